"""Buffers reused across a plan's nodes and runs (memory.py): intermediates written into
blocks, views keeping their block busy, graph outputs never pooled, concurrent runs, shapes
that change, runs that fail, and the session options that turn it off."""

from __future__ import annotations

import collections
import json
import sys
import threading
from pathlib import Path

import numpy as np
import onnx
import pytest

import onnxrun
from onnxrun import memory
from onnxrun.execute import CompiledSteps
from onnxrun.memory import MIN_BYTES, Buffers, Pattern
from onnxrun.providers.registry import takes_out

RUNS = CompiledSteps.GENERATE_AFTER + 3  # the loop, then the generated function

# a's memory is read through v (a view) long after a's own last reader; b and c are as large
# and produced meanwhile: they must not be given a's block while v lives.
VIEWS = """
<ir_version: 8, opset_import: ["" : 18]>
g (float[N, 8192] x) => (float[N, 8192] y, float[N, 8192] z) {
  shape = Constant<value = int64[3] {0, 2, 4096}>()
  back = Constant<value = int64[2] {0, 8192}>()
  a = Relu(x)
  v = Reshape(a, shape)
  b = Neg(x)
  c = Mul(b, x)
  d = Abs(c)
  w = Reshape(v, back)
  y = Add(w, d)
  z = Sub(d, x)
}
"""

# the graph outputs: r itself, and t, a view of an intermediate that other nodes read too
OUTPUTS = """
<ir_version: 8, opset_import: ["" : 18]>
g (float[N, 8192] x) => (float[N, 8192] r, float[N, 2, 4096] t, float[N, 8192] u) {
  shape = Constant<value = int64[3] {0, 2, 4096}>()
  a = Abs(x)
  r = Relu(a)
  n = Neg(x)
  t = Reshape(n, shape)
  m = Mul(n, x)
  u = Add(m, a)
}
"""

# the length of s depends on k's value, not on any input's shape: the same signature, other
# shapes inside
DATA_SHAPES = """
<ir_version: 8, opset_import: ["" : 18]>
g (float[L] x, int64[1] k) => (float[1] y) {
  zero = Constant<value = int64[1] {0}>()
  s = Slice(x, zero, k)
  e = Neg(s)
  f = Mul(e, s)
  y = ReduceSum<keepdims = 1>(f)
}
"""


def _session(text, **options):
    opts = onnxrun.SessionOptions()
    opts.intra_op_num_threads = 1
    for k, v in options.items():
        setattr(opts, k, v)
    return onnxrun.InferenceSession(onnx.parser.parse_model(text).SerializeToString(), opts)


def _views_reference(x):
    d = np.abs(-x * x)
    return np.maximum(x, 0) + d, d - x


def _pattern(sess):
    """The pattern of the session's plan (one input signature, one plan)."""
    patterns = [p for plan in sess._program._plans.values() if plan.memory is not None
                for p in plan.memory.patterns.values() if p is not None]
    assert len(patterns) == 1
    return patterns[0]


def _run_views(sess, seed: int) -> np.ndarray:
    """RUNS runs of VIEWS on random inputs, each checked against numpy; the last input."""
    rng = np.random.default_rng(seed)
    for i in range(RUNS):
        x = rng.standard_normal((4, 8192), dtype=np.float32)
        y, z = sess.run(None, {"x": x})
        ry, rz = _views_reference(x)
        np.testing.assert_array_equal(y, ry, err_msg=f"run {i}")
        np.testing.assert_array_equal(z, rz, err_msg=f"run {i}")
    return x


def test_intermediates_share_bytes_and_views_keep_theirs():
    sess = _session(VIEWS)
    _run_views(sess, seed=0)
    pattern = _pattern(sess)
    pooled = [spec for spec in pattern.specs if spec is not None]
    assert len(pooled) == 4  # a, b, c, d (y and z are graph outputs)
    a, b, c, d = [(spec[0], spec[0] + spec[1]) for spec in pooled]
    size = 4 * 8192 * 4
    assert all(hi - lo == size for lo, hi in (a, b, c, d))
    # a (live through v and w until y) shares its bytes with none of b, c, d; c is written
    # over b (Mul, its last reader), d over c (in place)
    assert all(a[1] <= lo or hi <= a[0] for lo, hi in (b, c, d))
    assert d == c == b
    assert pattern.nbytes == 2 * size


def test_arena_reused_across_runs():
    sess = _session(VIEWS)
    x = np.ones((4, 8192), np.float32)
    for _ in range(RUNS):
        sess.run(None, {"x": x})
    pattern = _pattern(sess)
    assert len(pattern.free) == 1  # one run at a time: one arena, checked in again
    arena = pattern.free[0].arena
    assert arena is not None
    sess.run(None, {"x": x})
    assert pattern.free[0].arena is arena


def test_profiled_runs_use_the_arena(tmp_path):
    """A profiled session records its pattern and runs in the arena, as an unprofiled one:
    its profile times the kernels of a run, not fresh memory's page faults."""
    sess = _session(VIEWS, enable_profiling=True,
                    profile_file_prefix=str(tmp_path / "views"))
    x = _run_views(sess, seed=1)
    pattern = _pattern(sess)
    arena = pattern.free[0].arena
    assert arena is not None
    seen = []
    original = Buffers.take

    def take(self, j, *args):
        out = original(self, j, *args)
        seen.append(out is not None and np.shares_memory(out, arena))
        return out

    Buffers.take = take
    try:
        sess.run(None, {"x": x})
    finally:
        Buffers.take = original
    assert len(seen) == 4 and all(seen)  # a, b, c, d: written into the arena
    with open(sess.end_profiling()) as f:
        counts = collections.Counter(e["name"] for e in json.load(f) if e.get("cat") == "Node")
    assert counts and set(counts.values()) == {RUNS + 1}  # every run's nodes timed


def test_outputs_never_alias_blocks():
    sess = _session(OUTPUTS)
    rng = np.random.default_rng(1)
    kept = []
    for _ in range(RUNS):
        x = rng.standard_normal((4, 8192), dtype=np.float32)
        r, t, u = sess.run(None, {"x": x})
        kept.append((x, r, t, u))
    pattern = _pattern(sess)
    # a and m; not n, which t (a graph output) is a view of
    assert sum(spec is not None for spec in pattern.specs) == 2
    arenas = [buffers.arena for buffers in pattern.free if buffers.arena is not None]
    assert arenas
    for x, r, t, u in kept:  # every earlier result intact after the later runs
        np.testing.assert_array_equal(r, np.abs(x))
        np.testing.assert_array_equal(t, (-x).reshape(4, 2, 4096))
        np.testing.assert_array_equal(u, -x * x + np.abs(x))
        for value in (r, t, u):
            assert not any(np.shares_memory(value, arena) for arena in arenas)


def test_shapes_that_change():
    sess = _session(VIEWS)
    rng = np.random.default_rng(2)
    for i in range(3 * RUNS):
        n = (4, 9, 4, 1, 16)[i % 5]  # 1 row: 32 KB, below MIN_BYTES
        x = rng.standard_normal((n, 8192), dtype=np.float32)
        y, z = sess.run(None, {"x": x})
        ry, rz = _views_reference(x)
        np.testing.assert_array_equal(y, ry)
        np.testing.assert_array_equal(z, rz)
    plan = next(iter(sess._program._plans.values()))
    assert len(plan.memory.patterns) == 4
    assert plan.memory.patterns[((1, 8192),), ()] is None  # nothing large enough


def test_shapes_seen_once_are_not_recorded():
    sess = _session(VIEWS)
    for n in range(2, 2 + RUNS):  # a decode step's way: every run a new length
        x = np.ones((n, 8192), np.float32)
        y, _ = sess.run(None, {"x": x})
        np.testing.assert_array_equal(y, _views_reference(x)[0])
    plan = next(iter(sess._program._plans.values()))
    assert plan.memory.patterns == {}
    assert len(plan.memory.seen) == RUNS


def test_shapes_inside_that_change_with_values():
    sess = _session(DATA_SHAPES)
    x = np.linspace(-1, 1, 100_000, dtype=np.float32)
    for i in range(3 * RUNS):
        k = (60_000, 90_000, 30_000)[i % 3]
        (y,) = sess.run(None, {"x": x, "k": np.array([k], np.int64)})
        s = x[:k]
        np.testing.assert_allclose(y, [np.sum(-s * s)], rtol=1e-5)


def _in_eight_threads(check) -> None:
    """``check(i)`` 3 * RUNS times in each of 8 threads started together, the interpreter
    switching threads often (runs overlap inside the plan); the first failure re-raised."""
    errors = []
    start = threading.Barrier(8)

    def work(i):
        try:
            start.wait()
            for _ in range(3 * RUNS):
                check(i)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(old)
    assert not errors, errors[0]


def test_concurrent_runs():
    sess = _session(VIEWS)
    rng = np.random.default_rng(3)
    inputs = [rng.standard_normal((4, 8192), dtype=np.float32) for _ in range(8)]
    expected = [_views_reference(x) for x in inputs]

    def check(i):
        y, z = sess.run(None, {"x": inputs[i]})
        np.testing.assert_array_equal(y, expected[i][0])
        np.testing.assert_array_equal(z, expected[i][1])

    _in_eight_threads(check)
    assert len(_pattern(sess).free) >= 1


def test_failed_run_then_good_runs():
    sess = _session(VIEWS)
    x = np.ones((4, 8192), np.float32)
    for _ in range(RUNS):
        sess.run(None, {"x": x})
    with pytest.raises(onnxrun.InvalidArgument):
        sess.run(None, {"x": np.ones((4, 10), np.float32)})
    x = np.full((4, 8192), -3, np.float32)
    y, z = sess.run(None, {"x": x})
    ry, rz = _views_reference(x)
    np.testing.assert_array_equal(y, ry)
    np.testing.assert_array_equal(z, rz)


@pytest.mark.parametrize("option", ["enable_mem_pattern", "enable_cpu_mem_arena",
                                    "enable_mem_reuse"])
def test_options_turn_it_off(option):
    sess = _session(VIEWS, **{option: False})
    x = np.ones((4, 8192), np.float32)
    for _ in range(RUNS):
        y, _ = sess.run(None, {"x": x})
    np.testing.assert_array_equal(y, _views_reference(x)[0])
    assert all(plan.memory is None for plan in sess._program._plans.values())


def test_held_value_is_not_overwritten():
    """Bytes a value still uses (through a view the record did not see) are never handed out
    again: the kernel allocates; when the run ends, an arena something holds is dropped."""
    shape, strides, size = (4, 8192), (8192 * 4, 4), 4 * 8192 * 4
    dtype = np.dtype(np.float32)
    pattern = Pattern(size, [(0, size, (), ((4, 8192),), shape, dtype, strides),
                             (0, size, (0,), ((4, 8192),), shape, dtype, strides)])
    buffers = Buffers(pattern)
    x = np.ones(shape, np.float32)
    first = buffers.take(0, x)
    assert first is not None and first.nbytes >= MIN_BYTES
    view = first.reshape(-1)[1:]  # holds the bytes, not ``first`` itself
    del first
    assert buffers.take(1, x) is None
    assert buffers.take(0, np.ones((2, 8192), np.float32)) is None  # other input shapes
    arena = buffers.arena
    buffers.release()
    assert buffers.arena is None  # dropped: ``view`` keeps its memory
    second = buffers.take(1, x)
    assert second is not None and not np.shares_memory(second, view)
    del view
    assert buffers.take(1, x) is None  # ``second`` is still alive
    del second
    third = buffers.take(1, x)
    assert third is not None and not np.shares_memory(third, arena)


# Ignore writes elsewhere than the buffer it is given; Into writes into it.
CUSTOM = """
<ir_version: 8, opset_import: ["" : 18, "test.memory": 1]>
g (float[N, 8192] x) => (float[N, 8192] y) {
  a = test.memory.Ignore(x)
  b = test.memory.Into(a)
  c = Neg(b)
  y = Add(c, x)
}
"""

_given: list[bool] = []


@onnxrun.register_custom_op("Ignore", "test.memory")
class _Ignore:
    accepts_out = True  # but returns a fresh array whatever it is given

    def __init__(self, ctx):
        pass

    def __call__(self, X, *, out=None):
        return X * 2


@onnxrun.register_custom_op("Into", "test.memory")
@takes_out
def _into(X, *, out=None):
    _given.append(out is not None)
    return np.multiply(X, 3, out=out)


def test_kernels_that_write_elsewhere_get_no_buffer():
    sess = _session(CUSTOM)
    x = np.arange(4 * 8192, dtype=np.float32).reshape(4, 8192)
    _given.clear()
    for _ in range(RUNS):
        (y,) = sess.run(None, {"x": x})
        np.testing.assert_array_equal(y, -(x * 6) + x)
    # run 1 notes the shapes, run 2 records, run 3 gives every candidate memory of its own:
    # Ignore wrote elsewhere
    assert _given == [False, False] + [True] * (RUNS - 2)
    pattern = _pattern(sess)
    plan = next(p for p in sess._program._plans.values() if p.memory is not None)
    pooled = {plan.steps[plan.memory.step_of[j]].node.op_type
              for j, spec in enumerate(pattern.specs) if spec is not None}
    assert pooled == {"Into", "Neg"}
    assert pattern.nbytes == 4 * 8192 * 4  # Neg written over Into's output


# the branches' intermediates get buffers of their own programs' patterns
BRANCHES = """
<ir_version: 8, opset_import: ["" : 18]>
g (bool c, float[N, 8192] x) => (float[N, 8192] y) {
  a = Neg(x)
  y = If(c) <then_branch = t () => (float[N, 8192] ty) {
      p = Mul(a, x)
      q = Abs(p)
      ty = Add(q, a)
  }, else_branch = e () => (float[N, 8192] ey) {
      r = Sub(a, x)
      ey = Mul(r, r)
  }>
}
"""


def test_subgraphs_and_run_options():
    sess = _session(BRANCHES)
    rng = np.random.default_rng(4)
    options = onnxrun.RunOptions()
    for i in range(3 * RUNS):
        x = rng.standard_normal((4, 8192), dtype=np.float32)
        c = bool(i % 3)
        (y,) = sess.run(None, {"c": np.array(c), "x": x}, options if i % 2 else None)
        a = -x
        np.testing.assert_array_equal(y, np.abs(a * x) + a if c else (a - x) * (a - x))


# Concat's inputs written in its output's place by their producers (strided slices at
# N = 2): a, b into j; j (Exp reads it first), e into k; k and s (read by m's Concat first)
# into n. c is read after k's Concat, u by m's Concat and Sub: each in bytes of its own.
JOINS = """
<ir_version: 8, opset_import: ["" : 18]>
g (float[N, 4, 4096] x) => (float[N, 4, 4096] y, float[N, 32, 4096] z) {
  a = Neg(x)
  b = Mul(x, x)
  j = Concat<axis = 1>(a, b)
  e = Exp(j)
  c = Abs(x)
  k = Concat<axis = -2>(j, c, e)
  s = Relu(x)
  u = Sigmoid(x)
  m = Concat<axis = 1>(s, u)
  n = Concat<axis = 1>(k, s)
  w = Sub(u, x)
  p = Add(m, m)
  z = Concat<axis = 1>(n, p)
  y = Mul(w, c)
}
"""


def _joins_reference(x):
    a, b = -x, x * x
    j = np.concatenate([a, b], 1)
    e = np.exp(j)
    c = np.abs(x)
    k = np.concatenate([j, c, e], 1)
    s = np.maximum(x, 0)
    u = 1 / (1 + np.exp(-x))
    n = np.concatenate([k, s], 1)
    return (u - x) * c, n, np.concatenate([s, u], 1)


def _run_both(text, feeds_list, **options):
    """Each run's outputs with the memory pattern, asserted equal bit for bit to those
    without it; the session with it."""
    on, off = _session(text, **options), _session(text, enable_mem_pattern=False, **options)
    for i, feeds in enumerate(feeds_list):
        for got, want in zip(on.run(None, feeds), off.run(None, feeds), strict=True):
            np.testing.assert_array_equal(got, want, err_msg=f"run {i}")
    return on


def test_concat_inputs_written_in_its_place():
    rng = np.random.default_rng(5)
    xs = [rng.standard_normal((2, 4, 4096), dtype=np.float32) for _ in range(RUNS)]
    sess = _run_both(JOINS, [{"x": x} for x in xs])
    y, z = sess.run(None, {"x": xs[0]})
    ry, rn, rm = _joins_reference(xs[0])
    np.testing.assert_allclose(y, ry, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(z[:, :24], rn, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(z[:, 24:], 2 * rm, rtol=1e-5, atol=1e-6)
    pattern = _pattern(sess)
    plan = next(p for p in sess._program._plans.values() if p.memory is not None)
    name = {j: plan.steps[i].node.outputs[0].name for i, j in plan.memory.candidates.items()}
    assert {name[j] for j in pattern.slices} == {"a", "b", "j", "e", "k", "s"}
    specs = {name[j]: spec for j, spec in enumerate(pattern.specs) if spec is not None}
    assert {"c", "u", "m", "n"} <= specs.keys()
    # each slice within n's bytes, at its place along the axis, in n's strides
    n_offset, n_bytes, _, _, n_shape, _, n_strides = specs["n"]
    assert n_shape == (2, 24, 4096)
    for v, first in (("k", 0), ("j", 0), ("a", 0), ("b", 4), ("e", 12), ("s", 20)):
        offset, size, _, _, shape, _, strides = specs[v]
        assert strides == n_strides
        assert offset == n_offset + first * n_strides[1]
        assert n_offset <= offset and offset + size <= n_offset + n_bytes
    c_offset, c_bytes = specs["c"][:2]
    assert c_offset + c_bytes <= n_offset or n_offset + n_bytes <= c_offset


def test_concat_inputs_in_place_from_many_threads():
    sess = _session(JOINS)
    rng = np.random.default_rng(6)
    inputs = [rng.standard_normal((2, 4, 4096), dtype=np.float32) for _ in range(8)]
    expected = [_session(JOINS, enable_mem_pattern=False).run(None, {"x": x}) for x in inputs]

    def check(i):
        for got, want in zip(sess.run(None, {"x": inputs[i]}), expected[i], strict=True):
            np.testing.assert_array_equal(got, want)

    _in_eight_threads(check)
    pattern = _pattern(sess)
    assert pattern.slices and any(pattern.over)  # w = Sub(u, x) over u: in place too


# Dense: takes a contiguous out only; given a slice of the Concat's (strided at N = 2), it
# writes a fresh array, and the next pattern gives it bytes of its own
DENSE_ONLY = """
<ir_version: 8, opset_import: ["" : 18, "test.memory": 1]>
g (float[N, 4, 4096] x) => (float[N, 8, 4096] y) {
  a = test.memory.Dense(x)
  b = Neg(x)
  j = Concat<axis = 1>(a, b)
  e = Exp(j)
  y = Add(e, j)
}
"""


@onnxrun.register_custom_op("Dense", "test.memory")
@takes_out
def _dense(X, *, out=None):
    return np.multiply(X, 5, out=out if out is not None and out.flags.c_contiguous else None)


def test_producer_that_writes_elsewhere_than_its_slice():
    rng = np.random.default_rng(7)
    sess = _run_both(DENSE_ONLY, [{"x": rng.standard_normal((2, 4, 4096), dtype=np.float32)}
                            for _ in range(RUNS + 2)])
    pattern = _pattern(sess)
    plan = next(p for p in sess._program._plans.values() if p.memory is not None)
    name = {j: plan.steps[i].node.outputs[0].name for i, j in plan.memory.candidates.items()}
    assert {name[j] for j in pattern.slices} == {"b"}
    assert "a" in {name[j] for j, spec in enumerate(pattern.specs) if spec is not None}
    assert pattern.recorder is None


def _suite_model(name):
    root = Path(__file__).resolve().parent.parent / "benchmarks"
    sys.path.insert(0, str(root))
    try:
        import suite_models
    finally:
        sys.path.remove(str(root))
    return suite_models.MODELS[name][0](small=True)


def _pooled_ops(sess):
    """op type -> how many steps write into the arena, and of those given a Concat's slice."""
    pattern = _pattern(sess)
    plan = next(p for p in sess._program._plans.values() if p.memory is not None)
    pooled, sliced = {}, {}
    for i, j in plan.memory.candidates.items():
        t = plan.steps[i].node.op_type
        if pattern.specs[j] is not None:
            pooled[t] = pooled.get(t, 0) + 1
        if j in pattern.slices:
            sliced[t] = sliced.get(t, 0) + 1
    return pooled, sliced


@pytest.mark.parametrize("name", ["densenet_style", "inception_style", "yolo_style"])
def test_cnn_kernels_write_into_concat_slices(name, monkeypatch):
    """Elementwise kernels, Concats and the convolutions whose compiled GEMM takes K in one
    block (Conv.streams_out: no tile read back) write into their range of a Concat's
    channels (rows of pixels further apart than their own channels); the outputs of every
    run equal those without the memory pattern bit for bit."""
    monkeypatch.setattr(memory, "MIN_BYTES", 4096)  # the small builds' values pooled too
    model, feeds = _suite_model(name)
    opts = onnxrun.SessionOptions()
    opts.intra_op_num_threads = 1
    on = onnxrun.InferenceSession(model.SerializeToString(), opts)
    opts.enable_mem_pattern = False
    off = onnxrun.InferenceSession(model.SerializeToString(), opts)
    want = off.run(None, feeds)
    for i in range(RUNS):
        for got, ref in zip(on.run(None, feeds), want, strict=True):
            np.testing.assert_array_equal(got, ref, err_msg=f"run {i}")
    pooled, sliced = _pooled_ops(on)
    assert pooled.get("Concat", 0) >= 1, pooled
    if name in ("densenet_style", "inception_style"):  # (the branches' last convolutions)
        assert {"Conv", "FusedConv"} & sliced.keys(), sliced
    # DenseNet's feature maps: each Concat's output in the next one's bytes; YOLO's C2f
    # residual sums (its SiLUs are in the convolutions' epilogues: the layout level's
    # ConvQuickGeluFusion)
    writers = {"densenet_style": "Concat", "yolo_style": "Add"}.get(name)
    assert writers is None or sliced.get(writers, 0) >= 1, sliced
    if name != "yolo_style":  # the compiled pools write into their buffers
        assert pooled.get("MaxPool", 0) + pooled.get("AveragePool", 0) >= 1, pooled


# products on the compiled GEMM's panels (a constant float32 B) write into their buffer
PRODUCTS = """
<ir_version: 8, opset_import: ["" : 18]>
g (float[N, 64] x) => (float[N, 64] y) {
  w1 = Constant<value = float[64, 256] {%s}>()
  w2 = Constant<value = float[256, 256] {%s}>()
  w3 = Constant<value = float[256, 64] {%s}>()
  h = MatMul(x, w1)
  r = Relu(h)
  k = Gemm<transB = 0>(r, w2)
  t = Tanh(k)
  y = MatMul(t, w3)
}
"""


def test_compiled_products_write_into_their_buffers():
    rng = np.random.default_rng(8)
    weights = [(rng.standard_normal(n) * 0.1).astype(np.float32) for n in
               (64 * 256, 256 * 256, 256 * 64)]
    text = PRODUCTS % tuple(", ".join(f"{v:.6g}" for v in w) for w in weights)
    sess = _run_both(text, [{"x": rng.standard_normal((96, 64), dtype=np.float32)}
                            for _ in range(RUNS)])
    pooled, _ = _pooled_ops(sess)
    assert pooled.get("MatMul", 0) >= 1 and pooled.get("Gemm", 0) + \
        pooled.get("FusedGemm", 0) >= 1, pooled


# the compiled LayerNormalization / SkipLayerNormalization write into their buffers
NORMS = """
<ir_version: 8, opset_import: ["" : 18, "com.microsoft" : 1]>
g (float[N, 512] x, float[N, 512] r) => (float[N, 512] y) {
  gamma = Constant<value = float[512] {%s}>()
  beta = Constant<value = float[512] {%s}>()
  a = Neg(x)
  n = LayerNormalization<axis = -1, epsilon = 0.00001>(a, gamma, beta)
  t = Tanh(n)
  s = com.microsoft.SkipLayerNormalization<epsilon = 0.00001>(t, r, gamma, beta)
  y = Abs(s)
}
"""


def test_layer_norms_write_into_their_buffers():
    rng = np.random.default_rng(9)
    gamma, beta = (rng.standard_normal(512).astype(np.float32) for _ in range(2))
    text = NORMS % tuple(", ".join(f"{v:.6g}" for v in w) for w in (gamma, beta))
    sess = _run_both(text, [{"x": rng.standard_normal((64, 512), dtype=np.float32),
                             "r": rng.standard_normal((64, 512), dtype=np.float32)}
                            for _ in range(RUNS)])
    pooled, _ = _pooled_ops(sess)
    assert pooled.get("LayerNormalization") == 1 and \
        pooled.get("SkipLayerNormalization") == 1, pooled


# in place: b over a, c over b (Relu), e over c (d, read again by z, is not written over),
# f over e (the bias broadcast, e the same shape as f)
IN_PLACE = """
<ir_version: 8, opset_import: ["" : 18]>
g (float[N, 8192] x, float[8192] bias) => (float[N, 8192] y, float[N, 8192] z) {
  a = Neg(x)
  b = Exp(a)
  c = Relu(b)
  d = Abs(x)
  e = Mul(c, d)
  f = Add(bias, e)
  y = Tanh(f)
  z = Sub(d, x)
}
"""


def test_elementwise_outputs_written_over_inputs_that_die_there():
    rng = np.random.default_rng(10)
    feeds = [{"x": rng.standard_normal((4, 8192), dtype=np.float32),
              "bias": rng.standard_normal(8192, dtype=np.float32)} for _ in range(RUNS)]
    sess = _run_both(IN_PLACE, feeds)
    y, z = sess.run(None, feeds[0])
    x, bias = feeds[0]["x"], feeds[0]["bias"]
    np.testing.assert_allclose(y, np.tanh(bias + np.maximum(np.exp(-x), 0) * np.abs(x)),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(z, np.abs(x) - x)
    pattern = _pattern(sess)
    plan = next(p for p in sess._program._plans.values() if p.memory is not None)
    name = {j: plan.steps[i].node.outputs[0].name for i, j in plan.memory.candidates.items()}
    over = {name[j]: (k, name[p]) for j, (k, p) in
            ((j, kp) for j, kp in enumerate(pattern.over) if kp is not None)}
    assert over == {"b": (0, "a"), "c": (0, "b"), "e": (0, "c"), "f": (1, "e")}, over
    offsets = {name[j]: spec[0] for j, spec in enumerate(pattern.specs) if spec is not None}
    assert offsets["a"] == offsets["b"] == offsets["c"] == offsets["e"] == offsets["f"]
    assert offsets["d"] != offsets["a"]
    assert pattern.nbytes == 2 * 4 * 8192 * 4


def test_written_over_only_while_nothing_else_holds_the_input():
    shape, strides, size = (4, 8192), (8192 * 4, 4), 4 * 8192 * 4
    dtype = np.dtype(np.float32)
    spec = (0, size, (), ((4, 8192),), shape, dtype, strides)
    buffers = Buffers(Pattern(size, [spec, spec], over=[None, (0, 0)]))
    x = np.ones(shape, np.float32)
    a = buffers.take(0, x)
    assert a is not None
    assert buffers.take(1, x) is None  # its input is not a's value
    view = a[1:].T  # a view of a, alive after a's last reader
    assert buffers.take(1, a) is None
    assert buffers.take(1, view) is None
    del view
    b = buffers.take(1, a)
    assert b is not None and np.shares_memory(a, b)
    del b
    t = a[:, :]  # a view the kernel returned, ``a`` itself gone
    del a
    assert buffers.take(1, t) is not None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mincore(2) of Linux")
def test_arena_pages_and_margins_are_mapped_when_allocated():
    # a page left unmapped beside a value made the prefetchers' reads into it page walks
    # (ShuffleNet's first MaxPool 160 instead of 58 us): every page of the arena and of a
    # margin on each side is written once when the arena is allocated
    import ctypes
    import mmap

    size = 3 * (1 << 20) + 123 * 64  # not a whole number of pages
    spec = (0, size, (), ((size // 4,),), (size // 4,), np.dtype(np.float32), (4,))
    buffers = Buffers(Pattern(size, [spec]))
    arena = buffers.arena
    raw = arena.base
    start = arena.ctypes.data
    assert start % memory.ARENA_ALIGN == 0
    assert start - raw.ctypes.data >= memory._GUARD_BYTES - memory.ARENA_ALIGN
    assert raw.ctypes.data + raw.nbytes - (start + size) >= memory._GUARD_BYTES
    page = mmap.PAGESIZE
    first = raw.ctypes.data // page * page
    pages = (raw.ctypes.data + raw.nbytes - first + page - 1) // page
    resident = (ctypes.c_ubyte * pages)()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    assert libc.mincore(ctypes.c_void_p(first), pages * page, resident) == 0, ctypes.get_errno()
    assert all(r & 1 for r in resident)


@pytest.mark.parametrize("name", ["dbnet_style", "densenet_style", "inception_style",
                                  "yolo_style"])
def test_slices_never_make_the_arena_larger(name, monkeypatch):
    """A slice keeps its Concat's bytes in use from the slice's producer on: the joins whose
    slices would make the arena larger (DBNet-style's upsampled maps) keep copying."""
    monkeypatch.setattr(memory, "MIN_BYTES", 4096)
    model, feeds = _suite_model(name)

    def arena():
        opts = onnxrun.SessionOptions()
        opts.intra_op_num_threads = 1
        sess = onnxrun.InferenceSession(model.SerializeToString(), opts)
        for _ in range(4):
            sess.run(None, feeds)
        return _pattern(sess)

    pattern = arena()
    monkeypatch.setattr(memory._Recorder, "_slices", lambda self, live: {})
    assert pattern.nbytes <= arena().nbytes
    if name in ("densenet_style", "yolo_style"):
        assert pattern.slices


# the erf Gelu kernels write into their buffer, which may be their input's own bytes
GELUS = """
<ir_version: 8, opset_import: ["" : 18, "com.microsoft" : 1]>
g (float[N, 1024] x, float[1024] b) => (float[N, 1024] y) {
  a = Neg(x)
  h = com.microsoft.BiasGelu(a, b)
  t = Neg(h)
  g = com.microsoft.Gelu(t)
  y = Abs(g)
}
"""


def test_gelus_write_over_their_inputs():
    rng = np.random.default_rng(11)
    sess = _run_both(GELUS, [{"x": rng.standard_normal((64, 1024), dtype=np.float32),
                              "b": rng.standard_normal(1024, dtype=np.float32)}
                             for _ in range(RUNS)])
    pooled, _ = _pooled_ops(sess)
    assert pooled.get("BiasGelu") == 1 and pooled.get("Gelu") == 1, pooled
    pattern = _pattern(sess)
    plan = next(p for p in sess._program._plans.values() if p.memory is not None)
    name = {j: plan.steps[i].node.outputs[0].name for i, j in plan.memory.candidates.items()}
    over = {name[j]: name[kp[1]] for j, kp in enumerate(pattern.over) if kp is not None}
    assert over == {"h": "a", "t": "h", "g": "t"}, over
    assert pattern.nbytes == 64 * 1024 * 4


# QuickGelu (SiLU at alpha 1) writes over its input, as the Gelus do
QUICK_GELU = """
<ir_version: 8, opset_import: ["" : 18, "com.microsoft" : 1]>
g (float[N, 1024] x) => (float[N, 1024] y) {
  a = Neg(x)
  q = com.microsoft.QuickGelu<alpha = 1.0>(a)
  y = Abs(q)
}
"""


def test_quick_gelu_writes_over_its_input():
    rng = np.random.default_rng(12)
    feeds = [{"x": rng.standard_normal((64, 1024), dtype=np.float32)} for _ in range(RUNS)]
    sess = _run_both(QUICK_GELU, feeds)
    pattern = _pattern(sess)
    plan = next(p for p in sess._program._plans.values() if p.memory is not None)
    name = {j: plan.steps[i].node.outputs[0].name for i, j in plan.memory.candidates.items()}
    over = {name[j]: name[kp[1]] for j, kp in enumerate(pattern.over) if kp is not None}
    assert over == {"q": "a"}, over
    a = -feeds[0]["x"].astype(np.float64)
    np.testing.assert_allclose(sess.run(None, feeds[0])[0], np.abs(a / (1 + np.exp(-a))),
                               rtol=1e-5, atol=1e-6)


def test_quick_gelu_into_a_channels_last_buffer_that_is_its_input():
    """The executor's buffer in X's channels-last layout, X's own bytes: QuickGelu writes
    there and returns that buffer, with the values it computes into a fresh array."""
    from types import SimpleNamespace

    from onnxrun.providers.cpu.compiled import logistic
    from onnxrun.providers.cpu.ops.contrib.fused import QuickGelu

    if logistic.unavailable() is not None:
        pytest.skip(logistic.unavailable())
    ctx = SimpleNamespace(session_options=SimpleNamespace(intra_op_num_threads=1))
    kernel = QuickGelu(ctx, alpha=1.0)
    X = np.random.default_rng(13).standard_normal((2, 9, 7, 40), np.float32).transpose(0, 3, 1, 2)
    want = kernel(X.copy())  # C order in, a fresh result
    got = kernel(X, out=X)
    assert got is X
    np.testing.assert_array_equal(got, want)
