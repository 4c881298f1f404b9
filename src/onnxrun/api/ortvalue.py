"""OrtValue: a value held by the runtime (a tensor, a sequence, a map, or an empty optional)."""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from ..dtypes import elem_name, elem_type, np_dtype, value_type_string
from ..errors import InvalidArgument


def _check_cpu(device_type: Any) -> None:
    """``device_type``: a name ("cpu") or an OrtDevice (capi's or onnxruntime's wrapper)."""
    if _device(device_type, 0) is not None:
        raise InvalidArgument(f"device '{device_type}': a host buffer is needed here")


def _device(device_type: Any, device_id: int) -> Any:
    """None for the CPU, the CUDA device object for "cuda" (InvalidArgument where there is
    none). ``device_type``: a name or an OrtDevice (capi's or onnxruntime's wrapper)."""
    if hasattr(device_type, "device_type"):
        kind = device_type.device_type()
        if kind == 0:  # OrtDevice.cpu()
            return None
        name = "cuda" if kind == 1 else repr(device_type)  # OrtDevice.cuda() is the GPU
        device_id = device_type.device_id() if hasattr(device_type, "device_id") else device_id
    else:
        name = str(device_type).lower()
        if name == "cpu":
            return None
    if name in ("cuda", "gpu"):
        from ..providers.cuda import device

        if device.available():
            try:
                return device.shared(int(device_id))
            except RuntimeError as e:
                raise InvalidArgument(f"device 'cuda' {device_id}: {e}") from None
    # RuntimeError as onnxruntime raises it, and ValueError: a bad argument
    raise InvalidArgument(
        f"device '{name}' is not available: onnxrun runs on the CPU here (CUDA needs CuPy and "
        "a GPU: pip install onnxrun[cuda12] or onnxrun[cuda13])")


def _owner(value: Any) -> Any:
    """The device object of a device array (None for host values)."""
    if isinstance(value, np.ndarray | list | dict) or value is None:
        return None
    from ..providers.cuda import device

    return device.owner(value)


class OrtValue:
    """Holds a numpy array (sharing its memory, as onnxruntime does for CPU arrays) or a
    non-tensor value."""

    __slots__ = ("_value",)

    def __init__(self, value: Any) -> None:
        self._value = value

    # -- construction ----------------------------------------------------------------------------
    @staticmethod
    def ortvalue_from_numpy(numpy_obj: Any, device_type: str = "cpu", device_id: int = 0
                            ) -> OrtValue:
        dev = _device(device_type, device_id)
        arr = np.asarray(numpy_obj)
        if arr.dtype.kind == "U":
            arr = arr.astype(object)
        return OrtValue(arr if dev is None else dev.to_device(arr))

    @staticmethod
    def ortvalue_from_numpy_with_onnx_type(numpy_obj: Any, onnx_element_type: int) -> OrtValue:
        arr = np.asarray(numpy_obj)
        target = np_dtype(onnx_element_type)
        if arr.dtype != target:
            arr = arr.view(target) if arr.dtype.itemsize == target.itemsize else arr.astype(target)
        return OrtValue(arr)

    @staticmethod
    def ortvalue_from_shape_and_type(shape: Any, element_type: Any, device_type: str = "cpu",
                                     device_id: int = 0, vendor_id: int = -1,
                                     memory_info: Any = None) -> OrtValue:
        """An uninitialized tensor. ``memory_info`` (an OrtMemoryInfo) allocates with the
        allocator registered for its device (create_and_register_allocator) instead."""
        dev = None
        if memory_info is not None:
            from .devices import registered_allocator

            registered_allocator(memory_info)  # only CPU ones can be registered: numpy's memory
        else:
            dev = _device(device_type, device_id)
        dtype = np_dtype(element_type) if isinstance(element_type, int) else np.dtype(element_type)
        shape = tuple(int(d) for d in shape)
        return OrtValue(np.empty(shape, dtype=dtype) if dev is None else dev.empty(shape, dtype))

    # -- inspection ------------------------------------------------------------------------------
    def numpy(self) -> Any:
        """The value; a device tensor is copied to the host."""
        dev = _owner(self._value)
        return self._value if dev is None else dev.to_host(self._value)

    def shape(self) -> list[int]:
        if not self.is_tensor():
            raise RuntimeError("OrtValue.shape() is only defined for tensors")
        return list(self._value.shape)

    def _dtype(self) -> np.dtype:
        dev = _owner(self._value)
        return self._value.dtype if dev is None else dev.dtype_of(self._value)

    def data_type(self) -> str:
        if self.is_sparse_tensor():
            return self._value.data_type()
        if _owner(self._value) is not None:
            return f"tensor({elem_name(elem_type(self._dtype()))})"
        return value_type_string(self._value)

    def element_type(self) -> int:
        if not self.is_tensor():
            raise RuntimeError("OrtValue.element_type() is only defined for tensors")
        return elem_type(self._dtype())

    def device_name(self) -> str:
        return "cpu" if _owner(self._value) is None else "cuda"

    def is_tensor(self) -> bool:
        return isinstance(self._value, np.ndarray) or _owner(self._value) is not None

    def is_tensor_sequence(self) -> bool:
        return isinstance(self._value, list)

    def is_sparse_tensor(self) -> bool:
        from .sparse import SparseTensor

        return isinstance(self._value, SparseTensor)

    @staticmethod
    def ort_value_from_sparse_tensor(sparse_tensor: Any) -> OrtValue:
        from .sparse import SparseTensor

        if not isinstance(sparse_tensor, SparseTensor):
            raise TypeError(f"expected a SparseTensor, got {type(sparse_tensor).__name__}")
        return OrtValue(sparse_tensor)

    def as_sparse_tensor(self) -> Any:
        """The SparseTensor this value holds."""
        if not self.is_sparse_tensor():
            raise RuntimeError(f"this OrtValue holds {self.data_type()}, not a sparse tensor")
        return self._value

    def has_value(self) -> bool:
        return self._value is not None

    def tensor_size_in_bytes(self) -> int:
        dev = _owner(self._value)
        if dev is None:
            return int(self._value.nbytes)
        return int(np.prod(self._value.shape, dtype=np.int64)) * self._dtype().itemsize

    def data_ptr(self) -> int:
        dev = _owner(self._value)
        return int(self._value.ctypes.data) if dev is None else dev.data_ptr(self._value)

    def update_inplace(self, np_arr: Any) -> None:
        """Copy ``np_arr`` into this value's memory (same shape and dtype)."""
        src = np.asarray(np_arr)
        if src.shape != tuple(self._value.shape) or src.dtype != self._dtype():
            raise ValueError(
                f"update_inplace expects {self._dtype()}{list(self._value.shape)}, "
                f"got {src.dtype}{list(src.shape)}"
            )
        dev = _owner(self._value)
        if dev is None:
            np.copyto(self._value, src)
        else:
            dev.copy_into(self._value, dev.to_device(src))

    # -- array and DLPack protocols ---------------------------------------------------------------
    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        """``np.asarray(value)``: the tensor's own memory (no copy) unless ``dtype`` differs or
        ``copy`` is True."""
        arr = self._tensor("np.asarray")
        if dtype is not None and np.dtype(dtype) != arr.dtype:
            if copy is False:
                raise ValueError(f"cannot convert a {arr.dtype} tensor to {np.dtype(dtype)} "
                                 "without a copy")
            return arr.astype(dtype)
        return arr.copy() if copy else arr

    def __dlpack__(self, *, stream: Any = None, **kwargs: Any) -> Any:
        """A DLPack capsule over the tensor's memory (no copy)."""
        if _owner(self._value) is not None:
            return self._value.__dlpack__(stream=stream, **kwargs)
        if stream is not None:
            raise BufferError("a CPU tensor takes no stream")
        return self._tensor("__dlpack__").__dlpack__(**kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        if _owner(self._value) is not None:
            return self._value.__dlpack_device__()
        return (_DLPACK_CPU, 0)

    def to_dlpack(self) -> Any:
        """The tensor as a DLPack capsule (onnxruntime's ``OrtValue.to_dlpack``)."""
        return self.__dlpack__()

    @staticmethod
    def from_dlpack(data: Any, is_bool_tensor: bool = False) -> OrtValue:
        """An OrtValue over the memory of a DLPack capsule or of an object with ``__dlpack__``
        (a numpy array, an OrtValue, a CPU torch tensor...), without a copy. ``is_bool_tensor``:
        the data is bool stored as uint8 (producers that predate DLPack's bool type)."""
        if isinstance(data, OrtValue):
            return OrtValue(data._value)
        dev = _owner(data)
        if dev is not None:
            return OrtValue(data)  # already on the device: shared, not copied
        if hasattr(data, "__dlpack_device__") and data.__dlpack_device__()[0] == _DLPACK_CUDA:
            return OrtValue(_device("cuda", data.__dlpack_device__()[1]).from_dlpack(data))
        source = DLPackCapsule(data) if type(data).__name__ == "PyCapsule" else data
        if not hasattr(source, "__dlpack__"):
            raise TypeError(
                f"from_dlpack expects a DLPack capsule or an object with __dlpack__, got "
                f"{type(data).__name__}")
        try:
            arr = np.from_dlpack(source)
        except (BufferError, RuntimeError, TypeError) as e:
            raise RuntimeError(f"from_dlpack: {e}") from e
        if is_bool_tensor and arr.dtype == np.uint8:
            arr = arr.view(np.bool_)
        return OrtValue(arr)

    def _tensor(self, what: str) -> np.ndarray:
        dev = _owner(self._value)
        if dev is not None:
            return dev.to_host(self._value)
        if not isinstance(self._value, np.ndarray):
            raise RuntimeError(f"{what} needs a tensor, this OrtValue holds {self.data_type()}")
        return self._value

    def __repr__(self) -> str:
        return f"OrtValue({self.data_type()}, shape={getattr(self._value, 'shape', None)})"


_DLPACK_CPU = 1  # DLPack's kDLCPU
_DLPACK_CUDA = 2  # kDLCUDA


class DLPackCapsule:
    """A bare DLPack capsule, given the protocol numpy's from_dlpack consumes."""

    def __init__(self, capsule: Any) -> None:
        self._capsule = capsule

    def __dlpack__(self, **kwargs: Any) -> Any:
        return self._capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return (_DLPACK_CPU, 0)


def array_from_pointer(buffer_ptr: int, shape: Any, element_type: Any) -> np.ndarray:
    """A numpy view over memory at ``buffer_ptr`` (IOBinding's raw-pointer API, CPU only)."""
    dtype = np_dtype(element_type) if isinstance(element_type, int) else np.dtype(element_type)
    shape = tuple(int(d) for d in shape)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    buf = (ctypes.c_char * nbytes).from_address(int(buffer_ptr))
    return np.frombuffer(buf, dtype=dtype).reshape(shape)
