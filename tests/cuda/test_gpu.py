"""The GPU lane's own checks (marked gpu: skipped without a CUDA GPU through CuPy): what the
stand-in cannot show — float16, real CUDA graphs replayed with new inputs, CuPy and PyTorch
tensors fed through DLPack, threads on real streams."""

from __future__ import annotations

import threading

import numpy as np
import onnx
import pytest

import onnxrun

pytestmark = pytest.mark.gpu
CUDA = ["CUDAExecutionProvider", "CPUExecutionProvider"]
rng = np.random.default_rng(2)


def _model(body: str, opset: int = 17) -> bytes:
    return onnx.parser.parse_model(
        f'<ir_version: 8, opset_import: ["" : {opset}]>\n{body}').SerializeToString()


MLP16 = _model("g (float16[N,64] x, float16[64,32] w, float16[32] s, float16[32] b) => "
               "(float16[N,32] y) { a = MatMul(x, w) n = LayerNormalization(a, s, b) "
               "g = Gelu(n) y = Softmax(g) }", opset=20)


def test_float16_runs_on_the_gpu():
    feeds = {"x": rng.standard_normal((8, 64)).astype(np.float16),
             "w": (0.1 * rng.standard_normal((64, 32))).astype(np.float16),
             "s": np.ones(32, np.float16), "b": np.zeros(32, np.float16)}
    sess = onnxrun.InferenceSession(MLP16, providers=CUDA)
    assert sess.get_optimization_report().placement.nodes.get("CPUExecutionProvider", 0) == 0
    got = sess.run(None, feeds)[0]
    want = onnxrun.InferenceSession(MLP16, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), atol=2e-3)


MLP = _model("g (float[N,64] x, float[64,64] w) => (float[N,64] y) "
             "{ a = MatMul(x, w) b = Relu(a) c = MatMul(b, w) y = Softmax(c) }")


def test_cuda_graph_replays_with_new_inputs():
    w = (0.1 * rng.standard_normal((64, 64))).astype(np.float32)
    graphs = onnxrun.InferenceSession(MLP, providers=[("CUDAExecutionProvider",
                                                       {"enable_cuda_graph": "1"})])
    plain = onnxrun.InferenceSession(MLP, providers=["CPUExecutionProvider"])
    for n in (4, 4, 16, 4, 16, 4):
        x = rng.standard_normal((n, 64)).astype(np.float32)
        np.testing.assert_allclose(graphs.run(None, {"x": x, "w": w})[0],
                                   plain.run(None, {"x": x, "w": w})[0], rtol=1e-4, atol=1e-6)
    assert len(graphs._graphs) == 2


def test_cupy_and_torch_tensors_fed_without_a_host_copy():
    import cupy

    x = rng.standard_normal((4, 64)).astype(np.float32)
    w = (0.1 * rng.standard_normal((64, 64))).astype(np.float32)
    want = onnxrun.InferenceSession(MLP, providers=["CPUExecutionProvider"]).run(
        None, {"x": x, "w": w})[0]
    sess = onnxrun.InferenceSession(MLP, providers=CUDA)
    binding = sess.io_binding()
    binding.bind_ortvalue_input("x", onnxrun.OrtValue.from_dlpack(cupy.asarray(x)))
    binding.bind_ortvalue_input("w", onnxrun.OrtValue.ortvalue_from_numpy(w, "cuda", 0))
    binding.bind_output("y", "cuda")
    sess.run_with_iobinding(binding)
    out = binding.get_outputs()[0]
    assert out.device_name() == "cuda"
    np.testing.assert_allclose(cupy.asnumpy(cupy.from_dlpack(out)), want, rtol=1e-4, atol=1e-6)
    torch = pytest.importorskip("torch")
    tx = torch.from_numpy(x).cuda()
    y = sess.run(None, {"x": tx, "w": torch.from_numpy(w).cuda()})[0]
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-6)


def test_threads_on_their_own_streams():
    w = (0.1 * rng.standard_normal((64, 64))).astype(np.float32)
    sess = onnxrun.InferenceSession(MLP, providers=CUDA)
    ref = onnxrun.InferenceSession(MLP, providers=["CPUExecutionProvider"])
    errors = []

    def work(seed):
        r = np.random.default_rng(seed)
        for _ in range(50):
            x = r.standard_normal((32, 64)).astype(np.float32)
            if not np.allclose(sess.run(None, {"x": x, "w": w})[0],
                               ref.run(None, {"x": x, "w": w})[0], rtol=1e-4, atol=1e-6):
                errors.append(seed)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


CONV = _model("g (float[N,8,14,14] x, float[16,8,3,3] w, float[16] b) => (float[N,16,7,7] y) "
              "{ y = Conv<strides=[2,2], pads=[1,1,1,1]>(x, w, b) }")


def test_convolution_through_cudnn_frontend_where_it_imports():
    """nvidia-cudnn-frontend's convolution (chosen per Conv where the package imports) against
    the CPU provider, and the implicit GEMM it falls back to, inside cudnn.disabled()."""
    from onnxrun.providers.cuda.cupy import cudnn

    if not cudnn.available():
        pytest.skip("nvidia-cudnn-frontend does not import here")
    feeds = {"x": rng.standard_normal((2, 8, 14, 14)).astype(np.float32),
             "w": (0.1 * rng.standard_normal((16, 8, 3, 3))).astype(np.float32),
             "b": rng.standard_normal(16).astype(np.float32)}
    want = onnxrun.InferenceSession(CONV, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    sess = onnxrun.InferenceSession(CONV, providers=CUDA)
    np.testing.assert_allclose(sess.run(None, feeds)[0], want, rtol=1e-3, atol=1e-3)
    kernels = [s.kernel for s in sess._program.steps if getattr(s.kernel, "cudnn", None)]
    convs = [c for k in kernels for c in k.cudnn_convs.values()]
    assert kernels and sum(c.built for c in convs) == 1
    assert all(g is not False for c in convs for g in c.graphs.values())  # it ran too
    with cudnn.disabled():
        gemm = onnxrun.InferenceSession(CONV, providers=CUDA)
    np.testing.assert_allclose(gemm.run(None, feeds)[0], want, rtol=1e-4, atol=1e-5)


_GEMM_LAYOUTS = [  # (A's base, B's base, the views taken of them)
    ((4, 5), (5, 3), lambda a, b: (a, b)),
    ((2, 3, 4, 5), (5, 6), lambda a, b: (a, b)),
    ((4, 5), (3, 5, 6), lambda a, b: (a, b)),
    ((4, 5), (3, 5), lambda a, b: (a, b.T)),
    ((5, 4), (5, 3), lambda a, b: (a.T, b)),
    ((6, 9, 10), (5, 3), lambda a, b: (a[:, 1:5, 2:7], b)),
    ((2, 7, 3, 4), (2, 3, 4, 7), lambda a, b: (a.transpose(0, 2, 1, 3), b)),  # copied first
    ((3, 4, 10), (3, 5, 2), lambda a, b: (a[:, :, ::2], b)),  # copied first
    ((1, 1), (1, 1), lambda a, b: (a, b)),
    ((2, 1, 4, 5), (3, 5, 2), lambda a, b: (a, b)),  # broadcast: copied first
    ((5,), (5, 3), lambda a, b: (a, b)),
    ((4, 5), (5,), lambda a, b: (a, b)),
    ((5,), (5,), lambda a, b: (a, b)),
    ((0, 5), (5, 3), lambda a, b: (a, b)),
    ((4, 0), (0, 3), lambda a, b: (a, b)),
    ((64, 130), (130, 70), lambda a, b: (a, b)),
]


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_own_cublas_gemm_matches_numpy_for_every_layout(dtype):
    """cupy/blas.py against numpy on views passed as they are (tests/cuda/test_blas_plan.py's
    layouts) and on the ones it copies first; 1-D and empty operands as numpy treats them."""
    import cupy

    from onnxrun.providers.cuda.cupy import blas

    r = np.random.default_rng(3)
    tol = 2e-2 if dtype == np.float16 else 1e-5
    for sa, sb, view in _GEMM_LAYOUTS:
        a, b = r.standard_normal(sa).astype(dtype), r.standard_normal(sb).astype(dtype)
        got = blas.matmul(*view(cupy.asarray(a), cupy.asarray(b)))
        a, b = view(a, b)
        want = np.matmul(a.astype(np.float64), b.astype(np.float64))
        assert got.shape == want.shape and got.dtype == dtype, (sa, sb)
        np.testing.assert_allclose(cupy.asnumpy(got).astype(np.float64), want, rtol=tol,
                                   atol=tol * max(1, a.shape[-1]))


def test_own_cublas_gemm_is_captured_in_a_cuda_graph():
    """The reason cupy/blas.py exists: CuPy's matmul raises inside a stream capture."""
    import cupy

    from onnxrun.providers.cuda.cupy import blas, graphs

    a = cupy.asarray(rng.standard_normal((3, 16, 32)).astype(np.float32))
    b = cupy.asarray(rng.standard_normal((32, 8)).astype(np.float32))
    with cupy.cuda.Stream():  # capture needs a stream other than the legacy default one
        out, replay = graphs.capture(cupy, lambda: blas.matmul(a, b))
        cupy.cuda.get_current_stream().synchronize()
        np.testing.assert_allclose(cupy.asnumpy(out), cupy.asnumpy(a) @ cupy.asnumpy(b),
                                   rtol=1e-5, atol=1e-5)
        a[...] = 2 * a
        replay()
        cupy.cuda.get_current_stream().synchronize()
    np.testing.assert_allclose(cupy.asnumpy(out), cupy.asnumpy(a) @ cupy.asnumpy(b), rtol=1e-5,
                               atol=1e-5)


def test_a_large_device_feed_is_read_after_its_upload():
    """OrtValue uploads run on the legacy default stream, a run on its own non-blocking one:
    the run waits for the upload (a 75 MB feed bound and run at once was read half-copied)."""
    model = _model("g (float[N,4096] x) => (float[N,4096] y) { y = Mul(x, x) }")
    for graphs in ("0", "1"):
        sess = onnxrun.InferenceSession(model, providers=[
            ("CUDAExecutionProvider", {"enable_cuda_graph": graphs})])
        for _ in range(3):
            x = rng.standard_normal((5000, 4096)).astype(np.float32)
            binding = sess.io_binding()
            binding.bind_ortvalue_input("x", onnxrun.OrtValue.ortvalue_from_numpy(x, "cuda", 0))
            binding.bind_output("y", "cuda")
            sess.run_with_iobinding(binding)
            np.testing.assert_array_equal(binding.copy_outputs_to_cpu()[0], x * x)
