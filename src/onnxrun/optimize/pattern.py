"""Rewrite rules written as the subgraph they match (in the style of onnxscript's rewriter).

    class MatMulAddToGemm(RewriteRule):
        def pattern(self, op, a, b, c):
            return op.Add(op.MatMul(a, b, _name="mm"), c)

        def check(self, ctx, a, b, c, mm, **_):
            return is_constant(b) and rank(a) == 2 ...      # why a match is refused

        def rewrite(self, op, a, b, c, **_):
            return op.Gemm(a, b, c)

``pattern`` receives one variable per parameter after ``op``; calling ``op.<OpType>(...)``
builds a pattern node (``_domain=`` selects a domain, ``_name=`` binds the matched Node under
that name, ``_outputs=n`` matches a multi-output node and returns its outputs). A pattern
variable matches any value; the same variable used twice must match the same value. Add and Mul
match in both input orders, and ``check`` sees every match until one passes. Every value
produced inside the match, except the root's outputs, must be read only inside the match (and
not be a graph output), so the matched nodes can go.

``rewrite`` receives the same bindings and a builder: ``op.<OpType>(*inputs, **attributes)``
creates a node (``_domain=``, ``_outputs=n``) and returns its output(s); ``op.initializer(arr)``
adds a constant. Whatever ``rewrite`` returns replaces the root's outputs, keeping their names.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..ir import Attribute, Graph, Model, Node, Value
from ..proto import onnx
from . import graph_utils

COMMUTATIVE = {("", "Add"), ("", "Mul")}


@dataclass(eq=False)
class PatternVar:
    name: str


@dataclass(eq=False)
class PatternNode:
    op_type: str
    domain: str
    inputs: list[Any]
    bind_as: str | None = None
    num_outputs: int = 1
    outputs: list[PatternOutput] = field(default_factory=list)


@dataclass(eq=False)
class PatternOutput:
    node: PatternNode
    index: int


class _PatternBuilder:
    def __getattr__(self, op_type: str) -> Callable[..., Any]:
        def build(*inputs: Any, _domain: str = "", _name: str | None = None, _outputs: int = 1):
            node = PatternNode(op_type, _domain, list(inputs), _name, _outputs)
            node.outputs = [PatternOutput(node, i) for i in range(_outputs)]
            return node.outputs[0] if _outputs == 1 else tuple(node.outputs)

        return build


@dataclass
class Match:
    root: Node
    bindings: dict[str, Any]
    nodes: list[Node]


class RewriteRule:
    """Subclasses define ``pattern``, optionally ``check``, and ``rewrite``."""

    name = ""

    def __init__(self) -> None:
        params = _pattern_params(self.pattern)
        self._vars = [PatternVar(p) for p in params]
        out = self.pattern(_PatternBuilder(), *self._vars)
        self._root_output = out[0] if isinstance(out, tuple) else out
        if not isinstance(self._root_output, PatternOutput):
            raise TypeError(f"{type(self).__name__}.pattern must return an op output")
        self._root = self._root_output.node
        if not self.name:
            self.name = type(self).__name__

    def pattern(self, op: Any, *args: Any) -> Any:
        raise NotImplementedError

    def check(self, context: RewriteContext, **bindings: Any) -> bool:
        return True

    def rewrite(self, op: Any, **bindings: Any) -> Any:
        raise NotImplementedError

    # -- matching ------------------------------------------------------------------------------
    def matches(self, node: Node) -> Iterator[Match]:
        """Every way the pattern matches at ``node`` (Add and Mul in both input orders), so
        that a ``check`` refusing one binding does not hide another."""
        root = self._root
        if node.op_type != root.op_type or node.domain != root.domain:
            return
        for bindings, nodes in _match_node(root, node, {}, []):
            inside = {id(n) for n in nodes}
            if all(not (graph_utils.is_graph_output(v) or
                        any(id(u) not in inside for u, _ in v.uses))
                   for n in nodes if n is not node for v in n.outputs):
                yield Match(node, bindings, nodes)

    def match(self, node: Node) -> Match | None:
        """The first match at ``node``, or None."""
        return next(self.matches(node), None)


def _pattern_params(pattern: Callable[..., Any]) -> list[str]:
    """The names of ``pattern``'s variables (its parameters after ``op``). Read from the code
    object: inspect.signature, for every rule of every pass, was a good part of the first
    session's creation time."""
    code = getattr(getattr(pattern, "__func__", None), "__code__", None)
    if code is None or code.co_flags & (inspect.CO_VARARGS | inspect.CO_VARKEYWORDS) or (
        code.co_kwonlyargcount
    ):
        return list(inspect.signature(pattern).parameters)[1:]
    return list(code.co_varnames[2:code.co_argcount])  # after self and op


State = tuple[dict[str, Any], list[Node]]  # bindings so far, nodes matched so far


def _match_node(p: PatternNode, node: Node, bindings: dict[str, Any], nodes: list[Node]
                ) -> Iterator[State]:
    """The states in which ``node`` matches ``p`` (each a copy: backtracking never undoes)."""
    if node.op_type != p.op_type or node.domain != p.domain or len(node.outputs) < p.num_outputs:
        return
    if p.bind_as is not None:
        if p.bind_as in bindings and bindings[p.bind_as] is not node:
            return
        bindings = {**bindings, p.bind_as: node}
    if any(n is node for n in nodes):
        yield bindings, nodes  # reached again through another input: matched already
        return
    orders = [p.inputs]
    if (p.domain, p.op_type) in COMMUTATIVE and len(p.inputs) == 2:
        orders.append(p.inputs[::-1])
    for order in orders:
        if len(order) <= len(node.inputs):
            yield from _match_inputs(list(zip(order, node.inputs, strict=False)), 0, bindings,
                                     [*nodes, node])


def _match_inputs(pairs: list[tuple[Any, Value | None]], k: int, bindings: dict[str, Any],
                  nodes: list[Node]) -> Iterator[State]:
    if k == len(pairs):
        yield bindings, nodes
        return
    for b, n in _match_value(*pairs[k], bindings, nodes):
        yield from _match_inputs(pairs, k + 1, b, n)


def _match_value(p: Any, v: Value | None, bindings: dict[str, Any], nodes: list[Node]
                 ) -> Iterator[State]:
    if isinstance(p, PatternVar):
        if p.name not in bindings:
            yield {**bindings, p.name: v}, nodes
        elif bindings[p.name] is v:
            yield bindings, nodes
    elif p is None:
        if v is None:
            yield bindings, nodes
    elif isinstance(p, PatternOutput):
        if v is not None and v.producer is not None and v.output_index == p.index:
            yield from _match_node(p.node, v.producer, bindings, nodes)
    elif isinstance(p, int | float):  # a literal: a constant holding that one value
        value = graph_utils.scalar_value(v)
        if value is not None and float(value) == float(p):
            yield bindings, nodes
    else:
        raise TypeError(f"unsupported pattern element {p!r}")


# ---------------------------------------------------------------------------------------------


class RewriteContext:
    """What ``check`` may consult: the model and the root node being rewritten."""

    def __init__(self, model: Model, graph: Graph, root: Node) -> None:
        self.model = model
        self.graph = graph
        self.root = root


class _RewriteBuilder:
    def __init__(self, model: Model, graph: Graph, root: Node) -> None:
        self.model = model
        self.graph = graph
        self.root = root
        self.created: list[Node] = []

    def initializer(self, array: np.ndarray, name: str = "const") -> Value:
        return graph_utils.make_initializer(self.graph, f"{self.root.label}_{name}", array)

    def __getattr__(self, op_type: str) -> Callable[..., Any]:
        def build(*inputs: Value | None, _domain: str = "", _outputs: int = 1,
                  _name: str | None = None, **attrs: Any) -> Any:
            if _domain:
                graph_utils.ensure_opset(self.model, _domain, 1)
            name = _name or f"{self.root.label}_{op_type}"
            outs = [Value(graph_utils.unique_name(self.graph, f"{name}_out{i}"), graph=self.graph)
                    for i in range(_outputs)]
            node = Node(op_type, list(inputs), outs,
                        {k: _attribute(k, v) for k, v in attrs.items() if v is not None},
                        domain=_domain, name=graph_utils.unique_name(self.graph, name))
            self.created.append(node)
            return outs[0] if _outputs == 1 else tuple(outs)

        return build


def _attribute(name: str, value: Any) -> Attribute:
    if isinstance(value, Attribute):
        return Attribute(name, value.type, value.value, value.ref_attr_name)
    A = onnx.AttributeProto
    if isinstance(value, bool | int | np.integer):
        return Attribute(name, A.INT, int(value))
    if isinstance(value, float | np.floating):
        return Attribute(name, A.FLOAT, float(value))
    if isinstance(value, str):
        return Attribute(name, A.STRING, value)
    if isinstance(value, np.ndarray):
        return Attribute(name, A.TENSOR, value)
    if isinstance(value, list | tuple):
        if all(isinstance(x, int | np.integer) for x in value):
            return Attribute(name, A.INTS, [int(x) for x in value])
        if all(isinstance(x, float | int) for x in value):
            return Attribute(name, A.FLOATS, [float(x) for x in value])
        if all(isinstance(x, str) for x in value):
            return Attribute(name, A.STRINGS, list(value))
    raise TypeError(f"cannot make attribute {name} from {type(value).__name__}")


def apply_rule(rule: RewriteRule, model: Model, graph: Graph) -> int:
    """Apply ``rule`` everywhere it matches in ``graph``; returns the number of rewrites."""
    count = 0
    # Only nodes of the root's type can match: picking them out first spares a call per node
    # of the graph for every rule of every pass.
    op_type, domain = rule._root.op_type, rule._root.domain
    candidates = [n for n in graph.nodes if n.op_type == op_type and n.domain == domain]
    for node in candidates:
        if node.graph is not graph:
            continue  # removed by an earlier rewrite in this sweep
        context = RewriteContext(model, graph, node)
        m = next((m for m in rule.matches(node) if rule.check(context, **m.bindings)), None)
        if m is None:
            continue
        builder = _RewriteBuilder(model, graph, node)
        result = rule.rewrite(builder, **m.bindings)
        if result is None:
            continue
        new_outputs = list(result) if isinstance(result, tuple) else [result]
        _commit(graph, node, m, builder.created, new_outputs)
        count += 1
    return count


def _commit(graph: Graph, root: Node, m: Match, created: list[Node], outputs: list[Value]
            ) -> None:
    position = graph.nodes.index(root)
    for i, node in enumerate(created):
        node.graph = graph
        graph.nodes.insert(position + i, node)
    for old, new in zip(root.outputs, outputs, strict=False):
        if new is old:
            continue
        if new.producer is not None and new.producer in created and not new.uses:
            # The new node takes over the old output Value itself: name, type and readers stay.
            producer, index = new.producer, new.output_index
            producer.outputs[index] = old
            old.producer, old.output_index = producer, index
        elif not graph_utils.replace_value(old, new):
            # Cannot rename onto a graph input/output: keep the name with an Identity.
            ident = Node("Identity", [new], [], name=graph_utils.unique_name(graph, "keep"))
            ident.outputs = [old]
            old.producer, old.output_index = ident, 0
            ident.graph = graph
            graph.nodes.insert(position + len(created), ident)
    # m.nodes lists the root first, then each node before its producers: removing in that order
    # leaves every next node without readers.
    for node in m.nodes:
        if node.graph is graph and all(
            v.producer is not node or (not v.uses and not graph_utils.is_graph_output(v))
            for v in node.outputs
        ):
            graph.remove(node)
