"""compiled/attention_heads.py: attend_exp2's unmasked (or key-range) float32 heads as compiled
jobs that call OpenBLAS's cblas_sgemm, on spin.py's workers. Against a float64 oracle and the
numpy path (within ~1e-6: its exp2 polynomial and its row sums in 8 lanes are not numpy's),
the same bits at 1 and 2 threads, heads with odd sizes (the row's last T % 8 keys), key ranges,
row sums that overflow or vanish (the stable recomputation), NaN; the AVX2 code."""

from __future__ import annotations

import numpy as np
import pytest

from onnxrun.providers.cpu import blas
from onnxrun.providers.cpu import compiled as compiled_pkg
from onnxrun.providers.cpu.compiled import attention_heads, spin
from onnxrun.providers.cpu.ops import attention

pytest.importorskip("llvmlite")
if blas.cblas_sgemm() is None or attention_heads.unavailable() is not None:
    pytest.skip("no OpenBLAS cblas_sgemm or no compiled kernels here", allow_module_level=True)

RNG = np.random.default_rng(5)


@pytest.fixture(autouse=True)
def every_size(monkeypatch):
    """The compiled heads for every size here (small calls take the numpy path: MIN_MACS)."""
    monkeypatch.setattr(attention_heads, "MIN_MACS", 0)


def heads(B, N, S, T, D, Dv, scale=1.0):
    """q, k, v as the Attention kernel passes them: views of one packed projection."""
    qkv = (RNG.standard_normal((B, max(S, T), N * (2 * D + Dv))) * scale).astype(np.float32)
    q = qkv[:, :S, :N * D].reshape(B, S, N, D).transpose(0, 2, 1, 3)
    k = qkv[:, :T, N * D:2 * N * D].reshape(B, T, N, D).transpose(0, 2, 1, 3)
    v = qkv[:, :T, 2 * N * D:].reshape(B, T, N, Dv).transpose(0, 2, 1, 3)
    return q, k, v


def oracle(q, k, v, ranges=None):
    """(B, S, N, Dv) float64: softmax in base 2 of q k^T over each batch's key range."""
    B, N, S, _ = q.shape
    T = k.shape[2]
    out = np.zeros((B, S, N, v.shape[3]))
    for b in range(B):
        lo, hi = ranges[b] if ranges else (0, T)
        s = np.einsum("nsd,ntd->nst", q[b].astype(np.float64), k[b, :, lo:hi].astype(np.float64))
        p = np.exp2(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        out[b] = np.einsum("nst,ntd->snd", p, v[b, :, lo:hi].astype(np.float64))
    return out


def run(q, k, v, threads=1, ranges=None, compiled=True, monkeypatch=None):
    out = np.empty(q.shape[:1] + (q.shape[2], q.shape[1], v.shape[3]), np.float32)
    if compiled:
        attention.attend_exp2(q, k, v, out, key_ranges=ranges, threads=threads)
        return out
    with monkeypatch.context() as m:  # the numpy path
        m.setattr(attention, "_compiled_heads", lambda *a: False)
        attention.attend_exp2(q, k, v, out, key_ranges=ranges, threads=threads)
    return out


@pytest.mark.parametrize("B, N, S, T, D, Dv", [
    (2, 12, 128, 128, 32, 32),  # BERT MiniLM's layer
    (1, 3, 5, 37, 20, 24),  # a tail of 5 keys in every row, Dv != D
    (2, 2, 1, 1, 8, 8),  # one key
    (1, 4, 64, 9, 16, 16),
])
def test_heads_match_the_oracle_and_the_numpy_path(monkeypatch, B, N, S, T, D, Dv):
    q, k, v = heads(B, N, S, T, D, Dv)
    got = run(q, k, v)
    np.testing.assert_allclose(got, oracle(q, k, v), rtol=2e-5, atol=2e-6)
    numpy_path = run(q, k, v, compiled=False, monkeypatch=monkeypatch)
    np.testing.assert_allclose(got, numpy_path, rtol=2e-5, atol=2e-6)


def test_two_threads_give_the_bits_of_one(monkeypatch):
    monkeypatch.setattr(attention_heads, "SPLIT_MACS", 1)
    monkeypatch.setattr(blas, "one_thread", True)
    calls = []
    run_blocks = spin.run_blocks

    def counted(job, blocks, threads):
        calls.append((len(blocks), threads))
        return run_blocks(job, blocks, threads)

    monkeypatch.setattr(spin, "run_blocks", counted)
    q, k, v = heads(2, 6, 40, 40, 16, 16)
    one = run(q, k, v, threads=1)
    two = run(q, k, v, threads=2)
    assert calls == [(12, 1), (12, 2)]  # each head one job, on the workers at 2 threads
    np.testing.assert_array_equal(one, two)


def test_heads_in_groups_under_the_scratch_bound(monkeypatch):
    """Split over threads, heads whose scores would pass SCRATCH_BYTES go in groups (of at
    least two), one call of the workers each; the bits of one group, a flagged head redone in
    its group, and of the heads run in turn on one thread (one call, whatever the bound)."""
    monkeypatch.setattr(attention_heads, "SPLIT_MACS", 1)
    monkeypatch.setattr(blas, "one_thread", True)  # as in a session's run
    calls = []
    run_blocks = spin.run_blocks
    monkeypatch.setattr(spin, "run_blocks", lambda job, b, t: calls.append(len(b)) or
                        run_blocks(job, b, t))
    q, k, v = heads(2, 5, 16, 16, 8, 8)
    q = q.copy()
    q[1, 3] *= 500.0  # the 9th head overflows: redone the stable way
    whole = run(q, k, v, threads=2)
    assert calls == [10]
    monkeypatch.setattr(attention_heads, "SCRATCH_BYTES", 3 * 4 * 16 * 17)  # 3 heads a group
    calls.clear()
    np.testing.assert_array_equal(run(q, k, v, threads=2), whole)
    assert calls == [3, 3, 3, 1]
    calls.clear()
    np.testing.assert_array_equal(run(q, k, v), whole)
    assert calls == [10]
    np.testing.assert_allclose(whole, oracle(q, k, v), rtol=1e-4, atol=1e-5)


def test_heads_in_turn_share_one_scratch():
    """Run one after another, the heads' scores share one buffer (one head's size): the same
    bits as a buffer per head, every block pointing at the same scores."""
    from onnxrun.providers.cpu.compiled import jit

    q, k, v = heads(2, 3, 24, 20, 16, 8)
    sgemm = blas.cblas_sgemm()
    job = attention_heads.job(sgemm[1])
    part = [(b, h, 0, 20) for b in range(2) for h in range(3)]
    outs = []
    for one in (False, True):
        out = np.empty((2, 24, 3, 8), np.float32)
        blocks, scratch, flags = attention_heads.head_blocks(sgemm[0], q, k, v, out, part,
                                                             one_scratch=one)
        assert scratch.size == (1 if one else 6) * (24 * 20 + 24)
        assert len(set(blocks[:, 9].tolist())) == (1 if one else 6)
        for i in range(len(blocks)):
            job(jit.address(blocks) + i * blocks.strides[0])
        assert not flags.any()
        outs.append(out)
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_allclose(outs[1], oracle(q, k, v), rtol=2e-5, atol=2e-6)


def test_small_calls_take_the_numpy_path(monkeypatch):
    monkeypatch.setattr(attention_heads, "MIN_MACS", 1 << 18)
    calls = []
    monkeypatch.setattr(spin, "run_blocks", lambda *a: calls.append(a))
    q, k, v = heads(2, 2, 16, 16, 32, 32)  # 64 K multiply-adds
    np.testing.assert_allclose(run(q, k, v), oracle(q, k, v), rtol=2e-5, atol=2e-6)
    assert not calls


def test_split_needs_blas_at_one_thread(monkeypatch):
    """With BLAS on its own threads, the heads stay on the calling thread (two split parts'
    products would queue for OpenBLAS's threads)."""
    monkeypatch.setattr(attention_heads, "SPLIT_MACS", 1)
    monkeypatch.setattr(blas, "one_thread", False)
    calls = []
    monkeypatch.setattr(spin, "run_blocks", lambda job, b, threads: calls.append(threads) or
                        [job(attention_heads.jit.address(b) + i * b.strides[0])
                         for i in range(len(b))])
    q, k, v = heads(1, 4, 16, 16, 8, 8)
    run(q, k, v, threads=2)
    assert calls == [1]


def test_key_ranges():
    q, k, v = heads(2, 3, 24, 24, 16, 16)
    ranges = [(3, 20), (0, 7)]
    np.testing.assert_allclose(run(q, k, v, ranges=ranges), oracle(q, k, v, ranges),
                               rtol=2e-5, atol=2e-6)


def test_rows_that_overflow_or_vanish_are_redone_stably(monkeypatch):
    """Scores of thousands overflow exp2 (inf sums) or underflow it (sums under 2^-60) without
    the row maximum subtracted: those heads are computed again the stable way."""
    q, k, v = heads(1, 4, 8, 8, 8, 8)
    q = q.copy()
    q[0, 1] *= 400.0  # head 1: huge scores
    stable = []
    softmax = attention.softmax_

    def counted(s, *a):
        stable.append(s.shape)
        return softmax(s, *a)

    monkeypatch.setattr(attention, "softmax_", counted)
    got = run(q, k, v)
    assert stable == [(1, 8, 8)]  # only head 1
    np.testing.assert_allclose(got, oracle(q, k, v), rtol=1e-4, atol=1e-5)
    # every score below -2^7: each exponential under 2^-126, the sum under 2^-60
    q2 = np.full_like(q, -30.0)
    k2 = np.abs(k) + 1
    stable.clear()
    got = run(q2, k2, v)
    assert len(stable) == 4
    np.testing.assert_allclose(got, oracle(q2, k2, v), rtol=1e-4, atol=1e-5)


def test_nan_scores_give_nan_as_the_numpy_path(monkeypatch):
    q, k, v = heads(1, 2, 6, 6, 8, 8)
    q = q.copy()
    q[0, 0, 2, 3] = np.nan
    got = run(q, k, v)
    numpy_path = run(q, k, v, compiled=False, monkeypatch=monkeypatch)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(numpy_path))
    assert np.isnan(got[0, 2, 0]).all() and not np.isnan(got[0, :, 1]).any()


@pytest.mark.parametrize("shape", [(1, 3, 17, 29, 16, 8), (1, 2, 9, 45, 8, 40)])
def test_avx2_code(shape):
    """The module is written in 16 lanes for every target (LLVM splits them on AVX2): the
    AVX2 target's object gives the same bits as the host's, in the 16-lane passes over keys
    and output columns and in their one-at-a-time tails."""
    q, k, v = heads(*shape)
    host = run(q, k, v)
    with compiled_pkg.forced_target("avx2"):
        assert attention_heads.unavailable() is None
        np.testing.assert_array_equal(run(q, k, v), host)


def test_a_cblas_of_32_bit_integers():
    """``head32`` (an OpenBLAS built with 32-bit integers: distributions' libopenblas) passes
    the same arguments as int32: checked with a stand-in cblas_sgemm (numpy, through ctypes)
    that records them."""
    import ctypes

    from onnxrun.providers.cpu.compiled import jit

    i32, f32, fp = ctypes.c_int32, ctypes.c_float, ctypes.POINTER(ctypes.c_float)
    calls = []

    def sgemm(order, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc):
        calls.append((order, ta, tb, M, N, K, alpha, lda, ldb, beta, ldc))
        a = np.ctypeslib.as_array(A, ((M - 1) * lda + K,))
        b = np.ctypeslib.as_array(B, (((N if tb == 112 else K) - 1) * ldb +
                                      (K if tb == 112 else N),))
        c = np.ctypeslib.as_array(C, ((M - 1) * ldc + N,))
        am = np.lib.stride_tricks.as_strided(a, (M, K), (4 * lda, 4))
        bm = np.lib.stride_tricks.as_strided(b, (N, K) if tb == 112 else (K, N), (4 * ldb, 4))
        cm = np.lib.stride_tricks.as_strided(c, (M, N), (4 * ldc, 4))
        prod = alpha * (am @ (bm.T if tb == 112 else bm))
        cm[...] = prod if beta == 0 else prod + beta * cm  # beta 0: C is not read

    proto = ctypes.CFUNCTYPE(None, i32, i32, i32, i32, i32, i32, f32, fp, i32, fp, i32, f32, fp,
                             i32)
    fn = proto(sgemm)
    q, k, v = heads(1, 2, 6, 11, 8, 4)
    out = np.empty((1, 6, 2, 4), np.float32)
    blocks, _scratch, flags = attention_heads.head_blocks(
        ctypes.cast(fn, ctypes.c_void_p).value, q, k, v, out, [(0, 0, 0, 11), (0, 1, 2, 9)])
    job = attention_heads.job(32)
    for i in range(len(blocks)):
        job(jit.address(blocks) + i * blocks.strides[0])
    assert not flags.any()
    ldq, ldkv = q.strides[2] // 4, k.strides[2] // 4
    assert calls == [(101, 111, 112, 6, 11, 8, 1.0, ldq, ldkv, 0.0, 11),
                     (101, 111, 111, 6, 4, 11, 1.0, 11, ldkv, 0.0, 8),
                     (101, 111, 112, 6, 7, 8, 1.0, ldq, ldkv, 0.0, 7),
                     (101, 111, 111, 6, 4, 7, 1.0, 7, ldkv, 0.0, 8)]
    np.testing.assert_allclose(out[0, :, 0], oracle(q[:, :1], k[:, :1], v[:, :1])[0, :, 0],
                               rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(out[0, :, 1], oracle(q[:, 1:], k[:, 1:], v[:, 1:],
                                                    [(2, 9)])[0, :, 0], rtol=2e-5, atol=2e-6)
