"""Div by a float constant -> Mul by its reciprocal, computed once at load time.

x / c and x * (1 / c) differ by at most one rounding; multiplication is the cheaper operation,
and a Mul joins Mul chains and Conv*Mul fusion. Floats only (integer division truncates),
never when a reciprocal would overflow or lose precision as a subnormal, and in half precision
only when the reciprocal is exact.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from ...ir import Model
from ..base import BASIC, GraphPass, PassResult, register_pass
from ..graph_utils import all_graphs, constant_value, make_initializer
from ._helpers import is_float_array, smallest_normal


def reciprocal(c: np.ndarray) -> np.ndarray | None:
    """1 / c in c's dtype, or None when some finite, nonzero c has no normal reciprocal."""
    if not is_float_array(c):
        return None
    wide = c.astype(np.float64)
    with np.errstate(divide="ignore", over="ignore"):
        r = (1.0 / wide).astype(c.dtype)
    regular = np.isfinite(wide) & (wide != 0)
    magnitude = np.abs(r.astype(np.float64))[regular]
    if not np.all(np.isfinite(magnitude)) or np.any(magnitude < smallest_normal(c.dtype)):
        return None
    # Half precision: one more rounding is a visible change (1e-3), so exact reciprocals only
    # (powers of two, as in attention's / 8).
    if c.dtype.itemsize < 4 and not np.all(r.astype(np.float64)[regular] * wide[regular] == 1):
        return None
    return r


@register_pass
class DivToMul(GraphPass):
    name = "DivToMul"
    level = BASIC
    order = 25

    def run(self, model: Model) -> PassResult:
        changes: Counter = Counter()
        for graph in list(all_graphs(model.graph)):
            for node in list(graph.nodes):
                if (node.graph is not graph or node.domain != "" or node.op_type != "Div"
                        or len(node.inputs) != 2 or node.inputs[0] is None):
                    continue
                if constant_value(node.inputs[0]) is not None:
                    continue  # c / c': constant folding's
                c = constant_value(node.inputs[1])
                r = reciprocal(c) if c is not None else None
                if r is None:
                    continue
                node.op_type = "Mul"
                node.set_input(1, make_initializer(graph, f"{node.inputs[1].name}_reciprocal", r))
                changes["Div"] += 1
        return PassResult(bool(changes), changes)
