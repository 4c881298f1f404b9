"""Quantization types, formats and the arithmetic of scales and zero points.

The enums have onnxruntime's names and values (``onnxruntime.quantization.QuantType`` and
friends), so code written for onnxruntime's tool runs unchanged. The helpers compute scales and
zero points exactly as onnxruntime's tool does (same ranges, same rounding, same dtypes), so a
model quantized by either tool holds the same parameters for the same calibration ranges.
"""

from __future__ import annotations

from enum import Enum

import ml_dtypes
import numpy as np
from onnx import TensorProto


class QuantizationMode(Enum):
    IntegerOps = 0  # dynamic: ConvInteger, MatMulInteger, DynamicQuantizeLSTM
    QLinearOps = 1  # static: QLinearConv, QLinearMatMul...

    def __str__(self) -> str:
        return self.name

    @staticmethod
    def from_string(mode: str) -> QuantizationMode:
        try:
            return QuantizationMode[mode]
        except KeyError:
            raise ValueError(f"unknown quantization mode {mode!r}") from None


class QuantType(Enum):
    QInt8 = 0
    QUInt8 = 1
    QFLOAT8E4M3FN = 2
    QInt16 = 3
    QUInt16 = 4
    QInt4 = 5
    QUInt4 = 6

    def __str__(self) -> str:
        return self.name

    @staticmethod
    def from_string(t: str) -> QuantType:
        try:
            return QuantType[t]
        except KeyError:
            raise ValueError(f"unknown quantization type {t!r}") from None

    @property
    def tensor_type(self) -> int:
        return _TENSOR_TYPES[self]


_TENSOR_TYPES = {
    QuantType.QInt8: TensorProto.INT8, QuantType.QUInt8: TensorProto.UINT8,
    QuantType.QInt16: TensorProto.INT16, QuantType.QUInt16: TensorProto.UINT16,
    QuantType.QInt4: TensorProto.INT4, QuantType.QUInt4: TensorProto.UINT4,
    QuantType.QFLOAT8E4M3FN: TensorProto.FLOAT8E4M3FN,
}


class QuantFormat(Enum):
    QOperator = 0  # quantized operators (QLinearConv...)
    QDQ = 1  # float operators between QuantizeLinear / DequantizeLinear pairs

    def __str__(self) -> str:
        return self.name

    @staticmethod
    def from_string(fmt: str) -> QuantFormat:
        try:
            return QuantFormat[fmt]
        except KeyError:
            raise ValueError(f"unknown quantization format {fmt!r}") from None


class CalibrationMethod(Enum):
    MinMax = 0
    Entropy = 1
    Percentile = 2
    Distribution = 3


# -- element types ------------------------------------------------------------------------------

NP_TYPES = {
    TensorProto.INT8: np.dtype(np.int8), TensorProto.UINT8: np.dtype(np.uint8),
    TensorProto.INT16: np.dtype(np.int16), TensorProto.UINT16: np.dtype(np.uint16),
    TensorProto.INT4: np.dtype(ml_dtypes.int4), TensorProto.UINT4: np.dtype(ml_dtypes.uint4),
    TensorProto.INT32: np.dtype(np.int32),
    TensorProto.FLOAT8E4M3FN: np.dtype(ml_dtypes.float8_e4m3fn),
}

# (qmin, qmax) per type: full, symmetric (signed types drop their lowest value so that the
# range is centered on 0) and reduced (7 bits of 8, for CPUs whose u8s8 products saturate).
_FULL = {TensorProto.UINT8: (0, 255), TensorProto.INT8: (-128, 127),
         TensorProto.UINT16: (0, 65535), TensorProto.INT16: (-32768, 32767),
         TensorProto.UINT4: (0, 15), TensorProto.INT4: (-8, 7)}
_SYMMETRIC = {TensorProto.INT8: (-127, 127), TensorProto.INT16: (-32767, 32767)}
_REDUCED = {TensorProto.UINT8: (0, 127), TensorProto.INT8: (-64, 64),
            TensorProto.UINT16: (0, 32767), TensorProto.INT16: (-16384, 16384),
            TensorProto.UINT4: (0, 7), TensorProto.INT4: (-4, 3)}


def qtype_of(t: QuantType | int) -> int:
    """The TensorProto element type of a QuantType (or of an element type, returned as is)."""
    return t.tensor_type if isinstance(t, QuantType) else int(t)


def is_signed(qtype: int) -> bool:
    return qtype in (TensorProto.INT8, TensorProto.INT16, TensorProto.INT4)


def get_qmin_qmax_for_qType(qtype, reduce_range: bool = False,  # noqa: N802 (onnxruntime's name)
                            symmetric: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(qmin, qmax) as 0-d arrays of the quantized type, as onnxruntime's helper returns them."""
    qtype = qtype_of(qtype)
    if qtype not in _FULL:
        raise ValueError(f"unsupported quantization type {TensorProto.DataType.Name(qtype)}")
    if reduce_range:
        lo, hi = _REDUCED[qtype]
    elif symmetric and qtype in _SYMMETRIC:
        lo, hi = _SYMMETRIC[qtype]
    else:
        lo, hi = _FULL[qtype]
    dt = NP_TYPES[qtype]
    return np.array(lo, dtype=dt), np.array(hi, dtype=dt)


def compute_scale_zp(rmin, rmax, qmin, qmax, symmetric: bool = False,
                     min_real_range: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Scale and zero point mapping [rmin, rmax] (widened to hold 0) onto [qmin, qmax].

    Element-wise over arrays of ranges (per channel). Returns ``(zero_point, scale)`` in
    onnxruntime's order; the scale has rmax's float dtype, the zero point qmin's dtype.
    """
    rmin = np.asarray(rmin)
    rmax = np.asarray(rmax)
    fdt = rmax.dtype if rmax.dtype.kind == "f" else np.dtype(np.float32)
    qdt = np.asarray(qmin).dtype
    lo = np.minimum(rmin, 0).astype(np.float64)
    hi = np.maximum(rmax, 0).astype(np.float64)
    if min_real_range is not None:
        hi = np.maximum(hi, lo + float(min_real_range))
    if symmetric:
        absmax = np.maximum(np.abs(lo), np.abs(hi))
        lo, hi = -absmax, absmax
    qlo, qhi = float(qmin), float(qmax)
    scale = (hi - lo) / (qhi - qlo)
    tiny = np.finfo(fdt).smallest_subnormal if fdt == np.float16 else np.finfo(fdt).tiny
    stored = scale.astype(fdt)
    degenerate = (stored if fdt == np.float16 else scale) < tiny
    if symmetric:
        zp = np.full(scale.shape, np.round((qlo + qhi) / 2.0))
    else:
        with np.errstate(divide="ignore", invalid="ignore"):
            zp = np.round(qlo - lo / np.where(degenerate, 1.0, scale))
    zp = np.where(degenerate, 0.0, np.clip(zp, qlo, qhi))
    stored = np.where(degenerate, np.ones_like(stored), stored)
    return np.asarray(zp.astype(qdt)), np.asarray(stored.astype(fdt))


def snap_zero_point_to_uint8(rmin, rmax, qmin: int = 0, qmax: int = 255,
                             min_real_range: float | None = None
                             ) -> tuple[np.ndarray, np.ndarray]:
    """A uint8 zero point snapped to ``qmin`` (rmin >= 0) or to the middle of the range, with
    the smallest scale that still covers [rmin, rmax] (the ActivationRestrictedAsymmetric option).
    Returns ``(zero_point uint8, scale float32)``."""
    lo_q, hi_q = int(qmin), int(qmax)
    mid = (lo_q + hi_q + 1) // 2
    lo = min(float(np.squeeze(rmin)), 0.0)
    hi = max(float(np.squeeze(rmax)), 0.0)
    if min_real_range is not None and min_real_range > 0:
        hi = max(hi, lo + float(min_real_range))
    floor = float(min_real_range) / (hi_q - lo_q) if min_real_range is not None else 0.0
    if hi <= lo:  # a degenerate range: a scale from its magnitude, not 1.0
        zp = lo_q if lo >= 0.0 else mid
        span = (hi_q - lo_q) if zp == lo_q else max(1, (hi_q - lo_q) // 2)
        mag = max(abs(lo), abs(hi)) or 1.0
        scale = max(mag / max(1, span), floor)
    elif lo >= 0.0:
        zp, scale = lo_q, max(hi / (hi_q - lo_q), floor)
    else:
        zp, scale = mid, max(-lo / (mid - lo_q), hi / (hi_q - mid), floor)
    return np.array(zp, dtype=np.uint8), np.array(scale, dtype=np.float32)


def compute_scale_zp_blocked(weight: np.ndarray, quant_type: int, axis: int, block_size: int,
                             symmetric: bool) -> tuple[np.ndarray, np.ndarray]:
    """Per-block ``(zero_point, scale)`` of a rank-2 weight: blocks of ``block_size`` along
    ``axis``; both results have the weight's shape with ``ceil(shape[axis] / block_size)`` at
    ``axis`` (opset 21's blocked QuantizeLinear)."""
    if weight.ndim != 2:
        raise NotImplementedError(
            f"block-wise quantization takes rank-2 weights, got shape {weight.shape}")
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    axis = axis % 2
    moved = np.moveaxis(weight, axis, 0)
    k = moved.shape[0]
    nblocks = -(-k // block_size)
    pad = nblocks * block_size - k
    padded = np.concatenate([moved, np.repeat(moved[-1:], pad, axis=0)]) if pad else moved
    blocks = padded.reshape(nblocks, block_size, -1)
    qmin, qmax = get_qmin_qmax_for_qType(quant_type, symmetric=symmetric)
    zp, scale = compute_scale_zp(blocks.min(axis=1), blocks.max(axis=1), qmin, qmax, symmetric)
    return np.moveaxis(zp, 0, axis), np.moveaxis(scale, 0, axis)


_F8 = np.dtype(ml_dtypes.float8_e4m3fn)
_F8_MAX = 448.0  # the largest finite E4M3FN value: QuantizeLinear saturates to it


def compute_scale_zp_float8(element_type: int, std) -> tuple[np.ndarray, np.ndarray]:
    """Float 8 (E4M3FN) parameters from a tensor's standard deviation: the scale maps it onto the
    standard deviation of the finite float 8 values (both taken as gaussian); zero point 0."""
    if qtype_of(element_type) != TensorProto.FLOAT8E4M3FN:
        raise ValueError(f"float 8 quantization to element type {element_type} is not supported")
    std = np.asarray(std)
    scale = np.asarray(std / _float8_std(), dtype=std.dtype if std.dtype.kind == "f"
                       else np.float32)
    return np.zeros((), _F8), scale


def _float8_std() -> np.float32:
    values = np.arange(256, dtype=np.uint8).view(_F8).astype(np.float32)
    return np.std(values[np.isfinite(values)])


def quantize_nparray(qtype, arr: np.ndarray, scale, zero_point, low=None, high=None
                     ) -> np.ndarray:
    """round_half_even(arr / scale) + zero_point, clipped to the type's range (or low/high);
    float 8: arr / scale rounded to the nearest E4M3FN value, saturated at +-448."""
    qtype = qtype_of(qtype)
    if qtype == TensorProto.FLOAT8E4M3FN:
        if np.any(np.asarray(zero_point).astype(np.float32) != 0):
            raise NotImplementedError("float 8 quantization takes a zero point of 0 only")
        v = np.asarray(arr, np.float32) / np.asarray(scale, np.float32)
        return np.clip(v, -_F8_MAX, _F8_MAX).astype(_F8)
    qmin, qmax = get_qmin_qmax_for_qType(qtype)
    lo = float(qmin) if low is None else max(float(qmin), float(low))
    hi = float(qmax) if high is None else min(float(qmax), float(high))
    # 0-d inputs too: arithmetic on 0-d arrays gives numpy scalars, which clip(out=) rejects
    v = np.round(np.asarray(arr, np.float32) / scale)
    v = np.asarray(v + np.asarray(zero_point).astype(np.float32))
    return np.clip(v, lo, hi).astype(NP_TYPES[qtype])


def quantize_data(data: np.ndarray, qtype, symmetric: bool, reduce_range: bool = False,
                  min_real_range: float | None = None, axis: int | None = None
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Quantize a weight per tensor (``axis`` None) or per channel along ``axis``.

    Returns ``(zero_point, scale, quantized)``: scalars per tensor, 1-D arrays per channel.
    """
    qtype = qtype_of(qtype)
    if qtype == TensorProto.FLOAT8E4M3FN:
        if reduce_range:
            raise ValueError("reduce_range is not supported for float 8")
        if axis is not None:
            others = tuple(i for i in range(data.ndim) if i != axis % data.ndim)
            zp, scale = compute_scale_zp_float8(qtype, np.std(data, axis=others))
            zp = np.zeros(scale.shape, _F8)
            shape = [-1 if i == axis % data.ndim else 1 for i in range(data.ndim)]
            return zp, scale, quantize_nparray(qtype, data, scale.reshape(shape), 0)
        zp, scale = compute_scale_zp_float8(qtype, np.std(data))
        return zp, scale, quantize_nparray(qtype, data, scale, zp)
    qmin, qmax = get_qmin_qmax_for_qType(qtype, reduce_range, symmetric)
    if axis is None:
        rmin = data.min() if data.size else np.zeros((), data.dtype)
        rmax = data.max() if data.size else np.zeros((), data.dtype)
        zp, scale = compute_scale_zp(rmin, rmax, qmin, qmax, symmetric, min_real_range)
        return zp, scale, quantize_nparray(qtype, data, scale, zp)
    axis = axis % data.ndim
    others = tuple(i for i in range(data.ndim) if i != axis)
    rmin = data.min(axis=others) if data.size else np.zeros(data.shape[axis], data.dtype)
    rmax = data.max(axis=others) if data.size else np.zeros(data.shape[axis], data.dtype)
    zp, scale = compute_scale_zp(rmin, rmax, qmin, qmax, symmetric, min_real_range)
    shape = [-1 if i == axis else 1 for i in range(data.ndim)]
    q = quantize_nparray(qtype, data, scale.reshape(shape), zp.reshape(shape))
    return zp, scale, q


def default_weight_symmetric(qtype) -> bool:
    """onnxruntime's default: signed weight types are quantized symmetrically."""
    return qtype_of(qtype) in (TensorProto.INT8, TensorProto.INT16, TensorProto.INT4,
                               TensorProto.FLOAT8E4M3FN)


__all__ = [
    "CalibrationMethod", "QuantFormat", "QuantType", "QuantizationMode", "compute_scale_zp",
    "compute_scale_zp_blocked", "compute_scale_zp_float8",
    "get_qmin_qmax_for_qType", "quantize_data", "quantize_nparray",
]
