"""The onnxruntime-compatible Python API: sessions, introspection, options, OrtValue, IOBinding,
threads. Where onnxruntime's behaviour is well defined, it is the oracle."""

from __future__ import annotations

import threading
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnx.parser
import pytest
from concurrency import run_on_threads

import onnxrun
from onnxrun import InferenceSession, OrtValue, RunOptions, SessionOptions

ort = pytest.importorskip("onnxruntime")
from onnxruntime.capi import onnxruntime_pybind11_state as ort_errors  # noqa: E402

CPU = ["CPUExecutionProvider"]

MODEL_TEXT = """
<ir_version: 8, opset_import: ["" : 17], producer_name: "onnxrun-tests", producer_version: "1.0",
 domain: "ai.onnxrun.test", model_version: 3, doc_string: "a test model",
 metadata_props: ["author": "tests", "license": "MIT"]>
main (float[N, 3] X, float[3] Y) => (float[N, 3] Z, float[N, 3] W, float[N, 3] V)
<float[3] B = {1.0, -2.0, 3.0}>
{
    T = Add(X, Y)
    Z = Relu(T)
    W = Mul(X, B)
    V = Identity(W)
}
"""


@pytest.fixture(scope="module")
def model() -> onnx.ModelProto:
    m = onnx.parser.parse_model(MODEL_TEXT)
    m.graph.doc_string = "the main graph"
    onnx.checker.check_model(m)
    return m


@pytest.fixture(scope="module")
def sess(model: onnx.ModelProto) -> InferenceSession:
    return InferenceSession(model.SerializeToString())


@pytest.fixture(scope="module")
def ort_sess(model: onnx.ModelProto):
    return ort.InferenceSession(model.SerializeToString(), providers=CPU)


def feeds(n: int = 2, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"X": rng.standard_normal((n, 3)).astype(np.float32),
            "Y": rng.standard_normal(3).astype(np.float32)}


def expected(f: dict[str, np.ndarray]) -> list[np.ndarray]:
    b = np.array([1.0, -2.0, 3.0], np.float32)
    w = f["X"] * b
    return [np.maximum(f["X"] + f["Y"], 0), w, w]


def assert_same(got: list, want: list) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert isinstance(g, np.ndarray)
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)


def node_args(args) -> list[tuple]:
    return [(a.name, a.type, a.shape) for a in args]


# -- creating a session -------------------------------------------------------------------------


def test_session_from_path_bytes_proto_and_pathlike(model, tmp_path: Path):
    path = tmp_path / "model.onnx"
    onnx.save(model, path)
    f = feeds()
    want = expected(f)
    for source in (str(path), path, model.SerializeToString(), bytearray(model.SerializeToString()),
                   model):
        assert_same(InferenceSession(source).run(None, f), want)


def test_session_rejects_other_source_types():
    with pytest.raises(TypeError, match="model path"):
        InferenceSession(12345)


# -- introspection -------------------------------------------------------------------------------


def test_inputs_and_outputs_match_onnxruntime(sess, ort_sess):
    assert node_args(sess.get_inputs()) == node_args(ort_sess.get_inputs())
    assert node_args(sess.get_outputs()) == node_args(ort_sess.get_outputs())
    assert node_args(sess.get_inputs()) == [("X", "tensor(float)", ["N", 3]),
                                            ("Y", "tensor(float)", [3])]


def test_node_arg_types_and_unknown_shapes_match_onnxruntime():
    from onnx import TensorProto as T
    from onnx import helper as h

    ins = [
        h.make_tensor_value_info("sym", T.FLOAT, ["batch", None, 4]),  # symbol, unknown, fixed
        h.make_tensor_value_info("norank", T.FLOAT, None),  # unknown rank
        h.make_tensor_value_info("ids", T.INT64, [2]),
        h.make_tensor_value_info("flag", T.BOOL, []),
        h.make_tensor_value_info("text", T.STRING, [1]),
        h.make_tensor_value_info("half", T.FLOAT16, [1]),
        h.make_tensor_value_info("d", T.DOUBLE, [1]),
    ]
    outs = [h.make_tensor_value_info(f"o_{v.name}", v.type.tensor_type.elem_type, None)
            for v in ins]
    nodes = [h.make_node("Identity", [v.name], [f"o_{v.name}"]) for v in ins]
    m = h.make_model(h.make_graph(nodes, "g", ins, outs), opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    s = InferenceSession(m.SerializeToString())
    o = ort.InferenceSession(m.SerializeToString(), providers=CPU)
    assert node_args(s.get_inputs()) == node_args(o.get_inputs())
    assert node_args(s.get_outputs()) == node_args(o.get_outputs())
    assert s.get_inputs()[0].shape == ["batch", None, 4]
    assert s.get_inputs()[1].shape == []  # onnxruntime's way of saying "unknown rank"
    assert "NodeArg(name='sym'" in repr(s.get_inputs()[0])


def test_modelmeta_matches_onnxruntime(sess, ort_sess):
    fields = ("producer_name", "graph_name", "domain", "description", "graph_description",
              "version", "custom_metadata_map")
    ours, theirs = sess.get_modelmeta(), ort_sess.get_modelmeta()
    for f in fields:
        assert getattr(ours, f) == getattr(theirs, f), f
    assert ours.custom_metadata_map == {"author": "tests", "license": "MIT"}
    assert (ours.producer_name, ours.version) == ("onnxrun-tests", 3)
    assert ours.graph_description == "the main graph"


def test_providers(sess, ort_sess, model):
    assert sess.get_providers() == ["CPUExecutionProvider"] == ort_sess.get_providers()
    assert sess.get_provider_options() == ort_sess.get_provider_options()
    assert onnxrun.get_available_providers()[-1] == "CPUExecutionProvider"
    assert onnxrun.get_device() == ort.get_device() == "CPU"
    data = model.SerializeToString()
    # A provider this build lacks: a warning and the CPU fallback, as in onnxruntime.
    for mod in (onnxrun, ort):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            s = mod.InferenceSession(data, providers=["CUDAExecutionProvider", *CPU])
        assert s.get_providers() == CPU
        assert any("CUDAExecutionProvider" in str(w.message) for w in caught)
    with pytest.raises(ValueError, match="Unknown Provider"):
        InferenceSession(data, providers=["NoSuchExecutionProvider"])
    s = InferenceSession(data, providers=[("CPUExecutionProvider", {"arena_extend_strategy": 1})])
    assert s.get_provider_options() == {"CPUExecutionProvider": {"arena_extend_strategy": "1"}}


# -- options ------------------------------------------------------------------------------------

OPTION_FIELDS = (
    "graph_optimization_level", "intra_op_num_threads", "inter_op_num_threads", "execution_mode",
    "execution_order", "enable_profiling", "log_severity_level", "log_verbosity_level", "logid",
    "enable_cpu_mem_arena", "enable_mem_pattern", "enable_mem_reuse",
    "use_deterministic_compute", "optimized_model_filepath", "profile_file_prefix",
)


def _plain(v):
    return int(v) if hasattr(v, "name") and hasattr(v, "__int__") else v


def test_session_options_defaults_match_onnxruntime():
    ours, theirs = SessionOptions(), ort.SessionOptions()
    for f in OPTION_FIELDS:
        assert _plain(getattr(ours, f)) == _plain(getattr(theirs, f)), f


def test_session_options_fields_and_config(model):
    so = SessionOptions()
    so.graph_optimization_level = onnxrun.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = 2
    so.execution_mode = onnxrun.ExecutionMode.ORT_SEQUENTIAL
    so.log_severity_level = 3
    so.add_session_config_entry("session.disable_prepacking", "1")
    assert so.get_session_config_entry("session.disable_prepacking") == "1"
    with pytest.raises(RuntimeError, match="does not have configuration with key"):
        so.get_session_config_entry("no.such.key")
    so.graph_optimization_level = 1  # plain ints are accepted, as onnxruntime's enums are
    assert so.graph_optimization_level is onnxrun.GraphOptimizationLevel.ORT_ENABLE_BASIC
    with pytest.raises(ValueError):
        so.intra_op_num_threads = -1
    s = InferenceSession(model.SerializeToString(), so)
    got = s.get_session_options()
    assert got.intra_op_num_threads == 2 and got.log_severity_level == 3
    assert got.get_session_config_entry("session.disable_prepacking") == "1"
    assert_same(s.run(None, feeds()), expected(feeds()))


def test_free_dimension_override_matches_onnxruntime(model):
    data = model.SerializeToString()
    sessions = []
    for mod in (onnxrun, ort):
        so = mod.SessionOptions()
        so.add_free_dimension_override_by_name("N", 2)
        sessions.append(mod.InferenceSession(data, so, providers=CPU))
    ours, theirs = sessions
    assert node_args(ours.get_inputs()) == node_args(theirs.get_inputs())
    assert node_args(ours.get_outputs()) == node_args(theirs.get_outputs())
    assert ours.get_inputs()[0].shape == [2, 3]
    assert_same(ours.run(None, feeds(2)), theirs.run(None, feeds(2)))
    with pytest.raises(onnxrun.InvalidArgument, match="index: 0 Got: 3 Expected: 2"):
        ours.run(None, feeds(3))
    with pytest.raises(ort_errors.InvalidArgument):
        theirs.run(None, feeds(3))


def test_add_initializer_matches_onnxruntime(model):
    data = model.SerializeToString()
    new_b = np.array([10.0, 20.0, 30.0], np.float32)
    results = []
    for mod in (onnxrun, ort):
        so = mod.SessionOptions()
        value = mod.OrtValue.ortvalue_from_numpy(new_b)  # onnxruntime needs it kept alive
        so.add_initializer("B", value)
        results.append(mod.InferenceSession(data, so, providers=CPU).run(["W"], feeds()))
    assert_same(results[0], results[1])
    np.testing.assert_allclose(results[0][0], feeds()["X"] * new_b)
    so = SessionOptions()
    so.add_initializer("NotThere", np.zeros(3, np.float32))
    with pytest.raises(onnxrun.InvalidArgument, match="NotThere"):
        InferenceSession(data, so)


def test_overridable_initializers_match_onnxruntime():
    # An initializer also listed as a graph input has a default the caller may override.
    m = onnx.parser.parse_model("""
        <ir_version: 8, opset_import: ["" : 17]>
        main (float[2] X, float[2] B) => (float[2] Y) <float[2] B = {1.0, 2.0}> { Y = Add(X, B) }
    """)
    data = m.SerializeToString()
    x = np.array([1.0, 1.0], np.float32)
    ours, theirs = InferenceSession(data), ort.InferenceSession(data, providers=CPU)
    assert node_args(ours.get_inputs()) == node_args(theirs.get_inputs()) == [
        ("X", "tensor(float)", [2])]
    assert node_args(ours.get_overridable_initializers()) == node_args(
        theirs.get_overridable_initializers())
    assert_same(ours.run(None, {"X": x}), theirs.run(None, {"X": x}))
    b = np.array([5.0, 7.0], np.float32)
    assert_same(ours.run(None, {"X": x, "B": b}), theirs.run(None, {"X": x, "B": b}))
    assert_same(ours.run(None, {"X": x}), [np.array([2.0, 3.0], np.float32)])  # default is back


def test_run_options(sess, ort_sess):
    ours, theirs = RunOptions(), ort.RunOptions()
    for f in ("log_severity_level", "log_verbosity_level", "logid", "terminate",
              "only_execute_path_to_fetches"):
        assert getattr(ours, f) == getattr(theirs, f), f
    ours.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
    assert ours.get_run_config_entry("memory.enable_memory_arena_shrinkage") == "cpu:0"
    with pytest.raises(RuntimeError, match="does not have configuration with key"):
        ours.get_run_config_entry("missing")
    ours.logid = "run-1"
    assert_same(sess.run(None, feeds(), ours), expected(feeds()))


def test_terminate_set_before_run_raises(sess, ort_sess):
    for s, options, fail in ((sess, RunOptions, onnxrun.Fail),
                             (ort_sess, ort.RunOptions, ort_errors.Fail)):
        ro = options()
        ro.terminate = True
        with pytest.raises(fail, match="terminate flag"):
            s.run(None, feeds(), ro)
        ro.terminate = False
        s.run(None, feeds(), ro)  # the session is still usable


# -- running ------------------------------------------------------------------------------------


def test_run_all_outputs_matches_onnxruntime(sess, ort_sess):
    f = feeds(4, seed=3)
    assert_same(sess.run(None, f), ort_sess.run(None, f))
    assert_same(sess.run([], f), expected(f))  # an empty list also means every output


def test_output_subsets_in_requested_order(sess, ort_sess):
    f = feeds()
    for names in (["V"], ["Z", "W"], ["V", "Z"], ["W", "W"]):
        assert_same(sess.run(names, f), ort_sess.run(names, f))
    with pytest.raises(onnxrun.InvalidArgument, match=r"'nope'.*\['Z', 'W', 'V'\]"):
        sess.run(["nope"], f)
    with pytest.raises(ort_errors.InvalidArgument):
        ort_sess.run(["nope"], f)


FAILING_BRANCH = """
<ir_version: 8, opset_import: ["" : 17]>
main (float[N] X, float[A] P, float[B] Q) => (float[N] Good, float[A] Bad)
{
    Good = Relu(X)
    Bad = Add(P, Q)
}
"""


def test_only_the_nodes_needed_for_the_outputs_run():
    # Add(P[2], Q[3]) cannot broadcast: it fails whenever it runs.
    s = InferenceSession(onnx.parser.parse_model(FAILING_BRANCH).SerializeToString())
    f = {"X": np.array([-1.0, 2.0], np.float32), "P": np.zeros(2, np.float32),
         "Q": np.zeros(3, np.float32)}
    (good,) = s.run(["Good"], f)
    np.testing.assert_array_equal(good, [0.0, 2.0])
    with pytest.raises(onnxrun.RuntimeException):
        s.run(None, f)


def test_kernel_failure_names_node_operator_and_input_shapes():
    m = onnx.parser.parse_model(FAILING_BRANCH)
    m.graph.node[1].name = "the_bad_add"
    s = InferenceSession(m.SerializeToString())
    f = {"X": np.zeros(2, np.float32), "P": np.zeros(2, np.float32), "Q": np.zeros(3, np.float32)}
    with pytest.raises(onnxrun.RuntimeException) as info:
        s.run(["Bad"], f)
    message = str(info.value)
    for part in ("the_bad_add", "Add", "float[2]", "float[3]"):
        assert part in message
    # The same session still runs what is well defined.
    assert s.run(["Good"], f)[0].shape == (2,)


def test_inputs_are_not_modified_and_outputs_are_the_callers(sess):
    f = feeds()
    before = {k: v.copy() for k, v in f.items()}
    out = sess.run(None, f)
    for k in f:
        np.testing.assert_array_equal(f[k], before[k])
    for o in out:
        o[...] = 123.0  # outputs are writable and owned by the caller
    assert_same(sess.run(None, f), expected(f))


def test_constant_output_is_a_fresh_writable_copy():
    m = onnx.parser.parse_model("""
        <ir_version: 8, opset_import: ["" : 17]>
        main (float[1] X) => (float[2] C, float[1] Y) <float[2] K = {4.0, 5.0}>
        { C = Identity(K)
          Y = Identity(X) }
    """)
    s = InferenceSession(m.SerializeToString())
    c, _ = s.run(None, {"X": np.zeros(1, np.float32)})
    c[:] = -1.0
    c2, _ = s.run(None, {"X": np.zeros(1, np.float32)})
    np.testing.assert_array_equal(c2, [4.0, 5.0])


@pytest.mark.parametrize("feed_kind", ["owning", "view", "frombuffer"])
def test_outputs_never_share_memory_with_the_feeds(feed_kind):
    """An output that is a feed, or a view of one (Identity, Reshape, Slice), is handed back
    as a copy, whatever owns the fed memory; a fresh output is handed back as it is."""
    m = onnx.parser.parse_model("""
        <ir_version: 8, opset_import: ["" : 17]>
        main (float[6] X) => (float[6] A, float[2, 3] B, float[6] C, float[6] D)
        <int64[2] shape = {2, 3}, int64[1] one = {1}, int64[1] big = {9}>
        { A = Identity(X)
          B = Reshape(X, shape)
          S = Slice(X, one, big)
          C = Concat <axis = 0> (S, one_f)
          D = Add(X, X)
          one_f = Constant <value_floats = [7.0]> () }
    """)
    s = InferenceSession(m.SerializeToString())
    data = np.arange(12, dtype=np.float32)
    X = {"owning": lambda: data[:6].copy(), "view": lambda: data[3:9],
         "frombuffer": lambda: np.frombuffer(bytearray(data[:6].tobytes()), np.float32)
         }[feed_kind]()
    outs = s.run(None, {"X": X})
    for o in outs:
        assert not np.may_share_memory(o, X)
    np.testing.assert_array_equal(outs[0], X)
    np.testing.assert_array_equal(outs[3], X + X)


def test_lists_and_scalars_are_accepted_as_inputs(sess):
    out = sess.run(["Z"], {"X": [[1.0, -5.0, 2.0]], "Y": [0.0, 0.0, 0.0]})
    np.testing.assert_array_equal(out[0], [[1.0, 0.0, 2.0]])
    assert out[0].dtype == np.float32


def test_four_threads_share_one_session(sess):
    inputs = [feeds(n=1 + i % 5, seed=i) for i in range(40)]
    serial = [sess.run(None, f) for f in inputs]
    results: dict[int, list] = {}

    def worker(k: int) -> None:
        for i in range(k, len(inputs), 4):
            results[i] = sess.run(None, inputs[i])

    run_on_threads(worker, 4)
    for i, want in enumerate(serial):
        assert_same(results[i], want)


# -- OrtValue -----------------------------------------------------------------------------------


def test_ortvalue_matches_onnxruntime():
    arr = np.arange(6, dtype=np.float32).reshape(2, 3)
    for mod in (onnxrun, ort):
        v = mod.OrtValue.ortvalue_from_numpy(arr)
        assert v.shape() == [2, 3]
        assert v.data_type() == "tensor(float)"
        assert v.element_type() == onnx.TensorProto.FLOAT
        assert v.device_name() == "cpu"
        assert v.is_tensor() and v.has_value()
        np.testing.assert_array_equal(v.numpy(), arr)
        e = mod.OrtValue.ortvalue_from_shape_and_type([4, 2], np.int64)
        assert (e.shape(), e.data_type(), e.element_type()) == ([4, 2], "tensor(int64)", 7)
    for dtype, name in ((np.float16, "float16"), (np.bool_, "bool"), (np.int8, "int8"),
                        (np.float64, "double"), (np.uint64, "uint64")):
        ours = OrtValue.ortvalue_from_numpy(np.zeros(2, dtype))
        theirs = ort.OrtValue.ortvalue_from_numpy(np.zeros(2, dtype))
        assert ours.data_type() == theirs.data_type() == f"tensor({name})"
        assert ours.element_type() == theirs.element_type()


def test_ortvalue_shares_the_numpy_arrays_memory():
    arr = np.zeros((2, 2), np.float32)
    v = OrtValue.ortvalue_from_numpy(arr)
    arr[0, 0] = 5.0  # CPU OrtValues wrap the array, as onnxruntime's do
    assert v.numpy()[0, 0] == 5.0
    v.update_inplace(np.ones((2, 2), np.float32))
    assert arr.sum() == 4.0
    with pytest.raises(ValueError):
        v.update_inplace(np.ones(3, np.float32))
    with pytest.raises(ValueError, match="device"):
        OrtValue.ortvalue_from_numpy(arr, "cuda", 0)


def test_run_with_ort_values(sess, ort_sess):
    f = feeds()
    ours = sess.run_with_ort_values(["Z", "V"], {k: OrtValue.ortvalue_from_numpy(v)
                                                for k, v in f.items()})
    theirs = ort_sess.run_with_ort_values(["Z", "V"], {k: ort.OrtValue.ortvalue_from_numpy(v)
                                                      for k, v in f.items()})
    assert all(isinstance(v, OrtValue) for v in ours)
    assert_same([v.numpy() for v in ours], [v.numpy() for v in theirs])
    # OrtValues are accepted by run() too.
    assert_same(sess.run(["Z"], {"X": OrtValue.ortvalue_from_numpy(f["X"]), "Y": f["Y"]}),
                [expected(f)[0]])


# -- IOBinding -----------------------------------------------------------------------------------


def _bind_all_ways(mod, s, f):
    """The same binding calls on onnxrun or onnxruntime; returns what comes back."""
    x, y = np.ascontiguousarray(f["X"]), f["Y"]
    io = s.io_binding()
    io.bind_input("X", "cpu", 0, np.float32, list(x.shape), x.ctypes.data)  # raw pointer
    io.bind_cpu_input("Y", y)
    z = np.full(x.shape, -7.0, np.float32)  # preallocated output, by pointer
    io.bind_output("Z", "cpu", 0, np.float32, list(z.shape), z.ctypes.data)
    io.bind_output("W")  # allocated by the session
    w_value = mod.OrtValue.ortvalue_from_shape_and_type(list(x.shape), np.float32)
    io.bind_ortvalue_output("V", w_value)  # preallocated OrtValue
    s.run_with_iobinding(io)
    outs = io.get_outputs()
    copied = io.copy_outputs_to_cpu()
    same_buffer = outs[0].data_ptr() == z.ctypes.data
    return z, [o.numpy() for o in outs], copied, w_value.numpy(), same_buffer


def test_iobinding_matches_onnxruntime(sess, ort_sess):
    f = feeds(3, seed=5)
    ours = _bind_all_ways(onnxrun, sess, f)
    theirs = _bind_all_ways(ort, ort_sess, f)
    z, outs, copied, v, same_buffer = ours
    np.testing.assert_array_equal(z, theirs[0])
    assert_same(outs, theirs[1])
    assert_same(copied, theirs[2])
    np.testing.assert_array_equal(v, theirs[3])
    assert same_buffer and theirs[4]  # the bound buffer itself holds the output
    assert_same(outs, expected(f))
    assert all(isinstance(c, np.ndarray) for c in copied)


def test_iobinding_ortvalue_input_and_rebinding(sess):
    f = feeds()
    io = sess.io_binding()
    io.bind_ortvalue_input("X", OrtValue.ortvalue_from_numpy(f["X"]))
    io.bind_ortvalue_input("Y", OrtValue.ortvalue_from_numpy(f["Y"]))
    io.bind_output("Z")
    sess.run_with_iobinding(io)
    np.testing.assert_allclose(io.copy_outputs_to_cpu()[0], expected(f)[0])
    # Rebind a new input: the next run sees it.
    f2 = feeds(seed=9)
    io.bind_cpu_input("X", f2["X"])
    io.bind_cpu_input("Y", f2["Y"])
    sess.run_with_iobinding(io)
    np.testing.assert_allclose(io.get_outputs()[0].numpy(), expected(f2)[0])
    io.clear_binding_outputs()
    sess.run_with_iobinding(io)  # nothing bound: every output
    assert len(io.get_outputs()) == 3
    io.clear_binding_inputs()
    with pytest.raises(onnxrun.InvalidArgument, match="missing"):
        sess.run_with_iobinding(io)


@pytest.mark.parametrize("shape,dtype,ours,theirs", [
    ([5, 3], np.float32, "Got invalid dimensions for output: Z for the following indices: "
     "index: 0 Got: 5 Expected: 2", "ensure the pre-allocated shapes match"),
    ([2, 3, 1], np.float32, "Invalid rank for output: Z Got: 3 Expected: 2",
     "Invalid rank for output: Z Got: 3 Expected: 2"),
    ([2, 3], np.float64, "Unexpected output data type for 'Z'. Actual: (tensor(double)) , "
     "expected: (tensor(float))",
     "Unexpected output data type. Actual: (tensor(double)) , expected: (tensor(float))"),
])
@pytest.mark.parametrize("how", ["ortvalue", "pointer"])
def test_iobinding_refuses_a_preallocated_buffer_of_the_wrong_shape_or_type(
        sess, ort_sess, shape, dtype, ours, theirs, how):
    f = feeds(2)
    errors = []
    for s in (sess, ort_sess):
        io = s.io_binding()
        io.bind_cpu_input("X", f["X"])
        io.bind_cpu_input("Y", f["Y"])
        buffer = np.zeros(shape, dtype)
        if how == "ortvalue":
            io.bind_ortvalue_output("Z", (OrtValue if s is sess else ort.OrtValue)
                                    .ortvalue_from_numpy(buffer))
        else:
            io.bind_output("Z", "cpu", 0, dtype, shape, buffer.ctypes.data)
        with pytest.raises(RuntimeError) as info:  # what onnxruntime raises
            s.run_with_iobinding(io)
        errors.append(info.value)
    assert theirs in str(errors[1])
    # onnxrun: the same wording, naming the output, as an InvalidArgument (a ValueError too)
    assert isinstance(errors[0], onnxrun.InvalidArgument) and isinstance(errors[0], ValueError)
    assert ours in str(errors[0])


# -- what runs, and stopping a run from another thread ------------------------------------------

CALLS: list[str] = []
PAUSE = {"started": threading.Event(), "resume": threading.Event()}


@onnxrun.register_custom_op("Record", "test.onnxrun.api")
def _record(X, *, tag=""):
    CALLS.append(tag)
    return X


@onnxrun.register_custom_op("Pause", "test.onnxrun.api")
def _pause(X):
    PAUSE["started"].set()
    assert PAUSE["resume"].wait(30)
    return X


def test_only_needed_nodes_run_counted():
    m = onnx.parser.parse_model("""
        <ir_version: 8, opset_import: ["" : 17, "test.onnxrun.api" : 1]>
        main (float[2] X) => (float[2] A, float[2] B)
        { T = test.onnxrun.api.Record <tag = "shared"> (X)
          A = test.onnxrun.api.Record <tag = "a"> (T)
          B = test.onnxrun.api.Record <tag = "b"> (T) }
    """)
    s = InferenceSession(m.SerializeToString())
    x = np.ones(2, np.float32)
    CALLS.clear()
    s.run(["B"], {"X": x})
    assert CALLS == ["shared", "b"]
    CALLS.clear()
    s.run(None, {"X": x})
    assert sorted(CALLS) == ["a", "b", "shared"]


def test_terminate_set_from_another_thread_stops_the_run():
    m = onnx.parser.parse_model("""
        <ir_version: 8, opset_import: ["" : 17, "test.onnxrun.api" : 1]>
        main (float[2] X) => (float[2] Y)
        { P = test.onnxrun.api.Pause(X)
          Y = test.onnxrun.api.Record <tag = "after"> (P) }
    """)
    s = InferenceSession(m.SerializeToString())
    ro = RunOptions()
    PAUSE["started"].clear()
    PAUSE["resume"].clear()
    CALLS.clear()
    caught: list[BaseException] = []

    def run() -> None:
        try:
            s.run(None, {"X": np.ones(2, np.float32)}, ro)
        except BaseException as e:  # checked below
            caught.append(e)

    worker = threading.Thread(target=run)
    worker.start()
    assert PAUSE["started"].wait(30)  # the run is inside its first node
    ro.terminate = True
    PAUSE["resume"].set()
    worker.join(30)
    assert len(caught) == 1 and isinstance(caught[0], onnxrun.Fail)
    assert "terminate" in str(caught[0])
    assert CALLS == []  # the node after the flag never ran


def test_threads_on_a_convolutional_model_match_serial_and_onnxruntime():
    from onnx import numpy_helper

    rng = np.random.default_rng(0)
    m = onnx.parser.parse_model("""
        <ir_version: 8, opset_import: ["" : 17]>
        main (float[N, 3, 16, 16] X) => (float[N, 10] P)
        { C = Conv <pads = [1, 1, 1, 1]> (X, W, Bc)
          R = Relu(C)
          F = Flatten(R)
          L = MatMul(F, M)
          P = Softmax <axis = 1> (L) }
    """)
    m.graph.initializer.extend([
        numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "W"),
        numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "Bc"),
        numpy_helper.from_array((rng.standard_normal((2048, 10)) * 0.05).astype(np.float32), "M"),
    ])
    data = m.SerializeToString()
    try:
        s = InferenceSession(data)
    except onnxrun.NotImplemented as e:
        pytest.skip(f"kernels not there yet: {e}")
    o = ort.InferenceSession(data, providers=CPU)
    inputs = [{"X": rng.standard_normal((1 + i % 3, 3, 16, 16)).astype(np.float32)}
              for i in range(16)]
    serial = [s.run(None, f)[0] for f in inputs]
    for f, got in zip(inputs, serial, strict=True):
        np.testing.assert_allclose(got, o.run(None, f)[0], rtol=1e-4, atol=1e-6)
    results: dict[int, np.ndarray] = {}

    def worker(k: int) -> None:
        for i in range(k, len(inputs), 4):
            results[i] = s.run(None, inputs[i])[0]

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, want in enumerate(serial):
        np.testing.assert_array_equal(results[i], want)
