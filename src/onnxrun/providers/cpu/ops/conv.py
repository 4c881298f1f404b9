"""Convolutions: Conv and ConvTranspose, and the window geometry (pads, output sizes, strided
window offsets) shared with the pooling kernels in ``pool.py``.

Conv picks a kernel per layer (see ``Conv``): a depthwise kernel (planar or channels-last),
Winograd F(2x2, 3x3), one GEMM per kernel tap, or im2col + GEMM; a 1x1 convolution is a GEMM
on the input itself. Temporaries come from per-thread scratch buffers, the bias and fused
activation are applied on the way out, and around depthwise and Winograd layers activations
stay in channels-last memory (see "memory layout between convolutions").
"""

from __future__ import annotations

import collections
import functools
import itertools
import math
import threading
import weakref

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ....dtypes import compute_dtype, np_dtype, type_shape
from ....geometry import transpose_geometry, window_geometry
from .. import blas
from ..kernels import KernelContext, op, text_attribute
from ..parallel import parallel_for, threads_for


def pad_spatial(
    X: np.ndarray,
    heads: tuple[int, ...],
    outs: tuple[int, ...],
    kernel: tuple[int, ...],
    strides: tuple[int, ...],
    dilations: tuple[int, ...],
    fill,
) -> np.ndarray:
    """X with ``fill`` around its spatial dims: exactly the extent the windows read."""
    nd = len(outs)
    spatial = X.shape[2:]
    needed = [(o - 1) * s + (k - 1) * d + 1
              for o, s, k, d in zip(outs, strides, kernel, dilations, strict=True)]
    if not any(heads) and all(need <= n for need, n in zip(needed, spatial, strict=True)):
        return X
    Xp = np.full(X.shape[:2] + tuple(needed), fill, dtype=X.dtype)
    dst = [slice(None), slice(None)]
    src = [slice(None), slice(None)]
    for i in range(nd):
        lo, hi = heads[i], min(heads[i] + spatial[i], needed[i])
        dst.append(slice(lo, hi))
        src.append(slice(0, hi - lo))
    Xp[tuple(dst)] = X[tuple(src)]
    return Xp


def window_slices(
    outs: tuple[int, ...], kernel: tuple[int, ...], strides: tuple[int, ...],
    dilations: tuple[int, ...],
):
    """For each kernel offset (row-major): the index that selects that tap of every window."""
    for offset in itertools.product(*(range(k) for k in kernel)):
        yield offset, (Ellipsis,) + tuple(
            slice(t * d, t * d + (o - 1) * s + 1, s)
            for t, o, s, d in zip(offset, outs, strides, dilations, strict=True)
        )


def _im2col(Xp: np.ndarray, kernel, outs, strides, dilations) -> np.ndarray:
    """Strided view (N, C, *kernel, *outs) of the padded input: no copy yet."""
    nd = len(outs)
    st = Xp.strides
    shape = Xp.shape[:2] + tuple(kernel) + tuple(outs)
    strides_ = st[:2] + tuple(st[2 + i] * dilations[i] for i in range(nd)) + tuple(
        st[2 + i] * strides[i] for i in range(nd)
    )
    return as_strided(Xp, shape=shape, strides=strides_, writeable=False)


_TILE = 1 << 20  # elements of im2col matrix built at a time: a few MB, cache-friendly
_SMALL_CONV = 1 << 14  # im2col elements up to which a convolution takes the inline path


def _im2col_gemm(Wm: np.ndarray, view: np.ndarray, g: int, threads: int = 1,
                 scratch_out: bool = False) -> np.ndarray:
    """(N, g, M/g, *outs) = Wm @ im2col, the column matrix built a band of output rows at a time.

    ``view`` is the strided (N, C, *kernel, *outs) window view. Copying it band by band keeps
    the copy in cache and never materializes the whole (C*K, O) matrix of a large image; the
    intra-op threads copy a range of channels each, then each band is one 2-D GEMM (on BLAS's
    threads) written straight into the output (``scratch_out``: a scratch buffer of this
    thread, for a caller that copies the result out: no fresh pages per call).
    """
    N, C = view.shape[:2]
    nd = (view.ndim - 2) // 2
    outs = view.shape[2 + nd:]
    K = int(np.prod(view.shape[2:2 + nd]))
    Cg = C // g
    rest = int(np.prod(outs[1:]))
    Mg = Wm.shape[1]
    Y = scratch("conv_im2col_out", (N, g, Mg) + tuple(outs), Wm.dtype) if scratch_out else \
        np.empty((N, g, Mg) + tuple(outs), dtype=Wm.dtype)
    rows = max(1, min(outs[0], _TILE // max(1, Cg * K * rest)))
    for n in range(N):
        for gi in range(g):
            src = view[n, gi * Cg:(gi + 1) * Cg]
            dst = Y[n, gi]
            for r in range(0, outs[0], rows):
                h = min(rows, outs[0] - r)
                band = (Ellipsis, slice(r, r + h)) + (slice(None),) * (nd - 1)
                cols = scratch("conv_cols", (Cg,) + src.shape[1:1 + nd] + (h,) + outs[1:],
                               Wm.dtype)
                parallel_for(functools.partial(_copy_channels, cols, src[band]), Cg, threads,
                             K * h * rest * Wm.itemsize)
                blas.matmul(Wm[gi], cols.reshape(Cg * K, h * rest),
                            out=dst[:, r:r + h].reshape(Mg, h * rest), threads=threads)
    return Y


@functools.lru_cache(maxsize=128)
def _small_conv_columns(spatial, kernel, strides, dilations, heads, outs) -> np.ndarray:
    """For each kernel tap and output position (row-major, taps first), the flat index of the
    input element it reads, or ``prod(spatial)`` (an appended zero) where it reads padding."""
    size = math.prod(spatial)
    idx = np.zeros((math.prod(kernel), math.prod(outs)), np.intp)
    for t, tap in enumerate(itertools.product(*(range(k) for k in kernel))):
        flat = np.zeros(outs, np.intp)
        inside = np.ones(outs, bool)
        for a, (n, o, k, s, d, h) in enumerate(zip(spatial, outs, tap, strides, dilations, heads,
                                                    strict=True)):
            pos = np.arange(o) * s + k * d - h
            shape = [1] * len(outs)
            shape[a] = o
            pos = pos.reshape(shape)
            inside = inside & (pos >= 0) & (pos < n)
            flat = flat * n + np.clip(pos, 0, n - 1)
        idx[t] = np.where(inside, flat, size).reshape(-1)
    idx = idx.reshape(-1)
    idx.flags.writeable = False
    return idx


def _take_zero_padded(padded: list, X: np.ndarray, C: int, S: int, idx: np.ndarray,
                      axis: int | None) -> np.ndarray:
    """X as (C, S) with a zero column appended, taken at ``idx`` along ``axis`` (index S
    reads the zero: a small convolution's padding); the (C, S + 1) buffer comes from and
    goes back to the plan's list ``padded`` (pop and append are atomic, so concurrent
    runs take different buffers)."""
    try:
        Xz = padded.pop()
    except IndexError:
        Xz = np.empty((C, S + 1), X.dtype)
        Xz[:, S] = 0
    Xz[:, :S] = X.reshape(C, S)
    taken = Xz.take(idx, axis=axis)
    padded.append(Xz)
    return taken


def _copy_channels(dst: np.ndarray, src: np.ndarray, c0: int, c1: int) -> None:
    np.copyto(dst[c0:c1], src[c0:c1])


# -- scratch buffers, padding ---------------------------------------------------------------------

_scratch = threading.local()
_SCRATCH_MAX = 1 << 26  # bytes; larger temporaries are allocated per call


def scratch(slot: str, shape: tuple[int, ...], dtype) -> np.ndarray:
    """A temporary of this thread, contents undefined, reused from call to call.

    A kernel's temporaries die when it returns, so one buffer per slot and thread serves every
    node: no allocation (nor, when the allocator has handed large freed blocks back to the
    system, page faults) per run. A kernel must not hold two arrays of one slot at once, nor
    return one."""
    dtype = np.dtype(dtype)
    n = math.prod(shape) * dtype.itemsize
    if n > _SCRATCH_MAX:
        return np.empty(shape, dtype)
    pool = _scratch.__dict__
    buf = pool.get(slot)
    if buf is None or buf.nbytes < n:
        buf = pool[slot] = np.empty(max(n, 1 << 16), np.uint8)
    return buf[:n].view(dtype).reshape(shape)


def _pad_into(P: np.ndarray, X: np.ndarray, heads) -> np.ndarray:
    """Fill P (A, B, Hp, Wp, ...) with X (A, B, H, W, ..., any strides) surrounded by zeros: X
    starts at (heads[0], heads[1]) and is cut where it does not fit."""
    Hp, Wp = P.shape[2:4]
    h0, w0 = heads
    h, w = max(0, min(X.shape[2], Hp - h0)), max(0, min(X.shape[3], Wp - w0))
    P[:, :, :h0] = 0
    P[:, :, h0 + h:] = 0
    P[:, :, h0:h0 + h, :w0] = 0
    P[:, :, h0:h0 + h, w0 + w:] = 0
    P[:, :, h0:h0 + h, w0:w0 + w] = X[:, :, :h, :w]
    return P


def _pad_into_rows(P: np.ndarray, X: np.ndarray, heads, threads: int) -> None:
    """_pad_into(P, X, heads) at ``threads`` threads: channels-last pixels on both sides
    (_pad_on_workers) on spin.py's workers, else ranges of P's rows (of at least _PAD_BYTES)
    on the intra-op queue: a large padded copy (numpy releases the GIL in it) is worth the
    queue's hand-off."""
    if threads > 1 and _pad_on_workers(P, X, heads, threads):
        return

    def pad_rows(r0: int, r1: int) -> None:
        Xr = X[:, :, max(0, r0 - heads[0]):max(0, r1 - heads[0])]
        _pad_into(P[:, :, r0:r1], Xr, (max(0, heads[0] - r0), heads[1]))

    row_bytes = 2 * P.shape[0] * P.shape[1] * P.shape[3] * P.itemsize  # read and written
    parallel_for(pad_rows, P.shape[2], threads, row_bytes, _PAD_BYTES)


def _pad_on_workers(P: np.ndarray, X: np.ndarray, heads, threads: int) -> bool:
    """_pad_into where P (N, C, Hp, Wp) and X are views of channels-last pixels (the implicit
    GEMM's and Winograd's buffers; the layout level's activations): the borders zeroed here,
    each image's rows of w * C floats copied by compiled.copy (ranges on spin.py's workers, or
    here when too small to split). False (nothing done) for other layouts."""
    from ..compiled import copy

    N, C, Hp, Wp = P.shape
    item = P.itemsize
    h0, w0 = heads
    h, w = max(0, min(X.shape[2], Hp - h0)), max(0, min(X.shape[3], Wp - w0))
    if h * w * C * item < 2 * copy.MIN_BYTES_PER_RANGE:
        return False  # one range: _pad_into, as at 1 thread
    if X.dtype != P.dtype or not h or not w or min(heads) < 0 or P.strides[1] != item or \
            P.strides[3] != C * item or X.strides[1] != item or X.strides[3] != C * item or \
            copy.unavailable() is not None:
        return False
    P[:, :, :h0] = 0
    P[:, :, h0 + h:] = 0
    P[:, :, h0:h0 + h, :w0] = 0
    P[:, :, h0:h0 + h, w0 + w:] = 0
    for n in range(N):
        # each image's rows of w * C floats, as views (as_strided cost ~3 us each: a
        # 2-thread session's small pads took twice the 1-thread one's numpy copy)
        dst = P[n, :, h0:h0 + h, w0:w0 + w].transpose(1, 2, 0).view()
        src = X[n, :, :h, :w].transpose(1, 2, 0).view()
        dst.shape = src.shape = (h, w * C)  # views: the checks above make these rows
        if not copy.copy(dst, src, threads):
            dst[...] = src
    return True


# -- depthwise ------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=256)
def _depthwise_groups(kernel: tuple[int, ...], strides: tuple[int, ...],
                      dilations: tuple[int, ...]):
    """How the taps of a 2-D depthwise kernel read the polyphase split of the padded input.

    With strides (s_h, s_w) the padded input splits into s_h * s_w phases (phase (a, b) holds
    the pixels whose row is a and column b modulo the strides); tap (i, j) then reads phase
    (i*d_h % s_h, j*d_w % s_w) at the unit-stride offset (i*d_h // s_h, j*d_w // s_w). The taps
    of one phase and one column offset whose row offsets are evenly spaced form a group that
    one einsum sums. Returns (groups, row span, column span); a group is
    (phase, first row offset, row step, column offset, tap indices)."""
    (kh, kw), (sh, sw), (dh, dw) = kernel, strides, dilations
    cells: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for i in range(kh):
        for j in range(kw):
            r, a = divmod(i * dh, sh)
            q, b = divmod(j * dw, sw)
            cells.setdefault((a * sw + b, q), []).append((r, i * kw + j))
    groups = []
    for (phase, q), taps in sorted(cells.items()):
        taps.sort()
        rows = [r for r, _ in taps]
        steps = {y - x for x, y in zip(rows, rows[1:], strict=False)}
        if len(steps) <= 1 and 0 not in steps:
            step = steps.pop() if steps else 1
            groups.append((phase, rows[0], step, q, tuple(k for _, k in taps)))
        else:  # uneven spacing: a group per tap
            groups.extend((phase, r, 1, q, (k,)) for r, k in taps)
    return tuple(groups), (kh - 1) * dh // sh, (kw - 1) * dw // sw


def _depthwise_weights_2d(W: np.ndarray, kernel, strides, dilations, cdt):
    """Per tap group of _depthwise_groups: its (taps, C) weights; plus (kh, kw, C) for NHWC."""
    C = W.shape[0]
    flat = W.reshape(C, -1).astype(cdt)
    groups = _depthwise_groups(kernel, strides, dilations)[0]
    per_group = tuple(np.ascontiguousarray(flat[:, list(taps)].T) for *_, taps in groups)
    hwc = np.ascontiguousarray(flat.T.reshape(tuple(kernel) + (C,)))
    return per_group, hwc


# The channels-last kernel's inner loop runs along whole image rows (pixels x channels), the
# planar one's along planes: channels-last is faster from 32 channels on, at any image size and
# stride (measured on MobileNetV2's and ShuffleNet's layers).
_NHWC_CHANNELS = 32


def _depthwise_planar(X, wgroups, heads, outs, kernel, strides, dilations) -> np.ndarray:
    """Depthwise 2-D convolution in NCHW: returns the "wide" output (N, C, Ho, Wq) (a scratch
    view), whose first Wo columns are the result.

    The padded input is split into its polyphase planes, each flattened with a common row
    width Wq; every tap is then one contiguous slice of a plane (the wide rows wrap around into
    Wq - Wo unused columns), and the taps of a group are one einsum over a strided view."""
    N, C, H, Wd = X.shape
    (Ho, Wo), (sh, sw) = outs, strides
    groups, rspan, qspan = _depthwise_groups(kernel, strides, dilations)
    Hq, Wq = Ho + rspan, Wo + qspan
    L = Ho * Wq
    P = scratch("conv_in", (N, C, sh * sw, Hq * Wq + qspan), X.dtype)
    P[..., Hq * Wq:] = 0
    for a in range(sh):
        # plane row r is padded row r*sh + a, i.e. input row r*sh + a - head
        r0 = max(0, -(-(heads[0] - a) // sh))
        x0 = r0 * sh + a - heads[0]
        nr = max(0, min(Hq - r0, -(-(H - x0) // sh)))
        for b in range(sw):
            q0 = max(0, -(-(heads[1] - b) // sw))
            y0 = q0 * sw + b - heads[1]
            nq = max(0, min(Wq - q0, -(-(Wd - y0) // sw)))
            plane = P[:, :, a * sw + b, :Hq * Wq].reshape(N, C, Hq, Wq)
            if nr == 0 or nq == 0:
                plane[...] = 0
                continue
            # zero only the border the input does not cover
            plane[:, :, :r0] = 0
            plane[:, :, r0 + nr:] = 0
            plane[:, :, r0:r0 + nr, :q0] = 0
            plane[:, :, r0:r0 + nr, q0 + nq:] = 0
            plane[:, :, r0:r0 + nr, q0:q0 + nq] = \
                X[:, :, x0:x0 + (nr - 1) * sh + 1:sh, y0:y0 + (nq - 1) * sw + 1:sw]
    sN, sC, sP, item = P.strides
    # a row gap keeps the accumulator non-contiguous: numpy's broadcasting of the per-channel
    # weights and bias is much faster then
    Y = scratch("conv_acc", (N, C, L + 16), X.dtype)[..., :L]
    tmp = None
    for gi, ((phase, r, step, q, taps), w) in enumerate(zip(groups, wgroups, strict=True)):
        start = P[:, :, phase, r * Wq + q:]
        if gi == 0:
            out = Y
        elif tmp is None:
            out = tmp = scratch("conv_tmp", (N, C, L + 16), X.dtype)[..., :L]
        if len(taps) > 1:
            view = as_strided(start, (N, C, len(taps), L), (sN, sC, step * Wq * item, item),
                              writeable=False)
            np.einsum("ncil,ic->ncl", view, w, out=out)
        else:
            np.multiply(start[..., :L], w.reshape(C, 1), out=out)
        if gi:
            Y += tmp
    return Y.reshape(N, C, Ho, Wq)


@functools.lru_cache(maxsize=256)
def _depthwise_column_groups(kw: int, sw: int, dw: int):
    """How the kernel columns of a channels-last depthwise convolution read the column phases
    of the padded input: column j reads phase (j*dw) % sw at offset (j*dw) // sw, and the
    columns of one phase whose offsets are evenly spaced form a group that one einsum sums.
    Returns (groups, offset span); a group is (phase, first offset, offset step, columns)."""
    phases: dict[int, list[tuple[int, int]]] = {}
    for j in range(kw):
        q, b = divmod(j * dw, sw)
        phases.setdefault(b, []).append((q, j))
    groups = []
    for b, cols in sorted(phases.items()):
        offsets = [q for q, _ in cols]
        steps = {y - x for x, y in zip(offsets, offsets[1:], strict=False)}
        if len(steps) <= 1:
            groups.append((b, offsets[0], steps.pop() if steps else 1, tuple(j for _, j in cols)))
        else:
            groups.extend((b, q, 1, (j,)) for q, j in cols)
    return tuple(groups), (kw - 1) * dw // sw


def _depthwise_row_weights(w_hwc: np.ndarray, Wo: int, strides, dilations) -> tuple:
    """Per column group of _depthwise_column_groups: its (kh, columns, Wo*C) weights, each
    tap's channel vector repeated along an output row."""
    kh, kw, C = w_hwc.shape
    groups = _depthwise_column_groups(kw, strides[1], dilations[1])[0]
    rows = np.broadcast_to(w_hwc[:, :, None, :], (kh, kw, Wo, C)).reshape(kh, kw, Wo * C)
    return tuple(np.ascontiguousarray(rows[:, list(cols)]) for *_, cols in groups)


def _depthwise_nhwc(X, w_rows, heads, outs, kernel, strides, dilations, threads, out=None,
                    finish=None) -> None:
    """Depthwise 2-D convolution in channels-last rows. A tap's weights are the same for every
    pixel x channel element of an output row, so each einsum's inner loop runs along a whole
    row (Wo*C elements) of a channels-last copy of the padded input, split into its column
    phases when strided. Output rows are cut into ranges for the intra-op threads, each with
    its own padded copy of the input rows it reads. Rows h0:h1 of the (N, Ho, Wo, C) result
    go to ``out`` (else to a scratch array), then to ``finish(h0, h1, rows)``, still in
    cache."""
    N, C, H, Wd = X.shape
    (Ho, Wo), (kh, _), (sh, sw), dh = outs, kernel, strides, dilations[0]
    groups, qspan = _depthwise_column_groups(kernel[1], sw, dilations[1])
    Wq, L = Wo + qspan, Wo * C

    def rows(h0: int, h1: int) -> None:
        r0, r1 = h0 * sh, (h1 - 1) * sh + (kh - 1) * dh + 1  # the padded rows they read
        P = scratch("conv_in", (N, sw, r1 - r0, Wq, C), X.dtype)
        x0, x1 = max(0, r0 - heads[0]), max(0, min(H, r1 - heads[0]))
        for b in range(sw):
            q0 = max(0, -(-(heads[1] - b) // sw))  # phase b's first column inside the input
            src = X[:, :, x0:max(x0, x1), q0 * sw + b - heads[1]::sw]
            _pad_into(P[:, b].transpose(0, 3, 1, 2), src, (max(0, heads[0] - r0), q0))
        sN, _, sR, sQ, item = P.strides
        result = scratch("conv_acc", (N, h1 - h0, Wo, C), X.dtype) if out is None \
            else out[:, h0:h1]
        acc = result.reshape(N, h1 - h0, L)
        for gi, ((b, q, step, cols), w) in enumerate(zip(groups, w_rows, strict=True)):
            view = as_strided(P[:, b, :, q:], (N, h1 - h0, kh, len(cols), L),
                              (sN, sh * sR, dh * sR, step * sQ, item), writeable=False)
            if gi == 0:
                np.einsum("nhijl,ijl->nhl", view, w, out=acc)
            else:
                tmp = scratch("conv_tmp", acc.shape, X.dtype)
                np.einsum("nhijl,ijl->nhl", view, w, out=tmp)
                acc += tmp
        if finish is not None:
            finish(h0, h1, result)

    parallel_for(rows, Ho, threads, N * L * kh * kernel[1] * X.itemsize)


# -- dense 2-D convolutions without im2col --------------------------------------------------------


def _winograd_weights(W: np.ndarray, cdt) -> np.ndarray:
    """(16, C, M): G W G^T of each 3x3 filter, tap (a, b) of the 4x4 result first, ready
    to multiply the (tiles, C) transformed input from the right."""
    # G = [[1, 0, 0], [.5, .5, .5], [.5, -.5, .5], [0, 0, 1]] applied along each filter axis
    # by sums of whole (C, M) planes: a three-operand einsum loops over every index at once
    # (0.1-0.2 s per 512-channel layer at session creation), and a GEMM with 9 inner
    # products runs on BLAS's threads, which a loaded machine makes slower still.
    def transform(g0, g1, g2):
        return g0, (g0 + g1 + g2) * 0.5, (g0 - g1 + g2) * 0.5, g2

    M, C = W.shape[:2]
    U = np.empty((4, 4, C, M), cdt)
    rows = W.reshape(M, C * 9)
    # A block of channels at a time: its float64 temporaries (~30 of them) stay in the cache
    # and are reused, where whole-layer ones (18 MiB each at 512 x 512) were fresh pages
    # (CRNN's first session: kernel preparation 94 -> 75 ms CPU). Each element's sums are the same.
    step = max(1, _WINOGRAD_PREP_ELEMENTS // (9 * M))
    for c0 in range(0, C, step):
        c1 = min(C, c0 + step)
        # (c, 9, M): one 2-D transpose (a 4-D one reads a cache line per element)
        taps = np.ascontiguousarray(rows[:, 9 * c0:9 * c1].T, np.float64).reshape(c1 - c0, 9, M)
        t = [taps[:, k] for k in range(9)]  # tap (i, j) is t[3 * i + j]
        cols = [transform(t[j], t[3 + j], t[6 + j]) for j in range(3)]  # along i, per j
        for a in range(4):
            for b, plane in enumerate(transform(cols[0][a], cols[1][a], cols[2][a])):
                U[a, b, c0:c1] = plane
    return U.reshape(16, C, M)


_WINOGRAD_PREP_ELEMENTS = 1 << 16  # float64 taps per block of _winograd_weights (512 KiB)
_WINOGRAD_BAND = 1 << 22  # elements of transformed input per band of tile rows
# The padded channels-last copy of a convolution's input (Winograd's, the implicit GEMM's) in
# ranges of rows of at least this many bytes on the intra-op threads (a 2 MiB copy takes
# ~0.3-0.5 ms, the queue's hand-off 20-80 us): VGG-19's layers from 64 channels at 224 x 224
# (12.8 MB, 3-6 ms on one thread) and 256 at 56 x 56 up
_PAD_BYTES = 1 << 21
# Padded inputs up to this size are a convolution's own buffers (Conv._padded_nhwc): their
# zero borders written once. Above it the pad's copy outweighs the borders' stores, and a
# VGG-sized layer's buffer per kernel would add its size to the session's memory
_OWN_PAD_BYTES = 1 << 18
# prepared products a convolution keeps (implicit GEMMs, 1x1s: one per input shape)
_LAUNCHES = 8
_UNMADE = object()  # Conv._launch_for: no product made for that key yet
# Fewer 2x2 tiles than this (images below 16 x 16) make the 16 GEMMs too short to run at
# BLAS speed on some CPUs: no gain there (ResNet50's and Inception's 14 x 14 layers on a Xeon)
# unless the channels are many (VGG19's and ZFNet's 512-channel layers).
_WINOGRAD_TILES = 64
# With several BLAS threads, small GEMMs lose more to thread hand-offs than Winograd saves
# (Inception v1 at 2 threads: 1.5x slower); only VGG-sized layers keep it.
_WINOGRAD_THREADED_MACS = 1 << 24
# Channels-last convolutions on the compiled GEMM (Conv._conv_nhwc), by measurement (AVX2, 1
# thread, best of 21, against the NCHW method chosen otherwise). Stride 1, the implicit GEMM:
# 0.5-0.8x the time of im2col + OpenBLAS and of per-tap GEMMs from 8 channels on (16 at 40 x 40:
# 0.56x; 128 -> 32 at 7 x 7 to 56 x 56: 0.48-0.75x), 0.44-0.89x Winograd's with 64 channels (56
# x 56 to 224 x 224), but 1.2-1.7x with 128 and 256: Winograd keeps those. Strided, explicit
# im2col: 0.7-0.95x with 32+ channels up to 40 x 40 outputs; slower with fewer channels (each
# tap's copy moves runs of C floats) and on larger images (the column matrix outgrows caches).
# Session 9: strided undilated layers take the implicit GEMM too (rows of A wrapping at each
# output row: no column matrix, no space-to-depth), 0.6-0.8x the time of space-to-depth and
# im2col on YOLO's stride-2 layers (docs/PERFORMANCE.md); below 8 channels on (H, C, W).
_NHWC_IMPLICIT_CHANNELS = 8
# Channels per group (in and out) from which a grouped convolution (ResNeXt, RegNet: 3x3
# layers of 8 to 64 groups) runs as one implicit GEMM per group on the compiled kernel,
# channels-last, every group in one hand-out to the threads; narrower groups fill too little
# of a panel (16 or 64 columns) and keep BLAS's per-group im2col products
_GROUPED_WIDTH = 16
_NHWC_IM2COL_CHANNELS = 32
_NHWC_IM2COL_PIXELS = 40 * 40


def _winograd_3x3(X, U, b, heads, outs, threads: int = 1, packed=None) -> np.ndarray:
    """3x3 stride-1 convolution by Winograd F(2x2, 3x3): every 2x2 output tile is
    A^T [(G W G^T) * (B^T d B)] A over its 4x4 input tile d. The 16 products summed over the
    channels are 16 GEMMs with 9/4 fewer multiplications than im2col's; the transforms are
    sums and differences of strided slices, done channels-last so that their inner loops run
    along the channels, on the intra-op threads a range of tile rows each (the GEMMs use
    BLAS's threads; or, given ``packed``, the 16 matrices of U in the compiled GEMM's panels,
    the 16 products split over spin.py's workers). Returns (N, 2*ceil(Ho/2), 2*ceil(Wo/2),
    M) channels-last, bias added, a fresh array."""
    N, C = X.shape[:2]
    M = packed[0].N if packed is not None else U.shape[2]
    Ho, Wo = outs
    th, tw = -(-Ho // 2), -(-Wo // 2)
    Wp = 2 * tw + 2
    P = scratch("conv_in", (N, 2 * th + 2, Wp, C), X.dtype)
    Pt = P.transpose(0, 3, 1, 2)
    Y = np.empty((N, 2 * th, 2 * tw, M), X.dtype)
    item = X.itemsize

    _pad_into_rows(Pt, X, heads, threads)
    band = max(1, min(th, _WINOGRAD_BAND // (16 * C * N * tw)))
    wk = _winograd_kernels(X.dtype)
    for t0 in range(0, th, band):
        nt = min(band, th - t0)
        V = scratch("conv_cols", (16, N, nt, tw, C), X.dtype)
        if wk is not None:  # one compiled pass, tile rows on spin.py's workers
            wk.input_transform(P, V, t0, threads)
        else:
            parallel_for(functools.partial(_winograd_input, P, V, t0), nt, threads,
                         24 * N * tw * C * item)
        T = N * nt * tw
        Mm = scratch("conv_gemm", (16, T, M), X.dtype)
        if packed is not None:
            from ..compiled.float_gemm import run_all

            run_all(packed, V.reshape(16, T, C), Mm, threads)  # on spin.py's workers
        else:
            blas.matmul(V.reshape(16, T, C), U, out=Mm, threads=threads)
        if wk is not None:
            wk.output_transform(Mm.reshape(16, N, nt, tw, M), b, Y, t0, threads)
        else:
            parallel_for(functools.partial(_winograd_output, Mm.reshape(4, 4, N, nt, tw, M),
                                           b, Y, t0), nt, threads, 16 * N * tw * M * item)
    return Y


def _winograd_kernels(dtype):
    """compiled.winograd (its transforms: the numpy path's bits in one pass each) for float32
    where it runs, else None."""
    if dtype != np.float32:
        return None
    from ..compiled import winograd

    return winograd if winograd.unavailable() is None else None


def _winograd_input(P, V, t0: int, r0: int, r1: int) -> None:
    """Tile rows r0:r1 of the band starting at tile row t0: V = B^T d B of the padded
    channels-last input P, (16, N, tile rows, tile columns, C)."""
    N, nt, tw, C = V.shape[1:]
    # rows: B^T d, every 4-row window at once (tile rows step by 2)
    R = scratch("conv_rows", (4, N, r1 - r0, P.shape[2], C), P.dtype)
    first = 2 * (t0 + r0)
    p = [P[:, first + k:first + k + 2 * (r1 - r0) - 1:2] for k in range(4)]
    np.subtract(p[0], p[2], out=R[0])
    np.add(p[1], p[2], out=R[1])
    np.subtract(p[2], p[1], out=R[2])
    np.subtract(p[1], p[3], out=R[3])
    # columns: (B^T d) B, straight into the 16 GEMM operands (tiles, C)
    Vr = V[:, :, r0:r1]
    for a in range(4):
        q = [R[a][:, :, k:k + 2 * tw - 1:2] for k in range(4)]
        np.subtract(q[0], q[2], out=Vr[4 * a])
        np.add(q[1], q[2], out=Vr[4 * a + 1])
        np.subtract(q[2], q[1], out=Vr[4 * a + 2])
        np.subtract(q[1], q[3], out=Vr[4 * a + 3])


def _winograd_output(Mm, b, Y, t0: int, r0: int, r1: int) -> None:
    """Tile rows r0:r1 of the band starting at tile row t0: A^T m A (+ b) of the GEMM results
    Mm (4, 4, N, tile rows, tile columns, M) into the channels-last output Y."""
    N, _, tw, M = Mm.shape[2:]
    m = Mm[:, :, :, r0:r1]
    # rows, then columns into the strided output
    S = scratch("conv_acc", (2, 4, N, r1 - r0, tw, M), Mm.dtype)
    np.add(m[0], m[1], out=S[0])
    S[0] += m[2]
    np.subtract(m[1], m[2], out=S[1])
    S[1] -= m[3]
    if b is not None:  # S[a][1] enters both output columns with a plus sign
        S[:, 1] += b.reshape(M)
    for a in range(2):
        s = S[a]
        ya = Y[:, 2 * (t0 + r0) + a:2 * (t0 + r1):2]
        y = np.add(s[0], s[1], out=ya[:, :, 0::2])
        y += s[2]
        y = np.subtract(s[1], s[2], out=ya[:, :, 1::2])
        y -= s[3]


def _shifted_gemm(X, Wk, heads, outs, kernel, dilations, threads: int = 1) -> np.ndarray:
    """Stride-1 convolution (group 1) as one GEMM per kernel tap on the padded input itself:
    with every image flattened on a "wide" grid of row width Wp, tap (i, j) is the contiguous
    column range starting at i*dh*Wp + j*dw. No im2col matrix: the cheaper choice when the
    output has fewer channels than the input. Returns a strided (N, M, Ho, Wo) scratch view."""
    N, C = X.shape[:2]
    K, M = Wk.shape[:2]
    (Ho, Wo), (kh, kw), (dh, dw) = outs, kernel, dilations
    Hp, Wp = Ho + (kh - 1) * dh, Wo + (kw - 1) * dw
    plane = Hp * Wp
    slack = (kw - 1) * dw
    flat = scratch("conv_in", (C, N * plane + slack), X.dtype)
    flat[:, N * plane:] = 0
    _pad_into(flat[:, :N * plane].reshape(C, N, Hp, Wp), X.transpose(1, 0, 2, 3), heads)
    L = (N - 1) * plane + Ho * Wp
    Y = scratch("conv_acc", (M, L + 16), X.dtype)[:, :L]  # a gap: see _depthwise_planar
    tmp = scratch("conv_tmp", (M, L + 16), X.dtype)[:, :L] if K > 1 else None
    for k in range(K):
        i, j = divmod(k, kw)
        off = i * dh * Wp + j * dw
        blas.matmul(Wk[k], flat[:, off:off + L], out=Y if k == 0 else tmp, threads=threads)
        if k:
            Y += tmp
    sM, item = Y.strides
    return as_strided(Y, (N, M, Ho, Wo), (plane * item, sM, Wp * item, item), writeable=False)


# -- epilogue -------------------------------------------------------------------------------------


def _finish(Y, src, b, Z, act, out_dtype, threads: int = 1, out=None) -> np.ndarray:
    """The result act(Y + b + Z) as ``out_dtype``: Y a fresh array updated in place, or (Y
    None) ``src``, a strided view of scratch, copied out by the first operation (into
    ``out``, the executor's buffer, when it fits). Cut into ranges of rows (axis 2) for the
    intra-op threads."""
    if Y is None:
        Y = out if out is not None and out.shape == src.shape and out.dtype == src.dtype \
            else np.empty(src.shape, src.dtype)
    elif b is None and Z is None and act is None:  # nothing to add or activate
        return Y if Y.dtype == out_dtype else Y.astype(out_dtype)
    if Y.size == 0:  # an empty batch or output: nothing to add or activate
        return Y if Y.dtype == out_dtype else Y.astype(out_dtype)
    if Z is not None and Z.shape != Y.shape:
        Z = np.broadcast_to(Z, Y.shape)
    if Y.ndim < 3:
        _epilogue(Y, src, b, Z, act)
    else:
        N, H = Y.shape[0], Y.shape[2]
        passes = (src is not None) + (b is not None) + (Z is not None) + (act is not None)

        def rows(start: int, stop: int) -> None:
            for n, h0, h1 in _row_pieces(H, start, stop):
                part = (slice(n, n + 1), slice(None), slice(h0, h1))
                _epilogue(Y[part], None if src is None else src[part], b,
                          None if Z is None else Z[part], act)

        parallel_for(rows, N * H, threads, max(1, passes) * Y[0, :, 0].nbytes)
    return Y if Y.dtype == out_dtype else Y.astype(out_dtype)


def _residual_rows(Z, shape: tuple[int, ...]) -> np.ndarray | None:
    """Z (FusedConv's addend) as the (pixels, channels) rows a compiled GEMM's epilogue adds
    after the bias (the same additions, in the same order, as _finish's), or None where Z
    is absent or not a float32 channels-last array of the output's ``shape``."""
    if Z is None or Z.shape != shape or Z.dtype != np.float32 or not _is_channels_last(Z):
        return None
    return Z.transpose(0, 2, 3, 1).reshape(-1, shape[1])


def _row_pieces(H: int, start: int, stop: int):
    """Rows [start, stop) of the flattened (image, row) index as (image, first row, end row)
    pieces, one image each: a piece of a channels-last array stays one contiguous block."""
    while start < stop:
        n, h0 = divmod(start, H)
        h1 = min(H, h0 + stop - start)
        yield n, h0, h1
        start += h1 - h0


def _epilogue(Y, src, b, Z, act) -> None:
    """Y = act(src + b + Z) in place (src None: Y holds the sum's first term)."""
    if src is not None:
        bounds = getattr(act, "bounds", None)
        if b is None and Z is None and bounds is not None:  # Relu / Clip while copying
            blas.clip(src, *bounds, out=Y)
            return
        if b is not None:
            np.add(src, b, out=Y)
            b = None
        else:
            np.copyto(Y, src)
    if b is not None:
        add_channel_bias(Y, b)
    if Z is not None:
        Y += Z
    if act is not None:
        act(Y)


def add_channel_bias(Y: np.ndarray, b: np.ndarray) -> None:
    """Y += b (one value per channel, axis 1) in place. Channels-last, the rows of b are
    repeated to a block of several thousand elements: numpy adds a short broadcast row far
    more slowly than a long one."""
    M = Y.shape[1]
    if _is_channels_last(Y) and M < 4096:
        flat = Y.transpose(0, 2, 3, 1).reshape(-1, M)
        R = min(flat.shape[0], max(1, 8192 // M))
        whole = flat.shape[0] // R * R
        block = np.tile(b.reshape(M), (R, 1))
        body = flat[:whole].reshape(-1, R, M)
        body += block
        if whole < flat.shape[0]:
            flat[whole:] += block[:flat.shape[0] - whole]
        return
    Y += b


def nhwc_out(out: np.ndarray | None, shape: tuple[int, ...], dtype,
             rows: bool = False) -> np.ndarray:
    """A fresh (N, H, W, C) array of ``dtype``, or ``out`` (an (N, C, H, W) buffer the
    executor hands a kernel: memory.py) seen channels-last, when it is one of that layout;
    with ``rows``, for a caller that only slices it or views it as (N * H * W, C) rows, also
    when its rows are further apart (a range of the channels of a wider one: a Concat's
    output written in its place in another Concat's, memory.py)."""
    if out is not None and out.dtype == dtype:
        t = out.transpose(0, 2, 3, 1)
        if t.shape == shape and (t.flags.c_contiguous or rows and _pixel_rows(t)):
            return t
    return np.empty(shape, dtype)


def _pixel_rows(t: np.ndarray) -> bool:
    """Whether ``t`` (N, H, W, C) is rows of C contiguous elements, any equal stride apart,
    so that reshaping it to (N * H * W, C) or (N, H * W, C) is a view, not a copy."""
    v = t.view()
    try:
        v.shape = (-1, t.shape[3])  # raises where only a copy has that shape
    except AttributeError:
        return False
    return v.strides[1] == t.itemsize and v.strides[0] >= v.shape[1] * t.itemsize and \
        v.strides[0] % t.itemsize == 0


# elements from which the compiled pass takes it (below, its call costs more than numpy's)
_SCALE_SHIFT_COMPILED = 1 << 10


def scale_shift_channels(X: np.ndarray, a: np.ndarray, b: np.ndarray,
                         out: np.ndarray | None = None, threads: int = 1,
                         relu: bool = False) -> np.ndarray:
    """X * a + b, one (a, b) per channel, for a channels-last X (N, C, H, W) with C < 4096:
    a fresh channels-last result, the rows of pixels taken in blocks of several thousand
    elements with a and b repeated to match (as add_channel_bias; BatchNormalization at
    inference after a DenseNet's Concat: 1.6-2x faster than numpy's broadcast of a (C, 1, 1)
    operand at 64-256 channels and 56 x 56, bit for bit the same). ``relu``: then Relu, in
    the same compiled pass (FusedBatchNormalization), else on the result in place."""
    N, C, H, W = X.shape
    Yt = nhwc_out(out, (N, H, W, C), X.dtype)
    if Yt.size == 0:  # an empty batch or image: nothing to scale
        return Yt.transpose(0, 3, 1, 2)
    Xt = X.transpose(0, 2, 3, 1)
    if Xt.size >= _SCALE_SHIFT_COMPILED and _pixel_rows(Xt):
        # one compiled pass (rows on spin.py's workers), reading X where it lies: a
        # DenseNet's first channels of the next Concat's output (a copy cost 400 us a call)
        from ..compiled.scale_shift import scale_shift

        rows = Xt.view()
        rows.shape = (-1, C)  # a view: _pixel_rows
        if scale_shift(rows, a, b, Yt.reshape(-1, C), threads, relu):
            return Yt.transpose(0, 3, 1, 2)
    src, dst = Xt.reshape(-1, C), Yt.reshape(-1, C)
    R = min(src.shape[0], max(1, 8192 // C))
    whole = src.shape[0] // R * R
    body = dst[:whole].reshape(-1, R * C)
    np.multiply(src[:whole].reshape(-1, R * C), np.tile(a.reshape(C), R), out=body)
    body += np.tile(b.reshape(C), R)
    if whole < src.shape[0]:
        np.multiply(src[whole:], a.reshape(C), out=dst[whole:])
        dst[whole:] += b.reshape(C)
    if relu:
        from .activation import Relu

        Relu(Yt, out=Yt)
    return Yt.transpose(0, 3, 1, 2)


# -- memory layout between convolutions -------------------------------------------------------
#
# A kernel may return any strides. Around depthwise convolutions channels-last memory (an
# NCHW-shaped view of an NHWC array) is the cheaper one: the depthwise kernel works in it (its
# inner loops run along the channels instead of along short image rows), and the 1x1
# convolutions before and after it are the same GEMMs with transposed operands. Winograd works
# channels-last too. So a convolution writes its output channels-last when every reader takes
# it at no cost and a side gains (channels_last_output); graph outputs stay NCHW.

# This is onnxrun's layout optimization: onnxruntime's layout level (ORT_ENABLE_LAYOUT, 3, and
# so ORT_ENABLE_ALL) rewrites convolution chains into blocked NCHWc layouts in the graph; onnxrun
# picks the memory layout of each convolution's output when it prepares the kernel, so the saved
# model stays portable NCHW. It follows the same level: below ORT_ENABLE_LAYOUT every output is
# written NCHW. The session's optimization report counts the convolutions it turned.
_LAYOUT_LEVEL = 3  # GraphOptimizationLevel.ORT_ENABLE_LAYOUT


def layout_changes_allowed(ctx) -> bool:
    level = getattr(getattr(ctx, "session_options", None), "graph_optimization_level", None)
    return level is None or int(level) >= _LAYOUT_LEVEL


# One tensor in, numpy keeps its layout (the ufuncs' order "K"): activations, SiLU as the
# QuickGelu the optimizer fuses x * Sigmoid(x) into, the Gelu it fuses the erf form into (its
# kernel works on X's memory as it lies); and BatchNormalization at inference (a DenseNet's
# after each Concat), its other inputs per-channel constants, with the Relu the layout level
# fuses into it (ai.onnxrun FusedBatchNormalization) or without.
_PASS_THROUGH = frozenset({("", "Relu"), ("", "Clip"), ("", "Sigmoid"), ("", "Tanh"),
                           ("", "LeakyRelu"), ("", "HardSigmoid"), ("", "HardSwish"),
                           ("com.microsoft", "QuickGelu"), ("com.microsoft", "Gelu")})


def _passes_layout(node) -> bool:
    if node.domain == "" and node.op_type == "BatchNormalization":  # inference: x * a + b
        return sum(bool(v.name) for v in node.outputs) == 1
    if node.domain == "ai.onnxrun" and node.op_type == "FusedBatchNormalization":
        return True  # inference only, one output
    return (node.domain, node.op_type) in _PASS_THROUGH


def _follows_layout(node) -> bool:
    """Whether ``node``'s kernel writes its output in its (4-D) input's layout when allowed
    (keeps_layout): Concat (channels-last when an operand is) and Split along the channels,
    MaxPool / AveragePool without indices, nearest Resize."""
    if node.domain != "":
        return False
    op = node.op_type
    if op in ("Concat", "Split"):
        return int(node.attr("axis", 0 if op == "Split" else 1)) in (1, -3) and \
            _rank(node.inputs[0]) == 4
    if op in ("MaxPool", "AveragePool"):
        return len(node.outputs) == 1 or not node.outputs[1].name or not node.outputs[1].uses
    if op == "Resize":
        return text_attribute(node.attr("mode", "nearest")) == "nearest" and \
            _rank(node.inputs[0]) == 4
    if op in ("Reshape", "Transpose"):
        return channel_shuffle(node) is not None
    return False


def _shape(value) -> tuple | None:
    """type_shape of ``value``'s type as a tuple, remembered per graph while its kernels are
    prepared (the layout walks ask the same values' shapes over and over): keyed by the type
    object, which the entry holds, so a replaced type is read afresh."""
    tp = value.type if value is not None else None
    if tp is None:
        return None
    graph = value.graph
    shapes = _SHAPES.get(graph) if graph is not None else None
    if shapes is None:
        if graph is None:
            dims = type_shape(tp)
            return None if dims is None else tuple(dims)
        shapes = _SHAPES[graph] = {}
    hit = shapes.get(id(tp))
    if hit is not None and hit[0] is tp:
        return hit[1]
    dims = type_shape(tp)
    dims = None if dims is None else tuple(dims)
    shapes[id(tp)] = (tp, dims)
    return dims


_SHAPES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _dims(value) -> tuple | None:
    dims = _shape(value)
    return None if dims is None or not all(isinstance(d, int) and d > 0 for d in dims) \
        else dims


def _per_channel(value) -> bool:
    """Whether ``value`` (an operand of an element-wise join of 4-D images) has one pixel:
    a static shape whose last two dimensions (H and W, broadcast from the right) are 1, or
    a scalar. numpy lays the join's result out as its image operands are laid out."""
    dims = _dims(value) if value is not None else None
    return dims is not None and len(dims) <= 4 and all(d == 1 for d in dims[-2:])


def _shuffle_from(first) -> tuple | None:
    """(first, transpose, last) when the Reshape ``first`` starts a channel shuffle."""
    src, mid = _dims(first.inputs[0]), _dims(first.outputs[0])
    if src is None or mid is None or len(src) != 4 or len(mid) != 5 or \
            mid[0] != src[0] or mid[1] * mid[2] != src[1] or mid[3:] != src[2:] or \
            len(first.outputs[0].uses) != 1:
        return None
    transpose = first.outputs[0].uses[0][0]
    if transpose.domain != "" or transpose.op_type != "Transpose" or \
            [int(p) for p in (transpose.attr("perm", None) or ())] != [0, 2, 1, 3, 4] or \
            len(transpose.outputs[0].uses) != 1:
        return None
    last = transpose.outputs[0].uses[0][0]
    if last.domain != "" or last.op_type != "Reshape" or _dims(last.outputs[0]) != src:
        return None
    return first, transpose, last


def channel_shuffle(node) -> tuple | None:
    """The channel shuffle (ShuffleNet's Reshape (N, C, H, W) -> (N, g, C/g, H, W), Transpose
    (0, 2, 1, 3, 4), Reshape back to (N, C, H, W)) that ``node`` belongs to, as (first,
    transpose, last), or None. Channels-last memory passes through it: the first Reshape
    and the Transpose are views, the last Reshape one copy that interleaves the groups'
    channels of each pixel (ops/tensor.py)."""
    if node.domain != "" or node.op_type not in ("Reshape", "Transpose") or \
            node.inputs[0] is None:
        return None
    if node.op_type == "Reshape" and _rank(node.outputs[0]) == 5:
        return _shuffle_from(node)
    producer = node.inputs[0].producer
    if node.op_type == "Transpose":
        found = None if producer is None or producer.op_type != "Reshape" else \
            channel_shuffle(producer)
    else:
        found = None if producer is None or producer.op_type != "Transpose" else \
            channel_shuffle(producer)
    return found if found is not None and node in found else None


def _rank(value) -> int | None:
    dims = _shape(value)
    return None if dims is None else len(dims)


def keeps_layout(ctx) -> bool:
    """Whether the kernel of ``ctx``'s node may write its output channels-last when its input
    comes so (a _follows_layout operator, at the layout level): never a graph output."""
    node = getattr(ctx, "node", None)
    graph = getattr(node, "graph", None)
    if node is None or graph is None or not layout_changes_allowed(ctx):
        return False
    return not any(v in graph.outputs for v in node.outputs)


def channels_inner(X: np.ndarray) -> bool:
    """X (N, C, H, W) has its channels innermost in memory: channels-last, or a range of
    channels of such an array (a Split of one)."""
    return X.ndim == 4 and X.shape[1] > 1 and X.strides[1] == X.itemsize and \
        X.strides[3] >= X.shape[1] * X.itemsize and X.strides[2] >= X.shape[3] * X.strides[3]


_JOIN = frozenset({"Add", "Sub", "Mul", "Sum"})  # channels-last only when every operand is
# operators followed from a convolution, either way, deciding its layout: a chain of residual
# blocks without convolutions on the skip path (ShuffleNet's Sum -> Relu -> Sum ...) is
# followed block after block (12 left ShuffleNet's last 13 convolutions NCHW)
_LAYOUT_DEPTH = 48


# Each convolution's kind per graph (weakly held: gone with the graph), for the layout choices
# of its neighbours ask it over and over (ResNet-50: 654 times for 53 convolutions, a third of
# its kernels' preparation). A graph's kernels are prepared once, under one compiled-kernel
# state, and its nodes do not change meanwhile: keyed by the node's id and the threads.
_KINDS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def conv_kind(node, threads: int = 1) -> str:
    """How the Conv / FusedConv ``node`` will run (with ``threads`` BLAS threads): "1x1" (a
    GEMM on its input), "depthwise" (the channels-last kernel), "winograd", "nhwc"
    (channels-last im2col on the compiled GEMM), or "other"."""
    graph = node.graph
    if graph is None:
        return _conv_kind(node, threads)
    kinds = _KINDS.get(graph)
    if kinds is None:
        kinds = _KINDS[graph] = {}
    key = (id(node), threads)
    kind = kinds.get(key)
    if kind is None:
        kind = kinds[key] = _conv_kind(node, threads)
    return kind


def _conv_kind(node, threads: int) -> str:
    W = _constant_weight(node)
    if W is None or len(W.shape) != 4:
        return "other"
    group = int(node.attr("group", 1))
    if group == W.shape[0] and W.shape[1] == 1 and group > 1:
        return "depthwise" if group >= _NHWC_CHANNELS else "other"
    strides = tuple(int(v) for v in (node.attr("strides", None) or (1, 1)))
    dilations = tuple(int(v) for v in (node.attr("dilations", None) or (1, 1)))
    pads = tuple(int(v) for v in (node.attr("pads", None) or ()))
    auto_pad = text_attribute(node.attr("auto_pad", "NOTSET"))
    kernel = tuple(W.shape[2:])
    auto_pad = unpadded_auto_pad(auto_pad, kernel)
    if kernel == (1, 1) and strides == (1, 1) and not any(pads) and \
            auto_pad in ("NOTSET", "VALID") and \
            (group == 1 or _grouped_1x1_packable(W.dtype)):
        return "1x1"  # (grouped: all groups in one compiled GEMM call, Conv._grouped_1x1)
    outs = None
    shape = _static_shape(node.inputs[0])
    if shape is not None:
        try:
            outs = window_geometry(shape[2:], kernel, strides, dilations, pads, auto_pad)[2]
        except ValueError:
            return "other"
    method = _dense_method(W.shape[1] * group, W.shape[0], kernel, strides, dilations, group,
                           outs, method_threads(threads, compute_dtype(W.dtype)),
                           _packable(W.dtype))
    if method in ("hcw", "grouped"):  # implicit GEMMs on a copy of the input, as "nhwc"
        return "nhwc"
    return method if method in ("winograd", "nhwc") else "other"


class _WeightSpec(collections.namedtuple("_WeightSpec", "shape dtype")):
    # (not typing.NamedTuple: its string annotations cost a compile each at import)
    __slots__ = ()
    shape: tuple[int, ...]
    dtype: np.dtype


def unpadded_auto_pad(auto_pad: str, kernel) -> str:
    """``auto_pad`` as it acts on a window of ``kernel``: SAME_* pads a one-tap window by
    nothing at any stride (PyTorch exports its padding="same" 1x1 convolutions so, which
    would otherwise miss the 1x1 paths), NOTSET's zero pads."""
    if auto_pad in ("SAME_UPPER", "SAME_LOWER") and len(kernel) and \
            all(int(k) == 1 for k in kernel):
        return "NOTSET"
    return auto_pad


def _constant_weight(node) -> np.ndarray | _WeightSpec | None:
    """The constant W of the convolution ``node`` (its array, or its shape and dtype once the
    session has released the array, which the node's kernel holds packed: a convolution
    prepared later decides its layout on its neighbours as if W were there), or None."""
    v = node.inputs[1] if len(node.inputs) > 1 else None
    if v is None or v.const_value is not None:
        return None if v is None else v.const_value
    graph = v.graph
    if v.producer is not None or graph is None or graph.initializers.get(v.name) is not v or \
            v.type is None or not v.type.HasField("tensor_type"):
        return None
    shape = type_shape(v.type)
    if shape is None or not all(isinstance(d, int) for d in shape):
        return None
    return _WeightSpec(tuple(shape), np_dtype(v.type.tensor_type.elem_type))


def tiled_transpose(node) -> bool:
    """Whether the ConvTranspose ``node`` takes ConvTranspose's tiled path: a constant 4-D
    float32 W, one group, strides equal to the kernel, no dilation, padding, output padding
    or output shape (each input pixel writes its own kh x kw block of the output, as a
    segmentation head's 2x2 stride-2 upsampling)."""
    W = _constant_weight(node)
    if W is None or len(W.shape) != 4 or np.dtype(W.dtype) != np.float32 or \
            int(node.attr("group", 1)) != 1:
        return False
    kernel = tuple(int(v) for v in W.shape[2:])
    shape = node.attr("kernel_shape", None)
    if shape is not None and tuple(int(v) for v in shape) != kernel:
        return False
    auto_pad = text_attribute(node.attr("auto_pad", "NOTSET"))
    return tuple(int(v) for v in (node.attr("strides", None) or (1, 1))) == kernel and \
        not any(int(v) != 1 for v in (node.attr("dilations", None) or ())) and \
        not any(int(v) for v in (node.attr("pads", None) or ())) and \
        not any(int(v) for v in (node.attr("output_padding", None) or ())) and \
        not node.attr("output_shape", None) and auto_pad in ("NOTSET", "VALID")


def _packable(dtype) -> bool:
    """Whether a constant weight of ``dtype`` runs on the compiled float32 GEMM here."""
    if np.dtype(dtype) != np.float32:
        return False
    from ..compiled import float_gemm

    return float_gemm.unavailable() is None


def _grouped_1x1_packable(dtype) -> bool:
    """Whether a grouped 1x1 convolution runs on the compiled GEMM (Conv._grouped_1x1),
    reading and writing channels-last memory."""
    return _packable(dtype)


def method_threads(threads: int, dtype) -> int:
    """The BLAS threads a dense convolution's choice of method assumes: 1 where Winograd's
    products run on the compiled float32 GEMM (it splits them over the intra-op threads
    itself, and the session holds BLAS to one thread), so the one-thread rules apply; else
    ``threads``. Decided once, when the kernel is prepared."""
    if threads != 1 and np.dtype(dtype) == np.float32:
        from ..compiled import float_gemm

        if float_gemm.unavailable() is None:
            return 1
    return threads


def _static_shape(value) -> tuple | None:

    dims = type_shape(value.type) if value is not None and value.type is not None else None
    if dims is None or len(dims) != 4 or not all(isinstance(d, int) and d > 0
                                                 for d in dims[1:]):
        return None
    return tuple(dims)  # the batch may be symbolic


# The layout walks' answers per graph (weakly held, as _KINDS and on the same terms): each
# convolution's choice walks its neighbourhood forwards and backwards, and its neighbours'
# choices walk much of it again (ShuffleNet: 1,330 walk steps for 49 convolutions). An answer
# is kept with how deep below its own step its walk went, and reused only where the walk from
# the new depth would stay within _LAYOUT_DEPTH as well (then it takes the same steps); an
# answer that met the depth limit is not kept. A walk reads its ``joins`` only by asking
# whether a node is among them (_joined), so an answer is kept with the nodes its walk asked
# about and which of them were joins, and reused for any ``joins`` that answers those the
# same: keyed by the whole set, the answers around Concats were missed (a DenseNet block's
# inner Concats enter the set in every order its walks meet them). _REACHED: the deepest step
# of the walk under way (.depth) and the nodes it asked about (.asked).
_WALKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_REACHED = threading.local()


def _walk_memo(value) -> dict | None:
    producer = value.producer
    graph = producer.graph if producer is not None else None
    if graph is None:
        return None
    memo = _WALKS.get(graph)
    if memo is None:
        memo = _WALKS[graph] = {}
    return memo


def _joined(node, joins: frozenset) -> bool:
    """``node in joins``, noted for the walk under way (see _WALKS)."""
    asked = getattr(_REACHED, "asked", None)
    if asked is not None:
        asked.add(node)
    return node in joins


def _remembered(walk, value, threads: int, joins: frozenset, depth: int):
    """``walk(value, threads, joins, depth)``, answered from _WALKS where that is exact."""
    memo = _walk_memo(value)
    key = (walk, id(value), threads)
    outer = getattr(_REACHED, "depth", 0)
    outer_asked = getattr(_REACHED, "asked", None)
    if memo is not None:
        for answer, reach, asked, inside in memo.get(key, ()):
            if depth + reach <= _LAYOUT_DEPTH and asked & joins == inside:
                _REACHED.depth = max(outer, depth + reach)
                if outer_asked is not None:
                    outer_asked |= asked
                return answer
    _REACHED.depth = depth
    _REACHED.asked = asked = set()
    try:
        answer = walk(value, threads, joins, depth)
        reached = _REACHED.depth
    finally:
        _REACHED.depth = max(outer, getattr(_REACHED, "depth", depth))
        _REACHED.asked = outer_asked
        if outer_asked is not None:
            outer_asked |= asked
    if memo is not None and reached <= _LAYOUT_DEPTH:
        memo.setdefault(key, []).append((answer, reached - depth, frozenset(asked),
                                         joins & asked))
    return answer


def _channels_last_readers(value, threads: int, joins: frozenset = frozenset(),
                           depth: int = 0) -> set[str] | None:
    """The kinds of the convolutions reading ``value`` (through Relu / Clip, and through
    Add / Sub / Mul whose other operands are written channels-last too), or None when some
    reader would pay for channels-last memory (or ``value`` is a graph output). ``joins``:
    the Add nodes whose operands are being decided up the call chain."""
    found = _remembered(_readers_walk, value, threads, joins, depth)
    return None if found is None else set(found)


def _readers_walk(value, threads: int, joins: frozenset, depth: int) -> frozenset | None:
    producer = value.producer
    graph = producer.graph if producer is not None else None
    if graph is None or not value.uses or value in graph.outputs or depth > _LAYOUT_DEPTH:
        return None
    kinds: set[str] = set()
    for node, index in value.uses:
        if node.domain in ("", "com.microsoft") and node.op_type in ("Conv", "FusedConv"):
            if index == 3 and node.op_type == "FusedConv":  # Z: added to the output in the
                # output's layout (ConvAddActivationFusion's residuals), a join as an Add's
                # whose other operand is the convolution's own result (one walk on: its
                # readers are asked by _writes_walk)
                if _joined(node, joins):
                    continue
                if not _writes_channels_last(node.outputs[0], threads, joins | {node},
                                             depth + 1):
                    return None
                kinds.add("follow")
                continue
            kind = conv_kind(node, threads)
            if index != 0 or kind == "other":
                return None
            kinds.add(kind)
        elif _passes_layout(node) and index == 0:
            for v in node.outputs:
                more = _channels_last_readers(v, threads, joins, depth + 1)
                if more is None:
                    return None
                kinds |= more
        elif node.domain == "" and node.op_type in _JOIN:
            if _joined(node, joins):
                continue  # decided where the recursion entered it
            inner = joins | {node}
            for v in node.inputs:
                if v is not value and not _per_channel(v) and (v is None or not
                                                               _writes_channels_last(
                                                                   v, threads, inner,
                                                                   depth + 1)):
                    return None
            more = _channels_last_readers(node.outputs[0], threads, inner, depth + 1)
            if more is None:
                return None
            kinds |= more
        elif node.domain == "" and node.op_type == "GlobalAveragePool":
            kinds.add("pool")
        elif node.domain == "" and node.op_type == "ConvTranspose" and index == 0 and \
                tiled_transpose(node):
            kinds.add("transpose")  # its products read rows or columns alike
        elif _to_tokens(node, index):
            kinds.add("tokens")
        elif _follows_layout(node) and node.op_type in ("MaxPool", "AveragePool") and \
                index == 0 and (_dims(node.outputs[0]) or (0, 0, 0))[2:] == (1, 1):
            kinds.add("pool")  # one pixel: channels-last memory is NCHW memory
        elif _follows_layout(node):
            inner = joins
            if node.op_type == "Concat":  # (its NCHW operands are copied in, transposed)
                if _joined(node, joins):
                    continue
                inner = joins | {node}
            elif index != 0:
                return None
            for v in node.outputs:
                if not v.name or (not v.uses and v not in graph.outputs):
                    continue
                more = _channels_last_readers(v, threads, inner, depth + 1)
                if more is None:
                    return None
                kinds |= more | {"follow"}
        else:
            return None
    return frozenset(kinds)


def _writes_channels_last(value, threads: int, joins: frozenset = frozenset(),
                          depth: int = 0) -> bool:
    """Whether the producer of ``value`` (a convolution, or an operator that keeps its
    input's layout) writes it channels-last."""
    return _remembered(_writes_walk, value, threads, joins, depth)


def _writes_walk(value, threads: int, joins: frozenset, depth: int) -> bool:
    node = value.producer
    if node is None or depth > _LAYOUT_DEPTH:
        return False
    join = node.domain == "" and node.op_type in _JOIN
    if _passes_layout(node) or _follows_layout(node) or join:
        if join:  # channels-last when every operand comes so (numpy keeps a shared layout),
            # bar per-channel ones (a decomposed BatchNormalization's scale, an SE block's
            # gate), which broadcast over the pixels: numpy's result follows the others
            if _joined(node, joins):
                return False
            joins = joins | {node}
            images = [v for v in node.inputs if not _per_channel(v)]
            if not images or any(v is None or not _writes_channels_last(
                    v, threads, joins, depth + 1) for v in images):
                return False
        elif node.op_type == "Concat":  # channels-last when one operand comes so
            if _joined(node, joins):
                return False
            joins = joins | {node}
            if not any(v is not None and _writes_channels_last(v, threads, joins, depth + 1)
                       for v in node.inputs):
                return False
        elif node.inputs[0] is None or not _writes_channels_last(node.inputs[0], threads,
                                                                   joins, depth + 1):
            return False
        return all(_channels_last_readers(v, threads, joins, depth + 1) is not None
                   for v in node.outputs if v.name and (v.uses or v in node.graph.outputs))
    if node.domain == "" and node.op_type == "ConvTranspose":
        return value is node.outputs[0] and tiled_transpose(node) and \
            _channels_last_readers(value, threads, joins, depth) is not None
    if node.op_type not in ("Conv", "FusedConv") or \
            node.domain not in ("", "com.microsoft") or value is not node.outputs[0]:
        return False
    readers = _channels_last_readers(value, threads, joins, depth)
    if readers is None:
        return False
    kind = conv_kind(node, threads)
    if kind in ("depthwise", "nhwc", "winograd"):  # their GEMM / loops / output transform
        return True  # write channels-last anyway
    if kind == "other":  # one transposing copy of its output, where a pool or a Concat
        # passes the layout on (a stem: Conv -> MaxPool), or tokens read it (the copy their
        # readers would make otherwise)
        return bool(readers & {"follow", "tokens"})
    return kind == "1x1" and bool(readers & {"depthwise", "nhwc", "tokens"} or
                                  _reads_channels_last(node, threads, depth))


def _to_tokens(node, index: int) -> bool:
    """Whether ``node`` turns its input X (N, C, H, W) into tokens (N, H*W, C) as a vision
    transformer's patch embedding does: a Reshape to (N, C, H*W) read only as tokens
    (_reads_tokens). Channels-last X makes those tokens contiguous memory, where NCHW X makes
    every reader (LayerNormalization, the residual Add, MatMul's rows) copy them first
    (SVTR-style recognizers: three stages, each starting so)."""
    if node.domain != "" or node.op_type != "Reshape" or index != 0:
        return False
    tokens, dims = node.outputs[0], _dims(node.inputs[0])
    if dims is None or len(dims) != 4 or _dims(tokens) != (dims[0], dims[1], dims[2] * dims[3]):
        return False
    graph = node.graph
    return bool(tokens.uses) and graph is not None and tokens not in graph.outputs and all(
        _reads_tokens(n, i) for n, i in tokens.uses)


def _reads_tokens(node, index: int) -> bool:
    """Whether ``node`` reads its input ``index``, (N, C, L), as tokens (N, L, C): a
    Transpose (0, 2, 1), or a product that transposes its A so (MatMulTransposeFusion's)."""
    if index != 0:
        return False
    if node.domain == "" and node.op_type == "Transpose":
        return [int(p) for p in node.attr("perm", [])] == [0, 2, 1]
    return node.domain == "com.microsoft" and node.op_type == "FusedMatMul" and \
        node.attr("transA", 0) == 1 and node.attr("transBatchA", 0) == 0


def _reads_channels_last(node, threads: int, depth: int) -> bool:
    """Whether the input of the convolution ``node`` arrives channels-last."""
    v = node.inputs[0]
    while v is not None and v.producer is not None and _passes_layout(v.producer):
        v = v.producer.inputs[0]
    if v is not None and depth >= _LAYOUT_DEPTH:  # the limit met: not an answer to keep
        _REACHED.depth = max(getattr(_REACHED, "depth", 0), _LAYOUT_DEPTH + 1)
        return False
    return v is not None and _writes_channels_last(v, threads, frozenset(), depth + 1)


def channels_last_output(node, threads: int = 1) -> bool:
    """Whether the convolution ``node`` should write its output channels-last: every reader
    takes it at no cost, and some side gains. By measurement (MobileNetV2, ResNet50, VGG19):
    a depthwise convolution's output, a 1x1 convolution's that a depthwise one reads or
    whose input came channels-last, and Winograd's (its readers' 1x1 GEMMs on the compiled
    GEMM: ResNet-50 at 1 thread -4 to -5% CPU time against NCHW there, session 12's AVX-512
    tile; with the 14 x 32 tile the 1x1 GEMMs around a Winograd layer ran faster in NCHW on
    BLAS)."""
    return _writes_channels_last(node.outputs[0], threads)


def _read_by_convolutions_only(node) -> bool:
    """Whether ``node``'s first output is read only as convolutions' input X (and is no
    graph output)."""
    value = node.outputs[0] if node is not None and node.outputs else None
    graph = value.producer.graph if value is not None and value.producer is not None else None
    if graph is None or not value.uses or value in graph.outputs:
        return False
    return all(n.domain in ("", "com.microsoft") and n.op_type in ("Conv", "FusedConv") and
               i == 0 for n, i in value.uses)


def _gemm_epilogue(act) -> tuple:
    """What of the activation ``act`` the compiled GEMM's epilogue applies: its clip bounds
    (Relu, Clip) and its logistic ((alpha, times_x): Sigmoid, SiLU / QuickGelu), each None
    where it has none; and whether the epilogue takes all of it (no activation, or one of
    those), so that nothing is left to apply after the product."""
    bounds, logistic = getattr(act, "bounds", None), getattr(act, "logistic", None)
    return bounds, logistic, act is None or bounds is not None or logistic is not None


def _is_channels_last(X: np.ndarray) -> bool:
    """X (N, C, H, W) is a view of a C-contiguous (N, H, W, C) array."""
    return X.ndim == 4 and X.transpose(0, 2, 3, 1).flags.c_contiguous


def _gemm_1x1(X: np.ndarray, Wm: np.ndarray, WmT: np.ndarray | None,
              threads: int = 1) -> np.ndarray:
    """1x1 stride-1 convolution, (g, M/g, C/g) weights: one GEMM per group on the input
    itself, whatever its layout (BLAS takes transposed operands). With ``WmT`` (C, M) the
    output is written channels-last: pixels x channels = (pixels x C) @ WmT."""
    N, C = X.shape[:2]
    g, Mg = Wm.shape[:2]
    if WmT is not None and g == 1:
        if _is_channels_last(X):  # every pixel of every image: one GEMM on a view
            Y = blas.matmul(X.transpose(0, 2, 3, 1).reshape(-1, C), WmT, threads=threads)
        else:
            Y = blas.matmul(X.reshape(N, C, -1).transpose(0, 2, 1), WmT, threads=threads)
        return Y.reshape((N,) + X.shape[2:] + (Mg,)).transpose(0, 3, 1, 2)
    cols = X.reshape(N, g, C // g, -1)  # a view for NCHW and for NHWC memory
    return blas.matmul(Wm, cols, threads=threads).reshape((N, g * Mg) + X.shape[2:])


def _dense_method(C: int, M: int, kernel, strides, dilations, group: int, outs,
                  threads: int = 1, packed: bool = False) -> str:
    """Which kernel computes a non-depthwise convolution, by measurement on 2-D CNN layers:
    with the compiled float32 GEMM (``packed``), the implicit GEMM for every undilated
    convolution (Conv._conv_implicit: "nhwc" channels-last, "hcw" on an (H, C, W) buffer
    below 8 channels) bar Winograd's stride-1 layers of 128+ channels, channels-last im2col
    for small dilated ones ("nhwc"); Winograd
    where the GEMM dominates (many channels in and out, enough 2x2 tiles for the 16 GEMMs to
    be efficient, and with several BLAS threads only GEMMs large enough to share: the
    transforms run on one), per-tap GEMMs where im2col would copy more than the output it
    makes, im2col + GEMM otherwise (``outs`` None: sizes not known yet)."""
    if group != 1 and packed and len(kernel) == 2 and kernel != (1, 1) and \
            all(d == 1 for d in dilations) and M % group == 0 and C % group == 0 and \
            M // group >= _GROUPED_WIDTH and C // group >= _GROUPED_WIDTH:
        return "grouped"
    if group != 1 or len(kernel) != 2 or (kernel == (1, 1) and all(s == 1 for s in strides)):
        return "gemm"
    classic = _blas_method(C, M, kernel, strides, dilations, outs, threads)
    if packed and (outs is None or C * math.prod(kernel) * math.prod(outs) > _SMALL_CONV or
                   kernel == (1, 1)):
        # (smaller ones, at batch 1, take the gather path: one np.take, one GEMM; not a
        # strided 1x1, a residual stage's shortcut: NCHW there made every block of the
        # stage before it write NCHW, RegNetY-800MF's 14 x 14 stage)
        if all(d == 1 for d in dilations):
            if C < _NHWC_IMPLICIT_CHANNELS:  # stems: on an (H, C, W) buffer
                return "hcw"
            if any(s != 1 for s in strides) or classic != "winograd" or min(C, M) < 128:
                return "nhwc"
        elif C >= _NHWC_IM2COL_CHANNELS and outs is not None and \
                outs[0] * outs[1] <= _NHWC_IM2COL_PIXELS:
            return "nhwc"
    return classic


def _blas_method(C: int, M: int, kernel, strides, dilations, outs, threads: int) -> str:
    """_dense_method's choice among the NCHW methods on BLAS (and Winograd)."""
    if any(s != 1 for s in strides) or kernel == (1, 1):
        return "gemm"
    if kernel == (3, 3) and dilations == (1, 1) and C >= 64 and M >= 64:
        tiles = None if outs is None else -(-outs[0] // 2) * -(-outs[1] // 2)
        if threads == 1:
            if tiles is None or tiles >= _WINOGRAD_TILES or (tiles >= 32 and min(C, M) >= 512):
                return "winograd"
        elif tiles is not None and tiles * C * M >= _WINOGRAD_THREADED_MACS:
            return "winograd"
    if 2 * M <= C:
        return "shifted"
    return "gemm"


class _ConvBase:
    """Attributes common to Conv and ConvTranspose (the kernel shape is read from W)."""

    def __init__(self, ctx: KernelContext, *, auto_pad="NOTSET", dilations=None, group=1,
                 kernel_shape=None, pads=None, strides=None) -> None:
        self.auto_pad = text_attribute(auto_pad)
        self.dilations = None if dilations is None else tuple(int(v) for v in dilations)
        self.group = int(group)
        self.pads = tuple(int(v) for v in pads) if pads is not None and len(pads) else ()
        self.strides = None if strides is None else tuple(int(v) for v in strides)
        B = ctx.constant(2)
        self.bias = None if B is None else B.astype(compute_dtype(B.dtype), copy=False)

    def _attrs(self, nd: int, W_shape: tuple[int, ...]):
        kernel = tuple(W_shape[2:])
        strides = self.strides if self.strides else (1,) * nd
        dilations = self.dilations if self.dilations else (1,) * nd
        return kernel, strides, dilations


@op("Conv", 1, 11, 22)
class Conv(_ConvBase):
    """Depthwise 2-D convolutions have their own kernels (planar or channels-last, see
    _depthwise_planar and _depthwise_nhwc); 1x1 stride-1 ones are a single GEMM on the input
    itself; 3x3 stride-1 ones with many channels use Winograd F(2x2, 3x3); stride-1 ones with
    fewer output than input channels one GEMM per tap; the rest im2col + one GEMM per group
    (_dense_method chooses). A constant W is re-arranged into the layout its kernel reads once,
    here, as is the choice of the output's memory layout (channels_last_output). The bias
    (and, in FusedConv, Z and the activation) is applied on the way out of the kernel."""

    def __init__(self, ctx: KernelContext, *, auto_pad="NOTSET", dilations=None, group=1,
                 kernel_shape=None, pads=None, strides=None) -> None:
        super().__init__(ctx, auto_pad=auto_pad, dilations=dilations, group=group,
                         kernel_shape=kernel_shape, pads=pads, strides=strides)
        W = ctx.constant(1)
        self.W_shape = None
        self.winograd_packed = None  # Winograd's 16 GEMM operands in the compiled GEMM's panels
        self.gemm_t_packed = None  # "gemm_t" in the compiled GEMM's panels
        self.group_packed = None  # a grouped 1x1's (C/g, M/g) per group, in those panels
        self.nhwc_packed = None  # (kh * kw * C, M) in the compiled GEMM's panels (_conv_nhwc)
        self.hcw_packed = None  # (kh * C * kw, M) in them (_conv_implicit on (H, C, W))
        self.grouped_packed = None  # per group (kh * kw * C/g, M/g) in them (_conv_grouped)
        self.packable = False  # a constant float32 W, the compiled GEMM here
        self.w_depthwise = self.w_depthwise_2d = None
        self.w_depthwise_rows: dict[int, tuple] = {}  # output width -> _depthwise_row_weights
        self.prepared: dict[str, np.ndarray] = {}  # method -> its weight layout
        # (input shape, hcw, fused) -> the implicit GEMM's prepared product (_conv_implicit)
        self.launches: dict[tuple, object] = {}
        self.small_plans: dict[tuple, tuple] | None = None  # X's shape -> _small_conv's plan
        self.channels_last = False  # write the output channels-last (channels_last_output)
        # _small_conv_compiled may hand its (pixels, M) product on as a transposed view:
        # every reader is a convolution's input (the gather reads any strides)
        self.strided_out = _read_by_convolutions_only(getattr(ctx, "node", None))
        self.dw_compiled = None  # a compiled.depthwise.DepthwiseFloat, for a constant W
        # W itself, when it is kept only in the panels (nhwc_packed, gemm_t_packed): the session
        # then drops the original and calls with W None; a method that needs W after all
        # (sizes other than prepared) rebuilds it exactly from the panels (_weight)
        self.prepacked_inputs: tuple[int, ...] = ()
        self.threads = threads_for(ctx)  # intra-op threads, = BLAS threads; see _dense_method
        self.method_threads = self.threads  # what _dense_method assumes (method_threads)
        if W is None:
            return
        self.W_shape = W.shape
        self.auto_pad = unpadded_auto_pad(self.auto_pad, W.shape[2:])
        self.channels_last = W.ndim == 4 and layout_changes_allowed(ctx) and \
            channels_last_output(ctx.node, self.threads)
        cdt = compute_dtype(W.dtype)
        nd = W.ndim - 2
        if self._is_depthwise(W.shape):
            if nd == 2:
                self.w_depthwise_2d = _depthwise_weights_2d(W, *self._attrs(2, W.shape), cdt)
                self.dw_compiled = _compiled_depthwise(W, cdt, self.bias)
                self.dw_threads = self.threads  # rows on spin.py's workers, from a size
                return
            self.w_depthwise = self._depthwise_weights(W, cdt)
        outs = None
        shape = ctx.input_shape(0)
        kernel, strides, dilations = self._attrs(nd, W.shape)
        if shape is not None and len(shape) == nd + 2 and \
                all(isinstance(d, int) and d > 0 for d in shape[2:]):
            try:
                outs = window_geometry(tuple(shape[2:]), kernel, strides, dilations,
                                       self.pads, self.auto_pad)[2]
            except ValueError:
                outs = None
        self.method_threads = method_threads(self.threads, cdt)
        self.packable = W.ndim == 4 and _packable(cdt)
        method = _dense_method(W.shape[1] * self.group, W.shape[0], kernel, strides,
                               dilations, self.group, outs, self.method_threads, self.packable)
        if method == "nhwc":
            self.nhwc_packed = self._nhwc_weights(W)
            if self.nhwc_packed is not None and W.dtype == np.float32:
                self.prepacked_inputs = (1,)
            return
        if method == "hcw":
            self.hcw_packed = self._hcw_weights(W)
            return
        if method == "grouped":
            self.grouped_packed = self._grouped_weights(W)
            if self.grouped_packed is not None and W.dtype == np.float32:
                self.prepacked_inputs = (1,)
            return
        self.prepared[method] = self._weights(method, W, cdt)
        if method == "winograd" and cdt == np.float32:
            from ..compiled.float_gemm import pack_stack

            # the panels replace the numpy path's (16, C, M) operand: kept once
            self.winograd_packed = pack_stack(self.prepared[method])
            if self.winograd_packed is not None:
                del self.prepared[method]
        one_by_one = self.group == 1 and kernel == (1,) * nd
        # A 1x1 convolution whose input comes channels-last but whose output must be NCHW (a
        # detection head's last layers, before a Concat / Reshape to the outputs) takes the
        # compiled GEMM too, its channels-last product then copied out to NCHW: BLAS's
        # product of W and the transposed input ran at a third of the rate (YOLOv8n-style
        # 64 -> 64 at 40 x 40: 372 us, 35 GFLOP/s).
        nchw_out = not self.channels_last and one_by_one and nd == 2 and \
            W.dtype == np.float32 and self.packable and layout_changes_allowed(ctx) and \
            _reads_channels_last(ctx.node, self.threads, 0)
        # One pixel (an SE block's squeeze and excitation, after the global pool): either
        # layout is the same memory, so the compiled GEMM's one-row product, the bias and a
        # SiLU / Sigmoid in its epilogue, replaces BLAS's GEMV and numpy's epilogue passes
        # (2304 -> 96 with SiLU: 76 -> ~35 us, EfficientNet-B7 has 110 of them)
        one_pixel = one_by_one and nd == 2 and self.packable and W.dtype == np.float32 and \
            shape is not None and len(shape) == 4 and tuple(shape[2:]) == (1, 1)
        nchw_out = nchw_out or (one_pixel and not self.channels_last)
        if one_by_one and (self.channels_last or nchw_out):
            # (C, M): the channels-last GEMM's right operand; a view of W where the dtype
            # allows (BLAS takes a transposed operand as a flag; the panels are the copy)
            self.prepared["gemm_t"] = W.reshape(W.shape[:2]).T.astype(cdt, copy=False)
            if cdt == np.float32:  # and in the compiled GEMM's panels, bias and clip fused
                from ..compiled.float_gemm import pack

                self.gemm_t_packed = pack(self.prepared["gemm_t"])
                if self.gemm_t_packed is not None and W.dtype == np.float32 and \
                        (nchw_out or one_pixel or _reads_channels_last(ctx.node, self.threads, 0)):
                    # its input comes channels-last: the panels are all it reads (the NCHW
                    # operands, views of W, are rebuilt if an input comes otherwise)
                    self.prepacked_inputs = (1,)
                    self.prepared.clear()
        elif self.channels_last and kernel == (1,) * nd == (1, 1) and \
                _grouped_1x1_packable(cdt) and self.packable and \
                all(s == 1 for s in strides) and not any(self.pads) and \
                self.auto_pad in ("NOTSET", "VALID"):
            from ..compiled.float_gemm import pack_groups

            g = self.group  # (g, C/g, M/g): each group's weight transposed, one buffer
            self.group_packed = pack_groups(np.ascontiguousarray(
                W.reshape(g, W.shape[0] // g, W.shape[1]).transpose(0, 2, 1), np.float32))

    @property
    def streams_out(self) -> bool:
        """Whether the output is written once, in order, into any rows of pixels it is handed
        (memory.py: a range of a Concat's channels, written in place of the Concat's copy): a
        channels-last output of the compiled GEMM whose K is one block, so that no tile is
        read back. Strided rows cost the GEMM nothing then (Emerald Rapids, 1 thread: 3025 x
        144 x 64 into 128-channel rows 439 us against 584 contiguous and 812 with the copy;
        729 x 288 x 128 into 256: 431 / 410 / 423), where K blocks read back rows a Concat's
        width apart (3136 x 1152 x 32 into 256 channels: 1.5x, session 10)."""
        if not self.channels_last:
            return False
        if self.nhwc_packed is not None:  # the implicit GEMM's shifted product (dilated: im2col)
            return self.nhwc_packed.one_k_block(all(d == 1 for d in self.dilations or ()))
        if self.grouped_packed is not None:
            return self.grouped_packed[0].one_k_block(shifted=True)
        if self.gemm_t_packed is not None:
            return self.gemm_t_packed.one_k_block()
        if self.group_packed is not None:
            return self.group_packed.first.one_k_block()
        return False

    @property
    def uses_compiled_gemm(self) -> bool | None:
        """True: Winograd on the compiled GEMM; False: BLAS's GEMMs; None: no GEMM (the
        depthwise kernels). The session weighs these (BLAS's thread count)."""
        if self.winograd_packed is not None or self.gemm_t_packed is not None or \
                self.nhwc_packed is not None or self.group_packed is not None or \
                self.hcw_packed is not None or self.grouped_packed is not None:
            return True
        return None if self.w_depthwise_2d is not None or self.w_depthwise is not None \
            else False

    def _weight(self, W: np.ndarray | None) -> np.ndarray:
        """W, or, where the session released it (prepacked_inputs), W rebuilt exactly from
        the panels that hold it."""
        if W is not None:
            return W
        if self.nhwc_packed is not None:  # (kh * kw * C, M) -> (M, C, kh, kw)
            M, C, kh, kw = self.W_shape
            return np.ascontiguousarray(
                self.nhwc_packed.matrix().reshape(kh, kw, C, M).transpose(3, 2, 0, 1))
        if self.gemm_t_packed is not None:  # (C, M) -> (M, C, 1, ...)
            return np.ascontiguousarray(self.gemm_t_packed.matrix().T).reshape(self.W_shape)
        if self.grouped_packed is not None:  # per group (kh * kw * C/g, M/g) -> (M/g, ...)
            M, Cg, kh, kw = self.W_shape
            return np.ascontiguousarray(np.concatenate(
                [p.matrix().reshape(kh, kw, Cg, -1).transpose(3, 2, 0, 1)
                 for p in self.grouped_packed]))
        raise ValueError("Conv: the weight is missing")

    def _is_depthwise(self, W_shape) -> bool:
        return self.group > 1 and W_shape[0] == self.group and W_shape[1] == 1

    def _weights(self, method: str, W: np.ndarray, cdt: np.dtype) -> np.ndarray:
        if method == "winograd":
            return _winograd_weights(W, cdt)
        if method == "shifted":  # (K, M, C): one GEMM operand per tap
            K = math.prod(W.shape[2:])
            w = W.reshape(W.shape[:2] + (K,)).transpose(2, 0, 1)
            return np.ascontiguousarray(w, dtype=cdt)
        g = self.group
        return np.ascontiguousarray(W.reshape(g, W.shape[0] // g, -1), dtype=cdt)

    def _nhwc_weights(self, W: np.ndarray):
        """W (M, C, kh, kw) as the (kh * kw * C, M) right operand of channels-last im2col, in
        the compiled GEMM's panels."""
        from ..compiled.float_gemm import pack_rows

        # (kh, kw, C, M): the rows in that order, copied once, straight into the panels
        return pack_rows(W.transpose(2, 3, 1, 0).astype(np.float32, copy=False))

    def _hcw_weights(self, W: np.ndarray):
        """W (M, C, kh, kw) as the (kh * C * kw, M) right operand of the implicit GEMM on an
        (H, C, W) buffer (_conv_implicit with hcw), in the compiled GEMM's panels."""
        from ..compiled.float_gemm import pack_rows

        return pack_rows(W.transpose(2, 1, 3, 0).astype(np.float32, copy=False))

    def _grouped_weights(self, W: np.ndarray):
        """W (M, C/g, kh, kw) as each group's (kh * kw * C/g, M/g) right operand of the
        implicit GEMM on its channels of the input (_conv_grouped), in the compiled GEMM's
        panels, one buffer; None where the kernel does not run."""
        from ..compiled.float_gemm import pack_stack

        g = self.group
        M, Cg, kh, kw = W.shape
        stack = W.reshape(g, M // g, Cg, kh, kw).transpose(0, 3, 4, 2, 1)
        return pack_stack(np.ascontiguousarray(stack, np.float32).reshape(g, kh * kw * Cg,
                                                                           M // g))

    def _depthwise_weights(self, W: np.ndarray, cdt: np.dtype) -> np.ndarray:
        # (K, C, 1, ..., 1): one per-channel multiplier per kernel offset
        nd = W.ndim - 2
        K = int(np.prod(W.shape[2:]))
        w = W.reshape(W.shape[0], K).T.astype(cdt)
        return np.ascontiguousarray(w.reshape((K, W.shape[0]) + (1,) * nd))

    accepts_out = True  # the executor's buffer for the output (memory.py)

    def __call__(self, X, W, B=None, *, out=None):
        return self._forward(X, W, B, out=out)

    def _forward(self, X, W, B=None, Z=None, act=None, out=None):
        """act(Conv(X, W) + B + Z) in a fresh array of X's dtype (``act`` works in place),
        or in ``out`` where the method writes its output itself (channels-last ones)."""
        plan = self.small_plans.get(X.shape) if self.small_plans is not None else None
        if plan is not None and X.dtype == plan[0] and (B is None) == (plan[5] is None):
            return self._small_conv(plan, X, Z, act)
        nd = X.ndim - 2
        w_shape = self.W_shape if W is None else W.shape  # None: held in the panels (_weight)
        kernel, strides, dilations = self._attrs(nd, w_shape)
        if X.shape[1] != w_shape[1] * self.group:
            raise ValueError(
                f"input channels {X.shape[1]} != weight channels {w_shape[1]} * group "
                f"{self.group}"
            )
        heads, tails, outs = window_geometry(
            X.shape[2:], kernel, strides, dilations, self.pads, self.auto_pad
        )
        out_dtype = X.dtype
        cdt = compute_dtype(X.dtype)
        if X.dtype != cdt:
            X = X.astype(cdt)
        const_w = self.W_shape is not None
        N, M = X.shape[0], w_shape[0]
        b = None
        if B is not None:
            b = self.bias if self.bias is not None else B.astype(cdt, copy=False)
            b = b.reshape((M,) + (1,) * nd)
        if Z is not None and Z.dtype != cdt:
            Z = Z.astype(cdt)
        if X.size == 0 or 0 in w_shape or 0 in outs:
            # an empty batch, no input channels, or an empty output: no kernel has work (and
            # the compiled ones are never handed empty buffers); the sum over no taps is 0
            return _finish(np.zeros((N, M) + outs, cdt), None, b, Z, act, out_dtype)
        depthwise = self._is_depthwise(w_shape) and X.shape[1] == M
        if depthwise and nd == 2:
            Y = self._depthwise_2d(X, self._weight(W), b, Z, act, heads, outs, kernel, strides,
                                   dilations, cdt, out)
            return Y if Y.dtype == out_dtype else Y.astype(out_dtype)
        if depthwise:
            w = self.w_depthwise if const_w else self._depthwise_weights(self._weight(W), cdt)
            Xp = pad_spatial(X, heads, outs, kernel, strides, dilations, 0)
            Y = None
            tmp = None
            for i, (_, idx) in enumerate(window_slices(outs, kernel, strides, dilations)):
                if Y is None:
                    Y = np.multiply(Xp[idx], w[i])
                    tmp = np.empty_like(Y)
                else:
                    np.multiply(Xp[idx], w[i], out=tmp)
                    Y += tmp
            return _finish(Y, None, b, Z, act, out_dtype, self.threads)
        method = _dense_method(X.shape[1], M, kernel, strides, dilations, self.group, outs,
                               self.method_threads,
                               self.packable and const_w and X.dtype == np.float32)
        if method == "nhwc":
            if self.nhwc_packed is None:  # shapes not known when prepared: packed once, here
                self.nhwc_packed = self._nhwc_weights(self._weight(W))
            if self.nhwc_packed is not None:
                Y = self._conv_nhwc(X, b, Z, act, heads, outs, kernel, strides, dilations,
                                    out)
                return Y if Y.dtype == out_dtype else Y.astype(out_dtype)  # float16 models
            self.packable = False
            method = _dense_method(X.shape[1], M, kernel, strides, dilations, self.group, outs,
                                   self.method_threads)
        if method == "hcw":
            if self.hcw_packed is None:  # shapes not known when prepared: packed once, here
                self.hcw_packed = self._hcw_weights(self._weight(W))
            if self.hcw_packed is not None:
                Y = self._conv_implicit(X, b, Z, act, heads, outs, kernel, strides,
                                        self.hcw_packed, True, out)
                return Y if Y.dtype == out_dtype else Y.astype(out_dtype)  # float16 models
            self.packable = False
            method = _dense_method(X.shape[1], M, kernel, strides, dilations, self.group, outs,
                                   self.method_threads)
        if method == "grouped":
            if self.grouped_packed is None:  # shapes not known when prepared: packed once
                self.grouped_packed = self._grouped_weights(self._weight(W))
            if self.grouped_packed is not None:
                Y = self._conv_grouped(X, b, Z, act, heads, outs, kernel, strides, out)
                return Y if Y.dtype == out_dtype else Y.astype(out_dtype)  # float16 models
            self.packable = False
            method = _dense_method(X.shape[1], M, kernel, strides, dilations, self.group, outs,
                                   self.method_threads)
        g = self.group
        one_by_one = all(k == 1 for k in kernel) and not any(heads) and \
            all(s == 1 for s in strides) and outs == X.shape[2:]
        if one_by_one and method == "gemm" and self.gemm_t_packed is not None and \
                X.dtype == np.float32 and _is_channels_last(X):
            return self._gemm_1x1_compiled(X, b, Z, act, out)
        if one_by_one and method == "gemm" and self.group_packed is not None and \
                X.dtype == np.float32 and const_w:
            Y = self._grouped_1x1(X, b, Z, act, out)
            return Y if Y.dtype == out_dtype else Y.astype(out_dtype)  # float16 models
        packed = self.winograd_packed if method == "winograd" and X.dtype == np.float32 \
            else None
        Wm = self.prepared.get(method)
        if Wm is None and packed is None:
            W = self._weight(W)
            Wm = self._weights(method, W, cdt)
            if const_w:  # sizes that chose another method when prepared: once
                self.prepared[method] = Wm
                if one_by_one and self.gemm_t_packed is not None:  # released: its view too
                    self.prepared["gemm_t"] = W.reshape(W.shape[:2]).T
        if method == "winograd":
            Y = _winograd_3x3(X, Wm, b, heads, outs, self.threads, packed).transpose(0, 3, 1, 2)
            if Y.shape[2:] == outs and self.channels_last:
                return _finish(Y, None, None, Z, act, out_dtype, self.threads)
            return _finish(None, Y[..., :outs[0], :outs[1]], None, Z, act, out_dtype,
                           self.threads, out)
        if method == "shifted":
            src = _shifted_gemm(X, Wm, heads, outs, kernel, dilations, self.threads)
            return self._laid_out(_finish(None, src, b, Z, act, out_dtype, self.threads, out))
        if one_by_one:
            return _finish(_gemm_1x1(X, Wm, self.prepared.get("gemm_t"), self.threads), None,
                           b, Z, act, out_dtype, self.threads)
        if N == 1 and g == 1 and X.shape[1] * math.prod(kernel) * math.prod(outs) <= \
                _SMALL_CONV:
            # A small convolution (a streaming model's 1-D layers: a few frames): the columns
            # in one gather (cached indices, padding read from an appended zero), one GEMM, the
            # epilogue inline; the padded copy, window view and banded, threaded path cost far
            # more in Python than the arithmetic here.
            idx = _small_conv_columns(X.shape[2:], kernel, strides, dilations, heads, outs)
            C, S = X.shape[1], math.prod(X.shape[2:])
            # the bias over the whole output (numpy adds a short broadcast row slowly); a
            # pool of inputs with their zero column appended (none where nothing is padding)
            bias = None if b is None else np.ascontiguousarray(np.broadcast_to(b, (M,) + outs))
            padded = (idx == S).any()
            # all of the plan depends on X's shape only (kept per shape, below)
            cacheable = const_w and X.dtype == cdt and (B is None or self.bias is not None)
            plan = (X.dtype, idx, Wm[0], (C, S), (C * math.prod(kernel), math.prod(outs)), b,
                    (N, M) + outs, bias, [] if padded else None, blas.matmul_function(cdt),
                    self._small_product(Wm[0], b, act, Z is None, idx, C, S, padded, kernel,
                                        strides, dilations, cdt, cacheable))
            if cacheable:
                # later calls of this shape go straight to _small_conv (a streaming model's
                # 1-D layers: ~20 us a call)
                if self.small_plans is None:
                    self.small_plans = {}
                self.small_plans[X.shape] = plan
            Y = self._small_conv(plan, X, Z, act)
            return Y if Y.dtype == out_dtype else Y.astype(out_dtype)
        Xp = pad_spatial(X, heads, outs, kernel, strides, dilations, 0)
        # written channels-last (a stem before a pool): the NCHW product is an intermediate,
        # kept in scratch (a fresh 3 MB one paid ~1-2 ms of page faults per call)
        temp = self.channels_last and len(outs) == 2
        Y = _im2col_gemm(Wm, _im2col(Xp, kernel, outs, strides, dilations), g, self.threads,
                         scratch_out=temp)
        Y = _finish(Y.reshape((N, M) + outs), None, b, Z, act, out_dtype, self.threads)
        result = self._laid_out(Y, out)
        return result.copy() if temp and result is Y else result  # scratch never leaves

    def _small_conv(self, plan: tuple, X: np.ndarray, Z, act) -> np.ndarray:
        """A small convolution (batch 1, one group) from its per-shape ``plan`` (_forward):
        the columns in one gather (cached indices, padding read from an appended zero), one
        GEMM, the epilogue inline; the padded copy, window view and banded, threaded path cost
        far more in Python than the arithmetic here. X in the compute dtype."""
        _, idx, w, (C, S), cols_shape, b, y_shape, bias, padded, matmul, compiled = plan
        if compiled is not None and (Z is None or not compiled[2]):
            return self._small_conv_compiled(compiled, X, Z, act, padded, C, S, y_shape)
        if padded is None:
            cols = X.reshape(C, S).take(idx, axis=1)
        else:  # (C, K * P): (C, K) rows, as w's columns
            cols = _take_zero_padded(padded, X, C, S, idx, 1)
        Y = matmul(w, cols.reshape(cols_shape)).reshape(y_shape)
        if Z is None:
            if bias is not None:
                Y += bias
            if act is not None:
                act(Y)
            return self._laid_out(Y)
        Z = Z.astype(Y.dtype, copy=False)
        if Z.shape != Y.shape:
            Z = np.broadcast_to(Z, Y.shape)
        _epilogue(Y, None, b, Z, act)
        return self._laid_out(Y)

    def _small_product(self, w, b, act, zfree, idx, C, S, padded, kernel, strides, dilations,
                       cdt, cacheable):
        """The compiled GEMM's part of a small convolution's plan, or None where BLAS's
        product stays: (prepared product, gather indices or None, whether the Relu / Clip
        is in the epilogue).

        The product is taken transposed, (pixels, C * taps) @ the packed (C * taps, M), the
        bias and a Relu / Clip in its epilogue: at a few pixels OpenBLAS packs the whole
        weight at every call and ran at ~20 GFLOP/s (a streaming model's [258, 256] STFT
        @ 4 frames: 20 -> 10 us), and the columns come in one gather (or, one channel
        unpadded, as overlapping rows read in place). At one pixel BLAS's GEMV is faster
        alone (2 against 4 us) but not in a run (the next layer's gather reads this one's
        channels-last output: 13 -> 10 us a call in the VAD-style model)."""
        K, P = math.prod(kernel), idx.size // math.prod(kernel)
        if not (cacheable and cdt == np.float32 and P >= 1 and _packable(cdt)):
            return None
        from ..compiled import float_gemm

        if self.threads > 1 and w.size * P >= float_gemm.SPIN_MACS_PER_RANGE:
            return None  # large enough to split: BLAS's threads
        try:
            packed = float_gemm.pack(np.ascontiguousarray(w.T))
        except Exception:  # noqa: BLE001 - jit.Unavailable and the like: BLAS stays
            return None
        if packed is None:
            return None
        lda = None
        if C == 1 and not padded and len(kernel) == 1 and dilations == (1,):
            lda = strides[0]  # the windows are overlapping rows of the input itself
        # a Relu / Clip clipped in the epilogue, unless Z is added before it
        bounds = getattr(act, "bounds", None) if zfree else None
        prod = packed.prepared(P, None if b is None else b.reshape(-1), bounds, lda=lda)
        if prod is None:
            return None
        tidx = None
        if lda is None:  # (P, C * K): pixel p's column c * K + k, from the flat input
            width = S + 1 if padded else S
            tidx = (np.arange(C, dtype=np.intp)[None, :, None] * width +
                    idx.reshape(K, P).T[:, None, :]).reshape(P, C * K)
        return prod, tidx, bounds is not None

    def _small_conv_compiled(self, compiled, X, Z, act, padded, C, S, y_shape):
        """_small_conv on the compiled GEMM (_small_product): its output (pixels, M),
        returned as the NCHW-shaped view of that channels-last memory."""
        prod, tidx, clipped = compiled
        if tidx is None:  # one channel, its windows read in place
            if not X.flags.c_contiguous:
                X = np.ascontiguousarray(X)
            Yt = prod(X)
        elif padded is None:
            Yt = prod(X.reshape(-1).take(tidx))
        else:
            Yt = prod(_take_zero_padded(padded, X, C, S, tidx, None))
        if Z is not None:
            Z = Z.astype(Yt.dtype, copy=False)
            Yt += np.broadcast_to(Z, y_shape).reshape(y_shape[1], -1).T
        if act is not None and not clipped:
            act(Yt)  # element-wise: the layout does not matter
        if not self.strided_out:  # NCHW for any other reader (a graph output, a kernel)
            return np.ascontiguousarray(Yt.T).reshape(y_shape)
        return self._laid_out(Yt.T.reshape(y_shape))

    def _laid_out(self, Y: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """The NCHW result of an im2col / per-tap / gather convolution, copied channels-last
        (into ``out`` when it is so laid out) where it was chosen so (channels_last_output)."""
        if self.channels_last and Y.ndim == 4 and not _is_channels_last(Y):
            N, C, H, W = Y.shape
            Yt = nhwc_out(out, (N, H, W, C), Y.dtype)
            np.copyto(Yt, Y.transpose(0, 2, 3, 1))
            return Yt.transpose(0, 3, 1, 2)
        return Y

    def _conv_nhwc(self, X, b, Z, act, heads, outs, kernel, strides, dilations, out=None):
        """Channels-last im2col on the compiled GEMM: the input copied once into a zero-padded
        NHWC scratch buffer, one GEMM (pixels x taps*C) @ the packed weight with the bias and
        a Relu / Clip fused; the output channels-last (copied out to NCHW unless it stays so:
        channels_last_output). Undilated: the implicit GEMM (_conv_implicit); dilated, each
        tap's strided window is copied into a column matrix as runs of C floats."""
        N, C = X.shape[:2]
        (kh, kw), (Ho, Wo), (sh, sw), (dh, dw) = kernel, outs, strides, dilations
        Hp, Wp = (Ho - 1) * sh + (kh - 1) * dh + 1, (Wo - 1) * sw + (kw - 1) * dw + 1
        pk = self.nhwc_packed
        bounds, logistic, whole = _gemm_epilogue(act)
        fused = whole and Z is None
        if dilations == (1, 1):
            return self._conv_implicit(X, b, Z, act, heads, outs, kernel, strides, pk, False,
                                       out)
        if not any(heads) and Hp <= X.shape[2] and Wp <= X.shape[3] and _is_channels_last(X):
            P = X.transpose(0, 2, 3, 1)
        else:
            P = scratch("conv_nhwc_pad", (N, Hp, Wp, C), np.float32)
            _pad_into(P.transpose(0, 3, 1, 2), X, heads)
        cols = scratch("conv_nhwc_cols", (N, Ho, Wo, kh, kw, C), np.float32)
        for i in range(kh):
            for j in range(kw):
                np.copyto(cols[:, :, :, i, j], P[:, i * dh:i * dh + (Ho - 1) * sh + 1:sh,
                                                 j * dw:j * dw + (Wo - 1) * sw + 1:sw])
        Y = pk.run(cols.reshape(N * Ho * Wo, kh * kw * C), None if b is None else b.reshape(-1),
                   bounds=bounds if fused else None, threads=self.threads,
                   out=nhwc_out(out, (N, Ho, Wo, pk.N), np.float32, True).reshape(-1, pk.N),
                   logistic=logistic if fused else None)
        Y = Y.reshape(N, Ho, Wo, pk.N).transpose(0, 3, 1, 2)
        if Z is not None:
            Y += Z
        if act is not None and not fused:
            act(Y)
        return Y if self.channels_last else np.ascontiguousarray(Y)

    def _padded_nhwc(self, X: np.ndarray, heads, Hp: int, Wp: int) -> np.ndarray:
        """X (N, C, H, W, any strides) zero-padded into an (N, Hp, Wp, C) buffer for the
        implicit GEMM. A small one is this kernel's own (per thread): its zero borders are
        written once, each call copies only X (YOLO-style 20 x 20 x 64: the four border
        stores and the row split cost 5 us of a 8.6 us pad); a large one is the thread's
        shared scratch, padded at every call (its copy may split over the threads)."""
        N, C = X.shape[:2]
        h0, w0 = heads
        if N * Hp * Wp * C * 4 > _OWN_PAD_BYTES or min(heads) < 0:
            P = scratch("conv_nhwc_pad", (N, Hp, Wp, C), np.float32)
            _pad_into_rows(P.transpose(0, 3, 1, 2), X, heads, self.threads)
            return P
        pads = self.__dict__.get("_pads")
        if pads is None:
            pads = self._pads = threading.local()
        key = (X.shape, h0, w0, Hp, Wp)
        kept = getattr(pads, "kept", None)
        if kept is None or kept[0] != key:
            kept = pads.kept = (key, np.zeros((N, Hp, Wp, C), np.float32))
        P = kept[1]
        h, w = max(0, min(X.shape[2], Hp - h0)), max(0, min(X.shape[3], Wp - w0))
        np.copyto(P[:, h0:h0 + h, w0:w0 + w], X[:, :, :h, :w].transpose(0, 2, 3, 1))
        return P

    def _conv_implicit(self, X, b, Z, act, heads, outs, kernel, strides, pk, hcw: bool,
                       out=None):
        """An undilated convolution as an implicit GEMM on the compiled kernel: the input
        copied once into a zero-padded scratch buffer, the GEMM's row of A for output pixel
        (oh, ow) read in place from (oh * sh, ow * sw) on (rows of ``Wo`` pixels: run_shifted's
        wrap), a K block a row of taps; the bias and a Relu / Clip fused, the output written
        once, channels-last (copied out to NCHW unless it stays so). The buffer is NHWC (a
        row of taps kw * C floats), or with ``hcw`` (H, C, W) (a row of taps kw floats per
        channel, Wp apart: few-channel stems, whose NCHW input copies into it by rows, where
        a channels-last copy moved 3 floats at a time: 254 against 27 us at 224 x 224)."""
        N, C = X.shape[:2]
        (kh, kw), (Ho, Wo), (sh, sw) = kernel, outs, strides
        Hp, Wp = (Ho - 1) * sh + kh, (Wo - 1) * sw + kw
        if hcw:  # K in (kh, C, kw) order: _hcw_weights
            P = scratch("conv_nhwc_pad", (N, Hp, C, Wp), np.float32)
            _pad_into_rows(P.transpose(0, 2, 1, 3), X, heads, self.threads)
            lda, block, jump, wstep = sw, kw, Wp - kw, sh * C * Wp
        else:  # K in (kh, kw, C) order: _nhwc_weights
            P = self._padded_nhwc(X, heads, Hp, Wp)
            lda, block, jump, wstep = sw * C, kw * C, (Wp - kw) * C, sh * Wp * C
        return self._shifted_run(
            P, X, b, Z, act, outs, pk.N, ("implicit", hcw),
            lambda bias, bounds, logistic: pk.prepared_shifted(
                Ho * Wo, lda, block, jump, bias, bounds, self.threads, Wo, wstep, logistic),
            out)

    def _launch_for(self, key: tuple, make):
        """The prepared product kept under ``key`` (a kind and an input shape), made by
        ``make()`` the first time (None too: a product with no prepared form), at most
        _LAUNCHES kept."""
        launch = self.launches.get(key, _UNMADE)
        if launch is _UNMADE:
            launch = make()
            if len(self.launches) >= _LAUNCHES:
                self.launches.clear()
            self.launches[key] = launch
        return launch

    def _shifted_run(self, P, X, b, Z, act, outs, M, kind, make, out=None):
        """The implicit GEMMs' run (_conv_implicit, _conv_grouped) on the padded copy ``P``
        of X: the product's argument blocks, ``make(bias, bounds, logistic)``, made once per
        input shape (the geometry follows from it) where the bias is the kernel's own
        constant (or none), so that each call writes two addresses; one call per image into
        the channels-last output of ``M`` channels, the bias and a Relu / Clip / SiLU fused;
        the output copied out to NCHW unless it stays so."""
        N = X.shape[0]
        Ho, Wo = outs
        bounds, logistic, whole = _gemm_epilogue(act)
        fused = whole and Z is None
        Y = nhwc_out(out, (N, Ho, Wo, M), np.float32, True).reshape(N, Ho * Wo, M)
        def made():
            return make(None if b is None else b.reshape(-1), bounds if fused else None,
                        logistic if fused else None)

        const_bias = b is None or self.bias is not None
        launch = self._launch_for((kind, X.shape, fused), made) if const_bias else made()
        flat = P.reshape(N, -1)
        for n in range(N):
            launch(flat[n], Y[n])
        Y = Y.reshape(N, Ho, Wo, M).transpose(0, 3, 1, 2)
        if Z is not None:
            Y += Z
        if act is not None and not fused:
            act(Y)
        return Y if self.channels_last else np.ascontiguousarray(Y)

    def _conv_grouped(self, X, b, Z, act, heads, outs, kernel, strides, out=None):
        """A grouped convolution (undilated, C/g and M/g channels per group) as one implicit
        GEMM per group on the compiled kernel (_conv_implicit's, group by group): the input
        copied once into a zero-padded group-major scratch buffer (N, g, Hp, Wp, C/g), so
        that each group's rows of taps are contiguous; group i writes its M/g columns of
        the channels-last output; the bias and a Relu / Clip / SiLU fused. Every group's
        ranges go to the threads in one hand-out."""
        from ..compiled.float_gemm import grouped_shifted

        N, C = X.shape[:2]
        g = self.group
        Cg = C // g
        (kh, kw), (Ho, Wo), (sh, sw) = kernel, outs, strides
        Hp, Wp = (Ho - 1) * sh + kh, (Wo - 1) * sw + kw
        packs = self.grouped_packed
        P = _pad_into(scratch("conv_grouped_pad", (N, g, Hp, Wp, Cg), np.float32),
                      X.reshape(N, g, Cg, *X.shape[2:]).transpose(0, 1, 3, 4, 2), heads)
        return self._shifted_run(
            P, X, b, Z, act, outs, g * packs[0].N, ("grouped",),
            lambda bias, bounds, logistic: grouped_shifted(
                packs, Ho * Wo, sw * Cg, kw * Cg, (Wp - kw) * Cg, Hp * Wp * Cg, bias, bounds,
                self.threads, Wo, sh * Wp * Cg, logistic),
            out)

    def _gemm_1x1_compiled(self, X, b, Z, act, out=None):
        """A 1x1 convolution of a channels-last X on the compiled GEMM: pixels x channels in,
        the output channels-last, the bias, a channels-last Z and a Relu / Clip in its
        epilogue."""
        N, C = X.shape[:2]
        M = self.gemm_t_packed.N
        bounds, logistic, whole = _gemm_epilogue(act)
        residual = _residual_rows(Z, (N, M) + X.shape[2:])
        fused = whole and (Z is None or residual is not None)
        A = X.transpose(0, 2, 3, 1).reshape(-1, C)  # a view
        Yo = nhwc_out(out, (N,) + X.shape[2:] + (M,), np.float32, True).reshape(-1, M)
        prod = None
        if residual is None and (b is None or self.bias is not None) and A.flags.c_contiguous:
            # its argument block made once per shape where one thread takes the product (a
            # squeeze-and-excitation block's one pixel: run's checks and block were ~3x its
            # 768 x 192 product, 58 -> 20 us)
            prod = self._launch_for(
                ("1x1", A.shape[0], fused),
                lambda: self.gemm_t_packed.prepared(
                    A.shape[0], None if b is None else b.reshape(M), bounds if fused else None,
                    self.threads, logistic=logistic if fused else None))
        if prod is not None:
            Y = prod(A, Yo)
        else:
            Y = self.gemm_t_packed.run(A, None if b is None else b.reshape(M),
                                       residual=residual if fused else None,
                                       bounds=bounds if fused else None, threads=self.threads,
                                       out=Yo, logistic=logistic if fused else None)
        Y = Y.reshape((N,) + X.shape[2:] + (M,)).transpose(0, 3, 1, 2)
        if not fused:
            Y = _finish(Y, None, None, Z, act, np.float32, self.threads)
        if self.channels_last or Y.flags.c_contiguous:  # (one pixel: NCHW memory too)
            return Y
        # an NCHW output (Conv.__init__'s nchw_out): the channels-last product copied out
        return _finish(None, Y, None, None, None, np.float32, self.threads, out)

    def _grouped_1x1(self, X, b, Z, act, out=None):
        """A grouped 1x1 convolution on the compiled GEMM, channels-last: group i's pixels x
        C/g channels (read in place, rows C floats apart) @ its packed weight, written into
        its range of the output's channels (``out``'s, the executor's buffer, where it is
        laid out so), every group in one call (ShuffleNet's layers, where BLAS ran a GEMM
        per group on NCHW planes); the bias, a channels-last Z and a Relu / Clip in the
        epilogue."""
        N, C = X.shape[:2]
        pk = self.group_packed
        M = pk.g * pk.N
        bounds, logistic, whole = _gemm_epilogue(act)
        residual = _residual_rows(Z, (N, M) + X.shape[2:])
        fused = whole and (Z is None or residual is not None)
        Y = pk.run(X.transpose(0, 2, 3, 1).reshape(-1, C),  # a view when X comes channels-last
                   None if b is None else b.reshape(M), bounds=bounds if fused else None,
                   residual=residual if fused else None, threads=self.threads,
                   out=nhwc_out(out, (N,) + X.shape[2:] + (M,), np.float32,
                                True).reshape(-1, M),
                   logistic=logistic if fused else None)
        Y = Y.reshape((N,) + X.shape[2:] + (M,)).transpose(0, 3, 1, 2)
        return Y if fused else _finish(Y, None, None, Z, act, np.float32, self.threads)

    def _depthwise_2d(self, X, W, b, Z, act, heads, outs, kernel, strides, dilations, cdt,
                      out=None):
        """The depthwise kernels, bias, Z and activation applied on the way out."""
        if self.dw_compiled is not None and X.dtype == np.float32:
            return self._depthwise_compiled(X, b, Z, act, heads, outs, kernel, strides,
                                            dilations, out)
        wgroups, w_hwc = self.w_depthwise_2d if self.w_depthwise_2d is not None else \
            _depthwise_weights_2d(W, kernel, strides, dilations, cdt)
        N, C = X.shape[:2]
        if C >= _NHWC_CHANNELS:
            w_rows = self.w_depthwise_rows.get(outs[1]) if self.w_depthwise_2d is not None \
                else None
            if w_rows is None:
                w_rows = _depthwise_row_weights(w_hwc, outs[1], strides, dilations)
                if self.w_depthwise_2d is not None:
                    self.w_depthwise_rows[outs[1]] = w_rows
            # the result in channels-last memory, or copied out of scratch into NCHW
            Y = np.empty((N,) + outs + (C,), cdt).transpose(0, 3, 1, 2) if self.channels_last \
                else np.empty((N, C) + outs, cdt)
            if Z is not None and Z.shape != Y.shape:
                Z = np.broadcast_to(Z, Y.shape)

            def finish(h0: int, h1: int, rows: np.ndarray) -> None:
                for n in range(N):  # one image at a time: a contiguous block channels-last
                    part = (slice(n, n + 1), slice(None), slice(h0, h1))
                    _epilogue(Y[part], None if self.channels_last else
                              rows[n:n + 1].transpose(0, 3, 1, 2), b,
                              None if Z is None else Z[part], act)

            _depthwise_nhwc(X, w_rows, heads, outs, kernel, strides, dilations, self.threads,
                            Y.transpose(0, 2, 3, 1) if self.channels_last else None, finish)
            return Y
        src = _depthwise_planar(X, wgroups, heads, outs, kernel, strides, dilations)[
            ..., :outs[1]]
        if b is not None:  # on the scratch accumulator, which is then copied out once
            add_channel_bias(src, b)
        return _finish(None, src, None, Z, act, cdt, self.threads)


    def _depthwise_compiled(self, X, b, Z, act, heads, outs, kernel, strides, dilations,
                            out=None):
        """The compiled channels-last kernel: bias, a Relu / Clip and a Sigmoid / SiLU in its
        epilogue, Z and other activations after it; the output channels-last (into ``out``
        where it is so laid out) or copied out to NCHW."""
        bounds, logistic, whole = _gemm_epilogue(act)
        fused = whole and Z is None
        Xt = np.ascontiguousarray(X.transpose(0, 2, 3, 1))  # free when X came channels-last
        N, C = X.shape[:2]
        # the constant bias is the kernel's own (padded once); one known only now is passed
        bias = None if b is None or self.bias is not None else b.reshape(-1)
        Y = self.dw_compiled.run(Xt, heads, outs, strides, dilations, bias,
                                 bounds if fused and bounds is not None else (-np.inf, np.inf),
                                 out=nhwc_out(out, (N,) + tuple(outs) + (C,), np.float32)
                                 if self.channels_last else None,
                                 threads=self.dw_threads,
                                 logistic=logistic if fused else None).transpose(0, 3, 1, 2)
        if Z is not None:
            Y += Z
        if act is not None and not fused:
            act(Y)
        return Y if self.channels_last else np.ascontiguousarray(Y)


def _compiled_depthwise(W: np.ndarray, cdt: np.dtype, bias: np.ndarray | None = None):
    """The compiled float32 depthwise kernel for a constant (C, 1, kh, kw) weight and bias (or
    None), or None where it cannot run (not float32, no llvmlite, a CPU below AVX2+FMA, a
    window over 7x7)."""
    if cdt != np.float32:
        return None
    from ..compiled import depthwise
    from ..compiled.jit import Unavailable

    try:
        return depthwise.DepthwiseFloat(W, bias)
    except (Unavailable, ValueError):
        return None


@op("ConvTranspose", 1, 11, 22)
class ConvTranspose(_ConvBase):
    """One GEMM per group gives every (output channel, kernel tap) contribution of every input
    position; col2im then adds them into the output, one strided block per kernel tap."""

    def __init__(self, ctx: KernelContext, *, auto_pad="NOTSET", dilations=None, group=1,
                 kernel_shape=None, output_padding=None, output_shape=None, pads=None,
                 strides=None) -> None:
        super().__init__(ctx, auto_pad=auto_pad, dilations=dilations, group=group,
                         kernel_shape=kernel_shape, pads=pads, strides=strides)
        self.output_padding = (
            tuple(int(v) for v in output_padding) if output_padding is not None else ()
        )
        self.output_shape = tuple(int(v) for v in output_shape) if output_shape is not None \
            else ()
        W = ctx.constant(1)
        self.w_gemm = None if W is None else self._gemm_weights(W, compute_dtype(W.dtype))
        self.threads = threads_for(ctx)
        # The tiled path (tiled_transpose): (1, kh, C, kw * M), tap row a's weights with the
        # columns of a pixel's output row (kw taps x M channels) in the output's order
        self.tiles = None
        self.tile_kw = 1
        self.channels_last = False  # its output stays channels-last (every reader takes it)
        node = getattr(ctx, "node", None)
        if W is not None and node is not None and tiled_transpose(node):
            C, M, kh, kw = W.shape
            self.tiles = np.ascontiguousarray(W.transpose(2, 0, 3, 1).reshape(1, kh, C, kw * M))
            self.tile_kw = kw
            self.channels_last = layout_changes_allowed(ctx) and \
                _channels_last_readers(node.outputs[0], self.threads) is not None

    accepts_out = True  # the executor's buffer for the output (memory.py): the tiled path's

    def _tiled(self, X: np.ndarray, B, out: np.ndarray | None) -> np.ndarray | None:
        """The tiled path: input pixel (i, j) writes output pixels (i*kh + a, j*kw + b), so
        for each input row i and tap row a the output row i*kh + a is one product, (W, C) @
        (C, kw * M), written in place channels-last: N * H * kh products of a stack
        (compiled/batched_gemm: OpenBLAS's sgemm from compiled code, split over the intra-op
        threads), then the bias. Each output element is one dot product of C terms, as the
        GEMM + col2im path sums it (the same terms; their order may differ in the last bit).
        Writes NCHW (a copy) unless every reader takes channels-last. None where the stack
        does not run (no cblas_sgemm)."""
        from ..compiled import batched_gemm

        N, C, H, Wd = X.shape
        _, kh, _, width = self.tiles.shape
        kw = self.tile_kw
        M = width // kw
        shape = (N, H * kh, Wd * kw, M)
        # the executor's buffer where it is laid out channels-last (as it is for one channel);
        # a product to be copied out to NCHW goes to scratch (a fresh one paid page faults)
        Yc = nhwc_out(out, shape, np.float32) if self.channels_last or M == 1 else \
            scratch("conv_transpose_tiles", shape, np.float32)
        # (N, H, 1, W, C): each input row's pixels, a view of X in either layout
        Y = batched_gemm.matmul(X.transpose(0, 2, 3, 1)[:, :, None], self.tiles,
                                Yc.reshape(N, H, kh, Wd, width), threads=self.threads)
        if Y is None:
            return None
        if B is not None:  # (float32: checked by the caller)
            rows = Yc.reshape(-1, M)
            np.add(rows, B if self.bias is None else self.bias, out=rows)
        Y = Yc.transpose(0, 3, 1, 2)
        if self.channels_last or Y.flags.c_contiguous:  # (one channel: the same memory)
            return Y
        return _finish(None, Y, None, None, None, np.float32, self.threads, out)  # to NCHW

    def _gemm_weights(self, W: np.ndarray, cdt: np.dtype) -> np.ndarray:
        # (C, M/g, *k) -> (g, M/g * K, C/g): cols = W^T @ X for each group
        g = self.group
        Cg = W.shape[0] // g
        w = W.reshape(g, Cg, -1).transpose(0, 2, 1)
        return np.ascontiguousarray(w, dtype=cdt)

    def _geometry(self, in_shape, kernel, strides, dilations):
        return transpose_geometry(in_shape, kernel, strides, dilations, self.pads,
                                  self.output_padding, self.output_shape, self.auto_pad)

    def __call__(self, X, W, B=None, *, out=None):
        if self.tiles is not None and X.dtype == np.float32 and X.ndim == 4 and \
                X.shape[1] == self.tiles.shape[2] and X.size and \
                (B is None or B.dtype == np.float32):
            Y = self._tiled(X, B, out)
            if Y is not None:
                return Y
        nd = X.ndim - 2
        kernel, strides, dilations = self._attrs(nd, W.shape)
        g = self.group
        N, C = X.shape[:2]
        if C != W.shape[0]:
            raise ValueError(f"input channels {C} != weight input channels {W.shape[0]}")
        M = W.shape[1] * g
        in_shape = X.shape[2:]
        heads, outs = self._geometry(in_shape, kernel, strides, dilations)
        out_dtype = X.dtype
        cdt = compute_dtype(X.dtype)
        if X.size == 0 or W.size == 0:  # an empty batch or no channels: only the bias
            Y = np.zeros((N, M) + tuple(outs), cdt)
            if B is not None:
                Y += B.astype(cdt, copy=False).reshape((M,) + (1,) * nd)
            return Y if Y.dtype == out_dtype else Y.astype(out_dtype)
        Wm = self.w_gemm if self.w_gemm is not None else self._gemm_weights(W, cdt)
        cols = blas.matmul(Wm, X.astype(cdt, copy=False).reshape(N, g, C // g, -1))
        cols = cols.reshape((N, M) + tuple(kernel) + tuple(in_shape))
        # col2im: each kernel tap adds a strided block of the (uncropped) output
        full = tuple(
            max((n - 1) * s + (k - 1) * d + 1, h + o)
            for n, s, k, d, h, o in zip(in_shape, strides, kernel, dilations, heads, outs,
                                        strict=True)
        )
        Yf = np.zeros((N, M) + full, dtype=cdt)
        for offset, idx in window_slices(in_shape, kernel, strides, dilations):
            Yf[idx] += cols[(slice(None), slice(None)) + offset]
        Y = Yf[(Ellipsis,) + tuple(slice(h, h + o) for h, o in zip(heads, outs, strict=True))]
        if B is not None:
            b = self.bias if self.bias is not None else B.astype(cdt, copy=False)
            b = b.reshape((M,) + (1,) * nd)
            if Y.shape == Yf.shape:
                Y += b
            else:
                Y = Y + b
        elif Y.shape != Yf.shape:
            Y = np.ascontiguousarray(Y)
        return Y if Y.dtype == out_dtype else Y.astype(out_dtype)
