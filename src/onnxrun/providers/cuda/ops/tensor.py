"""Data movement on the device: Reshape, Flatten, Squeeze, Unsqueeze, Transpose, Concat,
Split, Slice, Gather, Expand, Tile, Pad (constant), ConstantOfShape, Dropout (inference).
Shapes, axes, starts/ends and pads are host inputs: the arithmetic that produced them stays on
the CPU provider (onnxruntime's CUDA kernels take them in CPU memory too)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..array import namespace, normalize_axis
from ..kernels import KernelContext, op


def _ints(values: Any) -> list[int]:
    return [int(v) for v in np.asarray(values).reshape(-1)]


@op("Reshape", 5, 13, 14, 19, 21, 23, 24, 25, host_inputs=(1,))
def Reshape(data, shape, *, allowzero=0):
    dims = _ints(shape)
    if not allowzero:
        dims = [data.shape[i] if d == 0 else d for i, d in enumerate(dims)]
    return namespace(data).reshape(data, tuple(dims))


@op("Flatten", 1, 9, 11, 13, 21, 23, 24, 25)
def Flatten(input, *, axis=1):  # noqa: A002 - the schema's name
    a = normalize_axis(axis, input.ndim)
    outer = int(np.prod(input.shape[:a], dtype=np.int64))
    inner = int(np.prod(input.shape[a:], dtype=np.int64))
    return namespace(input).reshape(input, (outer, inner))


def _squeezed(data: Any, axes: list[int] | None) -> Any:
    if axes is None:
        shape = tuple(d for d in data.shape if d != 1)
    else:
        drop = {normalize_axis(a, data.ndim) for a in axes}
        shape = tuple(d for i, d in enumerate(data.shape) if i not in drop)
    return namespace(data).reshape(data, shape)


@op("Squeeze", 1, 11)
def Squeeze1(data, *, axes=None):
    return _squeezed(data, None if axes is None else list(axes))


@op("Squeeze", 13, 21, 23, 24, 25, host_inputs=(1,))
def Squeeze(data, axes=None):
    return _squeezed(data, None if axes is None else _ints(axes))


def _unsqueezed(data: Any, axes: list[int]) -> Any:
    rank = data.ndim + len(axes)
    where = {normalize_axis(a, rank) for a in axes}
    dims = iter(data.shape)
    shape = tuple(1 if i in where else next(dims) for i in range(rank))
    return namespace(data).reshape(data, shape)


@op("Unsqueeze", 1, 11)
def Unsqueeze1(data, *, axes):
    return _unsqueezed(data, list(axes))


@op("Unsqueeze", 13, 21, 23, 24, 25, host_inputs=(1,))
def Unsqueeze(data, axes):
    return _unsqueezed(data, _ints(axes))


@op("Transpose", 1, 13, 21, 23, 24, 25)
def Transpose(data, *, perm=None):
    perm = tuple(reversed(range(data.ndim))) if perm is None else tuple(int(p) for p in perm)
    return namespace(data).permute_dims(data, perm)


@op("Concat", 4, 11, 13)
def Concat(*inputs, axis):
    return namespace(inputs[0]).concat(list(inputs), axis=int(axis))


def _split(x: Any, axis: int, sizes: list[int]) -> tuple[Any, ...]:
    a = normalize_axis(axis, x.ndim)
    out, start = [], 0
    for size in sizes:
        index = [slice(None)] * x.ndim
        index[a] = slice(start, start + size)
        out.append(x[tuple(index)])
        start += size
    return tuple(out)


def _even_sizes(dim: int, n: int) -> list[int]:
    """ONNX's split into ``n`` parts: ceil(dim / n) each, the last one smaller."""
    part = -(-dim // n)
    return [min(part, max(dim - i * part, 0)) for i in range(n)]


@op("Split", 2, 11)
class Split2:
    def __init__(self, ctx: KernelContext, *, axis=0, split=None) -> None:
        self.axis, self.n = int(axis), ctx.num_outputs
        self.sizes = None if split is None else [int(s) for s in split]

    def __call__(self, input):  # noqa: A002
        sizes = self.sizes or _even_sizes(input.shape[normalize_axis(self.axis, input.ndim)],
                                          self.n)
        return _split(input, self.axis, sizes)


@op("Split", 13, 18, host_inputs=(1,))
class Split:
    def __init__(self, ctx: KernelContext, *, axis=0, num_outputs=None) -> None:
        self.axis = int(axis)
        self.n = int(num_outputs) if num_outputs is not None else ctx.num_outputs

    def __call__(self, input, split=None):  # noqa: A002
        dim = input.shape[normalize_axis(self.axis, input.ndim)]
        sizes = _ints(split) if split is not None else _even_sizes(dim, self.n)
        return _split(input, self.axis, sizes)


def _slice(data: Any, starts: list[int], ends: list[int], axes: list[int],
           steps: list[int]) -> Any:
    index = [slice(None)] * data.ndim
    for start, end, axis, step in zip(starts, ends, axes, steps, strict=True):
        a = normalize_axis(axis, data.ndim)
        dim = data.shape[a]
        s = start + dim if start < 0 else start
        e = end + dim if end < 0 else end
        if step > 0:
            index[a] = slice(min(max(s, 0), dim), min(max(e, 0), dim), step)
        else:
            s = min(max(s, 0), dim - 1)
            e = min(max(e, -1), dim - 1)
            index[a] = slice(s, None if e < 0 else e, step)
    return data[tuple(index)]


@op("Slice", 1)
def Slice1(data, *, starts, ends, axes=None):
    axes = list(range(len(starts))) if axes is None else list(axes)
    return _slice(data, list(starts), list(ends), axes, [1] * len(starts))


@op("Slice", 10, 11, 13, host_inputs=(1, 2, 3, 4))
def Slice(data, starts, ends, axes=None, steps=None):
    s, e = _ints(starts), _ints(ends)
    a = list(range(len(s))) if axes is None else _ints(axes)
    st = [1] * len(s) if steps is None else _ints(steps)
    return _slice(data, s, e, a, st)


@op("Gather", 1, 11, 13)
def Gather(data, indices, *, axis=0):
    xp = namespace(data)
    a = normalize_axis(axis, data.ndim)
    idx = xp.astype(indices, xp.int64) if indices.dtype != xp.int64 else indices
    idx = xp.where(idx < 0, idx + data.shape[a], idx)
    flat = xp.take(data, xp.reshape(idx, (-1,)), axis=a)
    return xp.reshape(flat, (*data.shape[:a], *indices.shape, *data.shape[a + 1:]))


@op("Expand", 8, 13, host_inputs=(1,))
def Expand(input, shape):  # noqa: A002 - the schema's name
    target = np.broadcast_shapes(tuple(input.shape), tuple(_ints(shape)))
    return namespace(input).broadcast_to(input, target)


@op("Tile", 6, 13, host_inputs=(1,))
def Tile(input, repeats):  # noqa: A002
    return namespace(input).tile(input, tuple(_ints(repeats)))


def _constant_pad(node: Any) -> bool:
    mode = node.attr("mode", "constant")
    return (mode.decode() if isinstance(mode, bytes) else mode) == "constant"


@op("Pad", 11, 13, 18, 19, 21, 23, 24, 25, host_inputs=(1, 2, 3), check=_constant_pad)
def Pad(data, pads, constant_value=None, axes=None, *, mode="constant"):
    xp = namespace(data)
    p = _ints(pads)
    n = len(p) // 2
    which = list(range(data.ndim)) if axes is None else [normalize_axis(a, data.ndim)
                                                          for a in _ints(axes)]
    before, after = [0] * data.ndim, [0] * data.ndim
    for i, a in enumerate(which[:n]):
        before[a], after[a] = p[i], p[i + n]
    value = 0 if constant_value is None else np.asarray(constant_value).reshape(-1)[0].item()
    shape = tuple(d + b + e for d, b, e in zip(data.shape, before, after, strict=True))
    out = xp.full(shape, value, dtype=data.dtype, device=data.device)
    # negative pads crop
    src = tuple(slice(max(-b, 0), d - max(-e, 0)) for d, b, e in
                zip(data.shape, before, after, strict=True))
    dst = tuple(slice(max(b, 0), max(b, 0) + (s.stop - s.start)) for b, s in
                zip(before, src, strict=True))
    out[dst] = data[src]
    return out


@op("ConstantOfShape", 9, 20, 21, 23, 24, 25, host_inputs=(0,))
class ConstantOfShape:
    def __init__(self, ctx: KernelContext, *, value=None) -> None:
        self.device = ctx.provider.backend
        v = np.zeros(1, np.float32) if value is None else np.asarray(value).reshape(-1)
        self.value, self.dtype = v[0].item(), self.device.as_dtype(v.dtype)

    def __call__(self, input):  # noqa: A002
        return self.device.xp.full(tuple(_ints(input)), self.value, dtype=self.dtype,
                                   device=self.device.array_device)


def _inference_dropout(node: Any) -> bool:
    outputs = node.graph.outputs if node.graph is not None else []
    mask_unused = len(node.outputs) < 2 or not node.outputs[1].name or (
        not node.outputs[1].uses and node.outputs[1] not in outputs)
    return mask_unused and (len(node.inputs) < 3 or node.inputs[2] is None)


@op("Dropout", 1, 6, 7, 10, 12, 13, 22, check=_inference_dropout)
def Dropout(data, ratio=None, training_mode=None, *, seed=None):
    return data
