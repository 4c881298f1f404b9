"""Output geometry of the windowed and resampling operators: one home for the arithmetic the
CPU kernels run with (Conv, the pools, ConvTranspose, Resize) and the optimizer's shape
refinement predicts with (optimize/extended/shape_refinement.py), so that a shape the
optimizer writes into the graph is the shape the kernel will produce.
"""

from __future__ import annotations

import functools

import numpy as np


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


def transpose_geometry(in_shape, kernel, strides, dilations, pads: tuple[int, ...],
                       output_padding: tuple[int, ...], output_shape: tuple[int, ...],
                       auto_pad: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(pads at the start, output sizes) of a ConvTranspose: ``output_shape`` (its spatial
    sizes, or with the batch and channels) where given, else in * stride under SAME_*, else
    the full extent minus ``pads``."""
    nd = len(in_shape)
    adj = output_padding or (0,) * nd
    pads = pads or (0,) * (2 * nd)
    heads, outs = [], []
    for i in range(nd):
        full = (in_shape[i] - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1 + adj[i]
        if output_shape or auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            if output_shape:
                out = output_shape[i] if len(output_shape) == nd else output_shape[i + 2]
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
            head = total // 2 if auto_pad == "SAME_UPPER" else total - total // 2
            head = max(head, 0)
        elif auto_pad == "VALID":
            head, out = 0, full
        else:
            head, out = pads[i], full - pads[i] - pads[i + nd]
        if out <= 0:
            raise ValueError(f"ConvTranspose output dimension {i} would be {out}")
        heads.append(head)
        outs.append(out)
    return tuple(heads), tuple(outs)


def resize_geometry(in_shape, scales, sizes, axes: list[int] | None,
                    policy: str = "stretch") -> tuple[list[int], np.ndarray]:
    """(output shape, float32 scale per axis) of a Resize of ``in_shape`` by ``scales`` or
    ``sizes`` (arrays; an empty one is absent) over ``axes`` (None: all)."""
    f32 = np.float32
    rank = len(in_shape)
    axes = list(range(rank)) if axes is None else [a + rank if a < 0 else a for a in axes]
    sc = np.ones(rank, dtype=f32)
    if scales is not None and scales.size:
        if scales.size != len(axes):
            raise ValueError(f"scales has {scales.size} values for {len(axes)} axes")
        sc[axes] = np.asarray(scales, dtype=f32).ravel()
        if (sc <= 0).any():
            raise ValueError("scales must be positive")
        out = [int(s * f32(n)) for s, n in zip(sc, in_shape, strict=True)]
        return out, sc
    if sizes is None or not sizes.size:
        raise ValueError("one of scales and sizes must be given")
    if sizes.size != len(axes):
        raise ValueError(f"sizes has {sizes.size} values for {len(axes)} axes")
    out = list(in_shape)
    for a, s in zip(axes, np.asarray(sizes).ravel(), strict=True):
        out[a] = int(s)
    for i in range(rank):
        sc[i] = f32(out[i]) / f32(in_shape[i]) if in_shape[i] else f32(1)
    if policy != "stretch":
        pick = np.min if policy == "not_larger" else np.max
        s = pick(sc[axes])
        for i in range(rank):
            if i in axes:
                sc[i] = s
                out[i] = int(np.floor(np.float64(s * f32(in_shape[i])) + 0.5))  # C round
            else:
                sc[i], out[i] = 1, in_shape[i]
    return out, sc
