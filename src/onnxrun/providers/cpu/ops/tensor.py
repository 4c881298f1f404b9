"""Tensor manipulation: shapes, reshapes, slicing, gathers/scatters, padding, constants.

Most of these return numpy views (no copy). Constant inputs that steer an operator (a reshape's
shape, a slice's bounds, unsqueeze axes) are read once when the session is created.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from ....dtypes import np_dtype
from ..indices import as_intp
from ..kernels import KernelContext, op

INT64 = np.int64


def _ints(a) -> list[int]:
    return [int(v) for v in np.asarray(a).reshape(-1).tolist()]


def _rank(ctx: KernelContext, i: int = 0) -> int | None:
    shape = ctx.input_shape(i)
    return None if shape is None else len(shape)


def _is_const(ctx: KernelContext, i: int) -> bool:
    """Input i is absent or a constant (so __init__ can read it once)."""
    return not ctx.has_input(i) or ctx.constant(i) is not None


# -- Identity, Shape, Size --------------------------------------------------------------------


@op("Identity", 1, 13, 14, 16, 19, 21, 23, 24, 25)
def Identity(input):  # noqa: A002 - the schema's name
    return input


@op("Shape", 1, 13, 15, 19, 21, 23, 24, 25)
def Shape(data, *, start=0, end=None):
    return np.array(data.shape[start:end], dtype=INT64)


@op("Size", 1, 13, 19, 21, 23, 24, 25)
def Size(data):
    return np.array(data.size, dtype=INT64)


# -- Reshape, Flatten, Squeeze, Unsqueeze -----------------------------------------------------


def _reshaped(data: np.ndarray, target) -> np.ndarray:
    """``data.reshape(target)``, or an error naming both shapes (numpy's speaks of arrays)."""
    try:
        return data.reshape(target)
    except ValueError:
        raise ValueError(f"Reshape: an input of shape {list(data.shape)} ({data.size} "
                         f"elements) cannot take the shape {list(target)}") from None


def _reshape_target(data_shape, shape, allowzero):
    if not allowzero and 0 in shape:
        shape = [data_shape[i] if d == 0 else d for i, d in enumerate(shape)]
    return shape


@op("Reshape", 5, 13, 14, 19, 21, 23, 24, 25)
class Reshape:
    def __init__(self, ctx: KernelContext, *, allowzero=0):
        self.allowzero = allowzero
        c = ctx.constant(1)
        self.shape = None
        if c is not None:
            shape = _ints(c)
            # without zeros to copy, the target is fixed: numpy infers the -1 itself
            self.shape = tuple(shape) if allowzero or 0 not in shape else None
            self.zero_shape = shape
        from .conv import channel_shuffle, keeps_layout

        # the end of a channel shuffle at the layout level: channels-last memory stays so
        node = getattr(ctx, "node", None)
        self.shuffle_end = node is not None and keeps_layout(ctx) and \
            (channel_shuffle(node) or (None,) * 3)[2] is node
        # the shuffle's copy may go into the executor's buffer (memory.py): its shape a
        # function of the input's, the target constant (a Reshape returning a view of its
        # input is left out by memory.py's probe run)
        self.accepts_out = self.shuffle_end and c is not None

    def __call__(self, data, shape, *, out=None):
        target = self.shape if self.shape is not None else \
            _reshape_target(data.shape, _ints(shape), self.allowzero)
        if self.shuffle_end and data.ndim == 5 and len(target) == 4 and \
                max(data.strides[1:3]) < data.strides[4]:
            return _shuffled_channels_last(data, target, out)
        return _reshaped(data, target)


def _shuffled_channels_last(data: np.ndarray, target, out=None) -> np.ndarray:
    """A channel shuffle's last Reshape, (N, a, b, H, W) -> (N, a*b, H, W), of channels-last
    data (its axes a, b innermost in memory): one copy into (N, H, W, a, b) memory (``out``,
    the executor's buffer, where it is so laid out), returned as an NCHW view of it (numpy's
    reshape would copy into NCHW memory). One copy per b: runs of a channels in, every b-th
    float out (2x faster than one copy whose inner loop is the b floats of a pixel)."""
    from .conv import nhwc_out

    N, a, b, H, W = data.shape
    if list(target) not in ([N, a * b, H, W], [N, -1, H, W], [-1, a * b, H, W]):
        return _reshaped(data, target)
    pixels = data.transpose(0, 3, 4, 2, 1)  # (N, H, W, b, a): the memory, when dense
    Yt = nhwc_out(out, (N, H, W, a * b), data.dtype).reshape(N, H, W, a, b)
    if data.dtype == np.float32 and pixels.flags.c_contiguous and data.size:
        from ..compiled import jit, shuffle

        if b <= shuffle.MAX_GROUPS:
            try:  # each pixel's (b, a) block transposed by vector shuffles (3-4x numpy's)
                Y = shuffle.shuffle(pixels.reshape(N * H * W, b, a), b,
                                    out=Yt.reshape(N * H * W, a, b))
                return Y.reshape(N, H, W, a * b).transpose(0, 3, 1, 2)
            except jit.Unavailable:
                pass
    src = data.transpose(0, 3, 4, 1, 2)
    for j in range(b):
        np.copyto(Yt[..., j], src[..., j])
    return Yt.reshape(N, H, W, a * b).transpose(0, 3, 1, 2)


@op("Reshape", 1)
def Reshape_1(data, *, shape):
    return _reshaped(data, _reshape_target(data.shape, list(shape), 0))


@op("Flatten", 1, 9, 11, 13, 21, 23, 24, 25)
def Flatten(input, *, axis=1):  # noqa: A002 - the schema's name
    shape = input.shape
    if axis < 0:
        axis += len(shape)
    return input.reshape(math.prod(shape[:axis]), math.prod(shape[axis:]))


def _squeeze(data, axes):
    if axes is None:
        return data.reshape([d for d in data.shape if d != 1])
    return np.squeeze(data, axis=tuple(axes))


def _unsqueeze_shape(shape, axes):
    rank = len(shape) + len(axes)
    norm = sorted(a + rank if a < 0 else a for a in axes)
    out = list(shape)
    for a in norm:
        out.insert(a, 1)
    return out


@op("Squeeze", 1, 11)
def Squeeze_11(data, *, axes=None):
    return _squeeze(data, axes)


@op("Squeeze", 13, 21, 23, 24, 25)
class Squeeze:
    def __init__(self, ctx: KernelContext):
        self.const = _is_const(ctx, 1)
        c = ctx.constant(1)
        self.axes = None if c is None else tuple(_ints(c))

    def __call__(self, data, axes=None):
        if self.const:
            return _squeeze(data, self.axes)
        return _squeeze(data, None if axes is None else _ints(axes))


@op("Unsqueeze", 1, 11)
def Unsqueeze_11(data, *, axes):
    return data.reshape(_unsqueeze_shape(data.shape, axes))


@op("Unsqueeze", 13, 21, 23, 24, 25)
class Unsqueeze:
    def __init__(self, ctx: KernelContext):
        c = ctx.constant(1)
        self.axes = None if c is None else _ints(c)
        # output positions of the new dims, for input rank self.rank (None: any rank)
        self.positions = None
        self.rank = None
        if self.axes is not None:
            r = _rank(ctx)
            if r is not None:
                self.positions = sorted(a + r + len(self.axes) if a < 0 else a
                                        for a in self.axes)
                self.rank = r
            elif all(a >= 0 for a in self.axes):
                self.positions = sorted(self.axes)

    def __call__(self, data, axes):
        if self.positions is not None and (self.rank is None or self.rank == data.ndim):
            shape = list(data.shape)
            for p in self.positions:
                shape.insert(p, 1)
            return data.reshape(shape)
        a = self.axes if self.axes is not None else _ints(axes)
        return data.reshape(_unsqueeze_shape(data.shape, a))


# -- Transpose, Concat, Split -----------------------------------------------------------------


@op("Transpose", 1, 13, 21, 23, 24, 25)
def Transpose(data, *, perm=None):
    return np.transpose(data, perm)


@op("Concat", 1, 4, 11, 13)
class Concat:
    """np.concatenate; at the layout level, a join along the channels with an operand whose
    channels are innermost (a channels-last convolution output, a Split of one) gives a
    channels-last result: each operand's rows of channels copied into their range of the
    output's rows (an NCHW operand transposed on the way)."""

    accepts_out = True  # the executor's buffer for the output (memory.py)

    def __init__(self, ctx: KernelContext, *, axis=1) -> None:
        from ..parallel import threads_for
        from .conv import keeps_layout

        self.axis = int(axis)
        # memory.py may hand an input's producer its range of this output: such an input
        # is found in place and not copied
        self.joins_axis = self.axis
        self.keep_layout = keeps_layout(ctx)
        self.copy = _copier(threads_for(ctx))  # large copies on spin.py's workers

    def __call__(self, *inputs, out=None):
        from .conv import nhwc_out

        if len(inputs) == 1:
            return inputs[0]
        if self.keep_layout and self.axis in (1, -3) and _channels_last_operands(inputs):
            N, _, H, W = inputs[0].shape
            Yt = nhwc_out(out, (N, H, W, sum(x.shape[1] for x in inputs)), inputs[0].dtype,
                          True)
            c = 0
            for x in inputs:
                _place(Yt[..., c:c + x.shape[1]], x.transpose(0, 2, 3, 1), self.copy)
                c += x.shape[1]
            return Yt.transpose(0, 3, 1, 2)
        if out is not None and out.dtype == inputs[0].dtype and \
                (self.keep_layout or out.flags.c_contiguous):
            try:  # out: the shape and layout this Concat's result had at these shapes
                return _concatenate_into(inputs, self.axis, out, self.copy)
            except ValueError:  # not the result's shape after all: a fresh one
                pass
        if self.copy is not np.copyto and sum(x.nbytes for x in inputs) >= _SPLIT_FROM and \
                all(x.flags.c_contiguous for x in inputs):
            try:  # C-contiguous as numpy's would be; large copies on spin.py's workers
                return _concatenate_into(inputs, self.axis, np.empty(
                    _joined_shape(inputs, self.axis), inputs[0].dtype), self.copy)
            except ValueError:  # numpy's error for operands that do not join
                pass
        Y = np.concatenate(inputs, axis=self.axis)  # numpy keeps a layout all operands share
        return Y if self.keep_layout or Y.flags.c_contiguous else np.ascontiguousarray(Y)


_SPLIT_FROM = 1 << 19  # bytes: below, no copy is worth two ranges (copy.MIN_BYTES_PER_RANGE)


def _copier(threads: int):
    """``copy(dst, src)``: dst[...] = src, split over spin.py's workers where large enough
    (compiled/copy.py), on this thread by its row copy where many short rows, else numpy's."""
    from ..compiled import copy

    if copy.unavailable() is not None:
        return np.copyto
    if threads > 1:
        return lambda dst, src: copy.copy(dst, src, threads) or copy.copy_rows(dst, src) or \
            np.copyto(dst, src)
    return lambda dst, src: copy.copy_rows(dst, src) or np.copyto(dst, src)


def _place(dst: np.ndarray, x: np.ndarray, copy=np.copyto) -> None:
    """dst[...] = x, unless x is dst's very elements already (written there by its producer)."""
    if x.ctypes.data != dst.ctypes.data or x.strides != dst.strides or x.dtype != dst.dtype:
        copy(dst, x)


def _joined_shape(inputs, axis: int) -> tuple[int, ...]:
    first = inputs[0]
    if not -first.ndim <= axis < first.ndim:
        raise ValueError("Concat: axis out of range")
    axis %= first.ndim
    return first.shape[:axis] + (sum(x.shape[axis] for x in inputs),) + first.shape[axis + 1:]


def _concatenate_into(inputs, axis: int, out: np.ndarray, copy=np.copyto) -> np.ndarray:
    """np.concatenate(inputs, axis, out=out), an input already in its place not copied."""
    first = inputs[0]
    axis = axis + first.ndim if axis < 0 else axis
    if not 0 <= axis < first.ndim or out.ndim != first.ndim or \
            any(x.ndim != first.ndim or x.dtype != out.dtype or
                x.shape[:axis] + x.shape[axis + 1:] != out.shape[:axis] + out.shape[axis + 1:]
                for x in inputs) or sum(x.shape[axis] for x in inputs) != out.shape[axis]:
        raise ValueError("Concat: out does not fit the inputs")
    pre = (slice(None),) * axis
    c = 0
    for x in inputs:
        _place(out[pre + (slice(c, c + x.shape[axis]),)], x, copy)
        c += x.shape[axis]
    return out


def _channels_last_operands(inputs) -> bool:
    from .conv import channels_inner

    first = inputs[0]
    return all(x.ndim == 4 and x.dtype == first.dtype and x.shape[0] == first.shape[0] and
               x.shape[2:] == first.shape[2:] for x in inputs) and \
        any(channels_inner(x) for x in inputs)


def _split(x, axis, sizes):
    axis = axis + x.ndim if axis < 0 else axis
    pre = (slice(None),) * axis
    out = []
    start = 0
    for s in sizes:
        out.append(x[pre + (slice(start, start + s),)])
        start += s
    return tuple(out)


def _even_sizes(dim, n):
    if n <= 0:
        raise ValueError("Split needs at least one output")
    if dim % n:
        raise ValueError(f"cannot split a dimension of {dim} into {n} equal parts")
    return [dim // n] * n


@op("Split", 1, 2, 11)
class Split_11:
    def __init__(self, ctx: KernelContext, *, axis=0, split=None):
        self.axis = axis
        self.split = split
        self.n = ctx.num_outputs

    def __call__(self, input, split=None):  # noqa: A002 - Split-1 takes split as an input too
        sizes = self.split if self.split else (_ints(split) if split is not None else None)
        if not sizes:
            sizes = _even_sizes(input.shape[self.axis], self.n)
        return _split(input, self.axis, sizes)


@op("Split", 13, 18)
class Split:
    def __init__(self, ctx: KernelContext, *, axis=0, num_outputs=None):
        self.axis = axis
        self.num_outputs = num_outputs
        self.n = ctx.num_outputs
        c = ctx.constant(1)
        self.sizes = None if c is None else _ints(c)

    def __call__(self, input, split=None):  # noqa: A002 - the schema's name
        sizes = self.sizes if self.sizes is not None else (
            _ints(split) if split is not None else None)
        if sizes is None:
            dim = input.shape[self.axis]
            if self.num_outputs is not None:
                chunk = -(-dim // self.num_outputs)
                sizes = [min(chunk, max(dim - i * chunk, 0)) for i in range(self.num_outputs)]
            else:
                sizes = _even_sizes(dim, self.n)
        return _split(input, self.axis, sizes)


# -- Slice ------------------------------------------------------------------------------------


def _slice_key(shape, starts, ends, axes, steps):
    key = [slice(None)] * len(shape)
    r = len(shape)
    if axes is None:
        axes = range(len(starts))
    if steps is None:
        steps = [1] * len(starts)
    for a, s, e, st in zip(axes, starts, ends, steps, strict=True):
        if a < 0:
            a += r
        if st < 0 and s < 0:
            # python clamps an under-range start to "before the first element" (empty);
            # ONNX clamps it to element 0
            s = max(s + shape[a], 0)
        key[a] = slice(s, e, st)
    return tuple(key)


@op("Slice", 1)
def Slice_1(data, *, starts, ends, axes=None):
    return data[_slice_key(data.shape, starts, ends, axes, None)]


@op("Slice", 10, 11, 13)
class Slice:
    def __init__(self, ctx: KernelContext):
        self.const = all(_is_const(ctx, i) for i in range(1, 5))
        if self.const:
            vals = [ctx.constant(i) for i in range(1, 5)]
            self.args = [None if v is None else _ints(v) for v in vals]
            starts, _, axes, steps = self.args
            rank = _rank(ctx)
            self.exact = rank is not None  # a key for a known rank; else one for any rank
            steps_ = steps or [1] * len(starts)
            # the key is fixed unless a negative step meets a negative start (needs the dim)
            simple = all(st > 0 or s >= 0 for s, st in zip(starts, steps_, strict=True))
            if rank is None and (axes is None or all(a >= 0 for a in axes)):
                rank = max(axes) + 1 if axes else len(starts)  # trailing dims: implicit
            self.key = _slice_key((0,) * rank, *self.args) if simple and rank is not None else None

    def __call__(self, data, starts, ends, axes=None, steps=None):
        if self.const:
            if self.key is not None and (
                    len(self.key) == data.ndim or not self.exact and len(self.key) < data.ndim):
                return data[self.key]
            return data[_slice_key(data.shape, *self.args)]
        return data[_slice_key(
            data.shape, _ints(starts), _ints(ends),
            None if axes is None else _ints(axes), None if steps is None else _ints(steps))]


# -- Gather family ----------------------------------------------------------------------------


@op("Gather", 1, 11, 13)
def Gather(data, indices, *, axis=0):
    return data.take(as_intp(indices), axis=axis)  # the method: np.take's wrapper costs ~1 us


Gather.calls_blas = False  # (InferenceSession's runner: no BLAS hold for it)


def _along_axis_index(indices, axis):
    """Full fancy index that reads ``indices`` along ``axis`` (the other dims: arange)."""
    axis = axis + indices.ndim if axis < 0 else axis
    grids = list(np.ogrid[tuple(slice(0, d) for d in indices.shape)])
    grids[axis] = indices
    return tuple(grids)


@op("GatherElements", 11, 13)
def GatherElements(data, indices, *, axis=0):
    return data[_along_axis_index(indices, axis)]


@op("GatherND", 11, 12, 13)
def GatherND(data, indices, *, batch_dims=0):
    k = indices.shape[-1]
    b = batch_dims
    if b == 0:
        return data[tuple(np.moveaxis(indices, -1, 0))]
    batch = math.prod(data.shape[:b])
    d2 = data.reshape((batch,) + data.shape[b:])
    ind = indices.reshape(batch, -1, k)
    key = (np.arange(batch)[:, None],) + tuple(ind[..., i] for i in range(k))
    out = d2[key]
    return out.reshape(indices.shape[:-1] + data.shape[b + k:])


def _scatter_into(out, key, updates, reduction):
    if reduction == "none":
        out[key] = updates
    elif reduction == "add":
        np.add.at(out, key, updates)
    elif reduction == "mul":
        np.multiply.at(out, key, updates)
    elif reduction == "max":
        np.maximum.at(out, key, updates)
    elif reduction == "min":
        np.minimum.at(out, key, updates)
    else:
        raise ValueError(f"unknown reduction '{reduction}'")
    return out


@op("ScatterND", 11, 13, 16, 18)
def ScatterND(data, indices, updates, *, reduction="none"):
    key = tuple(np.moveaxis(indices, -1, 0))
    return _scatter_into(data.copy(), key, updates, reduction)


@op("ScatterElements", 11, 13, 16, 18)
def ScatterElements(data, indices, updates, *, axis=0, reduction="none"):
    return _scatter_into(data.copy(), _along_axis_index(indices, axis), updates, reduction)


@op("Scatter", 9, 11)
def Scatter(data, indices, updates, *, axis=0):
    return ScatterElements(data, indices, updates, axis=axis)


# -- Expand, Tile, constants ------------------------------------------------------------------


@op("Expand", 8, 13)
def Expand(input, shape):  # noqa: A002 - the schema's name
    out_shape = np.broadcast_shapes(input.shape, tuple(_ints(shape)))
    if out_shape == input.shape:
        return input
    out = np.empty(out_shape, dtype=input.dtype)
    out[...] = input  # materialized: a broadcast view would be read-only and zero-strided
    return out


@op("Tile", 6, 13)
def Tile(input, repeats):  # noqa: A002 - the schema's name
    return np.tile(input, _ints(repeats))


@op("Tile", 1)
def Tile_1(input, tiles, axis):  # noqa: A002 - the schema's name
    reps = [1] * input.ndim
    reps[int(axis)] = int(tiles)
    return np.tile(input, reps)


@op("ConstantOfShape", 9, 20, 21, 23, 24, 25)
def ConstantOfShape(input, *, value=None):  # noqa: A002 - the schema's name
    shape = _ints(input)
    if value is None:
        return np.zeros(shape, dtype=np.float32)
    return np.full(shape, value.reshape(-1)[0], dtype=value.dtype)


@op("Constant", 1, 9, 11, 12, 13, 19, 21, 23, 24, 25)
class Constant:
    def __init__(self, ctx: KernelContext, *, value=None, sparse_value=None, value_float=None,
                 value_floats=None, value_int=None, value_ints=None, value_string=None,
                 value_strings=None):
        if value is not None:
            v = np.asarray(value)
        elif sparse_value is not None:
            v = np.asarray(sparse_value)
        elif value_float is not None:
            v = np.array(value_float, dtype=np.float32)
        elif value_floats is not None:
            v = np.array(value_floats, dtype=np.float32)
        elif value_int is not None:
            v = np.array(value_int, dtype=INT64)
        elif value_ints is not None:
            v = np.array(value_ints, dtype=INT64)
        elif value_string is not None:
            v = np.array(value_string, dtype=object)
        elif value_strings is not None:
            v = np.array(value_strings, dtype=object)
        else:
            raise ValueError("Constant has no value attribute")
        if v.flags.writeable:
            v = v.copy()
            v.flags.writeable = False  # shared by every run
        self.v = v

    def __call__(self):
        return self.v


@op("Range", 11, 27)
def Range(start, limit, delta):
    dt = start.dtype
    s, l_, d = start.item(), limit.item(), delta.item()
    n = max(int(math.ceil((l_ - s) / d)), 0)
    if dt.kind in "iu":
        return np.arange(s, s + n * d, d, dtype=dt)[:n]
    # onnxruntime adds delta step by step in the element type; cumsum does the same
    out = np.full(n, d, dtype=dt)
    if n:
        out[0] = s
    return np.cumsum(out, dtype=dt)


@op("EyeLike", 9, 22)
def EyeLike(input, *, dtype=None, k=0):  # noqa: A002 - the schema's name
    dt = input.dtype if dtype is None else np_dtype(dtype)
    return np.eye(input.shape[0], input.shape[1], k=k, dtype=dt)


@op("Trilu", 14)
def Trilu(input, k=None, *, upper=1):  # noqa: A002 - the schema's name
    kk = 0 if k is None else int(k.reshape(-1)[0])
    return np.triu(input, kk) if upper else np.tril(input, kk)


# -- Pad --------------------------------------------------------------------------------------


def _pad(data, pads, mode, value, axes=None):
    r = data.ndim
    if axes is None:
        n = len(pads) // 2
        axes = list(range(n))
    else:
        axes = [a + r if a < 0 else a for a in axes]
        n = len(axes)
    before = [0] * r
    after = [0] * r
    for i, a in enumerate(axes):
        before[a] = pads[i]
        after[a] = pads[i + n]
    if any(p < 0 for p in before + after):  # negative pads crop
        key = tuple(slice(-b if b < 0 else 0, d + a if a < 0 else d)
                    for b, a, d in zip(before, after, data.shape, strict=True))
        data = data[key]
        before = [max(b, 0) for b in before]
        after = [max(a, 0) for a in after]
    if not any(before) and not any(after):
        return data
    if mode == "constant":
        shape = tuple(d + b + a for d, b, a in zip(data.shape, before, after, strict=True))
        out = np.full(shape, value, dtype=data.dtype)
        key = tuple(slice(b, b + d) for b, d in zip(before, data.shape, strict=True))
        out[key] = data
        return out
    if mode in ("reflect", "edge", "wrap"):
        # One gather per padded axis with cached indices: np.pad's Python costs ~100 µs a
        # call, the whole of a small streaming model's STFT padding (np.pad pads axis by
        # axis from the padded result too, so the gathers give the same values).
        for a, (b, e) in enumerate(zip(before, after, strict=True)):
            if b or e:
                data = np.take(data, _pad_indices(mode, data.shape[a], b, e), axis=a)
        return data
    raise ValueError(f"unsupported pad mode '{mode}'")


def _pad_gathers(shape: tuple[int, ...], pads: list[int], mode: str, axes: list[int] | None
                 ) -> list[tuple[int, np.ndarray]] | None:
    """The gathers (axis, indices) that _pad makes for data of ``shape`` in a gathering mode
    with non-negative ``pads``; None where it would raise (left to it, for its error)."""
    r = len(shape)
    axes = list(range(len(pads) // 2)) if axes is None else [a + r if a < 0 else a
                                                             for a in axes]
    n = len(axes)
    if len(pads) != 2 * n or any(not 0 <= a < r for a in axes):
        return None
    before, after = [0] * r, [0] * r
    for i, a in enumerate(axes):
        before[a], after[a] = pads[i], pads[i + n]
    gathers = []
    for a, (b, e) in enumerate(zip(before, after, strict=True)):
        if b or e:
            if mode == "reflect" and shape[a] < 2 or shape[a] == 0:
                return None
            gathers.append((a, _pad_indices(mode, shape[a], b, e)))
    return gathers


@functools.lru_cache(maxsize=256)
def _pad_indices(mode: str, n: int, before: int, after: int) -> np.ndarray:
    """Which element of an axis of length ``n`` each position of its padded version takes."""
    idx = np.pad(np.arange(n, dtype=np.intp), (before, after), mode=mode)
    idx.flags.writeable = False
    return idx


def _pad_value(data, value):
    if value is None:
        return data.dtype.type(0) if data.dtype != object else ""
    v = np.asarray(value).reshape(-1)
    return v[0] if v.size else data.dtype.type(0)


@op("Pad", 1)
def Pad_1(data, *, mode="constant", paddings, value=0.0):
    return _pad(data, list(paddings), mode, np.asarray(value).astype(data.dtype))


@op("Pad", 2)
def Pad_2(data, *, mode="constant", pads, value=0.0):
    return _pad(data, list(pads), mode, np.asarray(value).astype(data.dtype))


@op("Pad", 11, 13, 18, 19, 21, 23, 24, 25)
class Pad:
    def __init__(self, ctx: KernelContext, *, mode="constant"):
        self.mode = mode
        self.pads = None if ctx.constant(1) is None else _ints(ctx.constant(1))
        self.axes = None if ctx.constant(3) is None else _ints(ctx.constant(3))
        # constant pads and axes, a gathering mode: data's shape -> its gathers (axis,
        # indices), as _pad makes them (a streaming model's STFT padding: one a call)
        self.gathers: dict[tuple[int, ...], list] | None = None
        if self.pads is not None and (self.axes is not None or not ctx.has_input(3)) and \
                mode in ("reflect", "edge", "wrap") and min(self.pads, default=0) >= 0:
            self.gathers = {}

    def __call__(self, data, pads, constant_value=None, axes=None):
        gathers = self.gathers
        if gathers is not None:
            plan = gathers.get(data.shape)
            if plan is None and len(gathers) < 64:
                plan = gathers[data.shape] = _pad_gathers(data.shape, self.pads, self.mode,
                                                          self.axes)
            if plan is not None:
                for a, idx in plan:
                    data = data.take(idx, axis=a)
                return data
        p = self.pads if self.pads is not None else _ints(pads)
        a = self.axes if self.axes is not None else (None if axes is None else _ints(axes))
        return _pad(data, p, self.mode, _pad_value(data, constant_value), a)


# -- index-producing and reordering ops -------------------------------------------------------


@op("NonZero", 9, 13)
def NonZero(X):
    if X.ndim == 0:
        return np.zeros((1, 1 if X else 0), dtype=INT64)  # a scalar reads as shape [1]
    return np.array(np.nonzero(X), dtype=INT64).reshape(X.ndim, -1)


@op("OneHot", 9, 11, 28)
def OneHot(indices, depth, values, *, axis=-1):
    d = int(np.asarray(depth).reshape(-1)[0])
    idx = indices.astype(INT64) if indices.dtype != INT64 else indices
    idx = np.where(idx < 0, idx + d, idx)
    r = idx.ndim + 1
    axis = axis + r if axis < 0 else axis
    shape = [1] * r
    shape[axis] = d
    rng = np.arange(d, dtype=INT64).reshape(shape)
    mask = np.expand_dims(idx, axis) == rng
    return np.where(mask, values[1], values[0])


@op("Compress", 9, 11, 28)
def Compress(input, condition, *, axis=None):  # noqa: A002 - the schema's name
    return np.compress(condition.reshape(-1), input, axis=axis)


@op("DepthToSpace", 1, 11, 13, 28)
def DepthToSpace(input, *, blocksize, mode="DCR"):  # noqa: A002 - the schema's name
    b, c, h, w = input.shape
    bs = blocksize
    if mode == "DCR":
        t = input.reshape(b, bs, bs, c // (bs * bs), h, w).transpose(0, 3, 4, 1, 5, 2)
    else:
        t = input.reshape(b, c // (bs * bs), bs, bs, h, w).transpose(0, 1, 4, 2, 5, 3)
    return t.reshape(b, c // (bs * bs), h * bs, w * bs)


@op("SpaceToDepth", 1, 13, 28)
def SpaceToDepth(input, *, blocksize, mode="DCR"):  # noqa: A002 - the schema's name
    b, c, h, w = input.shape
    bs = blocksize
    t = input.reshape(b, c, h // bs, bs, w // bs, bs)
    t = t.transpose(0, 3, 5, 1, 2, 4) if mode == "DCR" else t.transpose(0, 1, 3, 5, 2, 4)
    return t.reshape(b, c * bs * bs, h // bs, w // bs)


@op("ReverseSequence", 10, 28)
def ReverseSequence(input, sequence_lens, *, batch_axis=1, time_axis=0):  # noqa: A002
    x = np.moveaxis(input, (batch_axis, time_axis), (0, 1))
    nb, nt = x.shape[:2]
    t = np.arange(nt, dtype=INT64)[None, :]
    lens = sequence_lens.astype(INT64).reshape(-1, 1)
    src = np.where(t < lens, lens - 1 - t, t)
    out = x[np.arange(nb)[:, None], src]
    return np.moveaxis(out, (0, 1), (batch_axis, time_axis))


@op("Unique", 11, 28)
def Unique(X, *, axis=None, sorted=1):  # noqa: A002 - the schema's name
    flat = X.reshape(-1) if axis is None else X
    y, idx, inv, counts = np.unique(flat, return_index=True, return_inverse=True,
                                    return_counts=True, axis=axis)
    inv = inv.reshape(-1)
    if not sorted:
        order = np.argsort(idx, kind="stable")  # first-occurrence order
        rank = np.empty_like(order)
        rank[order] = np.arange(order.size)
        y = np.take(y, order, axis=0 if axis is None else axis)
        idx, counts, inv = idx[order], counts[order], rank[inv]
    return y, idx.astype(INT64), inv.astype(INT64), counts.astype(INT64)


__all__ = ["Identity"]
