"""Between validation and partitioning: run operators that no provider implements, but that ONNX
defines as a function (e.g. MeanVarianceNormalization, context-dependent ones such as
SoftmaxCrossEntropyLoss), by replacing each such node with its function body.

Expansion repeats until no expandable node is left, so functions whose bodies use other
functions expand fully. Body nodes keep the opset their function body imports, which may differ
from the model's (``Node.opset_version``).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

from .ir import Graph, Model, Node, Value
from .ir.serde import _attribute_to_proto, _Reader, _Scope
from .proto import HAVE_ONNX, onnx
from .providers import ExecutionProvider

AttributeProto = onnx.AttributeProto

_MAX_EXPANSIONS = 10_000  # a guard against function bodies that (indirectly) contain themselves


def expand_functions(model: Model, providers: list[ExecutionProvider]) -> int:
    """Expand in place every node no provider can run into its ONNX function body.

    Returns the number of nodes expanded. Nodes with neither a kernel nor a function are left for
    the partitioner to report.
    """
    counter = itertools.count()
    expanded = 0
    for graph in list(_graphs(model.graph)):
        i = 0
        while i < len(graph.nodes):
            node = graph.nodes[i]
            opset = model.node_opset(node)
            if opset is None or any(p.can_run(node, opset) for p in providers):
                i += 1
                continue
            body = _function_body(node, opset)
            if body is None:
                i += 1
                continue
            expanded += 1
            if expanded > _MAX_EXPANSIONS:
                raise RecursionError("function expansion does not terminate")
            new_nodes = _instantiate(body, node, graph, model, next(counter))
            graph.remove(node)
            for k, n in enumerate(new_nodes):
                n.graph = graph
                graph.nodes.insert(i + k, n)
            # do not advance i: the body's own nodes may need expanding too
    return expanded


def _graphs(g: Graph) -> Iterator[Graph]:
    yield g
    for node in g.nodes:
        for sub in node.subgraphs():
            yield from _graphs(sub)


def _function_body(node: Node, opset: int) -> onnx.FunctionProto | None:
    if not HAVE_ONNX:
        return None  # ONNX's function bodies are in onnx's C++ schemas
    try:
        schema = onnx.defs.get_schema(node.op_type, opset, node.domain)
    except onnx.defs.SchemaError:
        return None
    if schema.has_function:
        versions = [v for v in schema.function_opset_versions if v <= opset]
        version = max(versions) if versions else min(schema.function_opset_versions)
        return schema.get_function_with_opset_version(version)
    if schema.has_context_dependent_function:
        types = []
        for v in node.inputs:
            if v is None:
                types.append(onnx.TypeProto().SerializeToString())
            elif v.type is None or v.type.WhichOneof("value") is None:
                return None  # the body depends on input types we do not know
            else:
                types.append(v.type.SerializeToString())
        node_proto = onnx.NodeProto(
            op_type=node.op_type, domain=node.domain, name=node.name,
            input=[v.name if v is not None else "" for v in node.inputs],
            output=[v.name for v in node.outputs],
        )
        node_proto.attribute.extend(_attribute_to_proto(a) for a in node.attributes.values())
        versions = [v for v in schema.context_dependent_function_opset_versions if v <= opset]
        version = max(versions) if versions else opset
        data = schema.get_context_dependent_function_with_opset_version(
            version, node_proto.SerializeToString(), types
        )
        if not data:
            return None
        fp = onnx.FunctionProto()
        fp.ParseFromString(data)
        return fp
    return None


def _instantiate(fp: onnx.FunctionProto, node: Node, graph: Graph, model: Model, uid: int
                 ) -> list[Node]:
    """Copy the function body for this call site: fresh value names, attributes bound."""
    prefix = f"{node.label}__{fp.name}_{uid}__"
    body_opsets = {("" if o.domain == "ai.onnx" else o.domain): o.version for o in fp.opset_import}

    # Attribute values visible to the body: the caller's, then the schema's defaults.
    bound: dict[str, AttributeProto] = {}
    try:
        schema = onnx.defs.get_schema(node.op_type, model.node_opset(node) or 1, node.domain)
        for name, attr in schema.attributes.items():
            if attr.default_value.type != AttributeProto.UNDEFINED:
                bound[name] = attr.default_value
    except onnx.defs.SchemaError:
        pass
    for name, a in node.attributes.items():
        bound[name] = _attribute_to_proto(a)

    values: dict[str, Value | None] = {}
    for i, name in enumerate(fp.input):
        values[name] = node.inputs[i] if i < len(node.inputs) else None
    for i, name in enumerate(fp.output):
        if i < len(node.outputs) and node.outputs[i].name:
            values[name] = node.outputs[i]

    reader = _Reader(lambda t: b"")
    scope = _Scope(None)
    new_nodes: list[Node] = []
    for bn in fp.node:
        inputs = [values.get(n) if n else None for n in bn.input]
        outputs = []
        for n in bn.output:
            v = values.get(n)
            if v is None:
                v = Value(prefix + n if n else "", graph=graph)
                if n:
                    values[n] = v
            outputs.append(v)
        attrs = {}
        for a in bn.attribute:
            if a.ref_attr_name:
                src = bound.get(a.ref_attr_name)
                if src is None:
                    continue  # optional attribute the caller did not set
                a2 = AttributeProto()
                a2.CopyFrom(src)
                a2.name = a.name
                a = a2
            attrs[a.name] = reader.attribute(a, graph, scope)
        domain = "" if bn.domain == "ai.onnx" else bn.domain
        n = Node(bn.op_type, inputs, outputs, attrs, domain=domain,
                 name=f"{prefix}{bn.name or bn.op_type}")
        n.opset_version = body_opsets.get(domain)
        new_nodes.append(n)
    return new_nodes
