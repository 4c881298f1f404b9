"""Mul / Div chains by constants folded into one: (x * c1) * c2 -> x * (c1 * c2),
(x / c1) * c2 -> x * (c2 / c1), c1 / (x * c2) -> (c1 / c2) / x, and so on. The combined
constant is computed once (in float64 for floats); the intermediate node goes. Integers only
fold Mul into Mul: integer division truncates, so it does not reassociate."""

from __future__ import annotations

from collections import Counter

import numpy as np

from ...ir import Graph, Model, Node
from ..base import BASIC, GraphPass, PassResult, register_pass
from ..graph_utils import live_nodes, make_initializer
from ._helpers import is_float_array, one_constant_operand, sole_reader_producer

# (index of the variable input, its exponent e, constant factor k, the constant's dtype):
# the node computes x^e * k.
Term = tuple[int, int, np.ndarray, np.dtype]


def _term(node: Node) -> Term | None:
    if node.domain != "" or node.op_type not in ("Mul", "Div"):
        return None
    found = one_constant_operand(node)
    if found is None:
        return None
    ci, c = found
    if is_float_array(c) and c.dtype.itemsize < 4:
        return None  # half precision: reassociating changes results by its coarse rounding
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


def _fold(graph: Graph, node: Node, inner_node: Node, outer: Term, inner: Term) -> bool:
    (_, e2, k2, d2), (xi, e1, k1, d1) = outer, inner
    if d1 != d2:
        return False
    if d1.kind in "iu":
        with np.errstate(over="ignore"):
            combined = (k1 * k2).astype(d1)
        exponent = 1
    else:
        with np.errstate(all="ignore"):
            wide = (k1 if e2 == 1 else 1.0 / k1) * k2
        if not np.all(np.isfinite(wide)):
            return False
        combined = wide.astype(d1)
        exponent = e1 * e2
    x = inner_node.inputs[xi]
    k = make_initializer(graph, f"{node.label}_folded", combined)
    if exponent == 1:
        node.op_type = "Mul"
        node.set_input(0, x)
        node.set_input(1, k)
    else:
        node.op_type = "Div"
        node.set_input(0, k)
        node.set_input(1, x)
    graph.remove(inner_node)
    return True


@register_pass
class MulChainFolding(GraphPass):
    name = "MulChainFolding"
    level = BASIC
    order = 26

    def run(self, model: Model) -> PassResult:
        changes: Counter = Counter()
        for graph, node in live_nodes(model):
            outer = _term(node)
            if outer is None:
                continue
            inner_node = sole_reader_producer(node.inputs[outer[0]], graph)
            inner = _term(inner_node) if inner_node is not None else None
            label = f"{inner_node.op_type}+{node.op_type}" if inner is not None else ""
            if inner is not None and _fold(graph, node, inner_node, outer, inner):
                changes[label] += 1
        return PassResult(bool(changes), changes)
