"""The integer products a quantized model's optimized graph holds: MatMulInteger, QLinearMatMul,
ConvInteger and QLinearConv. Operands are widened to int32 with their zero points removed and
multiplied in int32 (the implicit-GEMM convolution of ``conv.py`` for the convolutions), so the
accumulators are exact, as onnxruntime's; the QLinear forms then requantize as MLAS does:
float32(acc) * (a_scale * b_scale / y_scale), rounded half to even, clamped, plus the output
zero point. Every parameter stays on the device (no host round trip for the scales)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...cpu.ops.quantization import clip_bounds
from ..array import namespace
from ..kernels import KernelContext, op
from .conv import Conv

_RANGES = {np.dtype(np.uint8): (0, 255), np.dtype(np.int8): (-128, 127)}


def _centered(xp: Any, q: Any, zero_point: Any, shape: tuple[int, ...] | None = None) -> Any:
    """``q - zero_point`` in int32; ``shape``: where a per-row / per-channel point goes."""
    v = xp.astype(q, xp.int32)
    if zero_point is None:
        return v
    z = xp.astype(zero_point, xp.int32)
    if z.ndim == 0 or z.size == 1:
        z = xp.reshape(z, ())
    elif shape is not None:
        z = xp.reshape(z, shape)
    return v - z


def _requantize(xp: Any, acc: Any, mult: Any, zero_point: Any, out: np.dtype, backend: Any
                ) -> Any:
    lo, hi = _RANGES[out]
    v = xp.round(xp.astype(acc, xp.float32) * mult)
    zp = 0.0 if zero_point is None else xp.astype(xp.reshape(zero_point, ()), xp.float32)
    v = xp.clip(v + zp, float(lo), float(hi)) if zero_point is not None else \
        xp.clip(v, float(lo), float(hi))
    return xp.astype(v, backend.as_dtype(out))


def _multiplier(xp: Any, a_scale: Any, b_scale: Any, y_scale: Any, shape: tuple[int, ...]
                ) -> Any:
    """(a_scale * b_scale) / y_scale in float32, b_scale per tensor or per output channel."""
    m = xp.reshape(xp.astype(a_scale, xp.float32), ())
    b = xp.astype(b_scale, xp.float32)
    m = m * (xp.reshape(b, ()) if b.size == 1 else xp.reshape(b, shape))
    return m / xp.reshape(xp.astype(y_scale, xp.float32), ())


def _row_shape(A: Any, zp: Any) -> tuple[int, ...] | None:
    """MatMulInteger's a_zero_point: a scalar, or one per row of A."""
    if zp is None or zp.size == 1:
        return None
    return (zp.shape[0], 1) if zp.ndim == 1 else tuple(zp.shape)  # [M] or [..., M, 1]


@op("MatMulInteger", 10)
def MatMulInteger(A, B, a_zero_point=None, b_zero_point=None):
    xp = namespace(A)
    a = _centered(xp, A, a_zero_point, _row_shape(A, a_zero_point))
    b = _centered(xp, B, b_zero_point, (B.shape[-1],))
    return xp.matmul(a, b)


@op("QLinearMatMul", 10, 21)
class QLinearMatMul:
    """(a - a_zp) @ (b - b_zp), requantized with a_scale * b_scale / y_scale."""

    def __init__(self, ctx: KernelContext) -> None:
        self.backend = ctx.provider.backend

    def __call__(self, a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale,
                 y_zero_point=None):
        xp = namespace(a)
        acc = xp.matmul(_centered(xp, a, a_zero_point), _centered(xp, b, b_zero_point,
                                                                  (b.shape[-1],)))
        mult = _multiplier(xp, a_scale, b_scale, y_scale, (b.shape[-1],))
        out = self.backend.dtype_of(y_zero_point if y_zero_point is not None else a)
        return _requantize(xp, acc, mult, y_zero_point, out, self.backend)


@op("ConvInteger", 10)
class ConvInteger(Conv):
    """The int32 accumulators of (x - x_zp) convolved with (w - w_zp): Conv's implicit GEMM
    on int32 operands (padding is the zero point: 0 once it is removed)."""

    def __call__(self, x, w, x_zero_point=None, w_zero_point=None):
        xp = namespace(x)
        wc = _centered(xp, w, w_zero_point, (-1,) + (1,) * (w.ndim - 1))
        return self._forward(_centered(xp, x, x_zero_point), wc, None, None)


@op("QLinearConv", 10)
class QLinearConv(Conv):
    def __init__(self, ctx: KernelContext, *, auto_pad="NOTSET", dilations=None, group=1,
                 kernel_shape=None, pads=None, strides=None) -> None:
        super().__init__(ctx, auto_pad=auto_pad, dilations=dilations, group=group,
                         kernel_shape=kernel_shape, pads=pads, strides=strides)
        self.backend = ctx.provider.backend

    def __call__(self, x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale,
                 y_zero_point=None, B=None):
        xp = namespace(x)
        wc = _centered(xp, w, w_zero_point, (-1,) + (1,) * (w.ndim - 1))
        acc = self._forward(_centered(xp, x, x_zero_point), wc, B, None)
        nd = acc.ndim - 2
        mult = _multiplier(xp, x_scale, w_scale, y_scale, (1, -1) + (1,) * nd)
        out = self.backend.dtype_of(y_zero_point if y_zero_point is not None else x)
        return _requantize(xp, acc, mult, y_zero_point, out, self.backend)


# -- what onnxrun's optimizer fuses QDQ and dynamically quantized graphs into -------------------

MS = "com.microsoft"
ONNXRUN = "ai.onnxrun"


def _column(xp: Any, p: Any) -> Any:
    """A per-tensor or per-column parameter as a scalar or an (N,) row, float32."""
    p = xp.astype(p, xp.float32)
    return xp.reshape(p, ()) if p.size == 1 else xp.reshape(p, (-1,))


@op("QGemm", 1, domain=MS)
class QGemm:
    """(A - a_zp) @ (B - b_zp) + C in int32, then float32(acc) * (alpha a_scale b_scale), or
    requantized to y_scale / y_zero_point."""

    def __init__(self, ctx: KernelContext, *, alpha=1.0, transA=0, transB=0) -> None:
        self.alpha, self.transA, self.transB = float(alpha), bool(transA), bool(transB)
        self.backend = ctx.provider.backend

    def __call__(self, A, a_scale, a_zero_point, B, b_scale, b_zero_point=None, C=None,
                 y_scale=None, y_zero_point=None):
        xp = namespace(A)
        a = _centered(xp, xp.matrix_transpose(A) if self.transA else A, a_zero_point)
        Bm = xp.matrix_transpose(B) if self.transB else B
        acc = xp.matmul(a, _centered(xp, Bm, b_zero_point, (Bm.shape[-1],)))
        if C is not None and C.size:
            acc = acc + xp.astype(C, xp.int32)
        m = xp.reshape(xp.astype(a_scale, xp.float32), ())
        if self.alpha != 1.0:
            m = m * float(np.float32(self.alpha))
        m = m * _column(xp, b_scale)
        if y_scale is None:
            return xp.astype(acc, xp.float32) * m
        m = m / xp.reshape(xp.astype(y_scale, xp.float32), ())
        out = self.backend.dtype_of(y_zero_point) if y_zero_point is not None else \
            np.dtype(np.uint8)
        return _requantize(xp, acc, m, y_zero_point, out, self.backend)


def _scaled(xp: Any, acc: Any, mult: Any, bias: Any, dtype: Any) -> Any:
    Y = xp.astype(acc, xp.float32) * mult
    if bias is not None:
        Y = Y + xp.astype(bias, xp.float32)
    return Y if Y.dtype == dtype else xp.astype(Y, dtype)


@op("DynamicQuantizeMatMul", 1, domain=MS)
def DynamicQuantizeMatMul(A, B, b_scale, b_zero_point=None, bias=None):
    """A quantized to uint8 on the fly (per tensor, DynamicQuantizeLinear's codes), times the
    quantized B in int32, scaled back by a_scale * b_scale."""
    from .quantization import DynamicQuantizeLinear

    xp = namespace(A)
    codes, a_scale, zp = DynamicQuantizeLinear(A)
    acc = xp.matmul(_centered(xp, codes, zp), _centered(xp, B, b_zero_point, (B.shape[-1],)))
    return _scaled(xp, acc, a_scale * _column(xp, b_scale), bias, A.dtype)


@op("MatMulIntegerToFloat", 1, domain=MS)
def MatMulIntegerToFloat(A, B, a_scale, b_scale, a_zero_point=None, b_zero_point=None,
                         bias=None):
    xp = namespace(A)
    acc = xp.matmul(_centered(xp, A, a_zero_point),
                    _centered(xp, B, b_zero_point, (B.shape[-1],)))
    mult = xp.reshape(xp.astype(a_scale, xp.float32), ()) * _column(xp, b_scale)
    return _scaled(xp, acc, mult, bias, a_scale.dtype)


@op("ConvIntegerToFloat", 1, domain=ONNXRUN)
class ConvIntegerToFloat(Conv):
    """onnxrun's fusion ConvInteger -> Cast(float) -> Mul(scale) [-> Add(bias)] [-> Relu /
    Clip]: float32(acc) * scale (+ bias), with the graph's broadcasting."""

    def __init__(self, ctx: KernelContext, *, activation="", activation_params=None,
                 auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None,
                 strides=None) -> None:
        super().__init__(ctx, auto_pad=auto_pad, dilations=dilations, group=group,
                         kernel_shape=kernel_shape, pads=pads, strides=strides)
        self.clip = clip_bounds(activation, activation_params)

    def __call__(self, x, w, scale, x_zero_point=None, w_zero_point=None, bias=None):
        xp = namespace(x)
        wc = _centered(xp, w, w_zero_point, (-1,) + (1,) * (w.ndim - 1))
        Y = xp.astype(self._forward(_centered(xp, x, x_zero_point), wc, None, None),
                      xp.float32) * scale
        if bias is not None:
            Y = Y + bias
        if self.clip is not None:
            lo, hi = self.clip
            Y = xp.maximum(Y, xp.asarray(lo, dtype=Y.dtype, device=Y.device))
            if hi != np.inf:
                Y = xp.minimum(Y, xp.asarray(hi, dtype=Y.dtype, device=Y.device))
        return Y


def _fma32(xp: Any, x: Any, r: Any, c: Any) -> Any:
    """float32 x * r + c with one rounding, through float64 (as the CPU kernel computes it)."""
    return xp.astype(xp.astype(x, xp.float64) * xp.astype(r, xp.float64) +
                     xp.astype(c, xp.float64), xp.float32)


def _trailing_broadcast(shape: tuple[int, ...], out_shape: tuple[int, ...]) -> bool:
    return bool(out_shape) and out_shape[-1] > 1 and (not shape or shape[-1] == 1)


@op("QLinearAdd", 1, domain=MS)
class QLinearAdd:
    """MLAS QLinearAdd: c = fma(a, sa/sc, fma(b, sb/sc, zc - (za sa/sc + zb sb/sc))), the
    CPU provider's float32 arithmetic step for step (a scalar per inner span unfused)."""

    def __init__(self, ctx: KernelContext) -> None:
        self.backend = ctx.provider.backend

    def __call__(self, A, A_scale, A_zero_point, B, B_scale, B_zero_point, C_scale,
                 C_zero_point=None):
        xp = namespace(A)
        out_shape = tuple(np.broadcast_shapes(tuple(A.shape), tuple(B.shape)))

        def f(v: Any) -> Any:
            return xp.reshape(xp.astype(v, xp.float32), ())

        sc = f(C_scale)
        zc = f(C_zero_point) if C_zero_point is not None else 0.0
        p, sp, zp_, q, sq, zq = A, f(A_scale), f(A_zero_point), B, f(B_scale), f(B_zero_point)
        a_bcast = _trailing_broadcast(tuple(A.shape), out_shape)
        b_bcast = _trailing_broadcast(tuple(B.shape), out_shape)
        if a_bcast and not b_bcast:  # onnxruntime passes the span input first
            p, sp, zp_, q, sq, zq = q, sq, zq, p, sp, zp_
        rp, rq = sp / sc, sq / sc
        fixed = zc - (rp * zp_ + rq * zq)
        if a_bcast != b_bcast:
            v = _fma32(xp, p, rp, fixed + xp.astype(q, xp.float32) * rq)
        else:
            v = _fma32(xp, p, rp, _fma32(xp, q, rq, fixed))
        lo, hi = _RANGES[self.backend.dtype_of(A)]
        v = xp.clip(xp.round(xp.broadcast_to(v, out_shape)), float(lo), float(hi))
        return xp.astype(v, A.dtype)


@op("QLinearGlobalAveragePool", 1, domain=MS)
class QLinearGlobalAveragePool:
    """MLAS: the exact integer sum minus zp * count, requantized with
    x_scale / (y_scale * count)."""

    def __init__(self, ctx: KernelContext, *, channels_last=0) -> None:
        self.channels_last = bool(channels_last)
        self.backend = ctx.provider.backend

    def __call__(self, X, x_scale, x_zero_point, y_scale, y_zero_point):
        xp = namespace(X)
        if X.ndim < 3:
            raise ValueError("QLinearGlobalAveragePool: input rank must be at least 3")
        axes = tuple(range(1, X.ndim - 1)) if self.channels_last else tuple(range(2, X.ndim))
        count = 1
        for a in axes:
            count *= X.shape[a]
        s = xp.reshape(xp.astype(x_scale, xp.float32), ())
        scale = s / (xp.reshape(xp.astype(y_scale, xp.float32), ()) * float(count))
        acc = xp.sum(xp.astype(X, xp.int64), axis=axes, keepdims=True) - \
            xp.reshape(xp.astype(x_zero_point, xp.int64), ()) * count
        # the CPU's float64 accumulator, narrowed to float32 before the scale
        return _requantize(xp, xp.astype(acc, xp.float64), scale, y_zero_point,
                           self.backend.dtype_of(X), self.backend)
