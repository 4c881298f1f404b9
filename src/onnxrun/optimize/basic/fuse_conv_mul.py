"""Conv * per-output-channel constant -> Conv with scaled weights and bias.

(x conv W + B) * s, with s constant along everything but the output channel, equals
x conv (W * s) + B * s: the multiplication moves into the weights, once, at load time.
"""

from __future__ import annotations

import numpy as np

from ..base import BASIC, RulePass, register_pass
from ..graph_utils import constant_value
from ..pattern import RewriteRule
from ._helpers import per_channel
from .fuse_conv_add import conv_parts


class ConvMul(RewriteRule):
    name = "Conv*Mul"

    def pattern(self, op, x, w, c):
        return op.Mul(op.Conv(x, w, _name="conv"), c)

    def check(self, context, conv, c, **_):
        parts = conv_parts(conv)
        value = constant_value(c)
        if parts is None or value is None or value.dtype != parts[0].dtype:
            return False
        scale = per_channel(value, parts[0].ndim, parts[0].shape[0])
        return scale is not None and bool(np.all(np.isfinite(scale)))

    def rewrite(self, op, x, conv, c, **_):
        weight, bias = conv_parts(conv)
        scale = per_channel(constant_value(c), weight.ndim, weight.shape[0]).astype(np.float64)
        new_w = weight.astype(np.float64) * scale.reshape((-1,) + (1,) * (weight.ndim - 1))
        inputs = [x, op.initializer(new_w.astype(weight.dtype), "W")]
        if bias is not None:
            inputs.append(op.initializer((bias.astype(np.float64) * scale).astype(bias.dtype),
                                         "B"))
        return op.Conv(*inputs, _name=conv.name or None, **conv.attributes)


@register_pass
class ConvMulFusion(RulePass):
    name = "ConvMulFusion"
    level = BASIC
    order = 31
    rules = (ConvMul,)
