"""FastGelu fusion: the tanh approximation
0.5 * x * (1 + Tanh(sqrt(2/pi) * (x + 0.044715 * x^3))) -> com.microsoft FastGelu.

x^3 is written Pow(x, 3) or x * (x * x); the 0.5 sits in one of three places, as for Gelu.
Eight elementwise nodes become one kernel.
"""

from __future__ import annotations

import math

from ..base import EXTENDED, RulePass, register_pass
from ..pattern import RewriteRule
from ._helpers import (
    HALF_FORMS,
    MS,
    close,
    float_scalar,
    half_x_times,
    is_float32,
    rule_variants,
    same_rank,
)

SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
CUBIC = 0.044715


class _FastGeluRule(RewriteRule):
    name = "FastGelu"
    outer = "x_half"
    cube = "pow"

    def pattern(self, op, x, c1, c2):
        x3 = op.Pow(x, 3.0) if self.cube == "pow" else op.Mul(x, op.Mul(x, x))
        inner = op.Mul(op.Add(x, op.Mul(x3, c2)), c1)
        return half_x_times(op, x, op.Add(op.Tanh(inner), 1.0), self.outer)

    def check(self, context, x, c1, c2, **_):
        return (close(float_scalar(c1), SQRT_2_OVER_PI, 1e-5)
                and close(float_scalar(c2), CUBIC, 1e-4) and is_float32(x)
                and same_rank(x, context.root.outputs[0]))

    def rewrite(self, op, x, **_):
        return op.FastGelu(x, _domain=MS)


@register_pass
class FastGeluFusion(RulePass):
    name = "FastGeluFusion"
    level = EXTENDED
    order = 11
    rules = rule_variants(_FastGeluRule, outer=HALF_FORMS, cube=("pow", "mul"))
