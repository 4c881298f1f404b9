"""Seeded training-mode Dropout: numpy's legacy RandomState(seed) stream, one per node."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import onnx.parser

import onnxrun


def _session(seed: int) -> onnxrun.InferenceSession:
    model = onnx.parser.parse_model(f"""
    <ir_version: 8, opset_import: ["" : 13]>
    g (float[4,5] x, float r, bool t) => (float[4,5] y, bool[4,5] z) {{
      y, z = Dropout<seed = {seed}>(x, r, t)
    }}
    """)
    return onnxrun.InferenceSession(model.SerializeToString())


def test_seeded_stream_continues_across_runs():
    x = np.random.default_rng(0).standard_normal((4, 5)).astype(np.float32)
    feeds = {"x": x, "r": np.float32(0.25), "t": np.bool_(True)}
    sess = _session(7)
    stream = np.random.RandomState(7)
    for _ in range(3):
        y, z = sess.run(None, feeds)
        mask = stream.uniform(0, 1, x.shape) >= 0.25
        np.testing.assert_array_equal(z, mask)
        np.testing.assert_allclose(y, x * mask / np.float32(0.75), rtol=1e-6)
    # a new session starts the stream again
    np.testing.assert_array_equal(_session(7).run(None, feeds)[1],
                                  np.random.RandomState(7).uniform(0, 1, x.shape) >= 0.25)


def test_concurrent_runs_share_one_stream():
    x = np.ones((4, 5), np.float32)
    feeds = {"x": x, "r": np.float32(0.5), "t": np.bool_(True)}
    sess = _session(11)
    with ThreadPoolExecutor(4) as pool:
        masks = list(pool.map(lambda _: sess.run(["z"], feeds)[0], range(8)))
    stream = np.random.RandomState(11)
    expected = sorted((stream.uniform(0, 1, x.shape) >= 0.5).tobytes() for _ in range(8))
    assert sorted(m.tobytes() for m in masks) == expected
