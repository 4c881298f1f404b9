"""Dense arrays in any axis order: the compiled element-wise kernels work on the flat memory of
an array whose elements fill one block (C order, or a permutation such as the channels-last
memory behind an NCHW-shaped view) and give their result the same layout."""

from __future__ import annotations

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
    return a.transpose(order).reshape(-1)


def shaped_like(buffer: np.ndarray, a: np.ndarray, order: tuple[int, ...]) -> np.ndarray:
    """A 1-D ``buffer`` viewed with ``a``'s shape and memory order."""
    permuted = buffer.reshape(tuple(a.shape[i] for i in order))
    inverse = np.argsort(order)
    return permuted.transpose(inverse)


__all__ = ["dense_order", "flat", "shaped_like"]
