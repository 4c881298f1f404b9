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


def test_fast_gelu_polynomial_is_the_tanh_form():
    """FastGelu's x / (1 + 2^(x P(x^2))) (gelu_polynomial.FAST_GELU_LOGIT): within float32
    rounding of 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), compiled and on the numpy
    path; +inf and NaN stay so (-inf is NaN in both forms: -inf times 0)."""
    from onnxrun.providers.cpu.gelu_polynomial import FAST_GELU_LOGIT

    xs = np.concatenate([np.linspace(-12, 12, 20001), [-100.0, 100.0, 3e38, -3e38]]).astype(
        np.float32)
    exact = np.array([0.5 * v * (1 + math.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v ** 3)))
                      for v in xs.astype(float)])
    for y in (gelu.bias_gelu(FAST_GELU_LOGIT, xs),
              _numpy_path_fast(xs)):
        np.testing.assert_allclose(y, exact, rtol=2e-6, atol=2e-7)
    specials = np.array([np.inf, -np.inf, np.nan], np.float32)
    y = gelu.bias_gelu(FAST_GELU_LOGIT, specials)
    assert y[0] == np.inf and np.isnan(y[2])


def _numpy_path_fast(x):
    from onnxrun.providers.cpu.gelu_polynomial import FAST_GELU_LOGIT

    with jit.disabled():
        return gelu_float32(x, coeffs=FAST_GELU_LOGIT)


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


# -- SiLU / QuickGelu: the same pass with a constant polynomial ------------------------------


def _silu_reference(x, alpha):
    with np.errstate(all="ignore"):
        x64 = x.astype(np.float64)
        return (x64 / (1 + np.exp(-alpha * x64))).astype(np.float32)


@pytest.mark.parametrize("n", [1, 15, 16, 17, 4095, 4096, 4097, 70000])
@pytest.mark.parametrize("alpha", [1.0, 1.702, -0.5])
def test_quick_gelu_equals_x_sigmoid_alpha_x(n, alpha):
    rng = np.random.default_rng(n)
    x = (rng.standard_normal(n) * 6).astype(np.float32)
    specials = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-30, 90.0, -90.0, 3e38, -3e38]
    x[:len(specials)] = specials[:n]
    y = gelu.quick_gelu(x, alpha)
    with np.errstate(all="ignore"):  # the numpy path's formula: x * sigmoid(alpha x)
        numpy_path = x * (1 / (1 + np.exp(-alpha * x)))
    assert np.array_equal(np.isnan(y), np.isnan(numpy_path))
    _agree(y, _silu_reference(x, alpha))
    z = x.copy()
    assert gelu.quick_gelu(z, alpha, out=z) is z
    assert np.array_equal(z, y, equal_nan=True)


def test_quick_gelu_threads_and_bad_inputs(monkeypatch):
    from onnxrun.providers.cpu.compiled import spin

    forks = []
    fork = spin.Pool.fork
    monkeypatch.setattr(spin.Pool, "fork", lambda self, job, argv, **kw: forks.append(
        len(argv)) or fork(self, job, argv, **kw))
    x = np.random.default_rng(0).standard_normal(4096 * 40 + 5).astype(np.float32)
    np.testing.assert_array_equal(gelu.quick_gelu(x, threads=3), gelu.quick_gelu(x))
    assert forks or spin.unavailable() is not None  # rows on spin.py's workers
    with pytest.raises(ValueError, match="1-D contiguous"):
        gelu.quick_gelu(x.reshape(-1, 5))
    with pytest.raises(ValueError, match="out"):
        gelu.quick_gelu(x, out=np.empty(3, np.float32))


def _silu_model(alpha=None):
    attrs = {} if alpha is None else {"alpha": alpha}
    node = helper.make_node("QuickGelu", ["X"], ["Y"], domain="com.microsoft", **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("X", TP.FLOAT, None)],
                              [helper.make_tensor_value_info("Y", TP.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[
        helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]).SerializeToString()


@pytest.mark.parametrize("alpha", [None, 1.0])
@pytest.mark.parametrize("shape", [(3, 5), (1, 16, 20, 20), (2, 7, 41)])
def test_quick_gelu_operator_equals_onnxruntime_and_the_numpy_path(shape, alpha):
    X = (np.random.default_rng(2).standard_normal(shape) * 4).astype(np.float32)
    blob = _silu_model(alpha)
    ours = onnxrun.InferenceSession(blob).run(None, {"X": X})[0]
    with jit.disabled():
        numpy_path = onnxrun.InferenceSession(blob).run(None, {"X": X})[0]
    theirs = ort.InferenceSession(blob, providers=["CPUExecutionProvider"]).run(
        None, {"X": X})[0]
    # the operator computes MLAS's own logistic (compiled/logistic.py): onnxruntime's bits
    assert ours.tobytes() == theirs.tobytes()
    np.testing.assert_allclose(numpy_path, theirs, rtol=1e-5, atol=2e-6)


def test_quick_gelu_keeps_a_channels_last_input_channels_last():
    from onnxrun.providers.cpu.ops.contrib.fused import QuickGelu

    class Ctx:
        session_options = None

    X = np.random.default_rng(3).standard_normal((2, 5, 6, 24)).astype(np.float32)
    X = X.transpose(0, 3, 1, 2)  # NCHW-shaped view of channels-last memory
    Y = QuickGelu(Ctx(), alpha=1.0)(X)
    assert Y.transpose(0, 2, 3, 1).flags.c_contiguous
    # MLAS's logistic (compiled/logistic.py), element for element whatever the memory order
    from onnxrun.providers.cpu.compiled import logistic

    dense = logistic.quick_gelu(np.ascontiguousarray(X), 1.0)
    assert Y.tobytes() == np.ascontiguousarray(Y).tobytes() and np.array_equal(Y, dense)
    odd = X[:, :, ::2]  # not dense: the numpy path, close to the same values
    np.testing.assert_allclose(QuickGelu(Ctx(), alpha=1.0)(odd), _silu_reference(odd, 1.0),
                               rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("target", ["avx2", "avxvnni", "avx512", "avx512vnni"])
def test_the_silu_variant_builds_for_every_target(target):
    """The constant-polynomial IR (compiled, not run, for AVX-512 on an AVX2 host)."""
    from onnxrun.providers.cpu.compiled import targets

    answer = jit._compile({"silu": gelu.module_ir([-1.4426950408889634], "silu")},
                          targets.get(target))
    assert answer["error"] is None and answer["errors"] == {} and "silu" in answer["objects"]
