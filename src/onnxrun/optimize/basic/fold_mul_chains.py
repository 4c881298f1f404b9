"""Mul / Div chains by constants folded into one: (x * c1) * c2 -> x * (c1 * c2),
(x / c1) * c2 -> x * (c2 / c1), c1 / (x * c2) -> (c1 / c2) / x, and so on. The combined
constant is computed once (in float64 for floats); the intermediate node goes. Integers only
fold Mul into Mul: integer division truncates, so it does not reassociate."""

from __future__ import annotations

import numpy as np

from ...ir import Node
from ..base import BASIC, register_pass
from ._constant_chains import ConstantChainFolding, Term, constant_operand
from ._helpers import is_float_array


@register_pass
class MulChainFolding(ConstantChainFolding):
    name = "MulChainFolding"
    level = BASIC
    order = 26
    direct, inverse = "Mul", "Div"

    def term(self, node: Node) -> Term | None:
        """x^e * k, e = orientation."""
        found = constant_operand(node, ("Mul", "Div"))
        if found is None:
            return None
        ci, c = found
        if is_float_array(c):
            wide = c.astype(np.float64)
            if node.op_type == "Mul":
                return 1 - ci, 1, wide, c.dtype
            if ci == 1:  # x / c
                with np.errstate(divide="ignore"):
                    return 0, 1, 1.0 / wide, c.dtype
            return 1, -1, wide, c.dtype  # c / x
        if node.op_type == "Mul" and c.dtype.kind in "iu":
            return 1 - ci, 1, c, c.dtype  # integers: Mul only, wrapping as the kernel does
        return None

    def combine(self, outer: Term, inner: Term) -> tuple[np.ndarray, int] | None:
        (_, e2, k2, _), (_, e1, k1, dtype) = outer, inner
        if dtype.kind in "iu":
            with np.errstate(over="ignore"):
                return (k1 * k2).astype(dtype), 1
        with np.errstate(all="ignore"):
            wide = (k1 if e2 == 1 else 1.0 / k1) * k2
        if not np.all(np.isfinite(wide)):
            return None
        return wide.astype(dtype), e1 * e2
