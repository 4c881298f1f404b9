"""onnxruntime API behaviours beyond running: provider arguments, the array and DLPack protocols
of OrtValue, np.void string feeds, the provider assignment report, external initializers from
memory, session options stored in the model, optimized models saved with external data.
onnxruntime is the oracle where it runs the same calls."""

from __future__ import annotations

import json
import os
import warnings

import numpy as np
import onnx
import onnx.parser
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxrun
from onnxrun import InferenceSession, OrtValue, SessionOptions
from onnxrun.api.session import check_and_normalize_provider_args

ort = pytest.importorskip("onnxruntime")

MUL = onnx.parser.parse_model("""
<ir_version: 8, opset_import: ["" : 17]>
main (float[3, 2] X) => (float[3, 2] Y)
<float[3, 2] W = {1.0, 2.0, 3.0, 4.0, 5.0, 6.0}>
{
    T = Mul(X, W)
    Y = Add(T, W)
}
""")
X = np.arange(6, dtype=np.float32).reshape(3, 2)


# -- providers ----------------------------------------------------------------------------------

def test_provider_arguments_are_normalized_as_onnxruntime_does():
    from onnxruntime.capi.onnxruntime_inference_collection import (
        check_and_normalize_provider_args as theirs,
    )

    valid = ["a", "b", "c"]
    cases = [(None, None), (["a"], None), (["a", "b"], None), ([("a", {1: 2}), "b"], None),
             (["a", "b"], [{1: 2}, {}])]
    for providers, options in cases:
        assert check_and_normalize_provider_args(providers, options, valid) == \
            tuple(theirs(providers, options, valid))
    with pytest.warns(UserWarning, match="Duplicate provider 'a'"):
        got = check_and_normalize_provider_args(["a", "b", "a"], [{"x": 1}, {}, {"y": 2}], valid)
    assert got == (["a", "b"], [{"x": "1"}, {}])
    with pytest.warns(UserWarning, match="'d' is not in available provider names"):
        check_and_normalize_provider_args(["d"], None, valid)
    for providers, options in ((3, None), ([3], None), (["a"], 3), (["a"], ["not dict"]),
                               (["a", "b"], [{1: 2}]), ([("a", {1: 2})], [{3: 4}]),
                               ("a", None)):
        with pytest.raises(ValueError):
            check_and_normalize_provider_args(providers, options, valid)


def test_unknown_provider_is_a_runtime_error():
    s = InferenceSession(MUL.SerializeToString())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(RuntimeError, match="Unknown Provider Type: InvalidProvider"):
            s.set_providers(["InvalidProvider"])
        with pytest.raises(ValueError, match="Unknown Provider Type"):  # a bad argument too
            InferenceSession(MUL.SerializeToString(), providers=["InvalidProvider"])
    s.set_providers(["CPUExecutionProvider"])
    assert s.get_providers() == ["CPUExecutionProvider"]


# -- OrtValue protocols -------------------------------------------------------------------------

def test_numpy_array_protocol_shares_memory():
    a = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
    v = OrtValue.ortvalue_from_numpy(a)
    same = np.asarray(v)
    assert same.ctypes.data == v.data_ptr() and same.dtype == np.float32
    assert np.asarray(v, dtype=np.float32).ctypes.data == v.data_ptr()
    wide = np.asarray(v, dtype=np.float64)
    assert wide.dtype == np.float64 and wide.ctypes.data != v.data_ptr()
    np.testing.assert_array_equal(np.array(v), a)
    for arr in (np.array([1, 2, 3], np.int64), np.array([True, False])):
        got = np.asarray(OrtValue.ortvalue_from_numpy(arr))
        assert got.dtype == arr.dtype and (got == arr).all()
    with pytest.raises(ValueError, match="without a copy"):
        v.__array__(np.float64, copy=False)
    with pytest.raises(RuntimeError, match="needs a tensor"):
        np.asarray(OrtValue([np.zeros(2)]))


def test_dlpack_round_trips_share_memory():
    a = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], np.float32)
    v = OrtValue.ortvalue_from_numpy(a)
    assert v.__dlpack_device__() == (1, 0)
    for source in (v.to_dlpack(), v.__dlpack__(), v, a):
        w = OrtValue.from_dlpack(source)
        assert w.data_ptr() == v.data_ptr()
        np.testing.assert_array_equal(w.numpy(), a)
    # numpy consumes an OrtValue too
    assert np.from_dlpack(v).ctypes.data == v.data_ptr()
    b = OrtValue.from_dlpack(OrtValue.ortvalue_from_numpy(np.array([True, False])))
    assert b.numpy().dtype == np.bool_
    u = OrtValue.from_dlpack(OrtValue.ortvalue_from_numpy(np.array([1, 2, 255], np.uint8)))
    assert u.numpy().dtype == np.uint8
    assert OrtValue.from_dlpack(np.array([1, 0], np.uint8), True).numpy().dtype == np.bool_
    for shape in ((1, 8, 0, 128), (0,), (0, 4), (4, 0)):
        z = np.zeros(shape, np.float32)
        assert OrtValue.from_dlpack(z.__dlpack__()).shape() == list(shape)
    with pytest.raises(TypeError, match="DLPack capsule or an object with __dlpack__"):
        OrtValue.from_dlpack([1, 2])


def test_run_takes_dlpack_tensors():
    class Foreign:  # a tensor of another library: only the DLPack protocol
        def __init__(self, arr):
            self._arr = arr

        def __dlpack__(self, **kwargs):
            return self._arr.__dlpack__(**kwargs)

        def __dlpack_device__(self):
            return self._arr.__dlpack_device__()

    s = InferenceSession(MUL.SerializeToString())
    want = ort.InferenceSession(MUL.SerializeToString()).run(None, {"X": X})
    np.testing.assert_array_equal(s.run(None, {"X": Foreign(X)})[0], want[0])
    np.testing.assert_array_equal(s.run(None, {"X": OrtValue.ortvalue_from_numpy(X)})[0],
                                  want[0])


def test_void_items_feed_a_string_input():
    m = onnx.parser.parse_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    main (string[2, 2] S) => (string[2, 2] T) { T = Identity(S) }
    """)
    x = np.array([b"must", b"have", b"same", b"size"], dtype=np.void).reshape((2, 2))
    got = InferenceSession(m.SerializeToString()).run(None, {"S": x})[0]
    want = ort.InferenceSession(m.SerializeToString()).run(None, {"S": x})[0]
    assert got.dtype == object and got.tolist() == want.tolist() == [["must", "have"],
                                                                     ["same", "size"]]
    bad = np.array([b"\xff\xfe", b"ok"], dtype=np.void).reshape(2, 1)
    m1 = onnx.parser.parse_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    main (string[2, 1] S) => (string[2, 1] T) { T = Identity(S) }
    """)
    with pytest.raises(onnxrun.InvalidArgument, match="'S': item 0 .* not UTF-8"):
        InferenceSession(m1.SerializeToString()).run(None, {"S": bad})


# -- provider assignment report -----------------------------------------------------------------

def test_provider_graph_assignment_info():
    so = SessionOptions()
    so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    so.graph_optimization_level = onnxrun.GraphOptimizationLevel.ORT_DISABLE_ALL
    s = InferenceSession(MUL.SerializeToString(), so)
    subgraphs = s.get_provider_graph_assignment_info()
    assert [g.ep_name for g in subgraphs] == ["CPUExecutionProvider"] * 2
    assert [(n.domain, n.op_type) for g in subgraphs for n in g.get_nodes()] == [
        ("", "Mul"), ("", "Add")]
    with pytest.raises(onnxrun.Fail, match="'session.record_ep_graph_assignment_info' must be"):
        InferenceSession(MUL.SerializeToString()).get_provider_graph_assignment_info()


# -- external initializers ----------------------------------------------------------------------

def _external(tensor: TensorProto, **entries: object) -> None:
    tensor.ClearField("raw_data")
    tensor.data_location = TensorProto.EXTERNAL
    del tensor.external_data[:]
    for k, v in entries.items():
        tensor.external_data.add(key=k, value=str(v))


def _pad_model_with_missing_file() -> onnx.ModelProto:
    pads = numpy_helper.from_array(np.array([0, 0, 1, 1], np.int64), "pads")
    _external(pads, location="pads.bin")
    graph = helper.make_graph(
        [helper.make_node("Pad", ["X", "pads"], ["Y"], mode="constant")], "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 2])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)], [pads])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_external_initializers_given_in_memory(tmp_path):
    path = str(tmp_path / "pad.onnx")
    onnx.save(_pad_model_with_missing_file(), path)  # pads.bin does not exist
    x = np.array([[1.0, 2.0]], np.float32)
    want = np.array([[1.0, 2.0, 0.0], [0.0, 0.0, 0.0]], np.float32)
    with pytest.raises(onnxrun.NoSuchFile, match="pads.bin"):
        InferenceSession(path)
    so = SessionOptions()
    so.add_external_initializers(["pads"], [OrtValue.ortvalue_from_numpy(
        np.array([0, 0, 1, 1], np.int64))])
    np.testing.assert_array_equal(InferenceSession(path, so).run(None, {"X": x})[0], want)
    data = np.array([7, 7, 0, 0, 1, 1], np.int64).tobytes()  # pads at offset 16
    model = _pad_model_with_missing_file()
    _external(model.graph.initializer[0], location="pads.bin", offset=16, length=32)
    onnx.save(model, path)
    so = SessionOptions()
    so.add_external_initializers_from_files_in_memory(["pads.bin"], [data], [len(data)])
    np.testing.assert_array_equal(InferenceSession(path, so).run(None, {"X": x})[0], want)
    short = SessionOptions()
    short.add_external_initializers_from_files_in_memory(["pads.bin"], [data], [40])
    with pytest.raises(onnxrun.InvalidGraph, match="exceeds the 40 bytes"):
        InferenceSession(path, short)
    wrong = SessionOptions()
    wrong.add_external_initializers(["pads"], [np.zeros(3, np.int64)])
    with pytest.raises(onnxrun.InvalidGraph, match="'pads' declares shape"):
        InferenceSession(path, wrong)
    with pytest.raises(ValueError, match="buffer holds 48 bytes"):
        SessionOptions().add_external_initializers_from_files_in_memory(["f"], [data], [64])


# -- session options stored in the model --------------------------------------------------------

def _with_config(config: str) -> bytes:
    m = onnx.ModelProto()
    m.CopyFrom(MUL)
    helper.set_model_props(m, {"ort_config": config, "other": "x"})
    return m.SerializeToString()


def test_session_options_from_the_model(monkeypatch, tmp_path):
    config = json.dumps({"session_options": {
        "inter_op_num_threads": 5, "intra_op_num_threads": 2, "graph_optimization_level": 1,
        "enable_profiling": 1, "execution_mode": 1, "not_an_option": 3}})
    so = SessionOptions()
    so.profile_file_prefix = str(tmp_path / "prof")
    s = InferenceSession(_with_config(config), so)  # ORT_LOAD_CONFIG_FROM_MODEL unset
    assert s.get_session_options().intra_op_num_threads == 0
    monkeypatch.setenv("ORT_LOAD_CONFIG_FROM_MODEL", "1")
    s = InferenceSession(_with_config(config), so)
    got = s.get_session_options()
    assert (got.inter_op_num_threads, got.intra_op_num_threads) == (5, 2)
    assert got.graph_optimization_level == onnxrun.GraphOptimizationLevel.ORT_ENABLE_BASIC
    assert got.execution_mode == onnxrun.ExecutionMode.ORT_PARALLEL and got.enable_profiling
    assert so.intra_op_num_threads == 0 and not so.enable_profiling  # the caller's are kept
    W = np.arange(1, 7, dtype=np.float32).reshape(3, 2)
    np.testing.assert_array_equal(s.run(None, {"X": X})[0], X * W + W)
    profile = s.end_profiling()
    assert os.path.dirname(profile) == str(tmp_path) and json.load(open(profile))
    for bad, message in (("{not json", "cannot be parsed"),
                         ('{"session_options": {"intra_op_num_threads": "2"}}',
                          "must be an integer"),
                         ('{"session_options": {"execution_mode": 4}}', "Unsupported value")):
        with pytest.raises(onnxrun.InvalidArgument, match=message):
            InferenceSession(_with_config(bad))
        if message == "cannot be parsed":
            with pytest.raises(Exception, match="cannot be parsed"):
                ort.InferenceSession(_with_config(bad))


# -- optimized model with external initializers -------------------------------------------------

def test_optimized_model_keeps_large_initializers_in_an_external_file(tmp_path, monkeypatch):
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((16, 16)).astype(np.float32), "W")
    b = numpy_helper.from_array(np.ones(4, np.float32), "B")  # 16 bytes: stays inside
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["X", "W"], ["T"]),
         helper.make_node("Add", ["T", "B16"], ["Y"]),
         helper.make_node("Tile", ["B", "four"], ["B16"])], "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 16])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, 16])],
        [w, b, numpy_helper.from_array(np.array([4], np.int64), "four")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    so = SessionOptions()
    so.graph_optimization_level = onnxrun.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.optimized_model_filepath = str(tmp_path / "opt.onnx")
    so.add_session_config_entry("session.optimized_model_external_initializers_file_name",
                                "opt.bin")
    so.add_session_config_entry(
        "session.optimized_model_external_initializers_min_size_in_bytes", "100")
    InferenceSession(model.SerializeToString(), so)
    assert os.path.getsize(tmp_path / "opt.bin") == 16 * 16 * 4
    saved = onnx.load(str(tmp_path / "opt.onnx"), load_external_data=False)
    where = {t.name: t.data_location for t in saved.graph.initializer}
    assert where["W"] == TensorProto.EXTERNAL and where["B"] == TensorProto.DEFAULT
    x = rng.standard_normal((2, 16)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"X": x})[0]
    for engine in (onnxrun, ort):  # both read the saved pair
        got = engine.InferenceSession(str(tmp_path / "opt.onnx")).run(None, {"X": x})[0]
        np.testing.assert_allclose(got, want, rtol=1e-5)
    so.add_session_config_entry("session.optimized_model_external_initializers_file_name",
                                "../escape.bin")
    with pytest.raises(onnxrun.InvalidArgument, match="relative to the optimized model"):
        InferenceSession(model.SerializeToString(), so)


# -- IOBinding ----------------------------------------------------------------------------------

def test_binding_a_raw_buffer_as_a_string_tensor_is_refused():
    scratch = np.zeros(4, np.uint8)
    for engine in (onnxrun, ort):
        binding = engine.InferenceSession(MUL.SerializeToString()).io_binding()
        for element_type in (int(TensorProto.STRING), np.dtype("U1"), np.dtype("S1"),
                             np.dtype(object)):
            with pytest.raises(RuntimeError, match="Only binding non-string Tensors"):
                binding.bind_input("X", "cpu", 0, element_type, [1], scratch.ctypes.data)
    binding = InferenceSession(MUL.SerializeToString()).io_binding()
    with pytest.raises(RuntimeError, match="Only binding non-string Tensors"):
        binding.bind_output("Y", "cpu", 0, np.dtype(object), [3, 2], scratch.ctypes.data)


def test_outputs_are_views_of_their_owner_as_in_onnxruntime():
    data = MUL.SerializeToString()
    got = InferenceSession(data).run(None, {"X": X})[0]
    want = ort.InferenceSession(data).run(None, {"X": X})[0]
    assert got.base is not None and want.base is not None
    assert not got.flags.owndata and got.flags.writeable
    np.testing.assert_array_equal(got, want)


def test_ortvalue_device_may_be_an_ort_device():
    class Device:  # what is read of an OrtDevice (capi's or onnxruntime's wrapper)
        def __init__(self, device_type: int) -> None:
            self._type = device_type

        def device_type(self) -> int:
            return self._type

    np.testing.assert_array_equal(OrtValue.ortvalue_from_numpy(X, Device(0)).numpy(), X)
    with pytest.raises(RuntimeError, match="not available"):
        OrtValue.ortvalue_from_numpy(X, Device(1))


def test_bad_devices_and_severities_raise_runtime_errors_as_in_onnxruntime():
    x = np.ones(2, np.float32)
    for engine in (onnxrun, ort):
        with pytest.raises(RuntimeError):
            engine.OrtValue.ortvalue_from_numpy(x, "cuda", 0)
        with pytest.raises(RuntimeError):
            engine.set_default_logger_severity(7)
    with pytest.raises(ValueError):  # a bad argument, for callers that catch that
        OrtValue.ortvalue_from_numpy(x, "cuda", 0)
    onnxrun.set_default_logger_severity(2)
    ort.set_default_logger_severity(2)
# -- memory infos -------------------------------------------------------------------------------

def test_input_and_output_memory_infos_like_onnxruntime():
    data = MUL.SerializeToString()
    for arena in (True, False):
        ours_so, theirs_so = SessionOptions(), ort.SessionOptions()
        ours_so.enable_cpu_mem_arena = theirs_so.enable_cpu_mem_arena = arena
        ours, theirs = InferenceSession(data, ours_so), ort.InferenceSession(data, theirs_so)
        for mine, want in ((ours.get_input_memory_infos(), theirs.get_input_memory_infos()),
                           (ours.get_output_memory_infos(), theirs.get_output_memory_infos())):
            assert len(mine) == len(want) == 1
            for field in ("name", "device_id"):
                assert getattr(mine[0], field) == getattr(want[0], field)
            for field in ("allocator_type", "mem_type"):
                assert int(getattr(mine[0], field)) == int(getattr(want[0], field))
        assert len(ours.get_input_epdevices()) == len(theirs.get_input_epdevices())


def test_iobinding_output_of_an_identity_is_not_the_bound_input():
    # IOBinding's outputs, like run()'s, are buffers of their own (onnxruntime copies too)
    m = onnx.parser.parse_model('<ir_version: 8, opset_import: ["" : 17]>\n'
                                 'g (float[3] x) => (float[3] y) { y = Identity(x) }')
    sess = onnxrun.InferenceSession(m.SerializeToString())
    x = np.arange(3, dtype=np.float32)
    binding = sess.io_binding()
    binding.bind_cpu_input("x", x)
    binding.bind_output("y")
    sess.run_with_iobinding(binding)
    y = binding.get_outputs()[0].numpy()
    assert not np.may_share_memory(x, y)
    np.testing.assert_array_equal(y, x)
