"""float32 (Skip)SimplifiedLayerNormalization: onnxruntime's numbers bit for bit (an LLM's
layers feed them to int8-quantized products, where a last-bit difference grows; see
compiled/nbits_gemm.py)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

import onnxrun

ort = pytest.importorskip("onnxruntime")


def _model(op, domain, names, n_out, gamma=None, **attrs):
    gamma = np.ones(8, np.float32) if gamma is None else gamma
    node = helper.make_node(op, [*names, "g"], [f"y{i}" for i in range(n_out)],
                            domain=domain, **attrs)
    g = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info(n, TP.FLOAT, None) for n in names],
        [helper.make_tensor_value_info(f"y{i}", TP.FLOAT, None) for i in range(n_out)],
        [numpy_helper.from_array(gamma, "g")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                               helper.make_opsetid("com.microsoft", 1)]
                             ).SerializeToString()


def _run_both(op, domain, feeds, gamma, n_out, **attrs):
    data = _model(op, domain, list(feeds), n_out, gamma, **attrs)
    got = onnxrun.InferenceSession(data).run(None, feeds)
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)
    return got, want


@pytest.mark.parametrize("shape", [(2, 17, 896), (5, 64)])
def test_simplified_layer_norm(shape):
    rng = np.random.default_rng(shape[-1])
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    gamma = (rng.standard_normal(shape[-1]) * 0.5 + 1).astype(np.float32)
    got, want = _run_both("SimplifiedLayerNormalization", "", {"x": x}, gamma, 1, epsilon=1e-5)
    assert got[0].tobytes() == want[0].tobytes()


@pytest.mark.parametrize("shape", [(2, 17, 896), (5, 60)])
def test_skip_simplified_layer_norm(shape):
    rng = np.random.default_rng(shape[-1])
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    skip = rng.standard_normal(shape).astype(np.float32)
    gamma = (rng.standard_normal(shape[-1]) * 0.5 + 1).astype(np.float32)
    # inputs in the schema's order: input, skip, gamma
    node_feeds = {"x": x, "s": skip}
    got, want = _run_both("SkipSimplifiedLayerNormalization", "com.microsoft", node_feeds,
                          gamma, 4, epsilon=1e-5)
    assert got[0].tobytes() == want[0].tobytes()
    assert got[3].tobytes() == want[3].tobytes()  # the sum


def test_skip_simplified_layer_norm_bias():
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((3, 5, 264)) * 3).astype(np.float32)
    skip = rng.standard_normal(x.shape).astype(np.float32)
    bias = rng.standard_normal(264).astype(np.float32)
    gamma = (rng.standard_normal(264) * 0.5 + 1).astype(np.float32)
    feeds = {"x": x, "s": skip}
    names = ["x", "s", "g", "b"]
    node = helper.make_node("SkipSimplifiedLayerNormalization", names,
                            ["y0", "", "y2", "y3"], domain="com.microsoft", epsilon=1e-6)
    g = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info(n, TP.FLOAT, None) for n in feeds],
        [helper.make_tensor_value_info(n, TP.FLOAT, None) for n in ("y0", "y2", "y3")],
        [numpy_helper.from_array(gamma, "g"), numpy_helper.from_array(bias, "b")])
    data = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                               helper.make_opsetid("com.microsoft", 1)]
                             ).SerializeToString()
    got = onnxrun.InferenceSession(data).run(None, feeds)
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)
    assert got[0].tobytes() == want[0].tobytes()
    assert got[2].tobytes() == want[2].tobytes()


# compiled/rms_norm: the numpy path's arithmetic (onnxruntime's, above) in one pass, taken by
# the kernels where it runs; checked against that path to the bit, on the AVX2 target too.

def _compiled_or_skip():
    from onnxrun.providers.cpu.compiled import rms_norm

    reason = rms_norm.unavailable()
    if reason is not None:
        pytest.skip(f"compiled kernel: {reason}")
    return rms_norm


@pytest.mark.parametrize("target", [None, "avx2"])
@pytest.mark.parametrize("rows,n", [(1, 256), (7, 896), (3, 8)])
def test_compiled_lanes_match_numpy_path(target, rows, n):
    from onnxrun.providers.cpu import compiled
    from onnxrun.providers.cpu.ops.contrib import transformer

    rms_norm = _compiled_or_skip()
    rng = np.random.default_rng(n + rows)
    x = (rng.standard_normal((rows, n)) * 3).astype(np.float32)
    x[0, :3] = [0.0, 1e-30, 3e4]
    gamma = (rng.standard_normal(n) * 0.5 + 1).astype(np.float32)
    with compiled.forced_target(target) if target else _nothing():
        y, inv = rms_norm.RmsNorm().lanes(x, gamma, 1e-5)
    want_y, want_inv = transformer._rms_float32(x, gamma, 1e-5, True)
    assert y.tobytes() == want_y.tobytes()
    assert inv.tobytes() == want_inv.tobytes()


@pytest.mark.parametrize("target", [None, "avx2"])
@pytest.mark.parametrize("rows,n", [(1, 256), (4, 900), (2, 13), (1, 1)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_compiled_skip_matches_numpy_path(target, rows, n, with_bias):
    from onnxrun.providers.cpu import compiled
    from onnxrun.providers.cpu.ops.contrib import transformer

    rms_norm = _compiled_or_skip()
    rng = np.random.default_rng(n * 3 + rows)
    a = (rng.standard_normal((rows, n)) * 3).astype(np.float32)
    b = rng.standard_normal((rows, n)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32) if with_bias else None
    gamma = (rng.standard_normal(n) * 0.5 + 1).astype(np.float32)
    with compiled.forced_target(target) if target else _nothing():
        y, inv, total = rms_norm.RmsNorm().skip(a, b, bias, gamma, 1e-6)
    want_total = transformer._skip_sum(a, b, bias, np.dtype(np.float32))
    want_y, want_inv = transformer._rms_float32(want_total, gamma, 1e-6, False)
    assert total.tobytes() == want_total.tobytes()
    assert y.tobytes() == want_y.tobytes()
    assert inv.tobytes() == want_inv.tobytes()


def test_kernels_take_the_compiled_path_and_keep_numpy_one():
    """Both paths of the session's kernels give the same bytes (the numpy one with the
    compiled kernels switched off), for a 3-D input whose rows are not contiguous."""
    from onnxrun.providers.cpu.compiled import jit

    _compiled_or_skip()
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((2, 3, 128)) * 3).astype(np.float32)
    skip = rng.standard_normal((2, 3, 128)).astype(np.float32)
    gamma = (rng.standard_normal(128) * 0.5 + 1).astype(np.float32)
    feeds = {"x": x[:, ::-1], "s": skip}
    fast, _ = _run_both("SkipSimplifiedLayerNormalization", "com.microsoft", feeds, gamma, 4)
    plain, _ = _run_both("SimplifiedLayerNormalization", "", {"x": x[:, ::-1]}, gamma, 2)
    with jit.disabled():
        fast0, want = _run_both("SkipSimplifiedLayerNormalization", "com.microsoft", feeds,
                                gamma, 4)
        plain0, want_plain = _run_both("SimplifiedLayerNormalization", "", {"x": x[:, ::-1]},
                                       gamma, 2)
    kernel = onnxrun.InferenceSession(_model("SimplifiedLayerNormalization", "", ["x"], 2)
                                      )._program.steps[0].kernel
    assert kernel.compiled is not None
    for got, ref in ((fast, fast0), (fast, want), (plain, plain0), (plain, want_plain)):
        for i in (0, len(got) - 1):
            assert got[i].tobytes() == ref[i].tobytes()


def _nothing():
    import contextlib

    return contextlib.nullcontext()


@pytest.mark.parametrize("with_bias", [False, True])
def test_constants_bound_into_one_call(with_bias):
    """A node whose scale (and bias) are constants binds them once into rms_skip_c's /
    rms_lanes_c's block and then calls it with the rows alone (a decode step's row, the
    second run on): onnxruntime's bytes, inv_std_var where the graph reads it, and the same
    bytes as the first (unbound) run; a scale that is an input is never bound."""
    from onnxrun.providers.cpu.compiled import rms_norm

    _compiled_or_skip()
    rng = np.random.default_rng(9)
    n = 256
    gamma = (rng.standard_normal(n) * 0.5 + 1).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    x = (rng.standard_normal((1, 1, n)) * 3).astype(np.float32)
    skip = rng.standard_normal((1, 1, n)).astype(np.float32)
    names = ["x", "s", "g", "b"] if with_bias else ["x", "s", "g"]
    node = helper.make_node("SkipSimplifiedLayerNormalization", names,
                            ["y", "", "inv", "sum"], domain="com.microsoft", epsilon=1e-5)
    norm = helper.make_node("SimplifiedLayerNormalization", ["sum", "g"], ["y2", "inv2"],
                            epsilon=1e-6)
    inits = [numpy_helper.from_array(gamma, "g"), numpy_helper.from_array(bias, "b")]
    outs = ["y", "inv", "sum", "y2", "inv2"]
    g = helper.make_graph(
        [node, norm], "g", [helper.make_tensor_value_info(v, TP.FLOAT, None) for v in "xs"],
        [helper.make_tensor_value_info(v, TP.FLOAT, None) for v in outs],
        inits if with_bias else inits[:1])
    data = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                               helper.make_opsetid("com.microsoft", 1)]
                             ).SerializeToString()
    sess = onnxrun.InferenceSession(data)
    feeds = {"x": x, "s": skip}
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)
    first = sess.run(None, feeds)
    calls = []
    kernels = [step.kernel for step in sess._program.steps]
    for k in kernels:
        for name in ("skip_c", "lanes_c"):
            fn = getattr(k.compiled, name)
            setattr(k.compiled, name, lambda *a, fn=fn, name=name: calls.append(name) or fn(*a))
    second = sess.run(None, feeds)
    assert sorted(calls) == ["lanes_c", "skip_c"]
    assert not any(k.bound is rms_norm.UNBOUND or k.bound is rms_norm.NEVER
                   for k in kernels)
    for got in (first, second):
        for g_, w in zip(got, want, strict=True):
            assert g_.shape == w.shape and g_.tobytes() == w.tobytes()
    # the scale as an input: computed each run, never bound
    g2 = helper.make_graph(
        [helper.make_node("SimplifiedLayerNormalization", ["x", "g"], ["y"])], "g",
        [helper.make_tensor_value_info(v, TP.FLOAT, None) for v in "xg"],
        [helper.make_tensor_value_info("y", TP.FLOAT, None)])
    data2 = helper.make_model(g2, opset_imports=[helper.make_opsetid("", 17)]
                              ).SerializeToString()
    sess2 = onnxrun.InferenceSession(data2)
    for _ in range(2):
        got = sess2.run(None, {"x": x, "g": gamma.copy()})
    assert sess2._program.steps[0].kernel.bound is rms_norm.NEVER
    want2 = ort.InferenceSession(data2, providers=["CPUExecutionProvider"]).run(
        None, {"x": x, "g": gamma})
    assert got[0].tobytes() == want2[0].tobytes()


def test_bound_calls_past_the_stack_rows(monkeypatch):
    """Rows past rms_norm.STACK_ROWS whose inv_std_var is not read: the node passes an array
    for it (the block's stack holds only so many), the same bytes as onnxruntime's."""
    from onnxrun.providers.cpu.compiled import rms_norm

    _compiled_or_skip()
    monkeypatch.setattr(rms_norm, "STACK_ROWS", 3)
    rng = np.random.default_rng(2)
    gamma = (rng.standard_normal(64) * 0.5 + 1).astype(np.float32)
    x = rng.standard_normal((2, 5, 64)).astype(np.float32)
    skip = rng.standard_normal((2, 5, 64)).astype(np.float32)
    for op, domain, feeds, n_out in (
            ("SkipSimplifiedLayerNormalization", "com.microsoft", {"x": x, "s": skip}, 1),
            ("SimplifiedLayerNormalization", "", {"x": x}, 1)):
        data = _model(op, domain, list(feeds), n_out, gamma)
        sess = onnxrun.InferenceSession(data)
        want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)
        for _ in range(2):  # unbound, then bound
            got = sess.run(None, feeds)
            assert got[0].tobytes() == want[0].tobytes()
        assert sess._program.steps[0].kernel.bound.n == 64
