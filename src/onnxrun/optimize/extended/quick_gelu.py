"""QuickGelu fusion: x * Sigmoid(alpha * x) -> com.microsoft QuickGelu(alpha); x * Sigmoid(x)
(SiLU / Swish) is the alpha = 1 case."""

from __future__ import annotations

from ..base import EXTENDED, RulePass, register_pass
from ..pattern import RewriteRule
from ._helpers import MS, float_scalar, is_float32, same_rank


class QuickGeluScaled(RewriteRule):
    name = "QuickGelu"

    def pattern(self, op, x, alpha):
        return op.Mul(x, op.Sigmoid(op.Mul(x, alpha)))

    def check(self, context, x, alpha, **_):
        return (float_scalar(alpha) is not None and is_float32(x)
                and same_rank(x, context.root.outputs[0]))

    def rewrite(self, op, x, alpha, **_):
        return op.QuickGelu(x, _domain=MS, alpha=float_scalar(alpha))


class Silu(RewriteRule):
    name = "QuickGelu"

    def pattern(self, op, x):
        return op.Mul(x, op.Sigmoid(x))

    def check(self, context, x, **_):
        return is_float32(x)

    def rewrite(self, op, x, **_):
        return op.QuickGelu(x, _domain=MS, alpha=1.0)


@register_pass
class QuickGeluFusion(RulePass):
    name = "QuickGeluFusion"
    level = EXTENDED
    order = 12
    rules = (QuickGeluScaled, Silu)
