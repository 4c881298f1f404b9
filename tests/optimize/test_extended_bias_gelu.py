"""BiasGeluFusion: Add(bias) + Gelu -> BiasGelu, Add(bias) + FastGelu -> FastGelu(x, bias)."""

from __future__ import annotations

import numpy as np
import pytest
from extended_helpers import build, ops, optimized

rng = np.random.default_rng(0)


HEAD = '<ir_version: 8, opset_import: ["" : 17]>\n'
ERF_GELU = """
    c = Constant <value = float {1.4142135}> ()
    one = Constant <value = float {1.0}> ()
    half = Constant <value = float {0.5}> ()
    a = Div(h, c)
    e = Erf(a)
    p = Add(e, one)
    e1 = Mul(h, p)
    y = Mul(e1, half)
"""
TANH_GELU = """
    c1 = Constant <value = float {0.7978846}> ()
    c2 = Constant <value = float {0.044715}> ()
    one = Constant <value = float {1.0}> ()
    half = Constant <value = float {0.5}> ()
    h2 = Mul(h, h)
    h3 = Mul(h, h2)
    m2 = Mul(c2, h3)
    s = Add(h, m2)
    m3 = Mul(c1, s)
    t = Tanh(m3)
    p = Add(one, t)
    e1 = Mul(h, p)
    y = Mul(e1, half)
"""


def biased(body: str, bias_shape=(8,), extra_out: str = ""):
    outs = "float[2, 3, 8] y" + (f", float[2, 3, 8] {extra_out}" if extra_out else "")
    text = f"""{HEAD}
g (float[2, 3, 8] x) => ({outs}) {{
    h = Add(b, x)
    {body}
}}"""
    return build(text, b=rng.standard_normal(bias_shape).astype(np.float32))


FEEDS = {"x": rng.standard_normal((2, 3, 8)).astype(np.float32)}


def test_bias_gelu_fires(tmp_path):
    changes, model = optimized(biased(ERF_GELU), FEEDS, tmp_path)
    assert changes["BiasGeluFusion"] == {"BiasGelu": 1}
    assert ops(model) == ["BiasGelu"]
    assert list(model.graph.node[0].input) == ["x", "b"]


def test_bias_fast_gelu_fires(tmp_path):
    changes, model = optimized(biased(TANH_GELU), FEEDS, tmp_path)
    assert changes["BiasGeluFusion"] == {"FastGelu+bias": 1}
    assert ops(model) == ["FastGelu"]
    assert list(model.graph.node[0].input) == ["x", "b"]


@pytest.mark.parametrize("body", [ERF_GELU, TANH_GELU])
def test_bias_over_two_axes_does_not_fire(body, tmp_path):
    # a [3, 8] bias is no 1-D bias: the Add stays in front of the Gelu
    changes, model = optimized(biased(body, bias_shape=(3, 8)), FEEDS, tmp_path)
    assert "BiasGeluFusion" not in changes
    assert "Add" in ops(model)


def test_biased_sum_read_elsewhere_does_not_fire(tmp_path):
    changes, model = optimized(biased(ERF_GELU, extra_out="h"), FEEDS, tmp_path)
    assert "BiasGeluFusion" not in changes
    assert sorted(ops(model)) == ["Add", "Gelu"]


def _onnx_gelu(attrs: str = ""):
    text = f"""<ir_version: 8, opset_import: ["" : 20]>
g (float[2, 3, 8] x) => (float[2, 3, 8] y) {{
    h = Add(x, b)
    y = Gelu {attrs}(h)
}}"""
    return build(text, b=rng.standard_normal(8).astype(np.float32))


def test_bias_onnx_gelu_fires(tmp_path):
    """ai.onnx Gelu (opset 20, erf) with a 1-D bias before it: com.microsoft BiasGelu."""
    changes, model = optimized(_onnx_gelu(), FEEDS, tmp_path)
    assert changes["BiasGeluFusion"] == {"BiasGelu (ai.onnx Gelu)": 1}
    assert ops(model) == ["BiasGelu"]
    assert list(model.graph.node[0].input) == ["x", "b"]


def test_bias_onnx_tanh_gelu_does_not_fire(tmp_path):
    changes, model = optimized(_onnx_gelu('<approximate = "tanh"> '), FEEDS, tmp_path)
    assert "BiasGeluFusion" not in changes
    assert sorted(ops(model)) == ["Add", "Gelu"]
