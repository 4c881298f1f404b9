"""InferenceSession.run_async: onnxruntime's callback contract (results, user_data, err)."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

import onnxrun

MODEL = str(Path(__file__).parent / "models" / "gpt_tiny.onnx")


def _call_async(sess, feeds, output_names=None):
    done = threading.Event()
    got = {}

    def callback(results, user_data, err):
        got.update(results=results, user_data=user_data, err=err,
                   thread=threading.current_thread())
        done.set()

    sess.run_async(output_names, feeds, callback, "my data")
    assert done.wait(30)
    return got


@pytest.mark.parametrize("engine", [onnxrun, ort])
def test_results_reach_the_callback_on_another_thread(engine):
    sess = engine.InferenceSession(MODEL, providers=["CPUExecutionProvider"])
    feeds = {"input_ids": np.arange(6, dtype=np.int64).reshape(1, 6) % 50}
    got = _call_async(sess, feeds)
    assert got["err"] == "" and got["user_data"] == "my data"
    assert got["thread"] is not threading.current_thread()
    (expected,) = sess.run(None, feeds)
    assert isinstance(got["results"], list) and isinstance(got["results"][0], np.ndarray)
    np.testing.assert_array_equal(got["results"][0], expected)


@pytest.mark.parametrize("engine", [onnxrun, ort])
def test_a_bad_feed_is_an_error_string_in_the_callback(engine):
    sess = engine.InferenceSession(MODEL, providers=["CPUExecutionProvider"])
    got = _call_async(sess, {"input_ids": np.ones((1, 4), np.float32)})
    assert got["results"] == [] and "tensor(int64)" in got["err"]


@pytest.mark.parametrize("engine", [onnxrun, ort])
def test_an_unknown_input_name_raises_at_once(engine):
    sess = engine.InferenceSession(MODEL, providers=["CPUExecutionProvider"])
    with pytest.raises(Exception, match="input_ids"):
        sess.run_async(None, {"nope": np.ones((1, 4), np.int64)}, lambda *a: None, None)


def test_many_concurrent_async_runs():
    sess = onnxrun.InferenceSession(MODEL)
    inputs = [np.full((1, n), n % 50, np.int64) for n in range(1, 17)]
    expected = [sess.run(None, {"input_ids": x})[0] for x in inputs]
    results: dict[int, np.ndarray] = {}
    lock, all_done = threading.Lock(), threading.Event()

    def callback(res, i, err):
        assert err == ""
        with lock:
            results[i] = res[0]
            if len(results) == len(inputs):
                all_done.set()

    for i, x in enumerate(inputs):
        sess.run_async(None, {"input_ids": x}, callback, i)
    assert all_done.wait(60)
    for i, e in enumerate(expected):
        np.testing.assert_array_equal(results[i], e)
