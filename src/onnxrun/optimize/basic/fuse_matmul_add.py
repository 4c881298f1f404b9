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

    def check(self, context, a, b, c, **_):
        shape_a = type_shape(a.type)
        w, bias = constant_value(b), constant_value(c)
        if shape_a is None or len(shape_a) != 2 or w is None or w.ndim != 2 or bias is None:
            return False
        if a.type.tensor_type.elem_type not in _FLOAT or w.dtype != bias.dtype:
            return False
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
