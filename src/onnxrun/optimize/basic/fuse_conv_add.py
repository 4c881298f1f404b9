"""Conv (or ConvTranspose) + Add of a per-output-channel constant -> the same convolution
with that constant in its bias.

The Add broadcasts a constant of shape [1, M, 1, 1] (or [M, 1, 1], or a scalar) over the
convolution's [N, M, ...] output: adding it to B instead saves a pass over the activation.
"""

from __future__ import annotations

import numpy as np

from ..base import BASIC, RulePass, register_pass
from ..graph_utils import constant_value
from ..pattern import RewriteRule
from ._helpers import is_float_array, per_channel


def conv_channels(conv, weight: np.ndarray) -> int:
    if conv.op_type == "ConvTranspose":
        return weight.shape[1] * int(conv.attr("group", 1))
    return weight.shape[0]


def conv_parts(conv) -> tuple[np.ndarray, np.ndarray | None] | None:
    """(W, B) of a convolution whose weights (and bias, if any) are float constants."""
    weight = constant_value(conv.inputs[1]) if len(conv.inputs) > 1 else None
    if not is_float_array(weight) or weight.ndim < 3:
        return None
    if len(conv.inputs) > 2 and conv.inputs[2] is not None:
        bias = constant_value(conv.inputs[2])
        if bias is None or bias.dtype != weight.dtype:
            return None
        return weight, bias
    return weight, None


class ConvAdd(RewriteRule):
    name = "Conv+Add"

    def pattern(self, op, x, w, c):
        return op.Add(op.Conv(x, w, _name="conv"), c)

    def check(self, context, conv, c, **_):
        parts = conv_parts(conv)
        value = constant_value(c)
        if parts is None or value is None or value.dtype != parts[0].dtype:
            return False
        return per_channel(value, parts[0].ndim, conv_channels(conv, parts[0])) is not None

    def rewrite(self, op, x, conv, c, **_):
        weight, bias = conv_parts(conv)
        add = per_channel(constant_value(c), weight.ndim, conv_channels(conv, weight))
        new_b = add.astype(np.float64) + (0.0 if bias is None else bias.astype(np.float64))
        build = getattr(op, conv.op_type)
        return build(x, conv.inputs[1], op.initializer(new_b.astype(weight.dtype), "B"),
                     _name=conv.name or None, **conv.attributes)


class ConvTransposeAdd(ConvAdd):
    name = "ConvTranspose+Add"

    def pattern(self, op, x, w, c):
        return op.Add(op.ConvTranspose(x, w, _name="conv"), c)


@register_pass
class ConvAddFusion(RulePass):
    name = "ConvAddFusion"
    level = BASIC
    order = 32
    rules = (ConvAdd, ConvTransposeAdd)
