"""DynamicQuantizeLinear + MatMulIntegerToFloat fusion, as onnxruntime's extended level does it:

    DynamicQuantizeLinear(x) -> MatMulIntegerToFloat(a, B, a_scale, b_scale, a_zp, b_zp[, bias])
        -> com.microsoft DynamicQuantizeMatMul(x, B, b_scale, b_zp[, bias])

when the product is the quantized values' only reader (MatMulIntegerToFloatFusion runs first).
A DynamicQuantizeLinear read by several products (the Q, K and V projections share one) stays:
it quantizes once for all of them.
"""

from __future__ import annotations

from ..base import EXTENDED, RulePass, register_pass
from ..pattern import RewriteRule
from ._helpers import MS, is_float32


class _QuantizeAndMatMul(RewriteRule):
    name = "DynamicQuantizeMatMul"
    with_bias = False

    def pattern(self, op, x, b, b_scale, b_zp, bias):
        a, a_scale, a_zp = op.DynamicQuantizeLinear(x, _outputs=3)
        extra = (bias,) if self.with_bias else ()
        return op.MatMulIntegerToFloat(a, b, a_scale, b_scale, a_zp, b_zp, *extra, _domain=MS,
                                       _name="mm")

    def check(self, context, x, mm, **_):
        return is_float32(x) and len(mm.inputs) == (7 if self.with_bias else 6)

    def rewrite(self, op, x, b, b_scale, b_zp, bias=None, **_):
        extra = (bias,) if self.with_bias else ()
        return op.DynamicQuantizeMatMul(x, b, b_scale, b_zp, *extra, _domain=MS)


class QuantizeAndMatMul(_QuantizeAndMatMul):
    pass


class QuantizeAndMatMulWithBias(_QuantizeAndMatMul):
    with_bias = True


@register_pass
class DynamicQuantizeMatMulFusion(RulePass):
    name = "DynamicQuantizeMatMulFusion"
    level = EXTENDED
    order = 13
    rules = (QuantizeAndMatMulWithBias, QuantizeAndMatMul)
