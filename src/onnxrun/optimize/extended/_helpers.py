"""Helpers shared by the extended-level fusions (not a pass).

Static facts the fusions need and the IR does not give directly: element types, ranks, whether
two values provably share a dimension (symbolic shapes, or following the ops that carry leading
dimensions through), what a Reshape's dynamic target shape is made of, and which nodes die with a
fused subgraph.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...dtypes import ml_dtypes, type_shape
from ...ir import Graph, Model, Node, Value
from ...proto import onnx
from .. import graph_utils
from ..pattern import _attribute

FLOAT = onnx.TensorProto.FLOAT

MS = "com.microsoft"
LOWEST_FLOAT32 = float(np.finfo(np.float32).min)


def const_value(v: Value | None) -> np.ndarray | None:
    """A constant's value: an initializer no caller can override, or a Constant node's output
    (when constant folding has not run)."""
    c = graph_utils.constant_value(v)
    if c is not None or v is None or v.producer is None:
        return c
    n = v.producer
    if n.op_type != "Constant" or n.domain != "":
        return None
    for name in ("value", "value_float", "value_int", "value_floats", "value_ints"):
        value = n.attr(name)
        if value is not None:
            return np.asarray(value)
    return None


def elem_type(v: Value | None) -> int | None:
    if v is None or v.type is None or not v.type.HasField("tensor_type"):
        return None
    return v.type.tensor_type.elem_type or None


def is_float32(*values: Value | None) -> bool:
    return all(elem_type(v) == FLOAT for v in values)


def shape(v: Value | None) -> list | None:
    if v is None:
        return None
    c = const_value(v)
    if c is not None:
        return list(c.shape)
    return type_shape(v.type)


def rank(v: Value | None) -> int | None:
    s = shape(v)
    return None if s is None else len(s)


def last_dim(v: Value | None) -> int | None:
    """The last dimension when statically known."""
    s = shape(v)
    return s[-1] if s and isinstance(s[-1], int) else None


def float_scalar(v: Value | None) -> float | None:
    """A constant one-element float tensor's value."""
    c = const_value(v)
    if c is None or c.size != 1 or c.dtype.kind != "f":
        return None
    return float(c.reshape(()))


def close(value: float | None, expected: float, rtol: float = 1e-4) -> bool:
    """``value`` is ``expected`` within ``rtol``, or is exactly ``expected`` rounded to float16
    or bfloat16: the constant as a half-precision model (or its float32 compute copy) holds it."""
    if value is None:
        return False
    if abs(value - expected) <= rtol * abs(expected):
        return True
    if value == float(np.float16(expected)):
        return True
    return ml_dtypes is not None and value == float(ml_dtypes.bfloat16(expected))


# -- Gelu-family patterns ------------------------------------------------------------------------

HALF_FORMS = ("x_half", "half_x", "inner_half")  # where an exporter puts the 0.5 of 0.5 x (1 + f)


def half_x_times(op: Any, x: Any, one_plus: Any, form: str) -> Any:
    """The pattern of ``0.5 * x * one_plus`` as ``form`` associates it: (x * one_plus) * 0.5,
    (x * 0.5) * one_plus, or x * (one_plus * 0.5)."""
    if form == "x_half":
        return op.Mul(op.Mul(x, one_plus), 0.5)
    if form == "half_x":
        return op.Mul(op.Mul(x, 0.5), one_plus)
    return op.Mul(x, op.Mul(one_plus, 0.5))


def rule_variants(base: type, **choices: tuple[str, ...]) -> tuple[type, ...]:
    """One subclass of the rule ``base`` per combination of its class attributes' values,
    e.g. rule_variants(_GeluRule, outer=HALF_FORMS, scale=("div", "mul"))."""
    combos: list[dict[str, str]] = [{}]
    for attr, values in choices.items():
        combos = [{**c, attr: v} for c in combos for v in values]
    return tuple(type("_".join([base.__name__.strip("_"), *c.values()]), (base,), c)
                 for c in combos)


def same_rank(x: Value | None, out: Value | None) -> bool:
    """``out`` provably has ``x``'s rank: constants matched inside a fused pattern did not
    broadcast the result to a higher rank."""
    rx, ro = rank(x), rank(out)
    return rx is not None and rx == ro


def producer(v: Value | None, op_type: str, domain: str = "") -> Node | None:
    if v is None or v.producer is None:
        return None
    n = v.producer
    return n if n.op_type == op_type and n.domain == domain else None


def opset(model: Model, node: Node) -> int:
    return model.node_opset(node) or 0


def reduce_axes(model: Model, node: Node) -> list[int] | None:
    """A Reduce* node's axes (attribute before opset 18, input since), None if dynamic."""
    if opset(model, node) >= 18 or len(node.inputs) > 1:
        if len(node.inputs) < 2 or node.inputs[1] is None:
            return None  # all axes (or noop_with_empty_axes): not a last-axis reduction
        c = const_value(node.inputs[1])
        return None if c is None else [int(a) for a in c.reshape(-1)]
    axes = node.attr("axes")
    return None if axes is None else [int(a) for a in axes]


def is_last_axis_mean(model: Model, node: Node, x: Value) -> bool:
    """``node`` is ReduceMean(x) over the last axis only, keeping dimensions."""
    if node.attr("keepdims", 1) != 1:
        return False
    axes = reduce_axes(model, node)
    r = rank(x)
    return axes is not None and len(axes) == 1 and (
        axes[0] == -1 or (r is not None and axes[0] == r - 1))


# -- dimensions --------------------------------------------------------------------------------

# Ops whose output keeps every dimension of input 0 (elementwise with a broadcast-free partner
# is handled separately).
_SAME_SHAPE = {
    ("", "Relu"), ("", "Tanh"), ("", "Sigmoid"), ("", "Erf"), ("", "Cast"), ("", "Identity"),
    ("", "Dropout"), ("", "Gelu"), ("", "LeakyRelu"), ("", "Clip"), ("", "Neg"), ("", "Sqrt"),
    ("", "LayerNormalization"), ("", "SimplifiedLayerNormalization"), ("", "RMSNormalization"),
    ("", "Softmax"), ("", "DynamicQuantizeLinear"), ("", "QuantizeLinear"),
    ("", "DequantizeLinear"),
    (MS, "Gelu"), (MS, "FastGelu"), (MS, "BiasGelu"), (MS, "QuickGelu"),
    (MS, "SkipLayerNormalization"), (MS, "SkipSimplifiedLayerNormalization"),
}
_ELEMENTWISE = {"Add", "Sub", "Mul", "Div", "Pow"}
# [..., M, K] @ [K, N] products (plain, integer, quantized on the fly)
_MATMULS = {("", "MatMul"), ("", "MatMulInteger"), (MS, "MatMulIntegerToFloat"),
            (MS, "DynamicQuantizeMatMul")}


def _dim_parent(v: Value, k: int) -> Value | None:
    """A value whose dimension ``k`` (counted from the front) is provably ``v``'s."""
    n = v.producer
    if n is None:
        return None
    x = n.inputs[0] if n.inputs else None
    if x is None:
        return None
    key = (n.domain, n.op_type)
    # the main output (and Skip*LayerNormalization's sum); statistics outputs are smaller
    main = v.output_index == 0 or (v.output_index == 3 and n.op_type.startswith("Skip"))
    if key in _SAME_SHAPE:
        return x if main else None
    if key in ((MS, "Attention"), (MS, "MultiHeadAttention")) and k < 2:
        return x if v.output_index == 0 else None  # [batch, sequence, ...] of the query
    r = rank(v)
    if r is None or k >= r:
        return None
    if key in _MATMULS and k < r - 1:
        w = shape(n.inputs[1])
        if w is not None and len(w) == 2 and rank(x) == r:
            return x  # [..., M, K] @ [K, N]: every dimension but the last is A's
    if key == ("", "Split"):
        axis = n.attr("axis", 0)
        axis = axis + r if axis < 0 else axis
        return x if axis != k else None
    if n.domain == "" and n.op_type in _ELEMENTWISE and len(n.inputs) == 2:
        for a, b in ((n.inputs[0], n.inputs[1]), (n.inputs[1], n.inputs[0])):
            sb = shape(b)
            # The partner spans only trailing axes after k: it cannot change dimension k.
            if rank(a) == r and sb is not None and len(sb) < r - k:
                return a
    return None


def _lineages(a: Value, b: Value, k: int, limit: int = 64) -> tuple[list, list] | None:
    """The values whose dimension ``k`` is provably ``a``'s, and ``b``'s (each list at most
    ``limit`` long, the value first), walked a step of each in turn: None as soon as the two
    meet. A residual stream's lineage runs back to the embedding, and a transformer layer's
    two operands meet a few steps up: walking both to the end made BERT's checks quadratic
    in its layers."""
    lines, seen = ([a], [b]), ({id(a)}, {id(b)})
    walking = [True, True]
    while walking[0] or walking[1]:
        for i in (0, 1):
            line = lines[i]
            if not walking[i]:
                continue
            p = _dim_parent(line[-1], k) if len(line) < limit else None
            if p is None:
                walking[i] = False
            elif id(p) in seen[1 - i]:
                return None
            else:
                line.append(p)
                seen[i].add(id(p))
    return lines


def same_dim(a: Value, b: Value, k: int) -> bool:
    """Dimension ``k`` of ``a`` and ``b`` are provably equal: same value after following
    dimension-preserving producers, or the same static size / shape-inference symbol."""
    if a is b:
        return True
    sa, sb = shape(a), shape(b)
    if sa is not None and sb is not None and k < min(len(sa), len(sb)) and \
            sa[k] is not None and sa[k] == sb[k]:
        return True  # the pair (a, b) of the loop below, without walking the lineages first
    lines = _lineages(a, b, k)
    if lines is None:
        return True
    la, lb = lines
    for x in la:
        sx = shape(x)
        if sx is None or k >= len(sx) or sx[k] is None:
            continue
        for y in lb:
            sy = shape(y)
            if sy is not None and k < len(sy) and sy[k] is not None and sy[k] == sx[k]:
                return True
    return False


def shape_items(v: Value | None) -> list[tuple] | None:
    """What a 1-D int64 shape tensor is made of: ("const", n) and ("dim", value, k) items (the
    latter: dimension k of value, read through Shape), or None when not understood."""
    if v is None:
        return None
    c = const_value(v)
    if c is not None:
        return [("const", int(x)) for x in c.reshape(-1)] if c.dtype.kind in "iu" else None
    n = v.producer
    if n is None or n.domain != "":
        return None
    if n.op_type == "Concat":
        items: list[tuple] = []
        for x in n.inputs:
            part = shape_items(x)
            if part is None:
                return None
            items += part
        return items
    if n.op_type == "Unsqueeze":
        inner = _shape_element(n.inputs[0])
        return None if inner is None else [inner]
    if n.op_type == "Shape" and n.inputs and n.inputs[0] is not None:
        # the whole shape, or a range of it (Shape's start / end slice as Python's do), of a
        # value of known rank: a dim item each
        dims = shape(n.inputs[0])
        if dims is not None:
            kept = range(len(dims))[slice(n.attr("start", 0), n.attr("end", None))]
            return [("dim", n.inputs[0], k) for k in kept]
    if n.op_type in ("Shape", "Slice", "Gather"):  # one element (Gather with a [k] index)
        item = _shape_element(v)
        return None if item is None else [item]
    return None


def _shape_element(v: Value | None) -> tuple | None:
    """One element of a shape: a constant, Gather(Shape(x), k), Slice(Shape(x), k, k+1) or
    Shape(x, start=k, end=k+1)."""
    if v is None:
        return None
    s = float_or_int_scalar(v)
    if s is not None:
        return ("const", int(s))
    n = v.producer
    if n is None or n.domain != "":
        return None
    if n.op_type == "Gather" and n.attr("axis", 0) == 0:
        src, idx = n.inputs[0], float_or_int_scalar(n.inputs[1])
        sh = producer(src, "Shape")
        if sh is None or idx is None:
            return None
        return _shape_of(sh, int(idx))
    if n.op_type == "Slice" and len(n.inputs) >= 3:
        sh = producer(n.inputs[0], "Shape")
        start, end = float_or_int_scalar(n.inputs[1]), float_or_int_scalar(n.inputs[2])
        if sh is None or start is None or end is None or start < 0 or end != start + 1:
            return None  # (a negative start would need an end past the last element)
        if len(n.inputs) > 3 and n.inputs[3] is not None:
            if float_or_int_scalar(n.inputs[3]) not in (0,):
                return None
        if len(n.inputs) > 4 and n.inputs[4] is not None:
            if float_or_int_scalar(n.inputs[4]) != 1:
                return None
        return _shape_of(sh, int(start))
    if n.op_type == "Shape":
        start, end = n.attr("start", 0), n.attr("end", None)
        if end is None or end != start + 1 or start < 0:
            return None
        return ("dim", n.inputs[0], start)
    return None


def _shape_of(shape_node: Node, k: int) -> tuple | None:
    """Element k of Shape(x) (with Shape-15's start/end honoured)."""
    x = shape_node.inputs[0]
    start, end = shape_node.attr("start", 0), shape_node.attr("end", None)
    if start != 0 or end is not None:
        return None
    if k < 0:
        r = rank(x)
        if r is None:
            return None
        k += r
    return ("dim", x, k)


def float_or_int_scalar(v: Value | None) -> float | int | None:
    c = const_value(v)
    if c is None or c.size != 1 or c.dtype.kind not in "iuf":
        return None
    return c.reshape(()).item()


def dim_matches(item: tuple, k: int, refs: list[Value], allow_copy: bool) -> bool:
    """A shape item provably equals dimension ``k`` of the values ``refs`` (which share it):
    Shape of a value with the same dimension, the same static size, or a Reshape 0 (copy)."""
    if item[0] == "const":
        if item[1] == 0 and allow_copy:
            return True
        return any(shape(r) is not None and k < len(shape(r)) and shape(r)[k] == item[1]
                   for r in refs)
    _, src, idx = item
    return idx == k and any(same_dim(src, r, k) for r in refs)


# -- rewriting ---------------------------------------------------------------------------------


def dying_nodes(core: list[Node], keep: list[Value | None]) -> set[Node] | None:
    """The nodes that are dead once ``core`` is gone: ``core`` plus the producers whose every
    output is read only by dead nodes (e.g. the Shape/Gather/Concat chains that computed the
    core's Reshape targets). None when a value produced inside ``core``, other than its last
    node's outputs, is still needed elsewhere. Nothing producing a ``keep`` value dies."""
    graph = core[-1].graph
    dead: set[Node] = set(core)
    kept = {id(v) for v in keep if v is not None}
    changed = True
    while changed:
        changed = False
        for node in list(dead):
            for v in node.inputs:
                p = v.producer if v is not None else None
                if p is None or p in dead or p.graph is not graph:
                    continue
                if all(id(o) not in kept and not graph_utils.is_graph_output(o)
                       and all(u in dead for u, _ in o.uses) for o in p.outputs):
                    dead.add(p)
                    changed = True
    for node in core[:-1]:
        for o in node.outputs:
            if graph_utils.is_graph_output(o) or id(o) in kept:
                return None
            if any(u not in dead for u, _ in o.uses):
                return None
    return dead


def make_node(graph: Graph, model: Model, op_type: str, inputs: list[Value | None],
              num_outputs: int = 1, *, domain: str = "", name: str = "",
              **attrs: Any) -> Node:
    """A new node (not yet in the graph) with fresh output values."""
    if domain:
        graph_utils.ensure_opset(model, domain, 1)
    base = name or op_type
    outs = [Value(graph_utils.unique_name(graph, f"{base}_out{i}"), graph=graph)
            for i in range(num_outputs)]
    return Node(op_type, list(inputs), outs,
                {k: _attribute(k, v) for k, v in attrs.items() if v is not None},
                domain=domain, name=graph_utils.unique_name(graph, base))


def take_over(node: Node, index: int, old: Value) -> None:
    """Make ``node``'s output ``index`` be the existing value ``old`` (name, type and readers
    stay) instead of the fresh one it was created with."""
    node.outputs[index] = old
    old.producer, old.output_index = node, index


def available_before(v: Value, node: Node) -> bool:
    """``v`` exists before ``node`` runs: a graph input, initializer or outer-scope value, or
    the output of an earlier node of the same graph."""
    p = v.producer
    if p is None or p.graph is not node.graph:
        return True
    nodes = node.graph.nodes
    return nodes.index(p) < nodes.index(node)


def insert_before(graph: Graph, anchor: Node, nodes: list[Node]) -> None:
    position = graph.nodes.index(anchor)
    for i, n in enumerate(nodes):
        n.graph = graph
        graph.nodes.insert(position + i, n)


def remove_nodes(graph: Graph, nodes: set[Node]) -> None:
    for node in sorted(nodes, key=graph.nodes.index, reverse=True):
        graph.remove(node)


def unnamed_output(graph: Graph) -> Value:
    """An omitted optional output."""
    return Value("", graph=graph)
