"""The layout level (channels-last convolution outputs, chosen when kernels are prepared)
belongs to ORT_ENABLE_LAYOUT (3) and above, as onnxruntime's NCHWc layout does; results do not
depend on it, and the optimization report counts it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx.parser
import pytest

import onnxrun

MODELS = Path(__file__).parent / "models"
LEVELS = onnxrun.GraphOptimizationLevel


def _session(level) -> onnxrun.InferenceSession:
    so = onnxrun.SessionOptions()
    so.graph_optimization_level = level
    return onnxrun.InferenceSession(str(MODELS / "mobilenet_tiny.onnx"), so)


def _channels_last_steps(sess) -> int:
    return sum(bool(getattr(step.kernel, "channels_last", False)) for step in sess._program.steps)


@pytest.mark.parametrize("level", [LEVELS.ORT_DISABLE_ALL, LEVELS.ORT_ENABLE_BASIC,
                                   LEVELS.ORT_ENABLE_EXTENDED])
def test_below_all_every_convolution_writes_nchw(level):
    assert _channels_last_steps(_session(level)) == 0


def test_at_all_depthwise_chains_go_channels_last_with_the_same_results():
    fast, plain = _session(LEVELS.ORT_ENABLE_ALL), _session(LEVELS.ORT_ENABLE_EXTENDED)
    assert _channels_last_steps(fast) > 0
    data = np.load(MODELS / "mobilenet_tiny.inputs.npz")
    feeds = {k.split("/", 1)[1]: v for k, v in data.items() if k.startswith("0/")}
    for got, want in zip(fast.run(None, feeds), plain.run(None, feeds), strict=True):
        assert got.flags.c_contiguous or got.ndim < 4  # graph outputs stay NCHW
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_the_layout_level_is_level_3_and_the_report_counts_it():
    layout = _session(LEVELS.ORT_ENABLE_LAYOUT)
    turned = _channels_last_steps(layout)
    assert turned > 0
    report = layout.get_optimization_report()
    convs = sum(hasattr(s.kernel, "channels_last") for s in layout._program.steps)
    assert report.layout == (turned, convs)
    assert f"{turned} of {convs} convolution outputs kept channels-last" in report.format()
    below = _session(LEVELS.ORT_ENABLE_EXTENDED).get_optimization_report()
    assert below.layout is None and "channels-last" not in below.format()


# A MobileNetV3-style block: the activations between the convolutions are HardSwish and SiLU
# (x * Sigmoid(x), which the optimizer fuses into QuickGelu); they keep the layout.
_V3_BLOCK = onnx.parser.parse_model("""
<ir_version: 8, opset_import: ["" : 17]>
g (float[1, 16, 12, 12] X) => (float[1, 16, 12, 12] Y) {
    a = Conv <kernel_shape = [1, 1]> (X, W1)
    b = HardSwish (a)
    c = Conv <kernel_shape = [3, 3], pads = [1, 1, 1, 1], group = 64> (b, W2)
    s = Sigmoid (c)
    d = Mul (c, s)
    Y = Conv <kernel_shape = [1, 1]> (d, W3)
}
""")


def _v3_session(level) -> onnxrun.InferenceSession:
    rng = np.random.default_rng(0)
    model = onnx.ModelProto()
    model.CopyFrom(_V3_BLOCK)
    for name, shape in (("W1", (64, 16, 1, 1)), ("W2", (64, 1, 3, 3)), ("W3", (16, 64, 1, 1))):
        model.graph.initializer.append(onnx.numpy_helper.from_array(
            rng.normal(0, 0.3, shape).astype(np.float32), name))
    so = onnxrun.SessionOptions()
    so.graph_optimization_level = level
    return onnxrun.InferenceSession(model.SerializeToString(), so)


def test_activations_between_convolutions_keep_the_layout_with_the_same_results():
    layout, plain = _v3_session(LEVELS.ORT_ENABLE_LAYOUT), _v3_session(LEVELS.ORT_ENABLE_EXTENDED)
    # the expansion (read by the depthwise one through HardSwish) and the depthwise convolution
    # (read by the projection through SiLU) both write channels-last
    assert _channels_last_steps(layout) == 2
    assert _channels_last_steps(plain) == 0
    x = np.random.default_rng(1).normal(size=(1, 16, 12, 12)).astype(np.float32)
    got, want = layout.run(None, {"X": x})[0], plain.run(None, {"X": x})[0]
    assert got.flags.c_contiguous  # the graph's output is NCHW
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
