"""QuantizeDequantizeFusion: a QDQ model's activation Q -> DQ pairs become onnxrun's
QuantizeDequantize, with the unfused values bit for bit (NaN and infinities included)."""

from __future__ import annotations

import numpy as np
import pytest
from extended_helpers import EXTENDED, build

import onnxrun

HEAD = '<ir_version: 8, opset_import: ["" : 19]>\n'
X = np.concatenate([np.linspace(-9, 9, 997, dtype=np.float32),
                    np.array([np.nan, np.inf, -np.inf, 0.5 * 0.05, -1.5 * 0.05, 0],
                             np.float32)]).reshape(1, -1)
PARAMS = {"s": np.array(0.05, np.float32), "zp": np.array(12, np.uint8),
          "s2": np.array(0.07, np.float32), "zpi": np.array(-3, np.int8),
          "vs": np.array([0.05, 0.05], np.float32), "vzp": np.array([12, 12], np.uint8)}


def run(text: str, level=EXTENDED, feeds=None):
    model = build(HEAD + text, **PARAMS)
    opts = onnxrun.SessionOptions()
    opts.graph_optimization_level = level
    sess = onnxrun.InferenceSession(model.SerializeToString(), opts)
    outputs = sess.run(None, feeds or {"x": X})
    fused = [n.op_type for n in sess._model.graph.nodes]
    return outputs, fused, sess.get_optimization_report().passes


def check(text: str, feeds=None):
    """Outputs equal the unoptimized run's exactly; returns the optimized node types."""
    got, fused, passes = run(text, feeds=feeds)
    want, _, _ = run(text, onnxrun.GraphOptimizationLevel.ORT_DISABLE_ALL, feeds)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)
    return fused, passes


@pytest.mark.parametrize("zp", ["zp", "zpi", ""])
def test_pair_fires_bit_exact(zp):
    args = f"s, {zp}" if zp else "s"
    fused, passes = check(f"""g (float[1, 1003] x) => (float[1, 1003] y) {{
        q = QuantizeLinear(x, {args})
        d = DequantizeLinear(q, {args})
        y = Relu(d)
    }}""")
    assert fused == ["QuantizeDequantize", "Relu"]
    assert passes["QuantizeDequantizeFusion"].changes == {"QuantizeLinear+DequantizeLinear": 1}


def test_several_dequantizations_of_one_q_share_one_node():
    fused, _ = check("""g (float[1, 1003] x) => (float[1, 1003] y, float[1, 1003] z) {
        q = QuantizeLinear(x, s, zp)
        d1 = DequantizeLinear(q, s, zp)
        d2 = DequantizeLinear(q, s, zp)
        y = Relu(d1)
        z = Neg(d2)
    }""")
    assert sorted(fused) == ["Neg", "QuantizeDequantize", "Relu"]


def test_a_dequantization_that_is_a_graph_output_keeps_its_name():
    got, fused, _ = run("""g (float[1, 1003] x) => (float[1, 1003] d) {
        q = QuantizeLinear(x, s, zp)
        d = DequantizeLinear(q, s, zp)
    }""")
    assert fused == ["QuantizeDequantize"]


@pytest.mark.parametrize("body", [
    # another scale on the way back
    "q = QuantizeLinear(x, s, zp)\n d = DequantizeLinear(q, s2, zp)",
    # per-axis parameters
    "q = QuantizeLinear<axis = 1>(x, vs, vzp)\n d = DequantizeLinear<axis = 1>(q, vs, vzp)",
])
def test_other_parameters_do_not_fire(body):
    feeds = {"x": X[:, :2].copy()}
    fused, _ = check(f"""g (float[1, 2] x) => (float[1, 2] y) {{
        {body}
        y = Relu(d)
    }}""", feeds)
    assert "QuantizeDequantize" not in fused


def test_the_quantized_value_read_elsewhere_does_not_fire():
    fused, _ = check("""g (float[1, 1003] x) => (float[1, 1003] y, uint8[1, 1003] q) {
        q = QuantizeLinear(x, s, zp)
        d = DequantizeLinear(q, s, zp)
        y = Relu(d)
    }""")
    assert "QuantizeDequantize" not in fused
