"""onnxruntime's native block-wise weight quantizers (capi quantize_matmul_{2,4,8}bits): the same
bytes as onnxruntime's (the oracle), and clear errors for buffers of the wrong kind."""

from __future__ import annotations

import numpy as np
import pytest

from onnxrun.api import blockwise

C = pytest.importorskip("onnxruntime.capi._pybind_state")


def _run(fn, m: np.ndarray, bits: int, block_size: int, symmetric: bool):
    K, N = m.shape
    kb = -(-K // block_size)
    dst = np.zeros((N, kb, block_size * bits // 8), np.uint8)
    scale = np.zeros((N, kb), m.dtype)
    zp = np.full((N, -(-kb * bits // 8)), 0x55, np.uint8)
    fn(dst, m, scale, zp, block_size, N, K, symmetric)
    # the values past K in the last block are not specified (onnxruntime leaves them)
    q = np.unpackbits(dst[..., None], axis=-1, bitorder="little").reshape(N, kb, -1, bits)
    values = (q * (1 << np.arange(bits))).sum(-1).reshape(N, -1)[:, :K]
    return values, scale, zp


@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("symmetric", [True, False])
def test_same_bytes_as_onnxruntime(bits, dtype, symmetric):
    rng = np.random.default_rng(bits)
    name = f"quantize_matmul_{bits}bits"
    for (K, N), block_size in [((128, 32), 16), ((73, 13), 32), ((52, 8), 64), ((16, 5), 128)]:
        m = (rng.standard_normal((K, N)) * rng.uniform(0.1, 10)).astype(dtype)
        m[0, 0], m[1, 0] = 0.5, -0.5  # a tie for the largest magnitude in the first block
        ours, theirs = (_run(getattr(mod, name), m, bits, block_size, symmetric)
                        for mod in (blockwise, C))
        for a, b, what in zip(ours, theirs, ("values", "scales", "zero points"), strict=True):
            np.testing.assert_array_equal(a, b, err_msg=f"{what}: K={K} N={N} bs={block_size}")


def test_zero_block_and_halves():
    m = np.zeros((16, 2), np.float32)
    m[:, 1] = np.arange(16) - 7.5  # values that land on .5 exactly: rounded away from zero
    ours = _run(blockwise.quantize_matmul_4bits, m, 4, 16, False)
    theirs = _run(C.quantize_matmul_4bits, m, 4, 16, False)
    for a, b in zip(ours, theirs, strict=True):
        np.testing.assert_array_equal(a, b)
    assert ours[1][0, 0] == 0  # an all-zero block has scale 0


def test_bad_buffers_are_refused_naming_them():
    m = np.ones((32, 4), np.float32)
    dst, scale, zp = np.zeros((4, 2, 8), np.uint8), np.zeros((4, 2), np.float32), \
        np.zeros((4, 1), np.uint8)
    q = blockwise.quantize_matmul_4bits
    with pytest.raises(ValueError, match="block_size must be a power of 2"):
        q(dst, m, scale, zp, 24, 4, 32, True)
    with pytest.raises(ValueError, match="dst must hold 64 elements"):
        q(np.zeros((4, 2, 4), np.uint8), m, scale, zp, 16, 4, 32, True)
    with pytest.raises(ValueError, match="scale must be float32"):
        q(dst, m, scale.astype(np.float16), zp, 16, 4, 32, True)
    with pytest.raises(ValueError, match="src must be float32 or float16"):
        q(dst, m.astype(np.float64), scale, zp, 16, 4, 32, True)
    with pytest.raises(ValueError, match="writable C-contiguous"):
        q(dst, m, np.zeros((2, 4), np.float32).T, zp, 16, 4, 32, True)
    with pytest.raises(ValueError, match="zero_point must be a numpy array"):
        q(dst, m, scale, [0, 0, 0, 0], 16, 4, 32, False)


@pytest.mark.parametrize("quant_type", [blockwise.FP4, blockwise.NF4])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_bnb4_same_bytes_as_onnxruntime(quant_type, dtype):
    rng = np.random.default_rng(quant_type)
    for (N, K), block_size in [((128, 32), 16), ((73, 13), 64), ((7, 3), 128)]:
        m = (rng.uniform(-1, 1, (N, K)) * rng.uniform(0.1, 5)).astype(dtype)
        m[0, :3] = 0  # a zero and a block that is not all zeros
        numel, nb = N * K, -(-N * K // block_size)
        results = []
        for fn in (blockwise.quantize_matmul_bnb4, C.quantize_matmul_bnb4):
            packed, absmax = np.zeros((numel + 1) // 2, np.uint8), np.zeros(nb, dtype)
            fn(packed, m, absmax, block_size, quant_type, N, K)
            results.append((packed, absmax))
        for a, b in zip(*results, strict=True):
            np.testing.assert_array_equal(a, b, err_msg=f"N={N} K={K} bs={block_size}")


def test_bnb4_refusals():
    m = np.ones((4, 8), np.float32)
    q = blockwise.quantize_matmul_bnb4
    with pytest.raises(ValueError, match="quant_type must be 0"):
        q(np.zeros(16, np.uint8), m, np.zeros(2, np.float32), 16, 2, 4, 8)
    with pytest.raises(ValueError, match="absmax must hold 2 elements"):
        q(np.zeros(16, np.uint8), m, np.zeros(3, np.float32), 16, 0, 4, 8)
