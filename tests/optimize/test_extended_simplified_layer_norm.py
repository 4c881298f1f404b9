"""SimplifiedLayerNormFusion: RMSNorm -> SimplifiedLayerNormalization."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.numpy_helper
import onnx.parser
import pytest
from extended_helpers import build, ops, optimized

rng = np.random.default_rng(0)


D = 8
W = rng.standard_normal(D).astype(np.float32)
FEEDS = {"x": rng.standard_normal((2, 3, D)).astype(np.float32)}


def rms_model(square="pow", divide="reciprocal", axis=-1, w_shape=(D,),
              out_shape=f"2, 3, {D}", opset=17):
    sq = "two = Constant <value = float {2.0}> ()\n sq = Pow(x, two)" if square == "pow" \
        else "sq = Mul(x, x)"
    div = "n = Div(x, r)" if divide == "div" else "inv = Reciprocal(r)\n n = Mul(x, inv)"
    reduce_mean = f"ax = Constant <value = int64[1] {{{axis}}}> ()\n ms = ReduceMean(sq, ax)" \
        if opset >= 18 else f"ms = ReduceMean <axes = [{axis}]> (sq)"
    text = f"""<ir_version: 8, opset_import: ["" : {opset}]>
g (float[2, 3, {D}] x) => (float[{out_shape}] y) {{
    eps = Constant <value = float {{1e-6}}> ()
    {sq}
    {reduce_mean}
    mse = Add(ms, eps)
    r = Sqrt(mse)
    {div}
    y = Mul(w, n)
}}"""
    return build(text, w=rng.standard_normal(w_shape).astype(np.float32))


@pytest.mark.parametrize("square", ["pow", "mul"])
@pytest.mark.parametrize("divide", ["div", "reciprocal"])
def test_rms_norm_fires(square, divide, tmp_path):
    changes, model = optimized(rms_model(square, divide), FEEDS, tmp_path)
    assert changes["SimplifiedLayerNormFusion"] == {"SimplifiedLayerNormalization": 1}
    assert ops(model) == ["SimplifiedLayerNormalization"]
    assert list(model.graph.node[0].input) == ["x", "w"]


def test_rms_norm_is_the_standard_operator_from_opset_23(tmp_path):
    changes, model = optimized(rms_model(opset=23), FEEDS, tmp_path)
    assert ops(model) == ["RMSNormalization"]
    onnx.checker.check_model(model)


def test_rms_norm_weight_of_rank_3_fires(tmp_path):
    changes, model = optimized(rms_model(w_shape=(1, 1, D)), FEEDS, tmp_path)
    assert ops(model) == ["SimplifiedLayerNormalization"]


def test_other_axis_does_not_fire(tmp_path):
    changes, model = optimized(rms_model(axis=1, w_shape=(3, 1)), FEEDS, tmp_path)
    assert "SimplifiedLayerNormFusion" not in changes


def test_weight_that_broadcasts_does_not_fire(tmp_path):
    # a [2, 3, D] weight is no per-channel scale
    changes, model = optimized(rms_model(w_shape=(2, 3, D)), FEEDS, tmp_path)
    assert "SimplifiedLayerNormFusion" not in changes
    assert "ReduceMean" in ops(model)


def test_weight_of_higher_rank_does_not_fire(tmp_path):
    # a [1, 1, 1, D] weight makes the result rank 4: a normalization would keep rank 3
    model = rms_model(w_shape=(1, 1, 1, D), out_shape=f"1, 2, 3, {D}")
    changes, opt = optimized(model, FEEDS, tmp_path)
    assert "SimplifiedLayerNormFusion" not in changes
