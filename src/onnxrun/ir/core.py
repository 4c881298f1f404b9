"""onnxrun's graph IR: values with use-def chains, nodes, graphs (subgraphs too) and models.

Why our own IR rather than onnx-ir: the engine needs only a small core (a value knows its producer
and its uses, a node its inputs/outputs/attributes, a graph its parent scope), it must be cheap to
build for every session, and owning it keeps load and optimize free of a second dependency.
Types are kept as ``onnx.TypeProto`` objects: they already describe tensors, sequences, maps and
optionals, and they serialize back without translation.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..proto import onnx


class Value:
    """A named SSA value: a graph input, an initializer, or a node output."""

    __slots__ = ("name", "type", "producer", "output_index", "uses", "const_value", "graph")

    def __init__(
        self,
        name: str,
        type: onnx.TypeProto | None = None,  # noqa: A002 - mirrors onnx field name
        producer: Node | None = None,
        output_index: int = 0,
        const_value: np.ndarray | None = None,
        graph: Graph | None = None,
    ) -> None:
        self.name = name
        self.type = type
        self.producer = producer
        self.output_index = output_index
        # (node, input index) pairs; a node inside a subgraph that reads this value from an outer
        # scope is listed too, so a value knows every reader at every depth.
        self.uses: list[tuple[Node, int]] = []
        self.const_value = const_value
        self.graph = graph

    @property
    def is_initializer(self) -> bool:
        return self.const_value is not None and self.producer is None

    def replace_all_uses_with(self, other: Value) -> None:
        for node, idx in list(self.uses):
            node.set_input(idx, other)
        if self.graph is not None:
            self.graph.outputs[:] = [other if v is self else v for v in self.graph.outputs]

    def __repr__(self) -> str:
        return f"Value({self.name!r})"


@dataclass
class Attribute:
    """A node attribute: its onnx AttributeType and a Python value.

    Values: int, float, str, np.ndarray (TENSOR / SPARSE_TENSOR densified), Graph, TypeProto, or a
    list of those. ``ref_attr_name`` is set inside function bodies that forward an attribute.
    """

    name: str
    type: int
    value: Any
    ref_attr_name: str = ""


# Attribute values that are never graphs, by exact type (Attribute's doc lists the kinds).
_PLAIN_VALUES = frozenset({int, float, str, bytes, np.ndarray})


def holding_graphs(nodes: Iterable[Node]) -> Iterator[Node]:
    """The nodes of ``nodes`` with subgraphs, in order, each looked at when reached. Graph walks
    (dozens per session) pass every node through this filter instead of calling
    ``subgraphs()`` on each: the call per node was most of their cost (ShuffleNet's 446
    nodes: 250 -> 70 us a walk)."""
    for node in nodes:
        for a in node.attributes.values():
            value = a.value
            kind = type(value)
            if kind in _PLAIN_VALUES or kind is list and (
                    not value or type(value[0]) in _PLAIN_VALUES):
                continue
            if node.subgraphs():
                yield node
            break


class Node:
    __slots__ = (
        "name",
        "op_type",
        "domain",
        "overload",
        "inputs",
        "outputs",
        "attributes",
        "graph",
        "doc_string",
        "opset_version",
    )

    def __init__(
        self,
        op_type: str,
        inputs: list[Value | None],
        outputs: list[Value],
        attributes: dict[str, Attribute] | None = None,
        *,
        domain: str = "",
        name: str = "",
        overload: str = "",
        doc_string: str = "",
    ) -> None:
        self.op_type = op_type
        self.domain = "" if domain == "ai.onnx" else domain
        self.name = name
        self.overload = overload
        self.doc_string = doc_string
        self.attributes = attributes or {}
        # Set on nodes expanded from a function body whose opset_import differs from the model's;
        # None means "the model's opset for this domain".
        self.opset_version: int | None = None
        self.graph: Graph | None = None
        self.inputs: list[Value | None] = []
        for i, v in enumerate(inputs):
            self.inputs.append(v)
            if v is not None:
                v.uses.append((self, i))
        self.outputs = outputs
        for i, v in enumerate(outputs):
            v.producer = self
            v.output_index = i

    def set_input(self, index: int, value: Value | None) -> None:
        old = self.inputs[index]
        if old is not None:
            old.uses.remove((self, index))
        self.inputs[index] = value
        if value is not None:
            value.uses.append((self, index))

    def subgraphs(self) -> list[Graph]:
        """The graphs among the attributes (usually none: asked of every node by every graph
        walk, so a plain loop, no generator)."""
        found: list[Graph] = []
        for attr in self.attributes.values():
            value = attr.value
            if isinstance(value, Graph):
                found.append(value)
            elif type(value) is list and value and isinstance(value[0], Graph):
                found.extend(g for g in value if isinstance(g, Graph))
        return found

    def attr(self, name: str, default: Any = None) -> Any:
        a = self.attributes.get(name)
        return default if a is None else a.value

    @property
    def label(self) -> str:
        """How error messages name this node: its name, else its first output."""
        if self.name:
            return self.name
        return self.outputs[0].name if self.outputs else f"<{self.op_type}>"

    def __repr__(self) -> str:
        return f"Node({self.op_type!r}, name={self.name!r})"


class Graph:
    """A graph or subgraph. ``parent`` links a subgraph to the graph whose node owns it, so names
    a subgraph does not define resolve to values of the enclosing scopes."""

    def __init__(self, name: str = "", parent: Graph | None = None) -> None:
        self.name = name
        self.parent = parent
        self.inputs: list[Value] = []
        self.outputs: list[Value] = []
        self.nodes: list[Node] = []
        self.initializers: dict[str, Value] = {}
        self.value_info: dict[str, onnx.TypeProto] = {}
        self.doc_string = ""
        self.sparse_initializer_names: set[str] = set()

    def append(self, node: Node) -> None:
        node.graph = self
        self.nodes.append(node)

    def remove(self, node: Node) -> None:
        for i, v in enumerate(node.inputs):
            if v is not None:
                v.uses.remove((node, i))
        self.nodes.remove(node)
        node.graph = None

    def all_nodes(self) -> Iterator[Node]:
        """Every node of this graph and, depth first, of its subgraphs."""
        for node in self.nodes:
            yield node
            for sub in node.subgraphs():
                yield from sub.all_nodes()

    def outer_references(self) -> list[Value]:
        """Values from enclosing scopes that this graph or its subgraphs read (first-use order)."""
        own: set[int] = set()
        seen: dict[int, Value] = {}
        self._collect_outer(own, seen)
        return list(seen.values())

    def _collect_outer(self, own: set[int], seen: dict[int, Value]) -> None:
        own.update(id(v) for v in self.inputs)
        own.update(id(v) for v in self.initializers.values())
        for node in self.nodes:
            own.update(id(v) for v in node.outputs)
        for node in self.nodes:
            for v in node.inputs:
                if v is not None and id(v) not in own:
                    seen.setdefault(id(v), v)
            for sub in node.subgraphs():
                sub._collect_outer(own, seen)

    def __repr__(self) -> str:
        return f"Graph({self.name!r}, {len(self.nodes)} nodes)"


@dataclass
class Model:
    graph: Graph
    ir_version: int
    opset_imports: dict[str, int]
    producer_name: str = ""
    producer_version: str = ""
    domain: str = ""
    model_version: int = 0
    doc_string: str = ""
    metadata_props: dict[str, str] = field(default_factory=dict)
    # Model-local functions, keyed by (domain, name): expanded by the function-inlining step.
    functions: dict[tuple[str, str], onnx.FunctionProto] = field(default_factory=dict)

    def opset(self, domain: str) -> int | None:
        return self.opset_imports.get("" if domain == "ai.onnx" else domain)

    def node_opset(self, node: Node) -> int | None:
        """The opset version a node's operator is resolved at."""
        if node.opset_version is not None:
            return node.opset_version
        return self.opset(node.domain)
