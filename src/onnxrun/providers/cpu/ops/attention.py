"""Attention and the transformer building blocks of the ai.onnx domain: Attention (23-25),
RotaryEmbedding, RMSNormalization, SwiGLU, TensorScatter, LinearAttention, CausalConvWithState
and the preview FlexAttention.

``attend`` (scaled dot-product attention batched over heads, grouped-query aware) and
``rotate`` (rotary embedding) are shared with the com.microsoft kernels in ``contrib/``.
float16 inputs are computed in float32 and rounded once at the end; bfloat16 attention is
computed step by step in bfloat16, as the ONNX reference does (its 8-bit significand leaves no
room for a different rounding).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import numpy as np

from ....dtypes import np_dtype
from .. import blas, parallel
from ..kernels import KernelContext, op
from .activation import sigmoid
from .reduction import max_last, sum_trailing


def compute_dtype(dtype: np.dtype) -> np.dtype:
    """float64 stays float64; every narrower float (float16, bfloat16) computes in float32."""
    return np.dtype(np.float64) if dtype == np.float64 else np.dtype(np.float32)


def _native_dtype(dtype: np.dtype) -> np.dtype:
    """Attention's compute dtype: bfloat16 is kept (with 8 significant bits, only computing
    step by step in bfloat16 like the ONNX reference reproduces its results); float16 and
    float32 compute in float32."""
    return dtype if dtype.kind == "V" else compute_dtype(dtype)


def to_heads(x: np.ndarray, num_heads: int) -> np.ndarray:
    """(B, S, H*D) -> (B, H, S, D) (a view)."""
    B, S, hidden = x.shape
    return x.reshape(B, S, num_heads, hidden // num_heads).transpose(0, 2, 1, 3)


def from_heads(x: np.ndarray) -> np.ndarray:
    """(B, H, S, D) -> (B, S, H*D)."""
    B, H, S, D = x.shape
    return x.transpose(0, 2, 1, 3).reshape(B, S, H * D)


def softmax_(x: np.ndarray, sink: np.ndarray | None = None) -> np.ndarray:
    """Softmax over the last axis of ``x`` in place (``x`` must be owned and contiguous).

    Rows that are entirely -inf give zeros rather than NaN. ``sink`` (broadcastable to
    ``x.shape[:-1] + (1,)``) adds one extra logit per row to the denominator only.
    """
    n = x.shape[-1]
    m = max_last(x) if x.size >= 4096 else x.max(axis=-1, keepdims=True)
    if sink is not None:
        m = np.maximum(m, sink)
    m[np.isneginf(m)] = 0  # a fully masked row: exp(-inf - 0) = 0 instead of NaN
    x -= m
    np.exp(x, out=x)
    if x.flags.c_contiguous and n and x.dtype.kind == "f":
        s = sum_trailing(x, n).reshape(x.shape[:-1] + (1,))
    else:
        s = x.sum(axis=-1, keepdims=True)
    if sink is not None:
        s += np.exp(sink - m)
    s[s == 0] = 1
    if x.dtype.itemsize <= 2:
        x /= s  # 16-bit floats: divide, so rounding matches the step-by-step reference
    else:
        np.reciprocal(s, out=s)  # one division per row, then a product per element
        x *= s
    return x


# stages of the score matrix a caller may capture
RAW, SOFTCAPPED, BIASED, PROBS = 0, 1, 2, 3


def attend(q: np.ndarray, k: np.ndarray, v: np.ndarray, bias: np.ndarray | None = None, *,
           scale: float, softcap: float = 0.0, sink: np.ndarray | None = None,
           softmax_dtype: np.dtype | None = None, capture: int | None = None,
           zero_masked_rows: bool = True) -> tuple[np.ndarray, np.ndarray | None]:
    """Scaled dot-product attention batched over heads.

    q (B, Hq, S, D), k (B, Hkv, T, D), v (B, Hkv, T, Dv), all of one float dtype; Hq is a
    multiple of Hkv and query head h reads key/value head h // (Hq // Hkv). ``bias`` (additive,
    -inf where masked) broadcasts to (B, Hq, S, T). Returns the output (B, Hq, S, Dv) and, when
    ``capture`` names a stage, a copy of the (B, Hq, S, T) scores at that stage.
    """
    B, Hq, S, D = q.shape
    Hkv, T = k.shape[1], k.shape[2]
    G = Hq // Hkv
    dt = q.dtype
    if dt.kind == "V":  # bfloat16: scale both sides by sqrt(scale), as the reference does
        root = dt.type(math.sqrt(scale))
        q, k = q * root, k * root
    else:  # written C-ordered so that the head-group reshape below is free
        q = np.multiply(q, dt.type(scale), out=np.empty(q.shape, dt))
    # query heads sharing one kv head are stacked along the row axis: one matmul per kv head
    scores = blas.matmul(q.reshape(B, Hkv, G * S, D), np.swapaxes(k, -1, -2))
    scores = scores.reshape(B, Hq, S, T).astype(dt, copy=False)  # bfloat16 matmuls give float32
    kept = None
    if capture == RAW:
        kept = scores.copy()
    if softcap and softcap > 0:
        scores *= dt.type(1.0 / softcap)
        np.tanh(scores, out=scores)
        scores *= dt.type(softcap)
    if capture == SOFTCAPPED:
        kept = scores.copy()
    if bias is not None:
        scores += bias
    if capture == BIASED:
        kept = scores.copy()
    if softmax_dtype is not None and softmax_dtype != dt:
        probs = softmax_(scores.astype(softmax_dtype), sink).astype(dt)
    else:
        probs = softmax_(scores, sink)
    if zero_masked_rows and bias is not None:
        masked = np.isneginf(bias.max(axis=-1, keepdims=True))
        if masked.any():  # a row with no key to attend outputs zeros
            probs = np.where(masked, dt.type(0), probs)
    if capture == PROBS:
        kept = probs.copy()
    out = blas.matmul(probs.reshape(B, Hkv, G * S, T), v).reshape(B, Hq, S, v.shape[-1])
    return out.astype(dt, copy=False), kept


LOG2E = 1.4426950408889634

# attend_exp2: below this row sum of exponentials (2^-60), small weights may have lost precision
# in the subnormal range, or masked ones (clipped to 2^-126) may weigh (or every key is masked):
# the row is computed the stable way instead
_TINY_ROW_SUM = 2.0 ** -60
# attend_exp2 works in blocks of heads with at most this many bytes of scores, which stay in the
# L2 cache from the product that makes them to the one that reads them
_CHUNK_BYTES = 1 << 20


def _as_4d(a: np.ndarray | None) -> np.ndarray | None:
    return None if a is None else a.reshape((1,) * (4 - a.ndim) + a.shape)


def _mask_block(bias: np.ndarray, b: int, h0: int, h1: int, lo: int, hi: int) -> np.ndarray:
    """The (heads, S, keys) block of a 4-D mask broadcastable to (B, N, S, T)."""
    bb = bias[b if bias.shape[0] > 1 else 0]
    bb = bb[h0:h1] if bb.shape[0] > 1 else bb
    return bb[..., lo:hi] if bb.shape[-1] > 1 else bb


def attend_exp2(q: np.ndarray, k: np.ndarray, v: np.ndarray, out: np.ndarray, *,
                keep: np.ndarray | None = None, bias: np.ndarray | None = None,
                key_ranges: list[tuple[int, int]] | None = None,
                exact_bias: Callable[[], np.ndarray | None] | None = None,
                threads: int = 1) -> None:
    """Softmax attention (float32 or float64) of queries that come multiplied by
    scale * log2(e), so that the softmax's exponentials are numpy's exp2 (twice as fast as exp).

    q (B, N, S, D), k (B, N, T, D), v (B, N, T, Dv): views of any strides, T >= 1; the result
    goes into ``out`` (B, S, N, Dv). Masks, each broadcastable to (B, N, S, T):
    ``bias`` is added to the scores, in log2 units; ``keep`` (0 or 1, the dtype of q)
    multiplies the exponentials (a masked score is never exponentiated: exp2 is slow where it
    underflows); ``key_ranges`` (per batch: lo, hi, non-empty) are the only keys a batch reads.
    Masking by ``keep`` or ``key_ranges`` must give the same weights as the operator's own
    additive mask (which ``exact_bias()`` returns in natural-log units, or None): exactly 0.

    The exponentials are taken without subtracting each row's maximum: softmax is invariant to
    it, and a row sum that is finite and not tiny proves that no exponential overflowed or lost
    precision. Blocks with a row that fails the test (huge scores, fully masked rows) are
    computed again the usual way, from natural-unit scores and ``exact_bias()``. The
    normalization divides the (S, Dv) outputs rather than the (S, T) weights.

    The blocks of heads (a batch's, cut by ``_head_blocks``: by the shapes only, so the
    results do not depend on ``threads``) run on the intra-op threads, each whole on one.
    """
    B, N, S, _ = q.shape
    T = k.shape[2]
    dt = q.dtype
    keep, bias = _as_4d(keep), _as_4d(bias)
    fi = np.finfo(dt)
    exact: list = []  # exact_bias(), made on first use

    def stable(b, h0, h1):
        if not exact:
            exact.append(_as_4d(exact_bias() if exact_bias is not None else None))
        s = blas.matmul(q[b, h0:h1], np.swapaxes(k[b, h0:h1], -1, -2))
        s *= dt.type(1.0 / LOG2E)
        if exact[0] is not None:
            s += _mask_block(exact[0], b, h0, h1, 0, T)
        return blas.matmul(softmax_(s), v[b, h0:h1])

    def block(b, h0, h1):
        lo, hi = key_ranges[b] if key_ranges is not None else (0, T)
        # keys transposed into a contiguous copy: BLAS then multiplies ~20% faster
        s = blas.matmul(q[b, h0:h1], np.ascontiguousarray(np.swapaxes(k[b, h0:h1, lo:hi], -1, -2)))
        if bias is not None:
            s += _mask_block(bias, b, h0, h1, lo, hi)
            # a mask given as a bias (-1e9, the lowest float) would make exp2 underflow, 10-100x
            # slower than its normal range: clipped to the smallest normal power (weight ~0),
            # and to the first power that overflows (the block is then redone the stable way)
            np.clip(s, fi.minexp, fi.maxexp, out=s)
        np.exp2(s, out=s)  # an overflow shows in the sums: the block is redone below
        if keep is not None:
            s *= _mask_block(keep, b, h0, h1, lo, hi)
        sums = sum_trailing(s, hi - lo)
        dst = np.swapaxes(out[b, :, h0:h1], 0, 1)  # (heads, S, Dv) view of the output
        if sums.min() >= _TINY_ROW_SUM and sums.max() < np.inf:
            o = blas.matmul(s, v[b, h0:h1, lo:hi])
            np.reciprocal(sums, out=sums)
            np.multiply(o, sums.reshape(h1 - h0, S, 1), out=dst)
        else:
            dst[...] = stable(b, h0, h1)

    head_macs = S * T * (q.shape[-1] + v.shape[-1])
    if keep is None and bias is None and _compiled_heads(q, k, v, out, key_ranges, threads,
                                                         stable):
        return
    per_block = _head_blocks(B, N, S * T * dt.itemsize, head_macs)
    blocks = [(b, h0, min(N, h0 + per_block)) for b in range(B) for h0 in range(0, N, per_block)]
    with np.errstate(all="ignore"):  # overflows and masked rows are handled above
        if threads > 1 and len(blocks) > 1 and \
                B * N * head_macs >= 2 * parallel.MIN_MACS_PER_RANGE:
            parallel.run_ranges(lambda i, _: block(*blocks[i]),
                                [(i, i + 1) for i in range(len(blocks))])
        else:
            for b, h0, h1 in blocks:
                block(b, h0, h1)


def _unit_rows(x: np.ndarray) -> bool:
    """Whether BLAS can read ``x`` (4-D float32) as row-major matrices by its row stride."""
    st = x.strides
    return st[3] == 4 and all(s >= 0 and s % 4 == 0 for s in st) and \
        st[2] >= 4 * max(1, x.shape[3])


def _compiled_heads(q, k, v, out, key_ranges, threads: int, stable) -> bool:
    """attend_exp2 without masks on float32 heads by ``compiled.attention_heads``: each head
    one compiled job (cblas_sgemm, the softmax pass, cblas_sgemm), the heads taken in turn by
    spin.py's workers (no Python between them); heads whose row sums fail the test redone
    ``stable``. False where it cannot run (nothing done then)."""
    if q.dtype != np.float32 or k.dtype != np.float32 or v.dtype != np.float32 or \
            not out.flags.c_contiguous or not all(map(_unit_rows, (q, k, v))):
        return False
    from ..compiled import attention_heads, spin

    sgemm = blas.cblas_sgemm()
    # (blas.matmul not numpy's own: Pyodide's products, which the tests force on here)
    if sgemm is None or blas.matmul_function(np.float32) is not np.matmul or \
            attention_heads.unavailable() is not None:
        return False
    B, N, S, _ = q.shape
    heads, keys = _heads(B, N, k.shape[2], None if key_ranges is None else tuple(key_ranges))
    T = k.shape[2]
    macs = S * keys * (q.shape[3] + v.shape[3])
    if macs < attention_heads.MIN_MACS:  # small heads: the numpy blocks are faster
        return False
    # the heads split where the work is worth two of the float GEMM's ranges, and BLAS is at
    # one thread (else each part's products would queue for OpenBLAS's own threads)
    split = threads > 1 and blas.one_thread and macs >= 2 * attention_heads.SPLIT_MACS
    job = attention_heads.job(sgemm[1])
    # split: heads in groups whose scores (one buffer per head) stay under SCRATCH_BYTES (at
    # least two: both threads busy); else all at once, one after another in one buffer
    group = max(2, attention_heads.SCRATCH_BYTES // (4 * S * (T + 1))) if split else len(heads)
    for g0 in range(0, len(heads), group):
        part = heads[g0:g0 + group]
        # the scratch held until the jobs end
        blocks, _scratch, flags = attention_heads.head_blocks(sgemm[0], q, k, v, out, part,
                                                              one_scratch=not split)
        spin.run_blocks(job, blocks, threads if split else 1)
        if flags.any():
            with np.errstate(all="ignore"):
                for i in np.flatnonzero(flags):
                    b, h = part[i][:2]
                    out[b, :, h] = stable(b, h, h + 1)[0]
    return True


@functools.lru_cache(maxsize=64)
def _heads(B: int, N: int, T: int, key_ranges: tuple | None) -> tuple[tuple, int]:
    """_compiled_heads' heads (b, h, key lo, key hi) and their keys in all, per shape."""
    heads = tuple((b, h, *(key_ranges[b] if key_ranges is not None else (0, T)))
                  for b in range(B) for h in range(N))
    return heads, sum(hi - lo for _, _, lo, hi in heads)


# attend_exp2 cuts a few large blocks further, into at least this many (of at least
# parallel.MIN_MACS_PER_RANGE multiply-adds each), for the intra-op threads: BERT's 2
# sequences of 12 heads are 2 blocks by the cache bound alone
_MIN_BLOCKS = 4


def _head_blocks(B: int, N: int, head_bytes: int, head_macs: int) -> int:
    """Heads per block of attend_exp2: at most _CHUNK_BYTES of scores, and fewer when the
    blocks would be under _MIN_BLOCKS, as long as each keeps parallel.MIN_MACS_PER_RANGE of
    work. A function of the shapes only: a thread count never changes a result."""
    per_block = max(1, min(N, _CHUNK_BYTES // max(1, head_bytes)))
    if B * -(-N // per_block) < _MIN_BLOCKS:
        wanted = -(-N // -(-_MIN_BLOCKS // B))  # heads per block for _MIN_BLOCKS blocks
        least = -(-parallel.MIN_MACS_PER_RANGE // max(1, head_macs))  # worth a hand-off
        per_block = min(per_block, max(wanted, least))
    return per_block


def neg_inf_where_not(allowed: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Additive bias: 0 where ``allowed``, -inf elsewhere."""
    return np.where(allowed, dtype.type(0), dtype.type(-np.inf))


def add_bias(bias: np.ndarray | None, extra: np.ndarray) -> np.ndarray:
    return extra if bias is None else bias + extra


# -- Attention -----------------------------------------------------------------------------------


def _pad_mask(mask: np.ndarray, total: int) -> np.ndarray:
    """A mask shorter than the key length is padded with masked (False / -inf) columns."""
    pad = total - mask.shape[-1]
    if pad <= 0:
        return mask
    value = False if mask.dtype == np.bool_ else -np.inf
    return np.pad(mask, [(0, 0)] * (mask.ndim - 1) + [(0, pad)], constant_values=value)


def _offset_positions(S: int, T: int, offset):
    """query position i + offset minus key position j: (S, T), or (B, 1, S, T) per batch."""
    i = np.arange(S).reshape(S, 1)
    j = np.arange(T).reshape(1, T)
    if np.ndim(offset):
        return (i + np.reshape(offset, (-1, 1, 1, 1))) - j
    return (i + int(offset)) - j


@op("Attention", 23, 24, 25)
class Attention:
    def __init__(self, ctx: KernelContext, *, is_causal=0, kv_num_heads=None, q_num_heads=None,
                 qk_matmul_output_mode=0, scale=None, softcap=0.0, softmax_precision=None,
                 left_window_size=-1, right_window_size=-1) -> None:
        self.is_causal = bool(is_causal)
        self.q_heads = None if q_num_heads is None else int(q_num_heads)
        self.kv_heads = None if kv_num_heads is None else int(kv_num_heads)
        self.mode = int(qk_matmul_output_mode)
        self.scale = None if scale is None else float(scale)
        self.softcap = float(softcap)
        self.softmax_dtype = None if softmax_precision is None else np_dtype(softmax_precision)
        self.left = int(left_window_size)
        self.right = int(right_window_size)
        self.want_qk = ctx.output_used(3)

    def __call__(self, Q, K, V, attn_mask=None, past_key=None, past_value=None,
                 nonpad_kv_seqlen=None):
        if Q.shape[0] == 0:  # as onnxruntime, which refuses an empty batch
            raise ValueError("Attention: the batch size must be greater than 0")
        three_d = Q.ndim == 3
        if three_d:
            if self.q_heads is None or self.kv_heads is None:
                raise ValueError("3-D Attention inputs need q_num_heads and kv_num_heads")
            Q, K, V = to_heads(Q, self.q_heads), to_heads(K, self.kv_heads), to_heads(
                V, self.kv_heads)
        if Q.shape[1] % K.shape[1] or K.shape[1] != V.shape[1]:
            raise ValueError(f"query heads {Q.shape[1]} are not a multiple of kv heads "
                             f"{K.shape[1]} (value heads {V.shape[1]})")
        if past_key is not None:
            K = np.concatenate((past_key, K), axis=2)
            V = np.concatenate((past_value, V), axis=2)
        present_k, present_v = K, V
        B, S = Q.shape[0], Q.shape[2]
        T = K.shape[2]
        cdt = _native_dtype(Q.dtype)
        bias = self._bias(attn_mask, past_key, nonpad_kv_seqlen, B, S, T, cdt)
        scale = self.scale if self.scale is not None else 1.0 / math.sqrt(Q.shape[3])
        softmax_dtype = self.softmax_dtype
        if softmax_dtype is not None:
            softmax_dtype = max(_native_dtype(softmax_dtype), cdt, key=lambda d: d.itemsize)
        out, qk = attend(Q.astype(cdt, copy=False), K.astype(cdt, copy=False),
                         V.astype(cdt, copy=False), bias, scale=scale, softcap=self.softcap,
                         softmax_dtype=softmax_dtype,
                         capture=self.mode if self.want_qk else None)
        if three_d:
            out = from_heads(out)
        out = out.astype(Q.dtype, copy=False)
        if qk is not None:
            qk = qk.astype(Q.dtype, copy=False)
        return out, present_k, present_v, qk

    def _bias(self, mask, past_key, nonpad, B, S, T, cdt):
        bias = None
        if mask is not None:
            mask = _pad_mask(mask, T)
            bias = neg_inf_where_not(mask, cdt) if mask.dtype == np.bool_ else mask.astype(cdt)
        windowed = self.left >= 0 or self.right >= 0
        if self.is_causal or windowed:
            if past_key is None and nonpad is not None:
                offset = nonpad.reshape(-1).astype(np.int64) - S
            else:
                offset = past_key.shape[2] if past_key is not None else 0
            diff = _offset_positions(S, T, offset)
            allowed = np.ones(diff.shape, dtype=bool)
            if self.is_causal:
                allowed &= diff >= 0
            if self.left >= 0:
                allowed &= diff <= self.left
            if self.right >= 0:
                allowed &= -diff <= self.right
            bias = add_bias(bias, neg_inf_where_not(allowed, cdt))
        if nonpad is not None:
            valid = np.arange(T) < nonpad.reshape(-1, 1)
            bias = add_bias(bias, neg_inf_where_not(valid, cdt).reshape(B, 1, 1, T))
        return bias


# -- FlexAttention (ai.onnx.preview) -------------------------------------------------------------


@op("FlexAttention", 1, domain="ai.onnx.preview")
class FlexAttention:
    def __init__(self, ctx: KernelContext, *, prob_mod=None, score_mod=None,
                 softmax_precision=None, scale=None) -> None:
        self.prob_mod = prob_mod
        self.score_mod = score_mod
        self.softmax_dtype = None if softmax_precision is None else np_dtype(softmax_precision)
        self.scale = None if scale is None else float(scale)

    def __call__(self, Q, K, V, *captured):
        dt = self.softmax_dtype or (Q.dtype if Q.dtype == np.float64 else np.dtype(np.float32))
        G = Q.shape[1] // K.shape[1]
        B, Hq, S, D = Q.shape
        T = K.shape[2]
        scale = self.scale if self.scale is not None else 1.0 / math.sqrt(D)
        q = Q.astype(dt) * dt.type(scale)
        scores = np.matmul(q.reshape(B, K.shape[1], G * S, D),
                           np.swapaxes(K.astype(dt, copy=False), -1, -2)).reshape(B, Hq, S, T)
        if self.score_mod is not None:
            scores = np.array(self.score_mod([scores], captured)[0], dtype=dt)
        probs = softmax_(scores)
        if self.prob_mod is not None:
            probs = np.array(self.prob_mod([probs], captured)[0], dtype=dt)
        out = np.matmul(probs.reshape(B, K.shape[1], G * S, T), V.astype(dt, copy=False))
        return out.reshape(B, Hq, S, V.shape[-1]).astype(V.dtype, copy=False)


# -- RotaryEmbedding -----------------------------------------------------------------------------


def rotate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, interleaved: bool, rot_dim: int
           ) -> np.ndarray:
    """Rotary embedding of the first ``rot_dim`` features of ``x`` (last axis); ``cos``/``sin``
    (rot_dim / 2 on the last axis) broadcast against ``x[..., :rot_dim // 2]``."""
    half = rot_dim // 2
    y = np.array(x, copy=True)
    if interleaved:
        x1, x2 = x[..., 0:rot_dim:2], x[..., 1:rot_dim:2]
        o1, o2 = y[..., 0:rot_dim:2], y[..., 1:rot_dim:2]
    else:
        x1, x2 = x[..., :half], x[..., half:rot_dim]
        o1, o2 = y[..., :half], y[..., half:rot_dim]
    o1[...] = cos * x1 - sin * x2
    o2[...] = sin * x1 + cos * x2
    return y


@op("RotaryEmbedding", 23)
def RotaryEmbedding(X, cos_cache, sin_cache, position_ids=None, *, interleaved=0,
                    num_heads=None, rotary_embedding_dim=0):
    if position_ids is not None:  # (max_position, rot/2) caches indexed per token -> (B, S, rot/2)
        cos_cache, sin_cache = cos_cache[position_ids], sin_cache[position_ids]
    if X.ndim == 4:  # (B, H, S, D): one row of the cache per (batch, position)
        x = X
        cos, sin = cos_cache[:, None], sin_cache[:, None]
    else:  # (B, S, H*D)
        if not num_heads:
            raise ValueError("RotaryEmbedding on a 3-D input needs num_heads")
        B, S, hidden = X.shape
        x = X.reshape(B, S, int(num_heads), hidden // int(num_heads))
        cos, sin = cos_cache[:, :, None], sin_cache[:, :, None]
    rot = int(rotary_embedding_dim) or x.shape[-1]
    if cos.shape[-1] != rot // 2:
        raise ValueError(f"cos_cache last dimension {cos.shape[-1]} != rotary dim / 2 "
                         f"({rot // 2})")
    cdt = compute_dtype(X.dtype)
    y = rotate(x.astype(cdt, copy=False), cos.astype(cdt, copy=False),
               sin.astype(cdt, copy=False), bool(interleaved), rot)
    return y.reshape(X.shape).astype(X.dtype, copy=False)


# -- RMSNormalization ----------------------------------------------------------------------------


def rms_normalize(X: np.ndarray, scale: np.ndarray, axis: int, epsilon: float,
                  sd: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """X / sqrt(mean(X^2 over axis..) + eps) * scale in ``sd``; also returns 1 / rms."""
    axis = axis + X.ndim if axis < 0 else axis
    Xs = X.astype(sd, copy=False)
    n = math.prod(X.shape[axis:])
    if Xs.flags.c_contiguous and n:
        ms = sum_trailing(np.square(Xs), n).reshape(X.shape[:axis] + (1,) * (X.ndim - axis))
        ms *= sd.type(1.0 / n)
    else:
        ms = np.mean(np.square(Xs), axis=tuple(range(axis, X.ndim)), keepdims=True)
    ms += sd.type(epsilon)
    inv = np.sqrt(ms, out=ms)
    np.reciprocal(inv, out=inv)
    Y = Xs * inv
    Y *= scale.astype(sd, copy=False)
    return Y, inv


@op("RMSNormalization", 23)
def RMSNormalization(X, scale, *, axis=-1, epsilon=1e-5, stash_type=1):
    sd = np.dtype(np.float64) if X.dtype == np.float64 else np_dtype(int(stash_type))
    Y, _ = rms_normalize(X, scale, int(axis), float(epsilon), compute_dtype(sd))
    return Y.astype(scale.dtype, copy=False)


# -- SwiGLU, TensorScatter -----------------------------------------------------------------------


@op("SwiGLU", 28)
def SwiGLU(A, B, *, alpha=1.0):
    if A.shape != B.shape:
        raise ValueError(f"SwiGLU inputs must have one shape, got {A.shape} and {B.shape}")
    cdt = compute_dtype(A.dtype)
    a = A.astype(cdt, copy=False)
    Y = sigmoid(a * cdt.type(alpha))
    Y *= a
    Y *= B.astype(cdt, copy=False)
    return Y.astype(A.dtype, copy=False)


@op("TensorScatter", 24)
def TensorScatter(past_cache, update, write_indices=None, *, axis=-2, mode="linear"):
    axis = int(axis) % past_cache.ndim
    if axis == 0:
        raise ValueError("TensorScatter axis must not be the batch axis")
    if mode not in ("linear", "circular"):
        raise ValueError(f"unsupported TensorScatter mode {mode!r}")
    B, max_len = past_cache.shape[0], past_cache.shape[axis]
    L = update.shape[axis]
    start = (np.zeros(B, np.int64) if write_indices is None
             else write_indices.reshape(-1).astype(np.int64))
    idx = start[:, None] + np.arange(L)  # (B, L): cache position of each update row
    if mode == "circular":
        idx %= max_len
    elif L and (idx.min() < 0 or idx.max() >= max_len):
        raise ValueError("TensorScatter writes past the end of the cache")
    present = past_cache.copy()
    dst = np.moveaxis(present, axis, 1)  # (B, max_len, ...): a view of ``present``
    rows = np.arange(B)[:, None]
    if axis == 1:
        dst[rows, idx] = update
    else:  # dims between batch and the sequence axis stay in place after the moved axis
        dst[rows, idx] = np.moveaxis(update, axis, 1)
    return present


# -- LinearAttention -----------------------------------------------------------------------------


@op("LinearAttention", 27)
class LinearAttention:
    def __init__(self, ctx: KernelContext, *, q_num_heads, kv_num_heads, chunk_size=64,
                 scale=0.0, update_rule="gated_delta") -> None:
        self.hq, self.hkv = int(q_num_heads), int(kv_num_heads)
        if self.hq <= 0 or self.hkv <= 0 or self.hq % self.hkv:
            raise ValueError(f"q_num_heads {self.hq} must be a positive multiple of "
                             f"kv_num_heads {self.hkv}")
        if update_rule not in ("linear", "gated", "delta", "gated_delta"):
            raise ValueError(f"unsupported update_rule {update_rule!r}")
        self.gated = update_rule in ("gated", "gated_delta")
        self.delta = update_rule in ("delta", "gated_delta")
        self.scale = float(scale)

    def __call__(self, query, key, value, past_state=None, decay=None, beta=None):
        if self.gated != (decay is not None) or self.delta != (beta is not None):
            raise ValueError("LinearAttention: decay is required exactly for the gated rules "
                             "and beta exactly for the delta rules")
        Hq, Hkv, G = self.hq, self.hkv, self.hq // self.hkv
        B, T, _ = query.shape
        dk, dv = query.shape[-1] // Hq, value.shape[-1] // Hkv
        cdt = compute_dtype(query.dtype)
        q = to_heads(query.astype(cdt, copy=False), Hq).reshape(B, Hkv, G, T, dk)
        k = to_heads(key.astype(cdt, copy=False), Hkv)  # (B, Hkv, T, dk)
        v = to_heads(value.astype(cdt, copy=False), Hkv)  # (B, Hkv, T, dv)
        state_dtype = past_state.dtype if past_state is not None else query.dtype
        if past_state is not None:
            state = past_state.astype(cdt)  # a private copy: updated in place below
        else:
            state = np.zeros((B, Hkv, dk, dv), dtype=cdt)
        scale = cdt.type(self.scale if self.scale else 1.0 / math.sqrt(dk))
        if not self.gated and not self.delta:
            out = self._linear(q, k, v, state)
            state += np.matmul(np.swapaxes(k, -1, -2), v)
        else:
            out = self._recurrent(q, k, v, state, decay, beta, cdt)
        out *= scale
        # (B, Hkv, G, T, dv) -> (B, T, Hq * dv), query head h = kv * G + g
        out = out.transpose(0, 3, 1, 2, 4).reshape(B, T, Hq * dv)
        return out.astype(query.dtype, copy=False), state.astype(state_dtype, copy=False)

    @staticmethod
    def _linear(q, k, v, state):
        """Causal linear attention in parallel: o_t = q_t S_0 + sum_{s<=t} (q_t . k_s) v_s."""
        T = q.shape[3]
        scores = np.matmul(q, np.swapaxes(k, -1, -2)[:, :, None])  # (B, Hkv, G, T, T)
        scores *= np.tri(T, dtype=scores.dtype)
        out = np.matmul(scores, v[:, :, None])
        out += np.matmul(q, state[:, :, None])
        return out

    def _recurrent(self, q, k, v, state, decay, beta, cdt):
        """Gated / delta rules: one state update per timestep (batched over batch and heads)."""
        B, Hkv, G, T, dk = q.shape
        if decay is not None:  # (B, T, Hkv) per head or (B, T, Hkv * dk) per key feature
            width = decay.shape[-1] // Hkv
            g = np.exp(decay.astype(cdt).reshape(B, T, Hkv, width).transpose(0, 2, 1, 3))
        if beta is not None:  # (B, T, Hkv) or (B, T, 1)
            bt = beta.astype(cdt).reshape(B, T, beta.shape[-1], 1).transpose(0, 2, 1, 3)
        out = np.empty((B, Hkv, G, T, v.shape[-1]), dtype=cdt)
        for t in range(T):
            k_t = k[:, :, t]  # (B, Hkv, dk)
            v_t = v[:, :, t]
            if decay is not None:
                state *= g[:, :, t, :, None]
            if beta is not None:
                retrieved = np.matmul(k_t[:, :, None, :], state)[:, :, 0]  # S^T k
                v_t = bt[:, :, t] * (v_t - retrieved)
            state += k_t[:, :, :, None] * v_t[:, :, None, :]
            out[:, :, :, t] = np.matmul(q[:, :, :, t], state)
        return out


# -- CausalConvWithState -------------------------------------------------------------------------


@op("CausalConvWithState", 27)
def CausalConvWithState(input, weight, bias=None, past_state=None, *,  # noqa: A002 - schema
                        activation="none"):
    if activation not in ("none", "silu", "swish"):
        raise ValueError(f"unsupported CausalConvWithState activation {activation!r}")
    X = input
    B, C, L = X.shape
    K = weight.shape[2]
    if past_state is None:
        past_state = np.zeros((B, C, K - 1), dtype=X.dtype)
    padded = np.concatenate((past_state, X), axis=2)
    cdt = compute_dtype(X.dtype)
    p = padded.astype(cdt, copy=False)
    w = weight.reshape(C, K).astype(cdt, copy=False)
    Y = p[:, :, 0:L] * w[:, 0:1]
    for i in range(1, K):  # one multiply-add per kernel tap, each over the whole sequence
        Y += p[:, :, i:i + L] * w[:, i:i + 1]
    if bias is not None:
        Y += bias.astype(cdt, copy=False)[:, None]
    if activation != "none":
        Y *= sigmoid(Y)
    present = padded[:, :, padded.shape[2] - (K - 1):]
    return Y.astype(X.dtype, copy=False), np.ascontiguousarray(present)
