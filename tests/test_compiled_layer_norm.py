"""compiled/layer_norm.py: float32 layer normalization a row per iteration, ranges of rows on
spin.py's workers; against a float64 reference, the same bits on 1 to 3 threads, and the
LayerNormalization / SkipLayerNormalization / InstanceNormalization operators through it
against onnxruntime."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxrun
from onnxrun.providers.cpu.compiled import jit, layer_norm

pytest.importorskip("llvmlite")
_REASON = jit.why_unavailable()
pytestmark = pytest.mark.skipif(_REASON is not None, reason=f"compiled kernels: {_REASON}")
RNG = np.random.default_rng(7)


def f32(*shape, scale=1.0):
    return (RNG.standard_normal(shape) * scale + 0.3).astype(np.float32)


def reference(x, gamma, beta, eps, skip=None, bias=None):
    s = x.astype(np.float64) + (0 if skip is None else skip) + (0 if bias is None else bias)
    mean = s.mean(axis=1)
    inv = 1 / np.sqrt(((s - mean[:, None]) ** 2).mean(axis=1) + np.float32(eps))
    y = (s - mean[:, None]) * inv[:, None] * gamma + (0 if beta is None else beta)
    return y, mean, inv, s


@pytest.mark.parametrize("rows, n", [(1, 256), (5, 16), (7, 33), (3, 5), (64, 384), (2, 1)])
@pytest.mark.parametrize("skip, bias, beta, want_sum", [
    (False, False, True, False), (False, False, False, False), (True, False, True, True),
    (True, True, True, True), (True, True, False, False)])
def test_against_float64(monkeypatch, rows, n, skip, bias, beta, want_sum):
    monkeypatch.setattr(layer_norm, "RANGE_FLOATS", 1)  # every split taken
    x, g = f32(rows, n, scale=3), f32(n)
    k, b, e = (f32(rows, n) if skip else None), (f32(n) if bias else None), \
        (f32(n) if beta else None)
    runs = [layer_norm.layer_norm(x, g, e, 1e-5, skip=k, bias=b, want_sum=want_sum,
                                  threads=t) for t in (1, 2, 3)]
    y, mean, inv, s = reference(x, g, e, 1e-5, k, b)
    Y, M, I, S = runs[0]
    np.testing.assert_allclose(Y, y, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(M, mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(I, inv, rtol=1e-5)
    if want_sum:
        np.testing.assert_array_equal(S, ((x + k) + b) if bias else (x + k))
    else:
        assert S is None
    for other in runs[1:]:
        for a, c in zip(runs[0], other, strict=True):
            assert (a is None and c is None) or np.array_equal(a, c)


def test_ranges_go_to_the_spin_workers(monkeypatch):
    from onnxrun.providers.cpu.compiled import spin

    calls = []
    run_blocks = spin.run_blocks

    def counted(job, blocks, threads):
        calls.append((len(blocks), threads))
        return run_blocks(job, blocks, threads)

    monkeypatch.setattr(spin, "run_blocks", counted)
    x, g = f32(256, 384), f32(384)
    one = layer_norm.layer_norm(x, g, None, 1e-5, threads=1)
    assert calls == []
    two = layer_norm.layer_norm(x, g, None, 1e-5, threads=2)
    assert calls and calls[0][0] > 1 and calls[0][1] == 2
    for a, b in zip(one[:3], two[:3], strict=True):
        np.testing.assert_array_equal(a, b)


def test_bad_operands():
    x = f32(4, 8)
    with pytest.raises(ValueError, match="C-contiguous float32"):
        layer_norm.layer_norm(x.T, f32(4), None, 1e-5)
    with pytest.raises(ValueError, match="gamma must hold 8"):
        layer_norm.layer_norm(x, f32(7), None, 1e-5)
    with pytest.raises(ValueError, match="skip"):
        layer_norm.layer_norm(x, f32(8), None, 1e-5, skip=f32(4, 7))


@pytest.mark.parametrize("target", ["avx2", "avxvnni", "avx512", "avx512vnni"])
def test_builds_for_every_target(target):
    from onnxrun.providers.cpu.compiled import targets

    answer = jit._compile({"layer_norm": layer_norm.module_ir()}, targets.get(target))
    assert answer["error"] is None and answer["errors"] == {} and "layer_norm" in answer["objects"]


def _one_node(op, feeds, consts, outs, domain="", **attrs):
    node = helper.make_node(op, list(feeds) + list(consts), outs, domain=domain, **attrs)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, a.shape)
                      for n, a in feeds.items()],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outs],
        [numpy_helper.from_array(a, n) for n, a in consts.items()])
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=9).SerializeToString()


CASES = {
    "LayerNormalization last axis": (
        "LayerNormalization", {"X": f32(2, 96, 128, scale=2)}, {"S": f32(128), "B": f32(128)},
        ["Y", "mean", "inv"], "", {"axis": -1, "epsilon": 1e-5}),
    "LayerNormalization two axes, no bias": (
        "LayerNormalization", {"X": f32(3, 40, 7, 9)}, {"S": f32(7, 9)}, ["Y"], "",
        {"axis": 2}),
    "SkipLayerNormalization": (
        "SkipLayerNormalization", {"X": f32(2, 96, 128), "K": f32(2, 96, 128)},
        {"G": f32(128), "Be": f32(128), "Bi": f32(128)}, ["Y", "mean", "inv", "sum"],
        "com.microsoft", {"epsilon": 1e-12}),
    "SkipLayerNormalization, one row, no beta": (
        "SkipLayerNormalization", {"X": f32(1, 1, 256), "K": f32(1, 1, 256)},
        {"G": f32(256)}, ["Y"], "com.microsoft", {}),
    "InstanceNormalization": (
        "InstanceNormalization", {"X": f32(3, 5, 17, 19, scale=2)}, {"S": f32(5), "B": f32(5)},
        ["Y"], "", {"epsilon": 1e-3}),
    "InstanceNormalization 1-D, one image": (
        "InstanceNormalization", {"X": f32(1, 4, 1000)}, {"S": f32(4), "B": f32(4)},
        ["Y"], "", {}),
}


@pytest.mark.parametrize("rows, n", [(1, 200704), (6, 33), (64, 49), (5, 1), (3, 16)])
def test_instance_norm_against_float64(monkeypatch, rows, n):
    """Per-row scale and bias (flag 16): one image-channel a row, its own affine; the same
    bits however the rows are split over threads."""
    monkeypatch.setattr(layer_norm, "RANGE_FLOATS", 1)  # every split taken
    x, scale, bias = f32(rows, n, scale=3), f32(rows), f32(rows)
    want = reference(x, 1.0, None, 1e-5)[0] * scale[:, None] + bias[:, None]
    got = layer_norm.instance_norm(x, scale, bias, 1e-5)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
    for threads in (2, 3):
        assert layer_norm.instance_norm(x, scale, bias, 1e-5, threads).tobytes() == \
            got.tobytes()
    with pytest.raises(ValueError, match="scale and bias"):
        layer_norm.instance_norm(x, scale[:-1] if rows > 1 else f32(2), bias, 1e-5)


@pytest.mark.parametrize("case", CASES)
def test_operators_equal_onnxruntime(monkeypatch, case):
    """The operators through the kernel (every split taken) at 1 and 2 threads: onnxruntime's
    values, the same bits at both."""
    op, feeds, consts, outs, domain, attrs = CASES[case]
    monkeypatch.setattr(layer_norm, "RANGE_FLOATS", 1)
    calls = []
    kernel, bound = layer_norm.layer_norm, layer_norm.Bound.run
    monkeypatch.setattr(layer_norm, "layer_norm",
                        lambda *a, **k: (calls.append(k.get("threads")), kernel(*a, **k))[1])
    inst = layer_norm.instance_norm
    monkeypatch.setattr(layer_norm, "instance_norm",
                        lambda *a, **k: (calls.append(a[4]), inst(*a, **k))[1])
    # (constant parameters: bound once, then each call through Bound.run)
    monkeypatch.setattr(layer_norm.Bound, "run",
                        lambda self, x, skip, want_sum, threads, out=None: (
                            calls.append(threads),
                            bound(self, x, skip, want_sum, threads, out))[1])
    data = _one_node(op, feeds, consts, outs, domain, **attrs)
    expected = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)
    runs = []
    for threads in (1, 2):
        so = onnxrun.SessionOptions()
        so.intra_op_num_threads = threads
        runs.append(onnxrun.InferenceSession(data, so).run(None, feeds))
    assert calls == [1, 2]
    for one, two, e in zip(*runs, expected, strict=True):
        assert one.shape == e.shape and one.dtype == e.dtype
        np.testing.assert_allclose(one, e, rtol=1e-4, atol=2e-5)
        np.testing.assert_array_equal(one, two)


def test_computed_parameters_are_not_bound_and_change_every_run():
    """gamma and beta fed (not constants): each run's own values, onnxruntime's results."""
    node = helper.make_node("SkipLayerNormalization", ["X", "K", "G", "Be"], ["Y"],
                            domain="com.microsoft")
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in
                      (("X", (2, 8, 64)), ("K", (2, 8, 64)), ("G", (64,)), ("Be", (64,)))],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)])
    data = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid("com.microsoft", 1)],
                             ir_version=9).SerializeToString()
    sess = onnxrun.InferenceSession(data)
    ref = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    for seed in range(3):
        r = np.random.default_rng(seed)
        feeds = {"X": f32(2, 8, 64), "K": f32(2, 8, 64),
                 "G": r.uniform(0.5, 1.5, 64).astype(np.float32),
                 "Be": r.normal(0, 1, 64).astype(np.float32)}
        np.testing.assert_allclose(sess.run(None, feeds)[0], ref.run(None, feeds)[0],
                                   rtol=1e-4, atol=2e-5)
