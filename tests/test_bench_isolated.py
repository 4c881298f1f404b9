"""``onnxrun bench`` measures session creation in a child process that runs the engine's modules
from bytecode, as an installed package does, even when this process writes none
(PYTHONDONTWRITEBYTECODE): the bytecode then goes to a cache outside the source tree."""

from __future__ import annotations

import sys
import tempfile

import numpy as np
import onnx
import onnx.parser

from onnxrun.tools import bench

MODEL_TEXT = """
<ir_version: 8, opset_import: ["" : 17]>
main (float[2, 8] X) => (float[2, 8] Y) { Y = Relu(X) }
"""


def test_child_runs_from_bytecode_kept_outside_the_source_tree(tmp_path, monkeypatch):
    model = tmp_path / "relu.onnx"
    onnx.save(onnx.parser.parse_model(MODEL_TEXT), model)
    feeds = tmp_path / "feeds.npz"
    np.savez(feeds, X=np.ones((2, 8), np.float32))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    result = bench.measure_isolated("onnxrun", str(model), str(feeds), bench.BenchOptions())
    assert result.create_s > 0 and result.peak_bytes >= result.baseline_bytes > 0
    cached = {p.name for p in (tmp_path / "onnxrun-bench-pycache").rglob("*.pyc")}
    tag = sys.implementation.cache_tag
    # compiled before the timing: the modules the session imports, and those it does not
    assert {f"activation.{tag}.pyc", f"conv.{tag}.pyc", f"session.{tag}.pyc"} <= cached
