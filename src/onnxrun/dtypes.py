"""ONNX element types <-> numpy dtypes, and onnxruntime's type strings ("tensor(float)")."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .errors import NotImplemented as _NotImplemented
from .proto import onnx
from .proto.element_types import fill_tensor_type, ml_dtypes, numpy_dtypes

TensorProto = onnx.TensorProto

# onnxruntime's spelling of each element type inside "tensor(...)".
_ORT_NAMES = {
    TensorProto.FLOAT: "float",
    TensorProto.UINT8: "uint8",
    TensorProto.INT8: "int8",
    TensorProto.UINT16: "uint16",
    TensorProto.INT16: "int16",
    TensorProto.INT32: "int32",
    TensorProto.INT64: "int64",
    TensorProto.STRING: "string",
    TensorProto.BOOL: "bool",
    TensorProto.FLOAT16: "float16",
    TensorProto.DOUBLE: "double",
    TensorProto.UINT32: "uint32",
    TensorProto.UINT64: "uint64",
    TensorProto.COMPLEX64: "complex64",
    TensorProto.COMPLEX128: "complex128",
    TensorProto.BFLOAT16: "bfloat16",
    TensorProto.FLOAT8E4M3FN: "float8e4m3fn",
    TensorProto.FLOAT8E4M3FNUZ: "float8e4m3fnuz",
    TensorProto.FLOAT8E5M2: "float8e5m2",
    TensorProto.FLOAT8E5M2FNUZ: "float8e5m2fnuz",
    TensorProto.UINT4: "uint4",
    TensorProto.INT4: "int4",
    TensorProto.FLOAT4E2M1: "float4e2m1",
}
for _name in ("FLOAT8E8M0", "UINT2", "INT2", "FLOAT6E2M3", "FLOAT6E3M2"):
    if hasattr(TensorProto, _name):
        _ORT_NAMES[getattr(TensorProto, _name)] = _name.lower()

# element type -> numpy dtype, as onnx.helper.tensor_dtype_to_np_dtype maps them (narrow types
# only with ml_dtypes)
NUMPY_DTYPES: dict[int, np.dtype] = numpy_dtypes(TensorProto.DataType)
_ELEM_BY_NP: dict[np.dtype, int] = {dt: elem for elem, dt in NUMPY_DTYPES.items()}
_ELEM_BY_NP[np.dtype(np.str_)] = TensorProto.STRING
_ELEM_BY_NP[np.dtype(np.bytes_)] = TensorProto.STRING

# None without ml_dtypes: no array has it then, so comparisons with it are simply false.
BFLOAT16 = np.dtype(ml_dtypes.bfloat16) if ml_dtypes is not None else None
_LOW_PRECISION = (np.dtype(np.float16), BFLOAT16)


def compute_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype a CPU kernel computes ``dtype`` in: float16/bfloat16 have no BLAS, so
    float32 (the result cast back); any other dtype itself."""
    return np.dtype(np.float32) if dtype in _LOW_PRECISION else dtype


class NarrowTypeUnavailable(_NotImplemented, TypeError):
    """An element type numpy holds only through ml_dtypes, which is not installed."""


def narrow_type_error(elem_type: int, where: str = "") -> NarrowTypeUnavailable | None:
    """The error for an element type ONNX defines that numpy cannot hold without ml_dtypes,
    when ml_dtypes is missing; None otherwise."""
    if ml_dtypes is not None or elem_type not in _ORT_NAMES or elem_type in NUMPY_DTYPES:
        return None
    return NarrowTypeUnavailable(
        f"{where}{': ' if where else ''}element type {_ORT_NAMES[elem_type]} needs the "
        "ml_dtypes package, which is not installed here (Pyodide 0.27 does not ship it)"
    )


def np_dtype(elem_type: int) -> np.dtype:
    """numpy dtype that holds ONNX element type ``elem_type``."""
    try:
        return NUMPY_DTYPES[elem_type]
    except KeyError:
        err = narrow_type_error(elem_type)
        if err is not None:
            raise err from None
        raise TypeError(f"unsupported ONNX element type {elem_type}") from None


def elem_type(dtype: np.dtype | type) -> int:
    """ONNX element type of a numpy dtype (unicode and bytes arrays are strings)."""
    dt = np.dtype(dtype)
    elem = _ELEM_BY_NP.get(dt)
    if elem is None:
        if dt.kind in "US":
            return TensorProto.STRING
        raise TypeError(f"numpy dtype {dt} has no ONNX element type")
    return elem


def tensor_type_proto(elem: int, shape: Sequence[int | str | None] | None) -> onnx.TypeProto:
    """The tensor type of element type ``elem`` and ``shape``, as
    onnx.helper.make_tensor_type_proto builds it (element_types.fill_tensor_type)."""
    return fill_tensor_type(onnx.TypeProto(), elem, shape)


def elem_name(elem: int) -> str:
    """onnxruntime's name of an element type: ``float``, ``int64``, ``bfloat16``..."""
    return _ORT_NAMES.get(elem, f"unknown{elem}")


def tensor_type_string(elem: int) -> str:
    return f"tensor({elem_name(elem)})"


def type_string(tp: onnx.TypeProto | None) -> str:
    """onnxruntime's type string of a TypeProto: tensor(float), seq(tensor(int64)), map(...)."""
    if tp is None:
        return "unknown"
    kind = tp.WhichOneof("value")
    if kind == "tensor_type":
        return tensor_type_string(tp.tensor_type.elem_type)
    if kind == "sparse_tensor_type":
        return f"sparse_tensor({elem_name(tp.sparse_tensor_type.elem_type)})"
    if kind == "sequence_type":
        return f"seq({type_string(tp.sequence_type.elem_type)})"
    if kind == "optional_type":
        return f"optional({type_string(tp.optional_type.elem_type)})"
    if kind == "map_type":
        key = elem_name(tp.map_type.key_type)
        return f"map({key},{type_string(tp.map_type.value_type)})"
    return "unknown"


def type_shape(tp: onnx.TypeProto | None) -> list[int | str | None] | None:
    """Shape as onnxruntime reports it: int for fixed dims, the symbol for named ones, else None.

    Returns None when the type carries no shape at all (unknown rank) or is not a tensor.
    """
    if tp is None:
        return None
    kind = tp.WhichOneof("value")
    if kind not in ("tensor_type", "sparse_tensor_type"):
        return [] if kind else None
    ttype = getattr(tp, kind)
    if not ttype.HasField("shape"):
        return None
    dims: list[int | str | None] = []
    for d in ttype.shape.dim:
        which = d.WhichOneof("value")
        if which == "dim_value":
            # A negative size means "any" (Paddle2ONNX writes -1), as in onnxruntime.
            dims.append(d.dim_value if d.dim_value >= 0 else None)
        else:
            dims.append(d.dim_param if which else None)
    return dims


def has_shape(tp: onnx.TypeProto | None) -> bool:
    """``type_shape(tp) is not None``, without reading the dimensions (a pass asks it of every
    value: ~3% of a YOLO-style model's creation went into building lists only to test them)."""
    if tp is None:
        return False
    kind = tp.WhichOneof("value")
    if kind not in ("tensor_type", "sparse_tensor_type"):
        return kind is not None
    return getattr(tp, kind).HasField("shape")


def has_settled_shape(tp: onnx.TypeProto | None) -> bool:
    """Whether a tensor type's shape is as known as it gets: every dimension a size or a
    symbol the model named, none unknown or one of the "unk__N" that ONNX shape inference
    makes up for sizes it could not find (other types: true, nothing to refine)."""
    if tp is None:
        return False
    kind = tp.WhichOneof("value")
    if kind not in ("tensor_type", "sparse_tensor_type"):
        return kind is not None
    t = getattr(tp, kind)
    if not t.HasField("shape"):
        return False
    for d in t.shape.dim:  # (a plain loop: asked of every value, twice per session)
        if not d.HasField("dim_value"):
            name = d.dim_param
            if not name or name.startswith("unk__"):
                return False
    return True


def has_negative_dim(tp: onnx.TypeProto) -> bool:
    """Whether a (possibly nested) tensor type declares a negative dimension size."""
    kind = tp.WhichOneof("value")
    if kind in ("tensor_type", "sparse_tensor_type"):
        return any(d.dim_value < 0 for d in getattr(tp, kind).shape.dim)
    if kind in ("sequence_type", "optional_type"):
        return has_negative_dim(getattr(tp, kind).elem_type)
    if kind == "map_type":
        return has_negative_dim(tp.map_type.value_type)
    return False


def without_negative_dims(tp: onnx.TypeProto) -> onnx.TypeProto:
    """``tp`` itself, or a copy where each negative dimension size is an unknown dimension: the
    meaning onnxruntime gives it, in the form onnx's shape inference and checker understand."""
    if not has_negative_dim(tp):
        return tp
    copy = onnx.TypeProto()
    copy.CopyFrom(tp)
    inner = copy
    while True:
        kind = inner.WhichOneof("value")
        if kind in ("tensor_type", "sparse_tensor_type"):
            for d in getattr(inner, kind).shape.dim:
                if d.WhichOneof("value") == "dim_value" and d.dim_value < 0:
                    d.ClearField("dim_value")
            return copy
        inner = inner.map_type.value_type if kind == "map_type" else getattr(inner, kind).elem_type


def value_type_string(value: object) -> str:
    """Type string of a runtime value (for error messages and OrtValue.data_type())."""
    if isinstance(value, np.ndarray):
        try:
            return tensor_type_string(elem_type(value.dtype))
        except TypeError:
            return f"tensor({value.dtype})"
    if isinstance(value, list):
        inner = value_type_string(value[0]) if value else "tensor(float)"
        return f"seq({inner})"
    if isinstance(value, dict):
        return "map"
    if value is None:
        return "optional"
    return type(value).__name__


def describe(value: object) -> str:
    """Short ``float[1,3,224,224]`` description of a runtime value for error messages."""
    if isinstance(value, np.ndarray):
        try:
            name = elem_name(elem_type(value.dtype))
        except TypeError:
            name = str(value.dtype)
        return f"{name}[{','.join(str(d) for d in value.shape)}]"
    if isinstance(value, list):
        return f"seq[{len(value)}]"
    if value is None:
        return "None"
    return type(value).__name__
