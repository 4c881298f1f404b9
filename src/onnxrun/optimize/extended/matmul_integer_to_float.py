"""MatMulInteger + scale fusion, as onnxruntime's extended level does it:

    MatMulInteger(a, B, a_zp, b_zp) -> Cast(float) -> Mul(Mul(a_scale, b_scale))
        -> com.microsoft MatMulIntegerToFloat(a, B, a_scale, b_scale, a_zp, b_zp)
    MatMulIntegerToFloat(...) + bias (1-D over the last axis)  -> its bias input

That is what ``quantize_dynamic`` writes after every DynamicQuantizeLinear -> MatMulInteger:
three passes over the product (int32 -> float, times the scale, plus the bias) become one
kernel that scales and adds the bias on its float accumulator. DynamicQuantizeMatMulFusion
then takes in the DynamicQuantizeLinear where this is its only reader.
"""

from __future__ import annotations

from ...proto import onnx
from ..base import EXTENDED, RulePass, register_pass
from ..pattern import RewriteRule
from ._helpers import MS, const_value, elem_type, is_float32, last_dim, same_rank, shape

FLOAT = onnx.TensorProto.FLOAT



def _is_scalar(v) -> bool:
    s = shape(v)
    return s is not None and (len(s) == 0 or s == [1])


def _column_param_ok(scale, zero_point, n) -> bool:
    """b_scale (and b_zero_point) constant, per tensor or one per column of B."""
    c = const_value(scale)
    if c is None or c.ndim > 1 or (c.ndim == 1 and c.size not in (1, n)):
        return False
    if zero_point is None:
        return True
    z = const_value(zero_point)
    return z is not None and z.size == c.size


class _ScaledMatMulInteger(RewriteRule):
    name = "MatMulIntegerToFloat"
    num_inputs = 4  # MatMulInteger's inputs as written: (a, b), (a, b, a_zp) or all four

    def pattern(self, op, a, b, a_zp, b_zp, a_scale, b_scale):
        ins = (a, b, a_zp, b_zp)[: self.num_inputs]
        product = op.MatMulInteger(*ins, _name="mmi")
        return op.Mul(op.Cast(product, _name="cast"), op.Mul(a_scale, b_scale))

    def check(self, context, b, a_scale, b_scale, mmi, cast, b_zp=None, **_):
        if len(mmi.inputs) != self.num_inputs or cast.attr("to") != FLOAT:
            return False
        zp = b_zp if self.num_inputs == 4 else None
        n = last_dim(b)
        return (is_float32(a_scale, b_scale) and _is_scalar(a_scale) and n is not None
                and _column_param_ok(b_scale, zp, n)
                and same_rank(mmi.outputs[0], context.root.outputs[0]))

    def rewrite(self, op, a, b, a_scale, b_scale, a_zp=None, b_zp=None, **_):
        if self.num_inputs < 4:
            b_zp = None
        if self.num_inputs < 3:
            a_zp = None
        return op.MatMulIntegerToFloat(a, b, a_scale, b_scale, a_zp, b_zp, _domain=MS)


def _variant(n: int) -> type[RewriteRule]:
    return type(f"MatMulIntegerToFloat_{n}", (_ScaledMatMulInteger,), {"num_inputs": n})


class MatMulIntegerToFloatBias(RewriteRule):
    name = "MatMulIntegerToFloat+bias"

    def pattern(self, op, a, b, a_scale, b_scale, a_zp, b_zp, bias):
        product = op.MatMulIntegerToFloat(a, b, a_scale, b_scale, a_zp, b_zp, _domain=MS,
                                          _name="mm")
        return op.Add(product, bias)

    def check(self, context, b, bias, mm, **_):
        if len(mm.inputs) > 6 and mm.inputs[6] is not None:
            return False  # has a bias already
        s, n = shape(bias), last_dim(b)
        return (const_value(bias) is not None and elem_type(bias) == FLOAT and s is not None
                and len(s) == 1 and s[0] == n)

    def rewrite(self, op, a, b, a_scale, b_scale, a_zp, b_zp, bias, **_):
        return op.MatMulIntegerToFloat(a, b, a_scale, b_scale, a_zp, b_zp, bias, _domain=MS)


@register_pass
class MatMulIntegerToFloatFusion(RulePass):
    name = "MatMulIntegerToFloatFusion"
    level = EXTENDED
    order = 12
    rules = (_variant(4), _variant(3), _variant(2), MatMulIntegerToFloatBias)
