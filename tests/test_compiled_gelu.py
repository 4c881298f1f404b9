"""The compiled GELU (compiled/gelu.py) against its numpy twin (ops.elementwise.gelu_float32 on
the numpy path) and onnxruntime: same formula, same polynomial; exp2 and the division are the
kernel's own, so results agree to float32 rounding, NaN and infinities in the same places."""

from __future__ import annotations

import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP
from onnx import helper

import onnxrun
from onnxrun.providers.cpu.compiled import gelu, jit
from onnxrun.providers.cpu.ops.elementwise import _GELU_LOGIT, gelu_float32

pytest.importorskip("llvmlite")
_REASON = jit.why_unavailable()
pytestmark = pytest.mark.skipif(_REASON is not None, reason=f"compiled kernels: {_REASON}")


def _numpy_path(x, bias=None):
    with jit.disabled():
        return gelu_float32(x, bias)


def _agree(y, ref):
    assert np.array_equal(np.isnan(y), np.isnan(ref))
    finite = np.isfinite(ref)
    assert np.array_equal(y[~finite & ~np.isnan(ref)], ref[~finite & ~np.isnan(ref)])
    np.testing.assert_allclose(y[finite], ref[finite], rtol=3e-6, atol=1e-7)


@pytest.mark.parametrize("shape", [(1,), (5,), (16,), (17,), (3, 33), (64, 1536), (2, 7, 40)])
@pytest.mark.parametrize("with_bias", [True, False])
def test_equals_the_numpy_path(shape, with_bias):
    rng = np.random.default_rng(sum(shape))
    x = (rng.standard_normal(shape) * 4).astype(np.float32)
    flat = x.reshape(-1)
    specials = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-30, -1e-30, 30.0, -30.0, 3e38, -3e38]
    flat[:len(specials)] = specials[:flat.size]
    bias = rng.standard_normal(shape[-1]).astype(np.float32) if with_bias else None
    _agree(gelu.bias_gelu(_GELU_LOGIT, x, bias), _numpy_path(x, bias))


def test_close_to_the_exact_gelu_and_in_place():
    xs = np.linspace(-12, 12, 20001).astype(np.float32)
    exact = np.array([0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in xs.astype(float)])
    y = xs.copy()
    assert gelu.bias_gelu(_GELU_LOGIT, y, out=y) is y
    assert np.abs(y - exact).max() < 1e-6  # the numpy path: 6.2e-7


def test_threads_and_bad_inputs():
    x = np.random.default_rng(0).standard_normal((300, 400)).astype(np.float32)
    np.testing.assert_array_equal(gelu.bias_gelu(_GELU_LOGIT, x, threads=3),
                                  gelu.bias_gelu(_GELU_LOGIT, x))
    with pytest.raises(ValueError, match="C-contiguous"):
        gelu.bias_gelu(_GELU_LOGIT, x.T)
    with pytest.raises(ValueError, match="bias"):
        gelu.bias_gelu(_GELU_LOGIT, x, np.ones(3, np.float32))
    with pytest.raises(ValueError, match="out"):
        gelu.bias_gelu(_GELU_LOGIT, x, out=np.empty((400, 300), np.float32))


@pytest.mark.parametrize("compiled_on", [True, False])
@pytest.mark.parametrize("op", ["BiasGelu", "Gelu"])
def test_operators_equal_onnxruntime(op, compiled_on):
    rng = np.random.default_rng(1)
    X = (rng.standard_normal((2, 64, 96)) * 3).astype(np.float32)
    B = rng.standard_normal(96).astype(np.float32)
    inputs = ["X", "B"] if op == "BiasGelu" else ["X"]
    node = helper.make_node(op, inputs, ["Y"], domain="com.microsoft")
    inits = [onnx.numpy_helper.from_array(B, "B")] if op == "BiasGelu" else []
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("X", TP.FLOAT,
                                                                          list(X.shape))],
                              [helper.make_tensor_value_info("Y", TP.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)])
    blob = model.SerializeToString()
    if compiled_on:
        ours = onnxrun.InferenceSession(blob).run(None, {"X": X})[0]
    else:
        with jit.disabled():
            ours = onnxrun.InferenceSession(blob).run(None, {"X": X})[0]
    theirs = ort.InferenceSession(blob, providers=["CPUExecutionProvider"]).run(
        None, {"X": X})[0]
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=2e-6)
