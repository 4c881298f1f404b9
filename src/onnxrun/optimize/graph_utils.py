"""Small graph-editing helpers shared by the passes (use-def aware, output names preserved)."""

from __future__ import annotations

import weakref
from collections.abc import Iterator

import numpy as np

from ..ir import Graph, Model, Node, Value
from ..ir.core import holding_graphs


def all_graphs(graph: Graph) -> Iterator[Graph]:
    """The graph and, depth first, every subgraph."""
    yield graph
    for node in holding_graphs(list(graph.nodes)):
        for sub in node.subgraphs():
            yield from all_graphs(sub)


def live_nodes(model: Model) -> Iterator[tuple[Graph, Node]]:
    """(graph, node) for every node of every graph, skipping nodes an earlier rewrite in the
    same sweep removed; each graph's node list is read when the sweep reaches it."""
    for graph in list(all_graphs(model.graph)):
        for node in list(graph.nodes):
            if node.graph is graph:
                yield graph, node


def is_graph_output(v: Value) -> bool:
    return v.graph is not None and any(o is v for o in v.graph.outputs)


def is_graph_input(v: Value) -> bool:
    return v.graph is not None and any(i is v for i in v.graph.inputs)


def constant_value(v: Value | None) -> np.ndarray | None:
    """The value of ``v`` when it is a constant no caller can override, else None."""
    if v is None or v.const_value is None or v.producer is not None:
        return None
    if is_graph_input(v):  # an initializer that is also an input may be fed: not constant
        return None
    return v.const_value


def is_constant(v: Value | None) -> bool:
    return constant_value(v) is not None


def scalar_value(v: Value | None) -> float | None:
    """The value of a constant holding one element, as a Python number."""
    c = constant_value(v)
    if c is None or c.size != 1 or c.dtype.kind not in "biuf":
        return None
    return c.reshape(()).item()


def pad_amounts(pad: Node, rank: int, constant=constant_value) -> list[int] | None:
    """A Pad node's constant pads as [begin..., end...] over all ``rank`` axes: its attribute
    before opset 11, its input since, spread over the ``axes`` input of opset 18 (``constant``
    reads a value); None where they are not integer constants or do not fit the rank."""
    pads = pad.attr("pads")
    if pads is None:
        c = constant(pad.inputs[1]) if len(pad.inputs) > 1 and pad.inputs[1] is not None \
            else None
        if c is None or c.dtype.kind not in "iu":
            return None
        pads = c.ravel()
    pads = [int(p) for p in pads]
    if len(pad.inputs) > 3 and pad.inputs[3] is not None:
        axes = constant(pad.inputs[3])
        if axes is None or len(pads) != 2 * axes.size:
            return None
        full = [0] * (2 * rank)
        for i, a in enumerate(int(a) for a in axes.ravel()):
            a = a + rank if a < 0 else a
            if not 0 <= a < rank:
                return None
            full[a], full[a + rank] = pads[i], pads[i + axes.size]
        return full
    return pads if len(pads) == 2 * rank else None


def single_consumer(v: Value) -> Node | None:
    """The one node reading ``v``, if exactly one does and ``v`` is not a graph output."""
    if len(v.uses) != 1 or is_graph_output(v):
        return None
    return v.uses[0][0]


def make_initializer(graph: Graph, name: str, array: np.ndarray) -> Value:
    from ..ir.serde import tensor_type

    arr = np.asarray(array)
    arr.flags.writeable = False
    v = Value(unique_name(graph, name), type=tensor_type(arr), const_value=arr, graph=graph)
    graph.initializers[v.name] = v
    return v


def to_initializer(v: Value, array: np.ndarray) -> None:
    """Turn a node output into an initializer in place: its name and readers stay."""
    from ..ir.serde import tensor_type

    arr = np.asarray(array)
    arr.flags.writeable = False
    v.producer = None
    v.const_value = arr
    v.type = tensor_type(arr)
    v.graph.initializers[v.name] = v


# The names a model uses, per root graph, kept current by unique_name itself: collecting them
# afresh for every new name made rewriting quadratic in the model's size. New names come from
# unique_name; names that disappear only leave the set more cautious than needed.
_NAME_CACHE: weakref.WeakKeyDictionary[Graph, set[str]] = weakref.WeakKeyDictionary()


def unique_name(graph: Graph, base: str) -> str:
    root = graph
    while root.parent is not None:
        root = root.parent
    names = _NAME_CACHE.get(root)
    if names is None:
        names = _NAME_CACHE[root] = _names(root)
    name, i = base, 1
    while name in names:
        name, i = f"{base}_{i}", i + 1
    names.add(name)
    return name


def _names(graph: Graph) -> set[str]:
    root = graph
    while root.parent is not None:
        root = root.parent
    names: set[str] = set()
    for g in all_graphs(root):
        names.update(v.name for v in g.inputs)
        names.update(g.initializers)
        for n in g.nodes:
            names.update(v.name for v in n.outputs)
    return names


def replace_value(old: Value, new: Value) -> bool:
    """Make every reader of ``old`` read ``new``. When ``old`` is a graph output its name must
    survive: ``new`` is renamed to it if ``new`` is a plain intermediate of the same graph;
    otherwise nothing changes and False is returned (the caller keeps its node)."""
    if is_graph_output(old):
        if new.graph is not old.graph or is_graph_output(new) or is_graph_input(new) or (
            new.producer is None
        ):
            return False
        name = old.name
        old.replace_all_uses_with(new)
        new.name = name
        if new.type is None or new.type.WhichOneof("value") is None:
            new.type = old.type  # the output's declared type, where nothing inferred new's
        return True
    old.replace_all_uses_with(new)
    return True


def remove_node(node: Node) -> None:
    if node.graph is not None:
        node.graph.remove(node)


def remove_dead(graph: Graph) -> int:
    """Remove nodes none of whose outputs is read or is a graph output (repeatedly)."""
    removed = 0
    changed = True
    while changed:
        changed = False
        for node in reversed(list(graph.nodes)):
            if all(not v.uses and not is_graph_output(v) for v in node.outputs):
                graph.remove(node)
                removed += 1
                changed = True
    return removed


def ensure_opset(model: Model, domain: str, version: int = 1) -> None:
    model.opset_imports.setdefault(domain, version)
