"""Gelu fusion: the erf form 0.5 * x * (1 + Erf(x / sqrt(2))) -> com.microsoft Gelu.

Exporters write it in several association orders (PyTorch: ``x * (1 + erf(x / sqrt2)) * 0.5``;
others ``(x * 0.5) * (...)`` or ``x * ((...) * 0.5)``) and divide by sqrt(2) or multiply by
1/sqrt(2); one rule per written form. One kernel replaces five elementwise passes over x.
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

SQRT2 = math.sqrt(2.0)


class _GeluRule(RewriteRule):
    name = "Gelu"
    outer = "x_half"  # where the 0.5 sits
    scale = "div"  # x / sqrt2 or x * (1/sqrt2)

    def pattern(self, op, x, c):
        arg = op.Div(x, c) if self.scale == "div" else op.Mul(x, c)
        return half_x_times(op, x, op.Add(op.Erf(arg), 1.0), self.outer)

    def check(self, context, x, c, **_):
        expected = SQRT2 if self.scale == "div" else 1.0 / SQRT2
        return (close(float_scalar(c), expected, 1e-6) and is_float32(x)
                and same_rank(x, context.root.outputs[0]))

    def rewrite(self, op, x, **_):
        return op.Gelu(x, _domain=MS)


@register_pass
class GeluFusion(RulePass):
    name = "GeluFusion"
    level = EXTENDED
    order = 10
    rules = rule_variants(_GeluRule, outer=HALF_FORMS, scale=("div", "mul"))
