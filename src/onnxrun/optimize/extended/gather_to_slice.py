"""Gather-to-Slice fusion: Gather(data, Range(start, limit, step)) -> Slice(data, [start],
[limit], [axis], [step]), as in onnxruntime: the position-embedding lookup of GPT-style exports
(``wpe[arange(seq)]``) becomes a contiguous slice instead of an index computation and a gather
copy. Only for a constant start >= 0 and step > 0, where both read the same rows (a limit past
the end makes Gather fail where Slice would clamp; onnxruntime accepts the same difference).
"""

from __future__ import annotations

import numpy as np

from ..base import EXTENDED, RulePass, register_pass
from ..graph_utils import constant_value, scalar_value
from ..pattern import RewriteRule
from ._helpers import elem_type, opset, rank


class GatherRange(RewriteRule):
    name = "Gather(Range)->Slice"

    def pattern(self, op, data, start, limit, step):
        return op.Gather(data, op.Range(start, limit, step), _name="gather")

    def check(self, context, data, start, limit, step, gather, **_):
        if opset(context.model, gather) < 13:
            return False  # Unsqueeze's axes became an input at 13
        s, d = scalar_value(start), scalar_value(step)
        if s is None or d is None or s < 0 or d <= 0:
            return False
        if constant_value(start).dtype.kind not in "iu" or rank(limit) != 0:
            return False
        r = rank(data)
        axis = gather.attr("axis", 0)
        return r is not None and -r <= axis < r and elem_type(limit) == elem_type(start)

    def rewrite(self, op, data, start, limit, step, gather, **_):
        dtype = constant_value(start).dtype
        axis = gather.attr("axis", 0)
        ends = op.Unsqueeze(limit, op.initializer(np.array([0], np.int64), "axes0"))
        return op.Slice(data, op.initializer(np.array([scalar_value(start)], dtype), "starts"),
                        ends, op.initializer(np.array([axis], dtype), "axes"),
                        op.initializer(np.array([scalar_value(step)], dtype), "steps"))


@register_pass
class GatherToSliceFusion(RulePass):
    name = "GatherToSliceFusion"
    level = EXTENDED
    order = 50
    rules = (GatherRange,)
