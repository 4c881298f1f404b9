"""Reshape chains: Reshape(Reshape(x, s1), s2) is Reshape(x, s2). A reshape only renames the
dimensions of the same row-major buffer, so what came before the last one does not matter:
the inner node may also be a Flatten, Squeeze or Unsqueeze. A 0 in s2 ("copy this dimension")
refers to the intermediate shape, so it is replaced by that dimension when it is known, and the
chain is left alone when it is not."""

from __future__ import annotations

from collections import Counter

import numpy as np

from ...ir import Model, Node
from ..base import BASIC, GraphPass, PassResult, register_pass
from ..graph_utils import all_graphs, constant_value, is_graph_output, make_initializer
from ._helpers import static_shape

_RESHAPING = {"Reshape", "Flatten", "Squeeze", "Unsqueeze"}


def _outer_shape(node: Node) -> np.ndarray | None:
    """The outer Reshape's target shape with every "copy" 0 resolved, or None."""
    if len(node.inputs) < 2:
        return None  # Reshape-1: shape as an attribute, none of today's exporters
    shape = constant_value(node.inputs[1])
    if shape is None or shape.ndim != 1 or shape.dtype != np.int64:
        return None
    if node.attr("allowzero", 0) or not np.any(shape == 0):
        return shape
    known = static_shape(node.inputs[0])
    zeros = np.flatnonzero(shape == 0)
    if known is None or zeros.max() >= len(known):
        return None
    resolved = shape.copy()
    resolved[zeros] = [known[i] for i in zeros]
    return resolved


@register_pass
class ReshapeChainFusion(GraphPass):
    name = "ReshapeChainFusion"
    level = BASIC
    order = 45

    def run(self, model: Model) -> PassResult:
        changes: Counter = Counter()
        for graph in list(all_graphs(model.graph)):
            for node in list(graph.nodes):
                if node.graph is not graph or node.domain != "" or node.op_type != "Reshape":
                    continue
                data = node.inputs[0]
                inner = data.producer if data is not None else None
                if (inner is None or inner.graph is not graph or inner.domain != ""
                        or inner.op_type not in _RESHAPING or inner.inputs[0] is None):
                    continue
                shape = _outer_shape(node)
                if shape is None:
                    continue
                if shape is not constant_value(node.inputs[1]):
                    node.set_input(1, make_initializer(graph, f"{node.label}_shape", shape))
                node.set_input(0, inner.inputs[0])
                changes[f"{inner.op_type}+Reshape"] += 1
                if not data.uses and not is_graph_output(data):
                    graph.remove(inner)
        return PassResult(bool(changes), changes)
