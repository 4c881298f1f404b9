"""com.microsoft Attention (packed QKV projection, as the optimizer's AttentionFusion writes
it) for the encoder case: no past state, no attention bias, an optional raw 0/1 key mask
(B, T), optionally causal. Other forms stay on the CPU provider. On CuPy, ``cupy/attention.py``
computes the heads' scores and weighted sums with batched GEMMs and a fused softmax."""

from __future__ import annotations

import math
from typing import Any

from ..array import namespace
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
        qkv = xp.matmul(input, weights)
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
    scores = xp.matmul(q, xp.matrix_transpose(k)) * scale
    if bias is not None:
        scores = scores + bias
    return xp.matmul(softmax(scores, -1), v)
