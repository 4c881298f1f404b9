"""Transpose chains: Transpose(Transpose(x, p1), p2) is one Transpose of x by p1[p2[i]], and
none at all when that composition is the identity (a pair that cancels).

The outer Transpose is rewritten to read x; the inner one goes when nothing else reads it.
"""

from __future__ import annotations

from collections import Counter

from ...ir import Attribute, Model, Node
from ...proto import onnx
from ..base import BASIC, GraphPass, PassResult, register_pass
from ..graph_utils import is_graph_output, live_nodes, replace_value
from ._helpers import rank


def _perm(t: Node) -> list[int] | None:
    perm = t.attr("perm")
    if perm is not None:
        return list(perm)
    r = rank(t.inputs[0])
    return None if r is None else list(range(r))[::-1]


def _inner_transpose(node: Node) -> Node | None:
    if node.domain != "" or node.op_type != "Transpose" or not node.inputs:
        return None
    x = node.inputs[0]
    inner = x.producer if x is not None else None
    if inner is None or inner.graph is not node.graph:
        return None
    return inner if inner.domain == "" and inner.op_type == "Transpose" else None


@register_pass
class TransposeChainFusion(GraphPass):
    name = "TransposeChainFusion"
    level = BASIC
    order = 44

    def run(self, model: Model) -> PassResult:
        changes: Counter = Counter()
        for graph, node in live_nodes(model):
            inner = _inner_transpose(node)
            if inner is None:
                continue
            p1, p2 = _perm(inner), _perm(node)
            if p1 is None or p2 is None or len(p1) != len(p2):
                continue
            composed = [p1[i] for i in p2]
            x = inner.inputs[0]
            if composed == list(range(len(composed))):
                if not replace_value(node.outputs[0], x):
                    continue
                graph.remove(node)
                changes["cancelled pair"] += 1
            else:
                node.set_input(0, x)
                node.attributes["perm"] = Attribute("perm", onnx.AttributeProto.INTS,
                                                    composed)
                changes["composed"] += 1
            if not inner.outputs[0].uses and not is_graph_output(inner.outputs[0]):
                graph.remove(inner)
        return PassResult(bool(changes), changes)

