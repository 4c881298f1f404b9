"""QuantizeLinear / DequantizeLinear, per tensor or per axis, 8-bit (the QDQ pairs of a model
that keeps them in float), DynamicQuantizeLinear, and com.microsoft MatMulNBits (the 2/4/8-bit
block-quantized weights of an LLM). Blocked Q/DQ, float8 and 4-bit tensor types stay on the
CPU; the integer products are in ``integer.py``."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..array import matmul, namespace, normalize_axis
from ..kernels import KernelContext, op

MS = "com.microsoft"

_RANGES = {np.dtype(np.uint8): (0, 255), np.dtype(np.int8): (-128, 127)}


def _plain(node: Any) -> bool:
    return not node.attr("block_size", 0) and not node.attr("output_dtype", 0) and \
        not node.attr("precision", 0)


def _param(xp: Any, p: Any, x: Any, axis: int) -> Any:
    """A per-tensor (size 1) or per-axis (1-D) scale or zero point, broadcastable to x."""
    if p.ndim == 0 or (p.ndim == 1 and p.shape[0] == 1):
        return xp.reshape(p, ())
    a = normalize_axis(axis, x.ndim)
    return xp.reshape(p, (1,) * a + (-1,) + (1,) * (x.ndim - a - 1))


@op("DequantizeLinear", 10, 13, 19, 21, check=_plain)
def DequantizeLinear(x, x_scale, x_zero_point=None, *, axis=1, block_size=0, output_dtype=0):
    xp = namespace(x)
    v = xp.astype(x, xp.float32)
    if x_zero_point is not None:
        v = v - xp.astype(_param(xp, x_zero_point, x, axis), xp.float32)
    y = v * xp.astype(_param(xp, x_scale, x, axis), xp.float32)
    return y if x_scale.dtype == xp.float32 else xp.astype(y, x_scale.dtype)


@op("QuantizeLinear", 10, 13, 19, 21, check=_plain)
class QuantizeLinear:
    def __init__(self, ctx: KernelContext, *, axis=1, block_size=0, output_dtype=0,
                 precision=0, saturate=1) -> None:
        self.backend = ctx.provider.backend
        self.axis = int(axis)

    def __call__(self, x, y_scale, y_zero_point=None):
        xp = namespace(x)
        out = np.dtype(np.uint8) if y_zero_point is None else self.backend.dtype_of(y_zero_point)
        lo, hi = _RANGES[out]
        v = xp.astype(x, xp.float32) / xp.astype(_param(xp, y_scale, x, self.axis), xp.float32)
        v = xp.round(v)  # half to even, as onnxruntime rounds
        if y_zero_point is not None:
            v = v + xp.astype(_param(xp, y_zero_point, x, self.axis), xp.float32)
        v = xp.where(xp.isnan(v), float(lo), v)  # NaN -> the lowest code, as onnxruntime
        return xp.astype(xp.clip(v, float(lo), float(hi)), self.backend.as_dtype(out))


@op("DynamicQuantizeLinear", 11)
def DynamicQuantizeLinear(x):
    """uint8 codes for [min(x, 0), max(x, 0)], as onnxruntime computes them (float32 division,
    round half to even), the scale and zero point as 0-d device arrays: no host round trip."""
    xp = namespace(x)
    v = xp.astype(x, xp.float32)
    zero = xp.zeros((), dtype=xp.float32, device=v.device)
    if v.size == 0:  # onnxruntime: scale 1, zero point 0
        return xp.astype(v, xp.uint8), xp.ones_like(zero), xp.astype(zero, xp.uint8)
    lo, hi = xp.minimum(xp.min(v), zero), xp.maximum(xp.max(v), zero)
    scale = xp.where(hi == lo, xp.ones_like(zero), (hi - lo) / 255.0)
    zp = xp.round(xp.clip(zero - lo / scale, 0.0, 255.0))
    q = v / scale
    q = xp.where(xp.isnan(q), -zp, q)  # MLAS clamps a NaN quotient to the low end
    q = xp.minimum(xp.maximum(xp.round(q), -zp), 255.0 - zp) + zp
    return xp.astype(q, xp.uint8), scale, xp.astype(zp, xp.uint8)


# -- MatMulNBits ---------------------------------------------------------------------------------


def _nbits_plain(node: Any) -> bool:
    """Bits 2, 4 or 8, weights not prepacked for another provider, no act-order g_idx."""
    given = {i for i, v in enumerate(node.inputs) if v is not None and v.name}
    return node.attr("bits", 4) in (2, 4, 8) and not node.attr("weight_prepacked", 0) and \
        4 not in given


def unpack_bits(xp: Any, packed: Any, bits: int) -> Any:
    """Little-endian bit fields of each byte along a new last axis (low bits first)."""
    if bits == 8:
        return packed[..., None]
    mask = (1 << bits) - 1
    return xp.stack([(packed >> (i * bits)) & mask for i in range(8 // bits)], axis=-1)


@op("MatMulNBits", 1, domain=MS, check=_nbits_plain)
class MatMulNBits:
    """Y = A @ dequantize(B) (+ bias), as onnxruntime's CUDA provider computes it: the weight
    stays packed on the device and is dequantized per call into A's type (float16 or float32),
    then one GEMM (cuBLAS on CuPy) in that type. ``accuracy_level`` is not read, as onnxruntime
    CUDA does not read it: there is no int8 compute of A on the device, so a level-4 model's
    results differ from the CPU provider's (which quantizes A to int8 per block) by that
    quantization's error, well within the tolerance of a 4-bit weight."""

    def __init__(self, ctx: KernelContext, *, K, N, block_size, accuracy_level=0, bits=4,
                 weight_prepacked=0) -> None:
        self.K, self.N = int(K), int(N)
        self.block_size, self.bits = int(block_size), int(bits)
        self.kb = -(-self.K // self.block_size)
        fast = getattr(ctx.provider, "fast", None)
        self.dequantize = None if fast is None else fast.nbits.dequantize

    def weight(self, B: Any, scales: Any, zero_points: Any, dtype: Any) -> Any:
        """The dequantized (N, K) weight in ``dtype``: (q - zp) * scale per block of K; the zero
        point defaults to 2**(bits - 1)."""
        xp = namespace(B)
        N, kb, bs, bits = self.N, self.kb, self.block_size, self.bits
        q = xp.astype(xp.reshape(unpack_bits(xp, xp.reshape(B, (N, kb, -1)), bits),
                                 (N, kb, bs)), dtype)
        s = xp.astype(xp.reshape(scales, (N, kb)), dtype)
        if zero_points is None:
            z = float(1 << (bits - 1))
        elif zero_points.dtype == xp.uint8:
            z = unpack_bits(xp, xp.reshape(zero_points, (N, -1)), bits)
            z = xp.astype(xp.reshape(z, (N, -1))[:, :kb], dtype)[..., None]
        else:
            z = xp.astype(xp.reshape(zero_points, (N, kb)), dtype)[..., None]
        W = xp.reshape((q - z) * s[..., None], (N, kb * bs))
        return W if kb * bs == self.K else W[:, :self.K]

    def __call__(self, A, B, scales, zero_points=None, g_idx=None, bias=None):
        xp = namespace(A)
        if A.shape[-1] != self.K:
            raise ValueError(f"MatMulNBits: A's last dimension {A.shape[-1]} != K={self.K}")
        if B.size == 0:  # an omitted projection: zeros, or the bias
            Y = xp.zeros((*A.shape[:-1], self.N), dtype=A.dtype, device=A.device)
        else:
            if self.dequantize is not None:  # CuPy: one kernel
                W = self.dequantize(B, scales, zero_points, self.N, self.K, self.block_size,
                                    self.bits, A.dtype)
            else:
                W = self.weight(B, scales, zero_points, A.dtype)
            Y = matmul(A, xp.matrix_transpose(W))
        if bias is not None and bias.size:
            Y = Y + xp.astype(bias, A.dtype)
        return Y
