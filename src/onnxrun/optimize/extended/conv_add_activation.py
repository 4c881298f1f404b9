"""Conv + Add (or a Sum of two) of a same-shaped value, optionally then Relu -> com.microsoft
FusedConv with that value as its Z input (onnxruntime's ConvAddActivationFusion): act(conv(x)
+ b + z) on the way out of the convolution instead of one pass for the sum and one for the
Relu (ResNet's and ShuffleNet's residual joins). The same additions in the same order: z is
added to the biased convolution output, as the Add did.
"""

from __future__ import annotations

from ..base import EXTENDED, RulePass, register_pass
from ..pattern import RewriteRule
from ._helpers import MS, is_float32, shape


class _ConvAdd(RewriteRule):
    name = "Conv+Add"
    join = "Add"
    conv_first = True  # Sum is not matched in both orders: a rule for each
    activation: str | None = None

    def pattern(self, op, x, w, z):
        conv = op.Conv(x, w, _name="conv")
        joined = getattr(op, self.join)(*((conv, z) if self.conv_first else (z, conv)),
                                        _name="join")
        return getattr(op, self.activation)(joined) if self.activation else joined

    def check(self, context, x, conv, join, z, **_):
        y = conv.outputs[0]
        out = context.root.outputs[0]
        dims = shape(y)
        # Z must be the output's very shape: FusedConv adds it, it does not broadcast to it
        return len(join.inputs) == 2 and len(conv.inputs) <= 3 and z is not y and \
            dims is not None and all(isinstance(d, int) for d in dims) and \
            shape(z) == dims and shape(out) == dims and is_float32(x, y, z, out)

    def rewrite(self, op, conv, z, **_):
        inputs = list(conv.inputs) + [None] * (3 - len(conv.inputs))
        extra = {"activation": self.activation} if self.activation else {}
        return op.FusedConv(*inputs, z, _domain=MS, **extra, **conv.attributes)


def _variant(join: str, conv_first: bool, activation: str | None) -> type[RewriteRule]:
    name = f"Conv+{join}" + (f"+{activation}" if activation else "")
    return type(name.replace("+", ""), (_ConvAdd,), {
        "name": name, "join": join, "conv_first": conv_first, "activation": activation})


@register_pass
class ConvAddActivationFusion(RulePass):
    name = "ConvAddActivationFusion"
    level = EXTENDED
    order = 39  # before ConvActivationFusion takes the Conv + Relu pairs
    # with the Relu first: a bare join's rule would leave Relu(FusedConv) behind
    rules = tuple(_variant(join, first, act) for act in ("Relu", None)
                  for join, first in (("Add", True), ("Sum", True), ("Sum", False)))
