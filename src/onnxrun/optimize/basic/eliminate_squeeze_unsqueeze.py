"""Squeeze / Unsqueeze pairs that cancel: Squeeze(Unsqueeze(x, axes), axes) and
Unsqueeze(Squeeze(x, axes), axes) are x (the second only runs when those dimensions are 1, so
putting them back gives x again). Axes come from the attribute (opset < 13) or a constant input,
and are compared after negative ones are resolved against the larger tensor's rank."""

from __future__ import annotations

from collections import Counter

from ...ir import Model, Node, Value
from ..base import BASIC, GraphPass, PassResult, register_pass
from ..graph_utils import all_graphs, constant_value, is_graph_output, replace_value
from ._helpers import rank

_PARTNER = {"Squeeze": "Unsqueeze", "Unsqueeze": "Squeeze"}


def _axes(node: Node) -> list[int] | None:
    if len(node.inputs) > 1 and node.inputs[1] is not None:
        c = constant_value(node.inputs[1])
        return None if c is None or c.ndim > 1 else [int(a) for a in c.reshape(-1)]
    axes = node.attr("axes")
    return None if axes is None else [int(a) for a in axes]


def _normalized(axes: list[int], r: int | None) -> set[int] | None:
    if any(a < 0 for a in axes):
        if r is None:
            return None
        axes = [a + r if a < 0 else a for a in axes]
    return set(axes) if len(set(axes)) == len(axes) else None


def _cancels(outer: Node, inner: Node) -> Value | None:
    a_outer, a_inner = _axes(outer), _axes(inner)
    if not a_outer or not a_inner:
        return None  # a Squeeze without axes removes whatever is 1: not known statically here
    # The larger tensor: the intermediate for Squeeze(Unsqueeze(x)), x for Unsqueeze(Squeeze(x)).
    big = outer.inputs[0] if outer.op_type == "Squeeze" else inner.inputs[0]
    r = rank(big)
    n_outer, n_inner = _normalized(a_outer, r), _normalized(a_inner, r)
    if n_outer is None or n_outer != n_inner:
        return None
    return inner.inputs[0]


@register_pass
class SqueezeUnsqueezeElimination(GraphPass):
    name = "SqueezeUnsqueezeElimination"
    level = BASIC
    order = 46

    def run(self, model: Model) -> PassResult:
        changes: Counter = Counter()
        for graph in list(all_graphs(model.graph)):
            for node in list(graph.nodes):
                if node.graph is not graph or node.domain != "" or node.op_type not in _PARTNER:
                    continue
                mid = node.inputs[0]
                inner = mid.producer if mid is not None else None
                if (inner is None or inner.graph is not graph or inner.domain != ""
                        or inner.op_type != _PARTNER[node.op_type]):
                    continue
                x = _cancels(node, inner)
                if x is None or not replace_value(node.outputs[0], x):
                    continue
                graph.remove(node)
                changes[f"{inner.op_type}+{node.op_type}"] += 1
                if not mid.uses and not is_graph_output(mid):
                    graph.remove(inner)
        return PassResult(bool(changes), changes)
