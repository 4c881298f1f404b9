"""BatchNormalization + Relu fusion (layout level): a float32 BatchNormalization at inference
(one output) whose result only a Relu reads -> ai.onnxrun FusedBatchNormalization with the
activation "Relu".

Why: a DenseNet's layers are pre-activated (Concat -> BatchNormalization -> Relu -> Conv),
and the BatchNormalization cannot fold into a convolution before it; as two nodes the Relu is
a second pass over the block's widest tensors (DenseNet-121-style blocks: 1.2 ms of 50),
where the compiled scale-shift pass applies it to each vector it has just computed, as
onnxruntime's NCHWc transformer does by turning the BatchNormalization into a convolution
with the Relu fused. onnxruntime has no such operator, so this is a layout-level rewrite
(like conv_quick_gelu.py here).
"""

from __future__ import annotations

from ..base import LAYOUT, RulePass, register_pass
from ..basic._helpers import inference_batchnorm
from ..extended._helpers import is_float32
from ..pattern import RewriteRule

ONNXRUN = "ai.onnxrun"


class BatchNormRelu(RewriteRule):
    name = "BatchNormalization+Relu"

    def pattern(self, op, x, scale, b, mean, var):
        return op.Relu(op.BatchNormalization(x, scale, b, mean, var, _name="bn"))

    def check(self, context, x, bn, **_):
        return inference_batchnorm(context.model, bn) and \
            is_float32(x, bn.outputs[0], context.root.outputs[0])

    def rewrite(self, op, bn, **_):
        return op.FusedBatchNormalization(*bn.inputs, _domain=ONNXRUN, activation="Relu",
                                          epsilon=float(bn.attr("epsilon", 1e-5)))


@register_pass
class BatchNormReluFusion(RulePass):
    name = "BatchNormReluFusion"
    level = LAYOUT
    order = 42
    rules = (BatchNormRelu,)
