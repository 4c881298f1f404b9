"""Reductions (axes as an attribute, or from opset 13/18 as a host input), ArgMax / ArgMin."""

from __future__ import annotations

from typing import Any

from ..array import namespace, normalize_axis
from ..kernels import op


def _axes(x: Any, axes: Any, noop_with_empty_axes: int) -> tuple[int, ...] | None:
    """None: reduce nothing (empty axes with noop_with_empty_axes)."""
    if axes is None or len(axes) == 0:
        return None if noop_with_empty_axes else tuple(range(x.ndim))
    return tuple(sorted(normalize_axis(int(a), x.ndim) for a in list(axes)))


def _reduction(name: str, attr_versions: tuple[int, ...], input_versions: tuple[int, ...],
               fn: Any) -> None:
    def with_attribute(data, *, axes=None, keepdims=1):
        return _apply(data, _axes(data, axes, 0), keepdims, fn)

    def with_input(data, axes=None, *, keepdims=1, noop_with_empty_axes=0):
        return _apply(data, _axes(data, axes, noop_with_empty_axes), keepdims, fn)

    with_attribute.__name__ = with_input.__name__ = name
    op(name, *attr_versions)(with_attribute)
    op(name, *input_versions, host_inputs=(1,))(with_input)


def _apply(data: Any, axes: tuple[int, ...] | None, keepdims: int, fn: Any) -> Any:
    if axes is None:
        return data
    return fn(namespace(data), data, axes, bool(keepdims))


_reduction("ReduceSum", (1, 11), (13,), lambda xp, x, a, k: xp.sum(x, axis=a, keepdims=k))
_reduction("ReduceMean", (1, 11, 13), (18,),
           lambda xp, x, a, k: xp.mean(x, axis=a, keepdims=k))
_reduction("ReduceMax", (1, 11, 12, 13), (18, 20),
           lambda xp, x, a, k: xp.max(x, axis=a, keepdims=k))
_reduction("ReduceMin", (1, 11, 12, 13), (18, 20),
           lambda xp, x, a, k: xp.min(x, axis=a, keepdims=k))
_reduction("ReduceProd", (1, 11, 13), (18,),
           lambda xp, x, a, k: xp.prod(x, axis=a, keepdims=k))
_reduction("ReduceSumSquare", (1, 11, 13), (18,),
           lambda xp, x, a, k: xp.sum(x * x, axis=a, keepdims=k))
_reduction("ReduceL2", (1, 11, 13), (18,),
           lambda xp, x, a, k: xp.sqrt(xp.sum(x * x, axis=a, keepdims=k)))
_reduction("ReduceL1", (1, 11, 13), (18,),
           lambda xp, x, a, k: xp.sum(xp.abs(x), axis=a, keepdims=k))


def _arg(name: str, fn_name: str) -> None:
    def kernel(data, *, axis=0, keepdims=1, select_last_index=0):
        xp = namespace(data)
        a = normalize_axis(axis, data.ndim)
        fn = getattr(xp, fn_name)
        if select_last_index:
            flipped = xp.flip(data, axis=a)
            idx = (data.shape[a] - 1) - fn(flipped, axis=a, keepdims=bool(keepdims))
        else:
            idx = fn(data, axis=a, keepdims=bool(keepdims))
        return xp.astype(idx, xp.int64)

    kernel.__name__ = name
    op(name, 1, 11, 12, 13)(kernel)


_arg("ArgMax", "argmax")
_arg("ArgMin", "argmin")
