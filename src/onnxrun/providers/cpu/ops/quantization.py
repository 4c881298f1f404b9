"""Quantization operators of the ai.onnx domain.

QuantizeLinear / DequantizeLinear in every version (per-tensor, per-axis and blocked; 8/16-bit,
4- and 2-bit integers, float8, float6 and float4 targets), DynamicQuantizeLinear, and the
integer-arithmetic operators QLinearMatMul, QLinearConv, MatMulInteger and ConvInteger.

Integer products run exactly on float32 BLAS: a dot product of integers is exact in float32 as
long as every partial sum stays below 2**24, which holds when ``|a|max * max_n sum_k |b[k, n]|``
does. Longer reductions are split into ranges of K whose float32 products are summed in float64
(exact up to 2**53). Requantization follows
onnxruntime's MLAS: ``float32(acc) * float32(scale)``, rounded half to even, clamped, plus the
zero point. The helpers here are shared with the com.microsoft kernels in ``contrib/``.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ....dtypes import ml_dtypes, np_dtype
from ..kernels import KernelContext, op, text_attribute
from ..parallel import split_threads
from .conv import pad_spatial, window_geometry, window_slices

F32 = np.dtype(np.float32)
F64 = np.dtype(np.float64)
F32_EXACT = float(1 << 24)  # integers below this are exact in float32, and so are their sums



def _ml(*names: str) -> set[np.dtype]:
    """ml_dtypes' types of these names (none without ml_dtypes: no array has them then)."""
    return {np.dtype(getattr(ml_dtypes, n)) for n in names} if ml_dtypes is not None else set()


_SUB_BYTE_INTS = _ml("int4", "uint4", "int2", "uint2")
FLOAT8 = _ml("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz")
_HALF = {np.dtype(np.float16), *_ml("bfloat16")}
# No infinity encodings: ml_dtypes' cast already saturates them.
_SMALL_FLOATS = _ml("float4_e2m1fn", "float6_e2m3fn", "float6_e3m2fn")


# -- parameters -------------------------------------------------------------------------------


def int_range(dtype: np.dtype) -> tuple[int, int] | None:
    """(min, max) of an integer element type (4- and 2-bit included), None for floats."""
    dt = np.dtype(dtype)
    if dt.kind in "iu" or dt in _SUB_BYTE_INTS:
        info = ml_dtypes.iinfo(dt) if dt in _SUB_BYTE_INTS else np.iinfo(dt)
        return int(info.min), int(info.max)
    return None


def is_int8(dtype: np.dtype) -> bool:
    return np.dtype(dtype) in (np.dtype(np.int8), np.dtype(np.uint8))


def scalar(value: np.ndarray | None, default=0):
    """The single element of a per-tensor parameter (``default`` when absent)."""
    if value is None:
        return default
    if value.size != 1:
        raise ValueError(f"expected a scalar or a 1-element tensor, got shape {list(value.shape)}")
    return value.reshape(-1)[0]


def broadcast_param(p: np.ndarray, x_shape: tuple[int, ...], axis: int, block_size: int = 0
                    ) -> np.ndarray:
    """A scale or zero point shaped to broadcast against x: per-tensor (one element), per-axis
    (1-D along ``axis``) or blocked (x's rank, ``ceil(D / block_size)`` along ``axis``)."""
    rank = len(x_shape)
    if p.size == 1 and (not block_size or p.ndim <= 1):
        return p.reshape(())
    if rank == 0:
        raise ValueError("a scalar input takes per-tensor quantization parameters only")
    ax = axis + rank if axis < 0 else axis
    if not 0 <= ax < rank:
        raise ValueError(f"axis {axis} is out of range for rank {rank}")
    dim = x_shape[ax]
    if not block_size:
        if p.ndim != 1 or p.shape[0] != dim:
            raise ValueError(f"per-axis parameter of shape {list(p.shape)} does not match "
                             f"dimension {dim} of axis {ax}")
        return p.reshape([dim if i == ax else 1 for i in range(rank)])
    block_size = int(block_size)
    if block_size <= 0:
        raise ValueError("block_size must be positive")
    blocks = -(-dim // block_size)
    expected = tuple(blocks if i == ax else d for i, d in enumerate(x_shape))
    if p.shape != expected:
        raise ValueError(f"blocked parameter of shape {list(p.shape)} does not match input shape "
                         f"{list(x_shape)} with block_size {block_size} (expected "
                         f"{list(expected)})")
    full = np.repeat(p, block_size, axis=ax)
    if full.shape[ax] != dim:
        full = full[(slice(None),) * ax + (slice(0, dim),)]
    return full


def _float_param(p: np.ndarray) -> np.ndarray:
    """Scales as float32 (float8e8m0, float16, bfloat16) or float64 (kept)."""
    return p if p.dtype in (F32, F64) else p.astype(F32)


# -- QuantizeLinear / DequantizeLinear ---------------------------------------------------------


def quantize(x: np.ndarray, scale: np.ndarray, zero_point: np.ndarray | None,
             out_dtype: np.dtype, axis: int = 1, block_size: int = 0, saturate: bool = True,
             precision: int = 0) -> np.ndarray:
    """saturate(round_half_even(x / scale) + zero_point) in ``out_dtype``.

    The division runs in ``precision`` when given, else in float32 (or float64 for int32 input):
    half-precision operands are widened first, as onnxruntime does.
    """
    out_dtype = np.dtype(out_dtype)
    s = broadcast_param(scale, x.shape, axis, block_size)
    if precision:
        pdt = np_dtype(int(precision))
        v = np.true_divide(x.astype(pdt, copy=False), s.astype(pdt, copy=False))
    else:
        v = np.true_divide(x.astype(F32) if x.dtype in _HALF else x,
                           s.astype(F32) if s.dtype in _HALF else s)
    v = np.asarray(v)  # a 0-d quotient comes back as a numpy scalar
    if v.dtype not in (F32, F64):  # half-precision quotient: round in its own type, then widen
        v = v.astype(F32)
    zp = None
    if zero_point is not None and zero_point.size and np.any(zero_point.astype(F32) != 0):
        zp = broadcast_param(zero_point, x.shape, axis, block_size)
    bounds = int_range(out_dtype)
    if bounds is not None:
        np.rint(v, out=v)
        if zp is not None:
            v += zp.astype(v.dtype)
        np.fmax(v, bounds[0], out=v)  # fmax, not clip: NaN -> the lowest code, as onnxruntime
        np.minimum(v, bounds[1], out=v)
        return v.astype(out_dtype)
    if out_dtype in FLOAT8 or out_dtype in _SMALL_FLOATS:
        if zp is not None:
            v = v + zp.astype(v.dtype)
        if saturate and out_dtype in FLOAT8:
            limit = float(ml_dtypes.finfo(out_dtype).max)
            np.clip(v, -limit, limit, out=v)
        return v.astype(out_dtype)
    raise TypeError(f"QuantizeLinear: unsupported output type {out_dtype}")


def dequantize(x: np.ndarray, scale: np.ndarray, zero_point: np.ndarray | None,
               out_dtype: np.dtype, axis: int = 1, block_size: int = 0) -> np.ndarray:
    """(x - zero_point) * scale, computed in float32 and returned as ``out_dtype``."""
    s = broadcast_param(_float_param(scale), x.shape, axis, block_size)
    cdt = F64 if s.dtype == F64 else F32
    if zero_point is not None and zero_point.size and np.any(zero_point.astype(F32) != 0):
        zp = broadcast_param(zero_point, x.shape, axis, block_size).astype(cdt)
        v = np.asarray(np.subtract(x.astype(cdt) if x.dtype.kind not in "iu" else x, zp,
                                   dtype=cdt))
    else:
        v = x.astype(cdt)
    np.multiply(v, s, out=v, casting="unsafe")
    return v if v.dtype == out_dtype else v.astype(out_dtype)


def _output_dtype(output_dtype: int, zero_point: np.ndarray | None) -> np.dtype:
    if zero_point is not None:
        if output_dtype and np_dtype(int(output_dtype)) != zero_point.dtype:
            raise ValueError(f"output_dtype {np_dtype(int(output_dtype))} does not match the "
                             f"zero point's type {zero_point.dtype}")
        return zero_point.dtype
    return np_dtype(int(output_dtype)) if output_dtype else np.dtype(np.uint8)


_FAST_QUANTIZE = {np.dtype(np.uint8), np.dtype(np.int8), np.dtype(np.uint16),
                  np.dtype(np.int16)}


def centered_codes(x: np.ndarray, scale: np.float32, zero_point: int, dtype: np.dtype
                   ) -> np.ndarray:
    """``quantize(x) - zero_point`` as a fresh float32 array, for float32 x, one float32 scale
    and an 8/16-bit code type: clamped to [lo - zero_point, hi - zero_point], NaN to the lowest
    code as onnxruntime does. np.clip is SIMD where np.fmax / np.minimum with a scalar are not;
    NaN, which clip keeps, is looked for with one reduction."""
    lo, hi = int_range(dtype)
    v = np.divide(x, scale)
    np.rint(v, out=v)
    np.clip(v, np.float32(lo - zero_point), np.float32(hi - zero_point), out=v)
    if v.size and np.isnan(v.min()):
        v[np.isnan(v)] = lo - zero_point
    return v


def quantize_per_tensor(x: np.ndarray, scale: np.float32, zero_point: int, out_dtype: np.dtype
                        ) -> np.ndarray:
    """``quantize`` for the common activation case (float32 x, one float32 scale, an 8/16-bit
    zero point): 2.2x faster than the general path."""
    v = centered_codes(x, scale, zero_point, out_dtype)
    if zero_point:
        v += np.float32(zero_point)
    return v.astype(out_dtype)


@op("QuantizeLinear", 10, 13, 19, 21, 23, 24, 25, 28)
def QuantizeLinear(x, y_scale, y_zero_point=None, *, axis=1, block_size=0, output_dtype=0,
                   precision=0, saturate=1):
    out = _output_dtype(output_dtype, y_zero_point)
    if (x.dtype == F32 and y_scale.dtype == F32 and y_scale.size == 1 and not precision
            and not block_size and out in _FAST_QUANTIZE and x.ndim > 0):
        zp = 0 if y_zero_point is None else int(y_zero_point.reshape(-1)[0])
        return quantize_per_tensor(x, y_scale.reshape(()), zp, out)
    return quantize(x, y_scale, y_zero_point, out, int(axis), int(block_size), bool(saturate),
                    int(precision))


# Operators onnxruntime has no equivalent of live in onnxrun's own domain.
ONNXRUN_DOMAIN = "ai.onnxrun"


@op("QuantizeDequantize", 1, domain=ONNXRUN_DOMAIN)
def QuantizeDequantize(x, scale, zero_point=None):
    """DequantizeLinear(QuantizeLinear(x, scale, zero_point), scale, zero_point) for a float32
    x and one scale (QuantizeDequantizeFusion writes it for a QDQ model's activations): the
    same values, bit for bit, in four passes over x instead of eight, and no narrow copy."""
    dtype = np.dtype(np.uint8) if zero_point is None else zero_point.dtype
    zp = 0 if zero_point is None else int(zero_point.reshape(-1)[0])
    s = scale.reshape(())
    v = centered_codes(x, s, zp, dtype)
    v *= s
    return v


# Operators whose work per weight element (a column of a GEMM over many rows) dwarfs
# dequantizing that element: a narrow weight they read is dequantized at each run, a few
# percent of their time, so the session holds it in its 8 (or fewer) bits. Not convolutions:
# their kernels re-lay a constant weight once (Winograd, depthwise, per-tap layouts), in float
# anyway, and a weight that arrives at each run is re-laid at each run: QDQ MobileNetV2 spent
# 4 ms per run dequantizing and 4.5 ms more in its convolutions (44 ms against 35 ms with the
# weights folded), for no lower peak memory (the float copies were made at every run).
_WEIGHT_READERS = {"MatMul", "Gemm", "FusedGemm", "FusedMatMul"}


def dequantizes_weight_per_run(node) -> bool:
    """Whether ``node`` is a DequantizeLinear of a constant narrower than float32 read only by
    weight readers: it is then neither folded into a float initializer nor cached."""
    if node.op_type != "DequantizeLinear" or not node.inputs or not node.outputs:
        return False
    x = node.inputs[0]
    if x is None or x.const_value is None or x.const_value.dtype.itemsize >= 4:
        return False
    uses = node.outputs[0].uses
    return bool(uses) and all(user.op_type in _WEIGHT_READERS for user, _ in uses)


@op("DequantizeLinear", 10, 13, 19, 21, 23, 24, 25, 28)
class DequantizeLinear:
    """A constant input is dequantized once, at session creation, unless it is a narrow weight
    (see dequantizes_weight_per_run), which stays narrow in memory and is dequantized per run."""

    def __init__(self, ctx: KernelContext, *, axis=1, block_size=0, output_dtype=0) -> None:
        self.axis = int(axis)
        self.block_size = int(block_size)
        self.output_dtype = int(output_dtype)
        self.cached = None
        x, s = ctx.constant(0), ctx.constant(1)
        has_zp = ctx.has_input(2)
        zp = ctx.constant(2) if has_zp else None
        if x is not None and s is not None and (zp is not None or not has_zp) \
                and not dequantizes_weight_per_run(ctx.node):
            y = self(x, s, zp)
            y.flags.writeable = False  # shared by every run
            self.cached = y

    def __call__(self, x, x_scale, x_zero_point=None):
        if self.cached is not None:
            return self.cached
        out = np_dtype(self.output_dtype) if self.output_dtype else x_scale.dtype
        if out not in (F32, F64, *_HALF):
            raise TypeError(f"DequantizeLinear: output type {out} is not a float type; set "
                            "output_dtype")
        return dequantize(x, x_scale, x_zero_point, out, self.axis, self.block_size)


# -- dynamic quantization ---------------------------------------------------------------------
#
# onnxruntime's range of x is MLAS's min/max kernel (MlasReduceMinimumMaximumF32KernelAvx), whose
# x86 MAXPS/MINPS return their second operand when either is NaN: a NaN is not simply skipped
# or propagated, what comes out depends on where it sits. Every later step is C++'s
# std::min/std::max (``b < a ? b : a``), which keep a NaN first operand and ignore a NaN second
# one. The numpy path below reproduces both exactly, and so does the compiled quantizer
# (compiled/quantize.py); on finite inputs they reduce to the plain min and max. (onnxruntime's
# DynamicQuantizeLinear with more than one intra-op thread splits the range over blocks whose
# partition depends on its thread pool; this is its one-thread order, which its
# DynamicQuantizeMatMul, MatMulIntegerToFloat and DynamicQuantizeLSTM always use.)

_F32_MAX = np.float32(np.finfo(np.float32).max)


def _maxps(a, b):
    """x86 MAXPS lane by lane: ``a > b ? a : b`` (b when either is NaN)."""
    return np.where(a > b, a, b)


def _minps(a, b):
    return np.where(a < b, a, b)


def _lanes(acc: np.ndarray, rows: np.ndarray, take_max: bool) -> np.ndarray:
    """``acc = MAXPS(acc, row)`` (or MINPS) over ``rows`` (k, lanes), without a loop: a NaN row
    element makes its lane NaN and the next element replaces it, so each lane ends NaN (NaN
    last), or as the plain extreme of what follows its last NaN (``acc`` included if none)."""
    k = rows.shape[0]
    if k == 0:
        return acc
    nan = np.isnan(rows)
    start = np.where(nan.any(axis=0), k - np.argmax(nan[::-1], axis=0), 0)  # after the last NaN
    clean = np.where(np.arange(k)[:, None] >= start, rows,
                     np.float32(-np.inf if take_max else np.inf))
    extreme = clean.max(axis=0) if take_max else clean.min(axis=0)
    with_acc = _maxps(acc, extreme) if take_max else _minps(acc, extreme)
    out = np.where(start == 0, with_acc, extreme)
    return np.where(start == k, np.float32(np.nan), out).astype(F32)


def _mlas_min_max(x: np.ndarray) -> tuple[np.float32, np.float32]:
    """MLAS's (min, max) of the float32 vector ``x``, NaN handling included: four 8-lane
    accumulators over blocks of 32, one over the blocks of 8 left, a 4-lane reduction, then a
    scalar std::min/std::max over the last few elements; accumulators start at -+FLT_MAX."""
    n = x.size
    lo, hi = _F32_MAX, -_F32_MAX
    i = 0
    if n >= 8:
        vlo, vhi = np.full(8, _F32_MAX, F32), np.full(8, -_F32_MAX, F32)
        if n >= 32:
            i = n // 32 * 32
            blocks = x[:i].reshape(-1, 4, 8)
            his = [_lanes(vhi, blocks[:, v], True) for v in range(4)]
            los = [_lanes(vlo, blocks[:, v], False) for v in range(4)]
            vhi = _maxps(_maxps(his[0], his[1]), _maxps(his[2], his[3]))
            vlo = _minps(_minps(los[0], los[1]), _minps(los[2], los[3]))
        j = i + (n - i) // 8 * 8
        vhi = _lanes(vhi, x[i:j].reshape(-1, 8), True)
        vlo = _lanes(vlo, x[i:j].reshape(-1, 8), False)
        i = j
        h = _maxps(vhi[:4], vhi[4:])
        h = _maxps(h, h[[2, 3, 2, 3]])
        hi = np.float32(_maxps(h[0], h[1]))
        m = _minps(vlo[:4], vlo[4:])
        m = _minps(m, m[[2, 3, 2, 3]])
        lo = np.float32(_minps(m[0], m[1]))
    for t in x[i:]:
        hi = t if hi < t else hi
        lo = t if t < lo else lo
    return np.float32(lo), np.float32(hi)


def dynamic_params(x: np.ndarray) -> tuple[np.float32, int, bool]:
    """onnxruntime's per-tensor uint8 (scale, zero point) of a float32 tensor, for the range
    [min(x, 0), max(x, 0)] (scale 1 when it is empty), and whether x / scale may hold NaN (a NaN
    or infinite x). A NaN or infinite range gives onnxruntime's non-finite scale."""
    if x.size == 0:
        return np.float32(1), 0, False
    lo, hi = np.float32(x.min()), np.float32(x.max())
    non_finite = not (np.isfinite(lo) and np.isfinite(hi))
    if np.isnan(lo) or np.isnan(hi):  # numpy propagates NaN; MLAS depends on where it is
        lo, hi = _mlas_min_max(np.ravel(x))
    lo = np.float32(0) if np.float32(0) < lo else lo  # std::min(lo, 0): NaN stays
    hi = np.float32(0) if hi < np.float32(0) else hi
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        scale = np.float32(1) if hi == lo else np.float32((hi - lo) / np.float32(255))
        initial = np.float32(np.float32(0) - lo / scale)
    zp = initial if initial < np.float32(255) else np.float32(255)  # std::min(255, NaN) is 255
    zp = zp if np.float32(0) < zp else np.float32(0)
    return scale, int(np.rint(zp)), non_finite


def dynamic_quantize(x: np.ndarray) -> tuple[np.ndarray, np.float32, int]:
    """onnxruntime's dynamic uint8 quantization of a float tensor: (``q - zp`` as float32
    whole numbers, scale, zero point). MLAS clamps x / scale before rounding, and a NaN
    quotient clamps to the low end (code 0): MAXPS(NaN, lo) is lo."""
    x = x.astype(F32, copy=False)
    scale, zp, non_finite = dynamic_params(x)
    with np.errstate(invalid="ignore"):
        y = np.asarray(np.true_divide(x, scale, dtype=F32))
    if non_finite:
        np.copyto(y, np.float32(-zp), where=np.isnan(y))
    np.rint(y, out=y)
    np.clip(y, -zp, np.float32(255) - zp, out=y)  # zp is whole: same as clipping y + zp
    return y, scale, zp


@op("DynamicQuantizeLinear", 11)
def DynamicQuantizeLinear(x):
    """uint8 quantization with a scale and zero point covering [min(x, 0), max(x, 0)]."""
    x = x.astype(F32, copy=False)
    if x.size:
        from ..compiled import layout
        from ..compiled import quantize as compiled

        order = layout.dense_order(x)  # channels-last views too: the codes keep x's layout
        if order is not None and not compiled.unavailable():
            q, scale, zp = compiled.dynamic_quantize_u8(layout.flat(x, order), 1.0)
            return (layout.shaped_like(q, x, order), np.array(scale, F32),
                    np.array(zp, np.uint8))
    y, scale, zp = dynamic_quantize(x)
    q = np.add(y, zp, out=np.empty(y.shape, np.uint8), casting="unsafe")  # add and narrow
    return q, np.array(scale, F32), np.array(zp, np.uint8)


# -- exact integer products -------------------------------------------------------------------


def centered(q: np.ndarray, zero_point, dtype: np.dtype = F32) -> np.ndarray:
    """``q - zero_point`` as a float array of exact integers."""
    if zero_point is None or not np.any(zero_point):
        return q.astype(dtype)
    zp = np.asarray(zero_point)
    return np.subtract(q, zp.astype(dtype), dtype=dtype)


def centered_absmax(q: np.ndarray, zero_point) -> float:
    """max |q - zero_point| without building q - zero_point when the zero point is a scalar."""
    if q.size == 0:
        return 0.0
    zp = 0 if zero_point is None else np.asarray(zero_point)
    if np.ndim(zp) == 0 or np.size(zp) == 1:
        z = float(np.asarray(zp).reshape(-1)[0]) if np.size(zp) else 0.0
        return max(abs(float(q.max()) - z), abs(float(q.min()) - z))
    return float(np.abs(centered(q, zp)).max())


_BLOCK = 32  # rows of K per bound block: 32 * 255 * 255 < 2**24, so one block is always exact


def _block_cumsum(absw: np.ndarray) -> np.ndarray:
    """(K, C) magnitudes -> running sums over blocks of _BLOCK rows, (blocks + 1, C)."""
    K = absw.shape[0]
    nb = -(-K // _BLOCK)
    if nb * _BLOCK != K:
        absw = np.pad(absw, ((0, nb * _BLOCK - K), (0, 0)))
    sums = absw.reshape(nb, _BLOCK, -1).sum(axis=1, dtype=F64)
    return np.concatenate([np.zeros((1, sums.shape[1]), F64), np.cumsum(sums, axis=0)])


def k_chunks(cum: np.ndarray, K: int, amax: float) -> list[tuple[int, int]]:
    """Split [0, K) into ranges over which every column's partial sums stay exact in float32
    (``amax * sum |w| < 2**24``), given the block running sums of |w|."""
    limit = F32_EXACT / max(amax, 1.0)
    if cum.shape[0] == 1 or cum[-1].max() < limit:
        return [(0, K)]
    chunks = []
    b0, nb = 0, cum.shape[0] - 1
    while b0 < nb:
        span = (cum[b0 + 1:] - cum[b0]).max(axis=1)  # non-decreasing in the block count
        n = max(1, int(np.searchsorted(span, limit)))
        chunks.append((b0 * _BLOCK, min(K, (b0 + n) * _BLOCK)))
        b0 += n
    return chunks


# |a - zero_point| of any 8-bit a (int8 or uint8, zero point of the same type) is at most this.
INT8_SPAN = 255.0


class _Exactness:
    """How a product with a constant integer matrix stays exact, decided once from the largest
    column sum of its magnitudes: one float32 GEMM while ``amax * colsum < 2**24``, else the K
    ranges precomputed for the widest 8-bit operand (valid for any narrower one too)."""

    __slots__ = ("colsum", "chunks_8bit")

    def __init__(self, absw: np.ndarray) -> None:
        cum = _block_cumsum(absw)
        self.colsum = float(cum[-1].max()) if cum.size else 0.0
        self.chunks_8bit = None
        if INT8_SPAN * self.colsum >= F32_EXACT:
            self.chunks_8bit = k_chunks(cum, absw.shape[0], INT8_SPAN)

    def ranges(self, K: int, amax: float, absw) -> list[tuple[int, int]]:
        """K ranges for an operand bounded by ``amax``; ``absw()`` gives the magnitudes for an
        operand wider than 8 bits (not met by the ONNX operators, which take 8-bit inputs)."""
        if amax * self.colsum < F32_EXACT:
            return [(0, K)]
        if amax <= INT8_SPAN and self.chunks_8bit is not None:
            return self.chunks_8bit
        return k_chunks(_block_cumsum(absw()), K, amax)


def _zero_point_or_none(zp: np.ndarray | None) -> np.ndarray | None:
    """A zero point as float32, None when it is all zeros (then no subtraction is needed)."""
    if zp is None or not zp.size or not np.any(zp):
        return None
    return zp.astype(F32)


class IntMatrix:
    """The right operand of an integer product: the 8-bit array itself (the initializer, not a
    copy) with its zero point and what keeps a product exact. ``float32()`` builds
    ``B - zero_point`` for one product, a few percent of the GEMM's time, so a session keeps its
    weights as int8. A constant 2-D matrix is also packed for the compiled VNNI kernel when it
    can run here (``prepack``: the intra-op thread count of the kernel that owns it)."""

    __slots__ = ("q", "zp", "_exact", "packed", "threads")

    def __init__(self, B: np.ndarray, zero_point=None, *, prepack: int | None = None) -> None:
        zp = None if zero_point is None else np.asarray(zero_point)
        if zp is not None and zp.ndim == 1 and zp.size > 1 and B.ndim >= 2:
            zp = zp.reshape(-1)  # per column: broadcasts along the last axis
        self.q = B
        self.zp = _zero_point_or_none(zp)
        self._exact = None
        self.packed = None
        self.threads = 1
        if prepack is not None and B.ndim == 2 and is_int8(B.dtype) and (
                zp is None or zp.size in (1, B.shape[1])):
            self.packed = _packed(B, zp)
            self.threads = prepack

    @property
    def exact(self) -> _Exactness:  # built on first use: a packed matrix may never need it
        if self._exact is None:
            self._exact = _Exactness(self._magnitudes())
        return self._exact

    def _magnitudes(self) -> np.ndarray:
        a = np.abs(self.float32())
        if a.ndim > 2:  # a stack of matrices: bound them all by the largest magnitudes
            a = a.reshape((-1,) + a.shape[-2:]).max(axis=0)
        elif a.ndim < 2:
            a = a.reshape(-1, 1)
        return a

    @property
    def colsum(self) -> float:
        return self.exact.colsum

    def float32(self, k0: int = 0, k1: int | None = None) -> np.ndarray:
        """Rows [k0, k1) of ``B - zero_point`` as a fresh float32 array."""
        q = self.q if k0 == 0 and k1 is None else self.q[..., k0:k1, :]
        return q.astype(F32) if self.zp is None else np.subtract(q, self.zp, dtype=F32)

    def ranges(self, K: int, amax: float) -> list[tuple[int, int]]:
        return self.exact.ranges(K, amax, self._magnitudes)


def _packed(B: np.ndarray, zero_point):
    """B packed for the compiled int8 GEMM, or None where it cannot run (no llvmlite, below AVX2,
    or switched off)."""
    from ..compiled import int8_gemm

    if int8_gemm.unavailable():
        return None
    return int8_gemm.PackedB(B, zero_point)


def compiled_matmul(A: np.ndarray, a_zero_point, B: IntMatrix, *, scale=None,
                    bias=None) -> np.ndarray | None:
    """(A - a_zero_point) @ B on the compiled kernel for an 8-bit A with one zero point: int32,
    or float32 ``float(acc) * scale + bias``. None when B is not packed (the caller takes the
    numpy path)."""
    if B.packed is None or not is_int8(A.dtype) or A.ndim < 1:
        return None
    if a_zero_point is not None and np.size(a_zero_point) != 1:
        return None  # a zero point per row (MatMulInteger allows it)
    zp = 0 if a_zero_point is None else int(np.asarray(a_zero_point).reshape(-1)[0])
    A2 = A.reshape(-1, A.shape[-1])
    Y = B.packed.matmul(A2, zp, scale=scale, bias=bias, threads=B.threads)
    return Y.reshape(A.shape[:-1] + (B.packed.N,))


def mm(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """matmul, a stack of rows times one matrix done as a single GEMM."""
    if B.ndim == 2 and A.ndim > 2 and A.flags.c_contiguous:
        return np.dot(A.reshape(-1, A.shape[-1]), B).reshape(A.shape[:-1] + (B.shape[1],))
    return np.matmul(A, B)


def int_matmul(Af: np.ndarray, amax: float, B: IntMatrix, Bf: np.ndarray | None = None
               ) -> np.ndarray:
    """Exact A @ B for float arrays of integers (``amax`` bounds |A|): one float32 GEMM when
    every partial sum fits 24 bits, else float32 GEMMs over K ranges summed in float64. ``Bf``:
    ``B.float32()`` when the caller reuses it over many products (an LSTM's time steps)."""
    chunks = B.ranges(Af.shape[-1], amax)
    if len(chunks) == 1:
        return mm(Af, B.float32() if Bf is None else Bf)
    acc = None
    for k0, k1 in chunks:
        Bk = B.float32(k0, k1) if Bf is None else Bf[..., k0:k1, :]
        part = mm(np.ascontiguousarray(Af[..., k0:k1]), Bk)
        if acc is None:
            acc = part.astype(F64)
        else:
            acc += part
    return acc


def requantize(acc: np.ndarray, multiplier, zero_point, out_dtype: np.dtype) -> np.ndarray:
    """MLAS requantization: float32(acc) * multiplier, round half to even, clamp, + zero point.
    ``acc`` may be overwritten."""
    v = acc if acc.dtype == F32 else acc.astype(F32)
    if multiplier is not None:  # None: acc is already float32(acc) * multiplier
        v *= multiplier
    np.rint(v, out=v)
    lo, hi = int_range(out_dtype)
    zp = float(scalar(zero_point, 0))
    np.clip(v, lo - zp, hi - zp, out=v)
    if zp:
        v += np.float32(zp)
    return v.astype(out_dtype)


def output_multiplier(a_scale: np.ndarray, b_scale: np.ndarray, y_scale: np.ndarray | None,
                      alpha: float = 1.0) -> np.ndarray:
    """(a_scale * b_scale) / y_scale in the scales' own precision (float32 as onnxruntime)."""
    dt = np.result_type(a_scale.dtype, b_scale.dtype,
                        *(() if y_scale is None else (y_scale.dtype,)))
    if dt not in (F32, np.dtype(np.float16)):
        dt = F32
    m = np.asarray(scalar(a_scale), dt)
    if alpha != 1.0:
        m = np.asarray(dt.type(alpha) * m, dt)
    m = m * b_scale.astype(dt)
    if y_scale is not None:
        m = m / np.asarray(scalar(y_scale), dt)
    return np.asarray(m, dt).astype(F32)


def _dequantize_simple(q, scale, zero_point) -> np.ndarray:
    return dequantize(q, scale, zero_point, F32, axis=-1)


@op("QLinearMatMul", 10, 21)
class QLinearMatMul:
    """(a - a_zp) @ (b - b_zp), requantized with a_scale * b_scale / y_scale."""

    def __init__(self, ctx: KernelContext) -> None:
        b, b_zp = ctx.constant(3), ctx.constant(5)
        self.B = None
        if b is not None and is_int8(b.dtype) and (b_zp is not None or ctx.num_inputs <= 5):
            self.B = IntMatrix(b, b_zp, prepack=split_threads(ctx))

    def __call__(self, a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale,
                 y_zero_point=None):
        out_dtype = y_zero_point.dtype if y_zero_point is not None else a.dtype
        if not (is_int8(a.dtype) and is_int8(b.dtype) and is_int8(out_dtype)):
            # float8: dequantize, multiply in float32, quantize
            A = _dequantize_simple(a, a_scale, a_zero_point)
            Bf = _dequantize_simple(b, b_scale, b_zero_point)
            return quantize(mm(A, Bf), y_scale, y_zero_point, out_dtype)
        Bm = self.B if self.B is not None else IntMatrix(b, b_zero_point)
        mult = output_multiplier(a_scale, b_scale.reshape(-1) if b_scale.ndim == 1 else b_scale,
                                 y_scale)
        scaled = compiled_matmul(a, a_zero_point, Bm, scale=mult)
        if scaled is not None:
            return requantize(scaled, None, y_zero_point, out_dtype)
        Af = centered(a, scalar(a_zero_point, 0))
        acc = int_matmul(Af, centered_absmax(a, a_zero_point), Bm)
        return requantize(acc, mult, y_zero_point, out_dtype)


def _row_zero_point(A: np.ndarray, zp: np.ndarray | None):
    """MatMulInteger's a_zero_point: a scalar, or one per row ([M] or [..., M, 1])."""
    if zp is None or zp.size == 1:
        return None if zp is None else zp.reshape(())
    if zp.ndim == 1:
        return zp.reshape(-1, 1)
    return zp


@op("MatMulInteger", 10)
class MatMulInteger:
    def __init__(self, ctx: KernelContext) -> None:
        B, b_zp = ctx.constant(1), ctx.constant(3)
        has_zp = ctx.has_input(3)
        self.B = None
        if B is not None and (b_zp is not None or not has_zp):
            self.B = IntMatrix(B, b_zp, prepack=split_threads(ctx))

    def __call__(self, A, B, a_zero_point=None, b_zero_point=None):
        Bm = self.B if self.B is not None else IntMatrix(B, b_zero_point)
        acc = compiled_matmul(A, a_zero_point, Bm)
        if acc is not None:
            return acc
        zp = _row_zero_point(A, a_zero_point)
        acc = int_matmul(centered(A, zp), centered_absmax(A, zp), Bm)
        return acc.astype(np.int32)


# -- integer convolution ----------------------------------------------------------------------


def _ints(values, n: int, default: int) -> tuple[int, ...]:
    return tuple(int(v) for v in values) if values is not None and len(values) else (default,) * n


class IntConvWeights:
    """A convolution's 8-bit weight as given (the initializer, not a copy), its zero point per
    output channel and what keeps the products exact; ``gemm()`` / ``taps()`` build
    ``W - w_zero_point`` in the layout of each group's GEMM or of the depthwise taps for one
    run."""

    def __init__(self, W: np.ndarray, zero_point, group: int) -> None:
        zp = None if zero_point is None else np.asarray(zero_point)
        self.q = W
        self.zp = _zero_point_or_none(zp)
        if self.zp is not None:
            self.zp = self.zp.reshape(-1)
        self.shape = W.shape
        self.group = group
        M = W.shape[0]
        self.depthwise = group > 1 and W.shape[1] == 1 and M == group
        self.exact = _Exactness(self._magnitudes())

    def _magnitudes(self) -> np.ndarray:
        M = self.shape[0]
        return np.abs(self.gemm().reshape(M, -1)).T

    @property
    def rowsum(self) -> float:
        return self.exact.colsum

    def _centered(self, q: np.ndarray, zp_shape: tuple[int, ...]) -> np.ndarray:
        if self.zp is None:
            return q.astype(F32)
        return np.subtract(q, self.zp.reshape(zp_shape) if self.zp.size > 1 else self.zp[0],
                           dtype=F32)

    def gemm(self) -> np.ndarray:
        """(group, M / group, C / group * taps) float32."""
        g, M = self.group, self.shape[0]
        return self._centered(self.q.reshape(g, M // g, -1), (g, M // g, 1))

    def taps(self) -> np.ndarray:
        """Depthwise weights as (taps, M, 1, ..., 1) float32: one multiplier per channel and
        kernel offset."""
        M = self.shape[0]
        taps = int(np.prod(self.shape[2:]))
        w = self._centered(self.q.reshape(M, taps), (M, 1)).T
        return np.ascontiguousarray(w.reshape((taps, M) + (1,) * (len(self.shape) - 2)))

    def ranges(self, K: int, amax: float) -> list[tuple[int, int]]:
        return self.exact.ranges(K, amax, self._magnitudes)


_TILE = 1 << 21  # elements of the column matrix built at a time


def _gemm_chunked(Wm: np.ndarray, cols: np.ndarray, chunks) -> np.ndarray:
    """Wm @ cols over the reduction ranges ``chunks`` (float32 each, summed in float64)."""
    if len(chunks) == 1:
        return np.matmul(Wm, cols)
    acc = None
    for k0, k1 in chunks:
        part = np.matmul(Wm[..., k0:k1], cols[..., k0:k1, :])
        if acc is None:
            acc = part.astype(F64)
        else:
            acc += part
    return acc


class IntConv:
    """Exact integer convolution on float arrays (the Conv attributes, once)."""

    def __init__(self, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None,
                 pads=None, strides=None) -> None:
        self.auto_pad = text_attribute(auto_pad)
        self.dilations = dilations
        self.group = int(group)
        self.kernel_shape = kernel_shape
        self.pads = tuple(int(v) for v in pads) if pads is not None and len(pads) else ()
        self.strides = strides

    def __call__(self, Xc: np.ndarray, amax: float, w: IntConvWeights) -> np.ndarray:
        """(N, M, *outs) accumulators of Xc (zero point removed) convolved with w."""
        nd = Xc.ndim - 2
        if nd < 1:
            raise ValueError(f"convolution input must have rank >= 3, got {Xc.ndim}")
        kernel = tuple(w.shape[2:])
        strides = _ints(self.strides, nd, 1)
        dilations = _ints(self.dilations, nd, 1)
        g = self.group
        N, C = Xc.shape[:2]
        M = w.shape[0]
        if C != w.shape[1] * g:
            raise ValueError(f"input channels {C} != weight channels {w.shape[1]} * group {g}")
        heads, _, outs = window_geometry(Xc.shape[2:], kernel, strides, dilations, self.pads,
                                         self.auto_pad)
        CK = C // g * int(np.prod(kernel))
        chunks = w.ranges(CK, amax)
        X = Xc.astype(F32, copy=False)
        if w.depthwise and C == M:
            Xp = pad_spatial(X, heads, outs, kernel, strides, dilations, 0)
            cdt = F32 if len(chunks) == 1 else F64
            Y = tmp = None
            taps = w.taps()
            for i, (_, idx) in enumerate(window_slices(outs, kernel, strides, dilations)):
                tap = taps[i]
                if Y is None:
                    Y = np.multiply(Xp[idx], tap, dtype=cdt)
                    tmp = np.empty_like(Y)
                else:
                    np.multiply(Xp[idx], tap, out=tmp, dtype=cdt)
                    Y += tmp
            return Y
        Wm = w.gemm()
        O = int(np.prod(outs))
        if all(k == 1 for k in kernel) and not any(heads) and all(s == 1 for s in strides) \
                and outs == X.shape[2:]:
            Y = _gemm_chunked(Wm, X.reshape(N, g, C // g, O), chunks)
            return Y.reshape((N, M) + outs)
        Xp = pad_spatial(X, heads, outs, kernel, strides, dilations, 0)
        st = Xp.strides
        view = as_strided(
            Xp, shape=Xp.shape[:2] + kernel + outs,
            strides=st[:2] + tuple(st[2 + i] * dilations[i] for i in range(nd))
            + tuple(st[2 + i] * strides[i] for i in range(nd)),
            writeable=False,
        )
        rest = O // outs[0]
        Y = np.empty((N, g, M // g) + outs, dtype=F32 if len(chunks) == 1 else F64)
        rows = max(1, min(outs[0], _TILE // max(1, N * g * CK * rest)))
        lead = (slice(None),) * (2 + nd)
        for r in range(0, outs[0], rows):
            n = min(rows, outs[0] - r)
            cols = view[lead + (slice(r, r + n),)].reshape(N, g, CK, n * rest)
            Y[(slice(None),) * 3 + (slice(r, r + n),)] = _gemm_chunked(Wm, cols, chunks).reshape(
                (N, g, M // g, n) + outs[1:])
        return Y.reshape((N, M) + outs)


def _conv_weights(ctx: KernelContext, w_index: int, zp_index: int, group: int):
    W, zp = ctx.constant(w_index), ctx.constant(zp_index)
    has_zp = ctx.has_input(zp_index)
    if W is not None and (zp is not None or not has_zp):
        return IntConvWeights(W, zp, group)
    return None


@op("ConvInteger", 10)
class ConvInteger:
    def __init__(self, ctx: KernelContext, *, auto_pad="NOTSET", dilations=None, group=1,
                 kernel_shape=None, pads=None, strides=None) -> None:
        self.conv = IntConv(auto_pad=auto_pad, dilations=dilations, group=group,
                            kernel_shape=kernel_shape, pads=pads, strides=strides)
        self.w = _conv_weights(ctx, 1, 3, self.conv.group)

    def __call__(self, x, w, x_zero_point=None, w_zero_point=None):
        wp = self.w if self.w is not None else IntConvWeights(w, w_zero_point, self.conv.group)
        zp = scalar(x_zero_point, 0)
        acc = self.conv(centered(x, zp), centered_absmax(x, zp), wp)
        return acc.astype(np.int32)


@op("QLinearConv", 10)
class QLinearConv:
    def __init__(self, ctx: KernelContext, *, auto_pad="NOTSET", dilations=None, group=1,
                 kernel_shape=None, pads=None, strides=None) -> None:
        self.conv = IntConv(auto_pad=auto_pad, dilations=dilations, group=group,
                            kernel_shape=kernel_shape, pads=pads, strides=strides)
        self.w = _conv_weights(ctx, 3, 5, self.conv.group)
        self.compiled = None
        if self.w is not None:
            from .int8_conv import CompiledQLinearConv

            self.compiled = CompiledQLinearConv.prepare(ctx, self.conv, ctx.constant(3),
                                                        ctx.constant(5))

    def __call__(self, x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale,
                 y_zero_point=None, B=None):
        out_dtype = y_zero_point.dtype if y_zero_point is not None else x.dtype
        if self.compiled is not None and (x_zero_point is None or x_zero_point.size == 1):
            mult = output_multiplier(x_scale, w_scale.reshape(-1), y_scale)
            y = self.compiled(x, x_zero_point, mult, y_zero_point, out_dtype,
                              None if B is None or not B.size else B)
            if y is not None:
                return y
        wp = self.w if self.w is not None else IntConvWeights(w, w_zero_point, self.conv.group)
        zp = scalar(x_zero_point, 0)
        amax = centered_absmax(x, zp)
        acc = self.conv(centered(x, zp), amax, wp)
        nd = acc.ndim - 2
        if B is not None and B.size:
            bias = B.reshape((-1,) + (1,) * nd)
            if acc.dtype == F32 and amax * wp.rowsum + float(np.abs(B).max()) >= F32_EXACT:
                acc = acc.astype(F64)
            acc += bias.astype(acc.dtype)
        mult = output_multiplier(x_scale, w_scale.reshape(-1), y_scale)
        if mult.size > 1:
            mult = mult.reshape((-1,) + (1,) * nd)
        return requantize(acc, mult, y_zero_point, out_dtype)


def broadcasts_per_channel(shape, channels: int, rank: int) -> bool:
    """Whether a tensor of ``shape`` broadcasts against an (N, channels, *spatial) tensor of
    ``rank`` dims as one value, or as one value per channel (the channel axis right-aligned)."""
    if len(shape) > rank:
        return False
    if all(d == 1 for d in shape):
        return True
    channel = len(shape) - (rank - 1)
    return channel >= 0 and all(d == (channels if i == channel else 1)
                                for i, d in enumerate(shape))


def clip_bounds(activation, activation_params) -> tuple[float, float] | None:
    """ConvIntegerToFloat's fused activation as the bounds it clips to (None: no activation):
    "Relu" is (0, inf), "Clip" its [min, max]. The CUDA kernel shares it."""
    activation = activation.decode() if isinstance(activation, bytes) else activation
    params = [float(p) for p in activation_params or ()]
    if activation in ("", None):
        return None
    if activation == "Relu":
        return (0.0, np.inf)
    if activation == "Clip" and len(params) == 2:
        return (params[0], params[1])
    raise ValueError(f"ConvIntegerToFloat: unsupported activation {activation!r} "
                     f"{params} (Relu, or Clip with [min, max])")


@op("ConvIntegerToFloat", 1, domain=ONNXRUN_DOMAIN)
class ConvIntegerToFloat:
    """onnxrun's fusion of a dynamically quantized convolution (ConvIntegerToFloatFusion):
    ConvInteger(x, w, x_zp, w_zp) -> Cast(float) -> Mul(scale) [-> Add(bias)], that is
    ``float32(acc) * scale (+ bias)`` with the graph's broadcasting. ``scale`` (x_scale *
    w_scale) and ``bias`` are per tensor or per output channel. On the compiled kernels the
    scale and bias are the GEMM's epilogue: one pass instead of four. ``activation`` "Relu"
    or "Clip" (``activation_params`` = [min, max], as FusedConv's) clips the result, in the
    epilogue too (the fusion takes a following Relu / Clip in)."""

    def __init__(self, ctx: KernelContext, *, activation="", activation_params=None,
                 auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None,
                 strides=None) -> None:
        self.conv = IntConv(auto_pad=auto_pad, dilations=dilations, group=group,
                            kernel_shape=kernel_shape, pads=pads, strides=strides)
        self.clip = clip_bounds(activation, activation_params)
        self.w = _conv_weights(ctx, 1, 4, self.conv.group)
        self.compiled = None
        if self.w is not None:
            from .int8_conv import CompiledQLinearConv

            self.compiled = CompiledQLinearConv.prepare(ctx, self.conv, ctx.constant(1),
                                                        ctx.constant(4), float_output=True)

    def __call__(self, x, w, scale, x_zero_point=None, w_zero_point=None, bias=None):
        M = w.shape[0]
        params = (scale,) if bias is None else (scale, bias)
        if self.compiled is not None and x.ndim == 4 and \
                (x_zero_point is None or x_zero_point.size == 1) and \
                all(p.dtype == F32 and broadcasts_per_channel(p.shape, M, 4) for p in params):
            y = self.compiled(x, x_zero_point, scale.reshape(-1), None, F32, None,
                              None if bias is None else bias.reshape(-1), self.clip)
            if y is not None:
                return y
        wp = self.w if self.w is not None else IntConvWeights(w, w_zero_point, self.conv.group)
        zp = scalar(x_zero_point, 0)
        acc = self.conv(centered(x, zp), centered_absmax(x, zp), wp)
        Y = np.asarray(acc.astype(np.int32).astype(F32) * scale)  # as Cast then Mul
        if bias is not None:
            Y = np.asarray(Y + bias)
        if self.clip is not None:
            np.clip(Y, F32.type(self.clip[0]), F32.type(self.clip[1]), out=Y)
        return Y


__all__ = [
    "F32", "F32_EXACT", "FLOAT8", "INT8_SPAN", "DequantizeLinear", "IntConv", "IntConvWeights",
    "IntMatrix", "QuantizeLinear", "broadcast_param", "broadcasts_per_channel", "centered",
    "centered_absmax", "compiled_matmul", "dequantize", "dequantizes_weight_per_run",
    "int_matmul", "int_range", "is_int8", "k_chunks", "mm", "output_multiplier", "quantize",
    "requantize", "scalar",
]
