"""The compiled 4-bit MatMulNBits kernel (compiled/nbits_gemv.py): the same numbers as the numpy
path and onnxruntime (accuracy_level 4), for decoding rows and prompts, split over threads, and
the weight kept packed (no float32 copy)."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from nbits_models import matmul_nbits

import onnxrun
from onnxrun.providers.cpu import compiled
from onnxrun.providers.cpu.compiled import nbits_gemv

ort = pytest.importorskip("onnxruntime")
pytestmark = pytest.mark.skipif(nbits_gemv.unavailable() is not None,
                                reason=f"compiled kernel: {nbits_gemv.unavailable()}")


@pytest.mark.parametrize("block", [32, 64, 128, 256])
@pytest.mark.parametrize("zp", [False, True])
def test_same_numbers_as_numpy_path_and_onnxruntime(block, zp, monkeypatch):
    from onnxrun.providers.cpu.ops.contrib.quantization import MatMulNBits

    monkeypatch.setattr(MatMulNBits, "SPLIT_BYTES", 0)  # every product split over 2 threads
    rng = np.random.default_rng(block + zp)
    K, N = 4 * block + 32, 600  # K not whole blocks; 2 threads split the columns
    data = matmul_nbits(K, N, rng, block, zp=zp)
    so = onnxrun.SessionOptions()
    so.intra_op_num_threads = 2
    sess = onnxrun.InferenceSession(data, so)
    with compiled.disabled():
        ref_numpy = onnxrun.InferenceSession(data, so)
    ref = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    for M in (1, 2, 3, 4, 5, 70):  # decoding (1-4 rows: dec kernels); a few rows; many
        a = rng.standard_normal((M, K)).astype(np.float32)
        a[:, :block] = 0  # an all-zero block
        got = sess.run(None, {"A": a})[0]
        scale = np.abs(got).max()
        for want in (ref_numpy.run(None, {"A": a})[0], ref.run(None, {"A": a})[0]):
            assert np.abs(got - want).max() <= 2e-6 * scale


def test_weight_stays_packed():
    """A session keeps the 4-bit weight, not a float32 copy 8 times its size."""
    rng = np.random.default_rng(0)
    K, N = 2048, 2048  # packed 2 MiB; float32 16 MiB
    data = matmul_nbits(K, N, rng, 32, zp=False)
    tracemalloc.start()
    try:
        sess = onnxrun.InferenceSession(data)
        sess.run(None, {"A": np.ones((1, K), np.float32)})
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 * 2**20, peak
    with compiled.disabled():  # the numpy path does hold the float copy: the test can fail
        tracemalloc.start()
        try:
            onnxrun.InferenceSession(data)
            _, peak_numpy = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert peak_numpy > 16 * 2**20


@pytest.mark.parametrize("block", [32, 64, 128, 256])
def test_compiled_quantize_is_quantize_rows(block):
    """The compiled quantization of A gives quantize_rows's codes, scales and sa * sums bit
    for bit: round half to even on exact ties, all-zero blocks, one-sided blocks, K not whole
    blocks."""
    rng = np.random.default_rng(block)
    M, kb = 4, 5
    K = kb * block - 16
    A = rng.standard_normal((M, K)).astype(np.float32)
    A[0, :block] = 0  # an all-zero block
    A[1, :block] = np.arange(block) % 9 - 4 + 0.5  # amax 4.5
    A[1, block:2 * block] = (np.arange(block) % 200 - 100).astype(np.float32) + 0.5
    A[1, block] = 127.0  # amax 127: inv = 1, every other value an exact .5 tie
    A[2, 2 * block:3 * block] = np.abs(A[2, 2 * block:3 * block])  # all positive
    qa, sa, sums = nbits_gemv.quantize_rows(A, block)
    packed = np.zeros((8, kb, block // 2), np.uint8)
    gemv = nbits_gemv.Gemv(packed, np.ones((8, kb), np.float32), block)
    got_q, got_s, got_asum = gemv.quantize(A)
    np.testing.assert_array_equal(got_q, qa)
    np.testing.assert_array_equal(got_s, sa)
    np.testing.assert_array_equal(got_asum, sa * sums)
    assert (qa[1, block:2 * block] % 2 == 0).sum() == block - 1  # ties went to even codes


@pytest.mark.parametrize("block,kb", [(32, 7), (32, 8), (64, 3), (128, 2)])
def test_decode_kernel_against_exact_sums(block, kb):
    """Decoding's rows take Gemv.decode (gemv8: eight columns per pass, blocks of 32 in
    pairs and an odd last block alone, the zero points' share inside): each column within
    float32 rounding of the exact sums, for column ranges that start and end anywhere
    (shorter than eight too), nothing written outside them."""
    rng = np.random.default_rng(block * kb)
    N, K = 45, kb * block
    B = rng.integers(0, 256, (N, kb, block // 2), dtype=np.uint8)
    S = (rng.random((N, kb), dtype=np.float32) * 0.02 + 1e-3).astype(np.float32)
    Z = rng.integers(0, 16, (N, kb)).astype(np.float32)
    gemv = nbits_gemv.Gemv(B, S, block, Z * S)
    w = np.stack([B & 15, B >> 4], -1).reshape(N, kb, block).astype(np.float64) - Z[..., None]
    for M in (1, 3):
        A = rng.standard_normal((M, K)).astype(np.float32)
        qa, sa, asum = gemv.quantize(A)
        codes = np.rint(A.reshape(M, kb, block) * (
            np.float32(127) / np.abs(A.reshape(M, kb, block)).max(-1, keepdims=True)))
        exact = (np.einsum("mbi,nbi->mnb", codes, w) * (sa[:, None, :] * S[None])).sum(-1)
        scale = np.abs(exact).max()
        for n0, n1 in ((0, N), (3, 29), (8, 16), (40, 45)):
            got = np.full((M, N), np.nan, np.float32)
            gemv.decode(qa, sa, asum, got, n0, n1)
            assert np.isnan(got[:, :n0]).all() and np.isnan(got[:, n1:]).all()
            assert np.abs(got[:, n0:n1] - exact[:, n0:n1]).max() <= 2e-6 * scale
