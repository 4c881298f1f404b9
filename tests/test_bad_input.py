"""Robustness: wrong feeds, malformed or truncated files, hostile external data, broken graphs.

Every case must end in an onnxrun error whose message says what is wrong: never a crash, a hang,
or a read outside the model's folder.
"""

from __future__ import annotations

import builtins
import io
import os
from pathlib import Path

import numpy as np
import onnx
import onnx.parser
import pytest
from onnx import TensorProto, external_data_helper, helper, numpy_helper

import onnxrun
from onnxrun import InferenceSession

LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"

MODEL_TEXT = """
<ir_version: 8, opset_import: ["" : 17]>
main (float[N, 3] X, int64[2] I) => (float[N, 3] Y, int64[2] J)
<float[3] W = {1.0, 2.0, 3.0}>
{
    T = Mul(X, W)
    Y = Relu(T)
    J = Identity(I)
}
"""


@pytest.fixture(scope="module")
def sess() -> InferenceSession:
    return InferenceSession(onnx.parser.parse_model(MODEL_TEXT).SerializeToString())


def good_feed(n: int = 2) -> dict[str, np.ndarray]:
    return {"X": np.ones((n, 3), np.float32), "I": np.array([1, 2], np.int64)}


# -- feeds ------------------------------------------------------------------------------------


def test_wrong_input_name_lists_expected_names(sess):
    feed = good_feed()
    feed["Z"] = feed.pop("X")
    with pytest.raises(onnxrun.InvalidArgument, match=r"'Z'.*\['X', 'I'\]"):
        sess.run(None, feed)


def test_wrong_dtype_says_expected_and_got(sess):
    feed = good_feed()
    feed["X"] = feed["X"].astype(np.float64)
    with pytest.raises(onnxrun.InvalidArgument) as info:
        sess.run(None, feed)
    assert "tensor(double)" in str(info.value) and "tensor(float)" in str(info.value)
    assert "'X'" in str(info.value)
    feed = good_feed()
    feed["I"] = feed["I"].astype(np.int32)
    with pytest.raises(onnxrun.InvalidArgument, match=r"int32.*int64"):
        sess.run(None, feed)


def test_wrong_rank(sess):
    feed = good_feed()
    feed["X"] = np.ones((2, 3, 1), np.float32)
    with pytest.raises(onnxrun.InvalidArgument,
                       match="Invalid rank for input: X Got: 3 Expected: 2"):
        sess.run(None, feed)


def test_wrong_fixed_dimension(sess):
    feed = good_feed()
    feed["X"] = np.ones((2, 4), np.float32)
    with pytest.raises(onnxrun.InvalidArgument, match="index: 1 Got: 4 Expected: 3"):
        sess.run(None, feed)
    # The symbolic dimension N takes any value.
    assert sess.run(None, good_feed(7))[0].shape == (7, 3)


def test_missing_input(sess):
    with pytest.raises(onnxrun.InvalidArgument, match=r"Required inputs \(\['I'\]\) are missing"):
        sess.run(None, {"X": good_feed()["X"]})


def test_feed_that_is_not_a_mapping_or_not_convertible(sess):
    with pytest.raises(onnxrun.InvalidArgument, match="dict"):
        sess.run(None, [good_feed()["X"], good_feed()["I"]])
    feed = good_feed()
    feed["X"] = [["a", "b", "c"]]
    with pytest.raises(onnxrun.InvalidArgument, match="'X'"):
        sess.run(None, feed)


# -- model files -------------------------------------------------------------------------------


def test_garbage_bytes():
    rng = np.random.default_rng(0)
    for data in (b"this is not an onnx model", rng.bytes(1000), b"\x08\x07" + rng.bytes(64)):
        with pytest.raises(onnxrun.InvalidProtobuf, match="failed"):
            InferenceSession(data)


def test_empty_file(tmp_path: Path):
    path = tmp_path / "empty.onnx"
    path.write_bytes(b"")
    with pytest.raises(onnxrun.InvalidProtobuf, match="not an ONNX model"):
        InferenceSession(str(path))


def test_nonexistent_path(tmp_path: Path):
    missing = tmp_path / "nope" / "model.onnx"
    with pytest.raises(onnxrun.NoSuchFile, match="does not exist"):
        InferenceSession(str(missing))
    with pytest.raises(FileNotFoundError):  # the builtin a caller would naturally catch
        InferenceSession(missing)
    with pytest.raises(onnxrun.NoSuchFile, match="not a file"):
        InferenceSession(tmp_path)


def _truncation_points(size: int) -> list[int]:
    rng = np.random.default_rng(1)
    points = {1, 2, 3, 5, 8, 13, 21, 34, 55, size // 2, size - 1, size - 2, size - 10}
    points.update(int(p) for p in rng.integers(1, size, 40))
    return sorted(p for p in points if 0 < p < size)


@pytest.mark.parametrize("source", ["built", "light_squeezenet"])
def test_truncated_model_always_raises(tmp_path: Path, source: str):
    if source == "built":
        m = onnx.parser.parse_model(MODEL_TEXT)
        m.graph.initializer.append(numpy_helper.from_array(np.ones(64, np.float32), "unused"))
        data = m.SerializeToString()
    else:
        data = (LIGHT / "light_squeezenet.onnx").read_bytes()
    path = tmp_path / "cut.onnx"
    for k in _truncation_points(len(data)):
        path.write_bytes(data[:k])
        with pytest.raises(onnxrun.OnnxRunError):
            InferenceSession(str(path))
        with pytest.raises(onnxrun.OnnxRunError):
            InferenceSession(data[:k])


# -- graphs ------------------------------------------------------------------------------------


def test_unknown_operator_names_domain_op_opset_and_node():
    m = onnx.parser.parse_model("""
        <ir_version: 8, opset_import: ["" : 17, "com.example" : 3]>
        main (float[2] X) => (float[2] Y) { Y = com.example.Frobnicate(X) }
    """)
    m.graph.node[0].name = "frob_node"
    with pytest.raises(onnxrun.NotImplemented) as info:
        InferenceSession(m.SerializeToString())
    message = str(info.value)
    for part in ("Frobnicate", "com.example", "3", "frob_node"):
        assert part in message
    assert isinstance(info.value, NotImplementedError)


def test_unknown_standard_operator_is_refused():
    m = onnx.parser.parse_model("""
        <ir_version: 8, opset_import: ["" : 17]>
        main (float[2] X) => (float[2] Y) { Y = NoSuchOperator(X) }
    """)
    with pytest.raises(onnxrun.Fail, match="NoSuchOperator"):
        InferenceSession(m.SerializeToString())


def test_graph_with_a_cycle():
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2])
    nodes = [
        helper.make_node("Add", ["X", "B"], ["A"], name="first"),
        helper.make_node("Relu", ["A"], ["B"], name="second"),
        helper.make_node("Identity", ["B"], ["Y"], name="out"),
    ]
    m = helper.make_model(helper.make_graph(nodes, "cyclic", [x], [y]),
                          opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(onnxrun.InvalidGraph, match=r"cycle.*'first', 'second'"):
        InferenceSession(m.SerializeToString())


def test_nodes_listed_out_of_order_still_run():
    # Not an error: onnxruntime sorts the nodes itself, and so does onnxrun.
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2])
    nodes = [helper.make_node("Identity", ["B"], ["Y"]), helper.make_node("Relu", ["X"], ["B"])]
    m = helper.make_model(helper.make_graph(nodes, "unsorted", [x], [y]),
                          opset_imports=[helper.make_opsetid("", 17)])
    s = InferenceSession(m.SerializeToString())
    np.testing.assert_array_equal(s.run(None, {"X": np.array([-1, 1], np.float32)})[0], [0, 1])
    assert s.get_outputs()[0].shape == [2]


def test_node_reading_an_undefined_value():
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2])
    nodes = [helper.make_node("Add", ["X", "ghost"], ["Y"], name="adder")]
    m = helper.make_model(helper.make_graph(nodes, "g", [x], [y]),
                          opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(onnxrun.InvalidGraph, match="ghost"):
        InferenceSession(m.SerializeToString())


def test_graph_output_never_produced():
    m = onnx.parser.parse_model("""
        <ir_version: 8, opset_import: ["" : 17]>
        main (float[2] X) => (float[2] Y) { Z = Relu(X) }
    """)
    with pytest.raises(onnxrun.InvalidGraph, match="'Y'"):
        InferenceSession(m.SerializeToString())


def _model_with_initializer(tensor: TensorProto) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, [4])
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, [4])
    graph = helper.make_graph([helper.make_node("Mul", ["X", tensor.name], ["Y"])], "g", [x], [y],
                              initializer=[tensor])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def test_raw_data_shorter_than_declared_shape():
    t = TensorProto(name="W", data_type=TensorProto.FLOAT, dims=[4])
    t.raw_data = np.ones(3, np.float32).tobytes()
    with pytest.raises(onnxrun.InvalidGraph, match=r"'W'.*\[4\].*16 bytes.*12 bytes"):
        InferenceSession(_model_with_initializer(t).SerializeToString())


def test_typed_data_shorter_than_declared_shape():
    t = TensorProto(name="W", data_type=TensorProto.FLOAT, dims=[4])
    t.float_data.extend([1.0, 2.0, 3.0])
    with pytest.raises(onnxrun.InvalidGraph, match="'W'"):
        InferenceSession(_model_with_initializer(t).SerializeToString())
    t = TensorProto(name="W", data_type=TensorProto.FLOAT, dims=[1 << 40])  # absurd size
    t.float_data.extend([1.0])
    with pytest.raises(onnxrun.InvalidGraph, match="'W'"):
        InferenceSession(_model_with_initializer(t).SerializeToString())


# -- external data -----------------------------------------------------------------------------

WEIGHTS = np.array([1.0, 2.0, 3.0, 4.0], np.float32)


def _external_model(folder: Path, location: str, offset: int = 0,
                    length: int | None = None) -> Path:
    """A model whose initializer W points at ``location``; returns the model's path."""
    t = numpy_helper.from_array(WEIGHTS, "W")
    external_data_helper.set_external_data(t, location=location, offset=offset,
                                           length=WEIGHTS.nbytes if length is None else length)
    t.ClearField("raw_data")
    t.data_location = TensorProto.EXTERNAL
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "model.onnx"
    path.write_bytes(_model_with_initializer(t).SerializeToString())
    return path


class _OpenRecorder:
    """Records every file opened by name through os.open or open()/io.open()."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.paths: list[str] = []
        real, real_os_open = io.open, os.open

        def recording_open(file, *args, **kwargs):
            if isinstance(file, str | os.PathLike):
                self.paths.append(os.path.realpath(os.fspath(file)))
            return real(file, *args, **kwargs)

        def recording_os_open(file, *args, **kwargs):
            self.paths.append(os.path.realpath(os.fspath(file)))
            return real_os_open(file, *args, **kwargs)

        monkeypatch.setattr(builtins, "open", recording_open)
        monkeypatch.setattr(io, "open", recording_open)
        monkeypatch.setattr(os, "open", recording_os_open)


@pytest.mark.parametrize("how", ["dotdot", "absolute", "symlink"])
def test_external_data_outside_the_model_folder_is_never_read(tmp_path: Path, how: str,
                                                              monkeypatch: pytest.MonkeyPatch):
    outside = tmp_path / "outside.bin"
    outside.write_bytes(WEIGHTS.tobytes())  # valid data: only the policy can refuse it
    folder = tmp_path / "model"
    if how == "dotdot":
        path = _external_model(folder, "../outside.bin")
    elif how == "absolute":
        path = _external_model(folder, str(outside))
    else:
        folder.mkdir()
        (folder / "link.bin").symlink_to(outside)
        path = _external_model(folder, "link.bin")
    recorder = _OpenRecorder(monkeypatch)
    with pytest.raises(onnxrun.InvalidGraph, match="outside|absolute"):
        InferenceSession(str(path))
    assert os.path.realpath(outside) not in recorder.paths
    assert os.path.realpath(path) in recorder.paths  # the recorder does see the model's reads


@pytest.mark.parametrize("offset,length", [(0, 32), (12, 8), (100, 16), (-1, 16)])
def test_external_data_range_beyond_the_file(tmp_path: Path, offset: int, length: int):
    path = _external_model(tmp_path, "weights.bin", offset=offset, length=length)
    (tmp_path / "weights.bin").write_bytes(WEIGHTS.tobytes())  # 16 bytes
    with pytest.raises(onnxrun.InvalidGraph, match="exceeds|offset"):
        InferenceSession(str(path))


def test_external_data_length_shorter_than_the_tensor(tmp_path: Path):
    path = _external_model(tmp_path, "weights.bin", length=8)
    (tmp_path / "weights.bin").write_bytes(WEIGHTS.tobytes())
    with pytest.raises(onnxrun.InvalidGraph, match="'W'"):
        InferenceSession(str(path))


def test_external_data_file_missing(tmp_path: Path):
    path = _external_model(tmp_path, "weights.bin")
    with pytest.raises(onnxrun.NoSuchFile, match="weights.bin"):
        InferenceSession(str(path))


@pytest.mark.parametrize("location", ["weights.bin", "data/weights.bin"])
def test_valid_external_data_loads(tmp_path: Path, location: str):
    m = onnx.parser.parse_model("""
        <ir_version: 8, opset_import: ["" : 17]>
        main (float[2, 3] X) => (float[2, 3] Y)
        { T = Mul(X, W)
          Y = Add(T, B) }
    """)
    # Weights as raw_data: onnx externalizes only those.
    m.graph.initializer.extend([
        numpy_helper.from_array(np.arange(1, 7, dtype=np.float32).reshape(2, 3), "W"),
        numpy_helper.from_array(np.array([-1.0, 0.0, 1.0], np.float32), "B"),
    ])
    folder = tmp_path / "sub"
    (folder / os.path.dirname(location)).mkdir(parents=True, exist_ok=True)
    path = folder / "model.onnx"
    onnx.save_model(m, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=location, size_threshold=0)
    assert (folder / location).is_file()
    stored = onnx.load(str(path), load_external_data=False)
    assert all(t.data_location == TensorProto.EXTERNAL for t in stored.graph.initializer)

    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    want = x * np.arange(1, 7, dtype=np.float32).reshape(2, 3) + np.array([-1, 0, 1], np.float32)
    for source in (str(path), path):
        np.testing.assert_allclose(InferenceSession(source).run(None, {"X": x})[0], want)
    # As bytes, locations are read from the working directory (as onnxruntime does), unless the
    # session is told where they are.
    with pytest.raises(onnxrun.NoSuchFile, match="working directory"):
        InferenceSession(path.read_bytes())
    so = onnxrun.SessionOptions()
    so.add_session_config_entry("session.model_external_initializers_file_folder_path",
                                str(folder))
    np.testing.assert_allclose(InferenceSession(path.read_bytes(), so).run(None, {"X": x})[0],
                               want)
