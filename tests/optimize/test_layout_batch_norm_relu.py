"""BatchNormReluFusion (layout level): BatchNormalization at inference + Relu ->
ai.onnxrun FusedBatchNormalization, one compiled pass on a channels-last input
(compiled/scale_shift.py's relu variant): the same bits as the two nodes, NaN and signed
zeros included, at 1 and 2 threads, channels-last or not."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from extended_helpers import build, level_session, ops

import onnxrun

LEVELS = onnxrun.GraphOptimizationLevel
rng = np.random.default_rng(4)


def dense_layer(C: int, size: int, conv_first: bool = True, extra_reader: bool = False):
    """[Conv, Concat ->] BatchNormalization -> Relu -> 1x1 Conv: a DenseNet layer's start (the
    Concat of a convolution's output makes the normalization's input channels-last, and
    keeps it from folding into that convolution)."""
    D = 2 * C if conv_first else C
    outs = f"float[1, {C}, {size}, {size}] y" + (
        f", float[1, {D}, {size}, {size}] n" if extra_reader else "")
    first = ("c0 = Conv <pads = [1, 1, 1, 1]> (x, w0)\n    t = Concat <axis = 1> (c0, x)"
             if conv_first else "t = Identity(x)")
    text = f"""<ir_version: 8, opset_import: ["" : 15]>
g (float[1, {C}, {size}, {size}] x) => ({outs}) {{
    {first}
    n = BatchNormalization(t, s, b, m, v)
    r = Relu(n)
    y = Conv(r, w1)
}}"""
    def w(*shape):
        return (rng.standard_normal(shape) * 0.2).astype(np.float32)

    return build(text, w0=w(C, C, 3, 3), w1=w(C, D, 1, 1), s=w(D) + 1, b=w(D), m=w(D),
                 v=np.abs(w(D)) + 0.5)


def test_fires_at_the_layout_level_only(tmp_path):
    model = dense_layer(16, 6)
    sess = level_session(model, LEVELS.ORT_ENABLE_ALL, saved=tmp_path / "all.onnx")
    changes = sess.get_optimization_report().passes["BatchNormReluFusion"].changes
    assert dict(changes) == {"BatchNormalization+Relu": 1}
    saved = onnx.load(tmp_path / "all.onnx")
    fused = [n for n in saved.graph.node if n.op_type == "FusedBatchNormalization"]
    assert len(fused) == 1 and fused[0].domain == "ai.onnxrun"
    assert "Relu" not in ops(saved)
    level_session(model, LEVELS.ORT_ENABLE_EXTENDED, saved=tmp_path / "ext.onnx")
    assert "FusedBatchNormalization" not in ops(onnx.load(tmp_path / "ext.onnx"))


def test_a_normalization_read_elsewhere_is_not_fused():
    sess = level_session(dense_layer(16, 6, extra_reader=True), LEVELS.ORT_ENABLE_ALL)
    report = sess.get_optimization_report().passes.get("BatchNormReluFusion")
    assert report is None or not sum(report.changes.values())


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("C,size,conv_first", [(16, 6, True), (40, 37, True), (12, 9, False),
                                               (24, 40, False)])
def test_the_same_bits_as_the_unfused_graph(C, size, conv_first, threads):
    model = dense_layer(C, size, conv_first)
    x = rng.standard_normal((1, C, size, size)).astype(np.float32)
    if not conv_first:  # NaN, infinities and signed zeros reach the Relu as they are
        x.reshape(-1)[:5] = [np.nan, np.inf, -np.inf, -0.0, 0.0]
    fused = level_session(model, LEVELS.ORT_ENABLE_ALL, threads=threads)
    plain = level_session(model, LEVELS.ORT_ENABLE_ALL, ("BatchNormReluFusion",),
                          threads=threads)
    assert any(s.node.op_type == "FusedBatchNormalization" for s in fused._program.steps)
    for _ in range(4):  # past the memory plan's recording runs
        np.testing.assert_array_equal(fused.run(None, {"x": x})[0],
                                      plain.run(None, {"x": x})[0])


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_the_compiled_pass_applies_relu_as_onnxruns_relu(threads):
    """compiled/scale_shift.py's relu variant against BatchNormalization's numbers then the
    Relu kernel: NaN stays NaN, -0.0 stays -0.0, negatives become +0.0."""
    from onnxrun.providers.cpu.compiled import scale_shift
    from onnxrun.providers.cpu.ops.activation import Relu

    if scale_shift.unavailable() is not None:
        pytest.skip(scale_shift.unavailable())
    rows, C = 3000, 37
    x = rng.standard_normal((rows, C)).astype(np.float32)
    x.reshape(-1)[:6] = [np.nan, np.inf, -np.inf, -0.0, 0.0, 1e-38]
    a = rng.uniform(0.5, 1.5, C).astype(np.float32)
    b = rng.standard_normal(C).astype(np.float32)
    a[:2], b[:2] = [1.0, -1.0], [0.0, 0.0]  # -0.0 * 1 + 0 and +-inf through
    want = Relu(x * a + b)
    got = np.empty_like(x)
    assert scale_shift.scale_shift(x, a, b, got, threads, relu=True)
    np.testing.assert_array_equal(got, want)
    assert np.array_equal(np.signbit(got), np.signbit(want))
