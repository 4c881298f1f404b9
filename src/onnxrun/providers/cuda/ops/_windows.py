"""Sliding windows for Conv and the pools: padding and output sizes as ONNX defines them, and
the window patches as strided slices of a padded copy (the array API has no as_strided)."""

from __future__ import annotations

import math
from typing import Any

from ..array import namespace
from ..kernels import text_attribute


def geometry(spatial: tuple[int, ...], kernel: list[int], strides: list[int] | None,
             dilations: list[int] | None, pads: list[int] | None, auto_pad: Any,
             ceil_mode: int = 0) -> tuple[list[int], list[int], list[int], list[int], list[int]]:
    """(strides, dilations, pads before, pads after, output sizes)."""
    n = len(spatial)
    strides = list(strides) if strides is not None else [1] * n
    dilations = list(dilations) if dilations is not None else [1] * n
    mode = text_attribute(auto_pad or "NOTSET")
    before, after, out = [], [], []
    for i, size in enumerate(spatial):
        k = (kernel[i] - 1) * dilations[i] + 1
        if mode in ("SAME_UPPER", "SAME_LOWER"):
            o = -(-size // strides[i])
            total = max((o - 1) * strides[i] + k - size, 0)
            b = total // 2 if mode == "SAME_UPPER" else total - total // 2
            before.append(b)
            after.append(total - b)
        elif mode == "VALID":
            before.append(0)
            after.append(0)
        else:
            before.append(int(pads[i]) if pads is not None else 0)
            after.append(int(pads[i + n]) if pads is not None else 0)
        span = size + before[i] + after[i] - k
        o = (math.ceil(span / strides[i]) if ceil_mode else span // strides[i]) + 1
        if ceil_mode and (o - 1) * strides[i] >= size + before[i]:
            o -= 1  # the last window would start in the end padding
        out.append(o)
    return strides, dilations, before, after, out


def padded(x: Any, before: list[int], after: list[int], out: list[int], strides: list[int],
           dilations: list[int], kernel: list[int], value: float) -> Any:
    """``x`` padded with ``value`` so that every window of the output fits (ceil_mode's extra
    end padding included)."""
    xp = namespace(x)
    n = len(before)
    ends = [max((out[i] - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1,
                x.shape[2 + i] + before[i]) for i in range(n)]
    if all(b == 0 for b in before) and all(e == x.shape[2 + i] for i, e in enumerate(ends)):
        return x
    shape = (*x.shape[:2], *ends)
    p = xp.full(shape, value, dtype=x.dtype, device=x.device)
    index = (slice(None), slice(None), *(slice(before[i], before[i] + x.shape[2 + i])
                                         for i in range(n)))
    p[index] = x
    return p


def patches(p: Any, out: list[int], strides: list[int], dilations: list[int],
            kernel: list[int]) -> list[Any]:
    """One (N, C, *out) slice per kernel offset, in row-major kernel order."""
    n = len(out)
    offsets = [()]
    for i in range(n):
        offsets = [o + (j,) for o in offsets for j in range(kernel[i])]
    result = []
    for off in offsets:
        index = (slice(None), slice(None), *(
            slice(off[i] * dilations[i], off[i] * dilations[i] + (out[i] - 1) * strides[i] + 1,
                  strides[i]) for i in range(n)))
        result.append(p[index])
    return result
