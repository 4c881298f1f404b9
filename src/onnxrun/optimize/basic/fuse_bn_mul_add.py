"""BatchNormalization * / + per-channel constant -> BatchNormalization with new scale and bias.

BN(x) = scale * (x - mean) / sqrt(var + eps) + B, so BN(x) * m = BN'(x) with scale' = scale * m
and B' = B * m, and BN(x) + c = BN'(x) with B' = B + c, for m and c constant along everything
but the channel axis. Caffe2's exports write a BatchNormalization then its scale layer as a Mul
and an Add (the light zoo's DenseNet-121: 62 such pairs that no convolution absorbs, each a
pass over a dense block's widest tensors); folded, the BatchNormalization is one pass and the
layout level can fuse the Relu after it.
"""

from __future__ import annotations

import numpy as np

from ...dtypes import type_shape
from ..base import BASIC, RulePass, register_pass
from ..graph_utils import constant_value
from ..pattern import RewriteRule
from ._helpers import inference_batchnorm, per_channel


def _parts(model, bn, c) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(scale, B, the per-channel constant) where the rewrite applies, else None."""
    if not inference_batchnorm(model, bn) or any(v is None for v in bn.inputs):
        return None
    scale, bias = constant_value(bn.inputs[1]), constant_value(bn.inputs[2])
    value, shape = constant_value(c), type_shape(bn.inputs[0].type)
    if scale is None or bias is None or value is None or shape is None or \
            scale.ndim != 1 or bias.shape != scale.shape or value.dtype != scale.dtype or \
            scale.dtype != bias.dtype or scale.dtype.kind != "f":
        return None
    factor = per_channel(value, len(shape), scale.shape[0])
    if factor is None or not np.all(np.isfinite(factor)):
        return None
    return scale, bias, factor


class BatchNormMul(RewriteRule):
    name = "BatchNormalization*Mul"
    op_type = "Mul"

    def pattern(self, op, x, s, b, m, v, c):
        return getattr(op, self.op_type)(op.BatchNormalization(x, s, b, m, v, _name="bn"), c)

    def check(self, context, bn, c, **_):
        return _parts(context.model, bn, c) is not None

    def rewrite(self, op, bn, c, **_):
        scale, bias, value = _parts(op.model, bn, c)
        new_scale, new_bias = self.fold(scale.astype(np.float64), bias.astype(np.float64),
                                        value.astype(np.float64))
        return _folded(op, bn, new_scale, new_bias, scale.dtype)

    @staticmethod
    def fold(scale, bias, m):
        return scale * m, bias * m


class BatchNormAdd(BatchNormMul):
    name = "BatchNormalization+Add"
    op_type = "Add"

    @staticmethod
    def fold(scale, bias, c):
        return scale, bias + c


def _folded(op, bn, scale, bias, dtype):
    x, _, _, mean, var = bn.inputs
    return op.BatchNormalization(x, op.initializer(np.asarray(scale, dtype), "scale"),
                                 op.initializer(np.asarray(bias, dtype), "B"), mean, var,
                                 _name=bn.name or None, **bn.attributes)


@register_pass
class BatchNormMulAddFusion(RulePass):
    name = "BatchNormMulAddFusion"
    level = BASIC
    order = 33
    rules = (BatchNormMul, BatchNormAdd)
