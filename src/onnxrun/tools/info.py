"""``onnxrun info MODEL``: describe a model without running it: producer, IR version, opsets,
inputs and outputs, the initializers' count and size, and how many nodes of each operator it
holds."""

from __future__ import annotations

import argparse
import collections
import os
from typing import Any

from .. import dtypes
from ..load import load_model
from .common import flatten, format_bytes, format_shape, table


def cmd_info(args: argparse.Namespace) -> int:
    # The session's loader, so external data is found (and policed) exactly as a session does.
    _, model = load_model(args.model)
    g = model.graph
    out = [f"model:         {args.model} ({format_bytes(os.path.getsize(args.model))})"]
    producer = " ".join(x for x in (model.producer_name, model.producer_version) if x)
    out.append(f"producer:      {producer or '(none)'}")
    out.append(f"ir_version:    {model.ir_version}")
    opsets = ", ".join(f"{d or 'ai.onnx'} {v}" for d, v in sorted(model.opset_imports.items()))
    out.append(f"opsets:        {opsets or '(none)'}")
    if model.domain or model.model_version:
        out.append(f"domain:        {model.domain or '(none)'}  model_version: "
                   f"{model.model_version}")
    if g.name:
        out.append(f"graph:         {g.name}")
    if model.doc_string:
        out.append(f"doc:           {flatten(model.doc_string)[:200]}")
    for key, value in sorted(model.metadata_props.items()):
        out.append(f"metadata:      {key} = {flatten(value)[:200]}")

    initializer_ids = {id(v) for v in g.initializers.values()}
    inputs = [v for v in g.inputs if id(v) not in initializer_ids]
    overridable = len(g.inputs) - len(inputs)

    def value_rows(values: list[Any]) -> list[str]:
        return table([(v.name, dtypes.type_string(v.type), _value_shape(v)) for v in values])

    suffix = f" (+{overridable} initializers listed as inputs)" if overridable else ""
    out.append(f"inputs ({len(inputs)}){suffix}:")
    out.extend(value_rows(inputs))
    out.append(f"outputs ({len(g.outputs)}):")
    out.extend(value_rows(g.outputs))
    total = sum(int(v.const_value.nbytes) for v in g.initializers.values())
    out.append(f"initializers:  {len(g.initializers)}, {format_bytes(total)} ({total} bytes)")
    if model.functions:
        names = ", ".join(f"{d}:{n}" for d, n in sorted(model.functions))
        out.append(f"functions:     {len(model.functions)} ({names})")

    histogram = collections.Counter(
        f"{node.domain or 'ai.onnx'}:{node.op_type}" for node in g.all_nodes()
    )
    n_nodes = sum(histogram.values())
    n_sub = n_nodes - len(g.nodes)
    where = f", {n_sub} in subgraphs" if n_sub else ""
    out.append(f"nodes:         {n_nodes}{where}; {len(histogram)} operator types")
    ordered = sorted(histogram.items(), key=lambda kv: (-kv[1], kv[0]))
    out.extend(table([(name, str(count)) for name, count in ordered]))
    print("\n".join(out))
    return 0


def _value_shape(v: Any) -> str:
    tp = v.type
    if tp is None or tp.WhichOneof("value") not in ("tensor_type", "sparse_tensor_type"):
        return ""
    return format_shape(dtypes.type_shape(tp))



def add_parser(sub: Any, parents: list[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    p = sub.add_parser("info", parents=parents, help="describe a model without running it")
    p.add_argument("model", help="path of the .onnx file")
    p.set_defaults(func=cmd_info)
    return p
