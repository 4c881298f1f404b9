"""Where the CUDA provider's arrays live: one ``Device`` object owns every device concern
(the array namespace, copies both ways, pointers, DLPack, streams, graph capture), so kernels
are only arithmetic on the namespace it hands them.

Two devices implement it:

- ``CuPyDevice``: a real GPU through CuPy (``pip install onnxrun[cuda12]`` / ``[cuda13]``),
  its namespace array-api-compat's CuPy wrapper.
- ``StandInDevice``: array-api-strict's arrays placed on its non-default device ``device1``.
  array-api-strict refuses any operation mixing two devices (and numpy arrays), so a CPU-only
  machine runs the provider end to end and every implicit host/device mix fails a test.
  Only tests turn it on (``stand_in()``); it is never chosen on its own.

``current()`` is the device a new provider uses: CuPy's when it finds a GPU, else the stand-in
inside ``stand_in()``, else None (the provider is not available).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import importlib.util
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np


class Device:
    """What the provider needs of a device. ``xp`` is an array-API namespace."""

    name = "device"
    xp: Any
    device_id = 0

    def supports(self, dtype: np.dtype) -> bool:
        raise NotImplementedError

    def to_device(self, array: np.ndarray) -> Any:
        """A device copy of a host array (never sharing its memory)."""
        raise NotImplementedError

    def to_host(self, x: Any) -> np.ndarray:
        raise NotImplementedError

    def is_device_array(self, x: Any) -> bool:
        raise NotImplementedError

    def dtype_of(self, x: Any) -> np.dtype:
        """The numpy dtype of a device array."""
        raise NotImplementedError

    def as_dtype(self, dtype: np.dtype) -> Any:
        """The namespace's dtype object for a numpy dtype."""
        raise NotImplementedError

    def empty(self, shape: tuple[int, ...], dtype: np.dtype) -> Any:
        return self.xp.empty(shape, dtype=self.as_dtype(dtype), device=self.array_device)

    def data_ptr(self, x: Any) -> int:
        raise NotImplementedError

    def from_pointer(self, ptr: int, shape: tuple[int, ...], dtype: np.dtype) -> Any:
        """A device array over memory the caller owns (IOBinding's raw pointers), no copy."""
        raise NotImplementedError

    def from_dlpack(self, obj: Any) -> Any:
        raise NotImplementedError

    def copy_into(self, dst: Any, src: Any) -> None:
        dst[...] = src

    def synchronize(self) -> None:
        """Wait for the work queued on this thread's stream."""

    @contextlib.contextmanager
    def run_stream(self) -> Iterator[None]:
        """One stream for the duration of a run (concurrent runs do not share one)."""
        yield

    def capture(self, fn: Callable[[], Any]) -> tuple[Any, Callable[[], None]]:
        """Run ``fn`` once under graph capture: returns its result and a callable that
        replays the captured work (same buffers, same kernels)."""
        raise NotImplementedError

    @property
    def array_device(self) -> Any:
        raise NotImplementedError


# -- the stand-in: array-api-strict on a non-default device ----------------------------------------

class StandInDevice(Device):
    """array-api-strict's ``device1``: a device that is host memory, but which array-api-strict
    keeps apart from the host. Its graph capture records the run and replays it by running it
    again on the same buffers, which is what a CUDA graph's replay computes."""

    name = "array-api-strict:device1"

    def __init__(self, device_id: int = 0) -> None:
        import array_api_strict
        from array_api_strict._array_object import Array

        self.xp = array_api_strict
        self._array = Array
        self.device_id = device_id
        self._device = array_api_strict.Device("device1")
        self._host = array_api_strict.Device("CPU_DEVICE")
        self._dtypes = {np.dtype(name): d for name, d in
                        array_api_strict.__array_namespace_info__().dtypes().items()}
        self._np = {d: k for k, d in self._dtypes.items()}
        self.captures = 0  # graph captures made (tests read these)
        self.replays = 0

    @property
    def array_device(self) -> Any:
        return self._device

    def supports(self, dtype: np.dtype) -> bool:
        return np.dtype(dtype) in self._dtypes

    def as_dtype(self, dtype: np.dtype) -> Any:
        return self._dtypes[np.dtype(dtype)]

    def dtype_of(self, x: Any) -> np.dtype:
        return self._np[x.dtype]

    def to_device(self, array: np.ndarray) -> Any:
        array = np.asarray(array)
        if not self.supports(array.dtype):
            raise TypeError(f"{self.name} holds no {array.dtype} arrays")
        return self.xp.asarray(array, device=self._device, copy=True)

    def to_host(self, x: Any) -> np.ndarray:
        if not self.is_device_array(x):
            raise TypeError(f"expected an array on {self.name}, got {type(x).__name__}")
        return np.array(x.to_device(self._host), copy=True)

    def is_device_array(self, x: Any) -> bool:
        return isinstance(x, self._array) and x.device == self._device

    def data_ptr(self, x: Any) -> int:
        return int(np.from_dlpack(x).ctypes.data)

    def from_pointer(self, ptr: int, shape: tuple[int, ...], dtype: np.dtype) -> Any:
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        buf = (ctypes.c_char * nbytes).from_address(int(ptr))
        view = np.frombuffer(buf, dtype=dtype).reshape(shape)
        return self.xp.from_dlpack(view, device=self._device, copy=False)

    def from_dlpack(self, obj: Any) -> Any:
        if self.is_device_array(obj):
            return obj
        if isinstance(obj, self._array):
            raise TypeError(f"from_dlpack: an array on {obj.device} is not on {self.name}")
        return self.xp.from_dlpack(obj, device=self._device, copy=False)

    def capture(self, fn: Callable[[], Any]) -> tuple[Any, Callable[[], None]]:
        self.captures += 1
        result = fn()

        def replay() -> None:
            self.replays += 1
            fresh = fn()
            for dst, src in zip(result, fresh, strict=True):
                self.copy_into(dst, src)

        return result, replay


# -- CuPy ---------------------------------------------------------------------------------------

class CuPyDevice(Device):
    """A CUDA GPU through CuPy: cuBLAS, NVRTC kernels, the memory pool, streams, CUDA graphs."""

    def __init__(self, device_id: int = 0, mem_limit: int = 0) -> None:
        import array_api_compat.cupy as xp
        import cupy

        self.cp = cupy
        self.xp = xp
        self.device_id = device_id
        self._device = cupy.cuda.Device(device_id)
        self.name = f"cuda:{device_id}"
        # gpu_mem_limit: a pool of the provider's own with that limit (CuPy's default pool,
        # which the rest of the process shares, is left alone)
        self._pool = None
        if mem_limit:
            with self._device:
                self._pool = cupy.cuda.MemoryPool()
                self._pool.set_limit(size=mem_limit)
        self._local = threading.local()

    def _allocator(self) -> Any:
        if self._pool is None:
            return contextlib.nullcontext()
        return self.cp.cuda.using_allocator(self._pool.malloc)

    @property
    def array_device(self) -> Any:
        return self._device

    def supports(self, dtype: np.dtype) -> bool:
        dtype = np.dtype(dtype)
        return dtype.kind in "biuf" and dtype.itemsize <= 8 and dtype.name != "bfloat16" or \
            dtype.kind == "c"

    def as_dtype(self, dtype: np.dtype) -> Any:
        return np.dtype(dtype)

    def dtype_of(self, x: Any) -> np.dtype:
        return x.dtype

    def empty(self, shape: tuple[int, ...], dtype: np.dtype) -> Any:
        with self._device, self._allocator():
            return self.cp.empty(shape, dtype=dtype)

    def to_device(self, array: np.ndarray) -> Any:
        with self._device, self._allocator():
            return self.cp.array(np.asarray(array), copy=True)

    def to_host(self, x: Any) -> np.ndarray:
        return self.cp.asnumpy(x)

    def is_device_array(self, x: Any) -> bool:
        return isinstance(x, self.cp.ndarray)

    def data_ptr(self, x: Any) -> int:
        return int(x.data.ptr)

    def from_pointer(self, ptr: int, shape: tuple[int, ...], dtype: np.dtype) -> Any:
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        mem = self.cp.cuda.UnownedMemory(int(ptr), nbytes, owner=None,
                                         device_id=self.device_id)
        return self.cp.ndarray(shape, dtype=dtype, memptr=self.cp.cuda.MemoryPointer(mem, 0))

    def from_dlpack(self, obj: Any) -> Any:
        return self.cp.from_dlpack(obj)

    def synchronize(self) -> None:
        self.cp.cuda.get_current_stream().synchronize()

    @contextlib.contextmanager
    def run_stream(self) -> Iterator[None]:
        # One non-blocking stream per thread, reused by that thread's runs: concurrent runs
        # from several threads never share a stream, and a run ends synchronized.
        stream = getattr(self._local, "stream", None)
        if stream is None:
            with self._device:
                stream = self._local.stream = self.cp.cuda.Stream(non_blocking=True)
        with self._device, stream, self._allocator():
            # a non-blocking stream does not wait for the legacy default stream on its own:
            # the run's inputs may still be arriving there (OrtValue.ortvalue_from_numpy's
            # upload, a user's CuPy work). Seen on an H200: a 75 MB feed bound through IOBinding
            # was read half-copied by a CUDA graph's first run.
            stream.wait_event(self.cp.cuda.Stream.null.record())
            yield
            stream.synchronize()

    def capture(self, fn: Callable[[], Any]) -> tuple[Any, Callable[[], None]]:
        from .cupy.graphs import capture

        return capture(self.cp, fn)


# -- which device a provider gets ---------------------------------------------------------------

_stand_in = threading.local()
_stand_in_depth = 0
_lock = threading.Lock()


@functools.cache
def cupy_gpu_count() -> int:
    """GPUs CuPy can use (0 without CuPy, a driver or a device)."""
    if "cupy" not in sys.modules and importlib.util.find_spec("cupy") is None:
        return 0  # not installed: no import attempt (~10 ms of the first session)
    try:
        import array_api_compat.cupy  # noqa: F401 - the namespace the kernels use
        import cupy

        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:  # noqa: BLE001 - any failure means no usable GPU
        return 0


def available() -> bool:
    return _stand_in_depth > 0 or cupy_gpu_count() > 0


def create(device_id: int = 0, mem_limit: int = 0) -> Device:
    """The device a new CUDA provider runs on; RuntimeError when there is none."""
    if _stand_in_depth > 0:
        return StandInDevice(device_id)
    count = cupy_gpu_count()
    if count == 0:
        raise RuntimeError("CUDA is not available: CuPy finds no GPU (pip install "
                           "onnxrun[cuda12] or onnxrun[cuda13] on a machine with one)")
    if not 0 <= device_id < count:
        raise RuntimeError(f"device_id {device_id} is out of range: {count} GPU(s) found")
    return CuPyDevice(device_id, mem_limit)


@contextlib.contextmanager
def stand_in() -> Iterator[None]:
    """Tests: inside, the CUDA provider is available and runs on array-api-strict's device1
    (ahead of CuPy, so the CPU-only lane runs the same everywhere)."""
    global _stand_in_depth
    with _lock:
        _stand_in_depth += 1
    try:
        yield
    finally:
        with _lock:
            _stand_in_depth -= 1


_shared: dict[tuple[bool, int], Device] = {}


def shared(device_id: int = 0) -> Device:
    """The process's device object for ``device_id`` (OrtValue and IOBinding use it)."""
    key = (_stand_in_depth > 0, int(device_id))
    dev = _shared.get(key)
    if dev is None:
        dev = _shared.setdefault(key, create(int(device_id)))
    return dev


def owner(x: Any) -> Device | None:
    """The device an array lives on, or None for anything else (host arrays included)."""
    module = type(x).__module__
    if module.startswith("array_api_strict"):
        dev = shared(0) if _stand_in_depth > 0 else None
        return dev if dev is not None and dev.is_device_array(x) else None
    if module.startswith("cupy") and cupy_gpu_count() > 0:
        return shared(int(x.device.id))
    return None
