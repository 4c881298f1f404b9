"""The part of the ``onnx`` package onnxrun's session path needs, in pure Python.

Used in place of ``onnx`` where it cannot be imported (Pyodide has no build of its C++
extension): the protobuf messages (onnx_pb.py, protobuf's pure-Python runtime), and the few
``helper`` / ``numpy_helper`` / ``external_data_helper`` functions the loader, serde and session
call, with onnx's behaviour for the inputs onnxrun gives them. What needs onnx's C++ (checker,
shape inference, schemas, inliner) is not here: validate.py and load.py use onnxrun's own
checks and inliner when ``onnxrun.proto.HAVE_ONNX`` is false.
"""

from __future__ import annotations

import numbers
import os
import sys
import types
from collections.abc import Sequence
from typing import Any

import numpy as np

from .element_types import NARROW, PLAIN, fill_tensor_type, numpy_dtypes
from .onnx_pb import IR_VERSION as _IR_VERSION_ENUM
from .onnx_pb import (  # noqa: F401  (re-exported: this module stands in for ``onnx``)
    NEWEST_OPSETS,  # noqa: F401
    AttributeProto,
    FunctionProto,
    GraphProto,
    MapProto,
    ModelProto,
    NodeProto,
    OperatorSetIdProto,
    OptionalProto,
    SequenceProto,
    SparseTensorProto,
    StringStringEntryProto,
    TensorProto,
    TensorShapeProto,
    TrainingInfoProto,
    TypeProto,
    ValueInfoProto,
)

IR_VERSION = int(_IR_VERSION_ENUM)

_T = TensorProto
_NP: dict[int, np.dtype] = numpy_dtypes(TensorProto.DataType)
_ELEM: dict[np.dtype, int] = {dt: elem for elem, dt in _NP.items()}
_NARROW = {TensorProto.DataType.Value(name) for name in NARROW}
_DATA_FIELD = {TensorProto.DataType.Value(name): field for name, (_, field) in PLAIN.items()}
_SUB_BYTE_BITS = {_T.UINT4: 4, _T.INT4: 4, _T.FLOAT4E2M1: 4, _T.UINT2: 2, _T.INT2: 2}


def _tensor_dtype_to_np_dtype(tensor_dtype: int) -> np.dtype:
    try:
        return _NP[tensor_dtype]
    except KeyError:
        if tensor_dtype in _NARROW:
            raise TypeError(
                f"element type {TensorProto.DataType.Name(tensor_dtype)} needs the ml_dtypes "
                "package, which is not installed here"
            ) from None
        raise KeyError(tensor_dtype) from None


def _np_dtype_to_tensor_dtype(np_dtype: np.dtype) -> int:
    dt = np.dtype(np_dtype)
    if dt in _ELEM:
        return _ELEM[dt]
    if dt.kind in "US":
        return TensorProto.STRING
    raise ValueError(f"Unable to convert type {np_dtype!r} into TensorProto element type.")


def _make_opsetid(domain: str, version: int) -> OperatorSetIdProto:
    return OperatorSetIdProto(domain=domain, version=version)


def _make_tensor_type_proto(elem_type: int, shape: Sequence[int | str | None] | None,
                            shape_denotation: Sequence[str] | None = None) -> TypeProto:
    return fill_tensor_type(TypeProto(), elem_type, shape)


def _make_tensor_value_info(name: str, elem_type: int, shape: Sequence[int | str | None] | None,
                            doc_string: str = "") -> ValueInfoProto:
    vi = ValueInfoProto(name=name, doc_string=doc_string)
    vi.type.CopyFrom(_make_tensor_type_proto(elem_type, shape))
    return vi


def _make_attribute(key: str, value: Any, doc_string: str | None = None,
                    attr_type: int | None = None) -> AttributeProto:
    A = AttributeProto
    a = AttributeProto(name=key)
    if doc_string:
        a.doc_string = doc_string
    if isinstance(value, numbers.Integral):
        a.i, a.type = int(value), A.INT
    elif isinstance(value, numbers.Real):
        a.f, a.type = float(value), A.FLOAT
    elif isinstance(value, str | bytes):
        a.s, a.type = value.encode() if isinstance(value, str) else value, A.STRING
    elif isinstance(value, TensorProto):
        a.t.CopyFrom(value)
        a.type = A.TENSOR
    elif isinstance(value, SparseTensorProto):
        a.sparse_tensor.CopyFrom(value)
        a.type = A.SPARSE_TENSOR
    elif isinstance(value, GraphProto):
        a.g.CopyFrom(value)
        a.type = A.GRAPH
    elif isinstance(value, TypeProto):
        a.tp.CopyFrom(value)
        a.type = A.TYPE_PROTO
    else:
        values = list(value)
        kind = attr_type
        if kind is None or kind in (A.INT, A.FLOAT, A.STRING, A.TENSOR, A.GRAPH):
            kind = _list_kind(values, kind)
        if kind == A.INTS:
            a.ints.extend(int(v) for v in values)
        elif kind == A.FLOATS:
            a.floats.extend(float(v) for v in values)
        elif kind == A.STRINGS:
            a.strings.extend(v.encode() if isinstance(v, str) else v for v in values)
        elif kind == A.TENSORS:
            a.tensors.extend(values)
        elif kind == A.SPARSE_TENSORS:
            a.sparse_tensors.extend(values)
        elif kind == A.GRAPHS:
            a.graphs.extend(values)
        elif kind == A.TYPE_PROTOS:
            a.type_protos.extend(values)
        else:
            raise ValueError(f"cannot make attribute '{key}' of {type(value).__name__}")
        a.type = kind
        return a
    if attr_type is not None and a.type != attr_type:
        kind = A.AttributeType.Name(attr_type)
        raise TypeError(f"attribute '{key}': {value!r} is not of type {kind}")
    return a


def _list_kind(values: list, hint: int | None) -> int:
    A = AttributeProto
    plural = {A.INT: A.INTS, A.FLOAT: A.FLOATS, A.STRING: A.STRINGS, A.TENSOR: A.TENSORS,
              A.GRAPH: A.GRAPHS}
    if hint is not None:
        return plural[hint]
    if all(isinstance(v, numbers.Integral) for v in values):
        return A.INTS
    if all(isinstance(v, numbers.Real) for v in values):
        return A.FLOATS
    if all(isinstance(v, str | bytes) for v in values):
        return A.STRINGS
    for cls, kind in ((TensorProto, A.TENSORS), (SparseTensorProto, A.SPARSE_TENSORS),
                      (GraphProto, A.GRAPHS), (TypeProto, A.TYPE_PROTOS)):
        if all(isinstance(v, cls) for v in values):
            return kind
    raise ValueError("an attribute's list must hold values of one kind")


def _unpack_sub_byte(data: np.ndarray, elem: int, count: int) -> np.ndarray:
    """Sub-byte integers and floats, packed low bits first (onnx's layout), one per uint8."""
    bits = _SUB_BYTE_BITS[elem]
    per = 8 // bits
    data = np.asarray(data, dtype=np.uint8).reshape(-1)
    out = np.empty((data.size, per), np.uint8)
    for k in range(per):
        out[:, k] = (data >> (k * bits)) & ((1 << bits) - 1)
    out = out.reshape(-1)[:count]
    if elem in (_T.INT4, _T.INT2):  # sign-extend
        sign = 1 << (bits - 1)
        out = ((out.astype(np.int16) ^ sign) - sign).astype(np.int8)
    return out


def _to_array(tensor: TensorProto, base_dir: str = "") -> np.ndarray:
    """numpy_helper.to_array for tensors whose data is in the proto (raw or typed fields)."""
    if tensor.data_location == TensorProto.EXTERNAL:
        raise ValueError(f"tensor '{tensor.name}' keeps its data in an external file")
    elem = tensor.data_type
    dtype = _tensor_dtype_to_np_dtype(elem)
    dims = tuple(tensor.dims)
    count = int(np.prod(dims, dtype=np.int64)) if dims else 1
    if elem == _T.STRING:
        # as onnx's to_array: UTF-8 decoded (bytes kept where they are not UTF-8)
        return np.array([_decode(s) for s in tensor.string_data], dtype=object).reshape(dims)
    if elem in _SUB_BYTE_BITS or elem in (_T.FLOAT6E2M3, _T.FLOAT6E3M2):
        if elem not in _SUB_BYTE_BITS:
            raise TypeError(f"6-bit float tensors ('{tensor.name}') need onnx to unpack")
        packed = (np.frombuffer(tensor.raw_data, np.uint8) if tensor.HasField("raw_data")
                  else np.asarray(tensor.int32_data, dtype=np.uint8))
        return _unpack_sub_byte(packed, elem, count).view(dtype).reshape(dims)
    if tensor.HasField("raw_data"):
        le = dtype.newbyteorder("<") if dtype.kind in "iufc" else dtype
        return np.frombuffer(tensor.raw_data, dtype=le).astype(dtype).reshape(dims)
    field = _DATA_FIELD.get(elem, "int32_data")
    data = getattr(tensor, field)
    if elem in (_T.COMPLEX64, _T.COMPLEX128):
        flat = np.asarray(data, dtype=np.float32 if elem == _T.COMPLEX64 else np.float64)
        return flat.view(dtype).reshape(dims)
    if field == "int32_data" and dtype.itemsize <= 2 and dtype.kind not in "iub":
        # float16, bfloat16, float8: the int32 holds the bit pattern
        bits = np.asarray(data, dtype=np.int32).astype(np.uint16 if dtype.itemsize == 2
                                                       else np.uint8)
        return bits.view(dtype).reshape(dims)
    return np.asarray(data).astype(dtype).reshape(dims)


def _decode(s: bytes) -> str | bytes:
    try:
        return s.decode("utf-8")
    except UnicodeDecodeError:
        return s


def _from_array(array: np.ndarray, /, name: str | None = None) -> TensorProto:
    arr = np.asarray(array)
    t = TensorProto()
    if name:
        t.name = name
    t.dims.extend(arr.shape)
    if arr.dtype.kind in "OUS":
        t.data_type = TensorProto.STRING
        t.string_data.extend(
            v.encode() if isinstance(v, str) else bytes(v) for v in arr.reshape(-1).tolist()
        )
        return t
    elem = _np_dtype_to_tensor_dtype(arr.dtype)
    t.data_type = elem
    if elem in _SUB_BYTE_BITS:
        bits = _SUB_BYTE_BITS[elem]
        per = 8 // bits
        flat = arr.reshape(-1).view(np.uint8) & ((1 << bits) - 1)
        flat = np.concatenate([flat, np.zeros((-flat.size) % per, np.uint8)]).reshape(-1, per)
        packed = np.zeros(flat.shape[0], np.uint8)
        for k in range(per):
            packed |= flat[:, k] << (k * bits)
        t.raw_data = packed.tobytes()
        return t
    data = arr if sys.byteorder == "little" else arr.astype(arr.dtype.newbyteorder("<"))
    t.raw_data = np.ascontiguousarray(data).tobytes()
    return t


def _set_external_data(tensor: TensorProto, location: str, offset: int | None = None,
                       length: int | None = None, checksum: str | None = None,
                       basepath: str | None = None) -> None:
    del tensor.external_data[:]
    tensor.data_location = TensorProto.EXTERNAL
    for k, v in (("location", location), ("offset", offset), ("length", length),
                 ("checksum", checksum), ("basepath", basepath)):
        if v is not None:
            tensor.external_data.add(key=k, value=str(v))


def save(proto: ModelProto, f: str | os.PathLike | Any, *args: Any, **kwargs: Any) -> None:
    """onnx.save for a ModelProto whose weights are already where they should be."""
    data = proto.SerializeToString()
    if hasattr(f, "write"):
        f.write(data)
    else:
        with open(os.fspath(f), "wb") as out:
            out.write(data)


def load_model_from_string(data: bytes) -> ModelProto:
    mp = ModelProto()
    mp.ParseFromString(data)
    return mp


helper = types.SimpleNamespace(
    tensor_dtype_to_np_dtype=_tensor_dtype_to_np_dtype,
    np_dtype_to_tensor_dtype=_np_dtype_to_tensor_dtype,
    make_opsetid=_make_opsetid,
    make_tensor_type_proto=_make_tensor_type_proto,
    make_tensor_value_info=_make_tensor_value_info,
    make_attribute=_make_attribute,
)
numpy_helper = types.SimpleNamespace(to_array=_to_array, from_array=_from_array)
external_data_helper = types.SimpleNamespace(set_external_data=_set_external_data)
