"""SkipLayerNormFusion: residual Add + (Simplified)LayerNormalization ->
com.microsoft Skip(Simplified)LayerNormalization."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.numpy_helper
import onnx.parser
import pytest
from extended_helpers import build, ops, optimized

rng = np.random.default_rng(0)


D = 8
HEAD = '<ir_version: 8, opset_import: ["" : 17]>\n'
PARAMS = {"gamma": rng.standard_normal(D).astype(np.float32),
          "beta": rng.standard_normal(D).astype(np.float32),
          "w": rng.standard_normal((D, D)).astype(np.float32),
          "bias": rng.standard_normal(D).astype(np.float32)}
FEEDS = {"a": rng.standard_normal((2, 3, D)).astype(np.float32),
         "b": rng.standard_normal((2, 3, D)).astype(np.float32)}


def model_of(body: str, outs: str = f"float[2, 3, {D}] y", b_shape: str = f"2, 3, {D}",
             a_shape: str = f"2, 3, {D}"):
    return build(f"""{HEAD}
g (float[{a_shape}] a, float[{b_shape}] b) => ({outs}) {{
    {body}
}}""", **PARAMS)


def test_add_layer_norm_fires(tmp_path):
    model = model_of("s = Add(a, b)\n y = LayerNormalization <epsilon = 1e-6> (s, gamma, beta)")
    changes, opt = optimized(model, FEEDS, tmp_path)
    assert changes["SkipLayerNormFusion"] == {"Add+LayerNormalization": 1}
    assert ops(opt) == ["SkipLayerNormalization"]
    node = opt.graph.node[0]
    assert node.domain == "com.microsoft" and list(node.input) == ["a", "b", "gamma", "beta"]
    assert node.attribute[0].f == pytest.approx(1e-6)


DYNAMIC = f"2, S, {D}"  # rows of unknown count: MatMul + Add stays as it is


def test_bias_of_linear_layer_is_absorbed(tmp_path):
    model = model_of("mm = MatMul(a, w)\n lin = Add(bias, mm)\n s = Add(lin, b)\n"
                     " y = LayerNormalization (s, gamma, beta)", a_shape=DYNAMIC,
                     b_shape=DYNAMIC)
    changes, opt = optimized(model, FEEDS, tmp_path)
    assert ops(opt) == ["MatMul", "SkipLayerNormalization"]
    matmul_out = opt.graph.node[0].output[0]
    assert list(opt.graph.node[1].input) == [matmul_out, "b", "gamma", "beta", "bias"]


def test_static_rows_take_the_bias_into_a_gemm_as_onnxruntime(tmp_path):
    """A static [2, 3, D] activation: MatMulAddReshapeFusion's Reshape, Gemm (the bias in
    its epilogue), Reshape, then the residual's SkipLayerNormalization without a bias: the
    graph onnxruntime's extended level makes."""
    model = model_of("mm = MatMul(a, w)\n lin = Add(bias, mm)\n s = Add(lin, b)\n"
                     " y = LayerNormalization (s, gamma, beta)")
    changes, opt = optimized(model, FEEDS, tmp_path)
    assert changes["MatMulAddReshapeFusion"] == {"MatMul+Add (rows)": 1}
    assert ops(opt) == ["Reshape", "Gemm", "Reshape", "SkipLayerNormalization"]
    assert list(opt.graph.node[1].input)[1:] == ["w", "bias"]
    assert list(opt.graph.node[3].input)[1:] == ["b", "gamma", "beta"]


def test_sum_read_elsewhere_becomes_fourth_output(tmp_path):
    # pre-LN transformers: the residual sum also feeds the next residual Add
    model = model_of("s = Add(a, b)\n n = LayerNormalization (s, gamma, beta)\n"
                     " y = Add(n, s)")
    changes, opt = optimized(model, FEEDS, tmp_path)
    assert ops(opt) == ["SkipLayerNormalization", "Add"]
    assert list(opt.graph.node[0].output) == ["n", "", "", "s"]


def test_bias_absorbed_when_sum_read_elsewhere(tmp_path):
    model = model_of("mm = MatMul(a, w)\n lin = Add(mm, bias)\n s = Add(b, lin)\n"
                     " n = LayerNormalization (s, gamma, beta)\n y = Add(n, s)",
                     a_shape=DYNAMIC, b_shape=DYNAMIC)
    changes, opt = optimized(model, FEEDS, tmp_path)
    assert ops(opt) == ["MatMul", "SkipLayerNormalization", "Add"]
    assert list(opt.graph.node[1].input)[-1] == "bias"
    assert list(opt.graph.node[1].output) == ["n", "", "", "s"]


def test_sum_as_graph_output_keeps_its_name(tmp_path):
    model = model_of("s = Add(a, b)\n y = LayerNormalization (s, gamma, beta)",
                     outs=f"float[2, 3, {D}] y, float[2, 3, {D}] s")
    changes, opt = optimized(model, FEEDS, tmp_path)
    assert ops(opt) == ["SkipLayerNormalization"]
    assert [o.name for o in opt.graph.output] == ["y", "s"]


def test_add_simplified_layer_norm_fires(tmp_path):
    model = model_of("s = Add(a, b)\n y = SimplifiedLayerNormalization <epsilon = 1e-6> "
                     "(s, gamma)")
    changes, opt = optimized(model, FEEDS, tmp_path)
    assert changes["SkipLayerNormFusion"] == {"Add+SimplifiedLayerNormalization": 1}
    assert ops(opt) == ["SkipSimplifiedLayerNormalization"]


def test_add_rms_normalization_fires(tmp_path):
    model = model_of("s = Add(a, b)\n y = RMSNormalization (s, gamma)")
    model.opset_import[0].version = 23
    changes, opt = optimized(model, FEEDS, tmp_path)
    assert ops(opt) == ["SkipSimplifiedLayerNormalization"]


def test_broadcast_residual_does_not_fire(tmp_path):
    model = model_of("s = Add(a, b)\n y = LayerNormalization (s, gamma, beta)",
                     b_shape=f"1, 3, {D}")
    feeds = FEEDS | {"b": FEEDS["b"][:1]}
    changes, opt = optimized(model, feeds, tmp_path)
    assert "SkipLayerNormFusion" not in changes
    assert ops(opt) == ["Add", "LayerNormalization"]


def test_normalizing_other_axes_does_not_fire(tmp_path):
    gamma2 = {"gamma": np.ones((3, D), np.float32), "beta": np.zeros((3, D), np.float32)}
    model = model_of("s = Add(a, b)\n y = LayerNormalization <axis = 1> (s, gamma, beta)")
    model.graph.ClearField("initializer")
    model.graph.initializer.extend(onnx.numpy_helper.from_array(v, k) for k, v in gamma2.items())
    changes, opt = optimized(model, FEEDS, tmp_path)
    assert "SkipLayerNormFusion" not in changes


def test_mean_output_read_does_not_fire(tmp_path):
    model = model_of("s = Add(a, b)\n y, mu, inv = LayerNormalization (s, gamma, beta)",
                     outs=f"float[2, 3, {D}] y, float[2, 3, 1] mu")
    changes, opt = optimized(model, FEEDS, tmp_path)
    assert "SkipLayerNormFusion" not in changes


def test_same_dim_stops_where_the_lineages_meet(monkeypatch):
    # a residual stream 40 steps deep (no shapes inferred in between): a and b meet two steps
    # above a, so the walk takes a few steps, not both lineages back to the input
    from onnxrun.load import load_model
    from onnxrun.optimize.extended import _helpers

    body = "\n".join(f"    x{i + 1} = Relu(x{i})" for i in range(40))
    text = f"{HEAD}g (float[N, S, {D}] x0) => (float[N, S, {D}] x40) {{\n{body}\n}}"
    _, model = load_model(onnx.parser.parse_model(text).SerializeToString())
    values = {v.name: v for n in model.graph.nodes for v in n.outputs}
    steps = []
    walk = _helpers._dim_parent
    monkeypatch.setattr(_helpers, "_dim_parent", lambda v, k: steps.append(v) or walk(v, k))
    assert _helpers.same_dim(values["x40"], values["x38"], 0)
    assert len(steps) <= 4
    steps.clear()
    assert _helpers.same_dim(values["x38"], values["x40"], 1)
    assert len(steps) <= 4
