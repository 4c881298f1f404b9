"""com.microsoft transformer operators written by onnxruntime's optimizer and by its
transformers tooling: the (Skip)(Simplified)LayerNormalization family, Attention (packed QKV
weights), MultiHeadAttention, GroupQueryAttention, RotaryEmbedding and
EmbedLayerNormalization.

All attention variants reduce to ``attention.attend`` (batched over heads, grouped-query
aware) with an additive bias built from their mask formats.
"""

from __future__ import annotations

import math
import weakref
from typing import NamedTuple

import numpy as np

from .....errors import InvalidArgument
from ... import blas
from ...kernels import KernelContext, op
from ...parallel import threads_for
from ..attention import (
    BIASED,
    LOG2E,
    PROBS,
    add_bias,
    attend,
    attend_exp2,
    compute_dtype,
    from_heads,
    neg_inf_where_not,
    rms_normalize,
    rotate,
    softmax_,
    to_heads,
)
from ..linalg import packed_weights, run_packed
from ..normalization import (
    UNBOUND,
    LayerNormalization,
    bound_constants,
    compiled_layer_norm,
    fits_compiled,
    rows_of,
)

MS = "com.microsoft"

# onnxruntime's own LayerNormalization schema (ai.onnx version 1, before ONNX adopted the
# operator at version 17) has the semantics of the standard one
op("LayerNormalization", 1)(LayerNormalization)
op("LayerNormalization", 1, domain=MS)(LayerNormalization)


def _stat_dtype(dtype: np.dtype) -> np.dtype:
    return np.dtype(np.float64) if dtype == np.float64 else np.dtype(np.float32)


def _layer_norm(x: np.ndarray, gamma, beta, epsilon: float, out: np.ndarray | None = None):
    """Layer normalization over the last axis of the float array ``x``, into ``out`` (which may
    be ``x``; a new array by default). Returns (normalized, mean, inv_std) with the statistics
    kept as (..., 1). Five passes over the data: the row sums as a BLAS product with ones, the
    sums of squares as an einsum, no temporary array."""
    sd = x.dtype
    n = x.shape[-1]
    if x.size == 0:  # no rows, or empty rows (whose statistics are NaN)
        mean = x.mean(axis=-1, keepdims=True)
        y = np.subtract(x, mean, out=out)
        var = np.mean(np.square(y), axis=-1, keepdims=True)
    else:
        mean = (x.reshape(-1, n) @ np.ones(n, sd)).reshape(x.shape[:-1] + (1,))
        mean *= sd.type(1.0 / n)
        y = np.subtract(x, mean, out=out)
        yr = y.reshape(-1, n)
        var = np.einsum("ij,ij->i", yr, yr).reshape(mean.shape)
        var *= sd.type(1.0 / n)
    var += sd.type(epsilon)
    inv = np.sqrt(var, out=var)
    np.reciprocal(inv, out=inv)
    y *= inv
    y *= gamma.astype(sd, copy=False)
    if beta is not None:
        y += beta.astype(sd, copy=False)
    return y, mean, inv


# onnxruntime's float32 RMS normalizations, operation for operation (an LLM's layers feed
# them to int8-quantized products, where a last-bit difference grows: see
# compiled/nbits_gemm.py). SimplifiedLayerNormalization (onnxruntime 1.32, x86-64) sums the
# squares in 8 lanes with fused multiply-adds, the lanes added as a tree, and multiplies by
# the reciprocal; SkipSimplifiedLayerNormalization sums them one by one (square, then add)
# and divides. Both: sqrt(sum / n + epsilon) in float32, then the scale.


def _fma_lanes_sum_of_squares(x: np.ndarray) -> np.ndarray:
    """Rows of float32 ``x`` (n a multiple of 8): acc = fma(x, x, acc) over 8 lanes, then
    ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)); float64 holds each exact product and
    the sum, rounded once to float32 as a fused multiply-add is."""
    rows, n = x.shape
    acc = np.zeros((rows, 8), np.float64)
    for i in range(0, n, 8):
        v = x[:, i:i + 8].astype(np.float64)
        v *= v
        acc += v
        acc = acc.astype(np.float32).astype(np.float64)
    a = acc.astype(np.float32)
    half = a[:, :4] + a[:, 4:]
    return (half[:, 0] + half[:, 2]) + (half[:, 1] + half[:, 3])


def _rms_float32(x: np.ndarray, scale: np.ndarray, epsilon: float, fma_lanes: bool):
    """onnxruntime's float32 RMS normalization of the rows of ``x``: (Y, 1 / rms)."""
    n = x.shape[-1]
    if fma_lanes:
        ms = _fma_lanes_sum_of_squares(x)
    else:  # sequential: np.cumsum adds in order
        ms = np.cumsum(np.square(x), axis=-1, dtype=np.float32)[:, -1]
    ms /= np.float32(n)
    ms += np.float32(epsilon)
    rms = np.sqrt(ms)
    inv = np.float32(1) / rms
    if fma_lanes:
        Y = x * inv[:, None]
    else:
        Y = x / rms[:, None]
    Y *= scale.astype(np.float32, copy=False).reshape(-1)
    return Y, inv


def _float32_typed(ctx: KernelContext, *indices: int) -> bool:
    """Whether the node's inputs ``indices`` are typed float32 tensors (an absent one
    counts); False where a type is unknown."""
    for i in indices:
        if not ctx.has_input(i):
            continue
        t = ctx.input_type(i)
        if t is None or t.WhichOneof("value") != "tensor_type" or t.tensor_type.elem_type != 1:
            return False
    return True


def _rows_of(ctx: KernelContext, index: int, scale: int) -> bool:
    """Whether input ``index`` is float32 with a fixed last dimension the size of the
    constant float32 input ``scale``: the RMS kernels' float32 paths then take every call
    (no BLAS: rms_normalize's sums are)."""
    shape = ctx.input_shape(index)
    c = ctx.constant(scale)
    return (_float32_typed(ctx, index, scale) and c is not None and bool(shape)
            and shape[-1] == c.size and c.size > 0)


def _compiled_rms():
    """compiled/rms_norm's kernels (the same arithmetic in one pass), or None where they do not
    run here: asked once, when a kernel is prepared (compiled/rms_norm then module _rms)."""
    global _rms, address
    from ...compiled import rms_norm

    _rms = rms_norm
    if address is None:
        from ...compiled.jit import address
    return rms_norm.kernels()


def _vector(a: np.ndarray) -> np.ndarray:
    """``a`` as a contiguous 1-D array: itself when it is one (a constant keeps its identity,
    by which the compiled kernels remember its address)."""
    if a.ndim == 1 and a.flags.c_contiguous:
        return a
    return np.ascontiguousarray(a.reshape(-1))


def _exact_rows(X: np.ndarray, scale: np.ndarray, lanes: int = 1) -> bool:
    """Whether X's last axis takes onnxruntime's float32 arithmetic here: float32 X and
    scale over the last axis only, a multiple of ``lanes`` long."""
    return (X.dtype == np.float32 and scale.dtype == np.float32 and X.ndim >= 1
            and X.shape[-1] > 0 and X.shape[-1] % lanes == 0
            and scale.size == X.shape[-1])


@op("SimplifiedLayerNormalization", 1)
@op("SimplifiedLayerNormalization", 1, domain=MS)
class SimplifiedLayerNormalization:
    """RMS normalization: X / sqrt(mean(X^2) + epsilon) * scale over axis..rank."""

    def __init__(self, ctx: KernelContext, *, axis=-1, epsilon=1e-5, stash_type=1) -> None:
        self.axis = int(axis)
        self.epsilon = float(epsilon)
        self.compiled = _compiled_rms()
        self.want_inv = ctx.output_used(1)
        self.bound = _rms.UNBOUND  # the constants, bound at the first call
        # InferenceSession's runner: no BLAS hold for float32 rows of 8k (_exact_rows)
        self.calls_blas = not (_rows_of(ctx, 0, 1) and self.axis == -1
                               and ctx.constant(1).size % 8 == 0)

    def __call__(self, X, scale):
        bound = self.bound
        if (scale is bound.scale and X.dtype == np.float32 and X.ndim
                and X.shape[-1] == bound.n and X.flags.c_contiguous
                and self.axis in (-1, X.ndim - 1)):
            # the scale bound once: rms_lanes_c's call of 5 arguments (a decode step's row)
            Y = np.empty(X.shape, np.float32)
            rows = X.size // bound.n
            inv = np.empty(X.shape[:-1] + (1,), np.float32) \
                if self.want_inv or rows > _rms.STACK_ROWS else None
            self.compiled.lanes_c(address(X), address(Y), 0 if inv is None else address(inv),
                                  bound.address, rows)
            return Y, inv if self.want_inv else None
        if self.axis in (-1, X.ndim - 1) and _exact_rows(X, scale, 8):
            if bound is _rms.UNBOUND:
                self.bound = _rms.bind(scale, None, self.epsilon, False) or _rms.NEVER
            rows = X.reshape(-1, X.shape[-1])
            if self.compiled is not None:
                Y, inv = self.compiled.lanes(np.ascontiguousarray(rows), _vector(scale),
                                             self.epsilon)
            else:
                Y, inv = _rms_float32(rows, scale, self.epsilon, True)
            return Y.reshape(X.shape), inv.reshape(X.shape[:-1] + (1,))
        Y, inv = rms_normalize(X, scale, self.axis, self.epsilon, _stat_dtype(X.dtype))
        return Y.astype(scale.dtype, copy=False), inv.astype(np.float32, copy=False)


def _skip_sum(input, skip, bias, sd):  # noqa: A002 - the schema's name
    s = np.add(input.astype(sd, copy=False), skip.astype(sd, copy=False))
    if bias is not None:
        s += bias.astype(sd, copy=False)
    return s


@op("SkipLayerNormalization", 1, domain=MS)
class SkipLayerNormalization:
    """LayerNorm(input + skip + bias) * gamma + beta, also returning the sum."""

    def __init__(self, ctx: KernelContext, *, epsilon=1e-12) -> None:
        self.epsilon = float(epsilon)
        self.want_sum = ctx.output_used(3)
        self.threads = threads_for(ctx)
        self.compiled = compiled_layer_norm()
        self.fn = None if self.compiled is None else self.compiled.function()
        self.bound = UNBOUND  # compiled/layer_norm.Bound of the constants (bound_constants)

    # the executor's buffer for Y (memory.py), where the node has no other output: the
    # compiled kernel writes it
    accepts_out = True

    def __call__(self, input, skip, gamma, beta=None, bias=None, *, out=None):  # noqa: A002
        n = input.shape[-1] if input.ndim else 0
        bound = bound_constants(self, gamma, beta, bias)
        if bound is not None and input.dtype == np.float32 and skip.dtype == np.float32 and \
                input.shape == skip.shape and n == bound.n and input.flags.c_contiguous and \
                skip.flags.c_contiguous:
            Y, mean, inv, total = bound.run(input.reshape(-1, n), skip.reshape(-1, n),
                                            self.want_sum, self.threads,
                                            rows_of(out, input.shape, n))
            stat = input.shape[:-1] + (1,)
            return (Y.reshape(input.shape), mean.reshape(stat), inv.reshape(stat),
                    None if total is None else total.reshape(input.shape))
        if self.compiled is not None and input.ndim and skip.shape == input.shape and \
                skip.dtype == np.float32 and fits_compiled(input, (n,), gamma, beta, bias):
            c = np.ascontiguousarray
            Y, mean, inv, total = self.compiled.layer_norm(
                c(input).reshape(-1, n), gamma, beta, self.epsilon, skip=c(skip).reshape(-1, n),
                bias=bias, want_sum=self.want_sum, threads=self.threads, fn=self.fn,
                out=rows_of(out, input.shape, n))
            stat = input.shape[:-1] + (1,)
            return (Y.reshape(input.shape), mean.reshape(stat), inv.reshape(stat),
                    None if total is None else total.reshape(input.shape))
        sd = _stat_dtype(input.dtype)
        s = _skip_sum(input, skip, bias, sd)
        # the sum is an output too: normalize into a new array then, else in place
        total = s.astype(input.dtype, copy=False) if self.want_sum else None
        Y, mean, inv = _layer_norm(s, gamma, beta, self.epsilon,
                                   None if self.want_sum else s)
        return (Y.astype(input.dtype, copy=False), mean.astype(np.float32, copy=False),
                inv.astype(np.float32, copy=False), total)


@op("SkipSimplifiedLayerNormalization", 1, domain=MS)
class SkipSimplifiedLayerNormalization:
    """RMS-normalized (input + skip + bias) * gamma, also returning the sum."""

    def __init__(self, ctx: KernelContext, *, epsilon=1e-12) -> None:
        self.epsilon = float(epsilon)
        self.want_sum = ctx.output_used(3)
        self.want_mean = ctx.output_used(1)
        self.want_inv = ctx.output_used(2)
        self.compiled = _compiled_rms()
        self.bound = _rms.UNBOUND  # the constants, bound at the first call
        # InferenceSession's runner: no BLAS hold for float32 rows (the compiled kernel or
        # _rms_float32)
        self.calls_blas = not (_rows_of(ctx, 0, 2) and _float32_typed(ctx, 1, 3))

    def __call__(self, input, skip, gamma, bias=None):  # noqa: A002 - the schema's name
        bound = self.bound
        if (gamma is bound.scale and bias is bound.bias and input.dtype == np.float32
                and skip.dtype == np.float32 and input.shape == skip.shape
                and input.shape[-1] == bound.n and input.flags.c_contiguous
                and skip.flags.c_contiguous and not self.want_mean):
            # constants bound once: rms_skip_c's call of 7 arguments (a decode step's row)
            shape = input.shape
            Y, total = np.empty(shape, np.float32), np.empty(shape, np.float32)
            rows = input.size // bound.n
            inv = np.empty(shape[:-1] + (1,), np.float32) \
                if self.want_inv or rows > _rms.STACK_ROWS else None
            self.compiled.skip_c(address(input), address(skip), address(Y), address(total),
                                 0 if inv is None else address(inv), bound.address, rows)
            return Y, None, inv if self.want_inv else None, total if self.want_sum else None
        if self.compiled is not None and skip.shape == input.shape and \
                skip.dtype == np.float32 and _exact_rows(input, gamma) and \
                (bias is None or (bias.dtype == np.float32 and bias.size == gamma.size)):
            if bound is _rms.UNBOUND:
                self.bound = _rms.bind(gamma, bias, self.epsilon, True) or _rms.NEVER
            Y, inv, total = self.compiled.skip(
                input, skip, None if bias is None else _vector(bias), _vector(gamma),
                self.epsilon)
            mean = np.zeros(inv.shape, np.float32) if self.want_mean else None
            return Y, mean, inv, total if self.want_sum else None
        sd = _stat_dtype(input.dtype)
        s = _skip_sum(input, skip, bias, sd)
        # the sum is a new array, and normalizing reads it without writing it
        total = s.astype(input.dtype, copy=False) if self.want_sum else None
        if _exact_rows(s, gamma):
            Y, inv = _rms_float32(s.reshape(-1, s.shape[-1]), gamma, self.epsilon, False)
            Y, inv = Y.reshape(s.shape), inv.reshape(s.shape[:-1] + (1,))
        else:
            Y, inv = rms_normalize(s, gamma, -1, self.epsilon, sd)
        # no mean in RMS normalization: onnxruntime's 0
        mean = np.zeros(inv.shape, np.float32) if self.want_mean else None
        return Y.astype(input.dtype, copy=False), mean, inv.astype(np.float32, copy=False), total


# -- masks -------------------------------------------------------------------------------------


def _filter_bias(allowed: np.ndarray, value: float, dtype: np.dtype) -> np.ndarray:
    """0 where ``allowed``, the mask filter value elsewhere."""
    return np.where(allowed, dtype.type(0), dtype.type(value))


def _key_mask(mask: np.ndarray, B: int, S: int, T: int, P: int) -> np.ndarray:
    """The allowed keys (broadcastable to (B, 1, S, T)) of onnxruntime's mask formats: key
    lengths (B), end and start positions (2B), raw 0/1 masks (B, T) and (B, S, T), and
    Megatron's (B, 1, max, max) whose rows P..P+S and first T columns apply."""
    mask = np.asarray(mask)
    j = np.arange(T)
    if mask.ndim == 1:
        if mask.shape[0] == B:
            return (j < mask.reshape(B, 1)).reshape(B, 1, 1, T)
        if mask.shape[0] == 2 * B:
            end, start = mask[:B].reshape(B, 1), mask[B:].reshape(B, 1)
            return ((j < end) & (j >= start)).reshape(B, 1, 1, T)
        raise ValueError(f"unsupported 1-D mask of shape {list(mask.shape)} for batch {B}")
    if mask.ndim == 2:
        if mask.shape[1] != T:
            raise ValueError(f"2-D mask width {mask.shape[1]} != total sequence length {T}")
        return (mask > 0).reshape(B, 1, 1, T)
    if mask.ndim == 3:
        return (mask > 0).reshape(B, 1, S, T)
    if mask.ndim == 4:
        return mask[:, :, P:P + S, :T] > 0
    raise ValueError(f"unsupported mask rank {mask.ndim}")


def _causal(S: int, T: int, P) -> np.ndarray:
    """Query s (absolute position P + s) may attend keys j <= P + s."""
    return np.arange(T)[None, :] <= np.arange(S)[:, None] + P


# masks of at most this many bytes have their masking remembered (_Exp2Attention._masking): a
# (batch, keys) padding mask is a few KiB, a (batch, 1, max, max) one can be megabytes
_MASK_MEMO_BYTES = 1 << 16

# A key masked with at most this filter value has an exactly zero weight (exp underflows) unless
# the scores themselves span thousands: such keys are skipped rather than biased.
_SKIPPED_KEY_FILTER = -1e4


def _key_ranges(allowed: np.ndarray, T: int) -> list[tuple[int, int]] | None:
    """Per batch, the one run of keys a key-only mask (B, 1, 1, T) leaves; None when the mask
    depends on the query, or leaves a batch no key or more than one run."""
    if allowed.shape[2] != 1:
        return None
    B = allowed.shape[0]
    rows = allowed.reshape(B, -1)
    if rows.shape[1] not in (1, T):
        return None
    rows = np.broadcast_to(rows, (B, T))  # every batch at once: a loop was ~10 us a call
    count = np.count_nonzero(rows, axis=1)
    lo = rows.argmax(axis=1)  # the first allowed key, and one past the last
    hi = T - rows[:, ::-1].argmax(axis=1)
    if not count.all() or (hi - lo != count).any():
        return None
    return list(zip(lo.tolist(), hi.tolist(), strict=True))


def _mask_bias(mask, B, S, T, P, causal, filter_value, cdt):
    """Additive bias: the filter value where the mask masks, the lowest float for future keys
    (so a row whose allowed keys are all masked still attends among those, as in
    onnxruntime)."""
    bias = None
    if mask is not None:
        bias = _filter_bias(_key_mask(mask, B, S, T, P), filter_value, cdt)
    if causal and S > 1:
        bias = add_bias(bias, _filter_bias(_causal(S, T, P), np.finfo(cdt).min, cdt))
    return bias


def _scale(scale: float, head_size: int) -> float:
    return scale if scale else 1.0 / math.sqrt(head_size)


def _float32_scale(scale: float, head_size: int) -> float:
    """onnxruntime's float32 scale: 1.0f / sqrt(float(head size)) (not the double rounded:
    they differ for head sizes 24, 72, 96, 112, ...)."""
    if scale:
        return float(np.float32(scale))
    return float(np.float32(1) / np.sqrt(np.float32(head_size)))


# -- Attention (packed QKV weights) ------------------------------------------------------------


class _Exp2Attention:
    """What Attention and MultiHeadAttention share: masks turned into what ``attend_exp2``
    takes (q must already carry scale * log2(e))."""

    causal: bool
    filter: float
    threads: int = 1  # the session's intra-op threads
    _last_causal: tuple = (None, None)
    _last_masking: tuple | None = None  # _masking's last (key, answer)

    def _causal_keep(self, S: int, T: int, P: int, cdt: np.dtype) -> np.ndarray:
        """Causal mask as 0/1 weights (S, T), kept for the next run of the same shape."""
        key = (S, T, P, cdt)
        if self._last_causal[0] != key:
            self._last_causal = (key, _causal(S, T, P).astype(cdt))
        return self._last_causal[1]

    def _masking(self, mask, B: int, S: int, T: int, P: int, cdt: np.dtype) -> tuple:
        """(keep, bias, key ranges) for attend_exp2 of the mask and the causal flag, the last
        answer kept for a mask of the same bytes (a padding mask repeats run after run:
        finding its ranges again was ~90 us of numpy calls a BERT layer, on cold caches)."""
        key = None
        if mask is not None:
            m = np.asarray(mask)
            if m.nbytes <= _MASK_MEMO_BYTES:
                key = (m.shape, m.dtype.str, m.tobytes(), B, S, T, P, cdt)
                last = self._last_masking
                if last is not None and last[0] == key:
                    return last[1]
        allowed = None if mask is None else _key_mask(mask, B, S, T, P)
        keep = self._causal_keep(S, T, P, cdt) if self.causal and S > 1 else None
        bias_, ranges = None, None
        if allowed is not None and self.filter <= _SKIPPED_KEY_FILTER:
            ranges = _key_ranges(allowed, T)
            if ranges is None:
                keep = allowed.astype(cdt) if keep is None else keep * allowed
        elif allowed is not None:  # a mild filter: masked keys keep some weight
            bias_ = _filter_bias(allowed, self.filter * LOG2E, cdt)
        if key is not None:  # one tuple: a concurrent run sees the old answer or the new
            self._last_masking = (key, (keep, bias_, ranges))
        return keep, bias_, ranges

    def _attend(self, q, k, v, mask, attention_bias, P: int, cdt: np.dtype) -> np.ndarray:
        """(B, S, N, Hv) attention output of heads q (B, N, S, H), k, v (B, N, T, H)."""
        B, N, S = q.shape[:3]
        T = k.shape[2]
        keep, bias_, ranges = self._masking(mask, B, S, T, P, cdt)
        if attention_bias is not None:
            bias_ = add_bias(bias_, attention_bias.astype(cdt) * cdt.type(LOG2E))

        def exact_bias():
            exact = _mask_bias(mask, B, S, T, P, self.causal, self.filter, cdt)
            if attention_bias is not None:
                exact = add_bias(exact, attention_bias.astype(cdt, copy=False))
            return exact

        out = np.empty((B, S, N, v.shape[-1]), cdt)
        if out.size:  # T >= S >= 1
            attend_exp2(q, k, v, out, keep=keep, bias=bias_, key_ranges=ranges,
                        exact_bias=exact_bias, threads=self.threads)
        return out


@op("Attention", 1, domain=MS)
class Attention(_Exp2Attention):
    """Packed QKV projection, then ``attend_exp2``: the query columns of a constant weight (and
    bias) are multiplied by scale * log2(e) once, here, instead of every query at every run."""

    def __init__(self, ctx: KernelContext, *, num_heads, qkv_hidden_sizes=None, unidirectional=0,
                 scale=0.0, mask_filter_value=-10000.0, past_present_share_buffer=0,
                 do_rotary=0, rotary_embedding_dim=0) -> None:
        if do_rotary:
            raise NotImplementedError("Attention with do_rotary=1 is not supported on CPU")
        self.N = int(num_heads)
        self.sizes = None if qkv_hidden_sizes is None else [int(v) for v in qkv_hidden_sizes]
        self.causal = bool(unidirectional)
        self.scale = float(scale)
        self.filter = float(mask_filter_value)
        self.share = bool(past_present_share_buffer)
        self.want_present = ctx.output_used(1)
        self._last_causal = (None, None)
        W, b = ctx.constant(1), ctx.constant(2)
        self.W = None if W is None else self._scaled(W.astype(compute_dtype(W.dtype)))
        self.b = None if b is None else self._scaled(b.astype(compute_dtype(b.dtype)))
        self.threads = threads_for(ctx)
        self.packed = None
        if W is None or W.dtype.kind == "f":  # (QAttention packs its 8-bit W dequantized)
            self._pack()

    def _pack(self) -> None:
        """A float32 W in the compiled GEMM's panels, its bias in the product's epilogue: the
        projection (a quarter of a BERT layer's multiply-adds) then splits over the session's
        threads like a MatMul's. The scaled copies (or the panels) replace the constants: the
        session drops its own (plan.py)."""
        self.packed = None
        if self.W is not None and self.W.ndim == 2 and self.W.dtype == np.float32 and (
                self.b is None or (self.b.dtype == np.float32 and
                                   self.b.shape == (self.W.shape[1],))):
            self.packed = packed_weights(self.W)
            if self.packed is not None:
                self.W = None  # held once, in the panels
        self.prepacked_inputs = tuple(i for i, x in ((1, self.W), (1, self.packed), (2, self.b))
                                      if x is not None)


    def _split(self, width: int) -> tuple[int, int, int]:
        return tuple(self.sizes) if self.sizes else (width // 3,) * 3

    def _scaled(self, w: np.ndarray) -> np.ndarray:
        """A copy of ``w`` (weights or bias) with its query columns times scale * log2(e)."""
        w = np.array(w, order="C")
        dq = self._split(w.shape[-1])[0]
        w[..., :dq] *= w.dtype.type(_scale(self.scale, dq // self.N) * LOG2E)
        return w

    def __call__(self, input, weights, bias=None, mask_index=None, past=None,  # noqa: A002
                 attention_bias=None, past_sequence_length=None):
        X = input
        B, S, _ = X.shape
        cdt = compute_dtype(X.dtype)
        A = X.astype(cdt, copy=False).reshape(B * S, X.shape[2])
        # one GEMM over every token
        if self.packed is not None:
            width = self.packed.N
            qkv = run_packed(self.packed, A, self.threads, bias=self.b,
                             released=True).reshape(B, S, width)
        else:
            W = self.W if self.W is not None else self._scaled(weights.astype(cdt, copy=False))
            width = W.shape[1]
            qkv = blas.matmul(A, W).reshape(B, S, width)  # uncut: the same bits at any count
            if self.b is not None:
                qkv += self.b
        if self.b is None and bias is not None:
            qkv += self._scaled(bias.astype(cdt, copy=False))
        dq, dk, dv = self._split(width)
        N = self.N
        q = to_heads(qkv[..., :dq], N)
        k = to_heads(qkv[..., dq:dq + dk], N)
        v = to_heads(qkv[..., dq + dk:dq + dk + dv], N)
        P, present = 0, None
        if past is not None and self.share:
            P = int(np.asarray(past_sequence_length).reshape(-1)[0])
            present = past.copy()  # the buffer keeps its length; the new tokens go at P
            present[0, :, :, P:P + S] = k
            present[1, :, :, P:P + S] = v
            k, v = present[0, :, :, :P + S].astype(cdt), present[1, :, :, :P + S].astype(cdt)
        elif past is not None:
            P = past.shape[3]
            k = np.concatenate((past[0].astype(cdt, copy=False), k), axis=2)
            v = np.concatenate((past[1].astype(cdt, copy=False), v), axis=2)
        if present is None and self.want_present:
            present = np.stack((k, v)).astype(X.dtype, copy=False)
        out = self._attend(q, k, v, mask_index, attention_bias, P, cdt)
        return out.reshape(B, S, dv).astype(X.dtype, copy=False), present


# -- MultiHeadAttention ------------------------------------------------------------------------


@op("MultiHeadAttention", 1, domain=MS)
class MultiHeadAttention(_Exp2Attention):
    def __init__(self, ctx: KernelContext, *, num_heads, mask_filter_value=-10000.0, scale=0.0,
                 unidirectional=0) -> None:
        self.N = int(num_heads)
        self.filter = float(mask_filter_value)
        self.scale = float(scale)
        self.causal = bool(unidirectional)
        self.want_qk = ctx.output_used(3)
        self.threads = threads_for(ctx)

    def __call__(self, query, key=None, value=None, bias=None, key_padding_mask=None,
                 attention_bias=None, past_key=None, past_value=None, past_sequence_length=None,
                 cache_indirection=None):
        if cache_indirection is not None:
            raise NotImplementedError("MultiHeadAttention with cache_indirection (beam search)")
        N = self.N
        cdt = compute_dtype(query.dtype)
        Q = query.astype(cdt, copy=False)
        B, S = Q.shape[:2]
        if Q.ndim == 5:  # packed (B, S, N, 3, H)
            q, k, v = (Q[:, :, :, i].transpose(0, 2, 1, 3) for i in range(3))
            if bias is not None:
                H = Q.shape[-1]
                b = bias.astype(cdt, copy=False).reshape(3, N, 1, H)
                q, k, v = q + b[0], k + b[1], v + b[2]
        else:
            D = Q.shape[2]
            K = key.astype(cdt, copy=False)
            b = None if bias is None else bias.astype(cdt, copy=False)
            if b is not None:
                Q = Q + b[:D]
            q = to_heads(Q, N)
            if K.ndim == 5:  # packed (B, L, N, 2, H)
                k, v = (K[:, :, :, i].transpose(0, 2, 1, 3) for i in range(2))
                if b is not None:
                    H = K.shape[-1]
                    k, v = k + b[D:2 * D].reshape(N, 1, H), v + b[2 * D:].reshape(N, 1, H)
            elif K.ndim == 4:  # already projected (B, N, L, H): the bias is part of it
                k, v = K, value.astype(cdt, copy=False)
            else:
                V = value.astype(cdt, copy=False)
                if b is not None:
                    K, V = K + b[D:2 * D], V + b[2 * D:]
                k, v = to_heads(K, N), to_heads(V, N)
        P = 0
        if past_key is not None:
            P = past_key.shape[2]
            k = np.concatenate((past_key.astype(cdt, copy=False), k), axis=2)
            v = np.concatenate((past_value.astype(cdt, copy=False), v), axis=2)
        dt = query.dtype
        if not self.want_qk:  # the fast path; scale * log2(e) goes onto q (a copy)
            qs = q * cdt.type(_scale(self.scale, q.shape[-1]) * LOG2E)
            out = self._attend(qs, k, v, key_padding_mask, attention_bias, P, cdt)
            return (out.reshape(B, S, N * v.shape[-1]).astype(dt, copy=False),
                    k.astype(dt, copy=False),
                    v.astype(dt, copy=False), None)
        T = k.shape[2]
        bias_ = _mask_bias(key_padding_mask, B, S, T, P, self.causal, self.filter, cdt)
        if attention_bias is not None:
            bias_ = add_bias(bias_, attention_bias.astype(cdt, copy=False))
        out, qk = attend(q, k, v, bias_, scale=_scale(self.scale, q.shape[-1]),
                         capture=BIASED if self.want_qk else None, zero_masked_rows=False)
        return (from_heads(out).astype(dt, copy=False), k.astype(dt, copy=False),
                v.astype(dt, copy=False), qk.astype(dt, copy=False))


# -- GroupQueryAttention -----------------------------------------------------------------------


class GQAAttributes(NamedTuple):
    """GroupQueryAttention's attributes as both providers' kernels read them."""

    N: int  # num_heads
    Nkv: int  # kv_num_heads
    scale: float  # 0: 1 / sqrt(head size)
    softcap: float
    window: int  # local_window_size; -1: none
    rotary: bool
    interleaved: bool
    smooth: bool  # smooth_softmax
    causal: bool
    q_eps: float  # the per-head RMS norms' epsilons
    k_eps: float


def gqa_attributes(num_heads, kv_num_heads, scale=0.0, softcap=0.0, local_window_size=-1,
                   do_rotary=0, rotary_interleaved=0, smooth_softmax=0, causal=1,
                   qk_norm_epsilon=1e-6, q_norm_epsilon=None, k_norm_epsilon=None
                   ) -> GQAAttributes:
    """The attributes parsed (the CPU and CUDA kernels' one reading of them); num_heads not
    a multiple of kv_num_heads is refused."""
    N, Nkv = int(num_heads), int(kv_num_heads)
    if N % Nkv:
        raise ValueError(f"num_heads {N} is not a multiple of kv_num_heads {Nkv}")
    return GQAAttributes(
        N, Nkv, float(scale), float(softcap), int(local_window_size), bool(do_rotary),
        bool(rotary_interleaved), int(smooth_softmax) == 1, bool(causal),
        float(qk_norm_epsilon if q_norm_epsilon is None else q_norm_epsilon),
        float(qk_norm_epsilon if k_norm_epsilon is None else k_norm_epsilon))


def _rotary_row(cos_cache, sin_cache, position_ids, H, p):
    """(position, half) of a one-token step's rotation by float32 C-contiguous (positions,
    half) caches (the position from position_ids, else ``p``), or None where the caches or
    the position do not fit the compiled rope_rows (the caller takes the general path)."""
    if (cos_cache is None or sin_cache is None or cos_cache.ndim != 2
            or sin_cache.shape != cos_cache.shape or cos_cache.dtype != np.float32
            or sin_cache.dtype != np.float32 or not cos_cache.flags.c_contiguous
            or not sin_cache.flags.c_contiguous or 2 * cos_cache.shape[1] > H
            or (position_ids is not None and position_ids.size != 1)):
        return None
    pos = p if position_ids is None else int(position_ids.reshape(-1)[0])
    if not 0 <= pos < cos_cache.shape[0]:
        return None
    return pos, cos_cache.shape[1]


@op("GroupQueryAttention", 1, domain=MS)
class GroupQueryAttention:
    def __init__(self, ctx: KernelContext, *, num_heads, kv_num_heads, scale=0.0, softcap=0.0,
                 local_window_size=-1, do_rotary=0, rotary_interleaved=0, smooth_softmax=0,
                 qk_output=0, causal=1, sliding_window_cache=0, k_quant_type="NONE",
                 v_quant_type="NONE", kv_cache_bit_width=0, qk_norm_epsilon=1e-6,
                 q_norm_epsilon=None, k_norm_epsilon=None) -> None:
        quant = {str(k_quant_type), str(v_quant_type)} - {"NONE", "b'NONE'"}
        if quant or int(kv_cache_bit_width):
            raise NotImplementedError("GroupQueryAttention with a quantized KV cache")
        if int(sliding_window_cache):
            raise NotImplementedError("GroupQueryAttention with sliding_window_cache=1")
        (self.N, self.Nkv, self.scale, self.softcap, self.window, self.rotary, self.interleaved,
         self.smooth, self.causal, self.q_eps, self.k_eps) = gqa_attributes(
            num_heads, kv_num_heads, scale, softcap, local_window_size, do_rotary,
            rotary_interleaved, smooth_softmax, causal, qk_norm_epsilon, q_norm_epsilon,
            k_norm_epsilon)
        self.qk_output = int(qk_output)
        self.want_qk = ctx.output_used(3) and self.qk_output > 0
        self.share = _shares_past_present(ctx)
        # one token of one sequence, packed QKV, float32, nothing but the mask and rotary:
        # the decode step of a builder's model, in a few numpy calls (_decode_one)
        self.simple = not (self.want_qk or self.softcap or self.window > 0 or self.smooth
                           or not self.causal)
        # what onnxruntime's flash path (compiled.gqa) excludes, known from the attributes
        self._exact_node = not (self.want_qk or self.softcap or self.smooth or not self.causal)
        # onnxruntime splits one token's keys across its threads (flash decoding) when batch x
        # heads is below its intra-op thread count: the session's, as here
        self.threads = threads_for(ctx)
        self._step = None  # _decode_step's constants of the query's width
        # the rotary caches' addresses (constants, read-only: ~3 us each through ctypes)
        self._cos, self._sin = _HeldAddress(), _HeldAddress()
        # the shared cache's buffers (the same arrays every step of a generator)
        self._pk, self._pv = _HeldAddress(), _HeldAddress()
        # compiled.gqa.decode_step's constants: ((W, cos, sin, half), words, their address),
        # swapped whole, never written once made (concurrent runs read a matching block)
        self._block: tuple = ((), None, 0)
        # the packed row's fixed width where the node is float32 (calls_blas)
        shape = ctx.input_shape(0)
        self._f32_width = shape[-1] if (
            shape and isinstance(shape[-1], int) and not ctx.has_input(1)
            and _float32_typed(ctx, 0, 3, 4) and self._exact_node) else 0

    @property
    def calls_blas(self) -> bool:
        """False where its calls take compiled.gqa's kernels (float32, a head size they take):
        InferenceSession's runner (onnxrun.genai's decode steps) then holds no BLAS. (A first
        prompt with padded rows still takes numpy's products.)"""
        return not self._f32_width or self._step_constants(self._f32_width)[3] is None

    def __call__(self, query, key=None, value=None, past_key=None, past_value=None,
                 seqlens_k=None, total_sequence_length=None, cos_cache=None, sin_cache=None,
                 position_ids=None, attention_bias=None, head_sink=None, k_scale=None,
                 v_scale=None, q_norm_weight=None, k_norm_weight=None, query_seqlens=None):
        if (key is None and past_key is not None and query.ndim == 3
                and query.shape[:2] == (1, 1) and self._exact_node and attention_bias is None
                and head_sink is None and q_norm_weight is None and query_seqlens is None):
            out = self._decode_step(query, past_key, past_value, seqlens_k,
                                    total_sequence_length, cos_cache, sin_cache, position_ids)
            if out is not None:
                return out
        self._check_inputs(query, key, value, past_key, past_value, seqlens_k,
                           total_sequence_length)
        N, Nkv = self.N, self.Nkv
        dt = query.dtype
        cdt = compute_dtype(dt)
        B, S = query.shape[:2]
        exact = self._exact_kernels(query, key, past_key, seqlens_k, total_sequence_length,
                                    attention_bias, head_sink, q_norm_weight, query_seqlens)
        if exact is not None and B == 1 and S == 1 and key is None and past_key is not None:
            total = int(seqlens_k.reshape(-1)[0]) + 1
            T_max = int(np.asarray(total_sequence_length).reshape(-1)[0])
            # not a first prompt; the keys within the cache (the kernels read them unchecked)
            if T_max != 1 and 1 <= total <= max(past_key.shape[2], T_max):
                return self._decode_exact(exact, query, past_key, past_value, total, T_max,
                                          cos_cache, sin_cache, position_ids)
        if (exact is None and self.simple and B == 1 and S == 1 and key is None
                and dt == np.float32
                and past_key is not None and past_key.dtype == dt and query_seqlens is None
                and attention_bias is None and head_sink is None and q_norm_weight is None):
            total = int(seqlens_k.reshape(-1)[0]) + 1
            T_max = int(np.asarray(total_sequence_length).reshape(-1)[0])
            if T_max != 1 and total <= max(past_key.shape[2], T_max):  # not a first prompt
                return self._decode_one(query, past_key, past_value, total, T_max, cos_cache,
                                        sin_cache, position_ids)
        if key is None:  # packed (B, S, (N + 2 Nkv) H)
            H = query.shape[2] // (N + 2 * Nkv)
            qkv = query.astype(cdt, copy=False)
            q = to_heads(qkv[..., :N * H], N)
            k = to_heads(qkv[..., N * H:(N + Nkv) * H], Nkv)
            v = to_heads(qkv[..., (N + Nkv) * H:], Nkv)
        else:
            H = query.shape[2] // N
            q = to_heads(query.astype(cdt, copy=False), N)
            k = to_heads(key.astype(cdt, copy=False), Nkv)
            v = to_heads(value.astype(cdt, copy=False), Nkv)
        total = seqlens_k.reshape(-1).astype(np.int64) + 1  # (B,) keys after this step
        T_max = int(np.asarray(total_sequence_length).reshape(-1)[0])
        first_prompt = S == T_max  # as onnxruntime decides: a prompt fills the whole cache
        if query_seqlens is not None:
            valid = query_seqlens.reshape(-1).astype(np.int64)
            past_len = total - valid
            first_prompt = False
        else:  # every new row is written, padding rows of a first prompt included
            valid = np.full(B, S, np.int64)
            past_len = np.zeros(B, np.int64) if first_prompt else total - S
        if q_norm_weight is not None:  # per-head RMS norm of Q and K (Qwen3)
            q, _ = rms_normalize(q, q_norm_weight, -1, self.q_eps, cdt)
            k, _ = rms_normalize(k, k_norm_weight, -1, self.k_eps, cdt)
        if self.rotary:
            if position_ids is None:
                pos = past_len[:, None] + np.arange(S)
            elif first_prompt:  # onnxruntime reads only the first position of a first prompt
                pos = np.broadcast_to(int(position_ids.reshape(-1)[0]) + np.arange(S), (B, S))
            else:
                pos = position_ids.astype(np.int64)
            cos = cos_cache.astype(cdt, copy=False)[pos][:, None]  # (B, 1, S, rot/2)
            sin = sin_cache.astype(cdt, copy=False)[pos][:, None]
            rot = cos_cache.shape[1] * 2
            if exact is None:
                q = rotate(q, cos, sin, self.interleaved, rot)
                k = rotate(k, cos, sin, self.interleaved, rot)
            else:  # per sequence: heads x positions rows, one cache row per position
                # one sequence's rotated rows as they are (no stacked copy)
                q, k = (x[0][None] if B == 1 else np.stack(x) for x in (
                    [_gqa.rope_heads(exact, x[b], cos[b, 0], sin[b, 0], self.interleaved)
                     for b in range(B)] for x in (q, k)))
        present_k, present_v = self._present(past_key, past_value, k, v, past_len, valid, T_max,
                                             dt)
        if (exact is not None and B and S and total.min() >= 1
                and total.max() <= present_k.shape[2]  # the kernels read the keys unchecked
                and (np.all(past_len >= 0) if not first_prompt
                     else np.all(total == S))):  # no padding rows
            kc, vc = _rows_contiguous(present_k), _rows_contiguous(present_v)
            out = np.empty((B, S, N * H), np.float32)
            # flash decoding: one token, batch x heads under the threads, equal lengths
            split = S == 1 and B * N < self.threads and bool(np.all(total == total[0]))
            for b in range(B):  # a prompt's result is written into out[b]
                ob = out[b]
                res = _gqa.attend(q[b], kc[b], vc[b], int(past_len[b]), int(total[b]),
                                  _float32_scale(self.scale, H), self.window, fn=exact,
                                  split=split, threads=self.threads, out=ob,
                                  scratch=_gqa.SCRATCH)
                if res is not ob:
                    ob[...] = res
            return out, present_k, present_v, None
        # keys past every batch's total length are hidden: a large shared buffer is not read
        T = present_k.shape[2] if self.want_qk else min(present_k.shape[2], int(total.max()))
        j = np.arange(T)
        qpos = past_len[:, None] + np.arange(S)  # (B, S) absolute query positions
        allowed = (j < total[:, None])[:, None, :]  # (B, 1, T)
        if self.causal:
            allowed = allowed & (j[None, None, :] <= qpos[:, :, None])
        if self.window > 0:
            allowed = allowed & (j[None, None, :] > qpos[:, :, None] - self.window)
        bias = neg_inf_where_not(allowed, cdt)[:, None]  # (B, 1, S or 1, T)
        if attention_bias is not None:
            ab = attention_bias.astype(cdt, copy=False)[..., :T]
            if ab.shape[-1] < T:
                ab = np.pad(ab, [(0, 0)] * (ab.ndim - 1) + [(0, T - ab.shape[-1])])
            bias = bias + ab
        sink = None
        if head_sink is not None:
            sink = head_sink.astype(cdt, copy=False).reshape(1, N, 1, 1)
        elif self.smooth:
            sink = np.zeros((1, N, 1, 1), dtype=cdt)
        capture = None
        if self.want_qk:
            capture = BIASED if self.qk_output == 1 else PROBS
        kc = present_k[:, :, :T].astype(cdt, copy=False)
        vc = present_v[:, :, :T].astype(cdt, copy=False)
        out, qk = attend(q, kc, vc, bias, scale=_scale(self.scale, H), softcap=self.softcap,
                         sink=sink, capture=capture)
        if qk is not None:
            if self.qk_output == 1:  # onnxruntime leaves the scores of hidden keys at 0
                qk[np.broadcast_to(np.isneginf(bias), qk.shape)] = 0
            qk = qk.astype(dt, copy=False)
        return from_heads(out).astype(dt, copy=False), present_k, present_v, qk

    def _check_inputs(self, query, key, value, past_key, past_value, seqlens_k,
                      total_sequence_length) -> None:
        """onnxruntime's checks of a call (group_query_attention_helper.h), as InvalidArgument
        naming the input and its shape, before any path reads the inputs (the compiled
        kernels read the cache unchecked): ranks, widths and head counts; seqlens_k one value
        per sequence, each within the present cache (max(past length, total_sequence_length))
        and, after a first prompt, covering the new rows; total_sequence_length one positive
        value. An empty batch is refused too (onnxruntime 1.32 crashes on it)."""
        N, Nkv = self.N, self.Nkv
        if query.ndim != 3:
            raise InvalidArgument(f"input 'query' must have 3 dimensions (batch, sequence, "
                                  f"hidden), got shape {list(query.shape)}")
        B, S, D = query.shape
        if B == 0:
            raise InvalidArgument(f"input 'query' has an empty batch (shape {list(query.shape)})")
        width = N + 2 * Nkv if key is None else N
        if D % width:
            raise InvalidArgument(
                f"input 'query' has hidden size {D}, not a multiple of "
                + (f"num_heads + 2 * kv_num_heads = {width} (packed Q, K, V)" if key is None
                   else f"num_heads = {N}"))
        H = D // width
        for name, t in (("key", key), ("value", value)):
            if key is not None and (t is None or t.shape != (B, S, Nkv * H)):
                raise InvalidArgument(f"input '{name}' must have shape {[B, S, Nkv * H]} "
                                      f"(query {list(query.shape)}), got "
                                      f"{None if t is None else list(t.shape)}")
        P = 0
        if past_key is not None or past_value is not None:
            for name, t in (("past_key", past_key), ("past_value", past_value)):
                if t is None or t.ndim != 4 or t.shape[0] != B or t.shape[1] != Nkv or \
                        t.shape[3] != H:
                    raise InvalidArgument(
                        f"input '{name}' must have shape [{B}, {Nkv}, past_sequence, {H}] "
                        f"(batch, kv_num_heads, sequence, head_size), got "
                        f"{None if t is None else list(t.shape)}")
            if past_value.shape[2] != past_key.shape[2]:
                raise InvalidArgument(f"inputs 'past_key' {list(past_key.shape)} and "
                                      f"'past_value' {list(past_value.shape)} differ in length")
            P = past_key.shape[2]
        if seqlens_k is None or seqlens_k.size != B:
            raise InvalidArgument(f"input 'seqlens_k' must hold batch_size ({B}) values, got "
                                  f"{None if seqlens_k is None else list(seqlens_k.shape)}")
        tsl = total_sequence_length
        if tsl is None or tsl.size != 1:
            raise InvalidArgument("input 'total_sequence_length' must hold one value, got shape "
                                  f"{None if tsl is None else list(tsl.shape)}")
        T = int(total_sequence_length.reshape(-1)[0])
        if T <= 0:
            raise InvalidArgument(f"input 'total_sequence_length' must be positive, got {T}")
        seq = seqlens_k.reshape(-1)
        lo, hi = (int(seq[0]),) * 2 if B == 1 else (int(seq.min()), int(seq.max()))
        present = max(P, T)
        if lo < 0 or hi >= present:
            raise InvalidArgument(
                f"input 'seqlens_k' {seq.tolist()} is out of range [0, {present}): the present "
                f"cache holds max(past length {P}, total_sequence_length {T}) positions")
        if S != T and lo + 1 < S:  # not a first prompt: the new rows follow the past
            raise InvalidArgument(f"input 'seqlens_k' {seq.tolist()} is too small for "
                                  f"{S} new rows (query {list(query.shape)})")

    def _exact_kernels(self, query, key, past_key, seqlens_k, total_sequence_length,
                       attention_bias, head_sink, q_norm_weight, query_seqlens):
        """compiled.gqa's kernels (onnxruntime's arithmetic, bit for bit: its flash path)
        where they cover the node and this call: float32, causal, no softcap, smooth softmax,
        sink, bias, per-head norm or QK output, a head size that is a multiple of 8 and a
        scale other than 1; else None (the numpy paths)."""
        if (not self._exact_node or query.dtype != np.float32 or attention_bias is not None
                or head_sink is not None or q_norm_weight is not None
                or query_seqlens is not None
                or (past_key is not None and past_key.dtype != np.float32)):
            return None
        H = query.shape[2] // (self.N + 2 * self.Nkv if key is None else self.N)
        # scale 1 takes MLAS's M == 1 kernels for a one-row Q K^T (another order)
        if H % 8 or _float32_scale(self.scale, H) == 1.0:
            return None
        global _gqa
        if _gqa is None:
            from ...compiled import gqa as _gqa  # jit on first use only
        return _gqa.kernels()

    def _decode_step(self, query, past_key, past_value, seqlens_k, total_sequence_length,
                     cos_cache, sin_cache, position_ids):
        """_decode_exact's case with a shared cache (onnxrun.genai's decode step) with as
        little Python around compiled.gqa as it takes (the general path's checks, views and
        allocations were ~2/3 of a small model's call): the packed row copied and rotated
        (``rope_rows`` on the rotary caches' rows, their addresses held), the new key and
        value written at position total - 1 of the past buffers, then attention over
        ``total`` keys (``decode_heads``, or ``attend`` for flash decoding's split): the
        same kernels on the same operands as _decode_exact. None where
        the call is not that case (the caller goes on to the general paths, which answer it
        as before)."""
        N, Nkv = self.N, self.Nkv
        step = self._step
        if step is None or step[0] != query.shape[2]:
            step = self._step = self._step_constants(query.shape[2])
        W, H, alpha, fn = step
        if (fn is None or query.dtype != np.float32 or past_key.dtype != np.float32
                or past_value.dtype != np.float32 or seqlens_k.size != 1
                or total_sequence_length.size != 1 or not self.share):
            return None
        total = seqlens_k.item() + 1
        T_max = total_sequence_length.item()
        P = past_key.shape[2]
        # not a first prompt; the new row inside the buffers, which hold the whole sequence
        # (_present's shared case); rows of H floats as the kernel reads them
        if (T_max <= 1 or not 1 <= total <= P or P < T_max
                or past_key.shape != (1, Nkv, P, H) or past_value.shape != past_key.shape
                or not (past_key.flags.writeable and past_value.flags.writeable)
                or past_key.strides[2:] != (4 * H, 4) or past_value.strides[2:] != (4 * H, 4)
                or past_key.strides[1] % 4 or past_value.strides[1] % 4):
            return None
        p = total - 1
        if (N >= self.threads and total <= _STEP_MAX_KEYS and query.flags.c_contiguous
                and past_value.strides == past_key.strides
                and (self.threads == 1 or 2 * N * total * H < _gqa.DECODE_SPLIT)):
            # on this thread, in one call (compiled.gqa's decode_step)
            pos = p
            cos_at = sin_at = half = 0
            if self.rotary:
                at = _rotary_row(cos_cache, sin_cache, position_ids, H, p)
                if at is None:
                    return None
                pos, half = at
                cos_at, sin_at = self._cos(cos_cache), self._sin(sin_cache)
            block = self._block
            if block[0] != (W, cos_at, sin_at, half):
                words = np.array([N, Nkv, H, _gqa._word(alpha), self.window, cos_at, sin_at,
                                  half, int(self.interleaved), int(self.rotary)], np.int64)
                block = self._block = ((W, cos_at, sin_at, half), words, address(words))
            out = np.empty((1, 1, N * H), np.float32)
            fn.decode_step(address(query), address(out), self._pk(past_key),
                           self._pv(past_value), block[2], pos, total,
                           past_key.strides[1] // 4)
            return out, past_key, past_value, None
        x = query.reshape(N + 2 * Nkv, H).copy()
        if self.rotary:
            at = _rotary_row(cos_cache, sin_cache, position_ids, H, p)
            if at is None:
                return None
            pos, half = at
            cos_at = self._cos(cos_cache) + pos * 4 * half
            sin_at = self._sin(sin_cache) + pos * 4 * half
            fn.rope_rows(address(x), N + Nkv, H, cos_at, sin_at, half, int(self.interleaved), 1)
        past_key[0, :, p] = x[N:N + Nkv]
        past_value[0, :, p] = x[N + Nkv:]
        if N < self.threads:  # flash decoding (the keys split in blocks): attend's
            out = _gqa.attend(x[:N].reshape(N, 1, H), past_key[0], past_value[0], p, total,
                              alpha, self.window, fn=fn, split=True, threads=self.threads)
            return out.reshape(1, 1, N * H), past_key, past_value, None
        out = np.empty((1, 1, N * H), np.float32)  # attend's one-token case, on addresses
        ws = total - self.window if 0 <= self.window < total else 0
        _gqa.decode_heads(fn, address(x), address(past_key), address(past_value), address(out),
                          N, N // Nkv, total, H, past_key.strides[1] // 4,
                          past_value.strides[1] // 4, alpha, ws, self.threads)
        return out, past_key, past_value, None

    def _step_constants(self, W: int) -> tuple:
        """(the packed row's width W, the head size, the float32 scale, compiled.gqa's
        kernels or None where they do not take a node of that width: _exact_kernels'
        conditions). The kernels are taken once, as the other compiled kernels take theirs
        when prepared (a lookup per call cost ~2-4 us: it reads the environment's switches)."""
        global _gqa, address
        H = W // (self.N + 2 * self.Nkv)
        alpha = _float32_scale(self.scale, H)
        if W != H * (self.N + 2 * self.Nkv) or not H or H % 8 or alpha == 1.0:
            return W, H, alpha, None
        if _gqa is None:
            from ...compiled import gqa as _gqa  # jit on first use only
        if address is None:
            from ...compiled.jit import address
        return W, H, alpha, _gqa.kernels()

    def _decode_exact(self, fn, query, past_key, past_value, total, T_max, cos_cache,
                      sin_cache, position_ids):
        """One new token of one sequence (packed QKV) on compiled.gqa: rotary, the new key and
        value written at position total - 1 (_present), attention over ``total`` keys."""
        N, Nkv = self.N, self.Nkv
        H = query.shape[2] // (N + 2 * Nkv)
        p = total - 1
        cos = sin = None
        if self.rotary:
            pos = p if position_ids is None else int(position_ids.reshape(-1)[0])
            cos, sin = cos_cache[pos], sin_cache[pos]
        x = _gqa.decode_packed(fn, query.reshape(-1), N, Nkv, cos, sin, self.interleaved)
        present_k, present_v = self._present(
            past_key, past_value, x[N:N + Nkv].reshape(1, Nkv, 1, H),
            x[N + Nkv:].reshape(1, Nkv, 1, H), np.array([p]), np.array([1]), T_max,
            np.dtype(np.float32))
        out = _gqa.attend(x[:N].reshape(N, 1, H), _rows_contiguous(present_k)[0],
                          _rows_contiguous(present_v)[0], p, total,
                          _float32_scale(self.scale, H), self.window, fn=fn,
                          split=N < self.threads, threads=self.threads)
        return out.reshape(1, 1, N * H), present_k, present_v, None

    def _decode_one(self, query, past_key, past_value, total, T_max, cos_cache, sin_cache,
                    position_ids):
        """The general path's numbers for one new token of one sequence (``query`` packed
        (1, 1, (N + 2 Nkv) H)), with attend's and softmax_'s operations on 2-D and 3-D views
        and none of the masks and per-row bookkeeping: the new key and value are written at
        position total - 1 (_present) and attention reads the first ``total`` positions."""
        N, Nkv = self.N, self.Nkv
        H = query.shape[2] // (N + 2 * Nkv)
        p = total - 1
        qk = query[0, 0, :(N + Nkv) * H].reshape(N + Nkv, H)  # q's heads then k's
        if self.rotary:
            pos = p if position_ids is None else int(position_ids.reshape(-1)[0])
            cos = cos_cache[pos].astype(np.float32, copy=False)  # (rot/2,)
            sin = sin_cache[pos].astype(np.float32, copy=False)
            qk = rotate(qk, cos, sin, self.interleaved, cos_cache.shape[1] * 2)
        v = query[0, 0, (N + Nkv) * H:].reshape(1, Nkv, 1, H)
        if self.share and past_key.shape[2] >= T_max and past_key.flags.writeable and \
                past_value.flags.writeable:  # _present's shared-buffer case, one row
            past_key[0, :, p] = qk[N:]
            past_value[0, :, p] = v[0, :, 0]
            present_k, present_v = past_key, past_value
        else:
            present_k, present_v = self._present(
                past_key, past_value, qk[N:].reshape(1, Nkv, 1, H), v, np.array([p]),
                np.array([1]), T_max, np.dtype(np.float32))
        # attend: q scaled, one product per kv head with its group of query heads stacked
        q = np.multiply(qk[:N], np.float32(_scale(self.scale, H)))
        scores = np.matmul(q.reshape(Nkv, N // Nkv, H),
                           present_k[0, :, :total].transpose(0, 2, 1))
        probs = softmax_(scores)
        out = np.matmul(probs, present_v[0, :, :total])
        return out.reshape(1, 1, N * H), present_k, present_v, None

    def _present(self, past_key, past_value, k, v, past_len, valid, T_max, dt):
        """The cache after this step: each batch's first past_len rows of the past, then its
        valid new rows; the rest zero. Its length is the larger of the past buffer's and the
        total sequence length. With a shared buffer (_shares_past_present) that holds the
        whole sequence, the new rows are written into the past buffers, which are returned."""
        B, Nkv, S, H = k.shape
        P_buf = 0 if past_key is None else past_key.shape[2]
        T = max(P_buf, T_max)
        if past_key is not None:
            dt = past_key.dtype
        if self.share and P_buf >= T_max and past_key.flags.writeable and \
                past_value.flags.writeable:
            if B == 1:
                p, n = int(past_len[0]), min(S, int(valid[0]))
                past_key[:, :, p:p + n] = k[:, :, :n]
                past_value[:, :, p:p + n] = v[:, :, :n]
                return [past_key, past_value]
            b_idx, s_idx = np.nonzero(np.arange(S)[None, :] < valid[:, None])
            for past, new in ((past_key, k), (past_value, v)):
                np.moveaxis(past, 2, 1)[b_idx, past_len[b_idx] + s_idx] = np.moveaxis(
                    new, 2, 1)[b_idx, s_idx]
            return [past_key, past_value]
        out = []
        if B == 1 or (np.all(past_len == past_len[0]) and np.all(valid == S)):
            # one past length for every row (decoding one sequence): block copies of the
            # rows that count, instead of a masked pass over the whole buffer
            p, n = int(past_len[0]), min(S, int(valid[0]))
            for past, new in ((past_key, k), (past_value, v)):
                present = np.empty((B, Nkv, T, H), dtype=dt)
                if p:
                    present[:, :, :p] = past[:, :, :p]
                present[:, :, p:p + n] = new[:, :, :n]
                present[:, :, p + n:] = 0
                out.append(present)
            return out
        for past, new in ((past_key, k), (past_value, v)):
            present = np.zeros((B, Nkv, T, H), dtype=dt)
            if past is not None and P_buf:
                keep = (np.arange(P_buf)[None, :] < past_len[:, None])[:, None, :, None]
                present[:, :, :P_buf] = np.where(keep, past, 0)
            rows = np.arange(S)
            dst = np.moveaxis(present, 2, 1)  # (B, T, Nkv, H) view
            b_idx, s_idx = np.nonzero(rows[None, :] < valid[:, None])
            dst[b_idx, past_len[b_idx] + s_idx] = np.moveaxis(new, 2, 1)[b_idx, s_idx]
            out.append(present)
        return out


_gqa = None  # compiled.gqa, imported on first use (it loads jit)
_rms = None  # compiled.rms_norm, imported when a normalization is prepared
# decode_step keeps a token's scores on the stack: keys up to this many (64 KiB) take it
_STEP_MAX_KEYS = 1 << 14
address = None  # compiled.jit.address, the same


class _HeldAddress:
    """An array's address, remembered while the same array comes back (held weakly: the
    array is not kept alive); one tuple swapped whole, so concurrent runs read a matching
    pair."""

    __slots__ = ("held",)

    def __init__(self) -> None:
        self.held = (lambda: None, 0)

    def __call__(self, a: np.ndarray) -> int:
        held = self.held
        if held[0]() is not a:
            held = self.held = (weakref.ref(a), address(a))
        return held[1]


def _rows_contiguous(x: np.ndarray) -> np.ndarray:
    """``x`` (..., T, H) float32 whose rows of H are contiguous (compiled.gqa reads rows by
    their stride): itself where they are."""
    if x.dtype == np.float32 and x.strides[-1] == 4 and all(s % 4 == 0 for s in x.strides):
        return x
    return np.ascontiguousarray(x, np.float32)


def _shares_past_present(ctx: KernelContext) -> bool:
    """Whether the session asked for onnxruntime-genai's past_present_share_buffer: the
    GroupQueryAttention kernels then write a step's new keys and values into the past buffers
    themselves and return those as present, where the buffers hold the whole sequence (a
    max_length cache), instead of copying the cache into a new present each step. Opted into
    with the session config entry ``onnxrun.past_present_share_buffer`` = "1" (onnxrun.genai
    sets it): a caller that feeds the cache back as it comes reads present; one that keeps an
    old past would see it change, so it is never the default."""
    options = ctx.session_options
    try:
        return options is not None and options.get_session_config_entry(
            SHARE_PAST_PRESENT) == "1"
    except RuntimeError:  # no such entry
        return False


SHARE_PAST_PRESENT = "onnxrun.past_present_share_buffer"


# -- RotaryEmbedding ---------------------------------------------------------------------------


@op("RotaryEmbedding", 1, domain=MS)
def RotaryEmbedding(input, position_ids, cos_cache, sin_cache, *,  # noqa: A002 - schema
                    interleaved=0, is_packed_batching=0, num_heads=0, rotary_embedding_dim=0,
                    scale=1.0):
    X = input
    cdt = compute_dtype(X.dtype)
    pos = np.asarray(position_ids).astype(np.int64)
    if X.ndim == 4:  # (B, N, S, H)
        S = X.shape[2]
        x = X
    else:  # (B, S, D)
        B, S, D = X.shape
        if rotary_embedding_dim and num_heads:
            H = D // int(num_heads)
        else:
            H = cos_cache.shape[1] * 2
        x = X.reshape(B, S, D // H, H)
    if pos.size == 1:  # a start offset shared by the batch
        pos = pos.reshape(1, 1) + np.arange(S)
    cos = cos_cache.astype(cdt, copy=False)[pos]
    sin = sin_cache.astype(cdt, copy=False)[pos]
    cos, sin = (cos[:, None], sin[:, None]) if X.ndim == 4 else (cos[:, :, None], sin[:, :, None])
    rot = int(rotary_embedding_dim) or x.shape[-1]
    y = rotate(x.astype(cdt, copy=False), cos, sin, bool(interleaved), rot)
    return y.reshape(X.shape).astype(X.dtype, copy=False)


# -- EmbedLayerNormalization -------------------------------------------------------------------


@op("EmbedLayerNormalization", 1, domain=MS)
class EmbedLayerNormalization:
    def __init__(self, ctx: KernelContext, *, epsilon=1e-12, mask_index_type=1) -> None:
        self.epsilon = float(epsilon)
        self.want_sum = ctx.output_used(2)

    def __call__(self, input_ids, segment_ids, word_embedding, position_embedding,
                 segment_embedding=None, gamma=None, beta=None, mask=None, position_ids=None):
        B, S = input_ids.shape
        sd = _stat_dtype(word_embedding.dtype)
        s = word_embedding[input_ids].astype(sd)
        if position_ids is not None:
            s += position_embedding[np.broadcast_to(position_ids, (B, S))].astype(sd, copy=False)
        else:
            s += position_embedding[:S].astype(sd, copy=False)
        if segment_ids is not None and segment_embedding is not None:
            s += segment_embedding[segment_ids].astype(sd, copy=False)
        dt = word_embedding.dtype
        total = s.astype(dt, copy=False) if self.want_sum else None
        Y, _, _ = _layer_norm(s, gamma, beta, self.epsilon, None if self.want_sum else s)
        if mask is not None:
            mask_index = (mask != 0).sum(axis=1).astype(np.int32)
        else:
            mask_index = np.zeros(B, dtype=np.int32)
        return Y.astype(dt, copy=False), mask_index, total


def _dq(q, scale, zp) -> np.ndarray | None:
    if q is None:
        return None
    return ((q.astype(np.float32) - np.asarray(zp, np.float32)) * np.asarray(scale, np.float32))


@op("QAttention", 1, domain=MS)
class QAttention(Attention):
    """Attention over an 8-bit input and packed QKV weight (dequantized; a constant weight once,
    at session creation)."""

    def __init__(self, ctx: KernelContext, *, num_heads, qkv_hidden_sizes=None, unidirectional=0,
                 scale=0.0, mask_filter_value=-10000.0, past_present_share_buffer=0,
                 do_rotary=0, rotary_embedding_dim=0) -> None:
        super().__init__(ctx, num_heads=num_heads, qkv_hidden_sizes=qkv_hidden_sizes,
                         unidirectional=unidirectional, scale=scale,
                         mask_filter_value=mask_filter_value,
                         past_present_share_buffer=past_present_share_buffer,
                         do_rotary=do_rotary, rotary_embedding_dim=rotary_embedding_dim)
        c = ctx.constants_of((1, 4, 7))
        self.W = None
        if c is not None and all(v is not None for v in c):
            self.W = self._scaled(_dq(c[0], c[1], c[2]))
        # the 8-bit weight is read per run unless dequantized here (Attention's own panels
        # and release judged the weight as a float one)
        self._pack()

    def __call__(self, input, weight, bias, input_scale, weight_scale, mask_index=None,  # noqa: A002
                 input_zero_point=None, weight_zero_point=None, past=None):
        izp = 0 if input_zero_point is None else input_zero_point
        wzp = 0 if weight_zero_point is None else weight_zero_point
        held = self.W is not None or self.packed is not None
        W = weight if held else _dq(weight, weight_scale, wzp)
        return super().__call__(_dq(input, input_scale, izp), W, bias, mask_index, past)


@op("QEmbedLayerNormalization", 1, domain=MS)
class QEmbedLayerNormalization(EmbedLayerNormalization):
    """EmbedLayerNormalization over 8-bit embedding tables, gamma and beta (dequantized)."""

    def __call__(self, input_ids, segment_ids, word_embedding, position_embedding,
                 segment_embedding, gamma, beta, mask, word_scale, position_scale,
                 segment_scale, gamma_scale, beta_scale, word_zp, position_zp, segment_zp,
                 gamma_zp, beta_zp):
        Y, mask_index, _ = super().__call__(
            input_ids, segment_ids, _dq(word_embedding, word_scale, word_zp),
            _dq(position_embedding, position_scale, position_zp),
            _dq(segment_embedding, segment_scale, segment_zp), _dq(gamma, gamma_scale, gamma_zp),
            _dq(beta, beta_scale, beta_zp), mask)
        return Y, mask_index
