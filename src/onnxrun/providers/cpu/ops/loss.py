"""Loss operators: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss.

Both reduce to one gather of the target class along axis 1 (``take_along_axis``), a per-element
weight (class weight, zero where the target is ``ignore_index``) and the requested reduction.
"""

from __future__ import annotations

import numpy as np

from ..indices import as_intp
from ..kernels import op


def _compute_dtype(dtype: np.dtype) -> np.dtype:
    """Half-precision inputs accumulate in float32; the result is cast back."""
    return np.dtype(np.float32) if dtype.itemsize < 4 else dtype


def _nll(x, target, weight, ignore_index, reduction, out_dtype):
    """``x``: (N, C, ...) log-probabilities in the compute dtype; ``target``: (N, ...)."""
    target = np.asarray(target).astype(np.int64, copy=False)
    ignored = None
    if ignore_index is not None:
        ignored = target == ignore_index
        if ignored.any():
            # ignored targets may lie outside [0, C): gather a valid class and mask it out
            target = np.where(ignored, 0, target)
        else:
            ignored = None
    picked = np.take_along_axis(x, as_intp(np.expand_dims(target, 1)), axis=1)[:, 0]
    loss = -picked
    w = None
    if weight is not None:
        w = np.asarray(weight).astype(x.dtype, copy=False)[target]
        if ignored is not None:
            w = np.where(ignored, x.dtype.type(0), w)
    elif ignored is not None:
        w = (~ignored).astype(x.dtype)
    if w is not None:
        loss = loss * w
    if reduction == "none":
        out = loss
    elif reduction == "sum":
        out = np.sum(loss)
    elif reduction == "mean":
        if w is None:
            out = np.mean(loss)
        else:
            with np.errstate(divide="ignore", invalid="ignore"):
                out = np.sum(loss) / np.sum(w)
    else:
        raise ValueError(f"unsupported reduction '{reduction}'")
    return np.asarray(out, dtype=out_dtype)


@op("NegativeLogLikelihoodLoss", 12, 13, 22)
def NegativeLogLikelihoodLoss(input, target, weight=None, *, ignore_index=None,
                              reduction="mean"):
    if input.ndim < 2:
        raise ValueError("NegativeLogLikelihoodLoss: input must have rank >= 2")
    ct = _compute_dtype(input.dtype)
    return _nll(input.astype(ct, copy=False), target, weight, ignore_index, reduction,
                input.dtype)


def _log_softmax(x, axis):
    m = np.max(x, axis=axis, keepdims=True)
    z = x - m
    return z - np.log(np.sum(np.exp(z), axis=axis, keepdims=True))


@op("SoftmaxCrossEntropyLoss", 12, 13)
def SoftmaxCrossEntropyLoss(scores, labels, weights=None, *, ignore_index=None,
                            reduction="mean"):
    if scores.ndim < 2:
        raise ValueError("SoftmaxCrossEntropyLoss: scores must have rank >= 2")
    ct = _compute_dtype(scores.dtype)
    log_prob = _log_softmax(scores.astype(ct, copy=False), 1)
    loss = _nll(log_prob, labels, weights, ignore_index, reduction, scores.dtype)
    return loss, log_prob.astype(scores.dtype, copy=False)
