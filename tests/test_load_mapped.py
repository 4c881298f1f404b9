"""A model file of 1 MiB or more is mapped rather than read (load.py's _map_file): the weights
are the same as from the file's bytes, aligned and read-only, and the mapping is gone once the
session is created."""

from __future__ import annotations

import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxrun
from onnxrun import load


def _model(path) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    weights = {
        "W": rng.standard_normal((512, 600)).astype(np.float32),  # 1.2 MB: over the threshold
        "b": rng.standard_normal(600).astype(np.float32),
        "h": rng.standard_normal((600,)).astype(np.float16),
    }
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["m"]), helper.make_node("Add", ["m", "b"], ["a"]),
         helper.make_node("Cast", ["h"], ["hf"], to=TensorProto.FLOAT),
         helper.make_node("Mul", ["a", "hf"], ["y"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 512])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 600])],
        [numpy_helper.from_array(v, k) for k, v in weights.items()])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return weights


def test_mapped_file_gives_the_weights_of_its_bytes(tmp_path):
    path = tmp_path / "m.onnx"
    weights = _model(path)
    assert path.stat().st_size >= load._MAP_MIN_BYTES
    _, from_file = load.load_model(str(path))
    _, from_bytes = load.load_model(path.read_bytes())
    for name, expected in weights.items():
        got = from_file.graph.initializers[name].const_value
        np.testing.assert_array_equal(got, expected)
        np.testing.assert_array_equal(got, from_bytes.graph.initializers[name].const_value)
        assert got.flags.aligned and not got.flags.writeable
        assert got.base is None or not isinstance(got.base, memoryview)  # a copy of its own


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
def test_mapping_is_released_after_creation(tmp_path):
    path = tmp_path / "m.onnx"
    weights = _model(path)
    sess = onnxrun.InferenceSession(str(path))
    with open("/proc/self/maps") as f:
        assert str(path) not in f.read()
    x = np.ones((2, 512), np.float32)
    expected = (x @ weights["W"] + weights["b"]) * weights["h"].astype(np.float32)
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], expected, rtol=1e-5, atol=1e-4)
