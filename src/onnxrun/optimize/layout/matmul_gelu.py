"""MatMul / Gemm + GELU fusion (layout level): a MatMul by a constant float32 weight whose
product only a com.microsoft BiasGelu (its bias a constant row), Gelu or FastGelu reads ->
ai.onnxrun MatMulBiasGelu (``approximate`` "tanh" for FastGelu); a float32 Gemm whose product
only a com.microsoft Gelu or FastGelu (without a bias) reads -> FusedGemm with the activation
"Gelu" / "FastGelu" (an SVTR-style recognizer's MLP).

Why: a transformer layer's up projection is followed by its GELU (BERT: MatMul then the
BiasGelu the extended level makes of Add + Gelu): as its own node the GELU is a pass over a
(tokens x 4 * hidden) product, where the compiled GEMM's epilogue computes it, with the bias,
on each tile it has just stored, still in L1 (the standalone BiasGelu's operations: the same
bits). onnxruntime has no such operator (nor a FusedGemm activation "Gelu"), so this is a
layout-level rewrite, like its NCHWc operators at that level (and conv_quick_gelu.py here).
"""

from __future__ import annotations

from ..base import LAYOUT, RulePass, register_pass
from ..extended._helpers import MS, is_float32, opset
from ..graph_utils import constant_value
from ..pattern import RewriteRule

ONNXRUN = "ai.onnxrun"


def _weight(w) -> bool:
    value = constant_value(w)
    return value is not None and value.ndim == 2 and value.dtype.name == "float32"


class MatMulBiasGelu(RewriteRule):
    name = "MatMul+BiasGelu"

    def pattern(self, op, x, w, b):
        return op.BiasGelu(op.MatMul(x, w, _name="mm"), b, _domain=MS)

    def check(self, context, x, w, b, mm, **_):
        bias = constant_value(b)
        return is_float32(x, mm.outputs[0], context.root.outputs[0]) and _weight(w) and \
            bias is not None and bias.shape == (constant_value(w).shape[1],) and \
            bias.dtype.name == "float32"

    def rewrite(self, op, x, w, b, **_):
        return op.MatMulBiasGelu(x, w, b, _domain=ONNXRUN)


class MatMulGelu(RewriteRule):
    name = "MatMul+Gelu"

    def pattern(self, op, x, w):
        return op.Gelu(op.MatMul(x, w, _name="mm"), _domain=MS)

    def check(self, context, x, w, mm, **_):
        return is_float32(x, mm.outputs[0], context.root.outputs[0]) and _weight(w)

    def rewrite(self, op, x, w, **_):
        return op.MatMulBiasGelu(x, w, _domain=ONNXRUN)


class MatMulFastGelu(RewriteRule):
    """FastGelu (its bias input optional, a constant row) after the MatMul: a GPT-style
    decoder's up projection."""

    name = "MatMul+FastGelu"

    def pattern(self, op, x, w):
        return op.FastGelu(op.MatMul(x, w, _name="mm"), _domain=MS)

    def check(self, context, x, w, mm, **_):
        if not (is_float32(x, mm.outputs[0], context.root.outputs[0]) and _weight(w)):
            return False
        extra = context.root.inputs[1:]
        if not extra or extra[0] is None:
            return True
        bias = constant_value(extra[0])
        return bias is not None and bias.shape == (constant_value(w).shape[1],) and \
            bias.dtype.name == "float32"

    def rewrite(self, op, x, w, **_):
        bias = [v for v in op.root.inputs[1:2] if v is not None]
        return op.MatMulBiasGelu(x, w, *bias, _domain=ONNXRUN, approximate="tanh")


class GemmGelu(RewriteRule):
    name = "Gemm+Gelu"
    activation = "Gelu"

    def pattern(self, op, a, b):
        return getattr(op, self.activation)(op.Gemm(a, b, _name="gemm"), _domain=MS)

    def check(self, context, gemm, **_):
        if opset(context.model, gemm) < 7:
            return False  # Gemm-6's broadcast attribute has no FusedGemm counterpart
        if len(context.root.inputs) > 1 and context.root.inputs[1] is not None:
            return False  # a FastGelu's own bias
        # (the Gelu's output is its input's type: the Gemm's; the extended level's Reshapes
        # around a Gemm may not carry a type)
        return is_float32(context.root.outputs[0])

    def rewrite(self, op, gemm, **_):
        return op.FusedGemm(*gemm.inputs, _domain=MS, activation=self.activation,
                            **gemm.attributes)


class GemmReshapeGelu(GemmGelu):
    """The same through the Reshape back to [batch, tokens, features] that the extended
    level's MatMulAddReshapeFusion writes after a transformer's projection: gelu(reshape(y))
    = reshape(gelu(y)), an element-wise function."""

    name = "Gemm+Reshape+Gelu"

    def pattern(self, op, a, b, shape):
        return getattr(op, self.activation)(
            op.Reshape(op.Gemm(a, b, _name="gemm"), shape, _name="reshape"), _domain=MS)

    def rewrite(self, op, gemm, reshape, **_):
        return op.Reshape(super().rewrite(op, gemm), *reshape.inputs[1:],
                          **reshape.attributes)


class GemmFastGelu(GemmGelu):
    name = "Gemm+FastGelu"
    activation = "FastGelu"


class GemmReshapeFastGelu(GemmReshapeGelu):
    name = "Gemm+Reshape+FastGelu"
    activation = "FastGelu"


@register_pass
class MatMulGeluFusion(RulePass):
    name = "MatMulGeluFusion"
    level = LAYOUT
    order = 41
    rules = (MatMulBiasGelu, MatMulGelu, MatMulFastGelu, GemmGelu, GemmReshapeGelu,
             GemmFastGelu, GemmReshapeFastGelu)
