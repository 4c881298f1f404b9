"""FastGelu fusion: the tanh approximation
0.5 * x * (1 + Tanh(sqrt(2/pi) * (x + 0.044715 * x^3))) -> com.microsoft FastGelu.

x^3 is written Pow(x, 3) or x * (x * x); the 0.5 sits in one of three places, as for Gelu.
Eight elementwise nodes become one kernel.
"""

from __future__ import annotations

import math

from ..base import EXTENDED, RulePass, register_pass
from ..pattern import RewriteRule
from ._helpers import MS, close, float_scalar, is_float32, same_rank

SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
CUBIC = 0.044715


class _FastGeluRule(RewriteRule):
    name = "FastGelu"
    outer = "x_half"
    cube = "pow"

    def pattern(self, op, x, c1, c2):
        x3 = op.Pow(x, 3.0) if self.cube == "pow" else op.Mul(x, op.Mul(x, x))
        inner = op.Mul(op.Add(x, op.Mul(x3, c2)), c1)
        one_plus = op.Add(op.Tanh(inner), 1.0)
        if self.outer == "x_half":
            return op.Mul(op.Mul(x, one_plus), 0.5)
        if self.outer == "half_x":
            return op.Mul(op.Mul(x, 0.5), one_plus)
        return op.Mul(x, op.Mul(one_plus, 0.5))

    def check(self, context, x, c1, c2, **_):
        return (close(float_scalar(c1), SQRT_2_OVER_PI, 1e-5)
                and close(float_scalar(c2), CUBIC, 1e-4) and is_float32(x)
                and same_rank(x, context.root.outputs[0]))

    def rewrite(self, op, x, **_):
        return op.FastGelu(x, _domain=MS)


def _variant(outer: str, cube: str) -> type[RewriteRule]:
    return type(f"FastGelu_{outer}_{cube}", (_FastGeluRule,), {"outer": outer, "cube": cube})


@register_pass
class FastGeluFusion(RulePass):
    name = "FastGeluFusion"
    level = EXTENDED
    order = 11
    rules = tuple(_variant(o, c) for o in ("x_half", "half_x", "inner_half")
                  for c in ("pow", "mul"))
