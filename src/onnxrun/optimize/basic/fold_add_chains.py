"""Add / Sub chains by constants folded into one: (x + c1) + c2 -> x + (c1 + c2),
(x - c1) + c2 -> x + (c2 - c1), c2 - (x + c1) -> (c2 - c1) - x, and so on. The combined
constant is computed once (floats in float64; integers wrap, as the kernels do, so the result
is the same); the intermediate node goes."""

from __future__ import annotations

import numpy as np

from ...ir import Node
from ..base import BASIC, register_pass
from ._constant_chains import ConstantChainFolding, Term, constant_operand
from ._helpers import is_float_array


@register_pass
class AddChainFolding(ConstantChainFolding):
    name = "AddChainFolding"
    level = BASIC
    order = 27
    direct, inverse = "Add", "Sub"

    def term(self, node: Node) -> Term | None:
        """s * x + k, s = orientation."""
        found = constant_operand(node, ("Add", "Sub"))
        if found is None:
            return None
        ci, c = found
        if is_float_array(c):
            k = c.astype(np.float64)
        elif c.dtype.kind in "iu":
            k = c
        else:
            return None
        if node.op_type == "Add":
            return 1 - ci, 1, k, c.dtype
        if ci == 1:  # x - c
            with np.errstate(over="ignore"):
                return 0, 1, -k, c.dtype
        return 1, -1, k, c.dtype  # c - x

    def combine(self, outer: Term, inner: Term) -> tuple[np.ndarray, int] | None:
        (_, s2, k2, _), (_, s1, k1, dtype) = outer, inner
        with np.errstate(all="ignore"):
            wide = (k1 if s2 == 1 else -k1) + k2  # s2 * (s1 x + k1) + k2
        if dtype.kind not in "iu" and not np.all(np.isfinite(wide)):
            return None
        return wide.astype(dtype), s1 * s2
