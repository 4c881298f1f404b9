"""Devices, memory descriptions and shared allocators, with onnxruntime's names and values.

onnxruntime describes where a tensor lives with ``OrtDevice`` (a device type, a memory type, a
vendor and an index) and how it is allocated with ``OrtMemoryInfo`` and ``OrtArenaCfg``. onnxrun
runs on the CPU and its memory is numpy's, so the one device that holds data is the CPU; the
other descriptions are still built, compared and rejected exactly where onnxruntime (a CPU-only
build) rejects them, so code that inspects or passes them around works unchanged.

``create_and_register_allocator`` registers a CPU allocator with the environment, for every
session (config entry ``session.use_env_allocators`` = "1") and for
``OrtValue.ortvalue_from_shape_and_type(..., memory_info=)``, which, as in onnxruntime, allocates
only where an allocator is registered for the memory's device. onnxrun's memory is numpy's either
way: a session's buffers come from the same allocator whether or not it asks for the shared one.
"""

from __future__ import annotations

import enum
import threading
from typing import Any

from ..errors import Fail


class _Enum(enum.IntEnum):
    """pybind11's enums: ``str()`` gives ``Type.NAME`` (IntEnum gives the number since 3.11)."""

    def __str__(self) -> str:
        return f"{type(self).__name__}.{self.name}"


class OrtAllocatorType(_Enum):
    INVALID = -1
    ORT_DEVICE_ALLOCATOR = 0
    ORT_ARENA_ALLOCATOR = 1


class OrtMemType(_Enum):
    CPU_INPUT = -2
    CPU_OUTPUT = -1
    CPU = -1  # onnxruntime's alias of CPU_OUTPUT
    DEFAULT = 0


class OrtDeviceMemoryType(_Enum):
    DEFAULT = 0
    HOST_ACCESSIBLE = 5


class OrtMemoryInfoDeviceType(_Enum):
    CPU = 0
    GPU = 1
    FPGA = 2
    NPU = 3


class OrtHardwareDeviceType(_Enum):
    CPU = 0
    GPU = 1
    NPU = 2


class OrtDeviceVendorId(enum.IntEnum):
    """PCI vendor ids, as onnxruntime's OrtDevice::VendorIds."""

    NONE = 0x0000
    AMD = 0x1002
    NVIDIA = 0x10DE
    ARM = 0x13B5
    MICROSOFT = 0x1414
    HUAWEI = 0x19E5
    QUALCOMM = 0x5143
    INTEL = 0x8086


class OrtCompiledModelCompatibility(_Enum):
    """How well an execution provider can run a model compiled for it (the EP-context API)."""

    EP_NOT_APPLICABLE = 0
    EP_SUPPORTED_OPTIMAL = 1
    EP_SUPPORTED_PREFER_RECOMPILATION = 2
    EP_UNSUPPORTED = 3


class ArenaExtendStrategy(_Enum):
    kNextPowerOfTwo = 0
    kSameAsRequested = 1


def _int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"{what} must be an integer, got {type(value).__name__} {value!r}")
    return value.__index__()


class NativeOrtDevice:
    """onnxruntime's native ``OrtDevice`` (``onnxruntime.capi._pybind_state.OrtDevice``).

    ``OrtDevice(device_type, mem_type, device_id)`` or
    ``OrtDevice(device_type, mem_type, vendor_id, device_id)``, the types from the static
    methods ``cpu()``, ``cuda()``... and ``default_memory()``.
    """

    __slots__ = ("_type", "_mem", "_vendor", "_id")

    def __init__(self, device_type: int, mem_type: int, *rest: int) -> None:
        if len(rest) not in (1, 2):
            raise TypeError("OrtDevice(device_type, mem_type, device_id) or "
                            "OrtDevice(device_type, mem_type, vendor_id, device_id)")
        vendor, device_id = (0, rest[0]) if len(rest) == 1 else rest
        self._type = _int(device_type, "device_type")
        self._mem = _int(mem_type, "mem_type")
        self._vendor = _int(vendor, "vendor_id")
        if self._type == self.dml():
            # DirectML is a GPU of Microsoft's: onnxruntime files it so, whatever vendor given.
            self._type, self._vendor = self.gpu(), int(OrtDeviceVendorId.MICROSOFT)
        self._id = _int(device_id, "device_id")

    # The device types (onnxruntime's OrtDevice::CPU, GPU, FPGA, NPU, DML); cuda, webgpu are
    # GPUs and cann an NPU told apart by vendor.
    @staticmethod
    def cpu() -> int:
        return 0

    @staticmethod
    def gpu() -> int:
        return 1

    @staticmethod
    def fpga() -> int:
        return 2

    @staticmethod
    def npu() -> int:
        return 3

    @staticmethod
    def dml() -> int:
        return 4

    @staticmethod
    def cuda() -> int:
        return 1

    @staticmethod
    def webgpu() -> int:
        return 1

    @staticmethod
    def cann() -> int:
        return 3

    @staticmethod
    def default_memory() -> int:
        return 0

    def device_type(self) -> int:
        return self._type

    def mem_type(self) -> int:
        return self._mem

    def vendor_id(self) -> int:
        return self._vendor

    def device_id(self) -> int:
        return self._id

    def __repr__(self) -> str:
        return (f"OrtDevice(device_type={self._type}, mem_type={self._mem}, "
                f"vendor_id={self._vendor}, device_id={self._id})")


NativeOrtDevice.__name__ = NativeOrtDevice.__qualname__ = "OrtDevice"

_DEVICE_TYPES = {"cpu": 0, "gpu": 1, "cuda": 1, "webgpu": 1, "npu": 3, "cann": 3, "dml": 4}
_ALIAS_VENDORS = {"cuda": OrtDeviceVendorId.NVIDIA, "dml": OrtDeviceVendorId.MICROSOFT,
                  "cann": OrtDeviceVendorId.HUAWEI, "webgpu": OrtDeviceVendorId.NONE}


class OrtDevice:
    """A device, as ``onnxruntime.OrtDevice``: ``OrtDevice.make("cpu", 0)``."""

    def __init__(self, c_ort_device: NativeOrtDevice) -> None:
        if not isinstance(c_ort_device, NativeOrtDevice):
            raise ValueError("`Provided object` needs to be of type "
                             "`onnxruntime.capi.onnxruntime_pybind11_state.OrtDevice`")
        self._ort_device = c_ort_device

    def _get_c_device(self) -> NativeOrtDevice:
        return self._ort_device

    @staticmethod
    def make(ort_device_name: str, device_id: int, vendor_id: int = -1) -> OrtDevice:
        """``ort_device_name``: cpu, cuda, dml, cann, webgpu, gpu or npu. The device aliases
        (cuda, dml, cann, webgpu) carry their vendor unless ``vendor_id`` names another."""
        try:
            device_type = _DEVICE_TYPES[ort_device_name]
        except (KeyError, TypeError):
            raise Fail(f"Unsupported device type: {ort_device_name}") from None
        if vendor_id < 0:
            vendor_id = _ALIAS_VENDORS.get(ort_device_name, 0)
        return OrtDevice(NativeOrtDevice(device_type, 0, int(vendor_id), device_id))

    def device_id(self) -> int:
        return self._ort_device.device_id()

    def device_type(self) -> int:
        return self._ort_device.device_type()

    def device_vendor_id(self) -> int:
        return self._ort_device.vendor_id()

    def device_mem_type(self) -> int:
        return self._ort_device.mem_type()

    def __repr__(self) -> str:
        return repr(self._ort_device)


# The names onnxruntime's CreateMemoryInfo knows: (device type, device memory type, vendor).
# "Cpu" always means device 0, as in onnxruntime.
_MEMORY_INFO_NAMES = {
    "Cpu": (OrtMemoryInfoDeviceType.CPU, OrtDeviceMemoryType.DEFAULT, OrtDeviceVendorId.NONE),
    "Cuda": (OrtMemoryInfoDeviceType.GPU, OrtDeviceMemoryType.DEFAULT, OrtDeviceVendorId.NVIDIA),
    "CudaPinned": (OrtMemoryInfoDeviceType.GPU, OrtDeviceMemoryType.HOST_ACCESSIBLE,
                   OrtDeviceVendorId.NVIDIA),
    "DML": (OrtMemoryInfoDeviceType.GPU, OrtDeviceMemoryType.DEFAULT,
            OrtDeviceVendorId.MICROSOFT),
    "OpenVINO_GPU": (OrtMemoryInfoDeviceType.GPU, OrtDeviceMemoryType.DEFAULT,
                     OrtDeviceVendorId.INTEL),
    "OpenVINO_RT_NPU": (OrtMemoryInfoDeviceType.NPU, OrtDeviceMemoryType.DEFAULT,
                        OrtDeviceVendorId.INTEL),
    "QnnHtpShared": (OrtMemoryInfoDeviceType.NPU, OrtDeviceMemoryType.HOST_ACCESSIBLE,
                     OrtDeviceVendorId.QUALCOMM),
    "WebGPU_Buffer": (OrtMemoryInfoDeviceType.GPU, OrtDeviceMemoryType.DEFAULT,
                      OrtDeviceVendorId.NONE),
    "WebNN_Tensor": (OrtMemoryInfoDeviceType.GPU, OrtDeviceMemoryType.DEFAULT,
                     OrtDeviceVendorId.NONE),
}


def _member(enum_type: type[enum.IntEnum], value: Any, what: str) -> Any:
    if isinstance(value, enum_type):
        return value
    try:
        return enum_type(_int(value, what))
    except ValueError:
        raise TypeError(f"{what} must be a {enum_type.__name__}, got {value!r}") from None


class OrtMemoryInfo:
    """Where and how memory is allocated: ``OrtMemoryInfo(name, allocator_type, device_id,
    mem_type)`` for the names onnxruntime knows ("Cpu", "Cuda", "CudaPinned", "DML"...), or
    ``OrtMemoryInfo.create_v2(...)`` for any device."""

    __slots__ = ("_name", "_device_type", "_vendor", "_id", "_device_mem", "_alloc", "_mem")

    def __init__(self, name: str, allocator_type: OrtAllocatorType, device_id: int,
                 mem_type: OrtMemType) -> None:
        if not isinstance(name, str):
            raise TypeError(f"OrtMemoryInfo name must be a str, got {type(name).__name__}")
        if name not in _MEMORY_INFO_NAMES:
            raise Fail("Specified device is not supported. Try CreateMemoryInfo_V2.")
        device_type, device_mem, vendor = _MEMORY_INFO_NAMES[name]
        self._set(name, device_type, int(vendor), 0 if name == "Cpu" else device_id, device_mem,
                  allocator_type, mem_type)

    def _set(self, name: str, device_type: Any, vendor: int, device_id: int, device_mem: Any,
             allocator_type: Any, mem_type: Any) -> None:
        self._name = name
        self._device_type = _member(OrtMemoryInfoDeviceType, device_type, "device_type")
        self._vendor = _int(vendor, "vendor_id")
        self._id = _int(device_id, "device_id")
        self._device_mem = _member(OrtDeviceMemoryType, device_mem, "device_mem_type")
        self._alloc = _member(OrtAllocatorType, allocator_type, "allocator_type")
        self._mem = _member(OrtMemType, mem_type, "mem_type")

    @classmethod
    def create_v2(cls, name: str, device_type: OrtMemoryInfoDeviceType, vendor_id: int,
                  device_id: int, device_mem_type: OrtDeviceMemoryType, alignment: int,
                  allocator_type: OrtAllocatorType) -> OrtMemoryInfo:
        """onnxruntime's CreateMemoryInfo_V2: any device, by type and vendor. A device's
        host-accessible memory is onnxruntime's CPU memory type; everything else DEFAULT."""
        if not isinstance(name, str):
            raise TypeError(f"OrtMemoryInfo name must be a str, got {type(name).__name__}")
        _int(alignment, "alignment")
        info = cls.__new__(cls)
        device_type = _member(OrtMemoryInfoDeviceType, device_type, "device_type")
        device_mem = _member(OrtDeviceMemoryType, device_mem_type, "device_mem_type")
        host = (device_mem == OrtDeviceMemoryType.HOST_ACCESSIBLE
                and device_type != OrtMemoryInfoDeviceType.CPU)
        info._set(name, device_type, vendor_id, device_id, device_mem, allocator_type,
                  OrtMemType.CPU if host else OrtMemType.DEFAULT)
        return info

    name = property(lambda self: self._name)
    device_id = property(lambda self: self._id)
    mem_type = property(lambda self: self._mem)
    allocator_type = property(lambda self: self._alloc)
    device_mem_type = property(lambda self: self._device_mem)
    device_vendor_id = property(lambda self: self._vendor)

    @property
    def is_cpu(self) -> bool:
        return self._device_type == OrtMemoryInfoDeviceType.CPU

    @property
    def _device(self) -> tuple[int, int, int, int]:
        """The device this memory is on, as onnxruntime keys its shared allocators."""
        return (int(self._device_type), int(self._device_mem), self._vendor, self._id)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, OrtMemoryInfo):
            return NotImplemented
        return all(getattr(self, s) == getattr(other, s) for s in self.__slots__)

    def __hash__(self) -> int:
        return hash(tuple(getattr(self, s) for s in self.__slots__))

    def __repr__(self) -> str:
        return (f"OrtMemoryInfo(name={self._name!r}, device_type={self._device_type!s}, "
                f"device_id={self._id}, mem_type={self._mem!s}, "
                f"allocator_type={self._alloc!s})")


_ARENA_FIELDS = ("max_mem", "arena_extend_strategy", "initial_chunk_size_bytes",
                 "max_dead_bytes_per_chunk", "initial_growth_chunk_size_bytes",
                 "max_power_of_two_extend_bytes")


class OrtArenaCfg:
    """An arena's configuration: ``OrtArenaCfg(max_mem, arena_extend_strategy,
    initial_chunk_size_bytes, max_dead_bytes_per_chunk)`` or ``OrtArenaCfg({name: value})``
    with any of the six fields; -1 (0 for max_mem) means onnxruntime's default."""

    def __init__(self, *args: Any) -> None:
        values = dict.fromkeys(_ARENA_FIELDS, -1)
        values["max_mem"] = 0
        if len(args) == 1 and isinstance(args[0], dict):
            for key, value in args[0].items():
                if key not in values:
                    raise Fail(f"Invalid OrtArenaCfg option: {key}")
                values[key] = value
        elif len(args) == 4:
            values.update(zip(_ARENA_FIELDS, args, strict=False))
        else:
            raise TypeError("OrtArenaCfg(max_mem, arena_extend_strategy, "
                            "initial_chunk_size_bytes, max_dead_bytes_per_chunk) or "
                            "OrtArenaCfg(dict)")
        for key, value in values.items():
            setattr(self, key, value)

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in _ARENA_FIELDS:
            raise AttributeError(f"'OrtArenaCfg' object has no attribute '{name}'")
        value = _int(value, f"OrtArenaCfg.{name}")
        if name == "max_mem" and value < 0:
            raise ValueError(f"OrtArenaCfg.max_mem is a size, got {value}")
        object.__setattr__(self, name, value)

    def __repr__(self) -> str:
        return "OrtArenaCfg(" + ", ".join(f"{k}={getattr(self, k)}" for k in _ARENA_FIELDS) + ")"


# The environment's shared allocators, by device: (memory info, arena config or None).
_lock = threading.Lock()
_shared: dict[tuple[int, int, int, int], tuple[OrtMemoryInfo, OrtArenaCfg | None]] = {}


def create_and_register_allocator(mem_info: OrtMemoryInfo,
                                  arena_cfg: OrtArenaCfg | None) -> None:
    """Register a CPU allocator (an arena with ``arena_cfg``) that sessions created with the
    config entry ``session.use_env_allocators`` = "1" share. Registering again replaces it."""
    if not isinstance(mem_info, OrtMemoryInfo):
        raise TypeError(f"create_and_register_allocator(): mem_info must be an OrtMemoryInfo, "
                        f"got {type(mem_info).__name__}")
    if arena_cfg is not None and not isinstance(arena_cfg, OrtArenaCfg):
        raise TypeError(f"create_and_register_allocator(): arena_cfg must be an OrtArenaCfg or "
                        f"None, got {type(arena_cfg).__name__}")
    if not mem_info.is_cpu:
        raise Fail("Error when creating and registering allocator: Only CPU devices are "
                   "supported. Please call CreateAndRegisterAllocatorV2() for other device.")
    with _lock:
        _shared[mem_info._device] = (mem_info, arena_cfg)


def create_and_register_allocator_v2(provider_type: str, mem_info: OrtMemoryInfo,
                                     options: dict[str, str],
                                     arena_cfg: OrtArenaCfg | None) -> None:
    """As ``create_and_register_allocator``, for the allocator of ``provider_type``."""
    from ..providers import available_providers

    if not isinstance(options, dict):
        raise TypeError(f"create_and_register_allocator_v2(): options must be a dict, "
                        f"got {type(options).__name__}")
    if provider_type not in available_providers():
        raise Fail("Error when creating and registering allocator in "
                   f"create_and_register_allocator_v2: {provider_type} is not implemented in "
                   "CreateAndRegisterAllocatorV2()")
    create_and_register_allocator(mem_info, arena_cfg)


def registered_allocator(memory_info: OrtMemoryInfo) -> tuple[OrtMemoryInfo, OrtArenaCfg | None]:
    """The allocator registered for ``memory_info``'s device: (its memory info, its arena
    configuration), or RuntimeError as onnxruntime's 'No shared allocator found'."""
    if not isinstance(memory_info, OrtMemoryInfo):
        raise TypeError(f"memory_info must be an OrtMemoryInfo, got {type(memory_info).__name__}")
    with _lock:
        entry = _shared.get(memory_info._device)
    if entry is None:
        raise Fail(f"No shared allocator found for: {memory_info!r} (register one with "
                   "create_and_register_allocator)")
    return entry
