"""ConvInteger + scale (+ bias) fusion, the convolution counterpart of MatMulIntegerToFloat:

    ConvInteger(x, W, x_zp, w_zp) -> Cast(float) -> Mul(scale) [-> Add(bias)]
        -> ai.onnxrun ConvIntegerToFloat(x, W, scale, x_zp, w_zp, bias)

That is what ``quantize_dynamic`` writes for every convolution: four passes over the int32
accumulator (to float, times x_scale * w_scale, plus the bias) become the epilogue of the
integer convolution, and so does a following Relu or Clip (ReLU6), as FusedConv's
activation. onnxruntime has no such operator (its dynamically quantized CNNs run the four
passes), so the fused node is in onnxrun's own domain; the scale and the bias must be per
tensor or per output channel in the shapes the quantizer writes ([], [1], [M, 1, 1],
[1, M, 1, 1]).
"""

from __future__ import annotations

from ...proto import onnx
from ..base import EXTENDED, RulePass, register_pass
from ..pattern import RewriteRule
from ._helpers import const_value, elem_type, is_float32, shape
from .conv_activation import activation_params

FLOAT = onnx.TensorProto.FLOAT

ONNXRUN = "ai.onnxrun"
_CONV_ATTRS = ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")


def _per_channel(v, M: int, rank: int) -> bool:
    """A tensor that broadcasts against an (N, M, *spatial) output as one value, or one value
    per output channel (the kernel takes the same test on the arrays)."""
    from ...providers.cpu.ops.quantization import broadcasts_per_channel

    s = shape(v)
    return s is not None and all(isinstance(d, int) for d in s) and \
        broadcasts_per_channel(s, M, rank)


def _weight_channels(w) -> tuple[int, int] | None:
    W = const_value(w)
    if W is not None:
        return W.shape[0], W.ndim
    s = shape(w)
    return (s[0], len(s)) if s is not None and isinstance(s[0], int) else None


class _ScaledConvInteger(RewriteRule):
    name = "ConvIntegerToFloat"
    num_inputs = 4  # ConvInteger's inputs as written: (x, w), (x, w, x_zp) or all four

    def pattern(self, op, x, w, x_zp, w_zp, scale):
        ins = (x, w, x_zp, w_zp)[: self.num_inputs]
        acc = op.ConvInteger(*ins, _name="conv")
        return op.Mul(op.Cast(acc, _name="cast"), scale)

    def check(self, context, w, scale, conv, cast, **_):
        if len(conv.inputs) != self.num_inputs or cast.attr("to") != FLOAT:
            return False
        mr = _weight_channels(w)
        return mr is not None and is_float32(scale) and _per_channel(scale, *mr)

    def rewrite(self, op, x, w, scale, conv, x_zp=None, w_zp=None, **_):
        if self.num_inputs < 4:
            w_zp = None
        if self.num_inputs < 3:
            x_zp = None
        attrs = {a: conv.attr(a) for a in _CONV_ATTRS if conv.attr(a) is not None}
        return op.ConvIntegerToFloat(x, w, scale, x_zp, w_zp, _domain=ONNXRUN, **attrs)


def _variant(n: int) -> type[RewriteRule]:
    return type(f"ConvIntegerToFloat_{n}", (_ScaledConvInteger,), {"num_inputs": n})


class ConvIntegerToFloatBias(RewriteRule):
    name = "ConvIntegerToFloat+bias"

    def pattern(self, op, x, w, scale, x_zp, w_zp, bias):
        y = op.ConvIntegerToFloat(x, w, scale, x_zp, w_zp, _domain=ONNXRUN, _name="conv")
        return op.Add(y, bias)

    def check(self, context, w, bias, conv, **_):
        if len(conv.inputs) > 5 and conv.inputs[5] is not None:
            return False  # has a bias already
        mr = _weight_channels(w)
        return (mr is not None and const_value(bias) is not None and elem_type(bias) == FLOAT
                and _per_channel(bias, *mr))

    def rewrite(self, op, x, w, scale, x_zp, w_zp, bias, conv, **_):
        attrs = {a: conv.attr(a) for a in _CONV_ATTRS if conv.attr(a) is not None}
        return op.ConvIntegerToFloat(x, w, scale, x_zp, w_zp, bias, _domain=ONNXRUN, **attrs)


class _ClippedConvIntegerToFloat(RewriteRule):
    """A Relu or a Clip with constant bounds after the fused convolution: its epilogue clips
    (the ``activation`` / ``activation_params`` attributes of FusedConv)."""

    name = "ConvIntegerToFloat+Relu"
    activation = "Relu"

    def pattern(self, op, x, w, scale):
        return getattr(op, self.activation)(
            op.ConvIntegerToFloat(x, w, scale, _domain=ONNXRUN, _name="conv"))

    def check(self, context, conv, **_):
        act = context.root
        return conv.attr("activation") is None and \
            activation_params(context.model, act) is not None and is_float32(act.outputs[0])

    def rewrite(self, op, conv, **_):
        act = op.root
        params = activation_params(op.model, act)
        return op.ConvIntegerToFloat(*conv.inputs, _domain=ONNXRUN, activation=act.op_type,
                                     activation_params=params or None, **conv.attributes)


class _ClipConvIntegerToFloat(_ClippedConvIntegerToFloat):
    name = "ConvIntegerToFloat+Clip"
    activation = "Clip"


@register_pass
class ConvIntegerToFloatFusion(RulePass):
    name = "ConvIntegerToFloatFusion"
    level = EXTENDED
    order = 12
    rules = (_variant(4), _variant(3), _variant(2), ConvIntegerToFloatBias,
             _ClippedConvIntegerToFloat, _ClipConvIntegerToFloat)
