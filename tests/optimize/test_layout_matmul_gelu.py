"""MatMulGeluFusion (layout level): MatMul by a constant float32 weight + com.microsoft BiasGelu
or Gelu -> ai.onnxrun MatMulBiasGelu, whose compiled GEMM applies the bias and the gelu in its
epilogue: the same bits as the unfused graph, on every kernel path, and onnxruntime's results
within float32 rounding."""

from __future__ import annotations

import contextlib

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from extended_helpers import build, level_session, ops

import onnxrun
from onnxrun.providers.cpu.compiled import jit

LEVELS = onnxrun.GraphOptimizationLevel
rng = np.random.default_rng(0)


def _w(*shape, scale=0.3):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def ffn(H: int, F: int, bias: str = "BiasGelu", extra_reader: bool = False,
        dims: str = "batch, tokens"):
    """A transformer's feed-forward block: up projection, GELU (written as the erf formula,
    which the extended level makes a BiasGelu of, or as com.microsoft BiasGelu / Gelu), down
    projection."""
    if bias == "erf":
        act = """ub = Add(u, b1)
    d = Div(ub, sqrt2)
    e = Erf(d)
    e1 = Add(e, one)
    m = Mul(ub, e1)
    g = Mul(m, half)"""
    elif bias == "BiasGelu":
        act = "g = com.microsoft.BiasGelu(u, b1)"
    else:
        act = "g = com.microsoft.Gelu(u)"
    outs = f"float[{dims}, {H}] y" + (f", float[{dims}, {F}] u" if extra_reader else "")
    text = f"""<ir_version: 8, opset_import: ["" : 17, "com.microsoft" : 1]>
g (float[{dims}, {H}] x) => ({outs}) {{
    sqrt2 = Constant <value = float {{1.4142135}}> ()
    one = Constant <value = float {{1.0}}> ()
    half = Constant <value = float {{0.5}}> ()
    u = MatMul(x, w1)
    {act}
    v = MatMul(g, w2)
    y = Add(v, b2)
}}"""

    return build(text, w1=_w(H, F), b1=_w(F), w2=_w(F, H), b2=_w(H))


@pytest.mark.parametrize("bias", ["erf", "BiasGelu", "Gelu"])
def test_fires_at_the_layout_level_only(bias, tmp_path):
    model = ffn(32, 128, bias)
    sess = level_session(model, LEVELS.ORT_ENABLE_ALL, saved=tmp_path / "all.onnx")
    changes = dict(sess.get_optimization_report().passes["MatMulGeluFusion"].changes)
    assert changes == {"MatMul+Gelu" if bias == "Gelu" else "MatMul+BiasGelu": 1}
    saved = onnx.load(tmp_path / "all.onnx")
    fused = [n for n in saved.graph.node if n.op_type == "MatMulBiasGelu"]
    assert len(fused) == 1 and fused[0].domain == "ai.onnxrun"
    assert len(fused[0].input) == (0 if bias == "Gelu" else 1) + 2
    assert not {"BiasGelu", "Gelu"} & set(ops(saved))
    level_session(model, LEVELS.ORT_ENABLE_EXTENDED, saved=tmp_path / "ext.onnx")
    assert "MatMulBiasGelu" not in ops(onnx.load(tmp_path / "ext.onnx"))
    # the saved model is onnxrun's: it loads and runs again
    feeds = {"x": rng.standard_normal((2, 5, 32)).astype(np.float32)}
    again = onnxrun.InferenceSession(str(tmp_path / "all.onnx")).run(None, feeds)[0]
    np.testing.assert_array_equal(again, sess.run(None, feeds)[0])


def test_a_product_read_elsewhere_is_not_fused():
    sess = level_session(ffn(32, 128, extra_reader=True), LEVELS.ORT_ENABLE_ALL)
    assert not sess.get_optimization_report().passes["MatMulGeluFusion"].changes


@pytest.mark.parametrize("compiled_on", [True, False])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("bias", ["erf", "Gelu"])
@pytest.mark.parametrize("H,F,shape", [(32, 128, (2, 5)), (384, 1536, (2, 128)),
                                       (48, 200, (1, 1)), (40, 70, (3, 33))])
def test_the_same_bits_as_the_unfused_graph(H, F, shape, bias, threads, compiled_on):
    """Fused (the epilogue's gelu on the compiled GEMM, or the product then BiasGelu's
    kernel) against the same level without the pass: equal bits (below 256 elements the
    standalone Gelu takes numpy's steps, whose products round separately: within an ulp);
    both within float32 rounding of onnxruntime."""
    model = ffn(H, F, bias)
    feeds = {"x": rng.standard_normal((*shape, H)).astype(np.float32)}
    with contextlib.nullcontext() if compiled_on else jit.disabled():
        fused = level_session(model, LEVELS.ORT_ENABLE_ALL, threads=threads)
        plain = level_session(model, LEVELS.ORT_ENABLE_ALL, ("MatMulGeluFusion",), threads)
        got, want = fused.run(None, feeds)[0], plain.run(None, feeds)[0]
    assert fused.get_optimization_report().passes["MatMulGeluFusion"].changes
    if np.prod(shape) * F >= 256 or not compiled_on:
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6)
    theirs = ort.InferenceSession(model.SerializeToString(),
                                  providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(got, theirs, rtol=1e-4, atol=1e-4 * max(1, H / 32))


def _fused_and_plain(model, feeds, compiled_on: bool, tmp_path, change: str):
    """The outputs at ORT_ENABLE_ALL with and without the pass (the fused model saved as
    all.onnx), the pass's one change checked."""
    with contextlib.nullcontext() if compiled_on else jit.disabled():
        fused = level_session(model, LEVELS.ORT_ENABLE_ALL, saved=tmp_path / "all.onnx")
        plain = level_session(model, LEVELS.ORT_ENABLE_ALL, ("MatMulGeluFusion",))
        got, want = fused.run(None, feeds)[0], plain.run(None, feeds)[0]
    assert dict(fused.get_optimization_report().passes["MatMulGeluFusion"].changes) == \
        {change: 1}
    return got, want


def mlp(H: int, F: int, rows: str):
    """An MLP with its GELU after a projection's Gemm: 2-D rows (Gemm, Gelu), or [batch,
    tokens, features] of static shape, which the extended level turns into Reshape, Gemm,
    Reshape before the Gelu (MatMulAddReshapeFusion)."""
    if rows == "2d":
        dims, up = f"6, {H}", "u = Gemm(x, w1, b1)"
    else:
        dims, up = f"2, 3, {H}", "m = MatMul(x, w1)\n    u = Add(m, b1)"
    text = f"""<ir_version: 8, opset_import: ["" : 17, "com.microsoft" : 1]>
g (float[{dims}] x) => (float[{dims}] y) {{
    {up}
    g = com.microsoft.Gelu(u)
    v = MatMul(g, w2)
    y = Add(v, b2)
}}"""

    return build(text, w1=_w(H, F), b1=_w(F), w2=_w(F, H), b2=_w(H))


@pytest.mark.parametrize("compiled_on", [True, False])
@pytest.mark.parametrize("rows,change", [("2d", "Gemm+Gelu"), ("3d", "Gemm+Reshape+Gelu")])
def test_a_gemms_gelu_goes_into_fused_gemm(rows, change, compiled_on, tmp_path):
    """Gemm + Gelu (directly, or through the Reshape back to 3-D) -> FusedGemm with the
    activation "Gelu", the gelu in the compiled GEMM's epilogue (or after the product): the
    same bits as the unfused graph, onnxruntime's results within rounding."""
    model = mlp(48, 200, rows)
    shape = (6, 48) if rows == "2d" else (2, 3, 48)
    feeds = {"x": rng.standard_normal(shape).astype(np.float32)}
    got, want = _fused_and_plain(model, feeds, compiled_on, tmp_path, change)
    node = next(n for n in onnx.load(tmp_path / "all.onnx").graph.node
                if n.op_type == "FusedGemm")
    assert onnx.helper.get_attribute_value(
        next(a for a in node.attribute if a.name == "activation")) == b"Gelu"
    np.testing.assert_array_equal(got, want)
    theirs = ort.InferenceSession(model.SerializeToString(),
                                  providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(got, theirs, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("compiled_on", [True, False])
@pytest.mark.parametrize("form,change", [("matmul-bias", "MatMul+FastGelu"),
                                         ("matmul", "MatMul+FastGelu"),
                                         ("gemm", "Gemm+FastGelu")])
def test_fast_gelu_fuses_too(form, change, compiled_on, tmp_path):
    """FastGelu (a GPT-style decoder's; its bias input optional) after a MatMul ->
    MatMulBiasGelu with approximate "tanh"; after a Gemm -> FusedGemm "FastGelu": the same
    bits as the unfused graph (whose FastGelu computes the same x / (1 + 2^(x P(x^2)))),
    onnxruntime's tanh form within float32 rounding."""
    if form == "gemm":
        dims, up, act = "6, 40", "u = Gemm(x, w1, b1)", "com.microsoft.FastGelu(u)"
    else:
        dims, up = "2, 3, 40", "u = MatMul(x, w1)"
        act = "com.microsoft.FastGelu(u, b1)" if form == "matmul-bias" else \
            "com.microsoft.FastGelu(u)"
    text = f"""<ir_version: 8, opset_import: ["" : 17, "com.microsoft" : 1]>
g (float[{dims}] x) => (float[{dims}] y) {{
    {up}
    g = {act}
    y = MatMul(g, w2)
}}"""
    model = build(text, w1=(rng.standard_normal((40, 160)) * 0.4).astype(np.float32),
                  b1=rng.standard_normal(160).astype(np.float32),
                  w2=(rng.standard_normal((160, 40)) * 0.2).astype(np.float32))
    feeds = {"x": rng.standard_normal(tuple(int(d) for d in dims.split(", "))).astype(
        np.float32)}
    got, want = _fused_and_plain(model, feeds, compiled_on, tmp_path, change)
    saved = onnx.load(tmp_path / "all.onnx")
    node = next(n for n in saved.graph.node if n.op_type in ("MatMulBiasGelu", "FusedGemm"))
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    assert attrs.get("approximate", attrs.get("activation")) in (b"tanh", b"FastGelu")
    assert len(node.input) == (3 if form != "matmul" else 2)
    np.testing.assert_array_equal(got, want)
    theirs = ort.InferenceSession(model.SerializeToString(),
                                  providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(got, theirs, rtol=1e-4, atol=1e-4)
