"""dtypes.has_shape answers ``type_shape(tp) is not None`` without reading the dimensions."""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper

from onnxrun.dtypes import has_shape, type_shape


def _types() -> list[onnx.TypeProto | None]:
    no_shape = onnx.TypeProto()
    no_shape.tensor_type.elem_type = TensorProto.FLOAT
    sparse = onnx.TypeProto()
    sparse.sparse_tensor_type.elem_type = TensorProto.FLOAT
    sparse_shaped = onnx.TypeProto()
    sparse_shaped.sparse_tensor_type.elem_type = TensorProto.FLOAT
    sparse_shaped.sparse_tensor_type.shape.dim.add().dim_value = 3
    tensor = helper.make_tensor_type_proto(TensorProto.FLOAT, [2, "n", None])
    return [
        None,
        onnx.TypeProto(),  # no kind at all
        no_shape,
        helper.make_tensor_type_proto(TensorProto.FLOAT, []),  # a scalar: shape, no dims
        tensor,
        helper.make_tensor_type_proto(TensorProto.FLOAT, [-1]),
        sparse,
        sparse_shaped,
        helper.make_sequence_type_proto(tensor),
        helper.make_optional_type_proto(tensor),
        helper.make_map_type_proto(TensorProto.INT64, tensor),
    ]


def test_has_shape_is_type_shape_not_none():
    answers = [has_shape(tp) for tp in _types()]
    assert answers == [type_shape(tp) is not None for tp in _types()]
    assert answers == [False, False, False, True, True, True, False, True, True, True, True]
