"""Conv + SiLU fusion (layout level): Conv followed by com.microsoft QuickGelu (which the
extended level makes of x * Sigmoid(x) and x * Sigmoid(alpha x)) -> FusedConv with the
activation "QuickGelu" and ``activation_params`` [alpha].

Why: a YOLO-style detector applies a SiLU after nearly every convolution (57 in
YOLOv8n-style); as its own node each is a pass over the convolution's output plus a node's
fixed cost, where the compiled GEMM's epilogue computes it on the tile it has just stored,
still in L1, with the same operations (MLAS's logistic: the standalone QuickGelu's bits).
onnxruntime's FusedConv has no such activation, so this is a layout-level rewrite, like
onnxruntime's own NCHWc operators at that level.
"""

from __future__ import annotations

from ..base import LAYOUT, RulePass, register_pass
from ..extended._helpers import MS, is_float32
from ..pattern import RewriteRule


class ConvQuickGelu(RewriteRule):
    name = "Conv+QuickGelu"

    def pattern(self, op, x, w):
        return op.QuickGelu(op.Conv(x, w, _name="conv"), _domain=MS)

    def check(self, context, x, conv, **_):
        return is_float32(x, conv.outputs[0], context.root.outputs[0])

    def rewrite(self, op, conv, **_):
        alpha = float(op.root.attr("alpha", 1.702))
        return op.FusedConv(*conv.inputs, _domain=MS, activation="QuickGelu",
                            activation_params=[alpha], **conv.attributes)


@register_pass
class ConvQuickGeluFusion(RulePass):
    name = "ConvQuickGeluFusion"
    level = LAYOUT
    order = 40
    rules = (ConvQuickGelu,)
