"""Conv + activation fusion: Conv followed by Relu, Clip (constant bounds: ReLU6), Sigmoid,
Tanh, LeakyRelu or HardSigmoid -> com.microsoft FusedConv, with the ``activation`` and
``activation_params`` attributes onnxruntime writes. The activation runs in place on the
convolution's output instead of as a separate pass over it. (HardSwish has no FusedConv form in
onnxruntime, so it stays separate.)
"""

from __future__ import annotations

from ..base import EXTENDED, RulePass, register_pass
from ..graph_utils import constant_value
from ..pattern import RewriteRule
from ._helpers import LOWEST_FLOAT32, MS, float_scalar, is_float32, opset

HIGHEST_FLOAT32 = -LOWEST_FLOAT32


def clip_bounds(model, clip) -> list[float] | None:
    """[min, max] of a Clip whose bounds are attributes (before opset 11) or constants."""
    if opset(model, clip) < 11:
        return [float(clip.attr("min", LOWEST_FLOAT32)), float(clip.attr("max", HIGHEST_FLOAT32))]
    bounds = []
    for i, default in ((1, LOWEST_FLOAT32), (2, HIGHEST_FLOAT32)):
        v = clip.inputs[i] if len(clip.inputs) > i else None
        if v is None:
            bounds.append(default)
            continue
        c = float_scalar(v)
        if c is None or constant_value(v).ndim > 1:
            return None
        bounds.append(c)
    return bounds


def activation_params(model, act) -> list[float] | None:
    """onnxruntime's activation_params for the node ``act`` ([] when it has none), or None
    when ``act`` cannot be fused."""
    op = act.op_type
    if act.domain != "":
        return None
    if op in ("Relu", "Sigmoid", "Tanh"):
        return []
    if op == "LeakyRelu":
        return [float(act.attr("alpha", 0.01))]
    if op == "HardSigmoid":
        return [float(act.attr("alpha", 0.2)), float(act.attr("beta", 0.5))]
    if op == "Clip":
        return clip_bounds(model, act)
    return None


class _ConvActivation(RewriteRule):
    name = "Conv+activation"
    activation = "Relu"

    def pattern(self, op, x, w):
        return getattr(op, self.activation)(op.Conv(x, w, _name="conv"))

    def check(self, context, x, conv, **_):
        act = context.root
        return activation_params(context.model, act) is not None and is_float32(
            x, conv.outputs[0], act.outputs[0])

    def rewrite(self, op, conv, **_):
        act = op.root
        params = activation_params(op.model, act)
        return op.FusedConv(*conv.inputs, _domain=MS, activation=act.op_type,
                            activation_params=params or None, **conv.attributes)


def _variant(activation: str) -> type[RewriteRule]:
    return type(f"Conv{activation}", (_ConvActivation,),
                {"activation": activation, "name": f"Conv+{activation}"})


@register_pass
class ConvActivationFusion(RulePass):
    name = "ConvActivationFusion"
    level = EXTENDED
    order = 40
    rules = tuple(_variant(a) for a in ("Relu", "Clip", "Sigmoid", "Tanh", "LeakyRelu",
                                        "HardSigmoid"))
