"""MatMulNBits (4 bits) against onnxruntime bit for bit for every block size MLAS has (16-256)
and both of its arithmetics: accuracy_level 4 (CompInt8: compiled/nbits_gemm.py for blocks of
32, compiled/nbits_blocks.py for the others) and levels 0-3 (CompFp32: nbits_blocks.py): one
row (MLAS's M == 1 kernels) and prompts, K not whole blocks, with and without zero points and
bias, and the rows in MLAS's ranges of 128 where onnxruntime has a thread pool."""

from __future__ import annotations

import numpy as np
import pytest
from nbits_models import matmul_nbits, model, packed_weight, sessions
from onnx import TensorProto as TP
from onnx import helper
from ort_bits import assert_ort_bits

import onnxrun
from onnxrun.providers.cpu.compiled import nbits_blocks

ort = pytest.importorskip("onnxruntime")
pytestmark = pytest.mark.skipif(nbits_blocks.unavailable() is not None,
                                reason=f"compiled kernel: {nbits_blocks.unavailable()}")


def _rows(rng, M, K):
    a = (rng.standard_normal((M, K)) * rng.uniform(0.1, 3, (M, 1))).astype(np.float32)
    a[:, :16] = 0  # an all-zero block (of 16)
    return a


@pytest.mark.parametrize("block", [16, 32, 64, 128, 256])
@pytest.mark.parametrize("level", [0, 4])
@pytest.mark.parametrize("zp,bias", [(False, False), (True, False), (False, True), (True, True)])
def test_bit_for_bit_onnxruntime(block, level, zp, bias):
    rng = np.random.default_rng(block * 10 + level + 2 * zp + 4 * bias)
    K, N = 3 * block + 40, 37  # K not whole blocks (16: a group of four and two alone); N % 8
    sess, ref = sessions(matmul_nbits(K, N, rng, block, level, zp, bias), 1)
    for M in (1, 2, 7, 128):  # MLAS's M == 1 kernels, the row pairs and a last odd row
        a = _rows(rng, M, K)
        assert_ort_bits(sess.run(None, {"A": a})[0], ref.run(None, {"A": a})[0], err=f"M={M}")


@pytest.mark.parametrize("block", [64, 128, 256])
@pytest.mark.parametrize("zp,bias", [(False, False), (True, True)])
@pytest.mark.parametrize("short", [0, 40])
def test_one_row_in_one_call(block, zp, bias, short, monkeypatch):
    """A decode step's row with a constant bias, K whole blocks or not (the 0.5b model's 896
    in blocks of 256): quantization and product in one compiled call (Int8.row), the same
    bits."""
    calls = []
    original = nbits_blocks.Int8.row

    def row(self, a, out):
        calls.append(original(self, a, out))
        return calls[-1]

    monkeypatch.setattr(nbits_blocks.Int8, "row", row)
    rng = np.random.default_rng(block + zp)
    K, N = 4 * block - short, 45
    sess, ref = sessions(matmul_nbits(K, N, rng, block, 4, zp, bias), 1)
    for _ in range(3):
        a = _rows(rng, 1, K)
        assert_ort_bits(sess.run(None, {"A": a})[0], ref.run(None, {"A": a})[0])
    assert calls == [True] * 3


@pytest.mark.parametrize("block", [64, 128, 256])
@pytest.mark.parametrize("zp", [False, True])
def test_one_row_split_over_spinning_workers(block, zp, monkeypatch):
    """At two threads a decode step's row goes to compiled/spin.py's workers in column ranges
    (Int8.row_parts, each part quantizing the row itself): onnxruntime's bits still."""
    from onnxrun.providers.cpu.compiled import spin
    from onnxrun.providers.cpu.ops.contrib.quantization import MatMulNBits

    if spin.unavailable() is not None:
        pytest.skip(f"spinning workers: {spin.unavailable()}")
    monkeypatch.setattr(MatMulNBits, "SPLIT_ROW_BYTES", 0)
    forks = []
    real = spin.Pool.fork
    monkeypatch.setattr(spin.Pool, "fork", lambda self, *a: forks.append(1) or real(self, *a))
    rng = np.random.default_rng(block + zp)
    K, N = 4 * block, 45  # N: ranges of eights, the last columns summed MLAS's other way
    sess, ref = sessions(matmul_nbits(K, N, rng, block, 4, zp, True), 2)
    for _ in range(3):
        a = _rows(rng, 1, K)
        assert_ort_bits(sess.run(None, {"A": a})[0], ref.run(None, {"A": a})[0])
    assert len(forks) == 3


@pytest.mark.parametrize("level", [1, 2, 3])
def test_levels_below_4_are_mlas_fp32(level):
    """onnxruntime computes levels 1-3 with float activations exactly as level 0."""
    rng = np.random.default_rng(level)
    K, N = 200, 24
    sess, ref = sessions(matmul_nbits(K, N, rng, 64, level, True, True), 1)
    for M in (1, 5):
        a = _rows(rng, M, K)
        assert_ort_bits(sess.run(None, {"A": a})[0], ref.run(None, {"A": a})[0], err=f"M={M}")


@pytest.mark.parametrize("block,level", [(32, 4), (64, 4), (16, 4), (128, 0)])
def test_thread_pool_ranges_of_128_rows(block, level, monkeypatch):
    """With a thread pool MLAS hands out ranges of 128 rows, and a range of one row takes its
    M == 1 kernel (M = 129, 257); without one (one thread), one range: the M > 1 kernel for
    every row. Either way onnxrun gives the numbers of an onnxruntime session of the same
    threads, the columns split over them."""
    from onnxrun.providers.cpu.ops.contrib.quantization import MatMulNBits

    monkeypatch.setattr(MatMulNBits, "SPLIT_BYTES", 0)  # every product split over the threads
    rng = np.random.default_rng(block + level)
    K, N = 2 * block + 40, 45
    data = matmul_nbits(K, N, rng, block, level, True, True)
    for threads in (1, 2):
        sess, ref = sessions(data, threads)
        for M in (65, 129, 257):
            a = _rows(rng, M, K)
            assert_ort_bits(sess.run(None, {"A": a})[0], ref.run(None, {"A": a})[0],
                            err=f"threads={threads} M={M}")


def test_computed_bias_and_three_dimensional_input():
    """A bias that is not a constant (a graph input: the optimizer would fold a computation
    of constants) added inside the kernel as MLAS does, and A (b, s, K)."""
    rng = np.random.default_rng(3)
    K, N, block = 160, 20, 64
    node = helper.make_node("MatMulNBits", ["A", "B", "S", "", "", "b"], ["Y"],
                            domain="com.microsoft", K=K, N=N, block_size=block, bits=4,
                            accuracy_level=4)
    data = model([node], [helper.make_tensor_value_info("A", TP.FLOAT, ["b", "s", K]),
                          helper.make_tensor_value_info("b", TP.FLOAT, [N])],
                 [helper.make_tensor_value_info("Y", TP.FLOAT, None)],
                 packed_weight(rng, N, -(-K // block), block))
    sess, ref = sessions(data, 1)
    for shape in ((1, 1, K), (2, 9, K)):
        feed = {"A": rng.standard_normal(shape).astype(np.float32),
                "b": rng.standard_normal(N).astype(np.float32)}
        assert_ort_bits(sess.run(None, feed)[0], ref.run(None, feed)[0], err=str(shape))


@pytest.mark.parametrize("target", ["avx2", "avx512"])
def test_module_builds_for_avx2_and_avx512_targets(target):
    """Compiled on its own (not in jit's bundle): its IR builds for the AVX-512 target too,
    which this host may not run."""
    import base64

    from onnxrun.providers.cpu.compiled import elf, jit, targets

    t = targets.get(target)
    answer = jit._compile({"nbits_blocks": nbits_blocks.module_ir(t)}, t)
    assert answer["error"] is None and answer["errors"] == {}
    assert "gemm128_m1" in elf.load(base64.b64decode(answer["objects"]["nbits_blocks"])).address


@pytest.mark.parametrize("level", [0, 4])
def test_weight_stays_packed_for_prompts(level):
    """Levels 0-3 too: a prompt's rows dequantize the weight a panel at a time (as MLAS
    dequantizes B for its SGEMM), no float32 copy kept (8x the packed bytes)."""
    import tracemalloc

    rng = np.random.default_rng(level)
    K, N = 2048, 2048  # packed 2 MiB; float32 16 MiB
    data = matmul_nbits(K, N, rng, 64, level)
    nbits_blocks.Fp32(64, np.zeros((1, 1, 32), np.uint8), np.ones((1, 1), np.float32), 64,
                      None)  # the module compiled (or loaded) before counting
    tracemalloc.start()
    try:
        sess = onnxrun.InferenceSession(data)
        tracemalloc.reset_peak()  # creation's own peak is the loader's (the model's bytes)
        for M in (1, 5):
            sess.run(None, {"A": np.ones((M, K), np.float32)})
        held, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert held < 8 * 2**20 and peak < 8 * 2**20, (held, peak)
