"""Reshape fusion: a Reshape whose target shape is computed from the shape of its own input,

    Reshape(x, Concat(Unsqueeze(Gather(Shape(x), 0)), Unsqueeze(Gather(Shape(x), 1)), [4, 16]))

as exporters write "keep the batch and sequence dimensions, split the hidden one", gets the
constant target [0, 0, 4, 16] instead: 0 copies x's dimension at that position, which is what
the subgraph computed. The Shape / Gather / Unsqueeze / Concat chain then has no reader left
and goes. A dimension read from another tensor (or at another position) becomes a constant only
when shape inference knows it as a number. As onnxruntime's ReshapeFusion.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from ...dtypes import type_shape
from ...ir import Graph, Model, Node, Value
from ..base import BASIC, GraphPass, PassResult, register_pass
from ..graph_utils import all_graphs, constant_value, make_initializer
from ._helpers import rank

# An entry of the target shape: ("const", value) or ("dim", source tensor, axis of it).
Entry = tuple


def _producer(v: Value | None, graph: Graph, op_type: str) -> Node | None:
    p = v.producer if v is not None else None
    if p is None or p.graph is not graph or p.domain != "" or p.op_type != op_type:
        return None
    return p


def _shape_dims(shape_node: Node) -> tuple[Value, list[int]] | None:
    """(source, its axes) that a Shape node lists, start / end (opset 15) applied."""
    src = shape_node.inputs[0]
    start, end = shape_node.attr("start", 0), shape_node.attr("end")
    r = rank(src)
    if r is None:
        if start != 0 or end is not None:
            return None
        return src, []  # axes known only by index: callers normalize with the rank
    return src, list(range(r))[slice(start, end)]


def _gathered(gather: Node, graph: Graph) -> list[Entry] | None:
    shape_node = _producer(gather.inputs[0], graph, "Shape")
    idx = constant_value(gather.inputs[1]) if len(gather.inputs) > 1 else None
    if shape_node is None or idx is None or idx.ndim > 1 or gather.attr("axis", 0) != 0:
        return None
    found = _shape_dims(shape_node)
    if found is None:
        return None
    src, axes = found
    entries = []
    for i in idx.reshape(-1).tolist():
        if axes:
            if not -len(axes) <= i < len(axes):
                return None
            entries.append(("dim", src, axes[i]))
        elif i >= 0:
            entries.append(("dim", src, i))
        else:
            return None
    return entries


def _entries(part: Value, graph: Graph) -> list[Entry] | None:
    """What one input of the Concat contributes to the target shape."""
    c = constant_value(part)
    if c is not None:
        return [("const", int(x)) for x in c.reshape(-1)] if c.ndim == 1 else None
    unsq = _producer(part, graph, "Unsqueeze")
    if unsq is not None:
        axes = unsq.attr("axes")
        if axes is None and len(unsq.inputs) > 1:
            a = constant_value(unsq.inputs[1])
            axes = None if a is None else a.reshape(-1).tolist()
        gather = _producer(unsq.inputs[0], graph, "Gather")
        if axes not in ([0], [-1]) or gather is None:
            return None
        idx = constant_value(gather.inputs[1]) if len(gather.inputs) > 1 else None
        return _gathered(gather, graph) if idx is not None and idx.ndim == 0 else None
    gather = _producer(part, graph, "Gather")
    if gather is not None:
        idx = constant_value(gather.inputs[1]) if len(gather.inputs) > 1 else None
        return _gathered(gather, graph) if idx is not None and idx.ndim == 1 else None
    shape_node = _producer(part, graph, "Shape")
    if shape_node is not None:
        found = _shape_dims(shape_node)
        if found is None or not found[1]:
            return None
        return [("dim", found[0], a) for a in found[1]]
    return None


def _resolve(entries: list[Entry], data: Value, allowzero: bool) -> np.ndarray | None:
    target = []
    for j, entry in enumerate(entries):
        if entry[0] == "const":
            target.append(entry[1])
            continue
        _, src, axis = entry
        known = type_shape(src.type)
        if known is not None and axis < len(known) and isinstance(known[axis], int):
            target.append(known[axis])
        elif src is data and axis == j and not allowzero:
            target.append(0)  # "copy x's dimension j", which is what was gathered
        else:
            return None
    return np.array(target, dtype=np.int64)


@register_pass
class ReshapeFusion(GraphPass):
    name = "ReshapeFusion"
    level = BASIC
    order = 43

    def run(self, model: Model) -> PassResult:
        changes: Counter = Counter()
        for graph in list(all_graphs(model.graph)):
            for node in list(graph.nodes):
                if (node.graph is not graph or node.domain != "" or node.op_type != "Reshape"
                        or len(node.inputs) < 2 or node.inputs[0] is None):
                    continue
                concat = _producer(node.inputs[1], graph, "Concat")
                if concat is None or concat.attr("axis") not in (0, -1):
                    continue
                entries: list[Entry] = []
                for part in concat.inputs:
                    got = _entries(part, graph) if part is not None else None
                    if got is None:
                        break
                    entries.extend(got)
                else:
                    target = _resolve(entries, node.inputs[0], bool(node.attr("allowzero", 0)))
                    if target is not None and np.count_nonzero(target == -1) <= 1:
                        node.set_input(1, make_initializer(graph, f"{node.label}_shape", target))
                        changes["Reshape"] += 1
        return PassResult(bool(changes), changes)
