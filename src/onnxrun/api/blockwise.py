"""onnxruntime's native block-wise weight quantizers (``onnxruntime.capi._pybind_state``):
``quantize_matmul_2bits``, ``quantize_matmul_4bits``, ``quantize_matmul_8bits`` and the
bitsandbytes 4-bit ``quantize_matmul_bnb4`` (at the end).

Each quantizes a float weight ``src [K, N]`` in blocks of ``block_size`` along K into the buffers
the caller allocated, in the layout of com.microsoft MatMulNBits: ``dst [N, K blocks,
block_size * bits / 8]`` (values packed low bits first; past K the last block quantizes zeros),
``scale [N, K blocks]`` and ``zero_point [N, ceil(K blocks * bits / 8)]`` (packed the same way,
slots past the last block holding the default zero point 2^(bits-1); left as given when
symmetric). The arithmetic is MLAS's, checked against onnxruntime's bytes: float32; a block's
scale from its largest-magnitude value (a tie goes to the negative one; zero point 2^(bits-1)),
or from its range widened to hold 0; values times the reciprocal of the scale as stored (float16
for a float16 weight), plus the zero point, rounded half away from zero.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import InvalidArgument


def _check(name: str, array: Any, shape: tuple[int, ...], dtypes: tuple[Any, ...],
           output: bool = True) -> None:
    if not isinstance(array, np.ndarray):
        raise InvalidArgument(f"{name} must be a numpy array, got {type(array).__name__}")
    if array.dtype not in dtypes:
        raise InvalidArgument(f"{name} must be {' or '.join(str(np.dtype(d)) for d in dtypes)}, "
                              f"got {array.dtype}")
    if array.size != int(np.prod(shape)):
        raise InvalidArgument(f"{name} must hold {int(np.prod(shape))} elements "
                              f"(shape {list(shape)}), got shape {list(array.shape)}")
    if output and not (array.flags.c_contiguous and array.flags.writeable):
        raise InvalidArgument(f"{name} must be a writable C-contiguous array (it is written)")


def quantize_blocks(src: np.ndarray, block_size: int, bits: int, symmetric: bool,
                    scale_dtype: Any = np.float32) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``src [K, N]`` -> (q [N, K blocks, block_size] uint8, scale [N, K blocks] float32,
    zero point [N, K blocks] uint8), as MLAS's MlasQuantizeBlockwise computes them."""
    K, N = src.shape
    kb = -(-K // block_size)
    blocks = np.zeros((N, kb * block_size), np.float32)
    blocks[:, :K] = src.T
    blocks = blocks.reshape(N, kb, block_size)
    top = (1 << bits) - 1
    if symmetric:
        lo, hi = blocks.min(axis=2), blocks.max(axis=2)
        peak = np.where(np.abs(lo) >= np.abs(hi), lo, hi)  # a tie goes to the negative one
        scale = peak / np.float32(-(1 << (bits - 1)))
        zp = np.full(scale.shape, 1 << (bits - 1), np.float32)
    else:
        lo = np.minimum(blocks.min(axis=2), np.float32(0))
        hi = np.maximum(blocks.max(axis=2), np.float32(0))
        scale = (hi - lo) / np.float32(top)
        with np.errstate(divide="ignore", invalid="ignore"):
            zp = np.clip(_round_half_away(np.where(scale != 0, -lo / scale, 0)), 0, top)
    # The values are quantized with the scale as stored (float16 for a float16 weight).
    scale = scale.astype(scale_dtype).astype(np.float32)
    with np.errstate(divide="ignore"):
        reciprocal = np.where(scale != 0, np.float32(1) / scale, np.float32(0))
    q = np.clip(_round_half_away(blocks * reciprocal[..., None] + zp[..., None]), 0, top)
    return q.astype(np.uint8), scale.astype(np.float32), zp.astype(np.uint8)


def _round_half_away(x: np.ndarray) -> np.ndarray:
    """std::round: halves away from zero (numpy's round takes them to even)."""
    half = np.abs(x - np.trunc(x)) == 0.5
    return np.where(half, x + np.copysign(np.float32(0.5), x), np.rint(x))


def _pack(values: np.ndarray, bits: int) -> np.ndarray:
    """Unsigned ``bits``-bit values packed into bytes along the last axis, low bits first."""
    per = 8 // bits
    v = values.reshape(*values.shape[:-1], -1, per).astype(np.uint8)
    shifts = np.arange(per, dtype=np.uint8) * np.uint8(bits)
    return np.bitwise_or.reduce(v << shifts, axis=-1).astype(np.uint8)


def _quantize_matmul(bits: int, dst: np.ndarray, src: np.ndarray, scale: np.ndarray,
                     zero_point: np.ndarray | None, block_size: int, N: int, K: int,
                     is_symmetric: bool) -> None:
    block_size, N, K = int(block_size), int(N), int(K)
    if block_size < 16 or block_size & (block_size - 1):
        raise InvalidArgument(f"block_size must be a power of 2 and >= 16, got {block_size}")
    if N <= 0 or K <= 0:
        raise InvalidArgument(f"N and K must be positive, got N={N}, K={K}")
    kb = -(-K // block_size)
    _check("src", src, (K, N), (np.float32, np.float16), output=False)
    _check("dst", dst, (N, kb, block_size * bits // 8), (np.uint8,))
    _check("scale", scale, (N, kb), (src.dtype,))
    if zero_point is not None:
        _check("zero_point", zero_point, (N, -(-kb * bits // 8)), (np.uint8,))
    q, s, zp = quantize_blocks(src.reshape(K, N).astype(np.float32), block_size, bits,
                               bool(is_symmetric), scale.dtype)
    dst.reshape(N, kb, -1)[...] = _pack(q, bits)
    scale.reshape(N, kb)[...] = s.astype(scale.dtype)
    if zero_point is None or is_symmetric:
        return  # symmetric: the zero point is implied, the buffer is left as given
    zpoints = zero_point.reshape(N, -1)
    if bits < 8:
        # slots past the last block hold the default zero point, 2^(bits-1), as onnxruntime's
        per = 8 // bits
        full = np.full((N, zpoints.shape[1] * per), 1 << (bits - 1), np.uint8)
        full[:, :kb] = zp
        zp = _pack(full, bits)
    zpoints[...] = zp


def quantize_matmul_2bits(dst: np.ndarray, src: np.ndarray, scale: np.ndarray,
                          zero_point: np.ndarray | None, block_size: int, N: int, K: int,
                          is_symmetric: bool) -> None:
    """2-bit MatMulNBits weights of ``src [K, N]`` into ``dst``, ``scale``, ``zero_point``."""
    _quantize_matmul(2, dst, src, scale, zero_point, block_size, N, K, is_symmetric)


def quantize_matmul_4bits(dst: np.ndarray, src: np.ndarray, scale: np.ndarray,
                          zero_point: np.ndarray | None, block_size: int, N: int, K: int,
                          is_symmetric: bool) -> None:
    """4-bit MatMulNBits weights of ``src [K, N]`` into ``dst``, ``scale``, ``zero_point``."""
    _quantize_matmul(4, dst, src, scale, zero_point, block_size, N, K, is_symmetric)


def quantize_matmul_8bits(dst: np.ndarray, src: np.ndarray, scale: np.ndarray,
                          zero_point: np.ndarray | None, block_size: int, N: int, K: int,
                          is_symmetric: bool) -> None:
    """8-bit MatMulNBits weights of ``src [K, N]`` into ``dst``, ``scale``, ``zero_point``."""
    _quantize_matmul(8, dst, src, scale, zero_point, block_size, N, K, is_symmetric)


# bitsandbytes' 4-bit codes, as the upper bounds of each code's interval over values scaled to
# [-1, 1] (a value takes the first code whose bound it does not exceed). FP4 is sign-magnitude:
# the bounds are over |x|, the sign is the code's bit 3.
_FP4_BOUNDS = np.array([0.00260417, 0.0859375, 0.20833333, 0.29166667, 0.4166667, 0.583333,
                        0.8333333, 1], np.float32)
_FP4_CODES = np.array([0, 1, 6, 7, 4, 5, 2, 3], np.uint8)
_NF4_BOUNDS = np.array([-0.8480964004993439, -0.6106329262256622, -0.4599952697753906,
                        -0.33967943489551544, -0.23460740596055984, -0.13791173323988914,
                        -0.045525018125772476, 0.03979014977812767, 0.1202552504837513,
                        0.2035212516784668, 0.2920137718319893, 0.3893125355243683,
                        0.5016634166240692, 0.6427869200706482, 0.8614784181118011, 1.0],
                       np.float32)
FP4, NF4 = 0, 1


def _first_bound(x: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """Index of the first bound >= x; 0 past the last (as the reference's argmax)."""
    i = np.searchsorted(bounds, x, side="left")
    return np.where(i == len(bounds), 0, i)


def quantize_matmul_bnb4(dst: np.ndarray, src: np.ndarray, absmax: np.ndarray, block_size: int,
                         quant_type: int, N: int, K: int) -> None:
    """bitsandbytes 4-bit (FP4 = 0 or NF4 = 1) quantization of ``src [N, K]`` (already
    transposed) in blocks of ``block_size`` consecutive values: ``absmax`` gets each block's
    largest magnitude, ``dst`` the codes, two a byte, the first in the high nibble."""
    block_size, N, K, quant_type = int(block_size), int(N), int(K), int(quant_type)
    if block_size < 16 or block_size & (block_size - 1):
        raise InvalidArgument(f"block_size must be a power of 2 and >= 16, got {block_size}")
    if quant_type not in (FP4, NF4):
        raise InvalidArgument(f"quant_type must be 0 (FP4) or 1 (NF4), got {quant_type}")
    if N <= 0 or K <= 0:
        raise InvalidArgument(f"N and K must be positive, got N={N}, K={K}")
    numel = N * K
    nb = -(-numel // block_size)
    _check("src", src, (N, K), (np.float32, np.float16), output=False)
    _check("dst", dst, ((numel + 1) // 2,), (np.uint8,))
    _check("absmax", absmax, (nb,), (src.dtype,))
    blocks = np.zeros(nb * block_size, np.float32)
    blocks[:numel] = src.reshape(-1)
    blocks = blocks.reshape(nb, block_size)
    peak = np.abs(blocks).max(axis=1)
    with np.errstate(divide="ignore"):
        reciprocal = np.where(peak != 0, np.float32(1) / peak, np.float32(0))
    x = (blocks * reciprocal[:, None]).reshape(-1)
    if quant_type == FP4:
        codes = _FP4_CODES[_first_bound(np.abs(x), _FP4_BOUNDS)] + (x < 0).astype(np.uint8) * 8
    else:
        codes = _first_bound(x, _NF4_BOUNDS).astype(np.uint8)
    packed = (codes[0::2] << np.uint8(4)) | codes[1::2]
    dst.reshape(-1)[...] = packed[: (numel + 1) // 2]
    absmax.reshape(-1)[...] = peak.astype(absmax.dtype)
