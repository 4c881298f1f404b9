"""The int8 oracle (ort_int8.session): onnxruntime's uint8 x int8 products are exact on every
CPU, at every optimization level, where its default saturates pairs to int16 without VNNI; and
onnxrun's are the same exact integers."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper
from ort_int8 import session, weights_to_uint8

import onnxrun

MS = "com.microsoft"
# every pair of products 255 * 127 + 255 * 127 = 64770: past int16 (vpmaddubsw saturates it)
A = np.full((3, 64), 255, np.uint8)
B = np.where(np.arange(64 * 5).reshape(64, 5) % 7 == 0, -128, 127).astype(np.int8)
EXACT = (A.astype(np.int64) - 1) @ (B.astype(np.int64) + 2)


def _model(node, out_type, inits) -> bytes:
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("A", TP.UINT8, [3, 64])],
                              [helper.make_tensor_value_info("Y", out_type, [3, 5])],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13),
                                                    helper.make_opsetid(MS, 1)], ir_version=8)
    return model.SerializeToString()


MATMUL_INTEGER = _model(helper.make_node("MatMulInteger", ["A", "B", "azp", "bzp"], ["Y"]),
                        TP.INT32, {"B": B, "azp": np.uint8(1), "bzp": np.int8(-2)})
# a_scale * b_scale = 1: the float output is the integer sum
DYNAMIC = _model(helper.make_node("MatMulIntegerToFloat", ["A", "B", "as", "bs", "azp", "bzp"],
                                  ["Y"], domain=MS),
                 TP.FLOAT, {"B": B, "as": np.float32(0.5), "bs": np.float32(2.0),
                            "azp": np.uint8(1), "bzp": np.int8(-2)})
LEVELS = [ort.GraphOptimizationLevel.ORT_DISABLE_ALL, ort.GraphOptimizationLevel.ORT_ENABLE_ALL]


@pytest.mark.parametrize("model", [MATMUL_INTEGER, DYNAMIC], ids=["MatMulInteger", "ToFloat"])
@pytest.mark.parametrize("level", LEVELS, ids=["unoptimized", "optimized"])
def test_products_past_int16_are_exact(model, level):
    so = ort.SessionOptions()
    so.graph_optimization_level = level
    got = session(model, so).run(None, {"A": A})[0]
    np.testing.assert_array_equal(got.astype(np.int64), EXACT)
    mine = onnxrun.InferenceSession(model).run(None, {"A": A})[0]
    np.testing.assert_array_equal(mine.astype(np.int64), EXACT)


def test_weights_to_uint8_keeps_the_products():
    from onnx import load_from_string

    converted = weights_to_uint8(load_from_string(MATMUL_INTEGER))
    inits = {t.name: numpy_helper.to_array(t) for t in converted.graph.initializer}
    node = converted.graph.node[0]
    assert inits[node.input[1]].dtype == np.uint8 and inits[node.input[3]] == 126
    assert sorted(inits) == sorted(["azp", node.input[1], node.input[3]])  # no int8 copy left
    got = onnxrun.InferenceSession(converted.SerializeToString()).run(None, {"A": A})[0]
    np.testing.assert_array_equal(got, EXACT)


def test_per_column_weights_without_zero_points():
    """A missing zero point becomes 128s shaped as the scales (one per column here)."""
    b_scale = np.linspace(0.01, 0.05, 5).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("DynamicQuantizeMatMul", ["X", "B", "bs"], ["Y"], domain=MS)], "g",
        [helper.make_tensor_value_info("X", TP.FLOAT, [3, 64])],
        [helper.make_tensor_value_info("Y", TP.FLOAT, [3, 5])],
        [numpy_helper.from_array(B, "B"), numpy_helper.from_array(b_scale, "bs")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13),
                                                    helper.make_opsetid(MS, 1)], ir_version=8)
    x = np.tile(np.linspace(0.0, 1.0, 64, dtype=np.float32), (3, 1))  # codes up to 255
    got = session(model.SerializeToString()).run(None, {"X": x})[0]
    want = onnxrun.InferenceSession(model.SerializeToString()).run(None, {"X": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-6)
