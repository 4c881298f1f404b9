"""``onnxrun optimize MODEL -o OUT [--level basic|extended|all|disable]``: the graph optimizer
as a command.

The model goes through a session's own steps (load, validate, free-dimension overrides from
``--dim``, optimize) at the requested level, the optimized graph is saved with
``optimized_model_filepath`` as onnxruntime does, and the optimizer's report is printed: what
each pass changed, the node count before and after, and the operators whose count changed.
``--check`` then runs onnx's checker on the saved file and compares its outputs with the
unoptimized model's on random inputs (as ``onnxrun run`` generates them).
"""

from __future__ import annotations

import argparse
import collections
import os
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from .common import (
    DTYPE_BY_NAME,
    CliError,
    element_name,
    format_bytes,
    generate_input,
    parse_dims,
    resolve_shape,
    table,
)

LEVELS = {"disable": 0, "basic": 1, "extended": 2, "layout": 3, "all": 99,
          "0": 0, "1": 1, "2": 2, "3": 3, "99": 99}
TOLERANCE = 1e-4  # of each output's largest magnitude


def op_histogram(path: str) -> collections.Counter:
    """Nodes per operator of a saved model, subgraphs included (weights are not read)."""
    import onnx

    def walk(graph: Any) -> Iterator[Any]:
        for node in graph.node:
            yield node
            for a in node.attribute:
                for g in [a.g] if a.HasField("g") else a.graphs:
                    yield from walk(g)

    model = onnx.load(path, load_external_data=False)
    return collections.Counter(
        f"{'' if n.domain in ('', 'ai.onnx') else n.domain + ':'}{n.op_type}"
        for n in walk(model.graph)
    )


def _difference(expected: Any, got: Any) -> float:
    """Largest difference relative to the output's largest finite magnitude (inf: mismatch)."""
    e, g = np.asarray(expected), np.asarray(got)
    if e.shape != g.shape or e.dtype != g.dtype:
        return float("inf")
    if e.dtype.kind not in "fc" or not e.size:
        return 0.0 if np.array_equal(e, g) else float("inf")
    finite = np.isfinite(e)
    if not np.array_equal(finite, np.isfinite(g)):
        return float("inf")
    scale = max(float(np.abs(e[finite]).max(initial=0.0)), 1e-30)
    return float(np.abs(e - g)[finite].max(initial=0.0)) / scale


def check_saved(model: str, output: str, dims: dict[str, int], seed: int) -> list[str]:
    """onnx's checker on the saved file, then its outputs against the unoptimized model's."""
    import onnx

    from ..api.options import SessionOptions
    from ..api.session import InferenceSession

    onnx.checker.check_model(output)
    lines = ["check: onnx.checker accepts the saved model"]
    plain = SessionOptions()
    plain.graph_optimization_level = 0
    for name, value in dims.items():
        plain.add_free_dimension_override_by_name(name, value)
    reference = InferenceSession(model, plain)
    reloaded = InferenceSession(output, plain)
    rng = np.random.default_rng(seed)
    feeds = {}
    for a in reference.get_inputs():
        element = element_name(a.type)
        if element is None or element not in DTYPE_BY_NAME:
            return [*lines, f"check: outputs not compared (input '{a.name}' is {a.type})"]
        feeds[a.name] = generate_input(element, resolve_shape(a.shape or [], dims), rng)
    worst = max((_difference(e, g) for e, g in zip(reference.run(None, feeds),
                                                   reloaded.run(None, feeds), strict=True)),
                default=0.0)
    if worst > TOLERANCE:
        raise CliError(f"the optimized model's outputs differ from the original's "
                           f"(largest difference {worst:.3g}, relative to the output's largest "
                           "magnitude)")
    lines.append(f"check: the saved model reloads and its outputs match the unoptimized "
                 f"model's on random inputs (largest difference {worst:.2g}, relative to each "
                 "output's largest magnitude)")
    return lines


def cmd_optimize(args: argparse.Namespace) -> int:
    from ..api.options import SessionOptions
    from ..api.session import InferenceSession

    dims = parse_dims(args.dim)
    if not os.path.isfile(args.model):
        raise CliError(f"model file '{args.model}' does not exist")
    if os.path.abspath(args.output) == os.path.abspath(args.model):
        raise CliError("-o/--output names the model itself: write the result elsewhere")
    options = SessionOptions()
    options.graph_optimization_level = LEVELS[args.level]
    options.optimized_model_filepath = args.output
    for name, value in dims.items():
        options.add_free_dimension_override_by_name(name, value)
    if args.disable:
        options.add_session_config_entry("optimization.disable_specified_optimizers",
                                         ",".join(args.disable))
    t0 = time.perf_counter()
    session = InferenceSession(args.model, options)
    elapsed_ms = (time.perf_counter() - t0) * 1e3

    out = [f"model: {args.model}  (level {args.level}, session created in {elapsed_ms:.1f} ms)"]
    out.extend(session.get_optimization_report().format().splitlines())
    before, after = op_histogram(args.model), op_histogram(args.output)
    changed = sorted((op for op in {*before, *after} if before[op] != after[op]),
                     key=lambda op: (-abs(before[op] - after[op]), op))
    if changed:
        out.append("nodes per operator (before -> after):")
        out.extend(table([(op, str(before[op]), "->", str(after[op])) for op in changed]))
    out.append(f"saved: {args.output} ({format_bytes(os.path.getsize(args.output))}), "
               f"{sum(before.values())} -> {sum(after.values())} nodes")
    if args.check:
        out.extend(check_saved(args.model, args.output, dims, args.seed))
    print("\n".join(out))
    return 0


def add_parser(sub: Any, parents: list[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "optimize", parents=parents, help="optimize a model and save the result",
        description="Run the graph optimizer on MODEL at the given level, as a session would, "
        "save the optimized model to OUT and print what each pass changed.",
    )
    p.add_argument("model", help="path of the .onnx file")
    p.add_argument("-o", "--output", required=True, metavar="OUT",
                   help="where to save the optimized model")
    p.add_argument("--level", "-l", choices=list(LEVELS), default="all", metavar="LEVEL",
                   help="disable, basic, extended, layout or all (or 0/1/2/3/99), as "
                   "onnxruntime's GraphOptimizationLevel (default: all)")
    p.add_argument("--dim", "-d", action="append", metavar="NAME=VALUE",
                   help="fix the symbolic dimension NAME (a free-dimension override), so shape "
                   "computations over it fold to constants; repeatable")
    p.add_argument("--disable", action="append", metavar="PASS",
                   help="turn the named optimizer pass off; repeatable")
    p.add_argument("--check", action="store_true",
                   help="run onnx's checker on OUT and compare its outputs with the "
                   "unoptimized model's on random inputs")
    p.add_argument("--seed", type=int, default=0, help="seed of --check's random inputs")
    p.set_defaults(func=cmd_optimize)
    return p
