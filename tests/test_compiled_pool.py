"""The compiled MaxPool / AveragePool (compiled/pool.py), channels-last and planar, against
onnxruntime and the numpy path: pads, strides (the planar kernel's 1, 2 and gathered others),
dilations, ceil_mode, count_include_pad, channel counts off the 16-lane chunks, rows off the
16-column vectors, a batch of 2, 2 threads, NaN and infinities, 1-D windows; the AVX2 code
(every target builds it: tests/test_compiled_targets.py, the bundle). In a session the
channels-last kernel runs where the layout passes channels-last memory, the planar one
elsewhere (below the layout level, after an NCHW producer)."""

from __future__ import annotations

import numpy as np
import pytest
from concurrency import spy_hand_offs
from onnx import TensorProto, helper, numpy_helper

import onnxrun
from onnxrun.providers.cpu import compiled
from onnxrun.providers.cpu.compiled import jit
from onnxrun.providers.cpu.compiled import pool as cpool
from onnxrun.providers.cpu.ops import pool as pool_ops
from onnxrun.providers.cpu.ops.conv import window_geometry

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("llvmlite")

CASES = [  # kernel, attrs
    ((3, 3), dict(strides=[2, 2], pads=[1, 1, 1, 1])),
    ((3, 3), dict(strides=[2, 2])),
    ((3, 3), dict(strides=[2, 2], ceil_mode=1)),
    ((5, 5), dict(pads=[2, 2, 2, 2])),
    ((3, 3), dict(strides=[2, 2], pads=[1, 1, 1, 1], count_include_pad=1)),
    ((2, 3), dict(strides=[1, 2], pads=[0, 1, 1, 0], dilations=[2, 1])),
    ((3, 3), dict(strides=[3, 3], pads=[1, 1, 1, 1], ceil_mode=1)),
    ((7, 7), dict(auto_pad="SAME_UPPER")),
]


def _model(op, kernel, attrs):
    if op == "MaxPool":
        attrs = {k: v for k, v in attrs.items() if k != "count_include_pad"}
    else:
        attrs = {k: v for k, v in attrs.items() if k != "dilations"}
    node = helper.make_node(op, ["X"], ["Y"], kernel_shape=list(kernel), **attrs)
    graph = helper.make_graph([node], "g",
                              [helper.make_tensor_value_info("X", TensorProto.FLOAT, None)],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)]) \
        .SerializeToString()


def _geometry(X, op, kernel, attrs):
    """(strides, dilations, heads, outs, avg's per-pixel factors) of a pool node's attributes
    on NCHW ``X``, as ops/pool.py computes them."""
    strides = tuple(attrs.get("strides", (1, 1)))
    dilations = (1, 1) if op == "AveragePool" else tuple(attrs.get("dilations", (1, 1)))
    heads, tails, outs = window_geometry(
        X.shape[2:], tuple(kernel), strides, dilations, tuple(attrs.get("pads", ())),
        attrs.get("auto_pad", "NOTSET"), attrs.get("ceil_mode", 0), dilated_same=False)
    heads, tails, outs = tuple(heads), tuple(tails), tuple(outs)
    scale = None
    if op == "AveragePool":
        counts = pool_ops._counts(X.shape[2:], heads, tails, outs,
                                  bool(attrs.get("count_include_pad", 0)), tuple(kernel),
                                  strides, dilations)
        scale = np.full(outs, 1 / np.prod(kernel), np.float32) if counts is None else \
            1 / counts.astype(np.float32)
    return strides, dilations, heads, outs, scale


def _compiled(X, op, kernel, attrs, threads=1):
    """The compiled pool of NCHW ``X`` (fed channels-last), as NCHW."""
    strides, dilations, heads, outs, scale = _geometry(X, op, kernel, attrs)
    Y = cpool.pool(np.ascontiguousarray(X.transpose(0, 2, 3, 1)),
                   "max" if op == "MaxPool" else "avg", kernel, heads, outs, strides,
                   dilations, scale, threads)
    return Y.transpose(0, 3, 1, 2)


@pytest.fixture(autouse=True)
def avx2():
    with compiled.forced_target("avx2"):
        if jit.why_unavailable() is not None:
            pytest.skip(jit.why_unavailable())
        yield


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
@pytest.mark.parametrize("kernel,attrs", CASES, ids=str)
@pytest.mark.parametrize("C", [5, 16, 24, 37, 136])
def test_compiled_pool_equals_onnxruntime(op, kernel, attrs, C):
    rng = np.random.default_rng(C)
    X = rng.standard_normal((2, C, 23, 19)).astype(np.float32)
    _equals_onnxruntime(_compiled, X, op, kernel, attrs)


def _equals_onnxruntime(pool, X, op, kernel, attrs):
    """``pool`` (_compiled or _planar) of X at 1 and 2 threads: onnxruntime's maximum to the
    bit, its average to float32 rounding."""
    want = ort.InferenceSession(_model(op, kernel, attrs),
                                providers=["CPUExecutionProvider"]).run(None, {"X": X})[0]
    for threads in (1, 2):
        got = pool(X, op, kernel, attrs, threads)
        assert got.shape == want.shape
        if op == "MaxPool":
            np.testing.assert_array_equal(got, want)
        else:
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
@pytest.mark.parametrize("C", [5, 16, 40, 96])
def test_both_loop_orders_give_the_same_bits(monkeypatch, op, C):
    """@pool_f32 (chunks outer) and @pool_px_f32 (pixels outer, chunks inner: from
    PIXEL_MAJOR_CHANNELS) on the same inputs, each forced here: the same bits, NaN and
    infinities, pads, dilations, a partial last chunk and under 16 channels included."""
    rng = np.random.default_rng(C)
    X = rng.standard_normal((2, C, 17, 13)).astype(np.float32)
    X[0, C // 2, 4, 5], X[1, 0, 0, 0] = np.nan, np.nan
    X[0, C - 1, 7, 7], X[1, C // 3, 2, 2] = np.inf, -np.inf
    for kernel, attrs in CASES:
        got = []
        for threshold in (1, 1 << 30):
            monkeypatch.setattr(cpool, "PIXEL_MAJOR_CHANNELS", threshold)
            got.append(_compiled(X, op, kernel, attrs))
        np.testing.assert_array_equal(got[0], got[1])
        assert np.isnan(got[0]).any()


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
def test_compiled_pool_nan_and_infinities_as_the_numpy_path(monkeypatch, op):
    """A NaN in a window makes its maximum (and sum) NaN, as numpy's; infinities pass: both
    compiled kernels against the numpy path."""
    rng = np.random.default_rng(3)
    X = rng.standard_normal((1, 20, 15, 14)).astype(np.float32)
    X[0, 3, 4, 5] = np.nan
    X[0, 17, 0, 0] = np.nan
    X[0, 8, 7, 7] = np.inf
    X[0, 9, 2, 2] = -np.inf
    kernel, attrs = (3, 3), dict(strides=[2, 2], pads=[1, 1, 1, 1])
    monkeypatch.setattr(pool_ops, "COMPILED", False)
    want = onnxrun.InferenceSession(_model(op, kernel, attrs)).run(None, {"X": X})[0]
    for got in (_compiled(X, op, kernel, attrs), _planar(X, op, kernel, attrs)):
        assert np.isnan(got).sum() == np.isnan(want).sum() > 0
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


PLANAR_CASES = CASES + [
    ((3, 3), dict()),  # stride 1: one load a tap
    ((2, 2), dict(strides=[2, 2])),
    ((3, 3), dict(strides=[1, 3], pads=[0, 2, 1, 1])),  # stride 3: gathered
    ((1, 4), dict(strides=[1, 4])),
    ((3, 3), dict(strides=[2, 2], pads=[1, 1, 1, 1], dilations=[1, 3])),
]


def _planar(X, op, kernel, attrs, threads=1):
    """compiled/pool.py's planar pool of NCHW ``X``."""
    strides, dilations, heads, outs, scale = _geometry(X, op, kernel, attrs)
    return cpool.pool_nchw(np.ascontiguousarray(X), "max" if op == "MaxPool" else "avg", kernel,
                           heads, outs, strides, dilations, scale, threads)


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
@pytest.mark.parametrize("kernel,attrs", PLANAR_CASES, ids=str)
@pytest.mark.parametrize("hw", [(23, 19), (9, 70), (40, 5)], ids=str)
def test_planar_pool_equals_onnxruntime(op, kernel, attrs, hw):
    """Rows of 5 to 70 columns: under one vector, partial last vectors, the stride-2 kernel's
    32 columns a read crossing the row's end; infinities (NaN: onnxruntime's maximum drops
    it, numpy's keeps it, as the kernels do: test_compiled_pool_nan_and_infinities_...)."""
    rng = np.random.default_rng(hw[1])
    X = rng.standard_normal((2, 3) + hw).astype(np.float32)
    X[0, 0, 1, 1], X[0, 1, 2, 2] = np.inf, -np.inf
    _equals_onnxruntime(_planar, X, op, kernel, attrs)


@pytest.mark.parametrize("level", [onnxrun.GraphOptimizationLevel.ORT_ENABLE_BASIC,
                                   onnxrun.GraphOptimizationLevel.ORT_ENABLE_ALL])
def test_a_session_pools_planar_input_compiled(monkeypatch, level):
    """NCHW input: both pools run planar and compiled at any optimization level, 1-D
    windows as one-row 2-D ones; a global window stays on numpy's reduction of whole
    planes (one lane a plane would be slower); onnxruntime's numbers."""
    calls = []
    real = cpool.pool_nchw
    monkeypatch.setattr(cpool, "pool_nchw",
                        lambda *a, **k: calls.append((a[1], a[2])) or real(*a, **k))
    rng = np.random.default_rng(11)
    for op, kernel, attrs, shape in (
            ("MaxPool", (3, 3), dict(strides=[2, 2]), (1, 8, 33, 35)),
            ("AveragePool", (3, 3), dict(pads=[1, 1, 1, 1]), (2, 5, 12, 30)),
            ("MaxPool", (5,), dict(strides=[2], pads=[2, 1]), (2, 6, 101)),
            ("AveragePool", (4,), dict(strides=[4]), (1, 7, 64)),
            ("AveragePool", (7, 7), dict(), (1, 9, 7, 7))):
        calls.clear()
        blob = _model(op, kernel, attrs)
        so = onnxrun.SessionOptions()
        so.graph_optimization_level = level
        X = rng.standard_normal(shape).astype(np.float32)
        got = onnxrun.InferenceSession(blob, so).run(None, {"X": X})[0]
        want = ort.InferenceSession(blob, providers=["CPUExecutionProvider"]) \
            .run(None, {"X": X})[0]
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
        window = (1,) * (2 - len(kernel)) + kernel
        assert calls == ([] if kernel == (7, 7) else
                         [("max" if op == "MaxPool" else "avg", window)])


def test_a_session_pools_channels_last_input_compiled(monkeypatch):
    """Conv -> MaxPool -> AveragePool -> Conv at the layout level: the pools get the first
    convolution's channels-last output and run compiled; onnxruntime's numbers."""
    rng = np.random.default_rng(5)
    C = 24
    w = [numpy_helper.from_array((rng.standard_normal((C, C, 3, 3)) * 0.1).astype(np.float32),
                                 f"w{i}") for i in range(2)]
    nodes = [helper.make_node("Conv", ["X", "w0"], ["a"], pads=[1, 1, 1, 1]),
             helper.make_node("MaxPool", ["a"], ["b"], kernel_shape=[3, 3], strides=[2, 2],
                              pads=[1, 1, 1, 1]),
             helper.make_node("AveragePool", ["b"], ["c"], kernel_shape=[3, 3],
                              pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["c", "w1"], ["Y"], pads=[1, 1, 1, 1])]
    graph = helper.make_graph(nodes, "g",
                              [helper.make_tensor_value_info("X", TensorProto.FLOAT,
                                                             [1, C, 40, 40])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)], w)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    blob = model.SerializeToString()
    calls = []
    real = cpool.pool
    monkeypatch.setattr(cpool, "pool", lambda *a, **k: calls.append(a[1]) or real(*a, **k))
    X = rng.standard_normal((1, C, 40, 40)).astype(np.float32)
    got = onnxrun.InferenceSession(blob).run(None, {"X": X})[0]
    assert calls == ["max", "avg"]
    want = ort.InferenceSession(blob, providers=["CPUExecutionProvider"]).run(None, {"X": X})[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_rows_split_on_the_spinning_workers_give_one_threads_bits(monkeypatch):
    """Above MIN_TAPS_PER_RANGE the output rows go to spin.py's workers (taken in turn), each
    row whole on one thread: the same bits at 1, 2 and 3 threads; below it, a pool at 2
    threads hands nothing off (no fork, no queue): a hand-off cost more than such a pool.
    The planar kernel's rows the same way."""
    forks, queued = spy_hand_offs(monkeypatch)
    rng = np.random.default_rng(7)
    X = rng.standard_normal((1, 24, 27, 31)).astype(np.float32)
    for op in ("MaxPool", "AveragePool"):
        attrs = dict(strides=[2, 2], pads=[1, 1, 1, 1])
        one = _compiled(X, op, (3, 3), attrs, 1)
        assert _compiled(X, op, (3, 3), attrs, 2).tobytes() == one.tobytes()
        assert forks == [] and queued == []  # 24 x 14 x 16 x 9 taps: one range
        monkeypatch.setattr(cpool, "MIN_TAPS_PER_RANGE", 64)
        for threads in (2, 3):
            for _ in range(5):
                assert _compiled(X, op, (3, 3), attrs, threads).tobytes() == one.tobytes()
        assert forks and queued == []
        forks.clear()
        monkeypatch.setattr(cpool, "MIN_TAPS_PER_RANGE", 1 << 18)
    for op in ("MaxPool", "AveragePool"):
        attrs = dict(strides=[2, 2], pads=[1, 1, 1, 1])
        one = _planar(X, op, (3, 3), attrs, 1)
        assert _planar(X, op, (3, 3), attrs, 2).tobytes() == one.tobytes()
        assert forks == [] and queued == []
        monkeypatch.setattr(cpool, "MIN_TAPS_PER_RANGE", 64)
        for threads in (2, 3):
            for _ in range(5):
                assert _planar(X, op, (3, 3), attrs, threads).tobytes() == one.tobytes()
        assert forks and queued == []
        forks.clear()
        monkeypatch.setattr(cpool, "MIN_TAPS_PER_RANGE", 1 << 18)
