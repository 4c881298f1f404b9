"""Normalizations (batch, instance, layer, group, LRN, mean-variance) and Dropout."""

from __future__ import annotations

import math
import threading

import numpy as np

from ....dtypes import compute_dtype, np_dtype
from ..kernels import KernelContext, op, text_attribute
from ..parallel import threads_for
from ..random_state import generator
from .activation import Relu


def _stat_dtype(dtype: np.dtype) -> np.dtype:
    """Statistics are kept in float32 at least (float64 for float64 data)."""
    return np.dtype(np.float64) if dtype == np.float64 else np.dtype(np.float32)


def _per_channel(p: np.ndarray, X: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """A (C,) parameter shaped to broadcast over (N, C, ...); (C, D1, ...) ones as they are."""
    p = p.astype(dtype, copy=False)
    C = X.shape[1]
    if p.size == C:
        return p.reshape((C,) + (1,) * (X.ndim - 2))
    return p.reshape(X.shape[1:])  # BatchNormalization spatial=0: one value per element


def compiled_layer_norm():
    """compiled/layer_norm (rows in one kernel call, ranges of rows on the intra-op
    threads), or None where it does not run here: asked once, when a kernel is prepared."""
    from ..compiled import layer_norm

    return layer_norm if layer_norm.unavailable() is None else None


def rows_of(out: np.ndarray | None, shape: tuple[int, ...], n: int) -> np.ndarray | None:
    """The executor's buffer ``out`` (memory.py) as the C-contiguous (rows, n) float32 rows
    compiled/layer_norm writes, or None where it is not one."""
    if out is None or out.shape != shape or out.dtype != np.float32 or \
            not out.flags.c_contiguous:
        return None
    return out.reshape(-1, n)


UNBOUND = object()  # a layer norm kernel's ``bound`` before its first call


def bound_constants(kernel, gamma, beta, bias):
    """``kernel.bound``, the compiled/layer_norm.Bound of its parameters, where ``gamma``,
    ``beta`` and ``bias`` are the arrays it bound (constants come back as the same arrays
    every run), else None. Bound at the first call (``kernel.bound`` starts as UNBOUND);
    computed parameters, or none compiled, never bind."""
    bound = kernel.bound
    if bound is UNBOUND:
        bound = kernel.bound = None if kernel.compiled is None else \
            kernel.compiled.bind(gamma, beta, bias, kernel.epsilon)
    if bound is not None and gamma is bound.gamma and beta is bound.beta and bias is bound.bias:
        return bound
    return None


def fits_compiled(X: np.ndarray, trailing: tuple[int, ...], *params) -> bool:
    """Whether compiled/layer_norm takes float32 ``X`` normalized over its ``trailing`` axes
    with these parameters (float32, one value per normalized element, or None)."""
    if X.dtype != np.float32 or X.size == 0:
        return False
    n = int(np.prod(trailing))
    return all(p is None or (p.dtype == np.float32 and p.size == n and p.ndim <= len(trailing)
                             and p.shape == trailing[len(trailing) - p.ndim:])
               for p in params)


@op("BatchNormalization", 1, 6, 7, 9, 14, 15)
class BatchNormalization:
    """Inference uses the given statistics. Training (``training_mode=1`` from opset 14,
    extra outputs before it) normalizes with the batch statistics and also returns the updated
    running ones (and, before opset 14, the batch mean and inverse standard deviation)."""

    def __init__(self, ctx: KernelContext, *, epsilon=1e-5, momentum=0.9, training_mode=0,
                 spatial=1, is_test=0, consumed_inputs=None) -> None:
        self.epsilon = float(epsilon)
        self.momentum = float(momentum)
        if ctx.opset >= 14:
            self.training = bool(training_mode)
        else:
            self.training = any(o.name for o in ctx.node.outputs[1:])
        self.legacy_outputs = ctx.opset < 14
        # folded y = x * a + b when every parameter is a constant
        self.folded = None
        self.threads = threads_for(ctx)  # a channels-last scale's rows on spin.py's workers
        params = [ctx.constant(i) for i in range(1, 5)]
        if not self.training and all(p is not None for p in params):
            self.folded = self._fold(*params)

    def _fold(self, scale, B, mean, var):
        wide = any(p.dtype == np.float64 for p in (scale, B, mean, var))
        sd = np.dtype(np.float64) if wide else np.dtype(np.float32)
        a = scale.astype(sd) / np.sqrt(var.astype(sd) + sd.type(self.epsilon))
        return a, B.astype(sd) - mean.astype(sd) * a

    # the executor's buffer for the output (memory.py); training mode's several outputs
    # never get one (it hands buffers to one-output steps only)
    accepts_out = True
    relu = False  # FusedBatchNormalization's Relu after

    def __call__(self, X, scale, B, input_mean, input_var, *, out=None):
        cdt = compute_dtype(X.dtype)
        if self.training:
            return self._train(X, scale, B, input_mean, input_var)
        a, b = self.folded if self.folded is not None else self._fold(
            scale, B, input_mean, input_var
        )
        if X.ndim == 4 and X.dtype == cdt and a.size == X.shape[1] < 4096:
            # (conv.py's layout helpers, imported here: a LayerNormalization model loads this
            # module without convolutions; a 4-D BatchNormalization's model has them loaded)
            from .conv import channels_inner, scale_shift_channels

            if channels_inner(X):
                return scale_shift_channels(X, a.astype(cdt, copy=False),
                                            b.astype(cdt, copy=False), out, self.threads,
                                            relu=self.relu)
        if out is not None and X.dtype == cdt and out.dtype == cdt and out.shape == X.shape:
            Y = np.multiply(X, _per_channel(a, X, cdt), out=out)
            Y += _per_channel(b, X, cdt)
            return Relu(Y, out=Y) if self.relu else Y
        Y = X.astype(cdt, copy=False) * _per_channel(a, X, cdt)
        Y += _per_channel(b, X, cdt)
        if self.relu:
            Relu(Y, out=Y)
        return Y.astype(X.dtype, copy=False)

    def _train(self, X, scale, B, input_mean, input_var):
        sd = _stat_dtype(X.dtype)
        axes = (0,) + tuple(range(2, X.ndim))
        Xs = X.astype(sd, copy=False)
        mean = Xs.mean(axis=axes)
        centered = Xs - mean.reshape((-1,) + (1,) * (X.ndim - 2))
        var = np.mean(centered * centered, axis=axes)
        a = scale.astype(sd) / np.sqrt(var + sd.type(self.epsilon))
        Y = centered * _per_channel(a, X, sd)
        Y += _per_channel(B, X, sd)
        m = sd.type(self.momentum)
        running_mean = input_mean.astype(sd) * m + mean * (1 - m)
        running_var = input_var.astype(sd) * m + var * (1 - m)
        stat_dtype = input_mean.dtype
        outs = (Y.astype(X.dtype, copy=False), running_mean.astype(stat_dtype),
                running_var.astype(stat_dtype))
        if self.legacy_outputs:  # saved_mean and, as onnxruntime returns it, 1 / saved_std
            inv_std = 1 / np.sqrt(var + sd.type(self.epsilon))
            outs += (mean.astype(stat_dtype), inv_std.astype(stat_dtype))
        return outs


# Rows up to this long have their sums taken as a BLAS product with ones (several times faster
# than numpy's mean); longer ones (instance norms of whole images) keep numpy's pairwise sum.
_BLAS_ROW_SUM_MAX = 16384


def _standardize_rows(X: np.ndarray, rows: int, eps: float, sd: np.dtype):
    """X seen as (rows, n), each row made zero-mean and unit-variance in ``sd``.

    Returns (standardized rows, mean, 1 / std); the variance is one fused sum of squares.
    """
    if rows == 0:  # an empty batch: no rows, no statistics
        return np.empty((0, 0), sd), np.empty(0, sd), np.empty(0, sd)
    x = X.astype(sd, copy=False).reshape(rows, -1)
    n = x.shape[1]
    if x.size and n <= _BLAS_ROW_SUM_MAX:
        mean = x @ np.ones(n, sd)
        mean *= sd.type(1.0 / n)
    else:
        mean = x.mean(axis=1)
    centered = x - mean[:, None]
    var = np.einsum("ij,ij->i", centered, centered)
    var /= sd.type(n)
    var += sd.type(eps)
    inv_std = np.sqrt(var, out=var)
    np.reciprocal(inv_std, out=inv_std)
    centered *= inv_std[:, None]
    return centered, mean, inv_std



@op("FusedBatchNormalization", 1, domain="ai.onnxrun")
class FusedBatchNormalization(BatchNormalization):
    """onnxrun's layout level's BatchNormalization at inference + Relu
    (optimize/layout/batch_norm_relu.py): on a channels-last input one compiled pass
    (compiled/scale_shift.py's relu variant), else the BatchNormalization then Relu in place;
    the bits of the two nodes either way. ``activation``: "Relu" (the only one made)."""

    def __init__(self, ctx: KernelContext, *, activation="Relu", epsilon=1e-5,
                 momentum=0.9) -> None:
        activation = text_attribute(activation)
        if activation != "Relu":
            raise ValueError(f"FusedBatchNormalization: activation must be 'Relu', got "
                             f"{activation!r}")
        super().__init__(ctx, epsilon=epsilon, momentum=momentum, training_mode=0)
        self.training = False  # one output, inference only (what the pass fuses)
        self.legacy_outputs = False
        self.relu = True

@op("InstanceNormalization", 1, 6, 22)
class InstanceNormalization:
    """Each (image, channel)'s values normalized, times scale[c] plus B[c]: float32 rows on
    compiled/layer_norm's kernel (its per-row affine; GroupNormalization as PyTorch exports
    it, a Reshape to (N, groups, -1) around this, runs here too), else numpy's passes."""

    def __init__(self, ctx: KernelContext, *, epsilon=1e-5) -> None:
        self.epsilon = float(epsilon)
        self.threads = threads_for(ctx)
        self.compiled = compiled_layer_norm()
        self.fn = None if self.compiled is None else self.compiled.function()

    accepts_out = True  # the executor's buffer for Y (memory.py): the compiled kernel's

    def __call__(self, input, scale, B, *, out=None):  # noqa: A002 - the schema's name
        X = input
        if self.compiled is not None and X.dtype == np.float32 and X.ndim >= 2 and \
                X.flags.c_contiguous and scale.size == X.shape[1] == B.size and X.size:
            N, rows, n = X.shape[0], X.shape[0] * X.shape[1], math.prod(X.shape[2:])
            given = rows_of(out, X.shape, n)
            Y = self.compiled.instance_norm(  # (scale and B per row: repeated per image)
                X.reshape(rows, n), np.tile(scale.astype(np.float32).reshape(-1), N),
                np.tile(B.astype(np.float32).reshape(-1), N), self.epsilon, self.threads,
                self.fn, given)
            return out if given is not None else Y.reshape(X.shape)
        return _instance_norm(X, scale, B, self.epsilon)


def _instance_norm(X, scale, B, epsilon):
    """InstanceNormalization on numpy: the statistics in float32 at least."""
    sd = _stat_dtype(X.dtype)
    Y, _, _ = _standardize_rows(X, X.shape[0] * X.shape[1], epsilon, sd)
    Y = Y.reshape(X.shape)
    Y *= _per_channel(scale, X, sd)
    Y += _per_channel(B, X, sd)
    return Y.astype(X.dtype, copy=False)


@op("LayerNormalization", 17)
class LayerNormalization:
    def __init__(self, ctx: KernelContext, *, axis=-1, epsilon=1e-5, stash_type=1) -> None:
        self.axis = int(axis)
        self.epsilon = float(epsilon)
        self.stat_type = np_dtype(int(stash_type))  # Mean and InvStdDev are stash_type
        self.want_stats = ctx.output_used(1) or ctx.output_used(2)
        self.threads = threads_for(ctx)
        self.compiled = compiled_layer_norm()
        self.fn = None if self.compiled is None else self.compiled.function()
        # compiled/layer_norm.Bound of the constants (bound_constants), for the last axis
        self.bound = UNBOUND

    # the executor's buffer for Y (memory.py), where the node has no other output: the
    # compiled kernel writes it
    accepts_out = True

    def __call__(self, X, Scale, B=None, *, out=None):
        last = X.ndim and self.axis in (-1, X.ndim - 1)
        bound = bound_constants(self, Scale, B, None) if last else None
        if bound is not None and X.dtype == np.float32 and X.shape[-1] == bound.n and \
                X.flags.c_contiguous:
            n = bound.n
            Y, mean, inv_std, _ = bound.run(X.reshape(-1, n), None, False, self.threads,
                                            rows_of(out, X.shape, n))
            if not self.want_stats:
                return Y.reshape(X.shape), None, None
            stat_shape = X.shape[:-1] + (1,)
            return (Y.reshape(X.shape), mean.reshape(stat_shape).astype(self.stat_type),
                    inv_std.reshape(stat_shape).astype(self.stat_type))
        axis = self.axis + X.ndim if self.axis < 0 else self.axis
        sd = _stat_dtype(X.dtype)
        outer = X.shape[:axis]
        if 0 in X.shape[axis:]:  # as onnxruntime: nothing to normalize over
            raise ValueError(f"LayerNormalization: the size of X.shape[axis:] "
                             f"{list(X.shape[axis:])} must be at least 1, got 0")
        if self.compiled is not None and fits_compiled(X, X.shape[axis:], Scale, B):
            n = int(np.prod(X.shape[axis:]))
            Y, mean, inv_std, _ = self.compiled.layer_norm(
                np.ascontiguousarray(X).reshape(-1, n), Scale, B, self.epsilon,
                threads=self.threads, fn=self.fn, out=rows_of(out, X.shape, n))
            Y = Y.reshape(X.shape)
        else:
            Y, mean, inv_std = _standardize_rows(X, int(np.prod(outer)), self.epsilon, sd)
            Y = Y.reshape(X.shape)
            Y *= Scale.astype(sd, copy=False)
            if B is not None:
                Y += B.astype(sd, copy=False)
            Y = Y.astype(X.dtype, copy=False)
        if not self.want_stats:
            return Y, None, None
        stat_shape = outer + (1,) * (X.ndim - axis)
        return (Y, mean.reshape(stat_shape).astype(self.stat_type),
                inv_std.reshape(stat_shape).astype(self.stat_type))


def _group_norm(X, scale, bias, num_groups, epsilon, sd, per_group: bool):
    N, C = X.shape[:2]
    G = int(num_groups)
    if C % G:
        raise ValueError(f"channels {C} are not divisible by num_groups {G}")
    Y, _, _ = _standardize_rows(X, N * G, epsilon, sd)
    Y = Y.reshape(X.shape)
    if per_group:  # opset 18: one scale/bias per group, shared by the group's channels
        scale = np.repeat(scale.astype(sd), C // G)
        bias = np.repeat(bias.astype(sd), C // G)
    Y *= _per_channel(scale, X, sd)
    Y += _per_channel(bias, X, sd)
    return Y.astype(X.dtype, copy=False)


@op("GroupNormalization", 18)
def GroupNormalization18(X, scale, bias, *, epsilon=1e-5, num_groups):
    return _group_norm(X, scale, bias, num_groups, epsilon, _stat_dtype(X.dtype), True)


@op("GroupNormalization", 21)
def GroupNormalization(X, scale, bias, *, epsilon=1e-5, num_groups, stash_type=1):
    sd = _stat_dtype(X.dtype) if int(stash_type) == 1 else compute_dtype(X.dtype)
    return _group_norm(X, scale, bias, num_groups, epsilon, sd, False)


@op("LRN", 1, 13)
def LRN(X, *, alpha=1e-4, beta=0.75, bias=1.0, size):
    size = int(size)
    cdt = compute_dtype(X.dtype)
    Xc = X.astype(cdt, copy=False)
    sq = Xc * Xc
    before = (size - 1) // 2  # the window is [c - before, c + size - 1 - before]
    C = X.shape[1]
    padded = np.zeros((X.shape[0], C + size - 1) + X.shape[2:], dtype=cdt)
    padded[:, before:before + C] = sq
    # sum of squares over the channel window: one shifted slice per window position
    acc = padded[:, 0:C].copy()
    for i in range(1, size):
        acc += padded[:, i:i + C]
    acc *= cdt.type(alpha / size)
    acc += cdt.type(bias)
    Y = Xc / (acc ** cdt.type(beta))
    return Y.astype(X.dtype, copy=False)


@op("MeanVarianceNormalization", 9, 13)
def MeanVarianceNormalization(X, *, axes=(0, 2, 3)):
    axes = tuple(int(a) for a in axes)
    if X.size == 0:  # nothing to normalize (numpy would warn about an empty mean)
        return np.empty(X.shape, X.dtype)
    sd = _stat_dtype(X.dtype)
    Xs = X.astype(sd, copy=False)
    centered = Xs - Xs.mean(axis=axes, keepdims=True)
    std = np.sqrt(np.mean(centered * centered, axis=axes, keepdims=True))
    centered /= std + sd.type(1e-9)
    return centered.astype(X.dtype, copy=False)


def _ones_mask(wanted: bool, X: np.ndarray, legacy: bool):
    """The inference mask (everything kept), only when something reads it."""
    if not wanted:
        return None
    return np.ones(X.shape, dtype=X.dtype if legacy else bool)


@op("Dropout", 1, 6, 7, 10)
class DropoutLegacy:
    """Before opset 12 Dropout has no training input: an inference engine passes data through.
    The mask has the data's type before opset 10 and is bool from then on."""

    def __init__(self, ctx: KernelContext, *, ratio=0.5, is_test=0, consumed_inputs=None) -> None:
        self.want_mask = ctx.output_used(1)
        self.legacy_mask = ctx.opset < 10

    def __call__(self, data):
        return data, _ones_mask(self.want_mask, data, self.legacy_mask)


@op("Dropout", 12, 13, 22)
class Dropout:
    """Training mode draws the mask from numpy's legacy ``RandomState(seed).uniform`` stream
    when the node has a seed (as the ONNX reference does): one stream per node and session,
    continued across runs, under a lock since runs may be concurrent."""

    def __init__(self, ctx: KernelContext, *, seed=None) -> None:
        self.seed = seed
        self.want_mask = ctx.output_used(1)
        self._state = None if seed is None else np.random.RandomState(int(seed))
        self._lock = threading.Lock()

    def _keep(self, shape: tuple[int, ...], r: float) -> np.ndarray:
        if self._state is None:
            return generator(None).random(shape) >= r
        with self._lock:
            return self._state.uniform(0.0, 1.0, shape) >= r

    def __call__(self, data, ratio=None, training_mode=None):
        r = 0.5 if ratio is None else float(np.asarray(ratio))
        if training_mode is None or not bool(np.asarray(training_mode)) or r == 0:
            return data, _ones_mask(self.want_mask, data, False)
        if not 0 <= r < 1:
            if r == 1:
                return np.zeros_like(data), np.zeros(data.shape, dtype=bool)
            raise ValueError(f"ratio must be in [0, 1), got {r}")
        mask = self._keep(data.shape, r)
        cdt = compute_dtype(data.dtype)
        out = data.astype(cdt, copy=False) * mask
        out *= cdt.type(1.0 / (1.0 - r))
        return out.astype(data.dtype, copy=False), mask
