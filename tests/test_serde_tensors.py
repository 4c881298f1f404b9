"""ir/serde.py's own readings of tensors agree with onnx's helpers bit for bit: the typed
fields read without numpy_helper's dispatch, and tensor types built field by field."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxrun.errors import InvalidGraph
from onnxrun.ir.serde import tensor_to_array, tensor_type

_TYPED = [
    (TensorProto.FLOAT, [0.02, -1.5, 3.4e38, float("inf"), float("nan"), -0.0]),
    (TensorProto.DOUBLE, [1e-300, -2.0, float("nan")]),
    (TensorProto.INT32, [-(2**31), 2**31 - 1, 0]),
    (TensorProto.INT64, [-(2**63), 2**63 - 1, 7]),
]


@pytest.mark.parametrize(("data_type", "values"), _TYPED)
@pytest.mark.parametrize("shape", ["vector", "scalar", "empty"])
def test_typed_fields_read_as_numpy_helper_reads_them(data_type, values, shape):
    dims, vals = {"vector": ([len(values)], values), "scalar": ([], values[:1]),
                  "empty": ([0, 3], [])}[shape]
    t = helper.make_tensor("t", data_type, dims, vals)
    assert not t.HasField("raw_data")
    got, want = tensor_to_array(t), numpy_helper.to_array(t)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert got.tobytes() == want.tobytes()
    assert not got.flags.writeable


@pytest.mark.parametrize("data_type", [d for d, _ in _TYPED])
def test_typed_field_of_the_wrong_count_is_refused(data_type):
    t = helper.make_tensor("t", data_type, [2], [1, 2])
    t.dims[0] = 3
    with pytest.raises(InvalidGraph, match="'t' with shape \\[3\\] cannot be read"):
        tensor_to_array(t)


@pytest.mark.parametrize("arr", [np.zeros((64, 3, 3, 3), np.float32), np.zeros((), np.int64),
                                 np.zeros((0, 5), np.bool_), np.array(["a"]),
                                 np.zeros((2,), np.float16)])
def test_tensor_type_is_onnx_helpers(arr):
    from onnxrun.dtypes import elem_type

    want = helper.make_tensor_type_proto(elem_type(arr.dtype), list(arr.shape))
    assert tensor_type(arr).SerializeToString() == want.SerializeToString()


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32,
                                   np.int64, np.uint64])
@pytest.mark.parametrize("shape", [(), (0,), (4,), (2, 3)])
def test_skeleton_constants_are_numpy_helpers(dtype, shape):
    from onnxrun.validate import _int_tensor

    arr = (np.arange(int(np.prod(shape))) - 1).astype(dtype).reshape(shape)
    want = numpy_helper.from_array(arr, "c")
    assert _int_tensor(arr, "c").SerializeToString() == want.SerializeToString()


@pytest.mark.parametrize("dims", [[], [0], [5, 1, 3]])
def test_skeleton_inputs_are_onnx_helpers(dims):
    from onnx import GraphProto

    from onnxrun.validate import _add_input

    g = GraphProto()
    _add_input(g, "w", TensorProto.FLOAT16, dims)
    want = helper.make_tensor_value_info("w", TensorProto.FLOAT16, list(dims))
    assert g.input[0].SerializeToString() == want.SerializeToString()


def test_tensor_types_are_fresh_messages():
    """tensor_type copies the type it built before for a dtype and shape: each call a message
    of its own, so a caller changing one changes no other value's type."""
    a, b = tensor_type(np.zeros((2, 3), np.float32)), tensor_type(np.zeros((2, 3), np.float32))
    assert a is not b and a == b
    a.tensor_type.shape.dim[0].dim_value = 7
    assert b.tensor_type.shape.dim[0].dim_value == 2
    assert tensor_type(np.zeros((2, 3), np.float32)).tensor_type.shape.dim[0].dim_value == 2
    assert tensor_type(np.zeros((2, 3), np.int64)) != b  # the dtype is part of the key
