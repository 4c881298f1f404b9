"""The layout optimization (channels-last convolution outputs, chosen when kernels are
prepared) belongs to ORT_ENABLE_ALL, as onnxruntime's NCHWc layout does; results do not depend
on it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
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
