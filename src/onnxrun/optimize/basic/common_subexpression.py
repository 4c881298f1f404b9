"""Common-subexpression elimination: two nodes with the same operator, domain, attributes and
inputs compute the same outputs, so the second reads the first's instead of recomputing.

Never for operators whose results differ between calls (random generators, Dropout, which may
train), nor for nodes holding subgraphs. Inputs are compared by identity, so constant sharing
(which makes equal initializers one value) runs first.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from ...ir import Model, Node
from ...proto import onnx
from ..base import BASIC, GraphPass, PassResult, register_pass
from ..graph_utils import all_graphs, is_graph_input, is_graph_output, replace_value

_DOMAINS = {"", "ai.onnx.ml", "com.microsoft"}
_NONDETERMINISTIC = {"Bernoulli", "Multinomial"}


def _eligible(node: Node) -> bool:
    op = node.op_type
    if node.domain not in _DOMAINS or op in _NONDETERMINISTIC:
        return False
    if op.startswith("Random") or "Dropout" in op:
        return False
    return not any(True for _ in node.subgraphs())


def _canonical(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return ("array", value.dtype.str, value.shape, np.ascontiguousarray(value).tobytes())
    if isinstance(value, onnx.TypeProto):
        return ("type", value.SerializeToString())
    if isinstance(value, list | tuple):
        return tuple(_canonical(v) for v in value)
    return value


def _key(node: Node) -> tuple:
    attrs = tuple(sorted((name, a.type, _canonical(a.value), a.ref_attr_name)
                         for name, a in node.attributes.items()))
    return (node.domain, node.op_type, node.overload,
            tuple(None if v is None else id(v) for v in node.inputs),
            tuple(bool(v.name) for v in node.outputs), attrs)


def _can_take_over(dup: Node, kept: Node) -> bool:
    """Every output of ``dup`` can be replaced by ``kept``'s (graph outputs keep their names:
    the kept value must be free to take the name)."""
    return not any(is_graph_output(old) and (is_graph_output(new) or is_graph_input(new))
                   for old, new in zip(dup.outputs, kept.outputs, strict=True))


@register_pass
class CommonSubexpressionElimination(GraphPass):
    name = "CommonSubexpressionElimination"
    level = BASIC
    order = 14

    def run(self, model: Model) -> PassResult:
        changes: Counter = Counter()
        for graph in list(all_graphs(model.graph)):
            seen: dict[tuple, Node] = {}
            for node in list(graph.nodes):
                if node.graph is not graph or not _eligible(node):
                    continue
                try:
                    key = _key(node)
                except TypeError:  # an unhashable attribute value: leave the node alone
                    continue
                kept = seen.setdefault(key, node)
                if kept is node or not _can_take_over(node, kept):
                    continue
                for old, new in zip(node.outputs, kept.outputs, strict=True):
                    if old.name:
                        replace_value(old, new)
                graph.remove(node)
                changes[node.op_type] += 1
        return PassResult(bool(changes), changes)

