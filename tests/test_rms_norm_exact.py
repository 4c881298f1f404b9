"""float32 (Skip)SimplifiedLayerNormalization: onnxruntime's numbers bit for bit (an LLM's
layers feed them to int8-quantized products, where a last-bit difference grows; see
compiled/nbits_gemm.py)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

import onnxrun

ort = pytest.importorskip("onnxruntime")


def _run_both(op, domain, feeds, gamma, n_out, **attrs):
    names = list(feeds)
    node = helper.make_node(op, [*names, "g"], [f"y{i}" for i in range(n_out)],
                            domain=domain, **attrs)
    g = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info(n, TP.FLOAT, None) for n in names],
        [helper.make_tensor_value_info(f"y{i}", TP.FLOAT, None) for i in range(n_out)],
        [numpy_helper.from_array(gamma, "g")])
    data = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                               helper.make_opsetid("com.microsoft", 1)]
                             ).SerializeToString()
    got = onnxrun.InferenceSession(data).run(None, feeds)
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)
    return got, want


@pytest.mark.parametrize("shape", [(2, 17, 896), (5, 64)])
def test_simplified_layer_norm(shape):
    rng = np.random.default_rng(shape[-1])
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    gamma = (rng.standard_normal(shape[-1]) * 0.5 + 1).astype(np.float32)
    got, want = _run_both("SimplifiedLayerNormalization", "", {"x": x}, gamma, 1, epsilon=1e-5)
    assert got[0].tobytes() == want[0].tobytes()


@pytest.mark.parametrize("shape", [(2, 17, 896), (5, 60)])
def test_skip_simplified_layer_norm(shape):
    rng = np.random.default_rng(shape[-1])
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    skip = rng.standard_normal(shape).astype(np.float32)
    gamma = (rng.standard_normal(shape[-1]) * 0.5 + 1).astype(np.float32)
    # inputs in the schema's order: input, skip, gamma
    node_feeds = {"x": x, "s": skip}
    got, want = _run_both("SkipSimplifiedLayerNormalization", "com.microsoft", node_feeds,
                          gamma, 4, epsilon=1e-5)
    assert got[0].tobytes() == want[0].tobytes()
    assert got[3].tobytes() == want[3].tobytes()  # the sum
