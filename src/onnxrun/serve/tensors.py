"""KServe v2 tensor data types and their numpy dtypes, and the raw byte layout of a tensor
(Triton's binary-tensor extension: little-endian, row-major; BYTES elements each prefixed
by a 4-byte little-endian length)."""

from __future__ import annotations

import math

import numpy as np

from ..errors import InvalidArgument

# a larger request (HTTP body, gRPC message) is refused before it is read whole
MAX_REQUEST_BYTES = 256 << 20
# tensors larger than this are converted in a worker thread, so that one large request does
# not stall the event loop and every other connection with it
OFF_LOOP_BYTES = 1 << 16

DATATYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(bool), "UINT8": np.dtype("u1"), "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"), "UINT64": np.dtype("<u8"), "INT8": np.dtype("i1"),
    "INT16": np.dtype("<i2"), "INT32": np.dtype("<i4"), "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"), "FP32": np.dtype("<f4"), "FP64": np.dtype("<f8"),
    "BYTES": np.dtype(object),
}
# onnxruntime's type strings ("tensor(float)") -> KServe's names
_ORT_TO_KSERVE = {
    "tensor(bool)": "BOOL", "tensor(uint8)": "UINT8", "tensor(uint16)": "UINT16",
    "tensor(uint32)": "UINT32", "tensor(uint64)": "UINT64", "tensor(int8)": "INT8",
    "tensor(int16)": "INT16", "tensor(int32)": "INT32", "tensor(int64)": "INT64",
    "tensor(float16)": "FP16", "tensor(float)": "FP32", "tensor(double)": "FP64",
    "tensor(string)": "BYTES",
}


def datatype_of_ort_type(type_string: str) -> str | None:
    """KServe's name for an onnxruntime type string; None when the protocol has none."""
    return _ORT_TO_KSERVE.get(type_string)


# numpy dtype (either byte order) -> KServe's name
_OF_DTYPE = {d.newbyteorder(order): name for name, d in DATATYPES.items() if name != "BYTES"
             for order in "<>"}


def datatype_of_array(array: np.ndarray) -> str:
    if array.dtype.kind in "OUS":
        return "BYTES"
    name = _OF_DTYPE.get(array.dtype)
    if name is None:
        raise InvalidArgument(f"the protocol has no data type for numpy {array.dtype}")
    return name


def element_count(shape: list[int]) -> int:
    return math.prod(shape)  # Python integers: a huge shape cannot wrap around


def element_text(raw: bytes) -> str:
    """A BYTES element as the str a string tensor holds. Sessions take strings as str (bytes
    objects would be str()'d, "b'..'", as onnxruntime does); surrogateescape keeps bytes that
    are not UTF-8, so any element round-trips through to_bytes."""
    return raw.decode("utf-8", "surrogateescape")


def from_bytes(data: bytes | memoryview, datatype: str, shape: list[int], name: str
               ) -> np.ndarray:
    """A tensor from its raw bytes: a read-only view of them when they are aligned for its
    dtype, else an aligned copy. A size that does not fit the shape is an InvalidArgument."""
    count = element_count(shape)
    if datatype == "BYTES":
        items, pos, view = [], 0, memoryview(data)
        while pos < len(data):
            if pos + 4 > len(data):
                raise InvalidArgument(f"input '{name}': truncated BYTES element length")
            size = int.from_bytes(view[pos:pos + 4], "little")
            if pos + 4 + size > len(data):
                raise InvalidArgument(f"input '{name}': BYTES element of {size} bytes runs past "
                                      "the end of its data")
            items.append(element_text(bytes(view[pos + 4:pos + 4 + size])))
            pos += 4 + size
        if len(items) != count:
            raise InvalidArgument(f"input '{name}': {len(items)} BYTES elements for shape "
                                  f"{shape} ({count} elements)")
        return np.array(items, dtype=object).reshape(shape)
    dtype = DATATYPES[datatype]
    if len(data) != count * dtype.itemsize:
        raise InvalidArgument(f"input '{name}': {len(data)} bytes of data, but shape {shape} of "
                              f"{datatype} needs {count * dtype.itemsize}")
    array = np.frombuffer(data, dtype=dtype).reshape(shape)
    return array if array.flags.aligned else array.copy()


def to_bytes(array: np.ndarray) -> bytes:
    if array.dtype.kind in "OUS":
        parts = []
        for item in array.reshape(-1):
            raw = item if isinstance(item, bytes) else str(item).encode("utf-8", "surrogateescape")
            parts += [len(raw).to_bytes(4, "little"), raw]
        return b"".join(parts)
    return np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()
