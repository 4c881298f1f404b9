"""float32 Sigmoid and QuickGelu (SiLU): MLAS's logistic, onnxruntime's numbers bit for bit
(compiled/logistic.py), tails, NaN and infinities included."""

from __future__ import annotations

import numpy as np
import pytest
from concurrency import spy_hand_offs
from onnx import TensorProto as TP
from onnx import helper
from ort_bits import assert_ort_bits

import onnxrun
from onnxrun.providers.cpu.compiled import logistic

ort = pytest.importorskip("onnxruntime")
pytestmark = pytest.mark.skipif(logistic.unavailable() is not None,
                                reason=f"compiled kernel: {logistic.unavailable()}")


def _both(op, domain, x, threads=1, **attrs):
    node = helper.make_node(op, ["x"], ["y"], domain=domain, **attrs)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TP.FLOAT, None)],
                          [helper.make_tensor_value_info("y", TP.FLOAT, None)])
    data = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                               helper.make_opsetid("com.microsoft", 1)]
                             ).SerializeToString()
    so = onnxrun.SessionOptions()
    so.intra_op_num_threads = threads
    got = onnxrun.InferenceSession(data, so).run(None, {"x": x})[0]
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    return got, want


def _input(n: int) -> np.ndarray:
    x = (np.random.default_rng(n).standard_normal(n) * 6).astype(np.float32)
    x[:9] = [np.nan, np.inf, -np.inf, 0.0, -0.0, 20.0, -20.0, 1e-30, 18.0]
    return x


@pytest.mark.parametrize("n", [300, 4099, 300_001])
def test_sigmoid(n):
    got, want = _both("Sigmoid", "", _input(n))
    assert_ort_bits(got, want)


@pytest.mark.parametrize("alpha", [1.0, 1.702])
@pytest.mark.parametrize("n", [300, 300_001])
def test_quick_gelu(alpha, n):
    got, want = _both("QuickGelu", "com.microsoft", _input(n).reshape(1, -1), threads=2,
                      alpha=alpha)
    assert_ort_bits(got, want)


def test_quick_gelu_splits_on_the_spinning_workers(monkeypatch):
    """At 2+ intra-op threads a SiLU of at least two ranges (logistic._CHUNK elements each)
    hands whole vectors of 8 to spin.py's workers, taken in turn: onnxruntime's bits and 1
    thread's at 2 and 3 threads, the ragged tail included; no range goes to parallel.py's
    Python threads, and a smaller SiLU hands nothing off."""
    forks, queued = spy_hand_offs(monkeypatch)
    small = _input(2 * logistic._CHUNK - 3).reshape(1, -1)
    got, want = _both("QuickGelu", "com.microsoft", small, threads=2)
    assert_ort_bits(got, want)
    assert forks == [] and queued == []
    x = _input(300_001).reshape(1, -1)
    one, want = _both("QuickGelu", "com.microsoft", x, threads=1)
    for threads in (2, 3):
        for _ in range(3):
            got, _ = _both("QuickGelu", "com.microsoft", x, threads=threads)
            assert got.tobytes() == one.tobytes()
    assert_ort_bits(one, want)
    assert forks and queued == []
