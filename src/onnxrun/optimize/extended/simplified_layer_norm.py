"""Simplified LayerNorm (RMSNorm) fusion:

    x / Sqrt(ReduceMean(x^2) + eps) * w      (or x * Reciprocal(Sqrt(...)) * w; x^2 as Pow or x*x)

over the last axis -> SimplifiedLayerNormalization(x, w, axis=-1, epsilon), in the default
domain where onnxruntime defines it (its version-1 schema); from opset 23 on, the standard
RMSNormalization.
"""

from __future__ import annotations

from ..base import EXTENDED, RulePass, register_pass
from ..pattern import RewriteRule
from ._helpers import float_scalar, is_float32, is_last_axis_mean, last_dim, opset, rank
from .layer_norm import affine_ok, as_vector


class _RmsNormRule(RewriteRule):
    name = "SimplifiedLayerNormalization"
    square = "pow"
    divide = "div"

    def pattern(self, op, x, eps, w):
        sq = op.Pow(x, 2.0) if self.square == "pow" else op.Mul(x, x)
        rms = op.Sqrt(op.Add(op.ReduceMean(sq, _name="rm"), eps))
        y = op.Div(x, rms) if self.divide == "div" else op.Mul(x, op.Reciprocal(rms))
        return op.Mul(y, w)

    def check(self, context, x, eps, w, rm, **_):
        d, e = last_dim(x), float_scalar(eps)
        if d is None or e is None or e < 0 or not is_float32(x, context.root.outputs[0]):
            return False
        return is_last_axis_mean(context.model, rm, x) and affine_ok(w, d, rank(x))

    def rewrite(self, op, x, eps, w, **_):
        if opset(op.model, op.root) >= 23:  # the standard operator: valid for onnx.checker too
            return op.RMSNormalization(x, as_vector(op, w), axis=-1, epsilon=float_scalar(eps))
        return op.SimplifiedLayerNormalization(x, as_vector(op, w), axis=-1,
                                               epsilon=float_scalar(eps))


def _variant(square: str, divide: str) -> type[RewriteRule]:
    return type(f"RmsNorm_{square}_{divide}", (_RmsNormRule,),
                {"square": square, "divide": divide})


@register_pass
class SimplifiedLayerNormFusion(RulePass):
    name = "SimplifiedLayerNormFusion"
    level = EXTENDED
    order = 16
    rules = tuple(_variant(s, v) for s in ("pow", "mul") for v in ("div", "reciprocal"))
