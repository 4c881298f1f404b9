"""QuantizeLinear / DequantizeLinear, per tensor or per axis, 8-bit (the QDQ pairs of a model
that keeps them in float). Blocked quantization, float8 and 4-bit types stay on the CPU."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..array import namespace, normalize_axis
from ..kernels import KernelContext, op

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
