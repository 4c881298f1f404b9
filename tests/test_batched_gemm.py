"""compiled/batched_gemm.py: a float32 stack of products, each by OpenBLAS's cblas_sgemm called
from compiled code, the stack split over spin.py's workers. Against numpy's matmul (the same
bits at alpha 1: the same cblas_sgemm per matrix), every operand layout it takes (rows or
columns contiguous, broadcast batch axes), the executor's ``out``, alpha as BLAS applies it,
the same bits at 1, 2 and 3 threads; through MatMul and FusedMatMul in a session at 2
threads against onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import onnxrun
from onnxrun.providers.cpu import blas, compiled
from onnxrun.providers.cpu.compiled import batched_gemm

pytest.importorskip("llvmlite")
if blas.cblas_sgemm() is None or batched_gemm.unavailable() is not None:
    pytest.skip("no OpenBLAS cblas_sgemm or no compiled kernels here", allow_module_level=True)

RNG = np.random.default_rng(11)


@pytest.fixture
def split(monkeypatch):
    """BLAS held to one thread (as during a session's runs) and any stack worth splitting."""
    monkeypatch.setattr(blas, "one_thread", True)
    monkeypatch.setattr(batched_gemm, "SPLIT_MACS", 0)


def operand(shape, transposed=False):
    x = RNG.standard_normal(shape[:-2] + (shape[-1], shape[-2]) if transposed else shape)
    x = x.astype(np.float32)
    return np.swapaxes(x, -1, -2) if transposed else x


CASES = [  # a's shape, b's shape, a transposed, b transposed
    ((1, 2, 64, 32), (1, 2, 32, 64), False, True),   # q k^T with k's rows: a transposed view
    ((1, 4, 48, 48), (1, 4, 48, 16), False, False),  # p v
    ((3, 1, 5, 7), (4, 7, 6), False, False),         # broadcast batch axes
    ((2, 3, 6), (2, 6, 5), True, False),
    ((5, 1, 1, 8), (1, 3, 8, 9), False, True),
    ((2, 3, 1, 4), (2, 3, 4, 1), False, False),      # single rows and columns
]


@pytest.mark.parametrize("sa,sb,ta,tb", CASES)
def test_numpys_bits_at_any_thread_count(sa, sb, ta, tb, split):
    a, b = operand(sa, ta), operand(sb, tb)
    want = np.matmul(a, b)
    first = batched_gemm.matmul(a, b)
    assert first is not None and first.flags.c_contiguous and first.shape == want.shape
    if sa[-2] > 1 and sb[-1] > 1:  # numpy's cblas_sgemm (a single row or column: its gemv)
        np.testing.assert_array_equal(first, want)
    np.testing.assert_allclose(first, want, rtol=1e-5, atol=1e-6)
    for threads in (2, 3):
        np.testing.assert_array_equal(batched_gemm.matmul(a, b, threads=threads), first)


@pytest.mark.parametrize("sa,sb,ta,tb", CASES[:3])
def test_alpha_times_each_sum_into_out(sa, sb, ta, tb, split):
    a, b = operand(sa, ta), operand(sb, tb)
    want = np.float32(0.17) * np.matmul(a.astype(np.float64), b.astype(np.float64))
    out = np.full(want.shape, np.nan, np.float32)
    assert batched_gemm.matmul(a, b, out, 0.17, threads=2) is out
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    # a buffer whose rows are apart (a slice of a wider one) is written in place too
    wide = np.full(want.shape[:-1] + (want.shape[-1] + 3,), np.nan, np.float32)
    assert batched_gemm.matmul(a, b, wide[..., :want.shape[-1]], 0.17) is not None
    np.testing.assert_allclose(wide[..., :want.shape[-1]], want, rtol=1e-5, atol=1e-5)
    assert np.isnan(wide[..., want.shape[-1]:]).all()


def test_the_avx2_code_too(split):
    with compiled.forced_target("avx2"):
        if batched_gemm.unavailable() is not None:
            pytest.skip(batched_gemm.unavailable())
        a, b = operand((1, 3, 40, 24)), operand((1, 3, 24, 40), True)
        np.testing.assert_array_equal(batched_gemm.matmul(a, b, threads=2), np.matmul(a, b))


def test_what_it_does_not_take():
    a = np.ones((2, 3, 4), np.float32)
    assert batched_gemm.matmul(a.astype(np.float64), np.ones((2, 4, 5))) is None
    assert batched_gemm.matmul(a, np.ones((2, 5, 5), np.float32)) is None  # K differs
    assert batched_gemm.matmul(a, np.ones((3, 4, 5), np.float32)) is None  # batch differs
    assert batched_gemm.matmul(a[:, :, ::2], np.ones((2, 2, 5), np.float32)) is None  # strided
    assert batched_gemm.matmul(a[:, :0], np.ones((2, 4, 5), np.float32)) is None  # empty
    # an out of another shape: a new array instead
    got = batched_gemm.matmul(a, np.ones((2, 4, 5), np.float32), np.empty((2, 3, 4),
                                                                        np.float32))
    np.testing.assert_array_equal(got, np.full((2, 3, 5), 4, np.float32))


@pytest.mark.parametrize("threads", [1, 2])
def test_unfused_attention_in_a_session_with_onnxruntimes_results(threads, monkeypatch):
    """q k^T (FusedMatMul's alpha after the optimizer folds the scale), Softmax, p v: stacks
    of heads at 2 threads go through the batched kernel, into the executor's buffers."""
    model = onnx.parser.parse_model("""
<ir_version: 8, opset_import: ["" : 17]>
g (float[1, 4, 128, 32] q, float[1, 4, 128, 32] k, float[1, 4, 128, 32] v)
    => (float[1, 4, 128, 32] y) {
    kt = Transpose <perm = [0, 1, 3, 2]> (k)
    s = MatMul (q, kt)
    scale = Constant <value = float {0.17677669}> ()
    ss = Mul (s, scale)
    p = Softmax <axis = -1> (ss)
    y = MatMul (p, v)
}
""")
    data = model.SerializeToString()
    calls = []
    real = batched_gemm.matmul
    monkeypatch.setattr(batched_gemm, "matmul", lambda *a: calls.append(a[3]) or real(*a))
    so = onnxrun.SessionOptions()
    so.intra_op_num_threads = threads
    sess = onnxrun.InferenceSession(data, so)
    ref = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    for seed in range(4):  # the memory pattern's runs too
        r = np.random.default_rng(seed)
        feeds = {n: r.standard_normal((1, 4, 128, 32)).astype(np.float32) for n in "qkv"}
        np.testing.assert_allclose(sess.run(None, feeds)[0], ref.run(None, feeds)[0],
                                   rtol=1e-4, atol=1e-5)
    # both products of each run at 2 threads (numpy's loop at 1), the scale as alpha
    assert len(calls) == (8 if threads == 2 else 0)
    assert threads == 1 or np.isclose(calls[0], 0.17677669)
