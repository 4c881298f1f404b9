"""The benchmark suite's model classes (benchmarks/suite_models.py: YOLO, DBNet, CRNN, SVTR,
VAD, DenseNet, Inception), built small, give onnxruntime's results on onnxrun at every
optimization level the suite uses."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

import onnxrun

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
try:
    import suite_models
finally:
    sys.path.remove(str(ROOT / "benchmarks"))

ort = pytest.importorskip("onnxruntime")
LEVELS = onnxrun.GraphOptimizationLevel


def _reference(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), so,
                                providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def _onnxrun(model: onnx.ModelProto, level=LEVELS.ORT_ENABLE_ALL) -> onnxrun.InferenceSession:
    so = onnxrun.SessionOptions()
    so.graph_optimization_level = level
    so.intra_op_num_threads = 1
    return onnxrun.InferenceSession(model.SerializeToString(), so)


def _close(got: list[np.ndarray], want: list[np.ndarray]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype
        scale = max(float(np.abs(w).max()), 1e-3)
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4 * scale)


@pytest.fixture(scope="module", params=sorted(suite_models.MODELS))
def built(request):
    model, feeds = suite_models.MODELS[request.param][0](small=True)
    return request.param, model, feeds


def test_the_model_is_valid_and_matches_onnxruntime(built):
    name, model, feeds = built
    onnx.checker.check_model(model, full_check=True)
    want = _reference(model, feeds)
    assert all(np.isfinite(w).all() and np.abs(w).max() > 0 for w in want), name
    _close(_onnxrun(model).run(None, feeds), want)


@pytest.mark.parametrize("level", [LEVELS.ORT_DISABLE_ALL, LEVELS.ORT_ENABLE_EXTENDED])
def test_lower_levels_match_onnxruntime(built, level):
    _, model, feeds = built
    _close(_onnxrun(model, level).run(None, feeds), _reference(model, feeds))


def test_vad_streams_its_state_through_both_branches_of_the_if():
    model, feeds = suite_models.build_vad()
    sess, ref = _onnxrun(model), _reference(model, feeds)
    rng = np.random.default_rng(0)
    for sr in (16000, 8000):
        state, ref_state = feeds["state"], feeds["state"]
        for _ in range(3):  # each chunk's state is the previous chunk's output
            chunk = rng.uniform(-0.5, 0.5, (1, 512)).astype(np.float32)
            prob, state = sess.run(None, {"input": chunk, "state": state,
                                          "sr": np.array(sr, np.int64)})
            want = _reference(model, {"input": chunk, "state": ref_state,
                                      "sr": np.array(sr, np.int64)})
            _close([prob, state], want)
            ref_state = want[1]
    assert len(ref) == 2


def test_ensure_writes_the_model_and_its_inputs_to_the_cache(tmp_path):
    path = suite_models.ensure("vad_style", tmp_path)
    assert path == tmp_path / "vad_style" / "model.onnx"
    assert sorted(p.name for p in path.parent.glob("*.npy")) == ["input.npy", "sr.npy",
                                                                 "state.npy"]
    first = path.stat().st_mtime_ns
    assert suite_models.ensure("vad_style", tmp_path).stat().st_mtime_ns == first  # cached
