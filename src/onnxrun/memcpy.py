"""Step 4b of a session: the copies between host and device, inserted once, at plan time.

After partitioning, a value produced on one side and read on the other gets one copy node —
onnxruntime's ``MemcpyFromHost`` (host -> device) or ``MemcpyToHost`` (device -> host) — run by
the device's provider; every reader on the far side reads the copy. Graph inputs and
initializers are host values (a feed already on the device passes through its
``MemcpyFromHost``; an initializer's copy is made once, when the kernel is prepared). Inputs a
device kernel reads as host values (shapes, axes: ``host_inputs``) get no upload, and a
``Shape`` / ``Size`` on the CPU reads a device value's metadata without a copy. Subgraph bodies
run on the CPU: the device values they read from outer scopes are copied down like any other.
Graph outputs stay where they are produced: a session hands them back on the host unless an
IOBinding keeps them on the device.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from .ir import Model, Node, Value
from .optimize.graph_utils import unique_name
from .partition import Assignment

_METADATA_ONLY = frozenset({"Shape", "Size"})


@dataclass
class Placement:
    """Where a session's nodes run and what crosses between devices (the optimization report
    shows it)."""

    nodes: Counter = field(default_factory=Counter)  # provider -> nodes it runs
    copies: list[tuple[str, str]] = field(default_factory=list)  # (op, value name)
    host_fed: set[str] = field(default_factory=set)  # graph inputs some CPU node reads

    def format(self) -> str:
        lines = ["placement: " + ", ".join(f"{p} {n} node(s)" for p, n in self.nodes.items())]
        counts = Counter(op for op, _ in self.copies)
        if counts:
            lines.append("  copies inserted: " + ", ".join(
                f"{op} x{n}" for op, n in sorted(counts.items())))
        return "\n".join(lines)


def _on_device(provider: Any) -> bool:
    return getattr(provider, "device", "cpu") != "cpu"


def insert_copies(model: Model, assignment: Assignment) -> Placement:
    g = model.graph
    placement = Placement()
    devices = {id(p): p for p in assignment.values() if _on_device(p)}
    if len(devices) > 1:
        raise NotImplementedError("one device provider per session is supported")
    device = next(iter(devices.values()), None)
    for node in g.all_nodes():
        placement.nodes[assignment[id(node)].name] += 1
    if device is None:
        placement.host_fed = {v.name for v in g.inputs}
        return placement

    def on_device(v: Value) -> bool:
        return v.producer is not None and id(v.producer) in assignment and \
            _on_device(assignment[id(v.producer)])

    copies: dict[tuple[int, str], Value] = {}

    def copy_of(v: Value, op_type: str) -> Value:
        key = (id(v), op_type)
        out = copies.get(key)
        if out is None:
            suffix = "to_device" if op_type == "MemcpyFromHost" else "to_host"
            out = Value(unique_name(g, f"{v.name}_{suffix}"), type=v.type, graph=g)
            node = Node(op_type, [v], [out], name=unique_name(g, f"{op_type}_{v.name}"))
            g.append(node)
            assignment[id(node)] = device
            copies[key] = out
            placement.copies.append((op_type, v.name))
        return out

    for v in g.inputs:
        readers = [n for n, _ in v.uses]
        if any(not _on_device(assignment[id(n)]) and n.op_type not in _METADATA_ONLY
               for n in readers):
            placement.host_fed.add(v.name)

    for node in list(g.nodes):
        provider = assignment[id(node)]
        device_node = _on_device(provider)
        host = provider.host_inputs(node) if device_node else ()
        for i, v in enumerate(node.inputs):
            if v is None:
                continue
            wants_device = device_node and i not in host
            if wants_device and not on_device(v):
                node.set_input(i, copy_of(v, "MemcpyFromHost"))
            elif not wants_device and on_device(v):
                if node.op_type in _METADATA_ONLY and node.domain == "":
                    continue
                node.set_input(i, copy_of(v, "MemcpyToHost"))
        for sub in node.subgraphs():  # bodies read outer device values on the host
            for inner in sub.all_nodes():
                for i, v in enumerate(inner.inputs):
                    if v is not None and on_device(v):
                        inner.set_input(i, copy_of(v, "MemcpyToHost"))
    return placement


def graph_outputs_on_device(model: Model, assignment: Assignment) -> set[str]:
    """Names of the graph outputs a device provider produces."""
    return {v.name for v in model.graph.outputs if v.producer is not None
            and _on_device(assignment[id(v.producer)])}


__all__ = ["Placement", "graph_outputs_on_device", "insert_copies"]
