"""RunOptions.terminate stops a run between nodes, including inside Loop bodies."""

from __future__ import annotations

import threading

import numpy as np
import onnx
import pytest

import onnxrun

_calls = threading.local()


@onnxrun.register_custom_op("Tick", "test.runcontrol")
class Tick:
    """Identity that sets the run's terminate flag on its 5th call (on this thread)."""

    def __init__(self, ctx):
        pass

    def __call__(self, X):
        _calls.n = getattr(_calls, "n", 0) + 1
        if _calls.n == 5 and getattr(_calls, "options", None) is not None:
            _calls.options.terminate = True
        return X


LOOP_MODEL = """
<ir_version: 8, opset_import: ["" : 17, "test.runcontrol": 1]>
g (float[2] x) => (float[2] y) {
  m = Constant<value = int64 {1000}>()
  c = Constant<value = bool {1}>()
  y = Loop(m, c, x) <body = b (int64 i, bool cin, float[2] v) => (bool cout, float[2] w) {
      cout = Identity(cin)
      w = test.runcontrol.Tick(v)
  }>
}
"""


def test_terminate_inside_loop_body():
    sess = onnxrun.InferenceSession(onnx.parser.parse_model(LOOP_MODEL))
    x = np.ones(2, np.float32)
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], x)  # runs to the end
    opts = onnxrun.RunOptions()
    _calls.n, _calls.options = 0, opts
    try:
        with pytest.raises(onnxrun.Fail, match="terminate"):
            sess.run(None, {"x": x}, opts)
        assert _calls.n == 5  # stopped right after the flag was set, not after 1000 iterations
    finally:
        _calls.options = None


def test_terminate_before_run():
    sess = onnxrun.InferenceSession(onnx.parser.parse_model(LOOP_MODEL))
    opts = onnxrun.RunOptions()
    opts.terminate = True
    with pytest.raises(onnxrun.Fail):
        sess.run(None, {"x": np.ones(2, np.float32)}, opts)
