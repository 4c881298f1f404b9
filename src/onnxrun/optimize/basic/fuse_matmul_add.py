"""MatMul + Add -> Gemm, for a 2-D activation times a constant 2-D weight plus a constant bias.

One BLAS call with the bias added in place replaces a GEMM and a broadcasted add. Higher-rank
activations (transformers' [batch, seq, hidden]) keep MatMul + Add: Gemm is 2-D only.
"""

from __future__ import annotations

from ...dtypes import type_shape
from ..base import BASIC, RulePass, register_pass
from ..graph_utils import constant_value
from ..pattern import RewriteRule

_FLOAT = {1, 10, 11, 16}  # float, float16, double, bfloat16


class MatMulAddToGemm(RewriteRule):
    name = "MatMul+Add"

    def pattern(self, op, a, b, c):
        return op.Add(op.MatMul(a, b), c)

    @staticmethod
    def operands(a, b, c) -> tuple | None:
        """(a's shape, the weight, the bias) where a is a float tensor of a known rank and b, c
        constants of its dtype, b 2-D; else None."""
        shape_a = type_shape(a.type) if a.type is not None else None
        w, bias = constant_value(b), constant_value(c)
        if shape_a is None or w is None or w.ndim != 2 or bias is None or \
                a.type.tensor_type.elem_type not in _FLOAT or w.dtype != bias.dtype:
            return None
        return shape_a, w, bias

    def check(self, context, a, b, c, **_):
        found = self.operands(a, b, c)
        if found is None or len(found[0]) != 2:
            return False
        shape_a, w, bias = found
        n = w.shape[1]
        # Gemm's C broadcasts unidirectionally to [M, N]; the Add must not grow the result.
        return bias.shape in ((n,), (1, n)) or (
            bias.ndim == 2 and isinstance(shape_a[0], int) and bias.shape == (shape_a[0], n)
        )

    def rewrite(self, op, a, b, c, **_):
        return op.Gemm(a, b, c)


@register_pass
class GemmFusion(RulePass):
    name = "MatMulAddFusion"
    level = BASIC
    order = 40
    rules = (MatMulAddToGemm,)
