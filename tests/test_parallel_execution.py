"""ExecutionMode.ORT_PARALLEL gives the sequential results, errors and termination."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from concurrency import assert_threads_match_serial

import onnxrun

BRANCHES = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[N, 64] x, float[64, 64] w) => (float[N, 64] y, float[N, 64] z) {
  a = MatMul(x, w)
  b = Relu(a)
  c = MatMul(x, w)
  d = Sigmoid(c)
  e = MatMul(b, w)
  f = Add(e, d)
  y = Tanh(f)
  z = Mul(b, d)
}
"""


def _session(text: str, mode: onnxrun.ExecutionMode, threads: int = 2) -> onnxrun.InferenceSession:
    opts = onnxrun.SessionOptions()
    opts.execution_mode = mode
    opts.inter_op_num_threads = threads
    return onnxrun.InferenceSession(onnx.parser.parse_model(text), opts)


def test_parallel_matches_sequential():
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((8, 64)).astype(np.float32),
             "w": rng.standard_normal((64, 64)).astype(np.float32) / 8}
    seq = _session(BRANCHES, onnxrun.ExecutionMode.ORT_SEQUENTIAL).run(None, feeds)
    par_sess = _session(BRANCHES, onnxrun.ExecutionMode.ORT_PARALLEL)
    for _ in range(20):  # scheduling varies between runs; results must not
        for a, b in zip(seq, par_sess.run(None, feeds), strict=True):
            np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(par_sess.run(["z"], feeds)[0], seq[1])


def test_parallel_from_several_threads():
    rng = np.random.default_rng(1)
    sess = _session(BRANCHES, onnxrun.ExecutionMode.ORT_PARALLEL)
    cases = [{"x": rng.standard_normal((4, 64)).astype(np.float32),
              "w": rng.standard_normal((64, 64)).astype(np.float32) / 8} for _ in range(4)]
    assert_threads_match_serial(sess, cases, 10)


@onnxrun.register_custom_op("Boom", "test.parallel")
def _boom(X):
    raise ValueError("boom")


def test_parallel_kernel_error_names_the_node():
    text = """
    <ir_version: 8, opset_import: ["" : 17, "test.parallel": 1]>
    g (float[2] x) => (float[2] y) {
      a = Relu(x)
      b = test.parallel.Boom(x)
      y = Add(a, b)
    }
    """
    sess = _session(text, onnxrun.ExecutionMode.ORT_PARALLEL)
    with pytest.raises(onnxrun.RuntimeException, match=r"'b' \(Boom\) with inputs float\[2\]"):
        sess.run(None, {"x": np.ones(2, np.float32)})


def test_parallel_inception_matches_sequential():
    path = os.path.join(os.path.dirname(onnx.__file__),
                        "backend/test/data/light/light_inception_v1.onnx")
    x = (np.arange(3 * 224 * 224).reshape(1, 3, 224, 224) / (3 * 224 * 224)).astype(np.float32)
    outs = []
    for mode in (onnxrun.ExecutionMode.ORT_SEQUENTIAL, onnxrun.ExecutionMode.ORT_PARALLEL):
        opts = onnxrun.SessionOptions()
        opts.execution_mode = mode
        sess = onnxrun.InferenceSession(path, opts)
        outs.append(sess.run(None, {sess.get_inputs()[0].name: x})[0])
    np.testing.assert_allclose(outs[0], outs[1], rtol=1e-5, atol=1e-7)
