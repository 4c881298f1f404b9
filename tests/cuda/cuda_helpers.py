"""What the CUDA provider's tests share."""

from __future__ import annotations

import numpy as np

import onnxrun

CUDA = ["CUDAExecutionProvider", "CPUExecutionProvider"]


def compare(model, feeds, *, rtol=1e-5, atol=1e-6, on_cpu=0, options=None, providers=None):
    """Run ``model`` on the CUDA provider and on the CPU provider; the outputs must agree and
    at most ``on_cpu`` nodes may have run on the CPU provider."""
    data = model.SerializeToString() if not isinstance(model, bytes) else model
    sess = onnxrun.InferenceSession(data, options, providers=providers or CUDA)
    got = sess.run(None, feeds)
    want = onnxrun.InferenceSession(data, options, providers=["CPUExecutionProvider"]).run(
        None, feeds)
    for g, w in zip(got, want, strict=True):
        assert isinstance(g, np.ndarray)
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)
    placed = sess.get_optimization_report().placement
    assert placed.nodes.get("CPUExecutionProvider", 0) <= on_cpu, placed.format()
    return sess, got
