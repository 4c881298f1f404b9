"""Dead-node and unused-initializer elimination: what no output needs is removed."""

from __future__ import annotations

from collections import Counter

from ...ir import Model
from ..base import BASIC, GraphPass, PassResult, register_pass
from ..graph_utils import all_graphs, is_graph_input, is_graph_output, remove_dead


@register_pass
class DeadCodeElimination(GraphPass):
    name = "DeadCodeElimination"
    level = BASIC
    order = 90

    def run(self, model: Model) -> PassResult:
        changes: Counter = Counter()
        # Innermost graphs first: removing a subgraph's dead nodes can free outer values.
        for graph in reversed(list(all_graphs(model.graph))):
            removed = remove_dead(graph)
            if removed:
                changes["nodes"] += removed
            for name, v in list(graph.initializers.items()):
                if not v.uses and not is_graph_output(v) and not is_graph_input(v):
                    del graph.initializers[name]
                    changes["initializers"] += 1
        return PassResult(bool(changes), changes)
