"""com.microsoft quantization operators, computed as onnxruntime's CPU kernels compute them.

QuantizeLinear / DequantizeLinear (contrib versions), the QLinear* element-wise, pooling,
softmax and concat operators, QGemm, DynamicQuantizeMatMul, MatMulIntegerToFloat, MatMulNBits
(2/4/8-bit block-quantized weights) and DynamicQuantizeLSTM.

Where onnxruntime rounds in a particular order (MLAS kernels: float32 products, fused
multiply-adds, a sequential float sum, lookup tables of 256 entries for the unary operators) the
same order is followed, so results match it exactly or, rarely, by one quantization step.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any

import numpy as np

from .....dtypes import np_dtype
from .....proto import onnx
from ...kernels import KernelContext, op
from ...parallel import run_each, run_ranges, split, split_threads, threads_for
from ..conv import pad_spatial, window_geometry, window_slices
from ..quantization import (
    F32,
    F32_EXACT,
    DequantizeLinear,
    IntMatrix,
    QuantizeLinear,
    centered,
    centered_absmax,
    compiled_matmul,
    dynamic_quantize,
    int_matmul,
    int_range,
    mm,
    output_multiplier,
    requantize,
    scalar,
)

TensorProto = onnx.TensorProto

MS = "com.microsoft"
F64 = np.dtype(np.float64)

op("QuantizeLinear", 1, domain=MS)(QuantizeLinear)
op("DequantizeLinear", 1, domain=MS)(DequantizeLinear)


def _f32(value) -> np.float32:
    return np.float32(scalar(value, 0.0))


def _zp(value) -> int:
    return int(scalar(value, 0))


def mlas_quantize(v: np.ndarray, scale: np.float32, zero_point: int, dtype: np.dtype
                  ) -> np.ndarray:
    """MlasQuantizeLinear: round(v / scale) clamped to [min - zp, max - zp], plus zp."""
    lo, hi = int_range(dtype)
    q = np.asarray(np.true_divide(v, scale, dtype=F32))
    np.rint(q, out=q)
    np.clip(q, lo - zero_point, hi - zero_point, out=q)
    if zero_point:
        q += np.float32(zero_point)
    return q.astype(dtype)


def _fma32(x: np.ndarray, r: np.float32, c) -> np.ndarray:
    """float32 fused multiply-add x * r + c (one rounding), through float64."""
    return (x.astype(F64) * float(r) + np.asarray(c, F64)).astype(F32)


def _trailing_broadcast(shape: tuple[int, ...], out_shape: tuple[int, ...]) -> bool:
    """Whether an input is constant along the output's last axis (a scalar per inner span)."""
    return bool(out_shape) and out_shape[-1] > 1 and (not shape or shape[-1] == 1)


# -- element-wise -------------------------------------------------------------------------------


@op("QLinearAdd", 1, domain=MS)
def QLinearAdd(A, A_scale, A_zero_point, B, B_scale, B_zero_point, C_scale, C_zero_point=None):
    """MLAS QLinearAdd (AVX2): c = fma(a, sa/sc, fma(b, sb/sc, zc - (za*sa/sc + zb*sb/sc)))."""
    dtype = A.dtype
    out_shape = np.broadcast_shapes(A.shape, B.shape)
    sc = _f32(C_scale)
    zc = _zp(C_zero_point)
    p, sp, zp_, q, sq, zq = A, _f32(A_scale), _zp(A_zero_point), B, _f32(B_scale), _zp(B_zero_point)
    a_bcast = _trailing_broadcast(A.shape, out_shape)
    b_bcast = _trailing_broadcast(B.shape, out_shape)
    if a_bcast and not b_bcast:  # onnxruntime passes the span input first, the scalar second
        p, sp, zp_, q, sq, zq = q, sq, zq, p, sp, zp_
    rp, rq = np.float32(sp / sc), np.float32(sq / sc)
    fixed = np.float32(np.float32(zc) - (np.float32(rp * np.float32(zp_))
                                         + np.float32(rq * np.float32(zq))))
    if A.shape == B.shape:
        from ...compiled import int8_elementwise

        if not int8_elementwise.unavailable():
            c = int8_elementwise.qlinear_add(p, q, rp, rq, fixed)
            if c is not None:
                return c
    if a_bcast != b_bcast:  # scalar per span: added to the constant part first, unfused
        base = fixed + (q.astype(F32) * rq)
        v = _fma32(p, rp, base)
    else:
        v = _fma32(p, rp, _fma32(q, rq, fixed))
    v = np.asarray(np.rint(np.broadcast_to(v, out_shape)))
    lo, hi = int_range(dtype)
    np.clip(v, lo, hi, out=v)
    return v.astype(dtype)


@op("QLinearMul", 1, domain=MS)
def QLinearMul(A, A_scale, A_zero_point, B, B_scale, B_zero_point, C_scale, C_zero_point=None):
    """MLAS QLinearMul: round(float32((a - za) * (b - zb)) * (sa * sb / sc) + zc)."""
    dtype = A.dtype
    ratio = np.float32(np.float32(_f32(A_scale) * _f32(B_scale)) / _f32(C_scale))
    v = np.asarray(np.multiply(centered(A, _zp(A_zero_point)), centered(B, _zp(B_zero_point))))
    v *= ratio
    v += np.float32(_zp(C_zero_point))
    np.rint(v, out=v)
    lo, hi = int_range(dtype)
    np.clip(v, lo, hi, out=v)
    return v.astype(dtype)


def lookup_table(dtype: np.dtype, x_scale, x_zero_point, y_scale, y_zero_point, fn
                 ) -> np.ndarray:
    """The 256 outputs of quantize(fn(dequantize(x))), indexed by the byte of x."""
    codes = np.arange(256, dtype=np.uint8).view(dtype).astype(np.int32)
    deq = _f32(x_scale) * (codes - _zp(x_zero_point)).astype(F32)
    return mlas_quantize(fn(deq).astype(F32), _f32(y_scale), _zp(y_zero_point), dtype)


def _sigmoid(v: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-v.astype(F64)))


class _QLinearLookup:
    """x -> table[x]: a unary function of 8-bit values is a lookup in a 256-entry table, built
    at session creation when the scales and zero points are constant."""

    def fn(self, v: np.ndarray) -> np.ndarray:  # pragma: no cover - overridden
        raise NotImplementedError

    def _setup(self, ctx: KernelContext) -> None:
        self.table = None
        params = ctx.constants_of((1, 2, 3, 4))
        x_type = ctx.input_type(0)
        elem = x_type.tensor_type.elem_type if x_type is not None else 0
        if params is not None and elem in (TensorProto.UINT8, TensorProto.INT8):
            self.table = lookup_table(np_dtype(elem), *params, self.fn)

    def __call__(self, X, X_scale, X_zero_point=None, Y_scale=None, Y_zero_point=None):
        table = self.table
        if table is None or table.dtype != X.dtype:
            table = lookup_table(X.dtype, X_scale, X_zero_point, Y_scale, Y_zero_point, self.fn)
        return table[X.view(np.uint8)]


@op("QLinearSigmoid", 1, domain=MS)
class QLinearSigmoid(_QLinearLookup):
    def __init__(self, ctx: KernelContext) -> None:
        self._setup(ctx)

    def fn(self, v):
        return _sigmoid(v)


@op("QLinearLeakyRelu", 1, domain=MS)
class QLinearLeakyRelu(_QLinearLookup):
    def __init__(self, ctx: KernelContext, *, alpha=0.01) -> None:
        self.alpha = np.float32(alpha)
        self._setup(ctx)

    def fn(self, v):
        return np.where(v >= 0, v, self.alpha * v)


def _identity(v):
    return v


@op("QLinearConcat", 1, domain=MS)
class QLinearConcat:
    """Each input is copied when it shares the output's scale and zero point, else requantized
    through a lookup table (built once for constant parameters)."""

    def __init__(self, ctx: KernelContext, *, axis) -> None:
        self.axis = int(axis)
        n = ctx.num_inputs
        if n < 5 or (n - 2) % 3:
            raise ValueError("QLinearConcat takes Y_scale, Y_zero_point and (tensor, scale, "
                             "zero point) triples")
        self.tables: list[Any] = [None] * ((n - 2) // 3)
        y = ctx.constants_of((0, 1))
        if y is None:
            return
        for k in range(len(self.tables)):
            p = ctx.constants_of((3 + 3 * k, 4 + 3 * k))
            if p is not None and y[1] is not None:
                self.tables[k] = self._table(y[1].dtype, p[0], p[1], y[0], y[1])

    @staticmethod
    def _table(dtype, x_scale, x_zp, y_scale, y_zp):
        if _f32(x_scale) == _f32(y_scale) and _zp(x_zp) == _zp(y_zp):
            return "copy"
        return lookup_table(np.dtype(dtype), x_scale, x_zp, y_scale, y_zp, _identity)

    def __call__(self, Y_scale, Y_zero_point, *inputs):
        parts = []
        for k in range(len(inputs) // 3):
            x, s, z = inputs[3 * k:3 * k + 3]
            table = self.tables[k] if k < len(self.tables) else None
            if table is None:
                table = self._table(Y_zero_point.dtype, s, z, Y_scale, Y_zero_point)
            parts.append(x if isinstance(table, str) else table[x.view(np.uint8)])
        return np.concatenate(parts, axis=self.axis)


@op("QLinearWhere", 1, domain=MS)
class QLinearWhere:
    """Where on quantized X and Y: each requantized to Z's parameters through a lookup table
    (a copy when they share them; built once for constant parameters)."""

    def __init__(self, ctx: KernelContext) -> None:
        self.tables: list[Any] = [None, None]
        z = ctx.constants_of((7, 8))
        if z is None or z[1] is None:
            return
        for k, idx in enumerate(((2, 3), (5, 6))):
            p = ctx.constants_of(idx)
            if p is not None and p[1] is not None:
                self.tables[k] = QLinearConcat._table(z[1].dtype, p[0], p[1], z[0], z[1])

    def __call__(self, condition, X, x_scale, x_zero_point, Y, y_scale, y_zero_point, z_scale,
                 z_zero_point):
        parts = []
        for k, (v, s, zp) in enumerate(((X, x_scale, x_zero_point), (Y, y_scale, y_zero_point))):
            table = self.tables[k]
            if table is None:
                table = QLinearConcat._table(z_zero_point.dtype, s, zp, z_scale, z_zero_point)
            parts.append(v if isinstance(table, str) else table[v.view(np.uint8)])
        return np.where(condition, parts[0], parts[1])


# -- pooling ------------------------------------------------------------------------------------


def _global_avg(X: np.ndarray, x_scale, x_zp, y_scale, y_zp, axes) -> np.ndarray:
    """MLAS QLinearGlobalAveragePool: the exact integer sum minus zp * count, requantized with
    x_scale / (y_scale * count)."""
    count = int(np.prod([X.shape[a] for a in axes]))
    scale = np.float32(_f32(x_scale) / np.float32(_f32(y_scale) * np.float32(count)))
    acc = X.sum(axis=axes, keepdims=True, dtype=np.int64) - _zp(x_zp) * count
    return requantize(acc.astype(F64), scale, y_zp, X.dtype)


@op("QLinearGlobalAveragePool", 1, domain=MS)
def QLinearGlobalAveragePool(X, x_scale, x_zero_point, y_scale, y_zero_point, *,
                             channels_last=0):
    if X.ndim < 3:
        raise ValueError("QLinearGlobalAveragePool: input rank must be at least 3")
    axes = tuple(range(1, X.ndim - 1)) if channels_last else tuple(range(2, X.ndim))
    return _global_avg(X, x_scale, x_zero_point, y_scale, y_zero_point, axes)


@op("QLinearAveragePool", 1, domain=MS)
class QLinearAveragePool:
    """Dequantize, average each window in float32 (taps summed in row-major order, the pads
    skipped), divide by the count, quantize: onnxruntime's order of operations."""

    def __init__(self, ctx: KernelContext, *, auto_pad="NOTSET", ceil_mode=0, channels_last=0,
                 count_include_pad=0, kernel_shape, pads=None, strides=None) -> None:
        self.kernel = tuple(int(k) for k in kernel_shape)
        nd = len(self.kernel)
        self.auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else str(auto_pad)
        self.ceil_mode = int(ceil_mode)
        self.channels_last = bool(channels_last)
        self.include_pad = bool(count_include_pad)
        self.pads = tuple(int(p) for p in pads) if pads is not None and len(pads) else ()
        self.strides = tuple(int(s) for s in strides) if strides else (1,) * nd

    def __call__(self, X, x_scale, x_zero_point=None, y_scale=None, y_zero_point=None):
        if self.channels_last:
            X = np.moveaxis(X, -1, 1)
        nd = len(self.kernel)
        if X.ndim != nd + 2:
            raise ValueError(f"kernel_shape {list(self.kernel)} does not fit input rank {X.ndim}")
        spatial = X.shape[2:]
        ones = (1,) * nd
        heads, _, outs = window_geometry(spatial, self.kernel, self.strides, ones, self.pads,
                                         self.auto_pad, self.ceil_mode, dilated_same=False)
        if spatial == self.kernel and not any(self.pads) and not any(heads):
            Y = _global_avg(X, x_scale, x_zero_point, y_scale, y_zero_point,
                            tuple(range(2, X.ndim)))
        else:
            Xf = _f32(x_scale) * centered(X, _zp(x_zero_point))
            Xp = pad_spatial(Xf, heads, outs, self.kernel, self.strides, ones, 0)
            taps = (Xp[idx] for _, idx in window_slices(outs, self.kernel, self.strides, ones))
            Y = next(taps).copy()
            for tap in taps:  # row-major order, as onnxruntime sums a window
                Y += tap
            Y /= self._counts(spatial, heads, outs)
            Y /= _f32(y_scale)
            Y += np.float32(_zp(y_zero_point))
            np.rint(Y, out=Y)
            lo, hi = int_range(X.dtype)
            np.clip(Y, lo, hi, out=Y)
            Y = Y.astype(X.dtype)
        return np.ascontiguousarray(np.moveaxis(Y, 1, -1)) if self.channels_last else Y

    def _counts(self, spatial, heads, outs) -> np.ndarray:
        if self.include_pad:
            return np.float32(int(np.prod(self.kernel)))
        total = None
        for i, o in enumerate(outs):
            start = np.arange(o) * self.strides[i] - heads[i]
            c = np.minimum(start + self.kernel[i], spatial[i]) - np.maximum(start, 0)
            total = c if total is None else np.multiply.outer(total, c)
        return total.astype(F32)


# -- softmax ------------------------------------------------------------------------------------


def _softmax_table(x_scale: np.float32, reduce_len: int) -> np.ndarray:
    """exp((i - 255 + shift) * x_scale) for i in 0..255, shifted so a row sum stays finite."""
    fmax = np.finfo(F32).max
    shift = math.log(float(np.float32(fmax / np.float32(reduce_len))))
    shift = max(0.0, shift - 5.0) / float(x_scale)
    i = np.arange(256, dtype=F64)
    return np.exp((i - 255.0 + shift) * float(x_scale)).astype(F32)


@op("QLinearSoftmax", 1, domain=MS)
class QLinearSoftmax:
    """onnxruntime's QLinearSoftmax: exponentials from a table relative to the row maximum, a
    sequential float32 sum, and y = round(e * floor(1 / y_scale) / sum) + y_zp."""

    def __init__(self, ctx: KernelContext, *, axis=None, opset) -> None:
        self.opset = int(opset)
        # without the attribute: Softmax's own default, 1 before opset 13 and -1 from it on
        self.axis = int(axis) if axis is not None else (1 if self.opset < 13 else -1)

    def __call__(self, X, X_scale, x_zero_point=None, y_scale=None, y_zero_point=None):
        if X.size == 0:
            return X.copy()
        axis = self.axis + X.ndim if self.axis < 0 else self.axis
        if self.opset < 13:
            rows = X.reshape(int(np.prod(X.shape[:axis])), -1)
        else:
            rows = np.moveaxis(X, axis, -1)
        D = rows.shape[-1]
        table = _softmax_table(_f32(X_scale), D)
        xi = rows.astype(np.int32)
        xi -= xi.max(axis=-1, keepdims=True)
        xi += 255
        e = table[xi]
        total = np.cumsum(e, axis=-1, dtype=F32)[..., -1:]
        ys = np.float32(math.floor(float(np.float32(1.0) / _f32(y_scale))))
        v = e * ys
        v /= total
        np.rint(v, out=v)
        v += np.float32(_zp(y_zero_point))
        lo, hi = int_range(X.dtype)
        Y = np.clip(v, lo, hi, out=v).astype(X.dtype)
        if self.opset < 13:
            return Y.reshape(X.shape)
        return np.ascontiguousarray(np.moveaxis(Y, -1, axis))


# -- matrix products ----------------------------------------------------------------------------


def _b_matrix(B: np.ndarray, zero_point, trans: bool = False,
              prepack: int | None = None) -> IntMatrix:
    """``prepack``: the kernel's thread count when B is a constant (packed for the compiled
    kernel once)."""
    Bm = B.T if trans else B
    zp = None if zero_point is None else np.asarray(zero_point)
    if zp is not None and zp.size > 1:
        zp = zp.reshape(-1)
    return IntMatrix(Bm, zp, prepack=prepack)


def _column_param(p: np.ndarray) -> np.ndarray:
    """A per-tensor or per-column parameter as a scalar or an (N,) row."""
    return p.reshape(()) if p.size == 1 else p.reshape(-1)


@op("QGemm", 1, domain=MS)
class QGemm:
    """(A - a_zp) @ (B - b_zp) + C in int32, then float32 (alpha * a_scale * b_scale) or
    requantized to y_scale / y_zero_point."""

    def __init__(self, ctx: KernelContext, *, alpha=1.0, transA=0, transB=0) -> None:
        self.alpha = float(alpha)
        self.transA = bool(transA)
        self.transB = bool(transB)
        self.B = None
        c = ctx.constants_of((3, 5))
        if c is not None and c[0] is not None:
            self.B = _b_matrix(c[0], c[1], self.transB, prepack=split_threads(ctx))

    def __call__(self, A, a_scale, a_zero_point, B, b_scale, b_zero_point=None, C=None,
                 y_scale=None, y_zero_point=None):
        Am = A.T if self.transA else A
        Bm = self.B if self.B is not None else _b_matrix(B, b_zero_point, self.transB)
        zp = _zp(a_zero_point)
        acc = compiled_matmul(Am, zp, Bm)  # exact int32
        if acc is None:
            amax = centered_absmax(Am, zp)
            acc = int_matmul(centered(Am, zp), amax, Bm)
            if C is not None and C.size:
                if acc.dtype == F32 and amax * Bm.colsum + float(np.abs(C).max()) >= F32_EXACT:
                    acc = acc.astype(F64)
                acc = acc + C.astype(acc.dtype)
        elif C is not None and C.size:
            acc += C.astype(np.int32)
        mult = output_multiplier(a_scale, _column_param(b_scale), y_scale, self.alpha)
        if y_scale is None:
            Y = acc if acc.dtype == F32 else acc.astype(F32)
            Y *= mult
            return Y
        out = y_zero_point.dtype if y_zero_point is not None else np.dtype(np.uint8)
        return requantize(acc, mult, y_zero_point, out)


def dynamic_quantize_codes(A: np.ndarray, out: np.ndarray | None = None
                           ) -> tuple[np.ndarray, np.float32, int]:
    """``dynamic_quantize`` as uint8 codes (``q + zp``, into ``out`` if given) on the compiled
    kernel: for products on the compiled GEMM, whose CPU features include the quantizer's."""
    from ...compiled.quantize import dynamic_quantize_u8

    return dynamic_quantize_u8(A, 1.0, out)


def _scaled_output(acc: np.ndarray, mult, bias, out_dtype) -> np.ndarray:
    Y = acc if acc.dtype == F32 else acc.astype(F32)
    Y *= mult
    if bias is not None:
        Y += bias.astype(F32)
    return Y if Y.dtype == out_dtype else Y.astype(out_dtype)


class _MatMulToFloat:
    def _setup(self, ctx: KernelContext, b_index: int, zp_index: int) -> None:
        self.B = None
        c = ctx.constants_of((b_index, zp_index))
        if c is not None and c[0] is not None:
            self.B = _b_matrix(c[0], c[1], prepack=split_threads(ctx))

    def _compiled(self, A8: np.ndarray, a_zero_point, mult, bias, out_dtype):
        """The product on the compiled kernel, scale and bias in its epilogue; None when B is
        not packed."""
        if self.B is None or self.B.packed is None:
            return None
        b = None if bias is None else bias.astype(F32, copy=False)
        Y = compiled_matmul(A8, a_zero_point, self.B, scale=mult, bias=b)
        return Y if Y.dtype == out_dtype else Y.astype(out_dtype)


@op("DynamicQuantizeMatMul", 1, domain=MS)
class DynamicQuantizeMatMul(_MatMulToFloat):
    """A quantized to uint8 on the fly (per tensor), times the quantized B, scaled back."""

    def __init__(self, ctx: KernelContext) -> None:
        self._setup(ctx, 1, 3)

    def __call__(self, A, B, b_scale, b_zero_point=None, bias=None):
        if self.B is not None and self.B.packed is not None:
            codes, a_scale, zp = dynamic_quantize_codes(A)
            mult = (a_scale * _column_param(b_scale).astype(F32)).astype(F32)
            return self._compiled(codes, zp, mult, bias, A.dtype)
        Bm = self.B if self.B is not None else _b_matrix(B, b_zero_point)
        Aq, a_scale, zp = dynamic_quantize(A)
        acc = int_matmul(Aq, float(max(zp, 255 - zp)), Bm)
        mult = (a_scale * _column_param(b_scale).astype(F32)).astype(F32)
        return _scaled_output(acc, mult, bias, A.dtype)


@op("MatMulIntegerToFloat", 1, domain=MS)
class MatMulIntegerToFloat(_MatMulToFloat):
    def __init__(self, ctx: KernelContext) -> None:
        self._setup(ctx, 1, 5)

    def __call__(self, A, B, a_scale, b_scale, a_zero_point=None, b_zero_point=None, bias=None):
        mult = (_f32(a_scale) * _column_param(b_scale).astype(F32)).astype(F32)
        Y = self._compiled(A, a_zero_point, mult, bias, a_scale.dtype)
        if Y is not None:
            return Y
        Bm = self.B if self.B is not None else _b_matrix(B, b_zero_point)
        zp = _zp(a_zero_point)
        acc = int_matmul(centered(A, zp), centered_absmax(A, zp), Bm)
        return _scaled_output(acc, mult, bias, a_scale.dtype)


# -- MatMulNBits --------------------------------------------------------------------------------


def _unpack_bits(packed: np.ndarray, bits: int) -> np.ndarray:
    """Little-endian bit fields of each byte along a new last axis (low bits first)."""
    if bits == 8:
        return packed[..., None]
    per = 8 // bits
    shifts = np.arange(per, dtype=np.uint8) * bits
    return (packed[..., None] >> shifts) & np.uint8((1 << bits) - 1)


def nbits_weight(B: np.ndarray, scales: np.ndarray, zero_points, g_idx, K: int, N: int,
                 block_size: int, bits: int) -> np.ndarray:
    """The dequantized (K, N) float32 weight of MatMulNBits: (q - zp) * scale per block of K
    (or per group g_idx[k]); the zero point defaults to 2**(bits - 1). With g_idx and packed
    zero points onnxruntime 1.32 uses 8 for every zero point; the defined formula is used here."""
    if bits not in (2, 4, 8):
        raise ValueError(f"MatMulNBits: bits={bits} is not supported (2, 4 or 8)")
    kb = -(-K // block_size)
    q = _unpack_bits(B.reshape(N, kb, -1), bits).reshape(N, kb, block_size).astype(F32)
    s = scales.reshape(N, kb).astype(F32)
    if zero_points is None:
        z = np.full((N, kb), float(1 << (bits - 1)), F32)
    elif zero_points.dtype == np.uint8:
        z = _unpack_bits(zero_points.reshape(N, -1), bits).reshape(N, -1)[:, :kb].astype(F32)
    else:
        z = zero_points.reshape(N, kb).astype(F32)
    if g_idx is not None and g_idx.size:  # act-order: k's parameters are those of group g_idx[k]
        groups = g_idx.reshape(-1)[:K].astype(np.intp)
        W = (q.reshape(N, -1)[:, :K] - z[:, groups]) * s[:, groups]
    else:
        W = ((q - z[..., None]) * s[..., None]).reshape(N, -1)[:, :K]
    return np.ascontiguousarray(W.T)


def int8_blocks(A: np.ndarray, block_size: int) -> np.ndarray:
    """A (float32, K last) as MLAS's CompInt8 path sees it: each block of ``block_size`` along K
    quantized to int8 with a symmetric scale amax / 127 (codes round-half-even of a * (127 /
    amax), an all-zero block gives zeros), and given back dequantized. A product with these
    values equals MLAS's int8 block products summed in int32 and scaled, up to float rounding."""
    K = A.shape[-1]
    kb = -(-K // block_size)
    pad = kb * block_size - K
    blocks = A.reshape(-1, K)
    if pad:
        blocks = np.pad(blocks, ((0, 0), (0, pad)))
    blocks = blocks.reshape(-1, kb, block_size)
    amax = np.abs(blocks).max(axis=-1, keepdims=True)
    with np.errstate(divide="ignore"):
        inv = np.where(amax != 0, np.float32(127) / amax, np.float32(0)).astype(F32)
    q = np.rint(blocks * inv)
    q *= amax / np.float32(127)
    return q.reshape(-1, kb * block_size)[:, :K].reshape(A.shape)


def int8_a_block(bits: int, block_size: int) -> int | None:
    """The block along K in which MLAS's CompInt8 path (onnxruntime 1.32, x86-64) quantizes A,
    or None where it has no such path and the product is float32: 4 and 8 bits, A in blocks of
    the weight's up to 256 (larger weight blocks still quantize A per 256); 2 bits in blocks of
    32 to 128 only. Read off onnxruntime's results; tests/test_ops_quantization.py checks
    every block size against it."""
    if bits in (4, 8) and block_size >= 16:
        return min(block_size, 256)
    if bits == 2 and block_size in (32, 64, 128):
        return block_size
    return None


@op("MatMulNBits", 1, domain=MS)
class MatMulNBits:
    """Y = A @ dequantize(B) (+ bias).

    ``accuracy_level`` as onnxruntime's CPU provider reads it: 4 (int8 compute) quantizes A to
    int8 per block of K before the product, as MLAS's CompInt8 kernels do, wherever MLAS has
    that path (int8_a_block; zero points absent or packed uint8, no g_idx); otherwise, and at
    levels 0-3, the product is in float32.

    Constant 4-bit weights (zero points absent or packed, no g_idx) run on compiled kernels
    with MLAS's arithmetic to the bit, for any number of rows (see compiled/nbits_gemm.py for
    why it matters): at level 4 in blocks of 32 (the builder's default) compiled/nbits_gemm.py,
    in blocks of 16, 64-256 compiled/nbits_blocks.py, the weight kept packed (no float32 copy);
    at levels 0-3 in blocks of 16-256 nbits_blocks.py's float kernels on the weight dequantized
    once. The columns are split over the session's threads.
    Otherwise the weight is dequantized once, at session creation, and every run is one
    float32 GEMM."""

    # rows of A per pass over the weight (their int8 codes stay in cache)
    ROWS = 64
    # packed weight bytes from which one row's product is split over the threads: waking a
    # worker costs 20-80 us (parallel.py), a 1 MiB weight streams in ~100-200 us
    SPLIT_BYTES = 1 << 20
    # the same for one row on compiled/spin.py's spinning workers (a hand-off of ~1 us when a
    # worker spins, a wake of 5-200 us when it sleeps): a 512 KiB weight is ~30-60 us of work.
    # Below it the split gained <= 2 us at best (896x896, 392 KiB: 24.4 -> 22.3 us) and a small
    # model's products (256 x 2012, 251 KiB) kept a worker spinning, or woke it, every token
    SPLIT_ROW_BYTES = 1 << 19

    def __init__(self, ctx: KernelContext, *, K, N, block_size, accuracy_level=0, bits=4,
                 weight_prepacked=0) -> None:
        self.K, self.N = int(K), int(N)
        self.row1 = None  # nbits_gemm's one call for a decode step's row where unsplit (_gemm)
        self.block_size, self.bits = int(block_size), int(bits)
        if int(weight_prepacked):
            raise ValueError("MatMulNBits: prepacked weights are specific to other providers")
        self.a_block = int8_a_block(self.bits, self.block_size) if int(
            accuracy_level) == 4 else None
        self.W = self.packed = self.gemm = self.spin = self.blocks = None
        self.bias_computed = False  # a bias input that is not a constant (nbits_gemm)
        self.threads = threads_for(ctx)
        c = ctx.constants_of((1, 2, 3, 4))
        if c is None or c[0] is None or c[1] is None or not c[0].size:
            return
        B, scales, zp, g_idx = c
        if g_idx is None and (zp is None or zp.dtype == np.uint8) and \
                self._blocks(ctx, B, scales, zp):
            return
        if self.a_block is not None and g_idx is None and (zp is None or zp.dtype == np.uint8):
            from ...compiled import nbits_gemv

            if self.block_size == 32 and nbits_gemv.supported(self.bits, self.block_size) and \
                    nbits_gemv.unavailable() is None:
                kb = -(-self.K // self.block_size)
                self.packed = np.ascontiguousarray(B.reshape(self.N, kb, self.block_size // 2))
                self.scales = np.ascontiguousarray(scales.reshape(self.N, kb), dtype=F32)
                z = np.float32(8) if zp is None else _unpack_bits(
                    zp.reshape(self.N, -1), 4).reshape(self.N, -1)[:, :kb].astype(F32)
                self.zs = np.ascontiguousarray((z * self.scales).T)  # (kb, N)
                self.gemv = nbits_gemv.Gemv(self.packed, self.scales, self.block_size,
                                            None if zp is None else self.zs.T)
                self.gemm = self._gemm(ctx, zp)
                return
        self.W = nbits_weight(B, scales, zp, g_idx, self.K, self.N, self.block_size, self.bits)

    def _blocks(self, ctx: KernelContext, B, scales, zp) -> bool:
        """compiled/nbits_blocks.py where MLAS has the product and nbits_gemm does not: level 4
        in blocks of 16, 64-256 (CompInt8), levels 0-3 in blocks of 16-256 (CompFp32)."""
        from ...compiled import nbits_blocks

        if self.a_block is not None:
            if not nbits_blocks.supported_int8(self.bits, self.block_size):
                return False
        elif not nbits_blocks.supported_fp32(self.bits, self.block_size):
            return False
        if nbits_blocks.unavailable() is not None:
            return False
        kb = -(-self.K // self.block_size)
        self.packed = np.ascontiguousarray(B.reshape(self.N, kb, self.block_size // 2))
        self.scales = np.ascontiguousarray(scales.reshape(self.N, kb), dtype=F32)
        zq = None if zp is None else np.ascontiguousarray(_unpack_bits(
            zp.reshape(self.N, -1), 4).reshape(self.N, -1)[:, :kb])
        if self.a_block is None:  # from the packed weight, rows a dequantized panel at a time
            self.blocks = nbits_blocks.Fp32(self.K, self.packed, self.scales, self.block_size, zq)
            return True
        z = np.float32(8) if zq is None else zq.astype(F32)
        zs = np.ascontiguousarray((z * self.scales).T)  # (kb, N)
        self.blocks = nbits_blocks.Int8(self.packed, self.scales, self.block_size, zq, zs)
        bias = ctx.constants_of((5,)) if ctx.has_input(5) else [None]
        if bias is not None:  # a constant bias (or none): one row in one call (row)
            self.blocks.bind_bias(None if bias[0] is None or not bias[0].size else
                                  np.ascontiguousarray(bias[0].reshape(-1), dtype=F32))
            self._spin()
        return True

    def _spin(self) -> None:
        """compiled/spin.py's workers for one row's product (a decode step's) at 2+ threads."""
        if self.threads > 1:
            from ...compiled import spin

            if spin.unavailable() is None:
                self.spin = spin.pool()
                self.spin_parts = min(self.threads, self.spin.size + 1)

    def _gemm(self, ctx: KernelContext, zp):
        """The MLAS-exact kernel for many rows (blocks of 32), its bias baked in where the
        bias is a constant (MLAS adds it before the zero points' share); else None."""
        from ...compiled import nbits_gemm

        if not nbits_gemm.supported(self.bits, self.block_size) or \
                nbits_gemm.unavailable() is not None:
            return None
        bias = ctx.constants_of((5,)) if ctx.has_input(5) else [None]
        # a computed bias: passed to every call (_exact), as MLAS adds it, inside the kernel
        self.bias_computed = bias is None
        b = np.zeros(self.N, F32) if bias is None or bias[0] is None or not bias[0].size else \
            np.ascontiguousarray(bias[0].reshape(-1), dtype=F32)
        zq = None if zp is None else np.ascontiguousarray(_unpack_bits(
            zp.reshape(self.N, -1), 4).reshape(self.N, -1)[:, :self.scales.shape[1]])
        self._spin()
        # zp * scale, (kb, N): the GEMV's array, shared (the kernel negates it as MLAS stores it)
        gemm = nbits_gemm.Gemm(self.packed, self.scales, self.zs, b, zq)
        if gemm.K == self.K and not self.bias_computed and \
                (self.spin is None or self.packed.nbytes < self.SPLIT_ROW_BYTES):
            # a decode step's whole-block row on this thread: (fn, consts, address, the
            # shapes of the last row's A and Y, one row of K floats)
            one = gemm.one_row()
            self.row1 = None if one is None else (*one, ((), ()))
        return gemm

    @property
    def uses_compiled_gemm(self) -> bool:  # read by the session: BLAS held to one thread
        return self.packed is not None or self.blocks is not None

    @property
    def calls_blas(self) -> bool:  # only the float32 product of a dequantized weight does
        return not self.uses_compiled_gemm

    def __call__(self, A, B, scales, zero_points=None, g_idx=None, bias=None):
        row1 = self.row1
        if row1 is not None:
            fn, consts, address, shapes = row1
            if A.shape == shapes[0] and A.dtype == F32 and A.flags.c_contiguous:
                Y = np.empty(shapes[1], F32)  # the last row's shapes again: a decode step's
                fn(address(A), address(Y), consts)
                return Y
        if A.shape[-1] != self.K:
            raise ValueError(f"MatMulNBits: A's last dimension {A.shape[-1]} != K={self.K}")
        if row1 is not None and A.size == self.K and A.dtype == F32 and A.flags.c_contiguous:
            Y = np.empty(A.shape[:-1] + (self.N,), F32)  # Gemm.row's call, less its checks
            fn(address(A), address(Y), consts)
            # its shapes remembered (the tuple swapped whole): the next step's call above
            self.row1 = (fn, consts, address, (A.shape, Y.shape))
            return Y
        if A.size == self.K and self.blocks is not None and self.a_block is not None:
            Y = np.empty(A.shape[:-1] + (self.N,), F32)  # a decode step, bias bound
            if self.spin is not None and self.packed.nbytes >= self.SPLIT_ROW_BYTES:
                if self.blocks.row_parts(A, Y, self.spin_parts, self.spin):
                    return Y
            elif (self.threads == 1 or self.packed.nbytes < self.SPLIT_BYTES) and \
                    self.blocks.row(A, Y):
                return Y
        if A.size == self.K and self.gemm is not None and A.dtype == F32 and \
                not self.bias_computed:  # a decode step
            Y = np.empty(A.shape[:-1] + (self.N,), F32)
            if self.spin is not None and self.packed.nbytes >= self.SPLIT_ROW_BYTES:
                self.gemm.row_parts(A, Y, self.spin_parts, self.spin)
            else:
                self.gemm.row(A, Y)
            return Y
        out_dtype = A.dtype
        Af = A if A.dtype == F32 else A.astype(F32)
        if B.size == 0:  # an omitted projection: zeros, or the bias
            Y = np.zeros(A.shape[:-1] + (self.N,), F32)
        elif self.blocks is not None:  # MLAS's arithmetic, bias included
            Y = self._exact_blocks(Af.reshape(-1, self.K), bias).reshape(A.shape[:-1] + (self.N,))
            return Y if Y.dtype == out_dtype else Y.astype(out_dtype)
        elif self.packed is not None:
            A2 = Af.reshape(-1, self.K)
            if self.gemm is not None:  # MLAS's arithmetic for any rows, bias included
                Y = self._exact(A2, bias if self.bias_computed else None).reshape(
                    A.shape[:-1] + (self.N,))
                return Y if Y.dtype == out_dtype else Y.astype(out_dtype)
            Y = self._packed(A2).reshape(A.shape[:-1] + (self.N,))
        else:
            W = self.W if self.W is not None else nbits_weight(
                B, scales, zero_points, g_idx, self.K, self.N, self.block_size, self.bits)
            int8 = self.a_block is not None and g_idx is None and (
                zero_points is None or zero_points.dtype == np.uint8)
            Y = mm(int8_blocks(Af, self.a_block) if int8 else Af, W)
        if bias is not None and bias.size:
            Y += bias.astype(F32)
        return Y if Y.dtype == out_dtype else Y.astype(out_dtype)

    def _exact(self, A: np.ndarray, bias=None) -> np.ndarray:
        """Rows on compiled/nbits_gemm.py, bias (bound, or ``bias`` computed) and zero points
        included."""
        M, N = A.shape[0], self.N
        qa, sa4, asum = self.gemm.quantize(A)
        Y = np.empty((M, N), F32)
        gemm = self.gemm
        if bias is not None:
            bias = np.ascontiguousarray(np.broadcast_to(bias.reshape(-1), (N,)), dtype=F32)
            gemm = partial(gemm, bias=bias)
        if self.packed.nbytes * M < self.SPLIT_BYTES and M <= self.ROWS:
            gemm(qa, sa4, asum, Y, 0, N)
            return Y
        chunks = []  # slices of A's codes that stay in cache; one row alone only as MLAS has it
        for r0, r1 in self._mlas_ranges(M):
            starts = list(range(r0, r1, self.ROWS))
            if len(starts) > 1 and r1 - starts[-1] == 1:
                starts.pop()  # a range's last row with the rows before it (MLAS's M > 1 kernel)
            for m0, m1 in zip(starts, [*starts[1:], r1], strict=True):
                chunks.append((qa[m0:m1], sa4[m0:m1], asum[m0:m1], Y[m0:m1]))

        def columns(n0: int, n1: int) -> None:  # one hand-off per thread
            for chunk in chunks:
                gemm(*chunk, n0, n1)

        run_ranges(columns, self.gemm.ranges(self.threads))
        return Y

    # MLAS hands a thread pool's products out in ranges of 128 rows: a range of one row takes
    # its M == 1 kernel (onnxruntime with one intra-op thread has no pool: one range)
    MLAS_ROWS = 128

    def _mlas_ranges(self, M: int) -> list[tuple[int, int]]:
        if self.threads > 1 and M > self.MLAS_ROWS:
            return [(m, min(m + self.MLAS_ROWS, M)) for m in range(0, M, self.MLAS_ROWS)]
        return [(0, M)]

    def _exact_blocks(self, A: np.ndarray, bias) -> np.ndarray:
        """compiled/nbits_blocks.py's product for the rows of A (M, K), bias included."""
        M, N = A.shape[0], self.N
        kernel = self.blocks
        if bias is not None:
            bias = np.ascontiguousarray(bias.reshape(-1), dtype=F32) if bias.size else None
        int8 = self.a_block is not None
        if int8:
            Y = np.empty((M, N), F32)
            width, grain = N, 4
        else:
            if bias is not None and kernel.Np != N:
                bias = np.concatenate([bias, np.zeros(kernel.Np - N, F32)])
            A = np.ascontiguousarray(A, dtype=F32)
            Y = np.empty((M, kernel.Np), F32)
            width, grain = kernel.Np, 16
        rows = self._mlas_ranges(M)
        weight_bytes = self.packed.nbytes
        for m0, m1 in rows:
            one = m1 - m0 == 1
            a, y = A[m0:m1], Y[m0:m1]
            if int8:
                qa, sa, asum = kernel.quantize(a)

                def part(n0, n1, qa=qa, sa=sa, asum=asum, y=y):
                    kernel(qa, sa, asum, bias, y, n0, n1)
            else:
                def part(n0, n1, a=a, y=y, one=one):
                    kernel(a, bias, y, n0, n1, one)
            if self.threads == 1 or weight_bytes * (m1 - m0) < self.SPLIT_BYTES:
                part(0, width)
            else:
                units = -(-width // grain)
                run_ranges(part, [(a0 * grain, min(a1 * grain, width))
                                  for a0, a1 in split(units, self.threads)])
        return Y if Y.shape[1] == N else np.ascontiguousarray(Y[:, :N])

    def _packed(self, A: np.ndarray) -> np.ndarray:
        """The level-4 product from the packed weight (see the class's doc)."""
        M, N = A.shape[0], self.N
        qa, sa, asum = self.gemv.quantize(A)
        Y = np.empty((M, N), F32)
        gemv = self.gemv
        if M < 4:  # decoding: eight columns per pass, the zero points' share inside
            if self.packed.nbytes * M < self.SPLIT_BYTES:
                gemv.decode(qa, sa, asum, Y, 0, N)
            else:
                run_ranges(lambda n0, n1: gemv.decode(qa, sa, asum, Y, n0, n1),
                           split(N, self.threads))
            return Y
        if self.packed.nbytes * M < self.SPLIT_BYTES and M <= self.ROWS:  # not worth a hand-off
            gemv(qa, sa, Y, 0, N)
        else:
            ranges = split(N, self.threads)
            for m0 in range(0, M, self.ROWS):  # a slice of A's codes stays in cache
                qs, ss, ys = (x[m0:m0 + self.ROWS] for x in (qa, sa, Y))
                run_ranges(lambda n0, n1, qs=qs, ss=ss, ys=ys: gemv(qs, ss, ys, n0, n1), ranges)
        Y -= asum @ self.zs  # the zero points' share
        return Y


@op("GatherBlockQuantized", 1, domain=MS)
class GatherBlockQuantized:
    """Gather from a block-quantized table: (data - zero_point) * scale per block of
    ``block_size`` along ``quantize_axis`` (zero point 0 for int4 data and 8 for uint4 without
    one), dequantized once for a constant table."""

    def __init__(self, ctx: KernelContext, *, block_size=128, gather_axis=0, quantize_axis=1,
                 bits=4) -> None:
        self.block_size = int(block_size)
        self.gather_axis, self.quantize_axis = int(gather_axis), int(quantize_axis)
        self.table = None
        c = ctx.constants_of((0, 2, 3))
        if c is not None and c[0] is not None and c[1] is not None:
            self.table = self._dequantize(c[0], c[1], c[2])

    def _dequantize(self, data, scales, zero_points) -> np.ndarray:
        ax = self.quantize_axis % data.ndim
        n = data.shape[ax]
        s = np.repeat(scales, self.block_size, axis=ax).take(range(n), axis=ax)
        if zero_points is None:
            z = 8.0 if str(data.dtype) == "uint4" else 0.0
        else:
            z = np.repeat(zero_points.astype(F32), self.block_size, axis=ax).take(range(n),
                                                                                  axis=ax)
        return ((data.astype(F32) - z) * s.astype(F32)).astype(scales.dtype)

    def __call__(self, data, indices, scales, zero_points=None):
        table = self.table if self.table is not None else self._dequantize(data, scales,
                                                                           zero_points)
        ax = self.gather_axis % table.ndim
        idx = np.where(indices < 0, indices + table.shape[ax], indices)
        return np.take(table, idx, axis=ax)


# bitsandbytes' code values: FP4 (e2m1, sign in the high bit) and NF4 (normal-float quantiles)
FP4_CODE = np.array([0.0, 0.0052083333, 0.6666667, 1.0, 0.33333334, 0.5, 0.16666667, 0.25,
                     -0.0, -0.0052083333, -0.6666667, -1.0, -0.33333334, -0.5, -0.16666667,
                     -0.25], F32)
NF4_CODE = np.array([-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
                     -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
                     0.07958029955625534, 0.16093020141124725, 0.24611230194568634,
                     0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
                     0.7229568362236023, 1.0], F32)
BNB4_CODES = {0: FP4_CODE, 1: NF4_CODE}


@op("MatMulBnb4", 1, domain=MS)
class MatMulBnb4:
    """Y = A @ B with B in bitsandbytes' FP4 / NF4 blocks (the transposed weight flattened,
    two 4-bit code indices a byte, high nibble first, times each block's absmax); a constant B
    is dequantized once."""

    def __init__(self, ctx: KernelContext, *, K, N, block_size, quant_type,
                 training_mode=0, transB=1) -> None:
        self.K, self.N, self.block_size = int(K), int(N), int(block_size)
        if int(quant_type) not in BNB4_CODES:
            raise ValueError(f"MatMulBnb4: quant_type={quant_type} is not 0 (FP4) or 1 (NF4)")
        self.code = BNB4_CODES[int(quant_type)]
        self.W = None
        c = ctx.constants_of((1, 2))
        if c is not None and c[0] is not None and c[1] is not None:
            self.W = self._weight(c[0], c[1])

    def _weight(self, B: np.ndarray, absmax: np.ndarray) -> np.ndarray:
        n = self.N * self.K
        q = np.stack([B >> 4, B & 0x0F], axis=-1).reshape(-1)[:n]
        scale = np.repeat(absmax.astype(F32), self.block_size)[:n]
        return np.ascontiguousarray((self.code[q] * scale).reshape(self.N, self.K).T)

    def __call__(self, A, B, absmax):
        W = self.W if self.W is not None else self._weight(B, absmax)
        Y = np.matmul(A.astype(F32, copy=False), W)
        return Y if A.dtype == F32 else Y.astype(A.dtype)


# -- DynamicQuantizeLSTM ------------------------------------------------------------------------


class _QuantWeights:
    """One direction's quantized W or R: the 8-bit [K, 4H] matrix and its scales; ``prepack``
    (the kernel's thread count, for constant weights) packs it for the compiled GEMM."""

    def __init__(self, q: np.ndarray, scale: np.ndarray, zero_point: np.ndarray,
                 prepack: int | None = None) -> None:
        self.mat = IntMatrix(q, zero_point.reshape(-1) if zero_point.size > 1 else zero_point,
                             prepack=prepack)
        self.packed = self.mat.packed  # a PackedB, or None: the numpy path
        self.scale = scale.astype(F32).reshape(-1) if scale.size > 1 else _f32(scale)


def _lstm_weights(W, W_scale, W_zp, R, R_scale, R_zp, D, prepack=None):
    def per_dir(p, d):
        p = np.asarray(p)
        return p.reshape(D, -1)[d]

    return [(_QuantWeights(W[d], per_dir(W_scale, d), per_dir(W_zp, d), prepack),
             _QuantWeights(R[d], per_dir(R_scale, d), per_dir(R_zp, d), prepack))
            for d in range(D)]


def _qgemm_dynamic(A2: np.ndarray, w: _QuantWeights, wf: np.ndarray | None) -> np.ndarray:
    """onnxruntime's quantized LSTM GEMM: A quantized to uint8 per call (per tensor); ``wf`` is
    ``w.mat.float32()``, built once per run for all time steps (None when ``w`` is packed)."""
    if w.packed is not None:  # the same integers and scale product, on the compiled GEMM
        codes, a_scale, zp = dynamic_quantize_codes(A2)
        return w.packed.matmul(codes, zp, scale=a_scale * w.scale, threads=w.mat.threads)
    Aq, a_scale, zp = dynamic_quantize(A2)
    acc = int_matmul(Aq, float(max(zp, 255 - zp)), w.mat, wf)
    out = acc if acc.dtype == F32 else acc.astype(F32)
    out *= (a_scale * w.scale) if np.ndim(w.scale) else np.float32(a_scale * w.scale)
    return out


def _float_r(w: _QuantWeights) -> np.ndarray | None:
    return None if w.packed is not None else w.mat.float32()


@op("DynamicQuantizeLSTM", 1, domain=MS)
class DynamicQuantizeLSTM:
    """An LSTM whose W and R are 8-bit quantized: the inputs of both GEMMs (all time steps of X
    at once, then H at every step) are quantized to uint8 on the fly, as onnxruntime does."""

    def __init__(self, ctx: KernelContext, *, activation_alpha=None, activation_beta=None,
                 activations=None, clip=None, direction="forward", hidden_size=None,
                 input_forget=0) -> None:
        from ..rnn import _activations, _apply, _directions  # LSTM's activation helpers

        self.apply = _apply
        direction = direction.decode() if isinstance(direction, bytes) else direction
        self.reverse = _directions(direction)
        self.D = len(self.reverse)
        self.hidden_size = None if hidden_size is None else int(hidden_size)
        self.clip = None if clip is None else float(clip)
        self.input_forget = bool(input_forget)
        names = None
        if activations:
            names = [a.decode() if isinstance(a, bytes) else a for a in activations]
        self.acts = _activations(names, ["Sigmoid", "Tanh", "Tanh"], activation_alpha,
                                 activation_beta, self.D)
        self.want_y = ctx.output_used(0)
        # independent directions run on threads of their own (no BLAS call to compete with)
        self.threads = threads_for(ctx)
        self.weights = None
        self._directions = [None] * self.D
        c = ctx.constants_of((1, 2, 8, 9, 10, 11))
        if c is not None:
            W, R, ws, wz, rs, rz = c
            self.weights = _lstm_weights(W, ws, wz, R, rs, rz, self.D, split_threads(ctx))

    def __call__(self, X, W, R, B=None, sequence_lens=None, initial_h=None, initial_c=None,
                 P=None, W_scale=None, W_zero_point=None, R_scale=None, R_zero_point=None):
        T, batch, _ = X.shape
        H = R.shape[1]
        D = self.D
        weights = self.weights or _lstm_weights(W, W_scale, W_zero_point, R, R_scale,
                                                R_zero_point, D)
        Xf = X.astype(F32, copy=False)
        lens = None if sequence_lens is None else sequence_lens.astype(np.int64).reshape(-1)
        if lens is not None and lens.size == batch and (lens == T).all():
            lens = None  # every sequence at full length: the fast paths apply
        steps = T if lens is None else int(lens.max(initial=0))
        Y = np.zeros((T, D, batch, H), F32)
        Yh = np.zeros((D, batch, H), F32)
        Yc = np.zeros((D, batch, H), F32)
        bias = np.zeros((D, 4 * H), F32) if B is None else (
            B.reshape(D, 8 * H)[:, :4 * H] + B.reshape(D, 8 * H)[:, 4 * H:]).astype(F32)
        peep = None if P is None else P.reshape(D, 3, H).astype(F32)
        compiled = []  # directions left to the compiled recurrence, run together below
        for d in range(D):
            wq, rq = weights[d]
            rf = _float_r(rq)
            f_act, g_act, h_act = ([a] for a in self.acts[d])
            xs = self._inputs(Xf, lens, steps, self.reverse[d])
            xw = _qgemm_dynamic(xs.reshape(steps * batch, xs.shape[2]), wq, _float_r(wq)).reshape(
                steps, batch, 4 * H) \
                if steps else np.zeros((0, batch, 4 * H), F32)
            h = np.zeros((batch, H), F32) if initial_h is None else initial_h[d].astype(F32)
            c = np.zeros((batch, H), F32) if initial_c is None else initial_c[d].astype(F32)
            if lens is None and peep is None and self._usual(d):
                direction = self._compiled_direction(d, rq, B is not None)
                if direction is not None:
                    compiled.append((d, direction, (xw + bias[d]) * direction.half,
                                     np.array(h, F32, order="C"), np.array(c, F32, order="C")))
                    continue
                if len(rq.mat.ranges(H, 255.0)) == 1:
                    ys, h, c = self._fast_direction(xw, bias[d], rq, rf, h, c,
                                                    B is not None)
                    if self.reverse[d]:
                        ys = ys[::-1]
                    Y[:, d] = ys
                    Yh[d], Yc[d] = h, c
                    continue
            h_in = h
            ys = np.zeros((T, batch, H), F32)
            for t in range(steps):
                g = xw[t] + _qgemm_dynamic(h_in, rq, rf)
                h_new, c_new = self._cell(g, c, bias[d], None if peep is None else peep[d],
                                          f_act, g_act, h_act, self.apply, H, B is not None)
                if lens is not None:
                    active = (t < lens)[:, None]
                    h = np.where(active, h_new, h)
                    c = np.where(active, c_new, c)
                    out = np.where(active, h_new, 0).astype(F32)
                else:
                    h, c, out = h_new, c_new, h_new
                ys[t] = out
                h_in = out if self.want_y else h
            if lens is not None:
                done = (lens == 0)[:, None]
                h = np.where(done, 0, h).astype(F32)
                c = np.where(done, 0, c).astype(F32)
            if self.reverse[d]:
                ys = self._reverse(ys, lens, steps)
            Y[:, d] = ys
            Yh[d], Yc[d] = h, c
        if compiled:
            self._run_compiled(compiled, Y, Yh, Yc)
        return (Y if self.want_y else None), Yh, Yc

    def _compiled_direction(self, d: int, rq: _QuantWeights, biased: bool):
        """The compiled recurrence for direction ``d`` (a ``compiled.lstm.Int8Recurrence``), or
        None where it cannot run (R not packed, zero-point terms past int32)."""
        if rq.packed is None:
            return None
        if self.weights is not None and self._directions[d] is not None:
            return self._directions[d]
        from ...compiled.jit import Unavailable
        from ...compiled.lstm import Int8Recurrence
        from ..rnn import sigmoid_halves

        H = rq.mat.q.shape[1] // 4
        half = sigmoid_halves(H, 4)
        try:
            direction = Int8Recurrence(rq.packed, rq.scale, half, self.clip, biased)
        except (ValueError, Unavailable):
            return None
        if self.weights is not None:  # constant weights: prepared once per session
            self._directions[d] = direction
        return direction

    def _run_compiled(self, jobs, Y, Yh, Yc) -> None:
        """Each direction's whole recurrence in one compiled call; directions run on
        ``threads`` threads at once (the calls release the GIL)."""
        def run(k: int) -> None:
            d, direction, xw, h, c = jobs[k]
            ys = np.empty(xw.shape[:2] + h.shape[1:], F32)
            direction.run(xw, h, c, ys)
            Y[:, d] = ys[::-1] if self.reverse[d] else ys
            Yh[d], Yc[d] = h, c

        run_each(run, len(jobs), self.threads)

    def _usual(self, d: int) -> bool:
        """Sigmoid, tanh, tanh and no coupled input-forget gate: the fast cell applies."""
        return not self.input_forget and [a.name for a in self.acts[d]] == [
            "sigmoid", "tanh", "tanh"]

    def _fast_direction(self, xw, bias, rq: _QuantWeights, rf, h, c, biased: bool):
        """One direction of the usual cell with every sequence at full length, on rnn's fast
        cell: the halving of i, o, f folded into the input part (once for all steps) and into
        the per-step scale of h's product, which stays the exact integer one onnxruntime
        computes: on the compiled GEMM, or one float32 GEMM (R fits it for any |h| code)."""
        from ..rnn import fast_lstm_cell, sigmoid_halves

        H = rq.mat.q.shape[1] // 4
        half = sigmoid_halves(H, 4)
        r_scale = (np.asarray(rq.scale, F32) * half).astype(F32)
        packed = rq.packed
        if packed is not None:  # codes of h, then one call for product and scale
            codes = np.empty(h.shape, np.uint8)
            # a few rows: a hand-off to worker threads costs more than the product
            threads = rq.mat.threads if h.shape[0] >= 8 else 1

            def recurrent(h, out):
                hq, a_scale, zp = dynamic_quantize_codes(h, codes)
                packed.matmul(hq, zp, scale=a_scale * r_scale, out=out, threads=threads)
        else:
            def recurrent(h, out):
                hq, a_scale, _ = dynamic_quantize(h)
                np.matmul(hq, rf, out=out)
                out *= a_scale * r_scale

        cell = fast_lstm_cell(H, recurrent, half, None if self.clip is None else
                              F32.type(self.clip), biased)
        xw = (xw + bias) * half  # every step's input part, biased and halved
        ys = np.empty((xw.shape[0],) + h.shape, F32)
        for s, x in enumerate(xw):
            h, c = cell(x, h, c, out=ys[s])
        return ys, h, c

    @staticmethod
    def _inputs(X: np.ndarray, lens, steps: int, reverse: bool) -> np.ndarray:
        if not reverse:
            return X[:steps]
        if lens is None:
            return X[::-1][:steps]
        s = np.arange(steps)[:, None]
        idx = np.where(s < lens, lens - 1 - s, s)
        return X[idx, np.arange(X.shape[1])]

    @staticmethod
    def _reverse(ys: np.ndarray, lens, steps: int) -> np.ndarray:
        if lens is None:
            return ys[::-1].copy()
        out = ys.copy()
        s = np.arange(steps)[:, None]
        idx = np.where(s < lens, lens - 1 - s, s)
        out[:steps] = ys[idx, np.arange(ys.shape[1])]
        return out

    def _cell(self, g, c, bias, peep, f_act, g_act, h_act, apply, H, biased):
        from ..rnn import clip_gates

        gi, go, gf, gc = (g[:, k * H:(k + 1) * H] for k in range(4))
        clip = self.clip

        def pre(x, b, p=None):
            if p is not None:
                x = x + p
            x = x + b
            clip_gates(x, clip, biased)
            return x

        i = apply(f_act, pre(gi, bias[:H], None if peep is None else peep[0] * c))
        if self.input_forget:
            f = 1 - i
        else:
            f = apply(f_act, pre(gf, bias[2 * H:3 * H], None if peep is None else peep[2] * c))
        cc = apply(g_act, pre(gc, bias[3 * H:]))
        c_new = c * f + i * cc
        o = apply(f_act, pre(go, bias[H:2 * H], None if peep is None else peep[1] * c_new))
        h_new = apply(h_act, c_new.copy()) * o  # onnxruntime does not clip C_t here
        return h_new.astype(F32), c_new.astype(F32)
