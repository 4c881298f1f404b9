"""The compiled kernels (providers/cpu/compiled/): the int8 GEMM against an int64 numpy
reference, the dynamic quantizer against the numpy kernels, and every operator that uses them
against its own numpy path (a session prepared inside ``compiled.disabled()``), bit for bit.

Every test runs once per target the host supports (``compiled.forced_target``: an AVX-512 VNNI
machine runs the avx512vnni, avx512 and avx2 code, an AVX2 one the avx2 code). Skipped where
the kernels cannot run (no llvmlite, not x86-64 Linux, a CPU below AVX2+FMA, or
ONNXRUN_COMPILED_KERNELS=0); the operator tests against onnxruntime then cover the numpy path.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import textwrap

import numpy as np
import onnx
import pytest
from concurrency import assert_threads_match_serial, spy_hand_offs
from one_node_harness import one_node
from onnx import TensorProto as TP

import onnxrun
from onnxrun.geometry import window_geometry
from onnxrun.providers.cpu import compiled
from onnxrun.providers.cpu.compiled import int8_depthwise, int8_gemm, ir, lstm, quantize, targets
from onnxrun.providers.cpu.ops import rnn
from onnxrun.providers.cpu.ops.contrib.quantization import dynamic_quantize
from onnxrun.providers.cpu.ops.quantization import DynamicQuantizeLinear
from onnxrun.providers.cpu.ops.rnn import fast_lstm_cell

_REASON = int8_gemm.unavailable() or quantize.unavailable()
pytestmark = pytest.mark.skipif(_REASON is not None, reason=f"compiled kernels: {_REASON}")

MS = "com.microsoft"
_HOST_TARGETS = [t.name for t in targets.TARGETS if targets.select(t.name)[0] is not None]


@pytest.fixture(autouse=True, params=_HOST_TARGETS or ["none"])
def target(request):
    """Each test on each target this host runs."""
    if request.param == "none":
        yield None
        return
    with compiled.forced_target(request.param) as t:
        yield t


RNG = np.random.default_rng(20240611)


def _ints(dtype, shape) -> np.ndarray:
    info = np.iinfo(dtype)
    return RNG.integers(info.min, int(info.max) + 1, size=shape).astype(dtype)


def _reference(A, a_zp, B, b_zp) -> np.ndarray:
    """sum_k (A - a_zp)(B - b_zp) in int64."""
    zb = 0 if b_zp is None else np.asarray(b_zp, np.int64)
    return (A.astype(np.int64) - a_zp) @ (B.astype(np.int64) - zb)


# -- PackedB.matmul -----------------------------------------------------------------------------

# M: full tiles of 8 and tails, 0 rows; N: panels of 32 and tails; K: multiples of 4 and tails
_SHAPES = [(1, 1, 1), (0, 5, 7), (3, 1, 33), (7, 13, 31), (8, 4, 32), (9, 17, 64), (17, 259, 95),
           (33, 64, 100), (2, 3, 200)]
_ZERO_POINTS = ["none", "scalar", "per-column"]


def _b_zero_point(kind: str, dtype, N: int):
    if kind == "none":
        return None
    if kind == "scalar":
        return _ints(dtype, ())
    return _ints(dtype, (N,))


@pytest.mark.parametrize("M,K,N", _SHAPES)
@pytest.mark.parametrize("a_dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("b_dtype", [np.int8, np.uint8])
@pytest.mark.parametrize("zp_kind", _ZERO_POINTS)
def test_matmul_int32_is_exact(M, K, N, a_dtype, b_dtype, zp_kind):
    A, B = _ints(a_dtype, (M, K)), _ints(b_dtype, (K, N))
    b_zp = _b_zero_point(zp_kind, b_dtype, N)
    a_zp = int(_ints(a_dtype, ()))
    got = int8_gemm.PackedB(B, b_zp).matmul(A, a_zp)
    assert got.dtype == np.int32 and got.shape == (M, N)
    np.testing.assert_array_equal(got, _reference(A, a_zp, B, b_zp))


@pytest.mark.parametrize("M,K,N", _SHAPES)
@pytest.mark.parametrize("scale_kind", ["scalar", "per-column"])
@pytest.mark.parametrize("with_bias", [False, True])
def test_matmul_float32_rounds_like_numpy(M, K, N, scale_kind, with_bias):
    """float(acc) * scale (+ bias), each operation rounded to float32 once, as MLAS."""
    A, B = _ints(np.uint8, (M, K)), _ints(np.int8, (K, N))
    b_zp = _ints(np.int8, (N,))
    a_zp = 131
    size = () if scale_kind == "scalar" else (N,)
    # both signs: a zero accumulator times a negative scale is -0.0 without a bias
    scale = (RNG.uniform(1e-4, 1e-2, size) * RNG.choice([-1, 1], size)).astype(np.float32)
    bias = RNG.standard_normal(N).astype(np.float32) if with_bias else None
    B[:, ::3] = b_zp[::3]  # columns of zero accumulators: the result's sign is the scale's
    acc = _reference(A, a_zp, B, b_zp)
    got = int8_gemm.PackedB(B, b_zp).matmul(A, a_zp, scale=scale, bias=bias)
    want = acc.astype(np.float32) * scale
    if bias is not None:
        want = want + bias
    assert got.dtype == np.float32 and got.shape == (M, N)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want))


@pytest.mark.parametrize("M,K,N", _SHAPES)
@pytest.mark.parametrize("bounds", [(0.0, np.inf), (-0.5, 0.25)])
def test_matmul_float32_clipped(M, K, N, bounds):
    """A fused Relu / Clip: np.clip of the scaled and biased result, bit for bit (the -0.0 of
    a zero accumulator times a negative scale kept where the bounds let it through)."""
    A, B = _ints(np.uint8, (M, K)), _ints(np.int8, (K, N))
    scale = (RNG.uniform(1e-4, 1e-2, (N,)) * RNG.choice([-1, 1], (N,))).astype(np.float32)
    bias = (RNG.standard_normal(N) * 0.3).astype(np.float32)
    acc = _reference(A, 3, B, None)
    got = int8_gemm.PackedB(B, None).matmul(A, 3, scale=scale, bias=bias, clip=bounds)
    want = np.clip(acc.astype(np.float32) * scale + bias, np.float32(bounds[0]),
                   np.float32(bounds[1]))
    np.testing.assert_array_equal(got, want)


def test_matmul_writes_into_out():
    A, B = _ints(np.uint8, (5, 40)), _ints(np.int8, (40, 70))
    packed = int8_gemm.PackedB(B, None)
    out = np.full((5, 70), np.nan, np.float32)
    got = packed.matmul(A, 7, scale=np.float32(0.5), out=out)
    assert got is out
    np.testing.assert_array_equal(out, _reference(A, 7, B, None).astype(np.float32) * 0.5)


@pytest.mark.parametrize("scale", [None, np.float32(0.01)])
def test_matmul_threads_equal_one_thread(scale):
    A, B = _ints(np.uint8, (37, 300)), _ints(np.int8, (300, 250))
    packed = int8_gemm.PackedB(B, _ints(np.int8, (250,)))
    one = packed.matmul(A, 100, scale=scale, threads=1)
    np.testing.assert_array_equal(packed.matmul(A, 100, scale=scale, threads=2), one)
    np.testing.assert_array_equal(packed.matmul(A, 100, scale=scale, threads=4), one)


def test_matmul_rejects_bad_inputs():
    packed = int8_gemm.PackedB(_ints(np.int8, (16, 8)), None)
    with pytest.raises(ValueError):
        packed.matmul(_ints(np.uint8, (2, 15)), 0)  # K is 16
    with pytest.raises(ValueError):
        packed.matmul(_ints(np.uint8, (2, 4, 16)), 0)  # not 2-D
    with pytest.raises(TypeError):
        packed.matmul(np.zeros((2, 16), np.float32), 0)
    with pytest.raises(TypeError):
        packed.matmul(np.zeros((2, 16), np.int16), 0)
    with pytest.raises(ValueError):
        int8_gemm.PackedB(np.zeros((4, 4), np.float32), None)
    with pytest.raises(ValueError):
        int8_gemm.PackedB(np.zeros(4, np.int8), None)


# -- dynamic_quantize_u8 ------------------------------------------------------------------------


def _samples():
    for n in (0, 1, 15, 16, 17, 1000):
        yield f"normal-{n}", RNG.standard_normal(n).astype(np.float32) * 3
    yield "zeros", np.zeros(37, np.float32)
    yield "positive", RNG.uniform(0.5, 4.0, 33).astype(np.float32)
    yield "negative", RNG.uniform(-4.0, -0.5, 33).astype(np.float32)
    yield "one-value", np.full(20, 2.5, np.float32)
    yield "huge", (RNG.standard_normal(50) * 1e30).astype(np.float32)
    yield "float32-extremes", np.array([3e38, -3e38, 1.0, -2.0, 0.0], np.float32)
    yield "tiny", (RNG.standard_normal(40) * 1e-30).astype(np.float32)
    yield "matrix", RNG.standard_normal((7, 19)).astype(np.float32)
    # non-finite: where a NaN sits decides what MLAS's min/max lanes make of it
    for n in (5, 21, 40, 77):
        for fill, rate in ((np.nan, 0.1), (np.nan, 0.8), (np.inf, 0.1), (-np.inf, 0.1)):
            x = RNG.standard_normal(n).astype(np.float32)
            x[RNG.random(n) < rate] = fill
            x[n // 2] = fill
            yield f"{fill}-{rate}-{n}", x
    yield "all-nan", np.full(50, np.nan, np.float32)
    yield "all-inf", np.full(50, np.inf, np.float32)
    yield "nan-then-one", np.array([np.nan] * 20 + [1.0], np.float32)


_SAMPLES = dict(_samples())


@pytest.mark.parametrize("name", list(_SAMPLES))
def test_dynamic_quantize_equals_the_contrib_numpy_kernel(name):
    x = _SAMPLES[name]
    with np.errstate(over="ignore", invalid="ignore"):
        centered_q, scale, zp = dynamic_quantize(x)
        want = (centered_q + zp).astype(np.uint8)
    codes, got_scale, got_zp = quantize.dynamic_quantize_u8(x, 1.0)
    assert codes.dtype == np.uint8 and codes.shape == x.shape
    assert got_zp == zp
    np.testing.assert_array_equal(np.float32(got_scale), np.float32(scale))  # NaN == NaN here
    np.testing.assert_array_equal(codes, want)


@pytest.mark.parametrize("name", list(_SAMPLES))
def test_dynamic_quantize_equals_dynamic_quantize_linear(name):
    x = _SAMPLES[name]
    with np.errstate(over="ignore", invalid="ignore"):
        want_q, want_scale, want_zp = DynamicQuantizeLinear(x)
    codes, scale, zp = quantize.dynamic_quantize_u8(x, 1.0)
    np.testing.assert_array_equal(codes, want_q)
    np.testing.assert_array_equal(np.float32(scale), want_scale)
    assert zp == int(want_zp)


def test_dynamic_quantize_into_a_larger_buffer():
    x = RNG.standard_normal((3, 10)).astype(np.float32)
    buf = np.full(64, 7, np.uint8)
    codes, _, _ = quantize.dynamic_quantize_u8(x, 1.0, out=buf)
    want, _, _ = quantize.dynamic_quantize_u8(x, 1.0)
    np.testing.assert_array_equal(buf[:30], want.reshape(-1))
    np.testing.assert_array_equal(buf[30:], 7)  # nothing written past x.size
    assert codes.dtype == np.uint8
    with pytest.raises(ValueError):
        quantize.dynamic_quantize_u8(x, 1.0, out=np.empty(29, np.uint8))


# -- operators: compiled path == numpy path -----------------------------------------------------


def _sessions(model: bytes, threads: int = 1):
    """(numpy-path session, compiled-path session) of one model."""
    so = onnxrun.SessionOptions()
    so.intra_op_num_threads = threads
    with compiled.disabled():
        ref = onnxrun.InferenceSession(model, so)
    return ref, onnxrun.InferenceSession(model, so)


def _kernels(sess):
    return [step.kernel for step in sess._program.steps]


class _Counting:
    """``cls.method``, counting its calls (proof that a session took a compiled path)."""

    def __init__(self, monkeypatch, cls, method: str) -> None:
        self.calls = 0
        original = getattr(cls, method)

        def counted(this, *args, **kwargs):
            self.calls += 1
            return original(this, *args, **kwargs)

        monkeypatch.setattr(cls, method, counted)


def _assert_same_outputs(model: bytes, feeds, monkeypatch, threads: int = 1):
    ref, sess = _sessions(model, threads)
    counter = _Counting(monkeypatch, int8_gemm.PackedB, "matmul")
    want = ref.run(None, feeds)
    assert counter.calls == 0, "the numpy-path session called the compiled GEMM"
    got = sess.run(None, feeds)
    assert counter.calls > 0, "the session did not take the compiled path"
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g, w)
        if g.dtype.kind == "f":
            np.testing.assert_array_equal(np.signbit(g), np.signbit(w))
    return ref, sess


@pytest.mark.parametrize("C", [16, 20, 37])  # whole 16-channel chunks, and a masked last one
@pytest.mark.parametrize("x_dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("strides,pads,bias", [((1, 1), (1, 1, 1, 1), False),
                                               ((2, 2), (0, 1, 2, 1), True)])
def test_qlinear_conv_depthwise(C, x_dtype, strides, pads, bias, monkeypatch):
    """QLinearConv with group == channels on the compiled depthwise kernel, bit for bit."""
    X = _ints(x_dtype, (2, C, 9, 11))
    W = _ints(np.int8, (C, 1, 3, 3))
    inputs = [X, np.float32(0.02), _ints(x_dtype, ()), W,
              (RNG.random(C) * 0.02 + 0.001).astype(np.float32), np.zeros(C, np.int8),
              np.float32(0.05), _ints(x_dtype, ()),
              RNG.integers(-2000, 2000, C).astype(np.int32) if bias else None]
    model, feeds = one_node("QLinearConv", inputs, opset=10, const=(1, 2, 3, 4, 5, 6, 7, 8),
                            group=C, kernel_shape=[3, 3], strides=list(strides),
                            pads=list(pads))
    ref, sess = _sessions(model, 1)
    counter = _Counting(monkeypatch, int8_depthwise.DepthwiseWeights, "run")
    want = ref.run(None, feeds)
    assert counter.calls == 0
    got = sess.run(None, feeds)
    assert counter.calls > 0, "the session did not take the compiled depthwise kernel"
    np.testing.assert_array_equal(got[0], want[0])


_B_CASES = [  # (B type, zero-point kind)
    (np.int8, "none"), (np.int8, "scalar"), (np.uint8, "scalar"), (np.int8, "per-column"),
    (np.uint8, "per-column"),
]


@pytest.mark.parametrize("b_dtype,zp_kind", _B_CASES)
@pytest.mark.parametrize("a_dtype", [np.uint8, np.int8])
def test_matmul_integer(b_dtype, zp_kind, a_dtype, monkeypatch):
    A, B = _ints(a_dtype, (2, 5, 37)), _ints(b_dtype, (37, 45))
    b_zp = _b_zero_point(zp_kind, b_dtype, 45)
    a_zp = _ints(a_dtype, ())
    inputs = [A, B, a_zp, b_zp]
    model, feeds = one_node("MatMulInteger", inputs, opset=21, const=(1, 3),
                            out_types=[TP.INT32])
    ref, sess = _assert_same_outputs(model, feeds, monkeypatch)
    assert _kernels(sess)[0].B.packed is not None
    assert _kernels(ref)[0].B.packed is None


@pytest.mark.parametrize("b_dtype,zp_kind", _B_CASES[1:])
def test_qlinear_matmul(b_dtype, zp_kind, monkeypatch):
    N = 70
    A, B = _ints(np.uint8, (9, 33)), _ints(b_dtype, (33, N))
    per_col = zp_kind == "per-column"
    b_scale = RNG.uniform(0.001, 0.01, (N,) if per_col else ()).astype(np.float32)
    inputs = [A, np.float32(0.05), np.uint8(120), B, b_scale,
              _b_zero_point(zp_kind, b_dtype, N), np.float32(0.2), np.uint8(128)]
    model, feeds = one_node("QLinearMatMul", inputs, opset=21, const=(3, 4, 5),
                            out_types=[TP.UINT8])
    _, sess = _assert_same_outputs(model, feeds, monkeypatch)
    assert _kernels(sess)[0].B.packed is not None


@pytest.mark.parametrize("b_dtype,zp_kind", _B_CASES[1:])
@pytest.mark.parametrize("requantized", [False, True])
def test_qgemm(b_dtype, zp_kind, requantized, monkeypatch):
    N = 40
    A, B = _ints(np.uint8, (6, 21)), _ints(b_dtype, (N, 21))  # transB
    per_col = zp_kind == "per-column"
    b_scale = RNG.uniform(0.001, 0.01, (N,) if per_col else ()).astype(np.float32)
    C = RNG.integers(-5000, 5000, N).astype(np.int32)
    inputs = [A, np.float32(0.04), np.uint8(110), B, b_scale,
              _b_zero_point(zp_kind, b_dtype, N), C]
    if requantized:
        inputs += [np.float32(0.3), np.uint8(100)]
    model, feeds = one_node("QGemm", inputs, opset=21, const=(3, 4, 5, 6), domain=MS,
                            out_types=[TP.UINT8 if requantized else TP.FLOAT], transB=1,
                            alpha=0.75)
    _, sess = _assert_same_outputs(model, feeds, monkeypatch)
    assert _kernels(sess)[0].B.packed is not None


@pytest.mark.parametrize("b_dtype,zp_kind", _B_CASES)
@pytest.mark.parametrize("with_bias", [False, True])
def test_dynamic_quantize_matmul(b_dtype, zp_kind, with_bias, monkeypatch):
    N = 66
    A = RNG.standard_normal((3, 4, 29)).astype(np.float32)
    B = _ints(b_dtype, (29, N))
    per_col = zp_kind == "per-column"
    b_scale = RNG.uniform(0.001, 0.01, (N,) if per_col else (1,)).astype(np.float32)
    b_zp = _b_zero_point(zp_kind, b_dtype, N)
    bias = RNG.standard_normal(N).astype(np.float32) if with_bias else None
    inputs = [A, B, b_scale, b_zp, bias]
    model, feeds = one_node("DynamicQuantizeMatMul", inputs, opset=21, const=(1, 2, 3, 4),
                            domain=MS, out_types=[TP.FLOAT])
    _, sess = _assert_same_outputs(model, feeds, monkeypatch)
    assert _kernels(sess)[0].B.packed is not None


@pytest.mark.parametrize("a_dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("b_dtype,zp_kind", _B_CASES)
def test_matmul_integer_to_float(a_dtype, b_dtype, zp_kind, monkeypatch):
    N = 35
    A, B = _ints(a_dtype, (2, 7, 18)), _ints(b_dtype, (18, N))
    per_col = zp_kind == "per-column"
    b_scale = RNG.uniform(0.001, 0.01, (N,) if per_col else (1,)).astype(np.float32)
    inputs = [A, B, np.array([0.03], np.float32), b_scale, _ints(a_dtype, (1,)),
              _b_zero_point(zp_kind, b_dtype, N), RNG.standard_normal(N).astype(np.float32)]
    model, feeds = one_node("MatMulIntegerToFloat", inputs, opset=21, const=(1, 3, 5, 6),
                            domain=MS, out_types=[TP.FLOAT])
    _, sess = _assert_same_outputs(model, feeds, monkeypatch)
    assert _kernels(sess)[0].B.packed is not None


def _lstm_inputs(T, batch, I, H, direction, wtype, per_channel, *, lens=None, init=False,
                 peep=False):
    D = 2 if direction == "bidirectional" else 1
    shape = (D, 4 * H) if per_channel else (D,)
    zp = np.full(shape, 0 if wtype == np.int8 else 128, wtype)
    if per_channel:  # zero points that are not all equal: the per-column correction
        zp = (zp.astype(np.int32) + RNG.integers(-3, 4, shape)).astype(wtype)
    x = RNG.standard_normal((T, batch, I)).astype(np.float32)
    h0 = c0 = None
    if init:
        h0, c0 = ((RNG.standard_normal((D, batch, H)) * 0.5).astype(np.float32)
                  for _ in range(2))
    return [x, _ints(wtype, (D, I, 4 * H)), _ints(wtype, (D, H, 4 * H)),
            (RNG.standard_normal((D, 8 * H)) * 0.3).astype(np.float32),
            None if lens is None else np.array(lens, np.int32), h0, c0,
            (RNG.standard_normal((D, 3 * H)) * 0.3).astype(np.float32) if peep else None,
            RNG.uniform(0.001, 0.01, shape).astype(np.float32), zp,
            RNG.uniform(0.001, 0.01, shape).astype(np.float32), zp.copy()]


_LSTMS = [  # (T, batch, I, H, direction, weight type, per channel, extras)
    (7, 1, 13, 40, "forward", np.int8, False, {}),
    (5, 3, 5, 8, "reverse", np.int8, True, {}),
    (6, 2, 33, 24, "bidirectional", np.uint8, False, {}),
    (6, 3, 6, 10, "bidirectional", np.uint8, True, {"init": True}),
    (6, 3, 5, 8, "bidirectional", np.int8, False, {"lens": [6, 3, 0], "init": True}),
    (5, 2, 4, 9, "forward", np.int8, True, {"peep": True}),
    (4, 9, 20, 16, "forward", np.int8, False, {}),
]


def _fused(extra) -> bool:
    """Whether the case takes the compiled recurrence (full-length sequences, no peepholes)."""
    return not extra.get("lens") and not extra.get("peep")


@pytest.mark.parametrize("T,batch,I,H,direction,wtype,per_channel,extra", _LSTMS)
def test_dynamic_quantize_lstm(T, batch, I, H, direction, wtype, per_channel, extra,
                               monkeypatch):
    """Products on the compiled GEMM, bit for bit; where the whole recurrence is compiled,
    equal but for tanh's last bits (ours and numpy's differ by an ulp or two)."""
    inputs = _lstm_inputs(T, batch, I, H, direction, wtype, per_channel, **extra)
    model, feeds = one_node("DynamicQuantizeLSTM", inputs, opset=21, n_out=3,
                            const=(1, 2, 3, 7, 8, 9, 10, 11), domain=MS,
                            out_types=[TP.FLOAT] * 3, hidden_size=H, direction=direction)
    recurrences = _Counting(monkeypatch, lstm.Int8Recurrence, "run")
    if _fused(extra):
        ref, sess = _sessions(model)
        want = ref.run(None, feeds)
        assert recurrences.calls == 0
        got = sess.run(None, feeds)
        assert recurrences.calls == (2 if direction == "bidirectional" else 1)
        for g, w in zip(got, want, strict=True):
            assert g.dtype == w.dtype and g.shape == w.shape
            np.testing.assert_allclose(g, w, rtol=0, atol=1e-6)
    else:
        ref, sess = _assert_same_outputs(model, feeds, monkeypatch)
        assert recurrences.calls == 0
    for d_weights in _kernels(sess)[0].weights:
        assert all(w.packed is not None for w in d_weights)
    for d_weights in _kernels(ref)[0].weights:
        assert all(w.packed is None for w in d_weights)


@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("clip", [None, 0.9])
def test_dynamic_quantize_lstm_non_finite(with_bias, clip, monkeypatch):
    """NaN / inf in X through the compiled recurrence: its quantizer (MLAS's NaN lanes) and
    gate clip (a biased LSTM's NaN gate becomes +clip) as the numpy path's, which
    test_ops_quantization checks against onnxruntime."""
    inputs = _lstm_inputs(6, 3, 5, 8, "bidirectional", np.int8, False)
    inputs[0][1, 0] = np.nan
    inputs[0][2, 1, 0], inputs[0][3, 2, 1] = np.inf, -np.inf
    if not with_bias:
        inputs[3] = None
    attrs = {"hidden_size": 8, "direction": "bidirectional"}
    if clip is not None:
        attrs["clip"] = clip
    model, feeds = one_node("DynamicQuantizeLSTM", inputs, opset=21, n_out=3,
                            const=(1, 2, 3, 7, 8, 9, 10, 11), domain=MS,
                            out_types=[TP.FLOAT] * 3, **attrs)
    recurrences = _Counting(monkeypatch, lstm.Int8Recurrence, "run")
    ref, sess = _sessions(model)
    want = ref.run(None, feeds)
    got = sess.run(None, feeds)
    assert recurrences.calls == 2
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=0, atol=1e-6)  # NaN where NaN
    assert np.isnan(got[0]).any() != with_bias


def _fast_cell_reference(xw, R, zb, r_scale, half, h, c, clip):
    """The numpy recurrence the compiled one replaces (rnn.fast_lstm_cell on the GEMM)."""
    packed = int8_gemm.PackedB(R, zb)
    scale = (np.asarray(r_scale, np.float32) * half).astype(np.float32)

    def recurrent(h, out):
        hq, a_scale, zp = quantize.dynamic_quantize_u8(h, 1.0)
        packed.matmul(hq, zp, scale=a_scale * scale, out=out)

    cell = fast_lstm_cell(R.shape[0], recurrent, half, None if clip is None else
                          np.float32(clip))
    ys = np.empty((xw.shape[0],) + h.shape, np.float32)
    for s, x in enumerate(xw):
        h, c = cell(x, h, c, out=ys[s])
    return ys, h, c


# (T, B, H, R type, per-column zero points, clip): H with K/4 tails past the 4-chain loop
# (H=37: 10 groups), under one chain (H=8), not a multiple of 16 units, partial panels
_RECURRENCES = [(5, 1, 8, np.int8, False, None), (7, 3, 40, np.uint8, True, None),
                (6, 2, 37, np.int8, True, 0.7), (40, 1, 64, np.int8, False, None),
                (9, 9, 19, np.uint8, False, 2.0), (4, 1, 1, np.int8, False, None),
                (3, 2, 16, np.uint8, True, None), (0, 2, 16, np.int8, False, None)]


@pytest.mark.parametrize("T,B,H,wtype,per_column,clip", _RECURRENCES)
def test_lstm_recurrence_equals_the_numpy_cell(T, B, H, wtype, per_column, clip):
    R = _ints(wtype, (H, 4 * H))
    zb = _ints(wtype, (4 * H,)) if per_column else np.array(0 if wtype == np.int8 else 128,
                                                             wtype)
    r_scale = RNG.uniform(0.001, 0.01, 4 * H).astype(np.float32)
    half = np.concatenate((np.full(3 * H, 0.5, np.float32), np.ones(H, np.float32)))
    xw = (RNG.standard_normal((T, B, 4 * H)) * half).astype(np.float32)
    h0, c0 = ((RNG.standard_normal((B, H)) * 0.5).astype(np.float32) for _ in range(2))
    want_ys, want_h, want_c = _fast_cell_reference(xw, R, zb, r_scale, half, h0, c0, clip)
    direction = lstm.Int8Recurrence(int8_gemm.PackedB(R, zb), r_scale, half, clip)
    h, c, ys = h0.copy(), c0.copy(), np.full((T, B, H), np.nan, np.float32)
    direction.run(xw, h, c, ys)
    for got, want in ((ys, want_ys), (h, want_h), (c, want_c)):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    if clip is not None:
        assert np.abs(c).max() > 0  # the state moved


def _float_cell_reference(xw, RT, half, h, c, clip):
    """The numpy recurrence the compiled float32 one replaces."""
    cell = fast_lstm_cell(RT.shape[0], lambda h, out: np.matmul(h, RT, out=out), half,
                          None if clip is None else np.float32(clip))
    ys = np.empty((xw.shape[0],) + h.shape, np.float32)
    for s, x in enumerate(xw):
        h, c = cell(x, h, c, out=ys[s])
    return ys, h, c


# (T, B, H, clip): groups of 4 rows and the 1-3 left over; H with K tails past the unrolled
# loop, units not a multiple of 16, partial panels
_FLOAT_RECURRENCES = [(5, 1, 8, None), (7, 2, 37, 0.6), (6, 3, 19, None), (4, 4, 64, None),
                      (3, 9, 30, 1.5), (5, 6, 1, None), (0, 2, 16, None)]


@pytest.mark.parametrize("T,B,H,clip", _FLOAT_RECURRENCES)
def test_float_lstm_recurrence_equals_the_numpy_cell(T, B, H, clip):
    half = np.concatenate((np.full(3 * H, 0.5, np.float32), np.ones(H, np.float32)))
    RT = (RNG.standard_normal((H, 4 * H)) / np.sqrt(H) * half).astype(np.float32)
    xw = (RNG.standard_normal((T, B, 4 * H)) * half).astype(np.float32)
    h0, c0 = ((RNG.standard_normal((B, H)) * 0.5).astype(np.float32) for _ in range(2))
    want_ys, want_h, want_c = _float_cell_reference(xw, RT, half, h0, c0, clip)
    recurrence = lstm.Float32Recurrence(RT, half, clip)
    h, c, ys = h0.copy(), c0.copy(), np.full((T, B, H), np.nan, np.float32)
    recurrence.run(xw, h, c, ys)
    for got, want in ((ys, want_ys), (h, want_h), (c, want_c)):  # summation order, tanh
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-6)


def test_float_lstm_recurrence_on_strided_steps():
    """A direction of [T, D, B, ...] arrays: steps D*B*G floats apart, in and out."""
    T, D, B, H = 4, 2, 3, 24
    half = np.concatenate((np.full(3 * H, 0.5, np.float32), np.ones(H, np.float32)))
    RT = (RNG.standard_normal((H, 4 * H)) / np.sqrt(H) * half).astype(np.float32)
    xs = (RNG.standard_normal((T, D, B, 4 * H)) * half).astype(np.float32)
    ys = np.zeros((T, D, B, H), np.float32)
    h, c = np.zeros((B, H), np.float32), np.zeros((B, H), np.float32)
    lstm.Float32Recurrence(RT, half, None).run(xs[:, 1], h, c, ys[:, 1])
    want = _float_cell_reference(np.ascontiguousarray(xs[:, 1]), RT, half, np.zeros((B, H),
                                 np.float32), np.zeros((B, H), np.float32), None)[0]
    np.testing.assert_allclose(ys[:, 1], want, rtol=0, atol=2e-6)
    assert not ys[:, 0].any()  # the other direction's slots untouched


def _float_rnn_inputs(gates: int, D: int, T: int, batch: int, I: int, H: int,
                      bias: bool = True) -> list:
    """X, W, R (and B) of a float32 LSTM (4 gates) or GRU (3), weights scaled to keep the
    gates off saturation."""
    inputs = [RNG.standard_normal((T, batch, I)).astype(np.float32),
              (RNG.standard_normal((D, gates * H, I)) * 0.3).astype(np.float32),
              (RNG.standard_normal((D, gates * H, H)) * 0.3).astype(np.float32)]
    if bias:
        inputs.append((RNG.standard_normal((D, 2 * gates * H)) * 0.3).astype(np.float32))
    return inputs


@pytest.mark.parametrize("direction,batch,threads", [("forward", 1, 1), ("reverse", 5, 1),
                                                     ("bidirectional", 2, 2),
                                                     ("bidirectional", 7, 1)])
def test_float_lstm_takes_the_compiled_recurrence(direction, batch, threads, monkeypatch):
    """The usual float32 LSTM runs each direction in one compiled call: outputs equal the
    numpy loop's but for tanh's and the products' last bits; both directions on 2 threads,
    by one fork to spin.py's workers where they run here."""
    from onnxrun.providers.cpu.compiled import spin

    T, I, H = 6, 10, 20
    D = 2 if direction == "bidirectional" else 1
    inputs = _float_rnn_inputs(4, D, T, batch, I, H)
    model, feeds = one_node("LSTM", inputs, opset=14, n_out=3, const=(1, 2, 3),
                            out_types=[TP.FLOAT] * 3, hidden_size=H, direction=direction)
    counter = _Counting(monkeypatch, lstm.Float32Recurrence, "_checked")  # run's, the fork's
    fresh = _Counting(monkeypatch, lstm.Float32Recurrence, "run_fresh")  # one direction
    forks, fork = [], spin.Pool.fork  # the jobs of spin.py's forks
    monkeypatch.setattr(spin.Pool, "fork", lambda pool, job, argv, at=0: forks.append(
        (job, len(argv))) or fork(pool, job, argv, at))
    ref, sess = _sessions(model, threads)
    want = ref.run(None, feeds)
    assert counter.calls == fresh.calls == 0
    got = sess.run(None, feeds)
    assert counter.calls + fresh.calls == D
    block = spin.function_address(lstm._block_function_of("lstm_f32"))
    split = threads > 1 and D > 1 and spin.usable() is not None
    assert [f for f in forks if f[0] == block] == ([(block, 2)] if split else [])
    if threads > 1:  # each direction whole on one thread: 1 thread's bits
        for g, w in zip(got, _sessions(model, 1)[1].run(None, feeds), strict=True):
            np.testing.assert_array_equal(g, w)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=0, atol=5e-6)


@pytest.mark.parametrize("op,gates", [("LSTM", 4), ("GRU", 3)])
def test_recurrent_input_product_runs_on_the_packed_panels(op, gates, monkeypatch):
    """All steps' input product X @ W^T (+ biases) of a layer with constant weights runs on the
    compiled GEMM's panels packed at creation (which then hold the only W^T), split over the
    threads: 2 threads give 1 thread's bits, the numpy session's outputs within rounding."""
    from onnxrun.providers.cpu.compiled import float_gemm

    T, B, I, H = 16, 2, 48, 32
    inputs = _float_rnn_inputs(gates, 2, T, B, I, H)
    model, feeds = one_node(op, inputs, opset=14, n_out=2 if op == "GRU" else 3,
                            const=(1, 2, 3), out_types=[TP.FLOAT] * (2 if op == "GRU" else 3),
                            hidden_size=H, direction="bidirectional")
    products = _Counting(monkeypatch, float_gemm.PackedMatrix, "run")
    ref, one = _sessions(model, 1)
    two = _sessions(model, 2)[1]
    for sess in (one, two):
        prepared = _kernels(sess)[0].prepared
        assert prepared["WT"] is None and prepared["packed"].K == I
    want = ref.run(None, feeds)
    assert products.calls == 0
    got = one.run(None, feeds)
    assert products.calls == 1
    for g, g2, w in zip(got, two.run(None, feeds), want, strict=True):
        np.testing.assert_array_equal(g, g2)
        np.testing.assert_allclose(g, w, rtol=0, atol=5e-6)


def test_float_lstm_falls_back_on_the_weights_rebuilt_from_the_panels(monkeypatch):
    """Sequences of different lengths take the numpy loop: its R^T, rebuilt from the compiled
    recurrences' panels (the session keeps one copy of R), gives the numpy session's outputs
    exactly."""
    T, B, I, H = 5, 3, 7, 12
    inputs = [*_float_rnn_inputs(4, 2, T, B, I, H, bias=False), None,
              np.array([5, 2, 4], np.int32)]
    model, feeds = one_node("LSTM", inputs, opset=14, n_out=3, const=(1, 2),
                            out_types=[TP.FLOAT] * 3, hidden_size=H, direction="bidirectional")
    ref, sess = _sessions(model)
    assert _kernels(sess)[0].prepared["RT"] is None  # only the panels hold R
    counter = _Counting(monkeypatch, lstm.Float32Recurrence, "run")
    for g, w in zip(sess.run(None, feeds), ref.run(None, feeds), strict=True):
        np.testing.assert_array_equal(g, w)
    assert counter.calls == 0
    np.testing.assert_array_equal(_kernels(sess)[0].prepared["RT"], _kernels(ref)[0].prepared["RT"])


def _gru_reference(xw, RT, rbh, h, clip):
    """rnn.GRU's step (linear_before_reset) in float64 activations, rounded per step."""
    H = RT.shape[0]
    ys = []
    for x in xw:
        zr = h @ RT[:, :2 * H] + x[:, :2 * H]
        if clip is not None:
            zr = np.clip(zr, -clip, clip)
        zr = 1 / (1 + np.exp(-zr.astype(np.float64)))
        hh = (h @ RT[:, 2 * H:] + rbh) * zr[:, H:] + x[:, 2 * H:]
        if clip is not None:
            hh = np.clip(hh, -clip, clip)
        hh = np.tanh(hh)
        h = ((h - hh) * zr[:, :H] + hh).astype(np.float32)
        ys.append(h)
    return np.array(ys).reshape(xw.shape[:2] + (H,)), h


@pytest.mark.parametrize("T,B,H,clip", [(5, 1, 8, None), (7, 3, 37, 0.7), (6, 5, 19, None),
                                        (4, 9, 64, 2.0), (3, 2, 1, None), (0, 2, 8, None)])
def test_gru_recurrence_equals_the_step(T, B, H, clip):
    RT = (RNG.standard_normal((H, 3 * H)) / np.sqrt(H)).astype(np.float32)
    rbh = (RNG.standard_normal(H) * 0.3).astype(np.float32)
    half = np.concatenate((np.full(2 * H, 0.5, np.float32), np.ones(H, np.float32)))
    xw = RNG.standard_normal((T, B, 3 * H)).astype(np.float32)
    h0 = (RNG.standard_normal((B, H)) * 0.5).astype(np.float32)
    want_ys, want_h = _gru_reference(xw, RT, rbh, h0.copy(), clip)
    recurrence = lstm.Float32Recurrence(RT, half, clip, "gru", rbh)
    h, ys = h0.copy(), np.full((T, B, H), np.nan, np.float32)
    recurrence.run(xw, h, None, ys)
    np.testing.assert_allclose(ys, want_ys, rtol=0, atol=1e-6)
    np.testing.assert_allclose(h, want_h, rtol=0, atol=1e-6)
    np.testing.assert_array_equal(recurrence.dense(), RT)


@pytest.mark.parametrize("direction,batch,threads,lbr", [("forward", 1, 1, 1),
                                                         ("bidirectional", 6, 2, 1),
                                                         ("reverse", 3, 1, 0)])
def test_float_gru_takes_the_compiled_recurrence(direction, batch, threads, lbr, monkeypatch):
    """GRU with linear_before_reset runs each direction in one compiled call, equal to the numpy
    loop but for rounding; without it (a second product on r*h per step) the numpy loop runs;
    sequences of different lengths take the numpy loop on R rebuilt from the panels, exactly."""
    T, I, H = 6, 10, 20
    D = 2 if direction == "bidirectional" else 1
    inputs = _float_rnn_inputs(3, D, T, batch, I, H)
    model, feeds = one_node("GRU", inputs, opset=14, n_out=2, const=(1, 2, 3),
                            out_types=[TP.FLOAT] * 2, hidden_size=H, direction=direction,
                            linear_before_reset=lbr)
    counter = _Counting(monkeypatch, lstm.Float32Recurrence, "_checked")  # run's, the fork's
    ref, sess = _sessions(model, threads)
    want = ref.run(None, feeds)
    got = sess.run(None, feeds)
    assert counter.calls == (D if lbr else 0)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=0, atol=5e-6)
    if lbr:
        lens = np.array([T, 2, 4, 1, 5, 3][:batch], np.int32)
        if batch > 1:
            ragged, ragged_feeds = one_node(
                "GRU", inputs + [lens], opset=14, n_out=2, const=(1, 2, 3),
                out_types=[TP.FLOAT] * 2, hidden_size=H, direction=direction,
                linear_before_reset=lbr)
            ref2, sess2 = _sessions(ragged, threads)
            assert _kernels(sess2)[0].prepared["RT_zr"] is None
            for g, w in zip(sess2.run(None, ragged_feeds), ref2.run(None, ragged_feeds),
                            strict=True):
                np.testing.assert_array_equal(g, w)


def test_lstm_recurrence_from_a_zero_state_and_bad_buffers():
    """h = 0 quantizes with the flat scale (zero point 0); wrong shapes are refused."""
    H = 16
    R = _ints(np.int8, (H, 4 * H))
    half = np.concatenate((np.full(3 * H, 0.5, np.float32), np.ones(H, np.float32)))
    direction = lstm.Int8Recurrence(int8_gemm.PackedB(R, None), np.float32(0.01), half,
                                        None)
    xw = (RNG.standard_normal((3, 1, 4 * H)) * half).astype(np.float32)
    h, c, ys = (np.zeros((1, H), np.float32), np.zeros((1, H), np.float32),
                np.empty((3, 1, H), np.float32))
    want = _fast_cell_reference(xw, R, None, np.float32(0.01), half, h.copy(), c.copy(), None)
    direction.run(xw, h, c, ys)
    np.testing.assert_allclose(ys, want[0], rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="ys must be"):
        direction.run(xw, h, c, np.empty((3, 1, H + 1), np.float32))
    with pytest.raises(ValueError, match="h must be"):
        direction.run(xw, h.astype(np.float64), c, ys)
    with pytest.raises(ValueError, match="must be"):
        lstm.Int8Recurrence(int8_gemm.PackedB(_ints(np.int8, (H, 3 * H)), None),
                                np.float32(0.01), half, None)


def test_tanh_is_within_three_ulp_and_odd():
    """The compiled tanh (ir.tanh_function) on 1.5M floats against float64's: <= 3 ulp, -0.0
    and NaN kept, saturated to +-1 far out."""
    body = "\n".join([
        *ir.declarations("fma", "rint", "minnum", "fabs", "copysign"), *ir.tanh_function(), "",
        "define void @tanh_all(ptr %x, ptr %o, i64 %n) nounwind {", "entry:",
        "  br label %l", "l:", "  %i = phi i64 [0, %entry], [%in, %l]",
        "  %p = getelementptr float, ptr %x, i64 %i",
        "  %v = load <16 x float>, ptr %p, align 4",
        "  %t = call <16 x float> @tanh16(<16 x float> %v)",
        "  %q = getelementptr float, ptr %o, i64 %i",
        "  store <16 x float> %t, ptr %q, align 4", "  %in = add i64 %i, 16",
        "  %m = icmp ult i64 %in, %n", "  br i1 %m, label %l, label %e", "e:", "  ret void",
        "}"])
    module = compiled.jit.compile_module(
        "test_tanh", body,
        {"tanh_all": ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)})
    x = np.concatenate([RNG.standard_normal(1 << 20) * 3, RNG.standard_normal(1 << 17) * 1e-3,
                        np.linspace(-12, 12, 1 << 18),
                        [0.0, -0.0, np.nan, np.inf, -np.inf, 1e-40, -1e-40, 9, 20, 100, -100,
                         0.3465, 0.3466, 1e-30]]).astype(np.float32)
    x = np.concatenate([x, np.zeros(-x.size % 16, np.float32)])
    out = np.empty_like(x)
    module.tanh_all(compiled.jit.address(x), compiled.jit.address(out), x.size)
    want = np.tanh(x.astype(np.float64))
    finite = np.isfinite(x)
    ulps = np.abs(out[finite] - want[finite]) / np.spacing(
        np.abs(want[finite]).astype(np.float32))
    assert ulps.max() <= 3, ulps.max()
    assert np.isnan(out[np.isnan(x)]).all()
    np.testing.assert_array_equal(out[np.isinf(x)], np.sign(x[np.isinf(x)]))
    np.testing.assert_array_equal(np.signbit(out), np.signbit(x) & ~np.isnan(x))


def test_environment_switch_keeps_the_numpy_path():
    script = textwrap.dedent("""
        import numpy as np, onnxrun
        from one_node_harness import one_node
        A = np.ones((2, 8), np.uint8)
        B = np.ones((8, 4), np.int8)
        model, feeds = one_node("MatMulInteger", [A, B], opset=21, const=(1,))
        sess = onnxrun.InferenceSession(model)
        from onnxrun.providers.cpu.compiled import int8_gemm
        print(sess._program.steps[0].kernel.B.packed is None, int8_gemm.unavailable())
        print(sess.run(None, feeds)[0].sum())
    """)
    env = dict(os.environ, ONNXRUN_COMPILED_KERNELS="0")
    tests_dir = os.path.dirname(__file__)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (tests_dir, env.get("PYTHONPATH")) if p)
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                         text=True, check=True, cwd=tests_dir).stdout.split("\n")
    assert out[0].startswith("True switched off"), out
    assert out[1] == str(2 * 4 * 8), out


# -- concurrency --------------------------------------------------------------------------------


@pytest.mark.parametrize("threads", [1, 2])
def test_one_session_on_four_threads(threads):
    """Concurrent runs of one session share nothing mutable: the LSTMs' per-run buffers and
    states, the GEMM's per-call arrays, intra-op threads splitting the panels or directions."""
    H = 48
    lstm_inputs = _lstm_inputs(6, 2, 30, H, "bidirectional", np.int8, True)
    lstm_model, lstm_feeds = one_node("DynamicQuantizeLSTM", lstm_inputs, opset=21, n_out=3,
                                      const=(1, 2, 3, 7, 8, 9, 10, 11), domain=MS,
                                      out_types=[TP.FLOAT] * 3, hidden_size=H,
                                      direction="bidirectional")
    dq_inputs = [RNG.standard_normal((64, 96)).astype(np.float32), _ints(np.int8, (96, 200)),
                 RNG.uniform(0.001, 0.01, (200,)).astype(np.float32), _ints(np.int8, (200,))]
    dq, dq_feeds = one_node("DynamicQuantizeMatMul", dq_inputs, opset=21, const=(1, 2, 3),
                            domain=MS, out_types=[TP.FLOAT])
    float_lstm, float_feeds = one_node("LSTM", _float_rnn_inputs(4, 2, 6, 2, 30, H, bias=False),
                                       opset=14, n_out=3, const=(1, 2),
                                       out_types=[TP.FLOAT] * 3, hidden_size=H,
                                       direction="bidirectional")
    for model, feeds in ((lstm_model, lstm_feeds), (dq, dq_feeds), (float_lstm, float_feeds)):
        so = onnxrun.SessionOptions()
        so.intra_op_num_threads = threads
        sess = onnxrun.InferenceSession(model, so)
        name = next(iter(feeds))
        assert_threads_match_serial(
            sess, [{**feeds, name: feeds[name] * (1 + k)} for k in range(4)], 5)


# -- float32 depthwise convolution ----------------------------------------------------------------

# (C, H, W, kernel, strides, pads, dilations, activation): edges on every side, asymmetric and
# no padding, strides, dilations, windows wider than the image, channel tails
_DEPTHWISE = [
    (32, 9, 11, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), "Relu"),
    (19, 8, 8, (3, 3), (2, 2), (0, 1, 1, 0), (1, 1), "Clip"),
    (40, 7, 12, (5, 5), (1, 2), (2, 2, 2, 2), (1, 1), ""),
    (16, 10, 10, (3, 3), (1, 1), (2, 2, 2, 2), (2, 2), "Clip"),
    (5, 3, 4, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), "LeakyRelu"),
    (24, 4, 3, (7, 7), (1, 1), (3, 3, 3, 3), (1, 1), ""),
    (48, 6, 6, (1, 3), (1, 1), (0, 1, 0, 1), (1, 1), "Relu"),
    (17, 5, 9, (3, 3), (3, 3), (0, 0, 0, 0), (1, 1), ""),
    # rows wide enough for the unrolled steps (input pixels loaded once per step at strides
    # 1 and 2, per tap otherwise), with the steps' remainders and both edges
    (24, 6, 23, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), "Relu"),
    (16, 7, 30, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), ""),
    (8, 5, 26, (3, 3), (1, 3), (0, 2, 0, 2), (1, 1), "Clip"),
    (8, 6, 27, (3, 3), (1, 1), (2, 2, 2, 2), (1, 2), ""),
]


@pytest.mark.parametrize("C,H,W,kernel,strides,pads,dilations,act", _DEPTHWISE)
@pytest.mark.parametrize("batch", [1, 2])
def test_float_depthwise_equals_the_numpy_kernels(C, H, W, kernel, strides, pads, dilations,
                                                  act, batch, monkeypatch):
    """FusedConv / Conv with group == channels on the compiled kernel (padding masked, never
    copied): equal to the numpy kernels to float32 rounding, the bias and a Relu / Clip in its
    epilogue, other activations after it."""
    from onnxrun.providers.cpu.compiled import depthwise

    X = RNG.standard_normal((batch, C, H, W)).astype(np.float32)
    Wt = RNG.standard_normal((C, 1) + kernel).astype(np.float32)
    B = RNG.standard_normal(C).astype(np.float32)
    attrs = dict(group=C, kernel_shape=list(kernel), strides=list(strides), pads=list(pads),
                 dilations=list(dilations))
    if act:
        model, feeds = one_node("FusedConv", [X, Wt, B], opset=17, const=(1, 2), domain=MS,
                                out_types=[TP.FLOAT], activation=act,
                                **({"activation_params": [0.0, 1.5]} if act == "Clip" else {}),
                                **attrs)
    else:
        model, feeds = one_node("Conv", [X, Wt, B], opset=17, const=(1, 2),
                                out_types=[TP.FLOAT], **attrs)
    counter = _Counting(monkeypatch, depthwise.DepthwiseFloat, "run")
    ref, sess = _sessions(model)
    want = ref.run(None, feeds)[0]
    assert counter.calls == 0
    got = sess.run(None, feeds)[0]
    assert counter.calls == 1
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("C,H,W,kernel,strides,pads", [
    (24, 6, 23, (3, 3), (1, 1), (1, 1, 1, 1)),  # whole chunks, the unrolled steps
    (19, 8, 8, (3, 3), (2, 2), (0, 1, 1, 0)),  # a partial chunk (masked lanes)
    (40, 7, 12, (5, 5), (1, 2), (2, 2, 2, 2)),
])
@pytest.mark.parametrize("act,alpha", [("QuickGelu", 1.0), ("QuickGelu", 1.702),
                                       ("Sigmoid", None)])
def test_float_depthwise_logistic_epilogue_has_the_standalone_bits(C, H, W, kernel, strides,
                                                                   pads, act, alpha):
    """A depthwise FusedConv's SiLU / QuickGelu or Sigmoid runs in the kernel's epilogue, on
    each row's pixels while they are in L1: the bits of the depthwise kernel without it
    followed by the standalone compiled logistic (MLAS's, onnxruntime's Sigmoid)."""
    from onnxrun.providers.cpu.compiled import depthwise, logistic

    X = RNG.standard_normal((2, H, W, C)).astype(np.float32) * 3
    Wt = RNG.standard_normal((C, 1) + kernel).astype(np.float32)
    dw = depthwise.DepthwiseFloat(Wt, RNG.standard_normal(C).astype(np.float32))
    geometry = window_geometry((H, W), kernel, strides, (1, 1), pads, "NOTSET")
    heads, outs = geometry[0], geometry[2]
    plain = dw.run(X, heads, outs, strides, (1, 1))
    fused = dw.run(X, heads, outs, strides, (1, 1),
                   logistic=(1.0 if alpha is None else alpha, alpha is not None))
    want = logistic.sigmoid(plain.reshape(-1)) if alpha is None else \
        logistic.quick_gelu(plain.reshape(-1), alpha)
    assert fused.tobytes() == want.tobytes()
    # a model's FusedConv takes that path: the same values as the numpy kernels
    model, feeds = one_node("FusedConv", [X.transpose(0, 3, 1, 2).copy(), Wt], opset=17,
                            const=(1,), domain=MS, out_types=[TP.FLOAT], activation=act,
                            **({"activation_params": [alpha]} if alpha is not None else {}),
                            group=C, kernel_shape=list(kernel), strides=list(strides),
                            pads=list(pads))
    ref, sess = _sessions(model)
    np.testing.assert_allclose(sess.run(None, feeds)[0], ref.run(None, feeds)[0], rtol=1e-5,
                               atol=1e-5)


def test_float_depthwise_bias_given_at_run_time(monkeypatch):
    """A bias that is a graph input (not a constant the kernel pads once) is added as given."""
    from onnxrun.providers.cpu.compiled import depthwise

    X = RNG.standard_normal((1, 24, 9, 10)).astype(np.float32)
    Wt = RNG.standard_normal((24, 1, 3, 3)).astype(np.float32)
    model, feeds = one_node("Conv", [X, Wt, np.zeros(24, np.float32)], opset=17, const=(1,),
                            out_types=[TP.FLOAT], group=24, pads=[1, 1, 1, 1])
    counter = _Counting(monkeypatch, depthwise.DepthwiseFloat, "run")
    ref, sess = _sessions(model)
    for _ in range(2):
        B = RNG.standard_normal(24).astype(np.float32)
        run = {**feeds, next(k for k, v in feeds.items() if v.ndim == 1): B}
        np.testing.assert_allclose(sess.run(None, run)[0], ref.run(None, run)[0], rtol=1e-5,
                                   atol=1e-5)
    assert counter.calls == 2


def test_float_depthwise_rows_split_on_the_spinning_workers(monkeypatch):
    """At 2+ intra-op threads a depthwise layer of at least two ranges of MIN_TAPS_PER_RANGE
    taps hands its output rows to spin.py's workers (taken in turn, each row whole on one
    thread): the same bits as at 1 thread; a smaller one hands nothing off (no fork, no queue
    of parallel.py's Python threads, where every split went before)."""
    from onnxrun.providers.cpu.compiled import depthwise

    forks, queued = spy_hand_offs(monkeypatch)
    X = RNG.standard_normal((2, 40, 23, 29)).astype(np.float32)
    Wt = RNG.standard_normal((40, 1, 3, 3)).astype(np.float32)
    B = RNG.standard_normal(40).astype(np.float32)
    model, feeds = one_node("FusedConv", [X, Wt, B], opset=17, const=(1, 2), domain=MS,
                            out_types=[TP.FLOAT], activation="Relu", group=40,
                            kernel_shape=[3, 3], strides=[1, 2], pads=[1, 1, 1, 1])
    counter = _Counting(monkeypatch, depthwise.DepthwiseFloat, "run")
    one = _sessions(model, 1)[1].run(None, feeds)[0]
    two = _sessions(model, 2)[1]
    assert two.run(None, feeds)[0].tobytes() == one.tobytes()
    assert forks == [] and queued == []  # 46 x 15 x 40 x 9 taps: one range
    monkeypatch.setattr(depthwise, "MIN_TAPS_PER_RANGE", 1024)
    for threads in (2, 3):
        sess = _sessions(model, threads)[1]
        for _ in range(5):
            assert sess.run(None, feeds)[0].tobytes() == one.tobytes()
    assert counter.calls == 12 and forks and queued == []


_EXPAND_DEPTHWISE = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[1, 16, 32, 32] x) => (float[1, 16, 32, 32] y) {
  a = Conv<group = 1>(x, we)
  d = Conv<group = 64, pads = [1, 1, 1, 1]>(a, wd, bd)
  r = Relu(d)
  y = Conv<group = 1>(r, wp)
}
"""


def test_float_depthwise_writes_into_the_executors_buffer(monkeypatch):
    """Written channels-last (between 1x1 convolutions), the depthwise output goes into the
    block memory.py hands it (256 KiB: pooled), run after run, with the same numbers."""
    from onnxrun.execute import CompiledSteps
    from onnxrun.providers.cpu.compiled import depthwise

    model = onnx.parser.parse_model(_EXPAND_DEPTHWISE)
    for name, shape in (("we", (64, 16, 1, 1)), ("wd", (64, 1, 3, 3)), ("bd", (64,)),
                        ("wp", (16, 64, 1, 1))):
        model.graph.initializer.append(onnx.numpy_helper.from_array(
            RNG.standard_normal(shape).astype(np.float32), name))
    from onnxrun.providers.cpu.ops.conv import Conv

    outs = []  # per call: whether the result lies in the buffer given
    original = Conv._depthwise_compiled

    def compiled_depthwise(this, *args):
        Y = original(this, *args)
        out = args[-1]
        outs.append(out is not None and np.shares_memory(Y, out))
        return Y

    monkeypatch.setattr(Conv, "_depthwise_compiled", compiled_depthwise)
    counter = _Counting(monkeypatch, depthwise.DepthwiseFloat, "run")
    ref, sess = _sessions(model.SerializeToString())
    x = RNG.standard_normal((1, 16, 32, 32)).astype(np.float32)
    want = ref.run(None, {"x": x})[0]
    for _ in range(CompiledSteps.GENERATE_AFTER + 3):
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], want, rtol=1e-4, atol=1e-4)
    assert counter.calls == len(outs) == CompiledSteps.GENERATE_AFTER + 3
    assert outs[:2] == [False, False] and all(outs[3:]), outs  # noted, recorded, then given


# -- compiling in a child process, loading the object here -----------------------------------


_GEMM_SCRIPT = textwrap.dedent("""
    import sys, numpy as np
    from onnxrun.providers.cpu.compiled import int8_gemm, jit
    if "--no-compiler" in sys.argv:  # every object must come from the cache
        def refuse(modules, target):
            raise AssertionError(f"compiler started for {sorted(modules)}")
        jit._compile = refuse
    B = np.arange(-60, 60, dtype=np.int8).reshape(12, 10)
    A = np.arange(36, dtype=np.uint8).reshape(3, 12)
    got = int8_gemm.PackedB(B).matmul(A, 2)
    assert (got == (A.astype(np.int64) - 2) @ B.astype(np.int64)).all()
    print("llvmlite" in sys.modules)
""")


def _gemm_in_a_process(cache: str, *args: str) -> str:
    env = dict(os.environ, ONNXRUN_KERNEL_CACHE=cache)
    return subprocess.run([sys.executable, "-c", _GEMM_SCRIPT, *args], capture_output=True,
                          text=True, check=True, env=env).stdout.strip()


def test_engine_process_never_loads_llvm():
    """The kernels compile in a compiler process: the engine's own process runs them without
    importing llvmlite (whose LLVM would stay resident, 60-80 MB)."""
    assert _gemm_in_a_process("0") == "False"  # no cache: compiled in this run


def test_kernel_cache_is_written_then_used(tmp_path):
    """The first process stores the bundle's objects; the next loads them without a compiler."""
    cache = tmp_path / "kernels"
    assert _gemm_in_a_process(str(cache)) == "False"
    entries = list(cache.glob("*.kernels"))
    assert len(entries) == 1
    assert _gemm_in_a_process(str(cache), "--no-compiler") == "False"
    assert not list(cache.glob(".tmp-*"))  # written atomically: no temporary file left


def test_damaged_kernel_cache_is_compiled_afresh(tmp_path):
    """A cache entry whose objects were changed (its tag no longer matches), or that is not an
    entry at all, costs a compile, never a wrong result or a crash; the next process is served
    by the entry written again."""
    import json

    from onnxrun.providers.cpu.compiled import cache as kernel_cache

    cache = tmp_path / "kernels"
    _gemm_in_a_process(str(cache))
    (entry,) = cache.glob("*.kernels")
    head = len(kernel_cache._MAGIC) + 65  # the tag and its newline
    data = entry.read_bytes()
    size = int.from_bytes(data[head:head + 8], "little")
    stored = json.loads(data[head + 8:head + 8 + size])
    objects = {name: b"\0\0\0" for name, _ in stored["objects"]}  # not ELF objects
    replaced = kernel_cache.payload(stored["key"], {"objects": objects,
                                                    "errors": stored["errors"]})
    entry.write_bytes(data[:head] + replaced)  # the old tag
    assert _gemm_in_a_process(str(cache)) == "False"
    assert _gemm_in_a_process(str(cache), "--no-compiler") == "False"  # stored afresh
    entry.write_bytes(b"\x00garbage")
    assert _gemm_in_a_process(str(cache)) == "False"
    assert _gemm_in_a_process(str(cache), "--no-compiler") == "False"


def test_no_compiler_process_without_llvmlite(monkeypatch):
    """Where llvmlite is not installed the answer is known without starting a process."""
    import importlib.util

    from onnxrun.providers.cpu.compiled import jit

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "llvmlite" else real(name, *a))

    def refuse(*args, **kwargs):
        raise AssertionError("a compiler process was started")

    monkeypatch.setattr(subprocess, "run", refuse)
    answer = jit._compile({"m": "define void @f() {\n  ret void\n}"}, targets.get("avx2"))
    assert answer["objects"] == {} and "llvmlite" in answer["error"]


def test_kernel_cache_switched_off_writes_nothing(tmp_path, monkeypatch):
    from onnxrun.providers.cpu.compiled import cache

    monkeypatch.setenv("ONNXRUN_KERNEL_CACHE", "0")
    assert cache.folder() is None
    avx2 = targets.get("avx2")
    assert cache.key({"m": "ir"}, avx2) is None
    monkeypatch.setenv("ONNXRUN_KERNEL_CACHE", str(tmp_path))
    key = cache.key({"m": "ir"}, avx2)
    assert key != cache.key({"m": "other ir"}, avx2)
    assert key != cache.key({"m": "ir"}, targets.get("avx512"))  # the target is in the key


def test_object_calling_outside_itself_is_refused():
    """The loader links self-contained objects only: a call to an undefined symbol is an
    error, never a jump to an unresolved address."""
    import base64

    from onnxrun.providers.cpu.compiled import elf, jit

    ir = "declare void @ext()\ndefine void @f() {\n  call void @ext()\n  ret void\n}"
    answer = jit._compile({"outside": ir}, targets.get("avx2"))
    assert answer["error"] is None
    with pytest.raises(elf.ObjectError, match="outside itself"):
        elf.load(base64.b64decode(answer["objects"]["outside"]))


def test_bad_ir_is_a_clear_unavailable():
    from onnxrun.providers.cpu.compiled import jit

    with pytest.raises(jit.Unavailable, match="compiling broken"):
        jit.compile_module("broken", "define void @f( {", {"f": None})


@pytest.mark.parametrize("T,batch,want_y,I,H", [(1, 1, True, 10, 16), (1, 1, False, 10, 16),
                                                (1, 1, True, 128, 128), (1, 3, True, 10, 16),
                                                (4, 2, True, 10, 16)])
def test_float_lstm_streaming_step_equals_the_general_path(T, batch, want_y, I, H, monkeypatch):
    """A forward float32 LSTM on whole sequences with initial states (a streaming model's one
    step a call) takes _compiled_forward: bit for bit what the general path (_run, here
    through a sequence_lens of full lengths) gives, and onnxruntime's within tolerance. One
    step of one row runs the stacked recurrence ([x, h] @ [W^T; R^T] in one product: the
    sums in another order, within float32 rounding of the general path)."""
    X, W, R, B = _float_rnn_inputs(4, 1, T, batch, I, H)
    h0, c0 = (RNG.standard_normal((1, batch, H)).astype(np.float32) for _ in range(2))
    outs = 3 if want_y else 2

    def model(lens):
        m, feeds = one_node("LSTM", [X, W, R, B, lens, h0, c0], opset=14, n_out=3,
                            const=(1, 2, 3), out_types=[TP.FLOAT] * 3, hidden_size=H)
        if not want_y:  # Y unused: its output name left empty
            proto = onnx.load_from_string(m)
            proto.graph.node[0].output[0] = ""
            del proto.graph.output[0]
            m = proto.SerializeToString()
        return m, feeds

    fast_model, feeds = model(None)
    general_model, general_feeds = model(np.full(batch, T, np.int32))
    counter = _Counting(monkeypatch, rnn.LSTM, "_compiled_forward")
    fast = _sessions(fast_model)[1]
    got = fast.run(None, feeds)
    assert counter.calls == 1
    # the recurrence's scratch (and an unwanted Y) is kept for the next step: one set
    prepared = _kernels(fast)[0].prepared
    stacked = T == batch == 1
    rec = prepared["stacked"] if stacked else prepared["recurrences"][0]
    assert rec.inputs == (I if stacked else 0)
    kept = list(rec._scratch[(T, batch)])
    for g, again in zip(got, fast.run(None, feeds), strict=True):
        np.testing.assert_array_equal(g, again)
    assert rec._scratch[(T, batch)] == kept and len(kept) == 1
    counter.calls -= 1
    want = _sessions(general_model)[1].run(None, general_feeds)
    assert counter.calls == 1 and len(got) == outs
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype
        if stacked:  # two float32 sums of I + H = 256 products in different orders (the
            # general path's input product on the compiled GEMM's panels): ~1e-6 apart at 128
            np.testing.assert_allclose(g, w, rtol=1e-6, atol=3e-6)
        else:
            np.testing.assert_array_equal(g, w)
    ort = pytest.importorskip("onnxruntime")
    so = ort.SessionOptions()
    so.log_severity_level = 3
    ref = ort.InferenceSession(fast_model, so, providers=["CPUExecutionProvider"])
    for g, e in zip(got, ref.run(None, feeds), strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("T,batch,H", [(1, 1, 128), (1, 3, 20), (3, 5, 16)])
def test_float_lstm_run_fresh_argument_block_equals_the_direct_call(T, batch, H, monkeypatch):
    """run_fresh reaches the recurrence through its argument block (one pointer: built once
    per shape, only the arrays' addresses written per call), never the 20-argument entry; bit
    for bit what ``run`` (that entry) gives, for calls on new arrays that reuse the block."""
    RT = (RNG.standard_normal((H, 4 * H)) * 0.2).astype(np.float32)
    half = np.concatenate([np.full(3 * H, 0.5), np.ones(H)]).astype(np.float32)
    rec = lstm.Float32Recurrence(RT * half, half, None, biased=True)
    direct = rec.fn

    def refuse(*args):
        raise AssertionError("run_fresh called the 20-argument entry")

    for _ in range(3):  # the second and third calls reuse the pooled block
        xw = RNG.standard_normal((T * batch, 4 * H)).astype(np.float32)
        h0, c0 = (RNG.standard_normal((1, batch, H)).astype(np.float32) for _ in range(2))
        h, c, ys = h0.copy(), c0.copy(), np.zeros((T, 1, batch, H), np.float32)
        monkeypatch.setattr(rec, "fn", refuse)
        rec.run_fresh(xw, h, c, ys, T, batch)
        h2, c2 = h0.copy(), c0.copy()  # the state without a ys wanted
        rec.run_fresh(xw, h2, c2, None, T, batch)
        monkeypatch.setattr(rec, "fn", direct)
        wh, wc, wys = h0[0].copy(), c0[0].copy(), np.zeros((T, batch, H), np.float32)
        rec.run(xw.reshape(T, batch, 4 * H), wh, wc, wys)
        np.testing.assert_array_equal(h[0], wh)
        np.testing.assert_array_equal(c[0], wc)
        np.testing.assert_array_equal(ys[:, 0], wys)
        np.testing.assert_array_equal(h2, h)
        np.testing.assert_array_equal(c2, c)
        assert np.abs(wh - h0[0]).max() > 0  # the step did change the state
    assert len(rec._scratch[(T, batch)]) == 1
