"""The CUDA provider end to end on the stand-in device: availability and fallback, options,
partitioning and copies, OrtValue / IOBinding / DLPack on the device, CUDA-graph bookkeeping,
threads, subgraphs, and real models against the CPU provider."""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import subprocess
import sys
import threading

import numpy as np
import onnx
import pytest
from cuda_helpers import CUDA, compare

import onnxrun
from onnxrun.errors import Fail
from onnxrun.providers.cuda import device

rng = np.random.default_rng(1)


def _model(body: str, opset: int = 17) -> bytes:
    return onnx.parser.parse_model(
        f'<ir_version: 8, opset_import: ["" : {opset}]>\n{body}').SerializeToString()


MLP = _model("g (float[N,4] x, float[4,3] w) => (float[N,3] y) "
             "{ a = MatMul(x, w) b = Relu(a) y = Softmax(b) }")


def _x(n=2):
    return rng.standard_normal((n, 4)).astype(np.float32)


def _w():
    return rng.standard_normal((4, 3)).astype(np.float32)


@pytest.fixture
def stand_in():
    with device.stand_in():
        yield


def _count_host_copies(monkeypatch) -> list[int]:
    """Counts every device -> host conversion of the stand-in device."""
    calls = [0]
    real = device.StandInDevice.to_host

    def counted(self, x):
        calls[0] += 1
        return real(self, x)

    monkeypatch.setattr(device.StandInDevice, "to_host", counted)
    return calls


# -- availability, options, fallback --------------------------------------------------------------

def test_listed_only_where_a_device_is():
    if device.cupy_gpu_count() == 0:
        assert "CUDAExecutionProvider" not in onnxrun.get_available_providers()
        assert onnxrun.get_device() == "CPU"
    with device.stand_in():
        assert onnxrun.get_available_providers()[0] == "CUDAExecutionProvider"
        assert onnxrun.get_device() == "GPU"


@pytest.mark.skipif(importlib.util.find_spec("cupy") is not None, reason="CuPy is installed")
def test_without_cupy_nothing_is_imported_to_find_out():
    """Without CuPy a session's provider check costs no import attempt (array_api_compat's
    took ~10 ms of every process's first session)."""
    code = ("import sys; from onnxrun.providers.cuda import device; "
            "print(device.cupy_gpu_count(), 'array_api_compat' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.split() == ["0", "False"]


@pytest.mark.skipif(device.cupy_gpu_count() > 0, reason="a GPU is present")
def test_unavailable_cuda_falls_back_with_onnxruntimes_warning():
    with pytest.warns(UserWarning, match="Specified provider 'CUDAExecutionProvider' is not in "
                                         "available provider names"):
        sess = onnxrun.InferenceSession(MLP, providers=CUDA)
    assert sess.get_providers() == ["CPUExecutionProvider"]


def test_provider_options_defaults_and_checks(stand_in):
    sess = onnxrun.InferenceSession(MLP, providers=CUDA)
    opts = sess.get_provider_options()["CUDAExecutionProvider"]
    assert opts["device_id"] == "0" and opts["enable_cuda_graph"] == "0"
    assert opts["cudnn_conv_algo_search"] == "EXHAUSTIVE" and opts["use_tf32"] == "1"
    assert opts["arena_extend_strategy"] == "kNextPowerOfTwo"
    assert opts["gpu_mem_limit"] == str(2 ** 64 - 1) and opts["do_copy_in_default_stream"] == "1"
    with pytest.raises(ValueError, match="Unknown provider option: 'no_such_option'"):
        onnxrun.InferenceSession(MLP, providers=[("CUDAExecutionProvider",
                                                  {"no_such_option": 1})])
    with pytest.raises(ValueError, match="cudnn_conv_algo_search must be one of"):
        onnxrun.InferenceSession(MLP, providers=[("CUDAExecutionProvider",
                                                  {"cudnn_conv_algo_search": "FAST"})])


def test_failing_device_falls_back_unless_disabled(stand_in, monkeypatch):
    def broken(device_id=0, mem_limit=0):
        raise RuntimeError(f"device_id {device_id} is out of range: 1 GPU(s) found")

    monkeypatch.setattr(device, "create", broken)
    with pytest.warns(RuntimeWarning, match="Falling back to \\['CPUExecutionProvider'\\]"):
        sess = onnxrun.InferenceSession(MLP, providers=CUDA)
    assert sess.get_providers() == ["CPUExecutionProvider"]
    sess.disable_fallback()
    with pytest.raises(RuntimeError, match="out of range"):
        sess.set_providers(CUDA)


def test_set_providers_builds_the_session_again(stand_in):
    sess = onnxrun.InferenceSession(MLP, providers=["CPUExecutionProvider"])
    x, w = _x(), _w()
    want = sess.run(None, {"x": x, "w": w})[0]
    sess.set_providers(CUDA)
    assert sess.get_providers() == CUDA
    assert sess.get_optimization_report().placement.nodes["CUDAExecutionProvider"] == 3
    np.testing.assert_allclose(sess.run(None, {"x": x, "w": w})[0], want, rtol=1e-6)


# -- partitioning and copies -----------------------------------------------------------------------

SHAPES = _model("""g (float[N,C] x, float[C] b) => (float[M,K] y, int64[2] s) {
    s = Shape(x)
    half = Constant<value=int64[2] {2, 1}>()
    dbl = Constant<value=int64[2] {1, 2}>()
    h = Div(s, half)
    d = Mul(h, dbl)
    y0 = Add(x, b)
    r = Reshape(y0, d)
    top, idx = TopK<axis=-1>(r, k)
    k = Constant<value=int64[1] {1}>()
    y = Mul(top, top)
}""")


def test_shape_subgraph_on_cpu_and_copies_inserted_once(stand_in):
    x = rng.standard_normal((4, 6)).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)
    sess, (y, s) = compare(SHAPES, {"x": x, "b": b}, on_cpu=5)
    placed = sess.get_optimization_report().placement
    # Shape reads the device value's metadata; Slice / Div stay on the CPU; TopK has no CUDA
    # kernel: one copy down before it, one copy up after it, one upload per graph input.
    assert sorted(placed.copies) == [("MemcpyFromHost", "b"), ("MemcpyFromHost", "top"),
                                     ("MemcpyFromHost", "x"), ("MemcpyToHost", "r")]
    assert "copies inserted: MemcpyFromHost x3, MemcpyToHost x1" in \
        sess.get_optimization_report().format()
    assert s.tolist() == [4, 6]


def test_profile_shows_provider_and_copy_per_node(stand_in, tmp_path):
    opts = onnxrun.SessionOptions()
    opts.enable_profiling = True
    opts.profile_file_prefix = str(tmp_path / "p")
    sess = onnxrun.InferenceSession(SHAPES, opts, providers=CUDA)
    sess.run(None, {"x": np.ones((4, 6), np.float32), "b": np.ones(6, np.float32)})
    events = json.load(open(sess.end_profiling()))
    nodes = {e["args"]["op_name"]: e["args"]["provider"] for e in events if e["cat"] == "Node"}
    assert nodes["MemcpyToHost"] == nodes["Add"] == "CUDAExecutionProvider"
    assert nodes["TopK"] == "CPUExecutionProvider"
    copy = next(e for e in events if e["cat"] == "Node" and e["args"]["op_name"] == "MemcpyToHost")
    assert copy["dur"] >= 0 and copy["args"]["output_type_shape"] == [{"float": [2, 12]}]
    assert copy["args"]["input_type_shape"] == [{"float": [2, 12]}]  # the device array


def test_subgraph_reads_device_values_through_a_copy(stand_in):
    m = _model("""g (float[3] x, bool c) => (float[3] y) {
        a = Exp(x)
        y = If(c) <then_branch = t () => (float[3] o) { o = Neg(a) },
                   else_branch = e () => (float[3] o) { o = Abs(a) }>
    }""", opset=17)
    for c in (True, False):
        compare(m, {"x": np.array([1, -2, 3], np.float32), "c": np.array(c)}, on_cpu=3)


# -- device memory: OrtValue, IOBinding, DLPack ----------------------------------------------------

def test_ortvalue_on_the_device(stand_in):
    x = _x(3)
    v = onnxrun.OrtValue.ortvalue_from_numpy(x, "cuda", 0)
    assert v.device_name() == "cuda" and v.shape() == [3, 4] and v.data_type() == "tensor(float)"
    assert v.element_type() == onnx.TensorProto.FLOAT and v.tensor_size_in_bytes() == 48
    assert isinstance(v.data_ptr(), int) and v.data_ptr() != x.ctypes.data
    np.testing.assert_array_equal(v.numpy(), x)
    e = onnxrun.OrtValue.ortvalue_from_shape_and_type([2, 5], np.int64, "cuda", 0)
    assert e.device_name() == "cuda" and e.shape() == [2, 5]
    e.update_inplace(np.arange(10).reshape(2, 5))
    np.testing.assert_array_equal(e.numpy(), np.arange(10).reshape(2, 5))
    with pytest.raises(ValueError, match="not available"):
        onnxrun.OrtValue.ortvalue_from_numpy(x, "npu", 0)


def test_ortvalue_cuda_refused_without_a_device():
    if device.cupy_gpu_count() > 0:
        pytest.skip("a GPU is present")
    with pytest.raises(ValueError, match="CUDA needs CuPy"):
        onnxrun.OrtValue.ortvalue_from_numpy(np.zeros(2), "cuda", 0)


def test_run_with_device_feeds_makes_no_host_round_trip(stand_in, monkeypatch):
    sess = onnxrun.InferenceSession(MLP, providers=CUDA)
    x, w = _x(), _w()
    want = onnxrun.InferenceSession(MLP).run(None, {"x": x, "w": w})[0]
    xv = onnxrun.OrtValue.ortvalue_from_numpy(x, "cuda", 0)
    wv = onnxrun.OrtValue.ortvalue_from_numpy(w, "cuda", 0)
    calls = _count_host_copies(monkeypatch)
    (out,) = sess.run_with_ort_values(["y"], {"x": xv, "w": wv})
    assert out.device_name() == "cuda" and calls[0] == 0
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-6)
    # a bare device array (what __dlpack__ producers hand over) is taken as it is
    y = sess.run(None, {"x": device.shared(0).to_device(x), "w": w})[0]
    np.testing.assert_allclose(y, want, rtol=1e-6)


def test_device_feed_of_the_wrong_type_is_refused(stand_in):
    sess = onnxrun.InferenceSession(MLP, providers=CUDA)
    bad = device.shared(0).to_device(np.zeros((2, 4), np.float64))
    with pytest.raises(ValueError, match="Unexpected input data type for 'x'"):
        sess.run(None, {"x": bad, "w": _w()})
    with pytest.raises(ValueError, match="invalid dimensions for input: w"):
        sess.run(None, {"x": _x(), "w": device.shared(0).to_device(np.zeros((4, 4), np.float32))})


def test_iobinding_on_the_device(stand_in, monkeypatch):
    sess = onnxrun.InferenceSession(MLP, providers=CUDA)
    x, w = _x(), _w()
    want = onnxrun.InferenceSession(MLP).run(None, {"x": x, "w": w})[0]
    binding = sess.io_binding()
    binding.bind_ortvalue_input("x", onnxrun.OrtValue.ortvalue_from_numpy(x, "cuda", 0))
    wv = onnxrun.OrtValue.ortvalue_from_numpy(w, "cuda", 0)
    binding.bind_input("w", "cuda", 0, np.float32, [4, 3], wv.data_ptr())
    binding.bind_output("y", "cuda")
    calls = _count_host_copies(monkeypatch)
    sess.run_with_iobinding(binding)
    binding.synchronize_outputs()
    (out,) = binding.get_outputs()
    assert out.device_name() == "cuda" and calls[0] == 0
    np.testing.assert_allclose(binding.copy_outputs_to_cpu()[0], want, rtol=1e-6)
    # into a device buffer of the caller's, by pointer
    target = onnxrun.OrtValue.ortvalue_from_shape_and_type([2, 3], np.float32, "cuda", 0)
    binding.bind_output("y", "cuda", 0, np.float32, [2, 3], target.data_ptr())
    sess.run_with_iobinding(binding)
    np.testing.assert_allclose(target.numpy(), want, rtol=1e-6)
    # and to the host
    binding.bind_output("y")
    sess.run_with_iobinding(binding)
    assert binding.get_outputs()[0].device_name() == "cpu"
    wrong = onnxrun.OrtValue.ortvalue_from_shape_and_type([3, 3], np.float32, "cuda", 0)
    binding.bind_ortvalue_output("y", wrong)
    with pytest.raises(ValueError, match="invalid dimensions for output: y"):
        sess.run_with_iobinding(binding)


def test_dlpack_both_ways(stand_in):
    x = _x()
    dev_array = device.shared(0).to_device(x)
    v = onnxrun.OrtValue.from_dlpack(dev_array)
    assert v.device_name() == "cuda" and v.data_ptr() == device.shared(0).data_ptr(dev_array)
    back = device.shared(0).from_dlpack(v)  # through OrtValue.__dlpack__
    assert device.shared(0).data_ptr(back) == v.data_ptr()
    assert v.__dlpack_device__() == dev_array.__dlpack_device__()
    host = onnxrun.OrtValue.from_dlpack(x)
    assert host.device_name() == "cpu" and host.data_ptr() == x.ctypes.data


# -- CUDA graphs -----------------------------------------------------------------------------------

def test_cuda_graph_captured_per_shape_and_replayed(stand_in):
    sess = onnxrun.InferenceSession(MLP, providers=[("CUDAExecutionProvider",
                                                     {"enable_cuda_graph": "1"})])
    backend = sess._device.backend
    ref = onnxrun.InferenceSession(MLP)
    for n, (captures, replays) in [(2, (1, 0)), (2, (1, 1)), (5, (2, 1)), (2, (2, 2)),
                                   (5, (2, 3))]:
        x, w = _x(n), _w()
        got = sess.run(None, {"x": x, "w": w})[0]
        np.testing.assert_allclose(got, ref.run(None, {"x": x, "w": w})[0], rtol=1e-6)
        assert (backend.captures, backend.replays) == (captures, replays)
    assert len(sess._graphs) == 2


def test_cuda_graph_needs_every_node_on_the_device(stand_in):
    with pytest.raises(Fail, match="cannot use the CUDA Graph feature"):
        onnxrun.InferenceSession(SHAPES, providers=[("CUDAExecutionProvider",
                                                     {"enable_cuda_graph": "1"})])


# -- threads ---------------------------------------------------------------------------------------

def test_concurrent_runs_on_one_session(stand_in):
    sess = onnxrun.InferenceSession(MLP, providers=CUDA)
    ref = onnxrun.InferenceSession(MLP)
    errors = []

    def work(seed):
        r = np.random.default_rng(seed)
        for _ in range(20):
            x = r.standard_normal((3, 4)).astype(np.float32)
            w = r.standard_normal((4, 3)).astype(np.float32)
            got = sess.run(None, {"x": x, "w": w})[0]
            if not np.allclose(got, ref.run(None, {"x": x, "w": w})[0], rtol=1e-6):
                errors.append(seed)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


# -- models ----------------------------------------------------------------------------------------

LIGHT = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
# the lighter half of the zoo (the CI lane runs these; the GPU lane runs all nine)
LANE = ["squeezenet", "shufflenet", "inception_v1", "resnet50"]
MODELS = sorted(glob.glob(os.path.join(LIGHT, "light_*.onnx")))


def _zoo_inputs(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    initializers = {t.name for t in model.graph.initializer}
    feeds = {}
    for vi in model.graph.input:
        if vi.name not in initializers:
            shape = [d.dim_value or 1 for d in vi.type.tensor_type.shape.dim]
            n = int(np.prod(shape))
            feeds[vi.name] = (np.arange(n).reshape(shape) / n).astype(np.float32)
    return feeds


@pytest.mark.skipif(not MODELS, reason="this onnx package ships no light zoo models")
@pytest.mark.parametrize("name", [os.path.basename(p)[6:-5] for p in MODELS])
def test_light_zoo_against_the_cpu_provider(on_device, name):
    if on_device == "stand-in" and name not in LANE:
        pytest.skip("the heavier zoo models run in the GPU lane")
    model = onnx.load(os.path.join(LIGHT, f"light_{name}.onnx"))
    compare(model, _zoo_inputs(model), rtol=1e-3, atol=1e-4)


MODELS_DIR = os.path.join(os.path.dirname(__file__), "..", "models")


@pytest.mark.parametrize("name", ["bert_tiny", "gpt_tiny"])
def test_transformers_against_the_cpu_provider(on_device, name):
    path = os.path.join(MODELS_DIR, f"{name}.onnx")
    cases = np.load(os.path.join(MODELS_DIR, f"{name}.inputs.npz"))  # keys "<case>/<input>"
    feeds = {k.split("/", 1)[1]: cases[k] for k in cases.files if k.startswith("0/")}
    sess, first = compare(open(path, "rb").read(), feeds, rtol=1e-3, atol=1e-4, on_cpu=100)
    for _ in range(3):  # the shape-specialized plans of later runs agree too
        for got, want in zip(sess.run(None, feeds), first, strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    placed = sess.get_optimization_report().placement
    assert placed.nodes["CUDAExecutionProvider"] > placed.nodes.get("CPUExecutionProvider", 0)


def test_shape_specialization_keeps_host_values_and_uploads_them(stand_in):
    # a value computed from x's shape alone (on the CPU) is read on the device: the
    # specialized plan skips the shape steps and keeps their host result; its upload, a device
    # step, runs each time (device values are not compared between runs)
    m = _model("""g (float[N] x) => (float[N] y) {
        s = Shape(x)
        zero = Constant<value=int64 {0}>()
        one = Constant<value=int64 {1}>()
        n = Squeeze(s)
        r = Range(zero, n, one)
        f = Cast<to=1>(r)
        y = Add(x, f)
    }""", opset=17)
    sess = onnxrun.InferenceSession(m, providers=CUDA)
    for n in (3, 3, 3, 5, 5, 5, 3):
        x = np.ones(n, np.float32)
        np.testing.assert_array_equal(sess.run(None, {"x": x})[0], 1 + np.arange(n))
    specialized = [e for e in sess._program.specializer._cache.values() if e is not None]
    assert len(specialized) == 2
    for plan, _ in specialized:
        assert [s.node.op_type for s in plan.steps] == ["MemcpyFromHost", "MemcpyFromHost", "Add"]


def test_float16_rewrite_off_only_where_the_device_computes_float16(stand_in, monkeypatch):
    def passes(elem: str) -> set[str]:
        m = _model(f"g ({elem}[4] x) => ({elem}[4] y) {{ y = Relu(x) }}")
        return set(onnxrun.InferenceSession(m, providers=CUDA).get_optimization_report().passes)

    rewrite = "Float16ComputeInFloat32"
    assert rewrite in passes("float16")  # the stand-in holds no float16: computed in float32
    real = device.StandInDevice.supports
    monkeypatch.setattr(device.StandInDevice, "supports",
                        lambda self, dt: np.dtype(dt) == np.float16 or real(self, dt))
    assert rewrite not in passes("float16")  # a GPU's own float16 kernels run it
    assert rewrite in passes("bfloat16")  # no bfloat16 on CuPy: float32 on the device


def test_shape_math_with_constant_nodes_stays_on_cpu_without_optimization(stand_in):
    m = _model("""g (float[N,C] x) => (float[M,K] y) {
        s = Shape(x)
        half = Constant<value=int64[2] {2, 1}>()
        dbl = Constant<value=int64[2] {1, 2}>()
        h = Div(s, half)
        d = Mul(h, dbl)
        y = Reshape(x, d)
    }""")
    opts = onnxrun.SessionOptions()
    opts.graph_optimization_level = onnxrun.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess, _ = compare(m, {"x": np.ones((4, 6), np.float32)}, options=opts, on_cpu=5)
    assert sess.get_optimization_report().placement.copies == [("MemcpyFromHost", "x")]


def test_values_only_the_host_reads_are_computed_on_the_cpu(stand_in):
    """GroupQueryAttention's seqlens_k from the attention mask: a chain of nodes whose results
    only a host input reads, starting from host values, runs on the CPU (no copy up and back);
    the same chain from a device value (w, also a graph output) stays on the device (one small
    copy down)."""
    m = _model("""g (float[1] x, int64[B,T] mask, float[3] v)
                  => (float[M] y, float[K] z, float[3] w) {
        n = ReduceSum<keepdims=0>(mask)
        one = Constant<value=int64[1] {1}>()
        m = Sub(n, one)
        shape = Reshape(m, one)
        y = Expand(x, shape)
        w = Relu(v)
        k = ReduceSum<keepdims=0>(w)
        kc = Cast<to=7>(k)
        ks = Reshape(kc, one)
        z = Expand(x, ks)
    }""")
    feeds = {"x": np.ones(1, np.float32), "mask": np.ones((2, 3), np.int64),
             "v": np.array([1.0, 2.0, 0.5], np.float32)}
    sess, (y, z, _) = compare(m, feeds, on_cpu=2)  # ReduceSum and Sub of the mask
    assert y.shape == (5,) and z.shape == (3,)
    placed = sess.get_optimization_report().placement
    assert sorted(placed.copies) == [("MemcpyFromHost", "v"), ("MemcpyFromHost", "x"),
                                     ("MemcpyToHost", "ks")]
