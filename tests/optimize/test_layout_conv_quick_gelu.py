"""ConvQuickGeluFusion (layout level): Conv + com.microsoft QuickGelu (a SiLU) -> FusedConv
with the activation "QuickGelu", which the compiled GEMM's epilogue applies: the same bits as
the unfused graph, on every kernel path."""

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


def silu_chain(C: int, size: int, scaled: bool = False, extra_reader: bool = False):
    """Two 3x3 convolutions and a 1x1, each followed by x * Sigmoid(x) (or x * Sigmoid(1.5 x)),
    then a residual Add: what a YOLO-style block is made of."""
    def silu(x, y):
        if scaled:
            return (f"{x}a = Mul({x}, k)\n {x}s = Sigmoid({x}a)\n {y} = Mul({x}, {x}s)")
        return f"{x}s = Sigmoid({x})\n {y} = Mul({x}, {x}s)"

    outs = f"float[1, {C}, {size}, {size}] y" + (
        f", float[1, {C}, {size}, {size}] c1" if extra_reader else "")
    text = f"""<ir_version: 8, opset_import: ["" : 17]>
g (float[1, {C}, {size}, {size}] x) => ({outs}) {{
    k = Constant <value = float {{1.5}}> ()
    c1 = Conv <pads = [1, 1, 1, 1]> (x, w1, b1)
    {silu("c1", "s1")}
    c2 = Conv <pads = [1, 1, 1, 1]> (s1, w2, b2)
    {silu("c2", "s2")}
    c3 = Conv (s2, w3, b3)
    {silu("c3", "s3")}
    y = Add(s3, s1)
}}"""
    def w(*shape):
        return (rng.standard_normal(shape) * 0.2).astype(np.float32)

    return build(text, w1=w(C, C, 3, 3), b1=w(C), w2=w(C, C, 3, 3), b2=w(C), w3=w(C, C, 1, 1),
                 b3=w(C))


@pytest.mark.parametrize("scaled", [False, True])
def test_fires_at_the_layout_level_only(scaled, tmp_path):
    model = silu_chain(8, 6, scaled)
    sess = level_session(model, LEVELS.ORT_ENABLE_ALL, saved=tmp_path / "all.onnx")
    report = sess.get_optimization_report().passes
    assert dict(report["ConvQuickGeluFusion"].changes) == {"Conv+QuickGelu": 3}
    saved = onnx.load(tmp_path / "all.onnx")
    assert ops(saved) == ["FusedConv"] * 3 + ["Add"]
    for node in saved.graph.node[:3]:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        assert node.domain == "com.microsoft" and attrs["activation"] == b"QuickGelu"
        np.testing.assert_allclose(attrs["activation_params"], [1.5 if scaled else 1.0])
    level_session(model, LEVELS.ORT_ENABLE_EXTENDED, saved=tmp_path / "ext.onnx")
    assert "FusedConv" not in ops(onnx.load(tmp_path / "ext.onnx"))


def test_a_convolution_read_elsewhere_is_not_fused():
    sess = level_session(silu_chain(8, 6, extra_reader=True), LEVELS.ORT_ENABLE_ALL)
    changes = sess.get_optimization_report().passes["ConvQuickGeluFusion"].changes
    assert dict(changes) == {"Conv+QuickGelu": 2}  # c1 is a graph output too


@pytest.mark.parametrize("compiled_on", [True, False])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("C,size,scaled", [(8, 6, False), (32, 20, False), (48, 13, True)])
def test_the_same_bits_as_the_unfused_graph(C, size, scaled, threads, compiled_on):
    """Fused (the epilogue's logistic on the compiled GEMM, or the activation after the
    product elsewhere) against the same level without the pass (QuickGelu's own kernel):
    equal bits; both within float32 rounding of onnxruntime."""
    model = silu_chain(C, size, scaled)
    feeds = {"x": rng.standard_normal((1, C, size, size)).astype(np.float32)}
    with contextlib.nullcontext() if compiled_on else jit.disabled():
        fused = level_session(model, LEVELS.ORT_ENABLE_ALL, threads=threads)
        plain = level_session(model, LEVELS.ORT_ENABLE_ALL, ("ConvQuickGeluFusion",), threads)
        got, want = fused.run(None, feeds)[0], plain.run(None, feeds)[0]
    assert fused.get_optimization_report().passes["ConvQuickGeluFusion"].changes
    np.testing.assert_array_equal(got, want)
    theirs = ort.InferenceSession(model.SerializeToString(),
                                  providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(got, theirs, rtol=1e-4, atol=1e-4)  # sums of 432 products
