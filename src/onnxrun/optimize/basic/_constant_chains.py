"""What AddChainFolding and MulChainFolding share: two nodes of an operator pair (Add/Sub,
Mul/Div), each with one constant operand, become one node with a combined constant.

A node of the pair is a *term* ``(variable input index, orientation, constant, dtype)``: the
orientation is +1 when it computes ``x op c`` (``x + k``, ``x * k``) and -1 when ``c inv x``
(``k - x``, ``k / x``). The pass composes an outer term with the term producing its variable
input (read by nothing else), computes the constant once, and rewrites the outer node in place
as ``x op k`` or ``k inv x``; the inner node goes."""

from __future__ import annotations

from collections import Counter

import numpy as np

from ...ir import Graph, Model, Node
from ..base import GraphPass, PassResult
from ..graph_utils import live_nodes, make_initializer
from ._helpers import is_float_array, one_constant_operand, sole_reader_producer

Term = tuple[int, int, np.ndarray, np.dtype]


def constant_operand(node: Node, ops: tuple[str, str]) -> tuple[int, np.ndarray] | None:
    """(index, value) of the one constant operand of an ai.onnx node of ``ops``; None for
    half-precision constants: reassociating would change results by their coarse rounding."""
    if node.domain != "" or node.op_type not in ops:
        return None
    found = one_constant_operand(node)
    if found is None or (is_float_array(found[1]) and found[1].dtype.itemsize < 4):
        return None
    return found


class ConstantChainFolding(GraphPass):
    direct = ""  # "Add" / "Mul": x op k
    inverse = ""  # "Sub" / "Div": k inv x

    def term(self, node: Node) -> Term | None:
        raise NotImplementedError

    def combine(self, outer: Term, inner: Term) -> tuple[np.ndarray, int] | None:
        """The constant of the composed term, in the inner dtype, and its orientation; None
        when it cannot be folded exactly enough (overflow to inf, integer division)."""
        raise NotImplementedError

    def run(self, model: Model) -> PassResult:
        changes: Counter = Counter()
        for graph, node in live_nodes(model):
            outer = self.term(node)
            if outer is None:
                continue
            inner_node = sole_reader_producer(node.inputs[outer[0]], graph)
            inner = self.term(inner_node) if inner_node is not None else None
            if inner is None or inner[3] != outer[3]:
                continue
            label = f"{inner_node.op_type}+{node.op_type}"
            if self._fold(graph, node, inner_node, outer, inner):
                changes[label] += 1
        return PassResult(bool(changes), changes)

    def _fold(self, graph: Graph, node: Node, inner_node: Node, outer: Term, inner: Term
              ) -> bool:
        combined = self.combine(outer, inner)
        if combined is None:
            return False
        constant, orientation = combined
        x = inner_node.inputs[inner[0]]
        k = make_initializer(graph, f"{node.label}_folded", constant)
        if orientation == 1:
            node.op_type = self.direct
            node.set_input(0, x)
            node.set_input(1, k)
        else:
            node.op_type = self.inverse
            node.set_input(0, k)
            node.set_input(1, x)
        graph.remove(inner_node)
        return True
