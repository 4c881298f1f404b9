"""After a few runs, a plan runs as one generated function (execute.CompiledSteps): the same
results, errors that name the node and its inputs, the terminate check between nodes,
outputs spread as the loop spreads them, values freed after their last use."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import onnx
import pytest

import onnxrun
from onnxrun.execute import CompiledSteps

RUNS = CompiledSteps.GENERATE_AFTER + 2  # the last runs take the generated function

MODEL = """
<ir_version: 8, opset_import: ["" : 18, "test.generated": 1]>
g (float[N, 4] x, float[K, M] w) => (float[N, M] y, float[N, 2] top, int64[N, 2] idx,
                                      float[N, 4] kept) {
  two = Constant<value = int64[1] {2}>()
  a = Add(x, x)
  h0, h1 = Split<axis = 1, num_outputs = 2>(a)
  r = Relu(h1)
  top, idx = TopK<axis = 1>(r, two)
  c = Concat<axis = 1>(h0, r)
  kept = test.generated.Keep(c)
  s, unused = test.generated.Pair(kept)
  y = MatMul(s, w)
}
"""

_seen: list[weakref.ref] = []


@onnxrun.register_custom_op("Keep", "test.generated")
def keep(X):
    return X + 0  # a new array each run, whose release the test watches


@onnxrun.register_custom_op("Pair", "test.generated")
def pair(X):
    out = X * 2
    _seen.append(weakref.ref(out))
    return (out,)  # fewer results than the node's outputs: the rest stay None


def _model():
    return onnx.parser.parse_model(MODEL).SerializeToString()


def _reference(x, w):
    a = x + x
    r = np.maximum(a[:, 2:], 0)
    c = np.concatenate([a[:, :2], r], axis=1)
    order = np.argsort(-r, axis=1, kind="stable")[:, :2]
    return (c * 2) @ w, np.take_along_axis(r, order, 1), order, c


@pytest.mark.parametrize("with_options", [False, True])
def test_runs_match_and_use_the_generated_function(with_options):
    sess = onnxrun.InferenceSession(_model())
    rng = np.random.default_rng(0)
    options = onnxrun.RunOptions() if with_options else None
    for _ in range(RUNS):
        x = rng.standard_normal((3, 4)).astype(np.float32)
        w = rng.standard_normal((4, 5)).astype(np.float32)
        got = sess.run(None, {"x": x, "w": w}, options)
        for g, want in zip(got, _reference(x, w), strict=True):
            np.testing.assert_allclose(g, want, rtol=1e-6)
    plan = sess._program.plan(tuple(sess._program.output_slots))
    assert plan.compiled.function(with_options) is not None  # the later runs took it


@pytest.mark.parametrize("nodes", [8, CompiledSteps.SMALL_PLAN + 8])
def test_small_plans_are_generated_sooner(nodes):
    """A plan of at most SMALL_PLAN steps is generated after GENERATE_AFTER_SMALL runs (a
    streaming model's, called thousands of times), a larger one after GENERATE_AFTER."""
    body = "\n".join(f"  t{i + 1} = Add(t{i}, t{i})" for i in range(nodes - 1))
    model = onnx.parser.parse_model(f"""
    <ir_version: 8, opset_import: ["" : 18]>
    g (float[2] t0) => (float[2] t{nodes - 1}) {{
    {body}
    }}
    """).SerializeToString()
    so = onnxrun.SessionOptions()
    so.enable_mem_pattern = False  # one variant of the function, whatever the run
    so.graph_optimization_level = onnxrun.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = onnxrun.InferenceSession(model, so)
    plan = sess._program.plan(tuple(sess._program.output_slots))
    assert len(plan.compiled.steps) == nodes - 1
    after = CompiledSteps.GENERATE_AFTER_SMALL if nodes - 1 <= CompiledSteps.SMALL_PLAN \
        else CompiledSteps.GENERATE_AFTER
    x = np.ones(2, np.float32)
    for _ in range(after):
        assert plan.compiled._fns == {}
        np.testing.assert_array_equal(sess.run(None, {"t0": x})[0], 2.0 ** (nodes - 1))
    sess.run(None, {"t0": x})
    assert plan.compiled._fns  # generated at the run after


def test_intermediates_are_freed_after_their_last_use():
    sess = onnxrun.InferenceSession(_model())
    x = np.ones((2, 4), np.float32)
    w = np.ones((4, 3), np.float32)
    for _ in range(RUNS):
        _seen.clear()
        sess.run(None, {"x": x, "w": w})
        gc.collect()
        assert _seen and all(ref() is None for ref in _seen)  # Pair's output: freed


@pytest.mark.parametrize("with_options", [False, True])
def test_kernel_error_names_node_and_inputs_on_later_runs(with_options):
    sess = onnxrun.InferenceSession(_model())
    options = onnxrun.RunOptions() if with_options else None
    x = np.ones((2, 4), np.float32)
    for _ in range(RUNS):
        sess.run(None, {"x": x, "w": np.ones((4, 3), np.float32)}, options)
    with pytest.raises(onnxrun.RuntimeException) as info:
        # w's first dimension is free, so MatMul's kernel is what refuses it
        sess.run(None, {"x": x, "w": np.ones((3, 2), np.float32)}, options)
    message = str(info.value).replace(" ", "")
    assert "(MatMul)" in message
    assert "[2,4]" in message and "[3,2]" in message, message


def test_terminate_between_nodes_on_later_runs():
    sess = onnxrun.InferenceSession(_model())
    x = np.ones((2, 4), np.float32)
    w = np.ones((4, 3), np.float32)
    options = onnxrun.RunOptions()
    for _ in range(RUNS):
        sess.run(None, {"x": x, "w": w}, options)
    options.terminate = True
    with pytest.raises(onnxrun.Fail, match="terminate"):
        sess.run(None, {"x": x, "w": w}, options)


# -- an If's branches written into the generated function -------------------------------------

IF_MODEL = """
<ir_version: 8, opset_import: ["" : 18, "test.generated": 1]>
g (bool c, float[N, 4] x, float[K, M] w) => (float[N, M] y, float[N, 4] z) {
  k = Constant<value = float[1] {3.0}>()
  y, z = If(c) <
    then_branch = t () => (float[N, M] ty, float[N, 4] tz) {
      half = Constant<value = float[1] {0.5}>()
      a = Mul(x, half)
      p, unused = test.generated.Pair(a)
      ty = MatMul(p, w)
      tz = Add(a, k)
    },
    else_branch = e () => (float[N, M] ey, float[N, 4] ez) {
      ey = MatMul(x, w)
      ez = Identity(x)
    }>
}
"""


def _if_model():
    return onnx.parser.parse_model(IF_MODEL).SerializeToString()


def _if_reference(c, x, w):
    if c:
        a = x * np.float32(0.5)
        return (a * 2) @ w, a + np.float32(3.0)
    return x @ w, x


@pytest.mark.parametrize("with_options", [False, True])
def test_if_branches_run_in_the_generated_function(with_options, monkeypatch):
    """Later runs take the If's branches inside the generated function: no nested run of a
    branch (Subgraph.__call__), the values of the enclosing graph and the branches'
    constants where they belong, both branches' results."""
    from onnxrun.plan import Subgraph

    sess = onnxrun.InferenceSession(_if_model())
    options = onnxrun.RunOptions() if with_options else None
    rng = np.random.default_rng(4)
    nested = []
    original = Subgraph.__call__
    monkeypatch.setattr(Subgraph, "__call__",
                        lambda self, *a: nested.append(1) or original(self, *a))
    for i in range(RUNS + 4):
        c = np.array(i % 3 != 0)
        x = rng.standard_normal((2, 4)).astype(np.float32)
        w = rng.standard_normal((4, 3)).astype(np.float32)
        nested.clear()
        got = sess.run(None, {"c": c, "x": x, "w": w}, options)
        for g, want in zip(got, _if_reference(c, x, w), strict=True):
            np.testing.assert_allclose(g, want, rtol=1e-6)
        assert not np.may_share_memory(got[1], x)
    assert not nested  # the last runs ran no branch through a nested run


def test_if_branch_values_are_freed_and_errors_name_both_nodes():
    """A value made inside a branch is released after its last use; a kernel failing inside
    a branch written in raises what the nested run raised: the If's node, then the failing
    node and its inputs."""
    model = onnx.parser.parse_model(IF_MODEL.replace("bool c", "bool[S] c"))
    sess = onnxrun.InferenceSession(model.SerializeToString())
    x = np.ones((2, 4), np.float32)
    feeds = {"c": np.array([True]), "x": x, "w": np.ones((4, 3), np.float32)}
    first = None
    for i in range(RUNS):
        _seen.clear()
        sess.run(None, feeds)
        gc.collect()
        assert _seen and all(ref() is None for ref in _seen)  # Pair's output in the branch
        if i == 0:  # the loop's nested run: the message to match later
            with pytest.raises(onnxrun.RuntimeException) as info:
                sess.run(None, dict(feeds, w=np.ones((3, 2), np.float32)))
            first = str(info.value)
    with pytest.raises(onnxrun.RuntimeException) as info:
        sess.run(None, dict(feeds, w=np.ones((3, 2), np.float32)))
    assert str(info.value) == first
    assert "(If) subgraph: while running node" in first and "(MatMul)" in first
    assert isinstance(info.value.__cause__, onnxrun.RuntimeException)
    with pytest.raises(onnxrun.RuntimeException, match="If condition"):
        sess.run(None, dict(feeds, c=np.array([True, False])))


def test_if_branch_checks_terminate_on_later_runs():
    sess = onnxrun.InferenceSession(_if_model())
    feeds = {"c": np.array(True), "x": np.ones((2, 4), np.float32),
             "w": np.ones((4, 3), np.float32)}
    options = onnxrun.RunOptions()
    for _ in range(RUNS):
        sess.run(None, feeds, options)
    options.terminate = True
    with pytest.raises(onnxrun.Fail, match="terminate"):
        sess.run(None, feeds, options)
