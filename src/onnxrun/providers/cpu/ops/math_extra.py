"""Miscellaneous ai.onnx math operators: Det, CumProd, BitCast and Swish."""

from __future__ import annotations

import numpy as np

from ....dtypes import np_dtype
from ..kernels import KernelContext, op


def _wide(dtype: np.dtype) -> np.dtype:
    """Half-precision types compute in float32 (LAPACK and exp have no float16 paths)."""
    return dtype if dtype in (np.float32, np.float64) else np.dtype(np.float32)


@op("Det", 11, 22)
def Det(X):
    if X.ndim < 2 or X.shape[-1] != X.shape[-2]:
        raise ValueError(f"Det: input must be [*, M, M], got {X.shape}")
    return np.asarray(np.linalg.det(X.astype(_wide(X.dtype), copy=False)), dtype=X.dtype)


@op("CumProd", 26)
def CumProd(x, axis, *, exclusive=0, reverse=0):
    ax = int(np.asarray(axis).reshape(()))
    if not -x.ndim <= ax < x.ndim:
        raise ValueError(f"CumProd: axis {ax} out of range for rank {x.ndim}")
    ax %= x.ndim
    dt = _wide(x.dtype) if x.dtype.kind == "f" or x.dtype.itemsize < 4 else x.dtype
    data = np.flip(x, ax) if reverse else x
    if exclusive:
        # shift by one along the axis, the first product being the empty product 1
        ones = np.ones_like(np.take(data, [0], axis=ax))
        data = np.concatenate([ones, np.delete(data, -1, axis=ax)], axis=ax) \
            if data.shape[ax] else data
    out = np.cumprod(data, axis=ax, dtype=dt)
    if reverse:
        out = np.flip(out, ax)
    return np.ascontiguousarray(out.astype(x.dtype, copy=False))


_SUB_BYTE_BITS = {"int4": 4, "uint4": 4, "float4_e2m1fn": 4, "int2": 2, "uint2": 2}


def _bit_width(dt: np.dtype) -> int:
    return _SUB_BYTE_BITS.get(dt.name, dt.itemsize * 8)


@op("BitCast", 26)
class BitCast:
    def __init__(self, ctx: KernelContext, *, to):
        self.to = np_dtype(int(to))
        if self.to.kind in "OUS":
            raise ValueError("BitCast: string types cannot be bit-cast")

    def __call__(self, input):
        if input.dtype.kind in "OUS":
            raise ValueError("BitCast: string types cannot be bit-cast")
        bits = _bit_width(input.dtype)
        if bits != _bit_width(self.to):
            raise ValueError(f"BitCast: {input.dtype} ({bits} bits) and {self.to} "
                             f"({_bit_width(self.to)} bits) differ in width")
        # (ascontiguousarray would turn a 0-d array into 1-d: reshape back)
        src = np.ascontiguousarray(input).reshape(input.shape)
        if bits < 8:
            # sub-byte types occupy the low bits of one byte each
            raw = src.view(np.uint8) & np.uint8((1 << bits) - 1)
            return raw.view(self.to)
        if src.dtype.byteorder == ">":  # the bytes are defined as little endian
            src = src.astype(src.dtype.newbyteorder("<"))
        return src.view(self.to)


@op("Swish", 24)
def Swish(X, *, alpha=1.0):
    ct = _wide(X.dtype)
    x = X.astype(ct, copy=False)
    with np.errstate(over="ignore"):
        y = x / (1 + np.exp(-ct.type(alpha) * x))
    return y.astype(X.dtype, copy=False)
