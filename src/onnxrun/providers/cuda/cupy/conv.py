"""im2col on CuPy: the windows of the padded input as one strided view, gathered by one copy
(the generic path stacks one slice per kernel offset)."""

from __future__ import annotations

from typing import Any

from ..ops import _windows


def im2col(X: Any, before: list[int], after: list[int], out: list[int], strides: list[int],
           dil: list[int], kernel: list[int], groups: int) -> Any:
    import cupy

    p = _windows.padded(X, before, after, out, strides, dil, kernel, 0.0)
    n = len(out)
    N, C = p.shape[:2]
    s = p.strides
    shape = (N, C, *kernel, *out)
    st = (s[0], s[1], *(s[2 + i] * dil[i] for i in range(n)),
          *(s[2 + i] * strides[i] for i in range(n)))
    view = cupy.lib.stride_tricks.as_strided(p, shape=shape, strides=st)
    K = 1
    for k in kernel:
        K *= k
    L = 1
    for o in out:
        L *= o
    return cupy.ascontiguousarray(view).reshape(N, groups, (C // groups) * K, L)
