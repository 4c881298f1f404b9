"""Convolutions: Conv (im2col + one GEMM per group) and ConvTranspose (GEMM + col2im).

Also holds the window geometry (pads, output sizes, strided window offsets) shared with the
pooling kernels in ``pool.py``.
"""

from __future__ import annotations

import functools
import itertools
import math
import threading

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ....dtypes import BFLOAT16
from ..kernels import KernelContext, op

_LOW_PRECISION = (np.dtype(np.float16), BFLOAT16)


def compute_dtype(dtype: np.dtype) -> np.dtype:
    """float16/bfloat16 have no BLAS: compute those in float32 and cast the result back."""
    return np.dtype(np.float32) if dtype in _LOW_PRECISION else dtype


@functools.lru_cache(maxsize=1024)
def window_geometry(
    in_shape: tuple[int, ...],
    kernel: tuple[int, ...],
    strides: tuple[int, ...],
    dilations: tuple[int, ...],
    pads: tuple[int, ...],
    auto_pad: str,
    ceil_mode: int = 0,
    dilated_same: bool = True,
) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """(pads at the start, pads at the end, output sizes) of a sliding-window operator.

    SAME_* pads make the output ceil(in / stride) long (the odd pad goes to the end for
    SAME_UPPER, to the start for SAME_LOWER); with ceil_mode the last window must still start
    inside the input or the start padding. ``dilated_same=False`` sizes SAME padding with the
    undilated kernel, as onnxruntime's pooling kernels do.
    """
    nd = len(in_shape)
    heads, tails, outs = [], [], []
    for i in range(nd):
        n, k, s, d = in_shape[i], kernel[i], strides[i], dilations[i]
        span = (k - 1) * d + 1
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            target = -(-n // s)
            total = max(0, (target - 1) * s + (span if dilated_same else k) - n)
            head = total // 2 if auto_pad == "SAME_UPPER" else total - total // 2
            tail = total - head
        elif auto_pad == "VALID":
            head = tail = 0
        else:
            head, tail = (pads[i], pads[i + nd]) if pads else (0, 0)
        room = n + head + tail - span
        if ceil_mode:
            out = -(-room // s) + 1
            if (out - 1) * s >= n + head:
                out -= 1
        else:
            out = room // s + 1
        if out <= 0:
            raise ValueError(
                f"window of size {span} does not fit in input dimension {n} with pads "
                f"({head}, {tail})"
            )
        heads.append(head)
        tails.append(tail)
        outs.append(out)
    return tuple(heads), tuple(tails), tuple(outs)


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


def _im2col_gemm(Wm: np.ndarray, view: np.ndarray, g: int) -> np.ndarray:
    """(N, g, M/g, *outs) = Wm @ im2col, the column matrix built a band of output rows at a time.

    ``view`` is the strided (N, C, *kernel, *outs) window view. Copying it band by band keeps
    the copy in cache and never materializes the whole (C*K, O) matrix of a large image; each
    band is one 2-D GEMM written straight into the output.
    """
    N, C = view.shape[:2]
    nd = (view.ndim - 2) // 2
    outs = view.shape[2 + nd:]
    K = int(np.prod(view.shape[2:2 + nd]))
    Cg = C // g
    rest = int(np.prod(outs[1:]))
    Mg = Wm.shape[1]
    Y = np.empty((N, g, Mg) + tuple(outs), dtype=Wm.dtype)
    rows = max(1, min(outs[0], _TILE // max(1, Cg * K * rest)))
    for n in range(N):
        for gi in range(g):
            src = view[n, gi * Cg:(gi + 1) * Cg]
            dst = Y[n, gi]
            for r in range(0, outs[0], rows):
                h = min(rows, outs[0] - r)
                band = (Ellipsis, slice(r, r + h)) + (slice(None),) * (nd - 1)
                cols = src[band].reshape(Cg * K, h * rest)
                np.matmul(Wm[gi], cols, out=dst[:, r:r + h].reshape(Mg, h * rest))  # a view
    return Y


# -- depthwise ----------------------------------------------------------------------------------


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


# Below this many output pixels per channel the channels-last kernel is faster: its inner loop
# runs over the channels, the planar one's over the (short) rows of the image.
_NHWC_PIXELS = 400

_scratch = threading.local()
_SCRATCH_MAX = 1 << 26  # bytes; larger temporaries are allocated per call


def scratch(slot: str, shape: tuple[int, ...], dtype) -> np.ndarray:
    """A temporary of this thread, contents undefined, reused from call to call.

    Large fresh arrays cost page faults every run (the allocator hands freed blocks back to
    the system); a kernel's temporaries die when it returns, so one buffer per slot and thread
    serves every node. A kernel must not hold two arrays of one slot, nor return one."""
    dtype = np.dtype(dtype)
    n = math.prod(shape) * dtype.itemsize
    if n > _SCRATCH_MAX:
        return np.empty(shape, dtype)
    pool = _scratch.__dict__
    buf = pool.get(slot)
    if buf is None or buf.nbytes < n:
        buf = pool[slot] = np.empty(max(n, 1 << 16), np.uint8)
    return buf[:n].view(dtype).reshape(shape)


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


def _depthwise_nhwc(X, w_hwc, heads, outs, kernel, strides, dilations) -> np.ndarray:
    """Depthwise 2-D convolution through a channels-last copy: one einsum over all taps, its
    inner loop along the channels. Returns (N, Ho, Wo, C) (a scratch array)."""
    N, C, H, Wd = X.shape
    need = [(o - 1) * s + (k - 1) * d + 1
            for o, s, k, d in zip(outs, strides, kernel, dilations, strict=True)]
    Xp = scratch("conv_in", (N, need[0], need[1], C), X.dtype)
    h0, w0 = heads
    h, w = max(0, min(H, need[0] - h0)), max(0, min(Wd, need[1] - w0))
    Xp[:, :h0] = 0
    Xp[:, h0 + h:] = 0
    Xp[:, h0:h0 + h, :w0] = 0
    Xp[:, h0:h0 + h, w0 + w:] = 0
    Xp[:, h0:h0 + h, w0:w0 + w] = X[:, :, :h, :w].transpose(0, 2, 3, 1)
    sN, sH, sW, sC = Xp.strides
    view = as_strided(
        Xp, (N, outs[0], outs[1], kernel[0], kernel[1], C),
        (sN, sH * strides[0], sW * strides[1], sH * dilations[0], sW * dilations[1], sC),
        writeable=False)
    Y = scratch("conv_acc", (N, outs[0], outs[1], C), X.dtype)
    return np.einsum("nhwijc,ijc->nhwc", view, w_hwc, out=Y)


class _ConvBase:
    """Attributes common to Conv and ConvTranspose (the kernel shape is read from W)."""

    def __init__(self, ctx: KernelContext, *, auto_pad="NOTSET", dilations=None, group=1,
                 kernel_shape=None, pads=None, strides=None) -> None:
        self.auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else str(auto_pad)
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
    _depthwise_planar); 1x1 stride-1 ones are a single GEMM on the input itself; the rest are
    im2col + one GEMM per group. A constant W is re-arranged into its GEMM (or per-tap) layout
    once, here. The bias (and, in FusedConv, the activation) is applied in place on the output
    while it is still in cache."""

    def __init__(self, ctx: KernelContext, *, auto_pad="NOTSET", dilations=None, group=1,
                 kernel_shape=None, pads=None, strides=None) -> None:
        super().__init__(ctx, auto_pad=auto_pad, dilations=dilations, group=group,
                         kernel_shape=kernel_shape, pads=pads, strides=strides)
        W = ctx.constant(1)
        self.W_shape = None
        self.w_gemm = self.w_depthwise = self.w_depthwise_2d = None
        if W is not None:
            self.W_shape = W.shape
            cdt = compute_dtype(W.dtype)
            if self._is_depthwise(W.shape):
                self.w_depthwise = self._depthwise_weights(W, cdt)
                if W.ndim == 4:
                    self.w_depthwise_2d = _depthwise_weights_2d(
                        W, *self._attrs(2, W.shape), cdt)
            if not (self._is_depthwise(W.shape) and W.ndim == 4):
                self.w_gemm = self._gemm_weights(W, cdt)

    def _is_depthwise(self, W_shape) -> bool:
        return self.group > 1 and W_shape[0] == self.group and W_shape[1] == 1

    def _gemm_weights(self, W: np.ndarray, cdt: np.dtype) -> np.ndarray:
        g = self.group
        return np.ascontiguousarray(W.reshape(g, W.shape[0] // g, -1), dtype=cdt)

    def _depthwise_weights(self, W: np.ndarray, cdt: np.dtype) -> np.ndarray:
        # (K, C, 1, ..., 1): one per-channel multiplier per kernel offset
        nd = W.ndim - 2
        K = int(np.prod(W.shape[2:]))
        w = W.reshape(W.shape[0], K).T.astype(cdt)
        return np.ascontiguousarray(w.reshape((K, W.shape[0]) + (1,) * nd))

    def __call__(self, X, W, B=None):
        return self._forward(X, W, B)

    def _forward(self, X, W, B=None, Z=None, act=None):
        """Conv(X, W) + B + Z, then ``act`` in place (an owned array of X's dtype)."""
        nd = X.ndim - 2
        kernel, strides, dilations = self._attrs(nd, W.shape)
        if X.shape[1] != W.shape[1] * self.group:
            raise ValueError(
                f"input channels {X.shape[1]} != weight channels {W.shape[1]} * group "
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
        N, M = X.shape[0], W.shape[0]
        b = None
        if B is not None:
            b = self.bias if self.bias is not None else B.astype(cdt, copy=False)
            b = b.reshape((M,) + (1,) * nd)
        if Z is not None and Z.dtype != cdt:
            Z = Z.astype(cdt)
        if self._is_depthwise(W.shape) and X.shape[1] == M and nd == 2:
            Y = self._depthwise_2d(X, W, b, Z, act, heads, outs, kernel, strides, dilations,
                                   cdt)
            return Y if Y.dtype == out_dtype else Y.astype(out_dtype)
        if self._is_depthwise(W.shape) and X.shape[1] == M:
            w = self.w_depthwise if const_w else self._depthwise_weights(W, cdt)
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
        else:
            g = self.group
            Wm = self.w_gemm if self.w_gemm is not None else self._gemm_weights(W, cdt)
            O = int(np.prod(outs))
            if all(k == 1 for k in kernel) and not any(heads) and all(s == 1 for s in strides) \
                    and outs == X.shape[2:]:
                cols = X.reshape(N, g, X.shape[1] // g, O)  # 1x1: the input is the matrix
                Y = np.matmul(Wm, cols)
            else:
                Xp = pad_spatial(X, heads, outs, kernel, strides, dilations, 0)
                Y = _im2col_gemm(Wm, _im2col(Xp, kernel, outs, strides, dilations), g)
            Y = Y.reshape((N, M) + outs)
        if b is not None:
            Y += b
        if Z is not None:
            Y += Z
        if act is not None:
            act(Y)
        return Y if Y.dtype == out_dtype else Y.astype(out_dtype)

    def _depthwise_2d(self, X, W, b, Z, act, heads, outs, kernel, strides, dilations, cdt):
        """The depthwise kernels, bias, Z and activation applied on the way out of scratch."""
        wgroups, w_hwc = self.w_depthwise_2d if self.w_depthwise_2d is not None else \
            _depthwise_weights_2d(W, kernel, strides, dilations, cdt)
        N, C = X.shape[:2]
        if outs[0] * outs[1] < _NHWC_PIXELS:
            acc = _depthwise_nhwc(X, w_hwc, heads, outs, kernel, strides, dilations)
            if b is not None:
                acc += b.reshape(C)
            src = acc.transpose(0, 3, 1, 2)
        else:
            acc = _depthwise_planar(X, wgroups, heads, outs, kernel, strides, dilations)
            if b is not None:
                acc += b
            src = acc[..., :outs[1]]
        Y = np.empty((N, C) + outs, dtype=cdt)
        bounds = getattr(act, "bounds", None)
        if bounds is not None and Z is None:  # Relu / Clip: one pass out of scratch
            np.clip(src, *bounds, out=Y)
            return Y
        np.copyto(Y, src)
        if Z is not None:
            Y += Z
        if act is not None:
            act(Y)
        return Y


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

    def _gemm_weights(self, W: np.ndarray, cdt: np.dtype) -> np.ndarray:
        # (C, M/g, *k) -> (g, M/g * K, C/g): cols = W^T @ X for each group
        g = self.group
        Cg = W.shape[0] // g
        w = W.reshape(g, Cg, -1).transpose(0, 2, 1)
        return np.ascontiguousarray(w, dtype=cdt)

    def _geometry(self, in_shape, kernel, strides, dilations):
        nd = len(in_shape)
        adj = self.output_padding or (0,) * nd
        pads = self.pads or (0,) * (2 * nd)
        heads, outs = [], []
        for i in range(nd):
            full = (in_shape[i] - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1 + adj[i]
            if self.output_shape or self.auto_pad in ("SAME_UPPER", "SAME_LOWER"):
                if self.output_shape:
                    shape = self.output_shape
                    out = shape[i] if len(shape) == nd else shape[i + 2]
                else:
                    out = in_shape[i] * strides[i]
                total = full - out
                if total <= -strides[i]:
                    raise ValueError(
                        f"output size {out} is inconsistent with input size {in_shape[i]}, "
                        f"kernel {kernel[i]} and stride {strides[i]} (dimension {i})"
                    )
                # the odd unit of padding goes to the end for SAME_UPPER, else to the start;
                # a slightly larger output (less than one stride) is zeros at the end
                head = total // 2 if self.auto_pad == "SAME_UPPER" else total - total // 2
                head = max(head, 0)
            elif self.auto_pad == "VALID":
                head, out = 0, full
            else:
                head, out = pads[i], full - pads[i] - pads[i + nd]
            if out <= 0:
                raise ValueError(f"ConvTranspose output dimension {i} would be {out}")
            heads.append(head)
            outs.append(out)
        return tuple(heads), tuple(outs)

    def __call__(self, X, W, B=None):
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
        Wm = self.w_gemm if self.w_gemm is not None else self._gemm_weights(W, cdt)
        cols = np.matmul(Wm, X.astype(cdt, copy=False).reshape(N, g, C // g, -1))
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
