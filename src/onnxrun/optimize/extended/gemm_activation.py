"""Gemm + activation fusion: Gemm followed by an activation onnxruntime's FusedGemm applies
(Relu, Sigmoid, Tanh, LeakyRelu, HardSigmoid, Elu, Selu, Softplus, Softsign, ThresholdedRelu)
-> com.microsoft FusedGemm, the activation's attributes carried as ``activation_<name>``.
Covers MatMul + Add + activation too, once the basic level has made MatMul + Add a Gemm.
"""

from __future__ import annotations

from ..base import EXTENDED, RulePass, register_pass
from ..pattern import RewriteRule
from ._helpers import MS, is_float32, opset

# activation -> {its attribute: default}, as the standalone operators define them
ACTIVATIONS: dict[str, dict[str, float]] = {
    "Relu": {}, "Sigmoid": {}, "Tanh": {}, "Softplus": {}, "Softsign": {},
    "LeakyRelu": {"alpha": 0.01},
    "HardSigmoid": {"alpha": 0.2, "beta": 0.5},
    "Elu": {"alpha": 1.0},
    "Selu": {"alpha": 1.67326319217681884765625, "gamma": 1.05070102214813232421875},
    "ThresholdedRelu": {"alpha": 1.0},
}


class _GemmActivation(RewriteRule):
    name = "Gemm+activation"
    activation = "Relu"

    def pattern(self, op, a, b):
        return getattr(op, self.activation)(op.Gemm(a, b, _name="gemm"))

    def check(self, context, a, gemm, **_):
        if opset(context.model, gemm) < 7:
            return False  # Gemm-6's broadcast attribute has no FusedGemm counterpart
        return is_float32(a, gemm.outputs[0], context.root.outputs[0])

    def rewrite(self, op, gemm, **_):
        act = op.root
        params = {f"activation_{k}": float(act.attr(k, default))
                  for k, default in ACTIVATIONS[act.op_type].items()}
        return op.FusedGemm(*gemm.inputs, _domain=MS, activation=act.op_type,
                            **gemm.attributes, **params)


def _variant(activation: str) -> type[RewriteRule]:
    return type(f"Gemm{activation}", (_GemmActivation,),
                {"activation": activation, "name": f"Gemm+{activation}"})


@register_pass
class GemmActivationFusion(RulePass):
    name = "GemmActivationFusion"
    level = EXTENDED
    order = 41
    rules = tuple(_variant(a) for a in ACTIVATIONS)
