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


def _identity(elem: int, shape: list | None) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", elem, shape)
    y = helper.make_tensor_value_info("y", elem, shape)
    m = helper.make_model(helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g",
                                            [x], [y]),
                          opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


@pytest.mark.parametrize("elem,shape", [(TensorProto.FLOAT, []), (TensorProto.FLOAT, [2]),
                                        (TensorProto.INT64, []), (TensorProto.STRING, []),
                                        (TensorProto.BOOL, [1])])
def test_none_fed_to_an_input_names_the_input(elem, shape):
    # A float scalar used to compute NaN from it, a string scalar to pass None on.
    s = InferenceSession(_identity(elem, shape).SerializeToString())
    with pytest.raises(onnxrun.InvalidArgument, match="input 'x' was fed None"):
        s.run(None, {"x": None})


def test_none_fed_to_an_optional_input_is_an_absent_value():
    ort = pytest.importorskip("onnxruntime")
    x = helper.make_value_info(
        "x", helper.make_optional_type_proto(helper.make_tensor_type_proto(TensorProto.FLOAT, [2])))
    y = helper.make_tensor_value_info("y", TensorProto.BOOL, [])
    m = helper.make_model(
        helper.make_graph([helper.make_node("OptionalHasElement", ["x"], ["y"])], "g", [x], [y]),
        opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 8
    for feed in (None, np.ones(2, np.float32)):
        want = ort.InferenceSession(m.SerializeToString()).run(None, {"x": feed})
        assert InferenceSession(m.SerializeToString()).run(None, {"x": feed}) == want


@pytest.mark.parametrize("elem,value", [(TensorProto.INT64, 2**70), (TensorProto.INT64, [1, 2**63]),
                                        (TensorProto.INT32, 2**40), (TensorProto.UINT64, -1),
                                        (TensorProto.UINT8, 256)])
def test_python_int_out_of_the_inputs_range_names_the_input(elem, value):
    shape = [2] if isinstance(value, list) else []
    s = InferenceSession(_identity(elem, shape).SerializeToString())
    with pytest.raises(onnxrun.InvalidArgument, match=r"input 'x': cannot convert"):
        s.run(None, {"x": value})


@pytest.mark.parametrize("value", [
    np.array(["a", 3, None], dtype=object), ["a", 3, None], ["a", 2.5, True],
    np.array([b"xy", np.float32(1.5), np.int64(7)], dtype=object), np.array(["a", "é", "c"]),
    np.array([b"a", b"bc", b"d"]), np.array([["a"], "b", 1.0], dtype=object),
])
def test_string_input_takes_mixed_objects_as_onnxruntime_does(value):
    ort = pytest.importorskip("onnxruntime")
    m = _identity(TensorProto.STRING, [3]).SerializeToString()
    got = InferenceSession(m).run(None, {"x": value})[0]
    if isinstance(value, np.ndarray) and value.dtype.kind == "S":
        want = np.array([v.decode() for v in value], dtype=object)  # onnxruntime misreads these
    else:
        want = ort.InferenceSession(m).run(None, {"x": value})[0]
    assert got.dtype == object and want.dtype == object
    assert got.tolist() == want.tolist()
    assert all(type(v) is str for v in got.tolist())


def test_bytes_that_are_not_utf8_for_a_string_input_name_the_input():
    s = InferenceSession(_identity(TensorProto.STRING, [2]).SerializeToString())
    with pytest.raises(onnxrun.InvalidArgument, match="input 'x'.*UTF-8"):
        s.run(None, {"x": np.array([b"ok", b"\xff"])})


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
    # onnxruntime's words for an operator no version of its domain defines
    assert "com.example:Frobnicate(-1) is not a registered function/op" in message
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


@pytest.mark.parametrize("data", ["raw", "typed", "empty"])
def test_initializer_with_an_unknown_data_type(data):
    t = TensorProto(name="W", data_type=99, dims=[0 if data == "empty" else 4])
    if data == "raw":
        t.raw_data = bytes(16)
    elif data == "typed":
        t.float_data.extend([1, 2, 3, 4])
    with pytest.raises(onnxrun.InvalidGraph, match=r"tensor 'W' does not have a valid data type"):
        InferenceSession(_model_with_initializer(t).SerializeToString())


def test_graph_input_with_an_unknown_data_type():
    m = _identity(TensorProto.FLOAT, [2])
    m.graph.input[0].type.tensor_type.elem_type = 99
    with pytest.raises(onnxrun.InvalidGraph, match=r"graph input 'x': invalid tensor data type 99"):
        InferenceSession(m.SerializeToString())


def _softmax_model_bytes() -> bytes:
    m = onnx.parser.parse_model("""
        <ir_version: 8, opset_import: ["" : 17, "my.dom" : 1]>
        main (float[2] X) => (float[2] Y) { T = Softmax<axis = 0>(X)  Y = Identity(T) }
    """)
    m.graph.node[0].name = "soft"
    return m.SerializeToString()


@pytest.mark.parametrize("field,old,message", [
    ("operator type", b"Softmax", r"node 'soft': its operator type is not valid UTF-8"),
    ("attribute name", b"axis", r"an attribute name is not valid UTF-8"),
])
def test_strings_that_are_not_utf8_where_a_name_is_looked_up(field, old, message):
    data = _softmax_model_bytes()
    assert data.count(old) == 1
    with pytest.raises(onnxrun.InvalidGraph, match=message):
        InferenceSession(data.replace(old, old[:1] + b"\xff" + old[2:]))


def test_node_domain_that_is_not_utf8():
    m = onnx.parser.parse_model("""
        <ir_version: 8, opset_import: ["" : 17, "my.dom" : 1]>
        main (float[2] X) => (float[2] Y) { Y = my.dom.Op(X) }
    """)
    data = m.SerializeToString().replace(b"my.dom", b"my\xffdom")
    with pytest.raises(onnxrun.InvalidGraph, match="its domain is not valid UTF-8"):
        InferenceSession(data)


def test_node_name_that_is_not_utf8_is_only_a_label():
    # onnxruntime accepts it (a name looks nothing up): so does onnxrun, and runs the model.
    data = _softmax_model_bytes().replace(b"soft", b"so\xfft")
    s = InferenceSession(data)
    np.testing.assert_allclose(s.run(None, {"X": np.zeros(2, np.float32)})[0], [0.5, 0.5])


def _sparse_model(values: list, indices: list, dims: list[int]) -> bytes:
    sparse = helper.make_sparse_tensor(
        numpy_helper.from_array(np.array(values, np.float32), "S"),
        numpy_helper.from_array(np.array(indices, np.int64), "S_indices"), dims)
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, [dims[-1]])
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)
    graph = helper.make_graph([helper.make_node("Add", ["X", "S"], ["Y"])], "g", [x], [y])
    graph.sparse_initializer.append(sparse)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m.SerializeToString()


def test_huge_sparse_initializer_is_refused_before_it_is_densified():
    # One value that claims 4 PiB once dense: refused from its declared size, no MemoryError.
    with pytest.raises(onnxrun.InvalidGraph,
                       match=r"sparse tensor 'S' of shape \[1125899906842624\] would take "
                             r"4503599627370496 bytes once dense"):
        InferenceSession(_sparse_model([1.0], [5], [2**50]))
    s = InferenceSession(_sparse_model([1.0], [2], [4]))  # a sane one still densifies
    np.testing.assert_array_equal(s.run(None, {"X": np.zeros(4, np.float32)})[0], [0, 0, 1, 0])


@pytest.mark.parametrize("values,indices,dims,message", [
    ([1.0, 2.0], [1], [4], r"2 values .* indices of shape \[1\]"),
    ([1.0], [[0, 1]], [4], r"indices of shape \[1, 2\] do not describe a tensor of shape \[4\]"),
    ([1.0], [7], [4], r"index outside \[4\]"),
    ([1.0], [[1, 9]], [2, 4], r"index outside \[2, 4\]"),
])
def test_malformed_sparse_initializer(values, indices, dims, message):
    with pytest.raises(onnxrun.InvalidGraph, match=r"sparse tensor 'S'.*" + message):
        InferenceSession(_sparse_model(values, indices, dims))


@pytest.mark.parametrize("domain,version", [("", 29), ("", 99), ("ai.onnx.ml", 99),
                                            ("com.microsoft", 99)])
def test_opset_newer_than_supported_is_refused_as_onnxruntime_does(domain, version):
    ort = pytest.importorskip("onnxruntime")
    m = _identity(TensorProto.FLOAT, [2])
    if domain:
        m.opset_import.append(helper.make_opsetid(domain, version))
    else:
        m.opset_import[0].version = version
    newest = {"": onnx.defs.onnx_opset_version(), "ai.onnx.ml": 5, "com.microsoft": 1}[domain]
    with pytest.raises(ort.capi.onnxruntime_pybind11_state.Fail,
                       match=f"support for domain {domain or 'ai.onnx'} is till opset {newest}"):
        ort.InferenceSession(m.SerializeToString())
    with pytest.raises(onnxrun.InvalidGraph,
                       match=rf"opset {version} of domain '{domain or 'ai.onnx'}', newer than "
                             rf"onnxrun supports: the newest is opset {newest}"):
        InferenceSession(m.SerializeToString())
    # onnxruntime's switch to allow it anyway
    so = onnxrun.SessionOptions()
    so.add_session_config_entry("session.allow_released_opsets_only", "0")
    s = InferenceSession(m.SerializeToString(), so)
    assert s.run(None, {"x": np.ones(2, np.float32)})[0].tolist() == [1, 1]


def test_custom_domain_at_any_version_is_accepted():
    m = _identity(TensorProto.FLOAT, [2])
    m.opset_import.append(helper.make_opsetid("my.domain", 99))
    assert InferenceSession(m.SerializeToString()).run(None, {"x": np.ones(2, np.float32)})


@pytest.mark.parametrize("version", [onnx.IR_VERSION + 1, 99])
def test_ir_version_newer_than_supported_is_refused_as_onnxruntime_does(version):
    ort = pytest.importorskip("onnxruntime")
    m = _identity(TensorProto.FLOAT, [2])
    m.ir_version = version
    message = (f"Unsupported model IR version: {version}, max supported IR version: "
               f"{onnx.IR_VERSION}")
    with pytest.raises(ort.capi.onnxruntime_pybind11_state.Fail, match=message):
        ort.InferenceSession(m.SerializeToString())
    with pytest.raises(onnxrun.InvalidGraph, match=message):
        InferenceSession(m.SerializeToString())
    m.ir_version = onnx.IR_VERSION
    assert InferenceSession(m.SerializeToString()).run(None, {"x": np.ones(2, np.float32)})


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


def test_feed_checks_of_the_usual_feed():
    """A host array of the declared dtype takes the feed check's short path (one comparison
    per fixed dimension): what it lets through and what still fails, with onnxruntime's
    words."""
    sess = InferenceSession(onnx.parser.parse_model("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[2, N, 3] x) => (float[2, N, 3] y) { y = Relu(x) }"""))
    x = np.arange(-12, 12, dtype=np.float32).reshape(2, 4, 3)
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], np.maximum(x, 0))
    view = np.arange(-24, 24, dtype=np.float32).reshape(2, 8, 3)[:, ::2]  # not contiguous
    np.testing.assert_array_equal(sess.run(None, {"x": view})[0], np.maximum(view, 0))
    with pytest.raises(onnxrun.InvalidArgument, match=r"invalid dimensions for input: x.*"
                       r"index: 2 Got: 4 Expected: 3"):
        sess.run(None, {"x": np.zeros((2, 4, 4), np.float32)})
    with pytest.raises(onnxrun.InvalidArgument, match="Invalid rank for input: x Got: 2"):
        sess.run(None, {"x": np.zeros((2, 3), np.float32)})
    with pytest.raises(onnxrun.InvalidArgument, match="Unexpected input data type"):
        sess.run(None, {"x": np.zeros((2, 4, 3), np.float64)})
