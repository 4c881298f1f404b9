"""Gradient (ai.onnx.preview.training): reverse-mode differentiation of the enclosing graph.

A kernel only sees its own inputs, so the differentiated program is prepared at session
creation: the nodes of the enclosing graph that ``y`` depends on (stopping at the tensors named
in ``xs`` and ``zs``, which are the Gradient's inputs, and at constant initializers) are bound
to the provider's own kernels, and those on a path from an ``x`` to ``y`` get a derivative rule
below. Each run recomputes that forward program from the Gradient's inputs (the spec lets them
differ from the graph's tensors of the same names), seeds dy/dy with ones and accumulates the
gradients backwards; numpy broadcasting is undone by summing over the broadcast axes.

Anything else ``y`` depends on (a graph input not in xs/zs, an outer-scope value), a node with
subgraphs, or an operator without a rule on the differentiated path is refused at session
creation. The session runs a model holding a Gradient without graph rewrites (see optimize).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ....ir import Graph, Node, Value
from ..kernels import KernelContext, op

_DOMAIN = "ai.onnx.preview.training"

# rule(ins, out, g, want) -> one gradient (or None) per input; ``out`` is output 0's value,
# ``g`` dy/d(output 0) and ``want`` says which inputs' gradients are read.
Rule = Callable[[list[Any], np.ndarray, np.ndarray, Sequence[bool]], list[Any]]

# -- helpers ----------------------------------------------------------------------------------


def _unbroadcast(g: np.ndarray, shape: Sequence[int]) -> np.ndarray:
    """Sum ``g`` (the gradient of a broadcast result) back down to an operand's shape."""
    shape = tuple(shape)
    if g.shape == shape:
        return g
    lead = g.ndim - len(shape)
    if lead > 0:
        g = g.sum(axis=tuple(range(lead)))
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and g.shape[i] != 1)
    if axes:
        g = g.sum(axis=axes, keepdims=True)
    return np.broadcast_to(g, shape) if g.shape != shape else g


def _legacy_shape(a: np.ndarray, b: np.ndarray, attrs: dict[str, Any]) -> tuple[int, ...]:
    """The shape B broadcasts as in opset < 7 binary ops (``broadcast=1`` aligned at ``axis``)."""
    axis = attrs.get("axis")
    if attrs.get("broadcast") and axis is not None and b.ndim:
        axis = axis if axis >= 0 else axis + a.ndim
        tail = a.ndim - axis - b.ndim
        if tail > 0:
            return b.shape + (1,) * tail
    return b.shape


def _zero(g: np.ndarray) -> Any:
    return g.dtype.type(0)


# -- derivative rules -------------------------------------------------------------------------
# Each factory takes the node's attributes and the opset it resolves at, and returns a Rule.


def _binary(kind: str) -> Callable[[dict[str, Any], int], Rule]:
    def make(attrs: dict[str, Any], opset: int) -> Rule:
        def rule(ins, out, g, want):
            a, b = ins
            bs = _legacy_shape(a, b, attrs) if opset < 7 else b.shape
            bb = b.reshape(bs)
            if kind == "Add":
                ga, gb = g, g
            elif kind == "Sub":
                ga, gb = g, (-g if want[1] else None)
            elif kind == "Mul":
                ga = g * bb if want[0] else None
                gb = g * a if want[1] else None
            else:  # Div: d(a/b)/db = -a/b^2 = -out/b
                ga = g / bb if want[0] else None
                gb = -g * out / bb if want[1] else None
            return [None if ga is None else _unbroadcast(ga, a.shape),
                    None if gb is None else _unbroadcast(gb, bs).reshape(b.shape)]

        return rule

    return make


def _unary(fn: Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]
           ) -> Callable[[dict[str, Any], int], Rule]:
    """An elementwise op of one input: ``fn(x, out, g)`` is dy/dx."""

    def make(attrs: dict[str, Any], opset: int) -> Rule:
        return lambda ins, out, g, want: [fn(ins[0], out, g)]

    return make


def _reshaped(attrs: dict[str, Any], opset: int) -> Rule:
    """Reshape, Flatten, Squeeze, Unsqueeze: the data is unchanged, only its shape."""
    return lambda ins, out, g, want: [g.reshape(ins[0].shape)]


def _leaky_relu(attrs: dict[str, Any], opset: int) -> Rule:
    alpha = float(attrs.get("alpha", 0.01))
    return lambda ins, out, g, want: [np.where(ins[0] > 0, g, g * alpha)]


def _pow(attrs: dict[str, Any], opset: int) -> Rule:
    def rule(ins, out, g, want):
        a, b = ins
        ga = gb = None
        if want[0]:
            ga = _unbroadcast(g * b * np.power(a, b - 1), a.shape)
        if want[1]:
            with np.errstate(divide="ignore", invalid="ignore"):
                gb = _unbroadcast(g * out * np.log(a), b.shape)
        return [ga, gb]

    return rule


def _matmul(attrs: dict[str, Any], opset: int) -> Rule:
    def rule(ins, out, g, want):
        a, b = ins
        # 1-D operands are promoted to matrices (and the promoted axis is missing from g)
        a2 = a[None, :] if a.ndim == 1 else a
        b2 = b[:, None] if b.ndim == 1 else b
        if a.ndim == 1:
            g = np.expand_dims(g, -2)
        if b.ndim == 1:
            g = np.expand_dims(g, -1)
        ga = gb = None
        if want[0]:
            ga = _unbroadcast(g @ np.swapaxes(b2, -1, -2), a2.shape).reshape(a.shape)
        if want[1]:
            gb = _unbroadcast(np.swapaxes(a2, -1, -2) @ g, b2.shape).reshape(b.shape)
        return [ga, gb]

    return rule


def _gemm(attrs: dict[str, Any], opset: int) -> Rule:
    alpha = float(attrs.get("alpha", 1.0))
    beta = float(attrs.get("beta", 1.0))
    trans_a, trans_b = int(attrs.get("transA", 0)), int(attrs.get("transB", 0))

    def rule(ins, out, g, want):
        a, b = ins[0], ins[1]
        c = ins[2] if len(ins) > 2 else None
        a_ = a.T if trans_a else a
        b_ = b.T if trans_b else b
        ga = gb = gc = None
        if want[0]:
            ga = (g @ b_.T) * alpha  # dA' where A' = op(A)
            ga = ga.T if trans_a else ga
        if want[1]:
            gb = (a_.T @ g) * alpha
            gb = gb.T if trans_b else gb
        if len(want) > 2 and want[2] and c is not None:
            gc = _unbroadcast(g * beta, c.shape)
        return [ga, gb, gc]

    return rule


def _transpose(attrs: dict[str, Any], opset: int) -> Rule:
    perm = attrs.get("perm")

    def rule(ins, out, g, want):
        p = list(range(g.ndim))[::-1] if perm is None else list(perm)
        return [g.transpose(np.argsort(p))]

    return rule


def _expand(attrs: dict[str, Any], opset: int) -> Rule:
    return lambda ins, out, g, want: [_unbroadcast(g, ins[0].shape), None]


def _reduce(mean: bool, axes_input_since: int) -> Callable[[dict[str, Any], int], Rule]:
    def make(attrs: dict[str, Any], opset: int) -> Rule:
        keep = int(attrs.get("keepdims", 1))
        noop = int(attrs.get("noop_with_empty_axes", 0))
        attr_axes = attrs.get("axes")
        from_input = opset >= axes_input_since

        def rule(ins, out, g, want):
            x = ins[0]
            axes = attr_axes
            if from_input:
                axes = ins[1] if len(ins) > 1 and ins[1] is not None else None
            if axes is None or len(axes) == 0:
                if noop and from_input:
                    return [g, None]
                axes = range(x.ndim)
            axes = sorted({int(a) % x.ndim for a in axes}) if x.ndim else []
            if not keep:
                g = np.expand_dims(g, tuple(axes)) if axes else g
            gx = np.broadcast_to(g, x.shape)
            if mean:
                gx = gx / max(1, int(np.prod([x.shape[a] for a in axes])))
            return [gx, None]

        return rule

    return make


def _softmax(log: bool) -> Callable[[dict[str, Any], int], Rule]:
    def make(attrs: dict[str, Any], opset: int) -> Rule:
        coerce = opset < 13  # before 13 the input is seen as 2-D [prod(:axis), prod(axis:)]
        axis = int(attrs.get("axis", 1 if coerce else -1))

        def rule(ins, out, g, want):
            shape = out.shape
            o, gg, ax = out, g, axis
            if coerce and out.ndim:
                k = axis % out.ndim
                rows = int(np.prod(shape[:k]))
                o, gg, ax = out.reshape(rows, -1), g.reshape(rows, -1), 1
            if log:  # y = x - logsumexp(x): dx = g - softmax(x) * sum(g)
                gx = gg - np.exp(o) * gg.sum(axis=ax, keepdims=True)
            else:  # dx = y * (g - sum(g * y))
                gx = o * (gg - (gg * o).sum(axis=ax, keepdims=True))
            return [gx.reshape(shape)]

        return rule

    return make


def _concat(attrs: dict[str, Any], opset: int) -> Rule:
    axis = int(attrs["axis"]) if "axis" in attrs else 1  # Concat-1 defaults to 1

    def rule(ins, out, g, want):
        ax = axis % g.ndim
        cuts = np.cumsum([x.shape[ax] for x in ins])[:-1]
        return list(np.split(g, cuts, axis=ax))

    return rule


def _sum(mean: bool) -> Callable[[dict[str, Any], int], Rule]:
    def make(attrs: dict[str, Any], opset: int) -> Rule:
        def rule(ins, out, g, want):
            gi = g / len(ins) if mean else g
            return [_unbroadcast(gi, x.shape) if w else None
                    for x, w in zip(ins, want, strict=True)]

        return rule

    return make


def _where(attrs: dict[str, Any], opset: int) -> Rule:
    def rule(ins, out, g, want):
        c, x, y = ins
        z = _zero(g)
        gx = _unbroadcast(np.where(c, g, z), x.shape) if want[1] else None
        gy = _unbroadcast(np.where(c, z, g), y.shape) if want[2] else None
        return [None, gx, gy]

    return rule


def _clip(attrs: dict[str, Any], opset: int) -> Rule:
    def rule(ins, out, g, want):
        x = ins[0]
        lo = attrs.get("min") if opset < 11 else (ins[1] if len(ins) > 1 else None)
        hi = attrs.get("max") if opset < 11 else (ins[2] if len(ins) > 2 else None)
        inside = np.ones(x.shape, dtype=bool)
        if lo is not None:
            inside &= x >= lo
        if hi is not None:
            inside &= x <= hi
        return [np.where(inside, g, _zero(g)), None, None]

    return rule


def _cast(attrs: dict[str, Any], opset: int) -> Rule:
    def rule(ins, out, g, want):
        floating = np.issubdtype(out.dtype, np.inexact) or out.dtype.kind == "V"
        return [g.astype(ins[0].dtype) if floating else None]

    return rule


def _sqrt(x, out, g):
    return g * 0.5 / out


# op_type -> (differentiable input positions, or None for all; rule factory)
_RULES: dict[str, tuple[tuple[int, ...] | None, Callable[[dict[str, Any], int], Rule]]] = {
    "Add": ((0, 1), _binary("Add")),
    "Sub": ((0, 1), _binary("Sub")),
    "Mul": ((0, 1), _binary("Mul")),
    "Div": ((0, 1), _binary("Div")),
    "Pow": ((0, 1), _pow),
    "MatMul": ((0, 1), _matmul),
    "Gemm": ((0, 1, 2), _gemm),
    "Neg": ((0,), _unary(lambda x, out, g: -g)),
    "Identity": ((0,), _unary(lambda x, out, g: g)),
    "Abs": ((0,), _unary(lambda x, out, g: g * np.sign(x))),
    "Reciprocal": ((0,), _unary(lambda x, out, g: -g * out * out)),
    "Relu": ((0,), _unary(lambda x, out, g: np.where(x > 0, g, _zero(g)))),
    "LeakyRelu": ((0,), _leaky_relu),
    "Sigmoid": ((0,), _unary(lambda x, out, g: g * out * (1 - out))),
    "Tanh": ((0,), _unary(lambda x, out, g: g * (1 - out * out))),
    "Exp": ((0,), _unary(lambda x, out, g: g * out)),
    "Log": ((0,), _unary(lambda x, out, g: g / x)),
    "Sqrt": ((0,), _unary(_sqrt)),
    "Reshape": ((0,), _reshaped),
    "Flatten": ((0,), _reshaped),
    "Squeeze": ((0,), _reshaped),
    "Unsqueeze": ((0,), _reshaped),
    "Expand": ((0,), _expand),
    "Transpose": ((0,), _transpose),
    "ReduceSum": ((0,), _reduce(False, 13)),
    "ReduceMean": ((0,), _reduce(True, 18)),
    "Softmax": ((0,), _softmax(False)),
    "LogSoftmax": ((0,), _softmax(True)),
    "Concat": (None, _concat),
    "Sum": (None, _sum(False)),
    "Mean": (None, _sum(True)),
    "Where": ((1, 2), _where),
    "Clip": ((0,), _clip),
    "Cast": ((0,), _cast),
}

# Operators whose outputs carry no gradient (integer / boolean results, or piecewise constant).
_NO_GRADIENT = frozenset({
    "Shape", "Size", "Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "Not", "And",
    "Or", "Xor", "ArgMax", "ArgMin", "NonZero", "IsNaN", "IsInf", "Sign", "Floor", "Ceil",
    "Round", "Constant", "ConstantOfShape", "EyeLike", "RandomNormalLike", "RandomUniformLike",
    "Bernoulli", "Range",
})


def _diff_positions(node: Node) -> Sequence[int]:
    if node.domain == "" and node.op_type in _NO_GRADIENT:
        return ()
    rule = _RULES.get(node.op_type) if node.domain == "" else None
    if rule is None or rule[0] is None:
        return range(len(node.inputs))  # unknown ops: every input (refused if on the path)
    return rule[0]


# -- the kernel -------------------------------------------------------------------------------


def _names(graph: Graph) -> dict[str, Value]:
    table: dict[str, Value] = {}
    for v in graph.inputs:
        table[v.name] = v
    for name, v in graph.initializers.items():
        table.setdefault(name, v)
    for n in graph.nodes:
        for v in n.outputs:
            if v.name:
                table[v.name] = v
    return table


@op("Gradient", 1, domain=_DOMAIN)
class Gradient:
    def __init__(self, ctx: KernelContext, *, xs, y, zs=None) -> None:
        node, graph = ctx.node, ctx.node.graph
        xs, zs = [str(x) for x in xs], [str(z) for z in (zs or ())]
        if graph is None:
            raise ValueError("Gradient: the node is not part of a graph")
        if len(node.inputs) != len(xs) + len(zs):
            raise ValueError(f"Gradient: expected {len(xs) + len(zs)} inputs (xs then zs), "
                             f"got {len(node.inputs)}")
        if len(set(xs + zs)) != len(xs) + len(zs):
            raise ValueError("Gradient: a tensor is named twice in xs/zs")
        table = _names(graph)
        for name in [*xs, *zs, y]:
            if name not in table:
                raise ValueError(f"Gradient: no tensor named '{name}' in graph '{graph.name}'")
        leaf_index = {name: i for i, name in enumerate(xs + zs)}
        graph_inputs = {id(v) for v in graph.inputs}

        # Forward program: the nodes y depends on, in dependency (post-)order.
        template: list[Any] = []
        slot_of: dict[int, int] = {}
        leaf_slots = [-1] * len(leaf_index)

        def slot(v: Value) -> int:
            s = slot_of.get(id(v))
            if s is None:
                s = slot_of[id(v)] = len(template)
                template.append(None)
            return s

        order: list[Node] = []
        seen: set[int] = set()
        constants: set[int] = set()

        def classify(v: Value) -> Node | None:
            """Register a value; return its producer when that must be recomputed."""
            if id(v) in slot_of:
                return None
            if v.name in leaf_index:
                leaf_slots[leaf_index[v.name]] = slot(v)
                return None
            if v.is_initializer and id(v) not in graph_inputs:
                template[slot(v)] = v.const_value
                constants.add(id(v))
                return None
            if v.producer is not None and v.producer.graph is graph:
                return v.producer
            raise NotImplementedError(
                f"Gradient: '{v.name}' is needed to compute '{y}' but is neither named in xs/zs "
                "nor a constant initializer (list it in zs)")

        y_value = table[y]
        root = classify(y_value)
        stack: list[tuple[Node, bool]] = [] if root is None else [(root, False)]
        while stack:
            n, finished = stack.pop()
            if finished:
                order.append(n)
                continue
            if id(n) in seen:
                continue
            seen.add(id(n))
            if n.subgraphs():
                raise NotImplementedError(
                    f"Gradient: node '{n.label}' ({n.op_type}) has subgraphs; control flow "
                    "between xs and y is not supported")
            stack.append((n, True))
            for v in n.inputs:
                if v is not None:
                    p = classify(v)
                    if p is not None and id(p) not in seen:
                        stack.append((p, False))
        for v in (table[name] for name in leaf_index):
            if id(v) not in slot_of:  # named but not reached from y: its gradient is zero
                leaf_slots[leaf_index[v.name]] = slot(v)

        model = ctx.extra.get("model")
        steps = []  # (kernel, input slots, output slots, node, opset, attributes)
        for n in order:
            opset = n.opset_version or (model.node_opset(n) if model is not None else None)
            if opset is None:
                raise ValueError(f"Gradient: unknown opset for node '{n.label}'")
            kctx = KernelContext(
                node=n, opset=opset,
                constants=[v.const_value if v is not None and id(v) in constants else None
                           for v in n.inputs],
                outputs_used=[bool(v.name) for v in n.outputs],
                provider=ctx.provider, session_options=ctx.session_options, extra=ctx.extra)
            attrs = {name: a.value for name, a in n.attributes.items()}
            kernel = ctx.provider.create_kernel(n, opset, kctx, attrs)
            ins = tuple(-1 if v is None else slot_of[id(v)] for v in n.inputs)
            outs = tuple(slot(v) for v in n.outputs)
            steps.append((kernel, ins, outs, n, opset, attrs))

        # Which values depend on an x (through differentiable inputs), and which y depends on.
        active = {slot_of[id(table[x])] for x in xs}
        for _, ins, outs, n, _, _ in steps:
            if any(ins[p] in active for p in _diff_positions(n) if p < len(ins)):
                active.update(outs)
        wanted = {slot_of[id(y_value)]}
        backward = []
        for _, ins, outs, n, opset, attrs in reversed(steps):
            if not any(s in wanted and s in active for s in outs):
                continue
            positions = [p for p in _diff_positions(n) if p < len(ins) and ins[p] in active]
            wanted.update(ins[p] for p in positions)
            rule = _RULES.get(n.op_type) if n.domain == "" else None
            if rule is None:
                raise NotImplementedError(
                    f"Gradient: no derivative rule for {n.op_type} (node '{n.label}') on the "
                    f"path from xs to '{y}'")
            want = tuple(p in positions for p in range(len(ins)))
            backward.append((rule[1](attrs, opset), ins, outs[0], want))

        self._template = template
        self._leaf_slots = leaf_slots
        self._x_slots = leaf_slots[:len(xs)]
        self._y_slot = slot_of[id(y_value)]
        self._backward = backward
        self._forward = [(k, ins, outs) for k, ins, outs, *_ in steps]
        self._num_outputs = ctx.num_outputs

    def __call__(self, *inputs):
        vals = self._template.copy()
        for s, v in zip(self._leaf_slots, inputs, strict=False):
            vals[s] = v
        for kernel, ins, outs in self._forward:
            result = kernel(*[None if i < 0 else vals[i] for i in ins])
            if type(result) is tuple:
                for s, r in zip(outs, result, strict=False):
                    vals[s] = r
            else:
                vals[outs[0]] = result
        y = np.asarray(vals[self._y_slot])
        grads: dict[int, np.ndarray] = {self._y_slot: np.ones_like(y)}
        for rule, ins, out, want in self._backward:
            g = grads.get(out)
            if g is None:
                continue
            args = [None if i < 0 else vals[i] for i in ins]
            results = rule(args, vals[out], g, want)
            for p, (i, w) in enumerate(zip(ins, want, strict=True)):
                gi = results[p] if p < len(results) else None
                x = args[p]
                if not w or gi is None or not _differentiable(x):
                    continue
                gi = np.asarray(gi).astype(x.dtype, copy=False)  # numpy scalars too
                prev = grads.get(i)
                grads[i] = gi if prev is None else prev + gi
        outputs = []
        for s, x in zip(self._x_slots, inputs, strict=False):
            g = grads.get(s)
            x = np.asarray(x)
            if g is None:
                g = np.zeros_like(x)
            elif g.shape != x.shape or not g.flags.writeable or not isinstance(g, np.ndarray):
                g = np.array(np.broadcast_to(g, x.shape), dtype=x.dtype)
            outputs.append(g)
        outputs += [None] * (self._num_outputs - len(outputs))
        return outputs[0] if self._num_outputs == 1 else tuple(outputs[:self._num_outputs])


def _differentiable(x: Any) -> bool:
    """Floating point values (ml_dtypes' bfloat16 / float8 have numpy kind 'V')."""
    dtype = getattr(x, "dtype", None)
    return dtype is not None and (np.issubdtype(dtype, np.inexact) or dtype.kind == "V")
