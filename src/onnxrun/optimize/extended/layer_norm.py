"""LayerNorm fusion: the decomposition exporters write before opset 17,

    d = x - ReduceMean(x);  y = d / Sqrt(ReduceMean(d^2) + eps) * gamma + beta

(last axis; d^2 as Pow(d, 2) or d * d; the division also as d * Reciprocal(...); beta
optional) -> LayerNormalization(x, gamma, beta, axis=-1, epsilon). Written in the default
domain at every opset, as onnxruntime does: its own LayerNormalization schema (version 1) fills
the opsets before ONNX adopted the operator at 17. Nine passes over x become one.
"""

from __future__ import annotations

import numpy as np

from ..base import EXTENDED, RulePass, register_pass
from ..graph_utils import constant_value
from ..pattern import RewriteRule
from ._helpers import float_scalar, is_float32, is_last_axis_mean, last_dim, rank, shape


def affine_ok(v, d: int, r: int) -> bool:
    """A scale / bias over the last axis (size ``d``) of a rank-``r`` input that does not
    broadcast it further."""
    s = shape(v)
    if s is None or not s or s[-1] != d or len(s) > r:
        return False
    if len(s) == 1:
        return True
    return constant_value(v) is not None and all(x == 1 for x in s[:-1])


def as_vector(op, v):
    """A [1, ..., d] constant as the 1-D tensor LayerNormalization wants."""
    c = constant_value(v)
    if c is None or c.ndim == 1:
        return v
    return op.initializer(np.ascontiguousarray(c.reshape(-1)), "affine")


class _LayerNormRule(RewriteRule):
    name = "LayerNormalization"
    square = "pow"
    divide = "div"
    with_bias = True

    def pattern(self, op, x, eps, gamma, beta):
        d = op.Sub(x, op.ReduceMean(x, _name="rm1"), _name="sub")
        sq = op.Pow(d, 2.0) if self.square == "pow" else op.Mul(d, d)
        std = op.Sqrt(op.Add(op.ReduceMean(sq, _name="rm2"), eps))
        y = op.Div(d, std) if self.divide == "div" else op.Mul(d, op.Reciprocal(std))
        out = op.Mul(y, gamma)
        return op.Add(out, beta) if self.with_bias else out

    def check(self, context, x, eps, gamma, rm1, rm2, sub, beta=None, **_):
        model, d = context.model, last_dim(x)
        e = float_scalar(eps)
        if d is None or e is None or e < 0 or not is_float32(x, context.root.outputs[0]):
            return False
        if not (is_last_axis_mean(model, rm1, x) and is_last_axis_mean(model, rm2, sub.outputs[0])):
            return False
        r = rank(x)
        return affine_ok(gamma, d, r) and (beta is None or affine_ok(beta, d, r))

    def rewrite(self, op, x, eps, gamma, beta=None, **_):
        b = as_vector(op, beta) if beta is not None else None
        return op.LayerNormalization(x, as_vector(op, gamma), b, axis=-1,
                                     epsilon=float_scalar(eps))


def _variant(square: str, divide: str, with_bias: bool) -> type[RewriteRule]:
    attrs = {"square": square, "divide": divide, "with_bias": with_bias}
    if not with_bias:
        # pattern() must not take a parameter it does not use: the matcher binds every one
        def pattern(self, op, x, eps, gamma):
            return _LayerNormRule.pattern(self, op, x, eps, gamma, None)

        attrs["pattern"] = pattern
    return type(f"LayerNorm_{square}_{divide}_{int(with_bias)}", (_LayerNormRule,), attrs)


@register_pass
class LayerNormFusion(RulePass):
    name = "LayerNormFusion"
    level = EXTENDED
    order = 15
    # With-bias forms first: the bias-free ones would otherwise take the inner part
    rules = tuple(_variant(s, v, b) for b in (True, False) for s in ("pow", "mul")
                  for v in ("div", "reciprocal"))
