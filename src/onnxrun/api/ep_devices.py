"""Hardware devices, execution-provider devices and compiled-model compatibility, as onnxruntime.

onnxruntime lists the machine's hardware (``get_hardware_devices``) and, for each execution
provider, the devices it can run on (``get_ep_devices``); an EP that compiles models stores a
compatibility string in the model's metadata (``ep_compatibility_info.<ep>``), which these
functions read back and judge. onnxrun has one device, the CPU, and one provider,
CPUExecutionProvider, which compiles nothing: it runs any model, so every compatibility
string is EP_NOT_APPLICABLE to it, as in onnxruntime.
"""

from __future__ import annotations

import io
import os
from collections.abc import Sequence
from functools import cache
from typing import Any

from .._version import __version__
from ..errors import Fail, InvalidArgument
from ..load import _open_regular, _parse_bytes, _parse_file
from .devices import (
    OrtCompiledModelCompatibility,
    OrtDeviceMemoryType,
    OrtHardwareDeviceType,
    _Enum,
)

_CPU_EP = "CPUExecutionProvider"
_METADATA_PREFIX = "ep_compatibility_info."
# /proc/cpuinfo's vendor_id -> onnxruntime's CPU vendor name and PCI vendor id.
_CPU_VENDORS = {"AuthenticAMD": ("AMD", 0x1022), "GenuineIntel": ("Intel", 0x8086)}


class OrtDeviceEpIncompatibilityReason(_Enum):
    """Why an EP cannot use a device: bit flags (UNKNOWN is the high bit, signed as in
    onnxruntime)."""

    NONE = 0
    DRIVER_INCOMPATIBLE = 1
    DEVICE_INCOMPATIBLE = 2
    MISSING_DEPENDENCY = 4
    UNKNOWN = -0x80000000


def _no_constructor(cls: type) -> None:
    raise TypeError(f"onnxruntime.capi.onnxruntime_pybind11_state.{cls.__name__}: "
                    "No constructor defined!")


class OrtHardwareDevice:
    """A piece of hardware: ``type`` (OrtHardwareDeviceType), ``vendor``, ``vendor_id``,
    ``device_id`` and ``metadata``. Listed by ``get_hardware_devices()``, never built."""

    __slots__ = ("_type", "_vendor", "_vendor_id", "_device_id", "_metadata")

    def __init__(self) -> None:
        _no_constructor(type(self))

    @classmethod
    def _make(cls, device_type: OrtHardwareDeviceType, vendor: str, vendor_id: int,
              device_id: int) -> OrtHardwareDevice:
        dev = object.__new__(cls)
        dev._type, dev._vendor, dev._vendor_id, dev._device_id = (device_type, vendor,
                                                                  vendor_id, device_id)
        dev._metadata: dict[str, str] = {}
        return dev

    type = property(lambda self: self._type)
    vendor = property(lambda self: self._vendor)
    vendor_id = property(lambda self: self._vendor_id)
    device_id = property(lambda self: self._device_id)
    metadata = property(lambda self: dict(self._metadata))

    def __repr__(self) -> str:
        return (f"OrtHardwareDevice(type={self._type!s}, vendor={self._vendor!r}, "
                f"vendor_id={self._vendor_id:#06x}, device_id={self._device_id})")


class OrtEpDevice:
    """An execution provider on a hardware device: ``ep_name``, ``ep_vendor``, ``ep_metadata``,
    ``ep_options`` and ``device``. Listed by ``get_ep_devices()``, never built."""

    __slots__ = ("_ep_name", "_device")

    def __init__(self) -> None:
        _no_constructor(type(self))

    @classmethod
    def _make(cls, ep_name: str, device: OrtHardwareDevice) -> OrtEpDevice:
        ep = object.__new__(cls)
        ep._ep_name, ep._device = ep_name, device
        return ep

    ep_name = property(lambda self: self._ep_name)
    ep_vendor = property(lambda self: "Microsoft")
    ep_metadata = property(lambda self: {"version": __version__})
    ep_options = property(lambda self: {})
    device = property(lambda self: self._device)

    def memory_info(self, device_memory_type: OrtDeviceMemoryType) -> None:
        """The memory this EP registers for the device's memory type: None, as onnxruntime's
        CPU EP registers none (its tensors are plain host memory)."""
        if not isinstance(device_memory_type, OrtDeviceMemoryType):
            raise TypeError("memory_info(): device_memory_type must be an OrtDeviceMemoryType, "
                            f"got {type(device_memory_type).__name__}")
        return None

    def __repr__(self) -> str:
        return f"OrtEpDevice(ep_name={self._ep_name!r}, device={self._device!r})"


def _cpu_vendor() -> tuple[str, int]:
    """The CPU's vendor, from /proc/cpuinfo (Linux); ("", 0) where it cannot be read."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "vendor_id":
                    return _CPU_VENDORS.get(value.strip(), (value.strip(), 0))
    except OSError:
        pass
    return "", 0


@cache
def _devices() -> tuple[OrtHardwareDevice, OrtEpDevice]:
    cpu = OrtHardwareDevice._make(OrtHardwareDeviceType.CPU, *_cpu_vendor(), 0)
    return cpu, OrtEpDevice._make(_CPU_EP, cpu)


def get_hardware_devices() -> list[OrtHardwareDevice]:
    """The machine's hardware onnxrun can use: the CPU."""
    return [_devices()[0]]


def get_ep_devices() -> list[OrtEpDevice]:
    """Each execution provider on each device it supports: CPUExecutionProvider on the CPU."""
    return [_devices()[1]]


def _str(value: Any, what: str, function: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{function}(): {what} must be a str, got {type(value).__name__}")
    return value


def get_hardware_device_ep_incompatibility_details(ep_name: str,
                                                   hardware_device: OrtHardwareDevice) -> dict:
    """Why ``ep_name`` cannot use ``hardware_device``: a dict of ``reasons_bitmask``
    (OrtDeviceEpIncompatibilityReason flags), ``notes`` (str or None) and ``error_code``."""
    function = "get_hardware_device_ep_incompatibility_details"
    _str(ep_name, "ep_name", function)
    if not isinstance(hardware_device, OrtHardwareDevice):
        raise TypeError(f"{function}(): hardware_device must be an OrtHardwareDevice, "
                        f"got {type(hardware_device).__name__}")
    if ep_name not in {ep.ep_name for ep in get_ep_devices()}:
        raise InvalidArgument(f"No valid factory found for execution provider '{ep_name}'.")
    reasons = OrtDeviceEpIncompatibilityReason.NONE
    if hardware_device.type != OrtHardwareDeviceType.CPU:
        reasons = OrtDeviceEpIncompatibilityReason.DEVICE_INCOMPATIBLE
    return {"reasons_bitmask": int(reasons), "notes": None, "error_code": 0}


def get_model_compatibility_for_ep_devices(
        ep_devices: Sequence[OrtEpDevice],
        compatibility_info: str) -> OrtCompiledModelCompatibility:
    """How well the EP of ``ep_devices`` (all of one EP) runs a model compiled with
    ``compatibility_info``. The CPU EP compiles nothing, so it is EP_NOT_APPLICABLE."""
    function = "get_model_compatibility_for_ep_devices"
    if isinstance(ep_devices, (str, bytes)) or not isinstance(ep_devices, Sequence) or not all(
            isinstance(d, OrtEpDevice) for d in ep_devices):
        raise TypeError(f"{function}(): ep_devices must be a sequence of OrtEpDevice, "
                        f"got {ep_devices!r}")
    _str(compatibility_info, "compatibility_info", function)
    if not ep_devices:
        raise Fail("Invalid argument provided to GetModelCompatibilityForEpDevices: "
                   "ep_devices is empty.")
    if len({d.ep_name for d in ep_devices}) > 1:
        raise Fail("Invalid argument provided to GetModelCompatibilityForEpDevices: all "
                   "ep_devices must belong to the same execution provider, got "
                   f"{sorted({d.ep_name for d in ep_devices})}.")
    return OrtCompiledModelCompatibility.EP_NOT_APPLICABLE


def _compatibility_info(model: Any, ep_type: str) -> str | None:
    key = _METADATA_PREFIX + ep_type
    # The last entry wins, as onnxruntime's metadata map keeps the last value of a key.
    found = None
    for entry in model.metadata_props:
        if entry.key == key:
            found = entry.value
    return found


def get_compatibility_info_from_model_bytes(model_data: Any, ep_type: str) -> str | None:
    """The compatibility string ``ep_type`` stored in the serialized model (its metadata
    ``ep_compatibility_info.<ep_type>``), or None."""
    function = "get_compatibility_info_from_model_bytes"
    try:
        data = memoryview(model_data).tobytes()
    except TypeError:
        raise TypeError(f"{function}(): model_data must be a bytes-like object, "
                        f"got {type(model_data).__name__}") from None
    _str(ep_type, "ep_type", function)
    if not data or not ep_type:
        raise Fail("Invalid argument provided to GetCompatibilityInfoFromModelBytes: "
                   f"{'model_data' if not data else 'ep_type'} is empty.")
    return _compatibility_info(_parse_bytes(data, "bytes"), ep_type)


def get_compatibility_info_from_model(model_path: str | os.PathLike, ep_type: str) -> str | None:
    """As ``get_compatibility_info_from_model_bytes``, for the model file at ``model_path``."""
    function = "get_compatibility_info_from_model"
    if not isinstance(model_path, (str, os.PathLike)):
        raise TypeError(f"{function}(): model_path must be a str or path, "
                        f"got {type(model_path).__name__}")
    path = os.fspath(model_path)
    if not isinstance(path, str):
        raise TypeError(f"{function}(): model_path must be a str path, got {path!r}")
    _str(ep_type, "ep_type", function)
    if not ep_type:
        raise Fail("Invalid argument provided to GetCompatibilityInfoFromModel: "
                   "ep_type is empty.")
    what = f"Load model {path} failed"
    with io.FileIO(_open_regular(path, what), "r") as f:
        model, _ = _parse_file(f, path)
    return _compatibility_info(model, ep_type)
