"""Skip LayerNorm fusion: a residual Add feeding a layer norm becomes one node,

    LayerNormalization(a + b)            -> com.microsoft SkipLayerNormalization(a, b, gamma, beta)
    SimplifiedLayerNormalization(a + b)  -> com.microsoft SkipSimplifiedLayerNormalization(a, b, w)
    RMSNormalization(a + b)              -> (the same)

for a and b of the same [batch, sequence, hidden] shape. A bias Add on one side (the Linear
layer before the residual) is absorbed as the ``bias`` input. When the sum is read elsewhere too
(pre-LN transformers carry it to the next residual), the fused node's fourth output
(input_skip_bias_sum) takes its place.
"""

from __future__ import annotations

from collections import Counter

from ...ir import Model, Node, Value
from ..base import EXTENDED, GraphPass, PassResult, register_pass
from ..graph_utils import all_graphs, constant_value, is_graph_output, single_consumer
from ._helpers import (
    MS,
    available_before,
    insert_before,
    is_float32,
    last_dim,
    make_node,
    producer,
    rank,
    remove_nodes,
    same_dim,
    shape,
    take_over,
    unnamed_output,
)

_NORMS = {"LayerNormalization": "SkipLayerNormalization",
          "SimplifiedLayerNormalization": "SkipSimplifiedLayerNormalization",
          "RMSNormalization": "SkipSimplifiedLayerNormalization"}


def _vector(v: Value | None, d: int) -> bool:
    s = shape(v)
    return s is not None and len(s) == 1 and s[0] == d


def _same_shape(a: Value, b: Value, d: int) -> bool:
    if rank(a) != 3 or rank(b) != 3 or last_dim(a) != d or last_dim(b) != d:
        return False
    return same_dim(a, b, 0) and same_dim(a, b, 1)


def _bias_add(v: Value, d: int, consumer: Node) -> tuple[Value, Value, Node] | None:
    """v = Add(x, bias) with a 1-D constant bias read only by ``consumer``: (x, bias, Add)."""
    add = producer(v, "Add")
    if add is None or single_consumer(v) is not consumer:
        return None
    for x, bias in ((add.inputs[0], add.inputs[1]), (add.inputs[1], add.inputs[0])):
        if constant_value(bias) is not None and _vector(bias, d) and rank(x) == 3 and (
                last_dim(x) == d):
            return x, bias, add
    return None


@register_pass
class SkipLayerNormFusion(GraphPass):
    name = "SkipLayerNormFusion"
    level = EXTENDED
    order = 35

    def run(self, model: Model) -> PassResult:
        changes: Counter = Counter()
        for graph in list(all_graphs(model.graph)):
            for node in list(graph.nodes):
                if node.graph is graph and node.domain == "" and node.op_type in _NORMS:
                    if self._fuse(model, node):
                        changes[f"Add+{node.op_type}"] += 1
        return PassResult(bool(changes), changes)

    def _fuse(self, model: Model, norm: Node) -> bool:
        graph = norm.graph
        simplified = norm.op_type != "LayerNormalization"
        if norm.attr("axis", -1) not in (-1, 2):
            return False
        if any(o.uses or is_graph_output(o) for o in norm.outputs[1:]):
            return False  # mean / inv_std read: training graphs keep their LayerNormalization
        s = norm.inputs[0]
        add = producer(s, "Add")
        if add is None or len(add.inputs) != 2 or add.graph is not graph:
            return False
        gamma = norm.inputs[1]
        beta = norm.inputs[2] if len(norm.inputs) > 2 and not simplified else None
        d = last_dim(s)
        if d is None or not _vector(gamma, d) or (beta is not None and not _vector(beta, d)):
            return False
        a, b = add.inputs
        if not is_float32(a, b, norm.outputs[0]) or not _same_shape(a, b, d):
            return False
        if any(v is not None and not available_before(v, add) for v in (gamma, beta)):
            return False  # the fused node takes the Add's place in the node order
        removed = [norm, add]
        bias = None
        for i, side in enumerate((a, b)):  # the sum output includes the bias: always exact
            found = _bias_add(side, d, add)
            if found is not None and _same_shape(found[0], b if i == 0 else a, d):
                a, b = (found[0], b) if i == 0 else (a, found[0])
                bias = found[1]
                removed.append(found[2])
                break
        inputs = [a, b, gamma] + ([] if simplified else [beta]) + [bias]
        while inputs[-1] is None:
            inputs.pop()
        fused = make_node(graph, model, _NORMS[norm.op_type], inputs, 4, domain=MS,
                          name=f"{norm.label}_skip", epsilon=float(norm.attr("epsilon", 1e-5)))
        take_over(fused, 0, norm.outputs[0])
        fused.outputs[1] = unnamed_output(graph)
        fused.outputs[2] = unnamed_output(graph)
        sum_needed = any(u is not norm for u, _ in s.uses) or is_graph_output(s)
        if sum_needed:
            take_over(fused, 3, s)
        else:
            fused.outputs[3] = unnamed_output(graph)
        for i, o in enumerate(fused.outputs):
            o.producer, o.output_index = fused, i
        insert_before(graph, add, [fused])
        remove_nodes(graph, set(removed))
        return True
