"""Pad (zeros, spatial axes only) -> Conv / AveragePool: the padding moves into the reader's
``pads`` attribute, as onnxruntime's PadFusion does.

PyTorch exports ZeroPad2d before a VALID convolution (TensorFlow-style "same" padding of
stride-2 layers in EfficientNet and MobileNet ports): a Pad node copies the whole activation
once more, and, as no layout follows it, makes the convolution before it write NCHW and the one
after it transpose its input back to channels-last. A convolution's own padding costs nothing.

Only where it is the same computation: a constant-mode Pad of zeros (``constant_value``
absent or all 0) with constant non-negative pads on the spatial axes only (none on the batch
or the channels), read by nothing else; a Conv with explicit pads or VALID (SAME_* placement
depends on the input size: left alone); an AveragePool that counts padding
(``count_include_pad`` 1, as the zeros it would have read) without ceil_mode. MaxPool is not
fused: its own padding is never taken, where the Pad's zeros would be.
"""

from __future__ import annotations

import numpy as np

from ...providers.registry import text_attribute
from ..base import BASIC, RulePass, register_pass
from ..graph_utils import constant_value, pad_amounts
from ..pattern import RewriteRule


def zero_pads(model, pad, rank: int) -> list[int] | None:
    """The Pad node's pads as [x1_begin, ..., x1_end, ...] over the ``rank`` axes, when it pads
    with zeros, by constants, only the axes after the first two, and by nothing negative."""
    if pad.domain != "" or text_attribute(pad.attr("mode", "constant")) != "constant":
        return None
    if (model.node_opset(pad) or 1) < 11:
        if pad.attr("pads") is None or float(pad.attr("value", 0.0)) != 0.0:
            return None
    elif len(pad.inputs) > 2 and pad.inputs[2] is not None:
        fill = constant_value(pad.inputs[2])
        if fill is None or np.any(fill != 0):
            return None
    pads = pad_amounts(pad, rank)
    if pads is None or rank < 3 or any(p < 0 for p in pads) or \
            any(pads[i] or pads[i + rank] for i in (0, 1)):
        return None
    return pads


def _explicit_pads(node, spatial: int) -> list[int] | None:
    """The node's own pads ([begin..., end...] over its spatial axes) where they are explicit
    (NOTSET, or VALID: none), else None."""
    auto_pad = text_attribute(node.attr("auto_pad", "NOTSET"))
    if auto_pad == "VALID":
        return [0] * (2 * spatial)
    if auto_pad != "NOTSET":
        return None
    pads = node.attr("pads")
    pads = [0] * (2 * spatial) if pads is None else [int(p) for p in pads]
    return pads if len(pads) == 2 * spatial else None


class _PadInto(RewriteRule):
    op_type = ""

    def pattern(self, op, x):
        return getattr(op, self.op_type)(op.Pad(x, _name="pad"), _name="reader")

    def accepts(self, reader) -> bool:
        return True

    def _merged(self, model, pad, reader) -> list[int] | None:
        if reader.domain != "" or not self.accepts(reader):
            return None
        kernel = reader.attr("kernel_shape")
        if kernel is None and len(reader.inputs) > 1:
            w = constant_value(reader.inputs[1])
            kernel = None if w is None else w.shape[2:]
        if kernel is None:
            return None
        spatial = len(kernel)
        own = _explicit_pads(reader, spatial)
        outer = zero_pads(model, pad, spatial + 2)
        if own is None or outer is None:
            return None
        rank = spatial + 2
        begins = [own[i] + outer[2 + i] for i in range(spatial)]
        ends = [own[spatial + i] + outer[rank + 2 + i] for i in range(spatial)]
        return begins + ends

    def check(self, context, pad, reader, **_):
        return self._merged(context.model, pad, reader) is not None

    def rewrite(self, op, x, pad, reader, **_):
        pads = self._merged(op.model, pad, reader)
        attrs = {k: a for k, a in reader.attributes.items() if k not in ("pads", "auto_pad")}
        build = getattr(op, reader.op_type)
        return build(x, *reader.inputs[1:], _name=reader.name or None, pads=pads, **attrs)


class PadConv(_PadInto):
    name = "Pad+Conv"
    op_type = "Conv"


class PadAveragePool(_PadInto):
    name = "Pad+AveragePool"
    op_type = "AveragePool"

    def accepts(self, reader) -> bool:
        return int(reader.attr("count_include_pad", 0)) == 1 and \
            not int(reader.attr("ceil_mode", 0)) and len(reader.outputs) == 1


@register_pass
class PadFusion(RulePass):
    name = "PadFusion"
    level = BASIC
    order = 34
    rules = (PadConv, PadAveragePool)
