"""Pooling: MaxPool (with Indices), AveragePool, LpPool and their global forms.

Windows are strided slices of the input, reduced one spatial axis at a time: the loops run
over the kernel taps (a handful), never over pixels, and the padding is never materialized
(each tap covers the outputs whose input lies inside the image). Global windows are a
matrix-vector product.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from ..kernels import KernelContext, op, text_attribute
from ..parallel import parallel_for, threads_for
from .conv import (
    channels_inner,
    compute_dtype,
    keeps_layout,
    pad_spatial,
    window_geometry,
    window_slices,
)

# channels-last float32 windows on the compiled kernel (compiled/pool.py), read when a
# pooling kernel is prepared
COMPILED = True


class _Pool:
    """Attributes and geometry common to the windowed pooling operators."""

    def __init__(self, ctx: KernelContext, *, auto_pad="NOTSET", ceil_mode=0, dilations=None,
                 kernel_shape, pads=None, strides=None) -> None:
        self.kernel = tuple(int(v) for v in kernel_shape)
        nd = len(self.kernel)
        self.auto_pad = text_attribute(auto_pad)
        self.ceil_mode = int(ceil_mode)
        self.dilations = tuple(int(v) for v in dilations) if dilations else (1,) * nd
        self.strides = tuple(int(v) for v in strides) if strides else (1,) * nd
        self.pads = tuple(int(v) for v in pads) if pads is not None and len(pads) else ()
        self.threads = threads_for(ctx)
        self.keep_layout = keeps_layout(ctx)  # a channels-last input gives a channels-last Y
        self.use_compiled = COMPILED  # (benchmarks/cnn_gain.py --changes pool: False)

    def geometry(self, X: np.ndarray):
        if X.ndim != len(self.kernel) + 2:
            raise ValueError(f"kernel_shape {list(self.kernel)} does not fit input rank {X.ndim}")
        return window_geometry(
            X.shape[2:], self.kernel, self.strides, self.dilations, self.pads, self.auto_pad,
            self.ceil_mode, dilated_same=False,
        )

    def taps(self, outs):
        return window_slices(outs, self.kernel, self.strides, self.dilations)

    def compiled(self, X: np.ndarray, op: str, heads, outs, scale=None,
                 out: np.ndarray | None = None) -> np.ndarray | None:
        """The compiled pool (compiled/pool.py) of a 1-D or 2-D float32 X: channels-last where
        X is and its layout passes on, else planar (into ``out``, the executor's buffer, when
        it has the result's layout), or None where it does not run (the numpy path then)."""
        if not (self.use_compiled and X.ndim in (3, 4) and X.dtype == np.float32 and
                X.shape[1] > 0):
            return None
        from ..compiled import jit, pool

        if not 0 < math.prod(self.kernel) <= pool.MAX_TAPS:
            return None
        planar = X.ndim == 3 or not (self.keep_layout and channels_inner(X))
        if planar and all(o == 1 for o in outs):
            return None  # a global window: numpy's reduction of whole planes is faster than
            # a vector of one lane per plane
        if op == "avg" and not isinstance(scale, np.ndarray):
            scale = np.full(outs, scale, np.float32)
        if planar:
            return self._compiled_planar(X, op, heads, outs, scale, out)
        try:  # (a view of part of the channels, a Split's output, copied)
            Xt = np.ascontiguousarray(X.transpose(0, 2, 3, 1))
            Y = pool.pool(Xt, op, self.kernel, heads, outs, self.strides, self.dilations, scale,
                          self.threads, None if out is None else out.transpose(0, 2, 3, 1))
        except jit.Unavailable:
            return None
        return Y.transpose(0, 3, 1, 2)

    def _compiled_planar(self, X: np.ndarray, op: str, heads, outs, scale,
                         out: np.ndarray | None) -> np.ndarray | None:
        """The compiled planar pool (compiled/pool.py's ``pool_nchw``) of a C-contiguous
        (N, C, H, W) or (N, C, L) X (a 1-D window: one row of L), or None."""
        from ..compiled import jit, pool

        X = np.ascontiguousarray(X)  # (a strided view: copied, still faster than numpy's)
        flat = X.ndim == 3
        if flat:  # (N, C, L) as (N, C, 1, L): the window one row high
            X4, outs4 = X[:, :, None], (1,) + tuple(outs)
            kernel, strides = (1,) + self.kernel, (1,) + self.strides
            dilations, heads4 = (1,) + self.dilations, (0,) + tuple(heads)
            scale = None if scale is None else scale.reshape(outs4)
            out = None if out is None else out[:, :, None]
        else:
            X4, outs4, kernel, strides = X, tuple(outs), self.kernel, self.strides
            dilations, heads4 = self.dilations, tuple(heads)
        try:
            Y = pool.pool_nchw(X4, op, kernel, heads4, outs4, strides, dilations, scale,
                               self.threads, out)
        except (jit.Unavailable, ValueError):
            return None
        return Y[:, :, 0] if flat else Y

    def reduce_windows(self, X: np.ndarray, heads, outs, fill, ufunc, scale=None) -> np.ndarray:
        """``ufunc`` (np.maximum, np.add) over each window, times ``scale`` when given, in a
        fresh C-contiguous array; padding counts as ``fill``, the identity of ``ufunc`` (or,
        for max, never larger than a real element).

        Windows are boxes, so the reduction is separable: one spatial axis at a time, k
        strided passes each. Nothing is padded: each tap covers the output positions whose
        input lies inside the image, and the first two taps that cover every position make
        the accumulator in one operation. The intra-op threads take a range of channels
        each."""
        keep = self.keep_layout and channels_inner(X)
        channels_last = keep or _channels_last_wins(X, outs, self.strides)
        if keep:
            Y = np.empty((X.shape[0],) + tuple(outs) + (X.shape[1],), X.dtype).transpose(
                0, 3, 1, 2)
        else:
            Y = np.empty(X.shape[:2] + tuple(outs), X.dtype)

        def channels(c0: int, c1: int) -> None:
            out = Y[:, c0:c1]
            if channels_last:
                # rows of pixels x channels: long inner loops where an NCHW row is a few pixels
                R = np.ascontiguousarray(X[:, c0:c1].transpose(0, 2, 3, 1))
                for i, o in enumerate(outs):
                    R = _reduce_axis(R, 1 + i, o, self.kernel[i], self.strides[i],
                                     self.dilations[i], heads[i], fill, ufunc)
                R = R.transpose(0, 3, 1, 2)
                if scale is None:
                    np.copyto(out, R)
                else:
                    np.multiply(R, scale, out=out)
                return
            R = X[:, c0:c1]
            last = len(outs) - 1
            for i, o in enumerate(outs):
                R = _reduce_axis(R, 2 + i, o, self.kernel[i], self.strides[i],
                                 self.dilations[i], heads[i], fill, ufunc,
                                 out if i == last else None)
            if scale is not None:
                out *= scale

        parallel_for(channels, X.shape[1], self.threads,
                     2 * X.shape[0] * math.prod(X.shape[2:]) * X.itemsize)
        return Y

    def window_sum(self, X: np.ndarray, heads, outs, power=None, scale=None) -> np.ndarray:
        """Sum over each window (zero padding), of |X|**power when power is given, times
        ``scale`` when given."""
        if power is not None:
            X = X * X if power == 2 else np.abs(X) ** power
        if X.dtype.kind == "f" and all(o == 1 for o in outs) and not any(heads) and all(
                d == 1 and k >= n for n, k, d in zip(X.shape[2:], self.kernel, self.dilations,
                                                     strict=True)):
            # one window over the whole image (a global pool): a matrix-vector product
            n, c = X.shape[:2]
            ones = np.ones(math.prod(X.shape[2:]), dtype=X.dtype)
            Y = np.matmul(X.reshape(n, c, -1), ones)
            if scale is not None:
                Y *= scale
            return Y.reshape((n, c) + (1,) * len(outs))
        return self.reduce_windows(X, heads, outs, 0, np.add, scale)

    def counts(self, in_shape, heads, tails, outs, include_pad: bool) -> np.ndarray | None:
        """Per output position, how many window taps fall in the counted range (None: all)."""
        return _counts(tuple(in_shape), tuple(heads), tuple(tails), tuple(outs), include_pad,
                       self.kernel, self.strides, self.dilations)


@functools.lru_cache(maxsize=256)
def _counts(in_shape, heads, tails, outs, include_pad, kernel, strides, dilations):
    """See _Pool.counts; the same geometry comes back every run (a read-only array)."""
    per_axis = []
    uniform = True
    for i, o in enumerate(outs):
        k, s, d = kernel[i], strides[i], dilations[i]
        lo, hi = (-heads[i], in_shape[i] + tails[i]) if include_pad else (0, in_shape[i])
        pos = np.arange(o)[:, None] * s - heads[i] + np.arange(k)[None, :] * d
        c = ((pos >= lo) & (pos < hi)).sum(axis=1)
        uniform = uniform and bool((c == k).all())
        per_axis.append(c)
    if uniform:
        return None
    total = per_axis[0]
    for c in per_axis[1:]:
        total = np.multiply.outer(total, c)
    total.flags.writeable = False
    return total


def _channels_last_wins(X: np.ndarray, outs, strides) -> bool:
    """Pool channels-last: small stride-1 images with many channels (measured on the
    Inception pooling branches; strided and large images are faster planar)."""
    return X.ndim == 4 and X.shape[1] >= 64 and all(s == 1 for s in strides) and \
        outs[0] * outs[1] <= 1024


def _reduce_axis(X: np.ndarray, axis: int, o: int, k: int, s: int, d: int, head: int, fill,
                 ufunc, out=None) -> np.ndarray:
    """Reduce the windows (k taps, stride s, dilation d, ``head`` padding) along one axis,
    into ``out`` when given."""
    n = X.shape[axis]
    lead = (slice(None),) * axis
    taps = []  # (first, end) output positions each tap reads inside the input, and the tap
    for t in range(k):
        start = t * d - head  # input index of output 0
        lo = max(0, -(start // s))  # ceil(-start / s)
        hi = min(o, (n - 1 - start) // s + 1) if n - 1 >= start else 0
        if lo < hi:
            first = start + lo * s
            taps.append((lo, hi, X[lead + (slice(first, first + (hi - lo - 1) * s + 1, s),)]))
    full = [tp for tp in taps if tp[0] == 0 and tp[1] == o]
    rest = [tp for tp in taps if not (tp[0] == 0 and tp[1] == o)]
    shape = X.shape[:axis] + (o,) + X.shape[axis + 1:]
    if len(full) >= 2:
        acc = ufunc(full[0][2], full[1][2], out=out)
        rest = full[2:] + rest
    elif full:
        acc = full[0][2].copy() if out is None else out
        if out is not None:
            np.copyto(out, full[0][2])
    else:
        acc = np.full(shape, fill, dtype=X.dtype) if out is None else out
        if out is not None:
            out.fill(fill)
    for lo, hi, tap in rest:
        part = acc[lead + (slice(lo, hi),)]
        ufunc(part, tap, out=part)
    return acc


def _lowest(dtype: np.dtype):
    """The padding value of max pooling: never larger than a real element."""
    return np.iinfo(dtype).min if dtype.kind in "iu" else -np.inf


@op("MaxPool", 1, 8, 10, 11, 12, 22)
class MaxPool(_Pool):
    def __init__(self, ctx: KernelContext, *, auto_pad="NOTSET", ceil_mode=0, dilations=None,
                 kernel_shape, pads=None, storage_order=0, strides=None) -> None:
        super().__init__(ctx, auto_pad=auto_pad, ceil_mode=ceil_mode, dilations=dilations,
                         kernel_shape=kernel_shape, pads=pads, strides=strides)
        self.storage_order = int(storage_order)
        self.want_indices = ctx.output_used(1)

    accepts_out = True  # the executor's buffer for the output (memory.py): compiled pools

    def __call__(self, X, *, out=None):
        heads, _, outs = self.geometry(X)
        fill = _lowest(X.dtype)
        if not self.want_indices:
            Y = self.compiled(X, "max", heads, outs, out=out)
            return Y if Y is not None else self.reduce_windows(X, heads, outs, fill, np.maximum)
        Xp = pad_spatial(X, heads, outs, self.kernel, self.strides, self.dilations, fill)
        return self._with_indices(X, Xp, heads, outs)

    def _with_indices(self, X, Xp, heads, outs):
        spatial = X.shape[2:]
        nd = len(spatial)
        # element strides of the (unpadded) spatial dims: row- or column-major
        order = range(nd - 1, -1, -1) if self.storage_order == 0 else range(nd)
        elem_strides = [0] * nd
        step = 1
        for i in order:
            elem_strides[i] = step
            step *= spatial[i]
        grids = [np.arange(o) * s - h for o, s, h in zip(outs, self.strides, heads, strict=True)]
        Y = I = None
        for offset, idx in self.taps(outs):
            flat = np.zeros(outs, dtype=np.int64)
            for i in range(nd):
                coord = grids[i] + offset[i] * self.dilations[i]
                shape = [1] * nd
                shape[i] = outs[i]
                flat = flat + (coord * elem_strides[i]).reshape(shape)
            window = Xp[idx]
            if Y is None:
                Y = window.copy()
                I = np.broadcast_to(flat, Y.shape).copy()
            else:
                better = window > Y
                np.copyto(Y, window, where=better)
                np.copyto(I, np.broadcast_to(flat, Y.shape), where=better)
        n, c = X.shape[:2]
        plane = int(np.prod(spatial))
        I += (np.arange(n * c, dtype=np.int64) * plane).reshape((n, c) + (1,) * nd)
        return Y, I


@op("AveragePool", 1, 7, 10, 11, 19, 22)
class AveragePool(_Pool):
    def __init__(self, ctx: KernelContext, *, auto_pad="NOTSET", ceil_mode=0,
                 count_include_pad=0, dilations=None, kernel_shape, pads=None,
                 strides=None) -> None:
        super().__init__(ctx, auto_pad=auto_pad, ceil_mode=ceil_mode, dilations=dilations,
                         kernel_shape=kernel_shape, pads=pads, strides=strides)
        self.include_pad = bool(count_include_pad)

    accepts_out = True  # the executor's buffer for the output (memory.py): compiled pools

    def __call__(self, X, *, out=None):
        heads, tails, outs = self.geometry(X)
        out_dtype = X.dtype
        cdt = compute_dtype(X.dtype)
        counts = self.counts(X.shape[2:], heads, tails, outs, self.include_pad)
        scale = cdt.type(1.0 / int(np.prod(self.kernel))) if counts is None else \
            1 / counts.astype(cdt)
        Y = self.compiled(X, "avg", heads, outs, scale, out)
        if Y is not None:
            return Y
        Y = self.window_sum(X.astype(cdt, copy=False), heads, outs, scale=scale)
        return Y if Y.dtype == out_dtype else Y.astype(out_dtype)


@op("LpPool", 1, 2, 11, 18, 22)
class LpPool(_Pool):
    def __init__(self, ctx: KernelContext, *, auto_pad="NOTSET", ceil_mode=0, dilations=None,
                 kernel_shape, p=2, pads=None, strides=None) -> None:
        super().__init__(ctx, auto_pad=auto_pad, ceil_mode=ceil_mode, dilations=dilations,
                         kernel_shape=kernel_shape, pads=pads, strides=strides)
        self.p = float(p)

    def __call__(self, X):
        heads, _, outs = self.geometry(X)
        out_dtype = X.dtype
        cdt = compute_dtype(X.dtype)
        Y = self.window_sum(X.astype(cdt, copy=False), heads, outs, power=self.p)
        Y = np.sqrt(Y, out=Y) if self.p == 2 else np.power(Y, cdt.type(1.0 / self.p), out=Y)
        return Y if Y.dtype == out_dtype else Y.astype(out_dtype)


def _spatial_axes(X: np.ndarray) -> tuple[int, ...]:
    return tuple(range(2, X.ndim))


_SUM_ROW = 1024  # floats per row numpy adds at a time in _column_sums


def _column_sums(V: np.ndarray) -> np.ndarray:
    """V (n, rows, c) summed over its rows, every column in the same order. numpy adds row
    after row, a loop step per row: with few columns (an SE block's 32 channels at 112 x 112)
    that loop was the cost (210 us for 1.6 MB); k consecutive rows are taken as one row of
    k * c floats instead (k partial sums per column, then summed), ~45 us there."""
    n, rows, c = V.shape
    k = -(-_SUM_ROW // c) if c else 1
    whole = rows // k
    if k == 1 or whole < 2:
        return V.sum(axis=1)
    Y = V[:, :whole * k].reshape(n, whole, k * c).sum(axis=1).reshape(n, k, c).sum(axis=1)
    if whole * k < rows:
        Y += V[:, whole * k:].sum(axis=1)
    return Y


@op("GlobalAveragePool", 1, 22)
def GlobalAveragePool(X):
    # a matrix-vector product: BLAS sums every (channel) row in one call, whatever the
    # layout, where a numpy mean reduces row by row
    cdt = compute_dtype(X.dtype)
    n, c = X.shape[:2]
    plane = math.prod(X.shape[2:])
    if plane == 0 or X.dtype.kind != "f":
        return np.mean(X, axis=_spatial_axes(X), keepdims=True, dtype=cdt).astype(X.dtype)
    if X.ndim == 4 and channels_inner(X):
        # channels-last: rows of channels summed in turn, every channel in the same order (a
        # GEMV's vector tail can round the last channels differently from the others)
        Y = _column_sums(X.astype(cdt, copy=False).transpose(0, 2, 3, 1).reshape(n, plane, c))
        Y *= cdt.type(1.0 / plane)
        return Y.reshape((n, c, 1, 1)).astype(X.dtype, copy=False)
    weights = np.full(plane, 1.0 / plane, dtype=cdt)
    Y = np.matmul(X.astype(cdt, copy=False).reshape(n, c, plane), weights)
    return Y.reshape((n, c) + (1,) * (X.ndim - 2)).astype(X.dtype, copy=False)


@op("GlobalMaxPool", 1, 22)
def GlobalMaxPool(X):
    return np.max(X, axis=_spatial_axes(X), keepdims=True)


@op("GlobalLpPool", 1, 2, 22)
def GlobalLpPool(X, *, p=2):
    p = float(p)
    cdt = compute_dtype(X.dtype)
    Xc = X.astype(cdt, copy=False)
    powered = Xc * Xc if p == 2 else np.abs(Xc) ** cdt.type(p)
    Y = np.sum(powered, axis=_spatial_axes(X), keepdims=True)
    Y = np.sqrt(Y) if p == 2 else Y ** cdt.type(1.0 / p)
    return Y.astype(X.dtype, copy=False)


# -- NhwcMaxPool (com.microsoft) ------------------------------------------------------------------


@op("NhwcMaxPool", 1, domain="com.microsoft")
class NhwcMaxPool(MaxPool):
    """MaxPool over a channels-last (N, spatial..., C) tensor."""

    accepts_out = False  # its output is copied out of MaxPool's

    def __init__(self, ctx: KernelContext, *, auto_pad="NOTSET", ceil_mode=0, dilations=None,
                 kernel_shape, pads=None, strides=None) -> None:
        super().__init__(ctx, auto_pad=auto_pad, ceil_mode=ceil_mode, dilations=dilations,
                         kernel_shape=kernel_shape, pads=pads, strides=strides)
        self.want_indices = False

    def __call__(self, x):
        Y = super().__call__(np.moveaxis(x, -1, 1))
        return np.ascontiguousarray(np.moveaxis(Y, 1, -1))
