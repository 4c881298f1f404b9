"""MaxPool, AveragePool (windows as in ``_windows``), GlobalAveragePool, GlobalMaxPool."""

from __future__ import annotations

from typing import Any

from ..array import namespace
from ..kernels import KernelContext, op
from . import _windows


def _no_indices(node: Any) -> bool:
    outputs = node.graph.outputs if node.graph is not None else []
    return len(node.outputs) < 2 or not node.outputs[1].name or (
        not node.outputs[1].uses and node.outputs[1] not in outputs)


class _Pool:
    def __init__(self, ctx: KernelContext, *, auto_pad="NOTSET", ceil_mode=0, dilations=None,
                 kernel_shape, pads=None, strides=None, count_include_pad=0,
                 storage_order=0) -> None:
        self.kernel = [int(k) for k in kernel_shape]
        self.auto_pad, self.ceil_mode = auto_pad, int(ceil_mode)
        self.dilations = None if dilations is None else [int(d) for d in dilations]
        self.pads = None if pads is None else [int(p) for p in pads]
        self.strides = None if strides is None else [int(s) for s in strides]
        self.count_include_pad = int(count_include_pad)

    def windows(self, X: Any, value: float) -> tuple[list[Any], list[int], tuple]:
        strides, dil, before, after, out = _windows.geometry(
            tuple(X.shape[2:]), self.kernel, self.strides, self.dilations, self.pads,
            self.auto_pad, self.ceil_mode)
        p = _windows.padded(X, before, after, out, strides, dil, self.kernel, value)
        return _windows.patches(p, out, strides, dil, self.kernel), out, (before, after,
                                                                            strides, dil)


@op("MaxPool", 1, 8, 10, 11, 12, check=_no_indices)
class MaxPool(_Pool):
    def __call__(self, X):
        xp = namespace(X)
        low = -float("inf") if xp.isdtype(X.dtype, "real floating") else int(
            xp.iinfo(X.dtype).min)
        taken, _, _ = self.windows(X, low)
        y = taken[0]
        for t in taken[1:]:
            y = xp.maximum(y, t)
        return y


@op("AveragePool", 1, 7, 10, 11, 19)
class AveragePool(_Pool):
    def __call__(self, X):
        xp = namespace(X)
        taken, out, (before, after, strides, dil) = self.windows(X, 0.0)
        y = taken[0]
        for t in taken[1:]:
            y = y + t
        if self.count_include_pad and not self.ceil_mode:
            k = 1
            for s in self.kernel:
                k *= s
            return y / k
        # the number of real (or, with count_include_pad, explicitly padded) elements per
        # window: the same pool over a mask of ones
        ones = xp.ones((1, 1, *X.shape[2:]), dtype=X.dtype, device=X.device)
        if self.count_include_pad:
            spatial = [X.shape[2 + i] + before[i] + after[i] for i in range(len(before))]
            ones = xp.ones((1, 1, *spatial), dtype=X.dtype, device=X.device)
            before = [0] * len(before)
            after = [0] * len(after)
        p = _windows.padded(ones, before, after, out, strides, dil, self.kernel, 0.0)
        counts = _windows.patches(p, out, strides, dil, self.kernel)
        total = counts[0]
        for c in counts[1:]:
            total = total + c
        return y / total


@op("GlobalAveragePool", 1, 22)
def GlobalAveragePool(X):
    return namespace(X).mean(X, axis=tuple(range(2, X.ndim)), keepdims=True)


@op("GlobalMaxPool", 1, 22)
def GlobalMaxPool(X):
    return namespace(X).max(X, axis=tuple(range(2, X.ndim)), keepdims=True)
