"""Sparse tensors: onnxruntime's SparseTensor API (COO, CSR, block sparse), OrtValues holding
them, and sessions with sparse inputs, outputs and constants (run dense inside, see
onnxrun.api.sparse)."""

from __future__ import annotations

import gc

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxrun
from onnxrun import InferenceSession, OrtValue
from onnxrun.api.sparse import OrtSparseFormat, SparseTensor

ort = pytest.importorskip("onnxruntime")


class _Cpu:  # what the constructors read of an OrtDevice
    def device_type(self) -> int:
        return 0


CPU = _Cpu()


def test_coo_tensor():
    values = np.array([1.0, 2.0, 3.0], np.float32)
    linear = np.array([3, 5, 15], np.int64)
    st = SparseTensor.sparse_coo_from_numpy([9, 9], values, linear, CPU)
    assert st.format() == OrtSparseFormat.ORT_SPARSE_COO
    assert (st.dense_shape(), st.data_type(), st.device_name()) == (
        [9, 9], "sparse_tensor(float)", "cpu")
    got_values, got_indices = st.values(), st.as_coo_view().indices()
    assert not got_values.flags.writeable and not got_indices.flags.writeable
    gc.collect()
    np.testing.assert_array_equal(got_values, values)
    np.testing.assert_array_equal(got_indices, linear)
    dense = np.zeros(81, np.float32)
    dense[linear] = values
    np.testing.assert_array_equal(st.to_dense(), dense.reshape(9, 9))
    coords = SparseTensor.sparse_coo_from_numpy([9, 9], values, np.array(
        [[0, 3], [0, 5], [1, 6]], np.int64), CPU)
    np.testing.assert_array_equal(coords.to_dense(), dense.reshape(9, 9))
    strings = SparseTensor.sparse_coo_from_numpy([9, 9], np.array(["xyz", "yxz", "zyx"]),
                                                 linear, CPU)
    assert strings.data_type() == "sparse_tensor(string)"
    assert list(strings.values()) == ["xyz", "yxz", "zyx"]
    value = OrtValue.ort_value_from_sparse_tensor(st)
    assert value.is_sparse_tensor() and not value.is_tensor()
    assert value.data_type() == "sparse_tensor(float)"
    assert value.as_sparse_tensor() is st
    with pytest.raises(RuntimeError, match="not a sparse tensor"):
        OrtValue.ortvalue_from_numpy(values).as_sparse_tensor()
    with pytest.raises(RuntimeError, match="no CUDA"):
        st.to_cuda(CPU)
    with pytest.raises(RuntimeError, match="not OrtSparseFormat.ORT_SPARSE_CSRC"):
        st.as_csrc_view()
    for bad in (np.array([3, 5], np.int64), np.array([3, 5, 81], np.int64),
                np.array([3, 5, 15], np.int32)):
        with pytest.raises(onnxrun.InvalidArgument):
            SparseTensor.sparse_coo_from_numpy([9, 9], values, bad, CPU)


def test_csr_and_block_sparse_tensors():
    values = np.array([1.0, 2.0, 3.0], np.float32)
    inner = np.array([1, 1, 1], np.int64)
    outer = np.array([0, 1, 2, 3, 3, 3, 3, 3, 3, 3], np.int64)
    st = SparseTensor.sparse_csr_from_numpy([9, 9], values, inner, outer, CPU)
    assert st.format() == OrtSparseFormat.ORT_SPARSE_CSRC
    view = st.as_csrc_view()
    np.testing.assert_array_equal(view.inner(), inner)
    np.testing.assert_array_equal(view.outer(), outer)
    assert not view.inner().flags.writeable
    dense = np.zeros((9, 9), np.float32)
    dense[[0, 1, 2], 1] = values
    np.testing.assert_array_equal(st.to_dense(), dense)
    with pytest.raises(onnxrun.InvalidArgument, match="not consistent"):
        SparseTensor.sparse_csr_from_numpy([9, 9], values, inner, outer[::-1].copy(), CPU)
    blocks = np.arange(8, dtype=np.float32).reshape(2, 2, 2)
    bs = SparseTensor.blocksparse_from_numpy([4, 4], blocks, np.array([[0, 1], [1, 0]], np.int64),
                                             CPU)
    assert bs.format() == OrtSparseFormat.ORT_SPARSE_BLOCK_SPARSE
    want = np.zeros((4, 4), np.float32)
    want[0:2, 2:4], want[2:4, 0:2] = blocks[0], blocks[1]
    np.testing.assert_array_equal(bs.to_dense(), want)
    np.testing.assert_array_equal(bs.as_blocksparse_view().indices(), [[0, 1], [1, 0]])
    with pytest.raises(onnxrun.InvalidArgument, match="block indices outside"):
        SparseTensor.blocksparse_from_numpy([4, 4], blocks, np.array([[0, 2], [1, 0]], np.int64),
                                            CPU)


def _sparse_type(elem: int, shape: list[int]):
    return helper.make_sparse_tensor_type_proto(elem, shape)


def test_sparse_constant_as_output_like_onnxruntime():
    """A Constant whose ``value`` holds a sparse tensor (onnxruntime's own test model writes
    it so) and a sparse graph output: a COO tensor back."""
    sp = helper.make_sparse_tensor(
        numpy_helper.from_array(np.array([1.5, 0.25, -2.0], np.float32), "v"),
        numpy_helper.from_array(np.array([2, 3, 5], np.int64), "i"), [3, 3])
    node = helper.make_node("Constant", [], ["values"])
    node.attribute.append(helper.make_attribute("value", sp))
    node.attribute[0].name = "value"
    graph = helper.make_graph([node], "g", [],
                              [helper.make_value_info("values", _sparse_type(1, [3, 3]))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 12)])
    data = model.SerializeToString()
    # (onnxruntime reports that output as tensor(float), though it returns a sparse value)
    assert InferenceSession(data).get_outputs()[0].type == "sparse_tensor(float)"
    for engine in (onnxrun, ort):
        session = engine.InferenceSession(data)
        value = session.run_with_ort_values(["values"], {})[0]
        st = value.as_sparse_tensor()
        assert st.dense_shape() == [3, 3]
        np.testing.assert_array_equal(st.values(), [1.5, 0.25, -2.0])
        np.testing.assert_array_equal(st.as_coo_view().indices(), [2, 3, 5])
    assert isinstance(InferenceSession(data).run(None, {})[0], SparseTensor)
    # the caller's ModelProto is left as it was
    InferenceSession(model)
    assert model.graph.output[0].type.HasField("sparse_tensor_type")


def test_sparse_to_dense_matmul_with_a_sparse_input():
    graph = helper.make_graph(
        [helper.make_node("SparseToDenseMatMul", ["A", "B"], ["Y"], domain="com.microsoft",
                          alpha=2.0)], "g",
        [helper.make_value_info("A", _sparse_type(TensorProto.FLOAT, [4, 3])),
         helper.make_tensor_value_info("B", TensorProto.FLOAT, [3, 2])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [4, 2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)])
    data = model.SerializeToString()
    values = np.array([1.0, -2.0, 3.0, 4.0], np.float32)
    coords = np.array([[0, 0], [1, 2], [3, 1], [3, 2]], np.int64)
    B = np.arange(6, dtype=np.float32).reshape(3, 2)
    ours = OrtValue.ort_value_from_sparse_tensor(
        SparseTensor.sparse_coo_from_numpy([4, 3], values, coords, CPU))
    theirs = ort.OrtValue.ort_value_from_sparse_tensor(ort.SparseTensor.sparse_coo_from_numpy(
        [4, 3], values, coords, ort.OrtDevice.make("cpu", 0)))
    session = InferenceSession(data)
    assert session.get_inputs()[0].type == "sparse_tensor(float)"
    got = session.run_with_ort_values(["Y"], {"A": ours, "B": OrtValue.ortvalue_from_numpy(B)})
    want = ort.InferenceSession(data).run_with_ort_values(
        ["Y"], {"A": theirs, "B": ort.OrtValue.ortvalue_from_numpy(B)})
    np.testing.assert_array_equal(got[0].numpy(), want[0].numpy())
    np.testing.assert_array_equal(session.run(None, {"A": ours.as_sparse_tensor(), "B": B})[0],
                                  want[0].numpy())
    with pytest.raises(onnxrun.InvalidArgument, match="'B' is a dense tensor"):
        session.run(None, {"A": ours, "B": ours})
