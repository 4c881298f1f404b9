"""Attention heads on CuPy: two batched GEMMs (cuBLAS, ``blas``) and the softmax in place."""

from __future__ import annotations

from typing import Any

from .blas import matmul


def attend(q: Any, k: Any, v: Any, scale: float, bias: Any) -> Any:
    import cupy

    scores = matmul(q, k.swapaxes(-1, -2))
    scores *= scale
    if bias is not None:
        scores += bias
    scores -= scores.max(axis=-1, keepdims=True)
    cupy.exp(scores, out=scores)
    scores /= scores.sum(axis=-1, keepdims=True)
    return matmul(scores, v)
