"""SessionOptions.enable_profiling writes onnxruntime's Chrome-trace JSON."""

from __future__ import annotations

import json

import numpy as np
import onnx

import onnxrun

MODEL = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[N, 4] x) => (float[N, 4] y) {
  t = Add(x, x)
  y = Relu(t)
}
"""


def test_profile_is_a_chrome_trace(tmp_path):
    opts = onnxrun.SessionOptions()
    opts.enable_profiling = True
    opts.profile_file_prefix = str(tmp_path / "prof")
    sess = onnxrun.InferenceSession(onnx.parser.parse_model(MODEL), opts)
    x = np.ones((2, 4), np.float32)
    for _ in range(3):
        sess.run(None, {"x": x})
    assert sess.get_profiling_start_time_ns() > 0
    path = sess.end_profiling()
    assert path.startswith(str(tmp_path / "prof_")) and path.endswith(".json")
    events = json.loads(open(path).read())
    assert all(e["ph"] == "X" and {"ts", "dur", "pid", "tid", "name", "cat"} <= e.keys()
               for e in events)
    names = [e["name"] for e in events if e["cat"] == "Session"]
    assert "session_initialization" in names and names.count("model_run") == 3
    nodes = [e for e in events if e["cat"] == "Node"]
    assert len(nodes) == 6  # two nodes, three runs
    relu = next(e for e in nodes if e["args"]["op_name"] == "Relu")
    assert relu["args"]["provider"] == "CPUExecutionProvider"
    assert relu["args"]["input_type_shape"] == [{"float": [2, 4]}]
    assert relu["args"]["output_type_shape"] == [{"float": [2, 4]}]


def test_no_profile_without_option():
    sess = onnxrun.InferenceSession(onnx.parser.parse_model(MODEL))
    sess.run(None, {"x": np.ones((1, 4), np.float32)})
    assert sess.end_profiling() == ""


def test_profile_without_native_thread_ids(tmp_path, monkeypatch):
    # Pyodide's threading has no get_native_id: events take the interpreter's thread id
    import threading

    monkeypatch.delattr(threading, "get_native_id")
    opts = onnxrun.SessionOptions()
    opts.enable_profiling = True
    opts.profile_file_prefix = str(tmp_path / "prof")
    sess = onnxrun.InferenceSession(onnx.parser.parse_model(MODEL), opts)
    sess.run(None, {"x": np.ones((1, 4), np.float32)})
    events = json.loads(open(sess.end_profiling()).read())
    assert {e["tid"] for e in events} == {threading.get_ident()}
