"""Image and detection operators: GridSample, AffineGrid, RoiAlign, MaxRoiPool,
NonMaxSuppression, Col2Im, DeformConv, CenterCropPad, MaxUnpool and ImageDecoder.

GridSample and DeformConv share one scheme: per spatial dimension, a short list of taps (index,
weight) is computed for every sample point; the taps of all dimensions are combined into flat
indices and each tap gathers whole channel vectors from a channels-last copy of the input, so the
Python loop runs over taps (at most 4 per dimension), never over pixels. RoiAlign's average mode
is separable (two small matmuls per roi on the window it covers), its max mode gathers the
bilinear corners of all samples at once; NonMaxSuppression works on blocks of IoU matrices.
"""

from __future__ import annotations

import io
import itertools

import numpy as np

from .... import errors
from ..indices import as_intp
from ..kernels import KernelContext, op

# -- shared interpolation helpers --------------------------------------------------------------


def _compute_dtype(dtype: np.dtype) -> np.dtype:
    return dtype if dtype in (np.float32, np.float64) else np.dtype(np.float32)


def _reflect(x, lo, hi):
    """Reflect coordinates outside [lo, hi] back inside, repeatedly (PyTorch's grid sampler)."""
    rng = hi - lo
    if rng <= 0:
        return np.full_like(x, lo)
    below = x < lo
    above = x > hi
    dx = np.where(below, lo - x, x - hi)
    n = np.floor(dx / rng)
    r = dx - n * rng
    even = np.mod(n, 2) == 0
    from_lo = lo + r
    from_hi = hi - r
    out = np.where(below, np.where(even, from_lo, from_hi), x)
    return np.where(above, np.where(even, from_hi, from_lo), out)


def _cubic_coeffs(t):
    """Keys cubic convolution weights (alpha = -0.75) for the 4 taps around fraction ``t``."""
    a = -0.75
    t1 = t + 1
    t2 = 1 - t
    t3 = 2 - t
    return (
        ((a * t1 - 5 * a) * t1 + 8 * a) * t1 - 4 * a,
        ((a + 2) * t - (a + 3)) * t * t + 1,
        ((a + 2) * t2 - (a + 3)) * t2 * t2 + 1,
        ((a * t3 - 5 * a) * t3 + 8 * a) * t3 - 4 * a,
    )


def _gather_taps(xt, taps_per_dim, strides, out_dtype):
    """Sum over the product of per-dimension taps of ``weight * xt[b, flat_index, :]``.

    ``xt``: (B, S, C) channels-last input; each ``taps_per_dim[d]`` is a list of (index, weight)
    pairs with arrays of shape (B, P). Returns (B, P, C).
    """
    nb, size, c = xt.shape
    rows = xt.reshape(nb * size, c)
    base = (np.arange(nb, dtype=np.int64) * size)[:, None]
    acc = None
    for combo in itertools.product(*taps_per_dim):
        flat = base
        w = None
        for (idx, wt), stride in zip(combo, strides, strict=True):
            flat = flat + (idx * stride if stride != 1 else idx)
            w = wt if w is None else w * wt
        # a row gather (np.take on axis 0) is much faster than 2-D fancy indexing
        val = np.take(rows, as_intp(flat.reshape(-1)), axis=0)
        val *= w.reshape(-1, 1).astype(out_dtype, copy=False)
        if acc is None:
            acc = val
        else:
            acc += val
    return acc.reshape(nb, -1, c)


# -- GridSample ---------------------------------------------------------------------------------

_GS_MODES = {"bilinear": "linear", "linear": "linear", "nearest": "nearest",
             "bicubic": "cubic", "cubic": "cubic"}


@op("GridSample", 16, 20, 22)
class GridSample:
    def __init__(self, ctx: KernelContext, *, align_corners=0, mode="linear",
                 padding_mode="zeros"):
        if mode not in _GS_MODES:
            raise ValueError(f"GridSample: unsupported mode '{mode}'")
        if padding_mode not in ("zeros", "border", "reflection"):
            raise ValueError(f"GridSample: unsupported padding_mode '{padding_mode}'")
        self.mode = _GS_MODES[mode]
        self.padding = padding_mode
        self.align = bool(align_corners)

    def _pixel_taps(self, idx, wt, size, lo, hi):
        """Make integer tap indices valid according to the padding mode."""
        if self.padding == "zeros":
            inside = (idx >= 0) & (idx < size)
            return np.clip(idx, 0, size - 1), np.where(inside, wt, 0)
        if self.padding == "border":
            return np.clip(idx, 0, size - 1), wt
        ref = _reflect(idx.astype(np.float64), lo, hi).astype(np.int64)
        return np.clip(ref, 0, size - 1), wt

    def __call__(self, X, grid):
        n, c = X.shape[:2]
        dims = X.shape[2:]
        r = len(dims)
        out_sp = grid.shape[1:-1]
        if grid.shape[-1] != r or grid.shape[0] != n:
            raise ValueError(f"GridSample: grid shape {grid.shape} does not match X {X.shape}")
        if X.size == 0 or grid.size == 0:
            return np.zeros((n, c, *out_sp), dtype=X.dtype)
        ct = _compute_dtype(grid.dtype)
        g = grid.reshape(n, -1, r).astype(ct, copy=False)
        taps_per_dim = []
        for d, size in enumerate(dims):
            v = g[..., r - 1 - d]  # grid's last axis lists x (innermost dim) first
            if self.align:
                x = (v + 1) / 2 * (size - 1)
                lo, hi = 0.0, size - 1.0
            else:
                x = ((v + 1) * size - 1) / 2
                lo, hi = -0.5, size - 0.5
            if self.mode == "nearest":
                x = np.rint(x)
            # the point itself is padded, except in cubic mode where (as in PyTorch and
            # onnxruntime) only its 4 taps are
            if self.mode != "cubic":
                outside = (x < lo) | (x > hi)
                if self.padding == "border":
                    x = np.where(outside, np.clip(x, 0, size - 1), x)
                elif self.padding == "reflection":
                    x = np.where(outside, _reflect(x, lo, hi), x)
            if self.mode == "nearest":
                base = x.astype(np.int64)
                taps = [(base, np.ones_like(x))]
            else:
                x0 = np.floor(x)
                t = x - x0
                base = x0.astype(np.int64)
                if self.mode == "linear":
                    taps = [(base, 1 - t), (base + 1, t)]
                else:
                    taps = [(base + k - 1, cw) for k, cw in enumerate(_cubic_coeffs(t))]
            taps_per_dim.append([self._pixel_taps(i, w, size, lo, hi) for i, w in taps])
        strides = [int(np.prod(dims[d + 1:], dtype=np.int64)) for d in range(r)]
        xt = X.reshape(n, c, -1).transpose(0, 2, 1)
        wt = _compute_dtype(X.dtype)
        out = _gather_taps(xt.astype(wt, copy=False), taps_per_dim, strides, wt)
        return out.transpose(0, 2, 1).reshape(n, c, *out_sp).astype(X.dtype, copy=False)


# -- AffineGrid -------------------------------------------------------------------------------


@op("AffineGrid", 20)
def AffineGrid(theta, size, *, align_corners=0):
    shape = [int(s) for s in np.asarray(size).reshape(-1)]
    n, sp = shape[0], shape[2:]
    r = len(sp)
    if theta.shape != (n, r, r + 1):
        raise ValueError(f"AffineGrid: theta shape {theta.shape} does not fit size {shape}")
    ct = np.float64
    axes = []
    for s in sp:
        if align_corners:
            a = np.linspace(-1.0, 1.0, s) if s > 1 else np.full(s, -1.0)
        else:
            a = (2.0 * np.arange(s) + 1.0) / s - 1.0
        axes.append(a.astype(ct))
    # base grid in (x, y[, z], 1) order: the innermost spatial dim comes first
    mesh = np.meshgrid(*axes, indexing="ij")
    base = np.stack([*mesh[::-1], np.ones(sp, dtype=ct)], axis=-1).reshape(-1, r + 1)
    out = np.einsum("pk,nrk->npr", base, theta.astype(ct, copy=False))
    return out.reshape(n, *sp, r).astype(theta.dtype, copy=False)


# -- RoiAlign ---------------------------------------------------------------------------------


def _roi_axis_taps(start, bin_size, grid, pooled, size):
    """Bilinear taps along one axis for rois sharing one sub-sample ``grid`` size: (R, P, G)
    arrays of the low/high indices and their weights (zero outside [-1, size])."""
    p = np.arange(pooled)[None, :, None]
    i = np.arange(grid)[None, None, :]
    b = bin_size[:, None, None]
    pos = start[:, None, None] + p * b + (i + 0.5) * b / grid
    valid = (pos >= -1.0) & (pos <= size)
    pos = np.maximum(pos, 0.0)
    low = pos.astype(np.int64)
    at_edge = low >= size - 1
    low = np.where(at_edge, size - 1, low)
    high = np.where(at_edge, size - 1, low + 1)
    pos = np.where(at_edge, low.astype(pos.dtype), pos)
    frac = pos - low
    return low, high, np.where(valid, 1.0 - frac, 0.0), np.where(valid, frac, 0.0)


def _interp_matrix(start, bin_size, grid, pooled, size):
    """(R, P, size) matrices: row p holds the summed bilinear weights of bin p's sub-samples
    divided by their count, for per-roi grid sizes ``grid`` (rois with a 0 grid get zeros)."""
    r = len(start)
    out = np.zeros((r, pooled, size), dtype=np.float64)
    for g in np.unique(grid).tolist():
        if g <= 0:
            continue
        sel = np.flatnonzero(grid == g)
        low, high, wl, wh = _roi_axis_taps(start[sel], bin_size[sel], g, pooled, size)
        row = (sel[:, None, None] * pooled + np.arange(pooled)[None, :, None]) * size
        flat = np.concatenate([(row + low).reshape(-1), (row + high).reshape(-1)])
        wts = np.concatenate([wl.reshape(-1), wh.reshape(-1)]) / g
        out += np.bincount(as_intp(flat), wts, minlength=out.size).reshape(out.shape)
    return out


@op("RoiAlign", 10, 16, 22)
class RoiAlign:
    def __init__(self, ctx: KernelContext, *, coordinate_transformation_mode=None, mode="avg",
                 output_height=1, output_width=1, sampling_ratio=0, spatial_scale=1.0):
        if coordinate_transformation_mode is None:
            # RoiAlign-10 had no attribute and behaved as output_half_pixel
            coordinate_transformation_mode = "half_pixel" if ctx.opset >= 16 else \
                "output_half_pixel"
        if coordinate_transformation_mode not in ("half_pixel", "output_half_pixel"):
            raise ValueError(f"RoiAlign: unsupported coordinate_transformation_mode "
                             f"'{coordinate_transformation_mode}'")
        if mode not in ("avg", "max"):
            raise ValueError(f"RoiAlign: unsupported mode '{mode}'")
        self.half_pixel = coordinate_transformation_mode == "half_pixel"
        self.mode = mode
        self.ph, self.pw = int(output_height), int(output_width)
        self.sampling_ratio = int(sampling_ratio)
        self.scale = float(spatial_scale)

    def __call__(self, X, rois, batch_indices):
        n, c, h, w = X.shape
        r = rois.shape[0]
        ph, pw = self.ph, self.pw
        if r == 0:
            return np.zeros((0, c, ph, pw), dtype=X.dtype)
        boxes = rois.astype(np.float64) * self.scale - (0.5 if self.half_pixel else 0.0)
        x0, y0, x1, y1 = boxes.T
        roi_w = x1 - x0
        roi_h = y1 - y0
        if not self.half_pixel:
            roi_w = np.maximum(roi_w, 1.0)
            roi_h = np.maximum(roi_h, 1.0)
        bin_h = roi_h / ph
        bin_w = roi_w / pw
        if self.sampling_ratio > 0:
            gh = np.full(r, self.sampling_ratio, dtype=np.int64)
            gw = gh
        else:
            gh = np.ceil(roi_h / ph).astype(np.int64)
            gw = np.ceil(roi_w / pw).astype(np.int64)
        ct = _compute_dtype(X.dtype)
        bidx = np.asarray(batch_indices).astype(np.int64).reshape(-1)
        if self.mode == "avg":
            out = self._average(X.astype(ct, copy=False), bidx, x0, y0, bin_h, bin_w, gh, gw)
        else:
            out = self._max(X.astype(ct, copy=False), bidx, x0, y0, bin_h, bin_w, gh, gw)
        return out.astype(X.dtype, copy=False)

    def _average(self, X, bidx, x0, y0, bin_h, bin_w, gh, gw):
        """Average pooling of bilinear samples is separable: out[r] = Ay[r] @ X[b] @ Ax[r]^T,
        with Ay (PH, H) and Ax (PW, W) the per-roi sums of sample weights (divided by the grid
        size). Each roi multiplies only the window of the map its samples touch."""
        n, c, h, w = X.shape
        r = len(bidx)
        ph, pw = self.ph, self.pw
        ay = _interp_matrix(y0, bin_h, gh, ph, h)  # (R, PH, H)
        ax = _interp_matrix(x0, bin_w, gw, pw, w)  # (R, PW, W)
        rows_hit = ay.any(axis=1)
        cols_hit = ax.any(axis=1)
        ay = ay.astype(X.dtype)
        ax = ax.astype(X.dtype)
        out = np.zeros((r, c, ph, pw), dtype=X.dtype)
        for i in range(r):  # per roi: two small matmuls on its window of the map
            ys = np.flatnonzero(rows_hit[i])
            xs = np.flatnonzero(cols_hit[i])
            if ys.size == 0 or xs.size == 0:
                continue
            y_a, y_b, x_a, x_b = ys[0], ys[-1] + 1, xs[0], xs[-1] + 1
            win = X[bidx[i], :, y_a:y_b, x_a:x_b]
            out[i] = np.matmul(np.matmul(ay[i, :, y_a:y_b], win), ax[i, :, x_a:x_b].T)
        return out

    def _max(self, X, bidx, x0, y0, bin_h, bin_w, gh, gw):
        """Max pooling: gather the 4 bilinear corners of every sample (rois grouped by grid
        size so that no padding samples are gathered), weight them, take maxima."""
        n, c, h, w = X.shape
        r = len(bidx)
        ph, pw = self.ph, self.pw
        xt = np.ascontiguousarray(X.transpose(0, 2, 3, 1))  # (N, H, W, C): C-vector gathers
        out = np.zeros((r, c, ph, pw), dtype=X.dtype)
        grids = np.stack([gh, gw], axis=1)
        for gy, gx in np.unique(grids, axis=0).tolist():
            sel = np.flatnonzero((gh == gy) & (gw == gx))
            if gy <= 0 or gx <= 0:
                continue  # no samples: the output stays 0
            ylo, yhi, wyl, wyh = _roi_axis_taps(y0[sel], bin_h[sel], gy, ph, h)
            xlo, xhi, wxl, wxh = _roi_axis_taps(x0[sel], bin_w[sel], gx, pw, w)
            yi = np.stack([ylo, yhi], axis=-1).reshape(len(sel), -1)
            xi = np.stack([xlo, xhi], axis=-1).reshape(len(sel), -1)
            wy = np.stack([wyl, wyh], axis=-1).astype(X.dtype)  # (R, PH, G, 2)
            wx = np.stack([wxl, wxh], axis=-1).astype(X.dtype)
            per_roi = yi.shape[1] * xi.shape[1] * c
            step = max(1, (1 << 23) // max(per_roi, 1))  # bound the gathered block
            for s in range(0, len(sel), step):
                e = min(len(sel), s + step)
                blk = xt[bidx[sel[s:e], None, None], yi[s:e, :, None], xi[s:e, None, :]]
                blk = blk.reshape(e - s, ph, gy, 2, pw, gx, 2, c)
                blk *= wy[s:e, :, :, :, None, None, None, None]
                blk *= wx[s:e, None, None, None, :, :, :, None]
                val = blk.max(axis=(2, 3, 5, 6))  # corners and sub-samples
                out[sel[s:e]] = val.transpose(0, 3, 1, 2)
        return out


# -- MaxRoiPool -------------------------------------------------------------------------------


def _bin_edges(start, length, pooled, size):
    """Integer [lo, hi) of every pooling bin of one roi along one axis (Caffe's RoiPool)."""
    b = length / pooled
    p = np.arange(pooled)
    lo = np.clip(np.floor(p * b).astype(np.int64) + start, 0, size)
    hi = np.clip(np.ceil((p + 1) * b).astype(np.int64) + start, 0, size)
    return lo, hi


def _range_max(a, lo, hi, axis):
    """Max of ``a`` over [lo[i], hi[i]) along ``axis`` for every bin, stacked on that axis;
    empty bins give -inf. (A slice max per bin beats ufunc.reduceat by an order of
    magnitude on non-innermost axes.)"""
    empty_shape = list(a.shape)
    del empty_shape[axis]
    parts = []
    for start, stop in zip(lo.tolist(), hi.tolist(), strict=True):
        if stop > start:
            sl = [slice(None)] * a.ndim
            sl[axis] = slice(start, stop)
            parts.append(a[tuple(sl)].max(axis=axis))
        else:
            parts.append(np.full(empty_shape, -np.inf, dtype=a.dtype))
    return np.stack(parts, axis=axis)


@op("MaxRoiPool", 1, 22)
class MaxRoiPool:
    def __init__(self, ctx: KernelContext, *, pooled_shape, spatial_scale=1.0):
        self.ph, self.pw = (int(v) for v in pooled_shape)
        self.scale = float(spatial_scale)

    def __call__(self, X, rois):
        n, c, h, w = X.shape
        out = np.zeros((rois.shape[0], self.ph, self.pw, c), dtype=X.dtype)
        # channels-last copy: the maxima then run over contiguous C vectors
        xt = np.ascontiguousarray(X.transpose(0, 2, 3, 1))
        r64 = rois.astype(np.float64)
        # C's roundf: halves away from zero
        scaled = r64[:, 1:5] * self.scale
        coords = (np.sign(scaled) * np.floor(np.abs(scaled) + 0.5)).astype(np.int64)
        for i in range(rois.shape[0]):  # per roi: bins are contiguous ranges -> reduceat
            b = int(r64[i, 0])
            x0, y0, x1, y1 = coords[i].tolist()
            hlo, hhi = _bin_edges(y0, max(y1 - y0 + 1, 1), self.ph, h)
            wlo, whi = _bin_edges(x0, max(x1 - x0 + 1, 1), self.pw, w)
            ya, yb, xa, xb = hlo.min(), hhi.max(), wlo.min(), whi.max()
            if yb <= ya or xb <= xa:
                continue  # every bin is empty: zeros
            win = xt[b, ya:yb, xa:xb]  # only the roi's window of the map
            m = _range_max(win, wlo - xa, whi - xa, axis=1)
            m = _range_max(m, hlo - ya, hhi - ya, axis=0)
            out[i] = np.where(np.isneginf(m), 0, m)
        return out.transpose(0, 3, 1, 2)


# -- NonMaxSuppression ------------------------------------------------------------------------


def _scalar(v, default, cast):
    if v is None or np.asarray(v).size == 0:
        return default
    return cast(np.asarray(v).reshape(-1)[0])


def _suppresses(a, b, thr):
    """(len a, len b) matrix: box a[i] suppresses box b[j] (IoU above ``thr``); ``a`` and
    ``b`` are (x1, y1, x2, y2, area) tuples. Degenerate boxes never suppress (onnxruntime)."""
    ax1, ay1, ax2, ay2, aa = (v[:, None] for v in a)
    bx1, by1, bx2, by2, ba = (v[None, :] for v in b)
    ix = np.minimum(ax2, bx2) - np.maximum(ax1, bx1)
    iy = np.minimum(ay2, by2) - np.maximum(ay1, by1)
    inter = ix * iy
    union = aa + ba - inter
    with np.errstate(divide="ignore", invalid="ignore"):
        return ((ix > 0) & (iy > 0) & (inter > 0) & (aa > 0) & (ba > 0) & (union > 0)
                & (inter / union > thr))


def _greedy_nms(boxes, max_out, thr):
    """Greedy NMS over candidates already sorted by score, in blocks: the IoU matrix of one
    block decides within it (a short loop over its rows), then the block's kept boxes
    suppress all later candidates at once."""
    k = len(boxes[0])
    alive = np.ones(k, dtype=bool)
    kept: list[int] = []
    block = int(min(max(2 * max_out, 64), 512))
    start = 0
    while start < k and len(kept) < max_out:
        end = min(k, start + block)
        idx = start + np.flatnonzero(alive[start:end])
        start = end
        if idx.size == 0:
            continue
        sup = _suppresses([v[idx] for v in boxes], [v[idx] for v in boxes], thr)
        dead = np.zeros(idx.size, dtype=bool)
        new = []
        for j in range(idx.size):
            if dead[j]:
                continue
            new.append(j)
            if len(kept) + len(new) == max_out:
                break
            dead |= sup[j]
        kept_idx = idx[new]
        kept.extend(kept_idx.tolist())
        if end < k and len(kept) < max_out:
            rest = end + np.flatnonzero(alive[end:])
            # chunk the (kept x rest) matrix to bound memory
            step = max(1, (1 << 22) // max(len(kept_idx), 1))
            for s in range(0, rest.size, step):
                part = rest[s:s + step]
                hit = _suppresses([v[kept_idx] for v in boxes], [v[part] for v in boxes], thr)
                alive[part[hit.any(axis=0)]] = False
    return kept


@op("NonMaxSuppression", 10, 11)
def NonMaxSuppression(boxes, scores, max_output_boxes_per_class=None, iou_threshold=None,
                      score_threshold=None, *, center_point_box=0):
    max_out = max(_scalar(max_output_boxes_per_class, 0, int), 0)
    iou_thr = _scalar(iou_threshold, 0.0, float)
    has_score_thr = score_threshold is not None and np.asarray(score_threshold).size
    score_thr = _scalar(score_threshold, 0.0, float)
    nb, nc = scores.shape[:2]
    if max_out == 0 or boxes.shape[1] == 0:
        return np.zeros((0, 3), dtype=np.int64)
    b = boxes
    if center_point_box:
        half_w, half_h = b[..., 2] / 2, b[..., 3] / 2
        x1, x2 = b[..., 0] - half_w, b[..., 0] + half_w
        y1, y2 = b[..., 1] - half_h, b[..., 1] + half_h
    else:  # [y1, x1, y2, x2], corners possibly flipped
        y1, y2 = np.minimum(b[..., 0], b[..., 2]), np.maximum(b[..., 0], b[..., 2])
        x1, x2 = np.minimum(b[..., 1], b[..., 3]), np.maximum(b[..., 1], b[..., 3])
    areas = (x2 - x1) * (y2 - y1)
    thr = boxes.dtype.type(iou_thr) if boxes.dtype.kind == "f" else iou_thr
    out = []
    for bi in range(nb):
        for ci in range(nc):
            s = scores[bi, ci]
            cand = np.flatnonzero(s > s.dtype.type(score_thr)) if has_score_thr else \
                np.arange(s.shape[0])
            # highest score first, lower box index first among equal scores
            order = cand[np.lexsort((cand, -s[cand].astype(np.float64)))]
            coords = [x1[bi, order], y1[bi, order], x2[bi, order], y2[bi, order],
                      areas[bi, order]]
            picked = order[_greedy_nms(coords, max_out, thr)]
            if picked.size:
                out.append(np.stack([np.full_like(picked, bi), np.full_like(picked, ci),
                                     picked], 1))
    if not out:
        return np.zeros((0, 3), dtype=np.int64)
    return np.concatenate(out, axis=0).astype(np.int64, copy=False)


# -- Col2Im -----------------------------------------------------------------------------------


@op("Col2Im", 18)
def Col2Im(input, image_shape, block_shape, *, dilations=None, pads=None, strides=None):
    img = [int(v) for v in np.asarray(image_shape).reshape(-1)]
    blk = [int(v) for v in np.asarray(block_shape).reshape(-1)]
    r = len(img)
    dil = list(dilations) if dilations else [1] * r
    pad = list(pads) if pads else [0] * (2 * r)
    std = list(strides) if strides else [1] * r
    n, ck, length = input.shape
    kprod = int(np.prod(blk))
    if ck % kprod:
        raise ValueError(f"Col2Im: input dim 1 ({ck}) not divisible by prod(block_shape)")
    c = ck // kprod
    nblocks = [(img[d] + pad[d] + pad[d + r] - dil[d] * (blk[d] - 1) - 1) // std[d] + 1
               for d in range(r)]
    if int(np.prod(nblocks)) != length:
        raise ValueError(f"Col2Im: input dim 2 ({length}) != number of blocks {nblocks}")
    cols = input.reshape(n, c, *blk, *nblocks)
    padded = np.zeros((n, c, *[img[d] + pad[d] + pad[d + r] for d in range(r)]),
                      dtype=input.dtype)
    # one strided accumulation per kernel offset
    for koff in itertools.product(*[range(k) for k in blk]):
        sl = tuple(slice(koff[d] * dil[d], koff[d] * dil[d] + std[d] * (nblocks[d] - 1) + 1,
                         std[d]) for d in range(r))
        view = padded[(slice(None), slice(None), *sl)]
        np.add(view, cols[(slice(None), slice(None), *koff)], out=view)
    if not any(pad):
        return padded
    crop = tuple(slice(pad[d], pad[d] + img[d]) for d in range(r))
    return np.ascontiguousarray(padded[(slice(None), slice(None), *crop)])


# -- DeformConv -------------------------------------------------------------------------------


@op("DeformConv", 19, 22)
class DeformConv:
    def __init__(self, ctx: KernelContext, *, dilations=None, group=1, kernel_shape=None,
                 offset_group=1, pads=None, strides=None):
        self.dilations = dilations
        self.group = int(group)
        self.kernel_shape = kernel_shape
        self.offset_group = int(offset_group)
        self.pads = pads
        self.strides = strides

    def __call__(self, X, W, offset, B=None, mask=None):
        n, c = X.shape[:2]
        dims = X.shape[2:]
        r = len(dims)
        ks = list(self.kernel_shape) if self.kernel_shape else list(W.shape[2:])
        dil = list(self.dilations) if self.dilations else [1] * r
        pad = list(self.pads) if self.pads else [0] * (2 * r)
        std = list(self.strides) if self.strides else [1] * r
        og, g = self.offset_group, self.group
        oc = W.shape[0]
        out_sp = [(dims[d] + pad[d] + pad[d + r] - dil[d] * (ks[d] - 1) - 1) // std[d] + 1
                  for d in range(r)]
        if list(offset.shape[2:]) != out_sp:
            raise ValueError(f"DeformConv: offset spatial shape {offset.shape[2:]} != {out_sp}")
        if c % og or c != W.shape[1] * g or oc % g:
            raise ValueError("DeformConv: channel counts do not match group/offset_group")
        kp = int(np.prod(ks))
        p = int(np.prod(out_sp))
        ct = _compute_dtype(X.dtype)
        if X.size == 0 or p == 0 or W.size == 0:  # an empty batch or output: the bias only
            out = np.zeros((n, oc, *out_sp), ct)
            if B is not None:
                out += B.astype(ct, copy=False).reshape(oc, *([1] * r))
            return out.astype(X.dtype, copy=False)
        # sampling points are ordered (output position, kernel tap) so that the gathered
        # columns reshape to (n, p, kp * C) for the final matmul without a transpose
        off = offset.reshape(n, og, kp, r, p).astype(ct, copy=False).transpose(0, 1, 4, 2, 3)
        kgrid = np.stack(np.meshgrid(*[np.arange(k) for k in ks], indexing="ij"), 0)
        ogrid = np.stack(np.meshgrid(*[np.arange(o) for o in out_sp], indexing="ij"), 0)
        kgrid = kgrid.reshape(r, 1, kp)
        ogrid = ogrid.reshape(r, p, 1)
        m = None
        if mask is not None:  # folded into the weights of the first dimension's taps
            m = mask.reshape(n, og, kp, p).astype(ct, copy=False).transpose(0, 1, 3, 2)
            m = m.reshape(n * og, p * kp)
        taps_per_dim = []
        for d in range(r):
            base = ogrid[d] * std[d] - pad[d] + kgrid[d] * dil[d]  # (p, kp)
            pos = (base[None, None] + off[..., d]).reshape(n * og, p * kp)
            p0 = np.floor(pos)
            t = pos - p0
            i0 = p0.astype(np.int64)
            taps = []
            for idx, wt in ((i0, 1 - t), (i0 + 1, t)):
                inside = (idx >= 0) & (idx < dims[d])
                wt = np.where(inside, wt, 0)
                if m is not None and d == 0:
                    wt = wt * m
                taps.append((np.clip(idx, 0, dims[d] - 1), wt))
            taps_per_dim.append(taps)
        strides_flat = [int(np.prod(dims[d + 1:], dtype=np.int64)) for d in range(r)]
        cg = c // og
        xt = X.astype(ct, copy=False).reshape(n, og, cg, -1).transpose(0, 1, 3, 2)
        xt = np.ascontiguousarray(xt).reshape(n * og, -1, cg)
        cols = _gather_taps(xt, taps_per_dim, strides_flat, ct)  # (n*og, p*kp, cg)
        cols = cols.reshape(n, og, p, kp, cg)
        if og > 1:
            cols = cols.transpose(0, 2, 3, 1, 4)
        cols = cols.reshape(n, p, kp, c)
        # W (oc, c/g, *k) -> per group (kp * c/g, oc/g) matching the columns' (tap, channel)
        cgp = c // g
        wg = W.astype(ct, copy=False).reshape(g, oc // g, cgp, kp).transpose(0, 3, 2, 1)
        wg = wg.reshape(g, kp * cgp, oc // g)
        if g == 1:
            out = np.matmul(cols.reshape(n, p, kp * c), wg[0])  # (n, p, oc)
        else:
            out = np.concatenate([
                np.matmul(cols[..., gi * cgp:(gi + 1) * cgp].reshape(n, p, kp * cgp), wg[gi])
                for gi in range(g)], axis=2)
        out = out.transpose(0, 2, 1).reshape(n, oc, *out_sp)
        if B is not None:
            out = out + B.astype(ct, copy=False).reshape(1, oc, *([1] * r))
        return np.ascontiguousarray(out.astype(X.dtype, copy=False))


# -- CenterCropPad, MaxUnpool -----------------------------------------------------------------


@op("CenterCropPad", 18)
def CenterCropPad(input_data, shape, *, axes=None):
    rank = input_data.ndim
    axes = list(range(rank)) if axes is None else [a + rank if a < 0 else a for a in axes]
    target = [int(v) for v in np.asarray(shape).reshape(-1)]
    if len(target) != len(axes):
        raise ValueError("CenterCropPad: shape and axes lengths differ")
    src = [slice(None)] * rank
    dst = [slice(None)] * rank
    out_shape = list(input_data.shape)
    for a, t in zip(axes, target, strict=True):
        dim = input_data.shape[a]
        out_shape[a] = t
        if t < dim:
            s = (dim - t) // 2
            src[a] = slice(s, s + t)
        elif t > dim:
            s = (t - dim) // 2
            dst[a] = slice(s, s + dim)
    out = np.zeros(out_shape, dtype=input_data.dtype)
    out[tuple(dst)] = input_data[tuple(src)]
    return out


@op("MaxUnpool", 9, 11, 22)
def MaxUnpool(X, I, output_shape=None, *, kernel_shape, pads=None, strides=None):
    r = X.ndim - 2
    pads = list(pads) if pads else [0] * (2 * r)
    strides = list(strides) if strides else [1] * r
    inferred = list(X.shape[:2]) + [
        (X.shape[d + 2] - 1) * strides[d] - pads[d] - pads[d + r] + kernel_shape[d]
        for d in range(r)]
    # indices are flat positions in the (N, C, *inferred spatial) tensor
    out = np.zeros(int(np.prod(inferred)), dtype=X.dtype)
    out[np.asarray(I).reshape(-1)] = X.reshape(-1)
    out = out.reshape(inferred)
    if output_shape is None:
        return out
    # An explicit output_shape zero-pads (or crops) the unpooled tensor at the end of each
    # axis, as the ONNX reference implementation and conformance data do. onnxruntime instead
    # reads the indices as positions in output_shape; the two agree when the shapes match.
    shape = [int(v) for v in np.asarray(output_shape).reshape(-1)]
    res = np.zeros(shape, dtype=X.dtype)
    common = tuple(slice(0, min(a, b)) for a, b in zip(shape, inferred, strict=True))
    res[common] = out[common]
    return res


# -- ImageDecoder -----------------------------------------------------------------------------

# The formats the operator's specification lists, under Pillow's names. Pillow opens many more
# (EPS through Ghostscript among them); a model's bytes get only these decoders.
_IMAGE_FORMATS = ("BMP", "JPEG", "JPEG2000", "TIFF", "PNG", "WEBP", "PPM")


def _pillow_image():
    """Pillow's Image module: images are decoded by Pillow, an optional dependency."""
    try:
        from PIL import Image
    except ImportError:
        raise errors.NotImplemented(
            "ImageDecoder decodes images with Pillow, which is not installed: "
            "pip install pillow (or pip install onnxrun[image])") from None
    return Image


@op("ImageDecoder", 20)
class ImageDecoder:
    """Decodes with Pillow into uint8 (H, W, 3) RGB or BGR, or (H, W, 1) Grayscale: the RGB
    image's ITU-R 601-2 luma as Pillow computes it (``convert("L")``). 16-bit images keep their
    high byte (as libpng's 8-bit reduction does), where Pillow's own conversion would clip."""

    def __init__(self, ctx: KernelContext, *, pixel_format="RGB"):
        if pixel_format not in ("RGB", "BGR", "Grayscale"):
            raise ValueError(f"ImageDecoder: unsupported pixel_format '{pixel_format}'")
        self.pixel_format = pixel_format
        self._image = _pillow_image()

    def __call__(self, encoded_stream):
        Image = self._image
        data = np.asarray(encoded_stream, dtype=np.uint8).tobytes()
        try:
            with Image.open(io.BytesIO(data), formats=_IMAGE_FORMATS) as img:
                if img.mode in ("I", "I;16", "I;16B", "I;16L", "I;16N"):
                    high = np.right_shift(np.clip(np.asarray(img), 0, 0xFFFF), 8)
                    rgb = Image.fromarray(high.astype(np.uint8), "L").convert("RGB")
                else:
                    rgb = img.convert("RGB")
        except Image.UnidentifiedImageError:
            raise ValueError("ImageDecoder: the encoded stream is not an image in a supported "
                             f"format ({', '.join(_IMAGE_FORMATS)})") from None
        except Exception as e:  # truncated or corrupt data, a decompression bomb...
            raise ValueError(f"ImageDecoder: cannot decode the image: {type(e).__name__}: "
                             f"{e}") from None
        if self.pixel_format == "Grayscale":
            return np.asarray(rgb.convert("L"))[:, :, None]
        out = np.asarray(rgb)
        return np.ascontiguousarray(out[:, :, ::-1]) if self.pixel_format == "BGR" else out
