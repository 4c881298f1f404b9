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
