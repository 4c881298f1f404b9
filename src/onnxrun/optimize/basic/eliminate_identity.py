"""Redundant-node elimination: nodes that return their input unchanged are bypassed.

Identity; Dropout at inference (no mask read, not in training mode); Add/Sub of 0, Mul/Div by 1
(when broadcasting does not change the shape or type); Cast to the type the value already has;
Reshape/Expand/Transpose/Squeeze/Unsqueeze/Flatten that provably change nothing; Pad with all-zero
pads; Slice that takes everything. A node whose output is a graph output stays when its input
cannot take that name (a graph input, another output).
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from ...dtypes import type_shape
from ...ir import Model, Node, Value
from ..base import BASIC, GraphPass, PassResult, register_pass
from ..graph_utils import constant_value, live_nodes, replace_value


def _shape(v: Value | None) -> list | None:
    return type_shape(v.type) if v is not None else None


def _elem(v: Value | None) -> int | None:
    if v is None or v.type is None or not v.type.HasField("tensor_type"):
        return None
    return v.type.tensor_type.elem_type or None


def _same_static_shape(a: Value, b: Value) -> bool:
    sa, sb = _shape(a), _shape(b)
    # Only fully static shapes: inferred symbolic dimensions are not reliably comparable.
    return sa is not None and sb is not None and sa == sb and all(isinstance(d, int) for d in sa)


def _all_equal(v: Value | None, value: float) -> bool:
    c = constant_value(v)
    return c is not None and c.dtype.kind in "biuf" and c.size > 0 and bool(np.all(c == value))


def _neutral_operand(node: Node) -> Value | None:
    """For x op c with c neutral (x+0, x-0, x*1, x/1): x, if the result keeps x's shape/type."""
    a, b = node.inputs[0], node.inputs[1]
    neutral = {"Add": 0.0, "Sub": 0.0, "Mul": 1.0, "Div": 1.0}[node.op_type]
    candidates = [(a, b)] + ([(b, a)] if node.op_type in ("Add", "Mul") else [])
    for x, c in candidates:
        cv = constant_value(c)
        if cv is None or not _all_equal(c, neutral):
            continue
        # The constant must not broadcast x to a larger shape, nor change its type.
        if _elem(x) is None or _elem(x) != _elem(node.outputs[0]):
            continue
        sx = _shape(x)
        if sx is None or cv.ndim > len(sx):
            continue
        return x
    return None


def _passthrough(node: Node) -> Value | None:
    """The input this node returns unchanged, or None."""
    op = node.op_type
    if node.domain != "":
        return None
    x = node.inputs[0] if node.inputs else None
    if x is None:
        return None
    if op == "Identity":
        return x
    if op == "Dropout":
        training = node.inputs[2] if len(node.inputs) > 2 else None
        mask_read = len(node.outputs) > 1 and bool(node.outputs[1].uses)
        if mask_read or (training is not None and not _all_equal(training, 0)):
            return None
        if node.attr("is_test", 1) == 0 and node.attr("ratio", 0.5) > 0 and len(node.inputs) < 2:
            return None  # Dropout-1..6 in training mode
        return x
    if op in ("Add", "Sub", "Mul", "Div") and len(node.inputs) == 2:
        return _neutral_operand(node)
    if op == "Cast":
        return x if _elem(x) is not None and _elem(x) == node.attr("to") else None
    if op in ("Reshape", "Expand", "Squeeze", "Unsqueeze", "Flatten"):
        return x if _same_static_shape(x, node.outputs[0]) else None
    if op == "Transpose":
        perm = node.attr("perm")
        return x if perm is not None and list(perm) == list(range(len(perm))) else None
    if op == "Pad" and len(node.inputs) > 1:
        return x if _all_equal(node.inputs[1], 0) else None
    if op == "Slice":
        return x if _same_static_shape(x, node.outputs[0]) else None
    return None


@register_pass
class RedundantNodeElimination(GraphPass):
    name = "RedundantNodeElimination"
    level = BASIC
    order = 20

    def run(self, model: Model) -> PassResult:
        changes: Counter = Counter()
        for graph, node in live_nodes(model):
            x = _passthrough(node)
            if x is None:
                continue
            if replace_value(node.outputs[0], x):
                graph.remove(node)
                changes[node.op_type] += 1
        return PassResult(bool(changes), changes)
