"""MatMul + scale fusion: multiplying (or dividing) a MatMul's input or output by a scalar
constant becomes com.microsoft FusedMatMul's ``alpha``: the GEMM scales for free, and a pass
over the product (attention's 1/sqrt(head_size)) disappears."""

from __future__ import annotations

from ..base import EXTENDED, RulePass, register_pass
from ..graph_utils import constant_value
from ..pattern import RewriteRule
from ._helpers import MS, float_scalar, is_float32, rank
from .matmul_transpose import _fused_attrs


def _factor(c, data, divide: bool) -> float | None:
    """The scalar in c, if multiplying ``data`` by it cannot broadcast to a higher rank."""
    s = float_scalar(c)
    r = rank(data)
    if s is None or r is None or constant_value(c).ndim > r or (divide and s == 0):
        return None
    return 1.0 / s if divide else s


class _ScaleRule(RewriteRule):
    name = "MatMul+scale"
    where = "out"  # "out": (a @ b) * c; "a" / "b": the scale is on that input
    divide = False
    fused = False

    def pattern(self, op, a, b, c):
        def scaled(v):
            return op.Div(v, c, _name="s") if self.divide else op.Mul(v, c, _name="s")

        def mm(x, y):
            if self.fused:
                return op.FusedMatMul(x, y, _domain=MS, _name="mm")
            return op.MatMul(x, y, _name="mm")

        if self.where == "out":
            return scaled(mm(a, b))
        if self.where == "a":
            return mm(scaled(a), b)
        return mm(a, scaled(b))

    def _operands(self, a, b, c, mm) -> tuple | None:
        """(A, B, factor) of the fused product. A Mul on an input binds its two operands
        either way round (both are pattern variables): the constant one is the scale."""
        if self.where == "out":
            f = _factor(c, mm.outputs[0], self.divide)
            return None if f is None else (a, b, f)
        data = a if self.where == "a" else b
        f = _factor(c, data, self.divide)
        if f is None and not self.divide:
            data, c = c, data
            f = _factor(c, data, False)
        if f is None:
            return None
        return (data, b, f) if self.where == "a" else (a, data, f)

    def check(self, context, a, b, c, mm, **_):
        found = self._operands(a, b, c, mm)
        if found is None:
            return False
        out = context.root.outputs[0]
        return rank(out) is not None and rank(out) == rank(mm.outputs[0]) and is_float32(
            found[0], found[1], out)

    def rewrite(self, op, a, b, c, mm, **_):
        x, y, f = self._operands(a, b, c, mm)
        attrs = _fused_attrs(mm)
        attrs["alpha"] = attrs["alpha"] * f
        return op.FusedMatMul(x, y, _domain=MS, **attrs)


def _variant(where: str, divide: bool, fused: bool) -> type[RewriteRule]:
    return type(f"MatMulScale_{where}_{int(divide)}_{int(fused)}", (_ScaleRule,),
                {"where": where, "divide": divide, "fused": fused})


@register_pass
class MatMulScaleFusion(RulePass):
    name = "MatMulScaleFusion"
    level = EXTENDED
    order = 61
    rules = tuple(_variant(w, d, f) for f in (False, True) for w in ("out", "a", "b")
                  for d in (False, True))
