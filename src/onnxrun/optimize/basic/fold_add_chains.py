"""Add / Sub chains by constants folded into one: (x + c1) + c2 -> x + (c1 + c2),
(x - c1) + c2 -> x + (c2 - c1), c2 - (x + c1) -> (c2 - c1) - x, and so on. The combined
constant is computed once (floats in float64; integers wrap, as the kernels do, so the result
is the same); the intermediate node goes."""

from __future__ import annotations

from collections import Counter

import numpy as np

from ...ir import Graph, Model, Node
from ..base import BASIC, GraphPass, PassResult, register_pass
from ..graph_utils import live_nodes, make_initializer
from ._helpers import is_float_array, one_constant_operand, sole_reader_producer

# (index of the variable input, its sign s, constant k, the constant's dtype): s * x + k.
Term = tuple[int, int, np.ndarray, np.dtype]


def _term(node: Node) -> Term | None:
    if node.domain != "" or node.op_type not in ("Add", "Sub"):
        return None
    found = one_constant_operand(node)
    if found is None:
        return None
    ci, c = found
    if is_float_array(c) and c.dtype.itemsize < 4:
        return None  # half precision: reassociating changes results by its coarse rounding
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


def _fold(graph: Graph, node: Node, inner_node: Node, outer: Term, inner: Term) -> bool:
    (_, s2, k2, d2), (xi, s1, k1, d1) = outer, inner
    if d1 != d2:
        return False
    with np.errstate(all="ignore"):
        wide = (k1 if s2 == 1 else -k1) + k2  # s2 * (s1 x + k1) + k2
    if d1.kind not in "iu" and not np.all(np.isfinite(wide)):
        return False
    x = inner_node.inputs[xi]
    k = make_initializer(graph, f"{node.label}_folded", wide.astype(d1))
    if s1 * s2 == 1:
        node.op_type = "Add"
        node.set_input(0, x)
        node.set_input(1, k)
    else:
        node.op_type = "Sub"
        node.set_input(0, k)
        node.set_input(1, x)
    graph.remove(inner_node)
    return True


@register_pass
class AddChainFolding(GraphPass):
    name = "AddChainFolding"
    level = BASIC
    order = 27

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
