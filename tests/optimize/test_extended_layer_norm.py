"""LayerNormFusion: the pre-opset-17 decomposition of layer normalization ->
LayerNormalization."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.numpy_helper
import onnx.parser
import pytest
from extended_helpers import build, ops, optimized

rng = np.random.default_rng(0)


D = 8
GAMMA = rng.standard_normal(D).astype(np.float32)
BETA = rng.standard_normal(D).astype(np.float32)
FEEDS = {"x": rng.standard_normal((2, 3, D)).astype(np.float32)}


def ln_model(opset=13, axis=-1, square="pow", divide="div", with_bias=True, eps="1e-5",
             extra_out=""):
    if opset >= 18:
        consts = f"ax = Constant <value = int64[1] {{{axis}}}> ()"
        rm1, rm2 = "ReduceMean(x, ax)", "ReduceMean(sq, ax)"
    else:
        consts = ""
        rm1 = rm2 = f"ReduceMean <axes = [{axis}]> "
        rm1, rm2 = rm1 + "(x)", rm2 + "(sq)"
    sq = "two = Constant <value = float {2.0}> ()\n sq = Pow(d, two)" if square == "pow" \
        else "sq = Mul(d, d)"
    div = "n = Div(d, std)" if divide == "div" else "r = Reciprocal(std)\n n = Mul(d, r)"
    tail = "m = Mul(n, gamma)\n y = Add(m, beta)" if with_bias else "y = Mul(gamma, n)"
    outs = f"float[2, 3, {D}] y" + (f", float[2, 3, {D}] {extra_out}" if extra_out else "")
    text = f"""<ir_version: 8, opset_import: ["" : {opset}]>
g (float[2, 3, {D}] x) => ({outs}) {{
    {consts}
    eps = Constant <value = float {{{eps}}}> ()
    mean = {rm1}
    d = Sub(x, mean)
    {sq}
    var = {rm2}
    ve = Add(var, eps)
    std = Sqrt(ve)
    {div}
    {tail}
}}"""
    inits = {"gamma": GAMMA} | ({"beta": BETA} if with_bias else {})
    return build(text, **inits)


@pytest.mark.parametrize("opset", [13, 18])
@pytest.mark.parametrize("square", ["pow", "mul"])
@pytest.mark.parametrize("divide", ["div", "reciprocal"])
def test_layer_norm_fires(opset, square, divide, tmp_path):
    changes, model = optimized(ln_model(opset, -1, square, divide), FEEDS, tmp_path)
    assert changes["LayerNormFusion"] == {"LayerNormalization": 1}
    assert ops(model) == ["LayerNormalization"]
    node = model.graph.node[0]
    assert node.domain == "" and list(node.input) == ["x", "gamma", "beta"]
    eps = next(a.f for a in node.attribute if a.name == "epsilon")
    assert eps == pytest.approx(1e-5)


def test_layer_norm_without_bias_fires(tmp_path):
    changes, model = optimized(ln_model(with_bias=False), FEEDS, tmp_path)
    assert ops(model) == ["LayerNormalization"]


def test_positive_last_axis_fires(tmp_path):
    changes, model = optimized(ln_model(axis=2), FEEDS, tmp_path)
    assert ops(model) == ["LayerNormalization"]


def test_other_axis_does_not_fire(tmp_path):
    changes, model = optimized(ln_model(axis=1), FEEDS, tmp_path)
    assert "LayerNormFusion" not in changes
    assert "ReduceMean" in ops(model)


def test_centered_value_read_elsewhere_does_not_fire(tmp_path):
    changes, model = optimized(ln_model(extra_out="d"), FEEDS, tmp_path)
    assert "LayerNormFusion" not in changes
    assert "ReduceMean" in ops(model)


def test_non_constant_epsilon_does_not_fire(tmp_path):
    model = ln_model()
    # epsilon fed by the caller: no fixed attribute value exists
    model.graph.node.remove(next(n for n in model.graph.node if n.output[0] == "eps"))
    model.graph.input.append(onnx.helper.make_tensor_value_info("eps", onnx.TensorProto.FLOAT,
                                                                 []))
    feeds = FEEDS | {"eps": np.array(1e-5, np.float32)}
    changes, opt = optimized(model, feeds, tmp_path)
    assert "LayerNormFusion" not in changes
