"""Bias + Gelu fusion: Gelu(x + bias) -> com.microsoft BiasGelu(x, bias) (com.microsoft's Gelu
or ai.onnx's erf Gelu), and
FastGelu(x + bias) -> FastGelu(x, bias), for a 1-D bias over x's last dimension (the Linear
layer before a transformer's FFN activation). Runs after GeluFusion / FastGeluFusion."""

from __future__ import annotations

from ..base import EXTENDED, RulePass, register_pass
from ..pattern import RewriteRule
from ._helpers import MS, is_float32, last_dim, rank, shape


def _bias_ok(x, bias) -> bool:
    sb, d = shape(bias), last_dim(x)
    return (is_float32(x, bias) and sb is not None and len(sb) == 1 and d is not None
            and sb[0] == d and (rank(x) or 0) >= 1)


def _orient(x, bias):
    """(input, bias) whichever way round the Add has them, or None."""
    if _bias_ok(x, bias):
        return x, bias
    if _bias_ok(bias, x):
        return bias, x
    return None


class AddGelu(RewriteRule):
    name = "BiasGelu"

    def pattern(self, op, x, bias):
        return op.Gelu(op.Add(x, bias), _domain=MS)

    def check(self, context, x, bias, **_):
        return _orient(x, bias) is not None

    def rewrite(self, op, x, bias, **_):
        return op.BiasGelu(*_orient(x, bias), _domain=MS)


class AddOnnxGelu(RewriteRule):
    """ai.onnx Gelu (opset 20), erf form: the same as com.microsoft's Gelu, so its bias is
    added inside BiasGelu's pass too (a BERT layer's FFN: one pass over 4 x hidden floats
    less, and the sum on the intra-op threads with the Gelu)."""

    name = "BiasGelu (ai.onnx Gelu)"

    def pattern(self, op, x, bias):
        return op.Gelu(op.Add(x, bias), _name="gelu")

    def check(self, context, x, bias, gelu, **_):
        approximate = gelu.attr("approximate", "none")
        if isinstance(approximate, bytes):
            approximate = approximate.decode()
        return approximate == "none" and _orient(x, bias) is not None

    def rewrite(self, op, x, bias, **_):
        return op.BiasGelu(*_orient(x, bias), _domain=MS)


class AddFastGelu(RewriteRule):
    name = "FastGelu+bias"

    def pattern(self, op, x, bias):
        return op.FastGelu(op.Add(x, bias), _domain=MS, _name="gelu")

    def check(self, context, x, bias, gelu, **_):
        has_bias = len(gelu.inputs) > 1 and gelu.inputs[1] is not None
        return not has_bias and _orient(x, bias) is not None

    def rewrite(self, op, x, bias, **_):
        return op.FastGelu(*_orient(x, bias), _domain=MS)


@register_pass
class BiasGeluFusion(RulePass):
    name = "BiasGeluFusion"
    level = EXTENDED
    order = 30
    rules = (AddGelu, AddOnnxGelu, AddFastGelu)
