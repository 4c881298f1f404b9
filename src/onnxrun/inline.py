"""Model-local functions inlined on the proto, in pure Python (load.py's step without onnx).

Where onnx imports, load.py uses onnx's C++ inliner; where it does not (Pyodide), this one: each
call of a function the model defines (domain, name, overload) is replaced by a copy of its body,
formal inputs and outputs renamed to the call's values, every other name made unique, attribute
references bound to the call's attributes (else the function's defaults, else dropped, as an
unset optional attribute), in subgraphs too. Calls inside bodies are inlined in turn.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

from .errors import InvalidGraph
from .proto import onnx

_MAX_DEPTH = 64  # functions calling themselves (directly or not) never end


def inline_local_functions(mp: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``mp`` with every call of a model-local function inlined, ``functions`` empty."""
    out = onnx.ModelProto()
    out.CopyFrom(mp)
    functions = {(f.domain, f.name, f.overload): f for f in out.functions}
    opsets = {o.domain: o.version for o in out.opset_import}
    for f in out.functions:
        for o in f.opset_import:
            if o.domain not in opsets:
                out.opset_import.add(domain=o.domain, version=o.version)
                opsets[o.domain] = o.version
    names = set(_all_names(out.graph))
    counter = itertools.count()
    _inline_graph(out.graph, functions, names, counter, 0)
    del out.functions[:]
    return out


def _all_names(g: onnx.GraphProto) -> Iterator[str]:
    for vi in [*g.input, *g.output, *g.value_info]:
        yield vi.name
    for t in g.initializer:
        yield t.name
    for n in g.node:
        yield from n.input
        yield from n.output
        for a in n.attribute:
            for sub in [a.g] if a.HasField("g") else a.graphs:
                yield from _all_names(sub)


def _inline_graph(g: onnx.GraphProto, functions: dict, names: set[str], counter, depth: int
                  ) -> None:
    new_nodes: list[onnx.NodeProto] = []
    for node in g.node:
        for a in node.attribute:
            for sub in [a.g] if a.HasField("g") else a.graphs:
                _inline_graph(sub, functions, names, counter, depth)
        f = functions.get((node.domain, node.op_type, node.overload))
        if f is None:
            new_nodes.append(node)
            continue
        if depth >= _MAX_DEPTH:
            raise InvalidGraph(
                f"model-local functions could not be inlined: function '{f.name}' calls itself")
        body = _instantiate(f, node, names, next(counter))
        holder = onnx.GraphProto()
        holder.node.extend(body)
        _inline_graph(holder, functions, names, counter, depth + 1)
        new_nodes.extend(holder.node)
    del g.node[:]
    g.node.extend(new_nodes)


def _instantiate(f: onnx.FunctionProto, call: onnx.NodeProto, names: set[str], uid: int
                 ) -> list[onnx.NodeProto]:
    rename: dict[str, str] = {}
    for i, formal in enumerate(f.input):
        rename[formal] = call.input[i] if i < len(call.input) else ""
    for i, formal in enumerate(f.output):
        if i < len(call.output) and call.output[i]:
            rename[formal] = call.output[i]
    prefix = f"{call.name or f.name}__{uid}__"

    def local(name: str) -> str:
        if not name:
            return name
        if name not in rename:
            new = prefix + name
            while new in names:
                new = "_" + new
            names.add(new)
            rename[name] = new
        return rename[name]

    bound: dict[str, onnx.AttributeProto] = {a.name: a for a in f.attribute_proto}
    bound.update({a.name: a for a in call.attribute})
    body = []
    for bn in f.node:
        n = onnx.NodeProto()
        n.CopyFrom(bn)
        del n.input[:]
        n.input.extend(local(x) for x in bn.input)
        del n.output[:]
        n.output.extend(local(x) for x in bn.output)
        n.name = prefix + (bn.name or bn.op_type)
        _bind_attributes(n, bound, rename)
        body.append(n)
    return body


def _bind_attributes(n: onnx.NodeProto, bound: dict[str, onnx.AttributeProto],
                     rename: dict[str, str]) -> None:
    kept = []
    for a in n.attribute:
        if a.ref_attr_name:
            src = bound.get(a.ref_attr_name)
            if src is None:
                continue  # an optional attribute the call did not set
            b = onnx.AttributeProto()
            b.CopyFrom(src)
            b.name = a.name
            a = b
        for sub in [a.g] if a.HasField("g") else a.graphs:
            _bind_subgraph(sub, bound, rename)
        kept.append(a)
    del n.attribute[:]
    n.attribute.extend(kept)


def _bind_subgraph(g: onnx.GraphProto, bound: dict[str, onnx.AttributeProto],
                   rename: dict[str, str]) -> None:
    """A body node's subgraph: names it reads from the body follow the body's renaming
    (names it defines itself shadow them), attribute references are bound."""
    own = {vi.name for vi in g.input} | {t.name for t in g.initializer}
    own |= {o for n in g.node for o in n.output}
    outer = {k: v for k, v in rename.items() if k not in own}
    for n in g.node:
        for i, x in enumerate(n.input):
            if x in outer:
                n.input[i] = outer[x]
        _bind_attributes(n, bound, outer)
    for vi in g.output:
        if vi.name in outer:
            vi.name = outer[vi.name]
