"""Dense arrays in any axis order: the compiled element-wise kernels work on the flat memory of
an array whose elements fill one block (C order, or a permutation such as the channels-last
memory behind an NCHW-shaped view) and give their result the same layout."""

from __future__ import annotations

import ctypes
import math

import numpy as np


def dense_order(a: np.ndarray) -> tuple[int, ...] | None:
    """The axis order (outermost first) in which ``a``'s memory is C-contiguous, or None."""
    if a.flags.c_contiguous:
        return tuple(range(a.ndim))
    if any(s <= 0 for s in a.strides):
        return None
    order = tuple(sorted(range(a.ndim), key=lambda i: -a.strides[i]))
    return order if a.transpose(order).flags.c_contiguous else None


def flat(a: np.ndarray, order: tuple[int, ...]) -> np.ndarray:
    """The memory of a dense ``a`` (axis order ``order``) as a 1-D array."""
    if a.flags.c_contiguous:  # the usual case, without a transpose's cost
        return a.reshape(-1)
    return a.transpose(order).reshape(-1)


def flat_out(out: np.ndarray | None, a: np.ndarray, order: tuple[int, ...]) -> np.ndarray | None:
    """``out`` (a buffer the executor hands a kernel: memory.py) as the 1-D memory of a result
    like ``a`` in ``order``, when it has ``a``'s shape and dtype and is dense in that order."""
    if out is None or out.shape != a.shape or out.dtype != a.dtype:
        return None
    t = out if order == tuple(range(a.ndim)) else out.transpose(order)
    return t.reshape(-1) if t.flags.c_contiguous else None


def shaped_like(buffer: np.ndarray, a: np.ndarray, order: tuple[int, ...]) -> np.ndarray:
    """A 1-D ``buffer`` viewed with ``a``'s shape and memory order."""
    if order == tuple(range(a.ndim)):  # C order: no argsort, no transpose (a decode step's
        return buffer.reshape(a.shape)  # SiLU is a few microseconds of arithmetic)
    permuted = buffer.reshape(tuple(a.shape[i] for i in order))
    inverse = np.argsort(order)
    return permuted.transpose(inverse)


def aligned_zeros(shape, dtype, align: int = 64) -> np.ndarray:
    """Zeros whose first byte is ``align``-aligned: a 64-byte vector load that straddles two
    cache lines costs twice (packed weights are loaded once per tile step)."""
    return _aligned(np.zeros, shape, dtype, align)


def aligned_empty(shape, dtype, align: int = 64) -> np.ndarray:
    """``aligned_zeros`` without the zeros, for a caller that writes every element (packed
    weights: zeroing them first was a second pass over each, ~5% of a CNN's creation)."""
    return _aligned(np.empty, shape, dtype, align)


def _aligned(make, shape, dtype, align: int) -> np.ndarray:
    # (math.prod and the buffer's address through ctypes.addressof: np.prod of a tuple and
    # ``.ctypes.data`` were most of this function's ~30 us, asked ~200 times per CNN session)
    dtype = np.dtype(dtype)
    n = int(shape if isinstance(shape, int) else math.prod(shape)) * dtype.itemsize
    raw = make(n + align, np.uint8)
    start = -ctypes.addressof(ctypes.c_char.from_buffer(raw)) % align
    return raw[start:start + n].view(dtype).reshape(shape)


__all__ = ["aligned_empty", "aligned_zeros", "dense_order", "flat", "shaped_like"]
