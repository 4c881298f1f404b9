"""ONNX element types -> numpy dtypes, as onnx.helper.tensor_dtype_to_np_dtype maps them, and
tensor types as onnx.helper.make_tensor_type_proto fills them.

One home for dtypes.py and pure.py, keyed by TensorProto.DataType's names and filling a
TypeProto it is given, so that it imports no protobuf module (dtypes.py reads it before
anything imports the onnx package; pure.py has its own message classes).
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any

import numpy as np

try:  # narrow types (bfloat16, float8, int4...): numpy holds them only through ml_dtypes
    import ml_dtypes
except ImportError:
    ml_dtypes = None

# element type name -> (numpy dtype name, TensorProto field of its non-raw data)
PLAIN = {
    "FLOAT": ("float32", "float_data"), "UINT8": ("uint8", "int32_data"),
    "INT8": ("int8", "int32_data"), "UINT16": ("uint16", "int32_data"),
    "INT16": ("int16", "int32_data"), "INT32": ("int32", "int32_data"),
    "INT64": ("int64", "int64_data"), "BOOL": ("bool", "int32_data"),
    "FLOAT16": ("float16", "int32_data"), "DOUBLE": ("float64", "double_data"),
    "COMPLEX64": ("complex64", "float_data"), "COMPLEX128": ("complex128", "double_data"),
    "UINT32": ("uint32", "uint64_data"), "UINT64": ("uint64", "uint64_data"),
    "STRING": ("object", "string_data"),
}
# element type name -> ml_dtypes' attribute
NARROW = {
    "BFLOAT16": "bfloat16", "FLOAT8E4M3FN": "float8_e4m3fn",
    "FLOAT8E4M3FNUZ": "float8_e4m3fnuz", "FLOAT8E5M2": "float8_e5m2",
    "FLOAT8E5M2FNUZ": "float8_e5m2fnuz", "UINT4": "uint4", "INT4": "int4",
    "FLOAT4E2M1": "float4_e2m1fn", "FLOAT8E8M0": "float8_e8m0fnu", "UINT2": "uint2",
    "INT2": "int2", "FLOAT6E2M3": "float6_e2m3fn", "FLOAT6E3M2": "float6_e3m2fn",
}


def numpy_dtypes(data_type: object) -> dict[int, np.dtype]:
    """Element type -> numpy dtype for the names ``data_type`` (TensorProto.DataType) knows,
    narrow types only where ml_dtypes has them."""
    known = set(data_type.keys())  # type: ignore[attr-defined]
    found = {data_type.Value(name): np.dtype(numpy_name)  # type: ignore[attr-defined]
             for name, (numpy_name, _) in PLAIN.items() if name in known}
    if ml_dtypes is not None:
        for name, attribute in NARROW.items():
            if name in known and hasattr(ml_dtypes, attribute):
                found[data_type.Value(name)] = np.dtype(getattr(ml_dtypes, attribute))  # type: ignore[attr-defined]
    return found


def fill_tensor_type(tp: Any, elem: int, shape: Sequence[int | str | None] | None) -> Any:
    """Make the TypeProto ``tp`` the tensor type of element type ``elem`` and ``shape`` (None:
    no shape; in a shape an int is a size, a str a symbol, None unknown); returns ``tp``."""
    tp.tensor_type.elem_type = elem
    if shape is not None:
        dims = tp.tensor_type.shape
        dims.SetInParent()
        for d in shape:
            dim = dims.dim.add()
            if isinstance(d, numbers.Integral):
                dim.dim_value = int(d)
            elif isinstance(d, str):
                dim.dim_param = d
    return tp
