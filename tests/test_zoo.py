"""The nine light model-zoo CNNs shipped inside the onnx package, against their stored outputs.

Inputs are built the way the onnx backend test runner builds them: every graph input that is
not an initializer gets ``arange(n).reshape(shape) / n`` (unknown dims taken as 1).
"""

from __future__ import annotations

import glob
import os

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import onnxrun

LIGHT = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
MODELS = sorted(glob.glob(os.path.join(LIGHT, "light_*.onnx")))


def _name(path: str) -> str:
    return os.path.basename(path)[len("light_"):-len(".onnx")]


def _inputs(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    initializers = {t.name for t in model.graph.initializer}
    feeds = {}
    for vi in model.graph.input:
        if vi.name in initializers:
            continue
        shape = [d.dim_value or 1 for d in vi.type.tensor_type.shape.dim]
        n = int(np.prod(shape))
        feeds[vi.name] = (np.arange(n).reshape(shape) / n).astype(np.float32)
    return feeds


@pytest.mark.skipif(not MODELS, reason="this onnx package ships no light zoo models")
@pytest.mark.parametrize("path", MODELS, ids=[_name(p) for p in MODELS])
def test_light_zoo_model(path: str) -> None:
    model = onnx.load(path)
    expected = numpy_helper.to_array(
        onnx.load_tensor(path[: -len(".onnx")] + "_output_0.pb")
    )
    sess = onnxrun.InferenceSession(model.SerializeToString())
    (got,) = sess.run(None, _inputs(model))
    assert got.dtype == expected.dtype
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-3, atol=1e-7)
