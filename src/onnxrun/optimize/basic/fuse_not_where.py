"""Not + Where: Where(Not(c), a, b) is Where(c, b, a). The Not goes when every reader of its
output is a Where's condition (exporters write causal masks this way)."""

from __future__ import annotations

from collections import Counter

from ...ir import Model
from ..base import BASIC, GraphPass, PassResult, register_pass
from ..graph_utils import all_graphs, is_graph_output


@register_pass
class NotWhereFusion(GraphPass):
    name = "NotWhereFusion"
    level = BASIC
    order = 47

    def run(self, model: Model) -> PassResult:
        changes: Counter = Counter()
        for graph in list(all_graphs(model.graph)):
            for node in list(graph.nodes):
                if node.graph is not graph or node.domain != "" or node.op_type != "Not":
                    continue
                out = node.outputs[0]
                readers = list(out.uses)
                if not readers or is_graph_output(out) or not all(
                    r.domain == "" and r.op_type == "Where" and i == 0 and r.graph is graph
                    and len(r.inputs) == 3 and r.inputs[1] is not out and r.inputs[2] is not out
                    for r, i in readers
                ):
                    continue
                for where, _ in readers:
                    a, b = where.inputs[1], where.inputs[2]
                    where.set_input(0, node.inputs[0])
                    where.set_input(1, b)
                    where.set_input(2, a)
                graph.remove(node)
                changes["Not+Where"] += len(readers)
        return PassResult(bool(changes), changes)
