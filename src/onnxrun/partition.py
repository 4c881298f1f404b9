"""Step 4 of a session: assign every node (subgraphs included) to an execution provider.

Providers are asked in the session's priority order; the first that has a kernel for the node's
(domain, op_type) at the model's opset runs it. Nodes no provider claims are reported together,
naming domain, operator, opset and node.
"""

from __future__ import annotations

from .errors import InvalidGraph, NotImplemented  # noqa: A004 - onnxruntime's name
from .ir import Model
from .providers import ExecutionProvider

Assignment = dict[int, ExecutionProvider]  # id(node) -> provider
ANY_OPSET = 1 << 30  # above every opset: a kernel of any version answers


def partition(model: Model, providers: list[ExecutionProvider]) -> Assignment:
    assignment: Assignment = {}
    missing: list[str] = []
    for node in model.graph.all_nodes():
        opset = model.node_opset(node)
        if opset is None:
            raise InvalidGraph(
                f"node '{node.label}' ({node.op_type}) uses domain '{node.domain}', which the "
                f"model does not import (opset_import has: {sorted(model.opset_imports) or 'none'})"
            )
        for provider in providers:
            if provider.can_run(node, opset):
                assignment[id(node)] = provider
                break
        else:
            domain = node.domain or "ai.onnx"
            entry = (f"{node.op_type}({opset}) node with name '{node.label}' (domain '{domain}', "
                     f"opset {opset})")
            if node.domain not in ("", "ai.onnx") and not any(
                    p.can_run(node, ANY_OPSET) for p in providers):
                # onnxruntime's wording for an operator no version of its domain defines (callers,
                # onnxruntime's own tests among them, match on it)
                entry += f": {node.domain}:{node.op_type}(-1) is not a registered function/op"
            missing.append(entry)
    if not missing and any(getattr(p, "device", "cpu") != "cpu" for p in providers):
        _shape_math_on_cpu(model, assignment, providers)
    if missing:
        names = ", ".join(p.name for p in providers)
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise NotImplemented(  # noqa: F901 - onnxrun.errors.NotImplemented, not the builtin
            f"Could not find an implementation for {'; '.join(missing[:5])}{more} "
            f"in providers [{names}]"
        )
    return assignment


_SHAPE_OPS = frozenset({"Shape", "Size"})


def _shape_math_on_cpu(model: Model, assignment: Assignment,
                       providers: list[ExecutionProvider]) -> None:
    """onnxruntime's CPU-preferred nodes: what computes on shapes (Shape / Size outputs, and
    every node reading only those and constants) stays on the CPU, where its small integer
    results are used as shapes, axes and indices, instead of going to the device and back."""
    cpu = next((p for p in providers if getattr(p, "device", "cpu") == "cpu"), None)
    if cpu is None:
        return
    g = model.graph
    shape_values: set[int] = set()
    changed = True
    while changed:
        changed = False
        for node in g.nodes:
            if all(id(v) in shape_values for v in node.outputs):
                continue
            if node.op_type in _SHAPE_OPS and node.domain == "":
                ok = True
            else:
                reads = [v for v in node.inputs if v is not None]
                ok = bool(reads) and not node.subgraphs() and any(
                    id(v) in shape_values for v in reads) and all(
                    id(v) in shape_values or _constant(v) for v in reads)
            opset = model.node_opset(node) or 0
            if ok and (assignment[id(node)] is cpu or cpu.can_run(node, opset)):
                assignment[id(node)] = cpu
                shape_values.update(id(v) for v in node.outputs)
                changed = True
    _host_only_on_cpu(model, assignment, cpu)


def _host_only_on_cpu(model: Model, assignment: Assignment, cpu: ExecutionProvider) -> None:
    """onnxruntime's other CPU-preferred nodes: a device node whose every result is read only
    as a host input of device kernels (seqlens_k of GroupQueryAttention, computed from the
    attention mask), directly or through other such nodes, and whose inputs are all on the
    host (graph inputs, constants, CPU results), runs on the CPU: its result then never
    crosses to the device and back, and its host inputs never go up."""
    g = model.graph
    outputs = set(map(id, g.outputs))

    def host_read(node, v) -> bool:
        provider = assignment[id(node)]
        if provider is cpu:
            return False  # a CPU operator's input: the copy down happens either way
        index = [i for i, x in enumerate(node.inputs) if x is v]
        return all(i in provider.host_inputs(node) for i in index)

    wanted: set[int] = set()  # nodes whose results only the host reads (consumers first)
    for node in reversed(g.nodes):
        if assignment[id(node)] is cpu or node.subgraphs():
            continue
        uses = [(n, v) for v in node.outputs for n, _ in v.uses]
        if uses and not any(id(v) in outputs for v in node.outputs) and all(
                id(n) in wanted or host_read(n, v) for n, v in uses):
            wanted.add(id(node))
    for node in g.nodes:  # producers first: each input must already be on the host
        if id(node) not in wanted or not cpu.can_run(node, model.node_opset(node) or 0):
            continue
        if all(v is None or v.producer is None or _constant(v) or
               assignment[id(v.producer)] is cpu for v in node.inputs):
            assignment[id(node)] = cpu


def _constant(v) -> bool:
    """An initializer, or a Constant node's output (graphs run without constant folding)."""
    return v.is_initializer or (v.producer is not None and v.producer.op_type == "Constant"
                                and v.producer.domain == "")
