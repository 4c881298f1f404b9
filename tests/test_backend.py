"""onnxrun.backend (onnxruntime.backend's API) and onnxrun.datasets: preparing and running
models, the allowlists of options a backend caller may set, onnxruntime's module layout."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest

import onnxrun
import onnxrun.backend as backend
from onnxrun import datasets
from onnxrun.backend.backend import OnnxRuntimeBackend
from onnxrun.backend.backend_rep import OnnxRuntimeBackendRep

X = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], np.float32)
SQUARES = X * np.arange(1, 7, dtype=np.float32).reshape(3, 2)


@pytest.fixture
def mul_1() -> str:
    return datasets.get_example("mul_1.onnx")


def test_prepare_and_run_every_model_form(mul_1):
    model = onnx.load(mul_1)
    session = onnxrun.InferenceSession(mul_1)
    for source in (mul_1, model, model.SerializeToString(), session):
        rep = backend.prepare(source)
        assert isinstance(rep, OnnxRuntimeBackendRep)
        np.testing.assert_array_equal(rep.run(X)[0], SQUARES)  # a single input's value
        np.testing.assert_array_equal(rep.run([X])[0], SQUARES)
        np.testing.assert_array_equal(rep.run({"X": X})[0], SQUARES)
        assert backend.prepare(rep) is rep
    np.testing.assert_array_equal(backend.run(mul_1, [X])[0], SQUARES)
    np.testing.assert_array_equal(OnnxRuntimeBackend.run_model(model, X)[0], SQUARES)
    with pytest.raises(RuntimeError, match="Incompatible device"):
        backend.prepare(mul_1, "CUDA")


def test_session_options_that_write_files_are_refused(mul_1, tmp_path):
    target = tmp_path / "out.onnx"
    for key, value in (("optimized_model_filepath", str(target)), ("enable_profiling", True),
                       ("profile_file_prefix", str(tmp_path / "prof"))):
        with pytest.raises(RuntimeError, match=f"attribute '{key}' is not permitted"):
            backend.prepare(mul_1, **{key: value})
        with pytest.raises(RuntimeError, match="not permitted"):
            backend.run(mul_1, [X], **{key: value})
    assert os.listdir(tmp_path) == []
    # allowed options are applied, unknown keywords ignored
    rep = backend.prepare(mul_1, intra_op_num_threads=1, graph_optimization_level=0,
                          no_such_option="x")
    options = rep.session.get_session_options()
    assert options.intra_op_num_threads == 1
    assert options.graph_optimization_level == onnxrun.GraphOptimizationLevel.ORT_DISABLE_ALL
    np.testing.assert_array_equal(rep.run(X, no_such_option=1)[0], SQUARES)


def test_run_options_that_stop_a_run_are_refused(mul_1):
    rep = backend.prepare(mul_1)
    with pytest.raises(RuntimeError, match="RunOptions attribute 'terminate' is not permitted"):
        rep.run(X, terminate=True)
    with pytest.raises(RuntimeError, match="not permitted"):
        backend.run(mul_1, [X], terminate=True)
    np.testing.assert_array_equal(
        backend.run(mul_1, [X], only_execute_path_to_fetches=True, logid="x")[0], SQUARES)


def test_a_map_input_is_one_value():
    """A dict is the value of a model's single map input unless its keys are input names."""
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper

    node = helper.make_node("DictVectorizer", ["M"], ["Y"], domain="ai.onnx.ml",
                            int64_vocabulary=[0, 1, 2])
    m_type = helper.make_map_type_proto(TensorProto.INT64, helper.make_tensor_type_proto(
        TensorProto.FLOAT, []))
    graph = helper.make_graph([node], "g", [helper.make_value_info("M", m_type)],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("ai.onnx.ml", 1)])
    value = {0: 1.5, 2: -3.0}
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"M": value})[0]
    np.testing.assert_array_equal(backend.prepare(model).run(value)[0], want)


def test_datasets_examples_run():
    ort = pytest.importorskip("onnxruntime")
    for name in ("logreg_iris.onnx", "mul_1.onnx", "sigmoid.onnx"):
        path = datasets.get_example(name)
        assert os.path.isabs(path)
        session = onnxrun.InferenceSession(path)
        feed = {i.name: np.linspace(-2, 2, int(np.prod(i.shape)), dtype=np.float32).reshape(
            i.shape) for i in session.get_inputs()}
        got = session.run(None, feed)
        want = ort.InferenceSession(path).run(None, feed)
        np.testing.assert_allclose(got[0], want[0], rtol=1e-6)
    labels, probabilities = backend.prepare(datasets.get_example("logreg_iris.onnx")).run(X)
    assert list(labels) == [0, 0, 0]
    assert abs(probabilities[0][0] - 0.9506) < 1e-4
    with pytest.raises(FileNotFoundError, match="Unable to find example 'nope.onnx'"):
        datasets.get_example("nope.onnx")
    with pytest.raises(FileNotFoundError):
        datasets.get_example("../__init__.py")


def test_datasets_files_are_what_the_builder_writes():
    from onnxrun.datasets import build

    for name, make in build.EXAMPLES.items():
        with open(datasets.get_example(name), "rb") as f:
            assert f.read() == make().SerializeToString(), name
