"""Reductions (Reduce*), ArgMax/ArgMin, CumSum and TopK.

Reductions keep the input's element type: numpy would widen int32 sums to int64, so the
accumulator dtype is always explicit (float32 for float16/bfloat16, whose own precision is too
coarse to accumulate in).
"""

from __future__ import annotations

import numpy as np

from ..kernels import KernelContext, op

INT64 = np.int64


def _acc(dtype: np.dtype) -> np.dtype:
    """Accumulator dtype: narrow floats accumulate in float32, everything else in itself."""
    if dtype.kind in "fV" and dtype.itemsize < 4 or dtype.kind == "V":
        return np.dtype(np.float32)
    return dtype


_BLAS = (np.dtype(np.float32), np.dtype(np.float64))


def _trailing(x, axes) -> int:
    """Number of trailing elements reduced when ``axes`` are the last axes of a C-contiguous
    array (0 otherwise)."""
    if not axes or x.size < 4096 or not x.flags.c_contiguous or x.dtype not in _BLAS:
        return 0
    k = len(axes)
    if tuple(axes) != tuple(range(x.ndim - k, x.ndim)):
        return 0
    return int(np.prod(x.shape[x.ndim - k:]))


def sum_trailing(x, n):
    """Sum over the last ``n`` elements of each row: a BLAS gemv against ones, several times
    faster than numpy's reduction along a contiguous axis."""
    out = x.reshape(-1, n) @ np.ones(n, dtype=x.dtype)
    return out


def _sum(x, axes, keep):
    n = _trailing(x, axes)
    if n:
        out = sum_trailing(x, n)
        return out.reshape(_reduced_shape(x.shape, axes, keep))
    acc = _acc(x.dtype)
    # np.add.reduce is what np.sum calls, without its Python wrapper (~5 us a small call)
    return np.add.reduce(x, axis=axes, dtype=acc, keepdims=keep).astype(x.dtype, copy=False)


def _reduced_shape(shape, axes, keep):
    if keep:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def max_last(x):
    """Max over the last axis, keepdims: argmax (SIMD) plus a gather beats np.max (scalar)."""
    idx = np.argmax(x, axis=-1)[..., None]
    return np.take_along_axis(x, idx, axis=-1)


# (shape, axes, keepdims) -> the result's shape where every reduced axis has length 1 (and
# the result is an array), else None
_ONE_ELEMENT: dict[tuple, tuple[int, ...] | None] = {}


def _one_element(shape, axes, keep) -> tuple[int, ...] | None:
    key = (shape, axes, keep)
    got = _ONE_ELEMENT.get(key, False)
    if got is False:
        got = _reduced_shape(shape, axes, keep) if axes and all(
            shape[a] == 1 for a in axes) and (keep or len(axes) < len(shape)) else None
        if len(_ONE_ELEMENT) < 1024:
            _ONE_ELEMENT[key] = got
    return got


def _mean(x, axes, keep):
    if x.dtype in _BLAS and 0 < x.size < 4096:  # the steps below, their checks skipped
        one = _one_element(x.shape, axes, keep)
        if one is not None:
            # the mean of one element: its sum, 0 + x (-0.0 becomes +0.0), divided by 1
            return np.add(x.reshape(one), x.dtype.type(0))
        total = np.add.reduce(x, axis=axes, dtype=x.dtype, keepdims=keep)
        count = x.size // total.size
        if total.__class__ is np.ndarray:
            np.true_divide(total, count, out=total, casting="unsafe")
            return total
        return total.dtype.type(total / count)
    if x.size == 0:  # onnxruntime's mean of nothing is 0 (the empty sum), not 0 / 0
        return np.sum(x, axis=axes, keepdims=keep)
    if x.dtype.kind in "iu":
        s = np.sum(x, axis=axes, dtype=x.dtype, keepdims=keep)
        n = x.size // max(s.size, 1) if x.size else 1
        q = np.floor_divide(s - np.fmod(s, n), n) if x.dtype.kind == "i" else s // n
        return q.astype(x.dtype, copy=False)
    n = _trailing(x, axes)
    if n:
        out = sum_trailing(x, n)
        out *= 1.0 / n
        return out.reshape(_reduced_shape(x.shape, axes, keep))
    acc = _acc(x.dtype)
    # np.mean's own steps (the sum in acc, divided by the count in acc) without its wrapper
    total = np.add.reduce(x, axis=axes, dtype=acc, keepdims=keep)
    count = x.size // max(np.size(total), 1)
    if isinstance(total, np.ndarray):
        np.true_divide(total, count, out=total, casting="unsafe")
    else:
        total = total.dtype.type(total / count)
    return total.astype(x.dtype, copy=False)


def _extreme(fn, nan_ufunc, arg_fn, empty_value):
    def reduce(x, axes, keep):
        if x.size == 0:
            return fn(x, axis=axes, keepdims=keep, initial=empty_value(x.dtype))
        if x.dtype.kind != "f":
            return fn(x, axis=axes, keepdims=keep)
        if axes == (x.ndim - 1,) and x.size >= 4096:
            # argmax/argmin are SIMD along a contiguous axis; max/min are not
            out = np.take_along_axis(x, arg_fn(x, axis=-1)[..., None], axis=-1)
        else:
            out = fn(x, axis=axes, keepdims=True)
        if np.isnan(out).any():
            # onnxruntime keeps a running max that skips NaN unless the first element is NaN
            out = nan_ufunc.reduce(x, axis=axes, keepdims=True)
            first = x[tuple(slice(0, 1) if axes is None or i in axes else slice(None)
                            for i in range(x.ndim))]
            out = np.where(np.isnan(first), first, out)
        if keep:
            return out
        return out.reshape(_reduced_shape(x.shape, tuple(range(x.ndim)) if axes is None
                                          else axes, False))

    return reduce


def _lowest(dt):
    if dt.kind in "fV":
        return -np.inf
    if dt.kind == "b":
        return False
    return np.iinfo(dt).min


def _highest(dt):
    if dt.kind in "fV":
        return np.inf
    if dt.kind == "b":
        return True
    return np.iinfo(dt).max


def _prod(x, axes, keep):
    return np.prod(x, axis=axes, dtype=_acc(x.dtype), keepdims=keep).astype(x.dtype, copy=False)


def _l1(x, axes, keep):
    return _sum(np.abs(x), axes, keep)


def _sum_square(x, axes, keep):
    if x.dtype.itemsize < 4 and x.dtype.kind in "fV":
        return _sum(np.square(x.astype(np.float32)), axes, keep).astype(x.dtype)
    return _sum(np.square(x), axes, keep)


def _l2(x, axes, keep):
    if x.dtype.kind in "iu":
        s = np.sum(np.square(x.astype(np.float64)), axis=axes, keepdims=keep)
        return np.sqrt(s).astype(x.dtype)
    acc = _acc(x.dtype)
    s = _sum(np.square(x.astype(acc, copy=False)), axes, keep)
    return np.sqrt(s).astype(x.dtype, copy=False)


def _log_sum(x, axes, keep):
    s = _sum(x, axes, keep)
    with np.errstate(divide="ignore"):  # log(0) = -inf is the answer, not an accident
        return np.log(s)


def _log_sum_exp(x, axes, keep):
    if x.size == 0:
        return _log_sum(x, axes, keep)
    m = np.max(x, axis=axes, keepdims=True)
    m = np.where(np.isfinite(m), m, x.dtype.type(0))  # all -inf (or inf) rows: no shift
    acc = _acc(x.dtype)
    s = np.sum(np.exp((x - m).astype(acc, copy=False)), axis=axes, keepdims=True)
    with np.errstate(divide="ignore"):
        out = (np.log(s) + m).astype(x.dtype, copy=False)
    if not keep:
        out = out.squeeze(axis=axes) if axes is not None else out.reshape(())
    return out


_REDUCERS = {
    "ReduceSum": (_sum, (1, 11), (13,)),
    "ReduceMean": (_mean, (1, 11, 13), (18,)),
    "ReduceMax": (_extreme(np.max, np.fmax, np.argmax, _lowest), (1, 11, 12, 13), (18, 20)),
    "ReduceMin": (_extreme(np.min, np.fmin, np.argmin, _highest), (1, 11, 12, 13), (18, 20)),
    "ReduceProd": (_prod, (1, 11, 13), (18,)),
    "ReduceL1": (_l1, (1, 11, 13), (18,)),
    "ReduceL2": (_l2, (1, 11, 13), (18,)),
    "ReduceLogSum": (_log_sum, (1, 11, 13), (18, 28)),
    "ReduceLogSumExp": (_log_sum_exp, (1, 11, 13), (18, 28)),
    "ReduceSumSquare": (_sum_square, (1, 11, 13), (18,)),
}


def _axes_tuple(axes, ndim):
    return tuple(sorted(a + ndim if a < 0 else a for a in axes))


def _attr_kernel(fn):
    def kernel(data, *, axes=None, keepdims=1):
        ax = _axes_tuple(axes, data.ndim) if axes else None
        return fn(data, ax, bool(keepdims))

    return kernel


def _input_kernel(fn):
    class Reduce:
        def __init__(self, ctx: KernelContext, *, keepdims=1, noop_with_empty_axes=0):
            self.keep = bool(keepdims)
            self.noop = bool(noop_with_empty_axes)
            absent = not ctx.has_input(1)
            c = ctx.constant(1)
            self.const = absent or c is not None
            self.axes = [] if absent else (None if c is None else [int(a) for a in c.tolist()])

        def __call__(self, data, axes=None):
            ax = self.axes if self.const else ([] if axes is None else axes.tolist())
            if not ax:
                # noop: nothing is reduced, but the elementwise part (square, log...) still runs
                return fn(data, () if self.noop else None, self.keep)
            return fn(data, _axes_tuple(ax, data.ndim), self.keep)

    return Reduce


for _name, (_fn, _attr_versions, _input_versions) in _REDUCERS.items():
    _k = _attr_kernel(_fn)
    _k.__name__ = _k.__qualname__ = _name
    op(_name, *_attr_versions)(_k)
    _c = _input_kernel(_fn)
    _c.__name__ = _c.__qualname__ = _name
    op(_name, *_input_versions)(_c)


# -- ArgMax / ArgMin --------------------------------------------------------------------------


def _arg(fn):
    def kernel(data, *, axis=0, keepdims=1, select_last_index=0):
        if data.ndim and data.shape[axis] == 0:  # no element to point at (onnxruntime refuses)
            raise ValueError(f"{fn.__name__}: axis {axis} of the input {list(data.shape)} is "
                             "empty")
        if select_last_index:
            n = data.shape[axis]
            flipped = np.flip(data, axis=axis)
            idx = fn(flipped, axis=axis, keepdims=bool(keepdims))
            return (n - 1 - idx).astype(INT64, copy=False)
        return fn(data, axis=axis, keepdims=bool(keepdims)).astype(INT64, copy=False)

    return kernel


op("ArgMax", 1, 11, 12, 13)(_arg(np.argmax))
op("ArgMin", 1, 11, 12, 13)(_arg(np.argmin))


# -- CumSum -----------------------------------------------------------------------------------


@op("CumSum", 11, 14)
def CumSum(x, axis, *, exclusive=0, reverse=0):
    a = int(np.asarray(axis).reshape(-1)[0])
    a = a + x.ndim if a < 0 else a
    acc = _acc(x.dtype)
    src = np.flip(x, axis=a) if reverse else x
    out = np.cumsum(src, axis=a, dtype=acc)
    if exclusive:
        shifted = np.zeros_like(out)
        n = x.shape[a]
        dst = (slice(None),) * a + (slice(1, n),)
        shifted[dst] = out[(slice(None),) * a + (slice(0, n - 1),)]
        out = shifted
    if reverse:
        out = np.flip(out, axis=a)
    return out.astype(x.dtype, copy=False)


# -- TopK -------------------------------------------------------------------------------------


def _topk(X, k, axis, largest, sorted_):
    axis = axis + X.ndim if axis < 0 else axis
    n = X.shape[axis]
    if k > n:
        raise ValueError(f"k ({k}) is larger than the axis ({n})")
    if largest:
        if X.dtype.kind == "u":
            key = np.invert(X)  # order-reversing for unsigned ints
        elif X.dtype.kind == "b":
            key = np.logical_not(X)
        else:
            key = np.negative(X)
    else:
        key = X
    # stable sort: among equal values the lower index comes first, as in onnxruntime
    if 0 < k < n // 8:
        # partial selection, kept only when no value tied with the k-th lies outside it
        # (argpartition is unstable: ties must resolve to the lowest indices)
        part = np.argpartition(key, k - 1, axis=axis)
        cand = np.sort(np.take(part, np.arange(k), axis=axis), axis=axis)
        vals = np.take_along_axis(key, cand, axis=axis)
        kth = vals.max(axis=axis, keepdims=True)
        if (np.count_nonzero(key == kth, axis=axis)
                == np.count_nonzero(vals == kth, axis=axis)).all():
            idx = np.take_along_axis(cand, np.argsort(vals, axis=axis, kind="stable"), axis)
            return np.take_along_axis(X, idx, axis=axis), idx.astype(INT64, copy=False)
    idx = np.argsort(key, axis=axis, kind="stable")
    idx = np.take(idx, np.arange(k), axis=axis)
    return np.take_along_axis(X, idx, axis=axis), idx.astype(INT64, copy=False)


@op("TopK", 1)
def TopK_1(X, *, axis=-1, k):
    return _topk(X, k, axis, True, True)


@op("TopK", 10, 11, 24)
def TopK(X, K, *, axis=-1, largest=1, sorted=1):  # noqa: A002 - the schema's name
    return _topk(X, int(np.asarray(K).reshape(-1)[0]), axis, largest, sorted)


__all__ = ["KernelContext"]
