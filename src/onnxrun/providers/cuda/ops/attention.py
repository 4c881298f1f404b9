"""com.microsoft Attention (packed QKV projection, as the optimizer's AttentionFusion writes
it) for the encoder case: no past state, no attention bias, an optional raw 0/1 key mask
(B, T), optionally causal. Other forms stay on the CPU provider. On CuPy, ``cupy/attention.py``
computes the heads' scores and weighted sums with batched GEMMs and a fused softmax."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..array import matmul, namespace
from ..kernels import KernelContext, op
from .activation import softmax

MS = "com.microsoft"


def _encoder_attention(node: Any) -> bool:
    given = [i for i, v in enumerate(node.inputs) if v is not None]
    if any(i > 3 for i in given) or node.attr("qkv_hidden_sizes") is not None or \
            node.attr("do_rotary", 0) or node.attr("past_present_share_buffer", 0):
        return False
    outputs = node.graph.outputs if node.graph is not None else []
    if len(node.outputs) > 1 and node.outputs[1].name and (node.outputs[1].uses or
                                                           node.outputs[1] in outputs):
        return False  # present state wanted
    if 3 in given:
        from ....dtypes import type_shape

        shape = type_shape(node.inputs[3].type)
        return shape is not None and len(shape) == 2  # raw (B, T) mask
    return True


@op("Attention", 1, domain=MS, check=_encoder_attention)
class Attention:
    def __init__(self, ctx: KernelContext, *, num_heads, qkv_hidden_sizes=None, unidirectional=0,
                 scale=0.0, mask_filter_value=-10000.0, past_present_share_buffer=0,
                 do_rotary=0, rotary_embedding_dim=0) -> None:
        self.N = int(num_heads)
        self.causal = bool(unidirectional)
        self.scale = float(scale)
        self.filter = float(mask_filter_value)
        fast = getattr(ctx.provider, "fast", None)
        self.attend = fast.attention.attend if fast is not None else attend

    def __call__(self, input, weights, bias=None, mask_index=None):  # noqa: A002 - schema
        xp = namespace(input)
        B, S, _ = input.shape
        qkv = matmul(input, weights)
        if bias is not None:
            qkv = qkv + bias
        D = weights.shape[1] // 3
        H = D // self.N
        scale = self.scale or 1.0 / math.sqrt(H)

        def heads(t: Any) -> Any:  # (B, S, D) -> (B, N, S, H)
            return xp.permute_dims(xp.reshape(t, (B, S, self.N, H)), (0, 2, 1, 3))

        q, k, v = heads(qkv[..., :D]), heads(qkv[..., D:2 * D]), heads(qkv[..., 2 * D:])
        bias_ = None
        if mask_index is not None:
            keep = xp.reshape(mask_index, (B, 1, 1, -1)) != 0
            zero = xp.zeros((), dtype=q.dtype, device=q.device)
            bias_ = xp.where(keep, zero, xp.full((), self.filter, dtype=q.dtype,
                                                 device=q.device))
        if self.causal and S > 1:
            row = xp.reshape(xp.arange(S, device=q.device), (S, 1))
            col = xp.reshape(xp.arange(S, device=q.device), (1, S))
            low = float(xp.finfo(q.dtype).min)
            future = xp.where(col > row, xp.full((), low, dtype=q.dtype, device=q.device),
                              xp.zeros((), dtype=q.dtype, device=q.device))
            bias_ = future if bias_ is None else bias_ + future
        out = self.attend(q, k, v, scale, bias_)  # (B, N, S, H)
        return xp.reshape(xp.permute_dims(out, (0, 2, 1, 3)), (B, S, D)), None


def attend(q: Any, k: Any, v: Any, scale: float, bias: Any) -> Any:
    """softmax(q k^T * scale + bias) v over heads (B, N, S, H)."""
    xp = namespace(q)
    scores = matmul(q, xp.matrix_transpose(k)) * scale
    if bias is not None:
        scores = scores + bias
    return matmul(softmax(scores, -1), v)


# -- the LLM operators of onnxruntime-genai's builder -------------------------------------------


def _compute(xp: Any, x: Any) -> Any:
    """float16 computes in float32 (onnxruntime's CUDA kernels accumulate in float32)."""
    return xp.astype(x, xp.float32) if x.dtype == getattr(xp, "float16", None) else x


def rotate(x: Any, cos: Any, sin: Any, interleaved: bool, rot: int) -> Any:
    """Rotary embedding of the first ``rot`` features of ``x`` (last axis); ``cos`` / ``sin``
    (rot / 2 on the last axis) broadcast against ``x[..., :rot // 2]``."""
    xp = namespace(x)
    half = rot // 2
    if interleaved:
        pairs = xp.reshape(x[..., :rot], (*x.shape[:-1], half, 2))
        x1, x2 = pairs[..., 0], pairs[..., 1]
        y = xp.reshape(xp.stack([cos * x1 - sin * x2, sin * x1 + cos * x2], axis=-1),
                       (*x.shape[:-1], rot))
    else:
        x1, x2 = x[..., :half], x[..., half:rot]
        y = xp.concat([cos * x1 - sin * x2, sin * x1 + cos * x2], axis=-1)
    return y if rot == x.shape[-1] else xp.concat([y, x[..., rot:]], axis=-1)


def cache_rows(cache: Any, pos: np.ndarray, what: str) -> Any:
    """Rows ``pos`` (host integers, (B, S)) of a cos / sin cache (max_position, rot / 2) on the
    device, as (B, S, rot / 2): a slice where every row reads the same consecutive positions
    (decoding one sequence), else one gather. Positions past the cache are refused: a slice
    would silently come back short."""
    xp = namespace(cache)
    if pos.size and (int(pos.min()) < 0 or int(pos.max()) >= cache.shape[0]):
        raise ValueError(f"{what}: position {int(pos.max())} is outside the cos/sin cache "
                         f"of {cache.shape[0]} positions")
    B, S = pos.shape
    p0 = int(pos[0, 0]) if pos.size else 0
    if S and (pos == p0 + np.arange(S)).all():
        return xp.broadcast_to(cache[p0:p0 + S, :][None, ...], (B, S, cache.shape[1]))
    idx = xp.asarray(pos.reshape(-1), device=cache.device)
    return xp.reshape(xp.take(cache, idx, axis=0), (B, S, cache.shape[1]))


def _host_ints(x: Any) -> np.ndarray:
    return np.asarray(x).astype(np.int64).reshape(-1)


def _rotary_positions(position_ids: Any, B: int, S: int) -> np.ndarray:
    pos = np.asarray(position_ids).astype(np.int64)
    if pos.size == 1:  # a start offset shared by the batch
        return np.broadcast_to(pos.reshape(1, 1) + np.arange(S), (B, S))
    return np.broadcast_to(pos.reshape(-1, S), (B, S))


@op("RotaryEmbedding", 1, domain=MS, host_inputs=(1,))
def RotaryEmbedding(input, position_ids, cos_cache, sin_cache, *,  # noqa: A002 - schema
                    interleaved=0, is_packed_batching=0, num_heads=0, rotary_embedding_dim=0,
                    scale=1.0):
    xp = namespace(input)
    X = input
    if X.ndim == 4:  # (B, N, S, H)
        B, _, S, _ = X.shape
        x = X
    else:  # (B, S, D)
        B, S, D = X.shape
        H = D // int(num_heads) if rotary_embedding_dim and num_heads else cos_cache.shape[1] * 2
        x = xp.reshape(X, (B, S, D // H, H))
    pos = _rotary_positions(position_ids, B, S)
    cos = _compute(xp, cache_rows(cos_cache, pos, "RotaryEmbedding"))
    sin = _compute(xp, cache_rows(sin_cache, pos, "RotaryEmbedding"))
    # (B, S, r) -> against (B, N, S, H) or (B, S, N, H)
    cos, sin = ((cos[:, None, ...], sin[:, None, ...]) if X.ndim == 4 else
                (cos[:, :, None, ...], sin[:, :, None, ...]))
    rot = int(rotary_embedding_dim) or x.shape[-1]
    y = rotate(_compute(xp, x), cos, sin, bool(interleaved), rot)
    return xp.astype(xp.reshape(y, X.shape), X.dtype)


def _device_gqa(node: Any) -> bool:
    """The GroupQueryAttention forms the device runs: no quantized KV cache, no scores output,
    no sliding-window cache (those stay on the CPU provider)."""
    quant = {node.attr("k_quant_type", "NONE"), node.attr("v_quant_type", "NONE")}
    if {q.decode() if isinstance(q, bytes) else str(q) for q in quant} != {"NONE"}:
        return False
    if node.attr("kv_cache_bit_width", 0) or node.attr("sliding_window_cache", 0):
        return False
    given = {i for i, v in enumerate(node.inputs) if v is not None and v.name}
    if given & {12, 13}:  # k_scale / v_scale
        return False
    outputs = node.graph.outputs if node.graph is not None else []
    return not (len(node.outputs) > 3 and node.outputs[3].name and (
        node.outputs[3].uses or node.outputs[3] in outputs))


@op("GroupQueryAttention", 1, domain=MS, host_inputs=(5, 6, 9, 16), check=_device_gqa)
class GroupQueryAttention:
    """onnxruntime's GroupQueryAttention on the device: packed or separate Q/K/V, rotary inside,
    causal / local window / softcap / smooth softmax / head sinks / attention bias / per-head
    Q and K norms. ``seqlens_k``, ``total_sequence_length``, ``position_ids`` and
    ``query_seqlens`` are small host integers (where each row's new keys go, which keys each
    query sees). With onnxrun.genai's shared past/present buffer (``_shares_past_present``)
    the new keys and values are written into the past buffers on the device, which come back
    as present: the cache never moves."""

    def __init__(self, ctx: KernelContext, *, num_heads, kv_num_heads, scale=0.0, softcap=0.0,
                 local_window_size=-1, do_rotary=0, rotary_interleaved=0, smooth_softmax=0,
                 qk_output=0, causal=1, sliding_window_cache=0, k_quant_type="NONE",
                 v_quant_type="NONE", kv_cache_bit_width=0, qk_norm_epsilon=1e-6,
                 q_norm_epsilon=None, k_norm_epsilon=None) -> None:
        from ...cpu.ops.contrib.transformer import _shares_past_present, gqa_attributes

        (self.N, self.Nkv, self.scale, self.softcap, self.window, self.rotary, self.interleaved,
         self.smooth, self.causal, self.q_eps, self.k_eps) = gqa_attributes(
            num_heads, kv_num_heads, scale, softcap, local_window_size, do_rotary,
            rotary_interleaved, smooth_softmax, causal, qk_norm_epsilon, q_norm_epsilon,
            k_norm_epsilon)
        self.share = _shares_past_present(ctx)

    def __call__(self, query, key=None, value=None, past_key=None, past_value=None,
                 seqlens_k=None, total_sequence_length=None, cos_cache=None, sin_cache=None,
                 position_ids=None, attention_bias=None, head_sink=None, k_scale=None,
                 v_scale=None, q_norm_weight=None, k_norm_weight=None, query_seqlens=None):
        from .normalization import rms_norm

        xp = namespace(query)
        N, Nkv = self.N, self.Nkv
        dt = query.dtype
        B, S = query.shape[:2]
        qkv = _compute(xp, query)

        def heads(t: Any, n: int) -> Any:  # (B, S, n H) -> (B, n, S, H)
            return xp.permute_dims(xp.reshape(t, (B, S, n, -1)), (0, 2, 1, 3))

        if key is None:  # packed (B, S, (N + 2 Nkv) H)
            H = query.shape[2] // (N + 2 * Nkv)
            q = heads(qkv[..., :N * H], N)
            k = heads(qkv[..., N * H:(N + Nkv) * H], Nkv)
            v = heads(qkv[..., (N + Nkv) * H:], Nkv)
        else:
            H = query.shape[2] // N
            q, k, v = heads(qkv, N), heads(_compute(xp, key), Nkv), heads(_compute(xp, value), Nkv)
        total = _host_ints(seqlens_k) + 1  # (B,) keys after this step
        T_max = int(_host_ints(total_sequence_length)[0])
        first_prompt = S == T_max  # as onnxruntime decides: a prompt fills the whole cache
        if query_seqlens is not None:
            valid = _host_ints(query_seqlens)
            past_len = total - valid
            first_prompt = False
        else:  # every new row is written, padding rows of a first prompt included
            valid = np.full(B, S, np.int64)
            past_len = np.zeros(B, np.int64) if first_prompt else total - S
        if q_norm_weight is not None:  # per-head RMS norm of Q and K (Qwen3)
            q = rms_norm(q, -1, self.q_eps, _compute(xp, q_norm_weight))
            k = rms_norm(k, -1, self.k_eps, _compute(xp, k_norm_weight))
        if self.rotary:
            if position_ids is None:
                pos = past_len[:, None] + np.arange(S)
            elif first_prompt:  # onnxruntime reads only the first position of a first prompt
                pos = np.broadcast_to(int(_host_ints(position_ids)[0]) + np.arange(S), (B, S))
            else:
                pos = np.asarray(position_ids).astype(np.int64).reshape(B, S)
            cos = _compute(xp, cache_rows(cos_cache, pos, "GroupQueryAttention"))[:, None, ...]
            sin = _compute(xp, cache_rows(sin_cache, pos, "GroupQueryAttention"))[:, None, ...]
            rot = cos_cache.shape[1] * 2
            q = rotate(q, cos, sin, self.interleaved, rot)
            k = rotate(k, cos, sin, self.interleaved, rot)
        present_k, present_v = self._present(xp, past_key, past_value, k, v, past_len, valid,
                                             T_max, dt)
        # keys past every row's total length are hidden: a large shared buffer is not read
        T = min(present_k.shape[2], int(total.max()))
        kc, vc = _compute(xp, present_k[:, :, :T, :]), _compute(xp, present_v[:, :, :T, :])
        # onnxruntime's float32 scale, 1.0f / sqrtf(H) (the CPU provider's too)
        scale = self.scale or float(np.float32(1) / np.sqrt(np.float32(H)))
        G = N // Nkv
        # one product per kv head, its group of query heads stacked: (B, Nkv, G S, H)
        scores = matmul(xp.reshape(q * scale, (B, Nkv, G * S, H)), xp.matrix_transpose(kc))
        scores = xp.reshape(scores, (B, N, S, T))
        if self.softcap > 0:
            scores = self.softcap * xp.tanh(scores / self.softcap)
        scores = scores + self._mask(xp, scores, total, past_len, S, T)
        if attention_bias is not None:
            ab = _compute(xp, attention_bias)[..., :T]
            if ab.shape[-1] < T:
                ab = xp.concat([ab, xp.zeros((*ab.shape[:-1], T - ab.shape[-1]), dtype=ab.dtype,
                                              device=ab.device)], axis=-1)
            scores = scores + ab
        sink = None
        if head_sink is not None:
            sink = xp.reshape(_compute(xp, head_sink), (1, N, 1, 1))
        elif self.smooth:
            sink = xp.zeros((1, N, 1, 1), dtype=scores.dtype, device=scores.device)
        probs = _softmax_with_sink(xp, scores, sink)
        out = matmul(xp.reshape(probs, (B, Nkv, G * S, T)), vc)  # (B, Nkv, G S, H)
        out = xp.permute_dims(xp.reshape(out, (B, N, S, H)), (0, 2, 1, 3))
        return xp.astype(xp.reshape(out, (B, S, N * H)), dt), present_k, present_v, None

    def _mask(self, xp: Any, scores: Any, total: np.ndarray, past_len: np.ndarray, S: int,
              T: int) -> Any:
        """0 where a query sees a key, -inf elsewhere, (B or 1, 1, S, T): built from aranges
        and host integers (a (B,) upload only when rows differ)."""
        dev = scores.device
        j = xp.reshape(xp.arange(T, device=dev), (1, 1, 1, T))
        s = xp.reshape(xp.arange(S, device=dev), (1, 1, S, 1))
        if (total == total[0]).all() and (past_len == past_len[0]).all():
            tot, qpos = int(total[0]), s + int(past_len[0])
        else:
            B = total.shape[0]
            tot = xp.reshape(xp.asarray(total, device=dev), (B, 1, 1, 1))
            qpos = s + xp.reshape(xp.asarray(past_len, device=dev), (B, 1, 1, 1))
        allowed = j < tot
        if self.causal:
            allowed = allowed & (j <= qpos)
        if self.window > 0:
            allowed = allowed & (j > qpos - self.window)
        zero = xp.zeros((), dtype=scores.dtype, device=dev)
        return xp.where(allowed, zero, xp.full((), -math.inf, dtype=scores.dtype, device=dev))

    def _present(self, xp: Any, past_key: Any, past_value: Any, k: Any, v: Any,
                 past_len: np.ndarray, valid: np.ndarray, T_max: int, dt: Any) -> list[Any]:
        """The cache after this step: each row's first past_len positions of the past, then
        its valid new rows, the rest zero; as long as the past buffer or the total sequence,
        whichever is longer. A shared buffer that holds the whole sequence is written in
        place and returned."""
        B, Nkv, S, H = k.shape
        P_buf = 0 if past_key is None else past_key.shape[2]
        T = max(P_buf, T_max)
        if past_key is not None:
            dt = past_key.dtype
        k, v = xp.astype(k, dt), xp.astype(v, dt)
        uniform = bool((past_len == past_len[0]).all() and (valid == valid[0]).all())
        if self.share and P_buf >= T_max:
            out = [past_key, past_value]
        else:
            out = [xp.zeros((B, Nkv, T, H), dtype=dt, device=k.device) for _ in range(2)]
        for present, past, new in ((out[0], past_key, k), (out[1], past_value, v)):
            if uniform:  # one block copy for the whole batch
                p, n = int(past_len[0]), min(S, int(valid[0]))
                if present is not past and p:
                    present[:, :, :p, :] = past[:, :, :p, :]
                present[:, :, p:p + n, :] = new[:, :, :n, :]
                continue
            for b in range(B):
                p, n = int(past_len[b]), min(S, int(valid[b]))
                if present is not past and p:
                    present[b, :, :p, :] = past[b, :, :p, :]
                present[b, :, p:p + n, :] = new[b, :, :n, :]
        return out


def _softmax_with_sink(xp: Any, scores: Any, sink: Any) -> Any:
    """softmax over the last axis; with a sink (one logit per head) the denominator also holds
    exp(sink) (smooth softmax: a sink of 0). A row that sees no key gives zeros."""
    m = xp.max(scores, axis=-1, keepdims=True)
    if sink is not None:
        m = xp.maximum(m, sink)
    m = xp.where(xp.isinf(m), xp.zeros_like(m), m)
    e = xp.exp(scores - m)
    denom = xp.sum(e, axis=-1, keepdims=True)
    if sink is not None:
        denom = denom + xp.exp(sink - m)
    return e / xp.where(denom == 0, xp.ones_like(denom), denom)


def _device_mha(node: Any) -> bool:
    """MultiHeadAttention with separate 3-D Q / K / V (or K / V already in heads), key masks of
    rank 1-3: packed QKV, cache_indirection (beam search) and the scores output stay on the
    CPU provider."""
    from ....dtypes import type_shape

    given = {i for i, v in enumerate(node.inputs) if v is not None and v.name}
    if 9 in given or not {0, 1, 2} <= given:
        return False
    ranks = [type_shape(node.inputs[i].type) for i in (0, 1, 4) if i in given]
    if any(r is None for r in ranks) or len(ranks[0]) != 3 or len(ranks[1]) not in (3, 4) or \
            (4 in given and len(ranks[2]) not in (1, 2, 3)):
        return False
    outputs = node.graph.outputs if node.graph is not None else []
    return not (len(node.outputs) > 3 and node.outputs[3].name and (
        node.outputs[3].uses or node.outputs[3] in outputs))


@op("MultiHeadAttention", 1, domain=MS, check=_device_mha)
class MultiHeadAttention:
    """com.microsoft MultiHeadAttention (as onnxruntime-genai's builder writes it for fp16 on
    a provider without GroupQueryAttention's shared cache): the past keys and values
    concatenated with the new ones (returned as present), key masks as the filter value,
    causal (unidirectional) with the lowest float, attention bias added."""

    def __init__(self, ctx: KernelContext, *, num_heads, mask_filter_value=-10000.0, scale=0.0,
                 unidirectional=0) -> None:
        self.N = int(num_heads)
        self.filter = float(mask_filter_value)
        self.scale = float(scale)
        self.causal = bool(unidirectional)

    def __call__(self, query, key=None, value=None, bias=None, key_padding_mask=None,
                 attention_bias=None, past_key=None, past_value=None, past_sequence_length=None,
                 cache_indirection=None):
        xp = namespace(query)
        N, dt = self.N, query.dtype
        Q = _compute(xp, query)
        B, S, D = Q.shape

        def heads(t: Any) -> Any:  # (B, L, N H) -> (B, N, L, H)
            return xp.permute_dims(xp.reshape(t, (B, t.shape[1], N, -1)), (0, 2, 1, 3))

        b = None if bias is None else _compute(xp, bias)
        q = heads(Q if b is None else Q + b[:D])
        if key.ndim == 4:  # already projected (B, N, L, H): the bias is part of it
            k, v = _compute(xp, key), _compute(xp, value)
        else:
            K, V = _compute(xp, key), _compute(xp, value)
            if b is not None:
                K, V = K + b[D:2 * D], V + b[2 * D:]
            k, v = heads(K), heads(V)
        P = 0
        if past_key is not None:
            P = past_key.shape[2]
            k = xp.concat([_compute(xp, past_key), k], axis=2)
            v = xp.concat([_compute(xp, past_value), v], axis=2)
        T = k.shape[2]
        H = q.shape[-1]
        scale = self.scale or float(np.float32(1) / np.sqrt(np.float32(H)))
        scores = matmul(q * scale, xp.matrix_transpose(k))  # (B, N, S, T)
        dev = scores.device
        zero = xp.zeros((), dtype=scores.dtype, device=dev)
        if key_padding_mask is not None:
            scores = scores + xp.where(_key_allowed(xp, key_padding_mask, B, S, T), zero,
                                       xp.full((), self.filter, dtype=scores.dtype, device=dev))
        if self.causal and S > 1:
            j = xp.reshape(xp.arange(T, device=dev), (1, T))
            s = xp.reshape(xp.arange(S, device=dev), (S, 1)) + P
            low = xp.full((), float(np.finfo(np.float32).min), dtype=scores.dtype, device=dev)
            scores = scores + xp.where(j <= s, zero, low)
        if attention_bias is not None:
            scores = scores + _compute(xp, attention_bias)
        out = matmul(_softmax_with_sink(xp, scores, None), v)  # (B, N, S, Hv)
        out = xp.reshape(xp.permute_dims(out, (0, 2, 1, 3)), (B, S, N * v.shape[-1]))
        return xp.astype(out, dt), xp.astype(k, dt), xp.astype(v, dt), None


def _key_allowed(xp: Any, mask: Any, B: int, S: int, T: int) -> Any:
    """onnxruntime's key masks on the device: lengths (B), end and start positions (2B), raw
    0/1 (B, T) or (B, S, T)."""
    j = xp.reshape(xp.arange(T, device=mask.device), (1, 1, 1, T))
    if mask.ndim == 1:
        m = xp.astype(mask, xp.int64)
        if mask.shape[0] == B:
            return j < xp.reshape(m, (B, 1, 1, 1))
        if mask.shape[0] == 2 * B:  # end positions, then start positions
            return (j < xp.reshape(m[:B], (B, 1, 1, 1))) & (j >= xp.reshape(m[B:], (B, 1, 1, 1)))
        raise ValueError(f"MultiHeadAttention: a 1-D key mask of {mask.shape[0]} values for "
                         f"batch {B}")
    if mask.ndim == 2:
        if mask.shape[1] != T:
            raise ValueError(f"MultiHeadAttention: 2-D key mask width {mask.shape[1]} != "
                             f"total sequence length {T}")
        return xp.reshape(mask > 0, (B, 1, 1, T))
    return xp.reshape(mask > 0, (B, 1, S, T))
