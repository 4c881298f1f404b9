"""The ``onnxrun`` command line.

``onnxrun info MODEL``
    Describe a model without running it: producer, IR version, opsets, inputs and outputs, the
    initializers' count and size, and how many nodes of each operator it holds.

``onnxrun run MODEL [--input NAME=FILE ...] [--dim NAME=VALUE ...] [--output-dir DIR] [-r N]``
    Run a model once on the inputs given (``.npy`` or ``.pb`` TensorProto files) and on random
    inputs for the others, print a summary of every output, and time the first run and the median
    of ``N`` more. Symbolic and unknown dimensions are 1 unless ``--dim`` names them.

``onnxrun bench MODEL [--vs onnxruntime] [-r N | -m SECONDS] [-x N] [--profile] ...``
    Time a model (median, p90, min, runs/s, creation time, peak memory), alternately with
    onnxruntime when asked; see ``onnxrun.tools.bench``.

``onnxrun optimize MODEL -o OUT [--level basic|extended|all|disable] [--check]``
    Optimize a model as a session would at that level, save it, and print what each pass
    changed and the node counts before and after; see ``onnxrun.tools.optimize``.

``onnxrun quantize MODEL -o OUT [--static --calibration-dir DIR] [--format qdq|qoperator]``
    Quantize a model to 8 bits (dynamic by default; static with calibration inputs) and print
    the size and operator changes; see ``onnxrun.quantization.command``.

Errors (a missing file, a malformed model, an input that does not fit) are reported on one line
and exit with status 1; ``--traceback`` shows the Python traceback instead.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from onnx import TensorProto, numpy_helper

from .. import dtypes
from ..errors import OnnxRunError

PROG = "onnxrun"


class CliError(Exception):
    """A mistake in the command line itself (a malformed --dim, an unknown input name...)."""


# ------------------------------------------------------------------------------------------------
# helpers shared by the commands


def _flatten(text: str) -> str:
    return " ".join(line.strip() for line in text.splitlines() if line.strip())


def _one_line(error: BaseException) -> str:
    return _flatten(str(error)) or type(error).__name__


def _parse_assignments(items: Sequence[str] | None, option: str) -> dict[str, str]:
    """``["a=1", "b=x.npy"]`` -> ``{"a": "1", "b": "x.npy"}``; the name may not be empty."""
    result: dict[str, str] = {}
    for item in items or ():
        name, sep, value = item.partition("=")  # a file path may hold "=", names rarely do
        if not sep or not name or not value:
            raise CliError(f"{option} expects NAME=VALUE, got '{item}'")
        result[name] = value
    return result


def _format_shape(shape: list[int | str | None] | None) -> str:
    if shape is None:
        return "unknown rank"
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


def _format_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def _table(rows: list[tuple[str, ...]], indent: str = "  ") -> list[str]:
    if not rows:
        return []
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return [
        indent + "  ".join(c.ljust(w) for c, w in zip(r[:-1], widths, strict=True)) + "  " + r[-1]
        for r in rows
    ]


# ------------------------------------------------------------------------------------------------
# onnxrun info


def cmd_info(args: argparse.Namespace) -> int:
    from ..load import load_model

    # The session's loader, so external data is found (and policed) exactly as a session does.
    _, model = load_model(args.model)
    g = model.graph
    out = [f"model:         {args.model} ({_format_bytes(os.path.getsize(args.model))})"]
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
        out.append(f"doc:           {_flatten(model.doc_string)[:200]}")
    for key, value in sorted(model.metadata_props.items()):
        out.append(f"metadata:      {key} = {_flatten(value)[:200]}")

    initializer_ids = {id(v) for v in g.initializers.values()}
    inputs = [v for v in g.inputs if id(v) not in initializer_ids]
    overridable = len(g.inputs) - len(inputs)

    def value_rows(values: list[Any]) -> list[str]:
        return _table([(v.name, dtypes.type_string(v.type), _value_shape(v)) for v in values])

    suffix = f" (+{overridable} initializers listed as inputs)" if overridable else ""
    out.append(f"inputs ({len(inputs)}){suffix}:")
    out.extend(value_rows(inputs))
    out.append(f"outputs ({len(g.outputs)}):")
    out.extend(value_rows(g.outputs))
    total = sum(int(v.const_value.nbytes) for v in g.initializers.values())
    out.append(f"initializers:  {len(g.initializers)}, {_format_bytes(total)} ({total} bytes)")
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
    out.extend(_table([(name, str(count)) for name, count in ordered]))
    print("\n".join(out))
    return 0


def _value_shape(v: Any) -> str:
    tp = v.type
    if tp is None or tp.WhichOneof("value") not in ("tensor_type", "sparse_tensor_type"):
        return ""
    return _format_shape(dtypes.type_shape(tp))


# ------------------------------------------------------------------------------------------------
# onnxrun run

_DTYPE_BY_NAME: dict[str, np.dtype] = {}
for _elem in TensorProto.DataType.values():
    try:
        _DTYPE_BY_NAME[dtypes.elem_name(_elem)] = dtypes.np_dtype(_elem)
    except TypeError:
        pass
_DTYPE_BY_NAME["string"] = np.dtype(object)


def _element_name(type_string: str) -> str | None:
    """``tensor(float)`` (or ``optional(tensor(float))``) -> ``float``; None for other types."""
    m = re.fullmatch(r"(?:optional\()?tensor\((\w+)\)\)?", type_string)
    return m.group(1) if m else None


def _resolve_shape(shape: list[int | str | None], dims: dict[str, int]) -> tuple[int, ...]:
    """Fixed dimensions as declared, named ones from --dim, every other one 1."""
    return tuple(d if isinstance(d, int) else dims.get(d, 1) if isinstance(d, str) else 1
                 for d in shape)


# Sub-byte integers hold fewer values than 0..9.
_INT_HIGH = {"int4": 8, "uint4": 16, "int2": 2, "uint2": 4}


def generate_input(element: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """A random tensor: floats standard normal, integers 0..9 (valid as small indices), random
    booleans, strings "a"."""
    dtype = _DTYPE_BY_NAME[element]
    if element == "string":
        return np.full(shape, "a", dtype=object)
    if element == "bool":
        return rng.random(shape) < 0.5
    if element.startswith(("int", "uint")):
        return rng.integers(0, _INT_HIGH.get(element, 10), size=shape).astype(dtype)
    if element.startswith("complex"):
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
    return rng.standard_normal(shape).astype(np.float32).astype(dtype)


def load_input(path: str) -> Any:
    """Read an input value from ``.npy`` or ``.pb`` (a serialized TensorProto)."""
    p = Path(path)
    if not p.is_file():
        raise CliError(f"input file '{path}' does not exist")
    if p.suffix == ".pb":
        tensor = TensorProto()
        try:
            tensor.ParseFromString(p.read_bytes())
            return numpy_helper.to_array(tensor)
        except Exception as e:
            raise CliError(f"'{path}' is not a serialized TensorProto: {_one_line(e)}") from None
    try:
        return np.load(p, allow_pickle=False)
    except Exception as e:
        raise CliError(f"cannot read '{path}' as a .npy array: {_one_line(e)}") from None


def describe(value: Any) -> str:
    """``float32 [1, 1000]``: a value's dtype and shape."""
    if isinstance(value, list):
        return f"sequence of {len(value)}"
    arr = np.asarray(value)
    return f"{arr.dtype} {_format_shape(list(arr.shape))}"


def summarize(value: Any, first: int = 5) -> str:
    """``float32 [1, 1000]  min=... max=... mean=...  first: [...]`` for one output value."""
    if value is None:
        return "empty optional"
    if isinstance(value, list):
        inner = ", ".join(describe(v) for v in value[:first])
        more = ", ..." if len(value) > first else ""
        return f"sequence of {len(value)}: [{inner}{more}]"
    if isinstance(value, dict):
        return f"map of {len(value)} entries"
    arr = np.asarray(value)
    head = describe(arr)
    if arr.size == 0:
        return f"{head}  (empty)"
    flat = arr.reshape(-1)[:first]
    if arr.dtype == object or arr.dtype.kind in "US":
        values = ", ".join(repr(x) for x in flat)
        return f"{head}  first: [{values}{', ...' if arr.size > first else ''}]"
    if arr.dtype == bool:
        values = ", ".join(str(bool(x)) for x in flat)
        stats = f"true={int(arr.sum())}/{arr.size}"
    elif arr.dtype.kind == "c":
        values = ", ".join(f"{x:.4g}" for x in flat)
        stats = f"mean={arr.mean():.6g}"
    else:
        wide = arr.astype(np.float64)  # also reads bfloat16 / float8 through ml_dtypes
        values = ", ".join(f"{x:.6g}" for x in wide.reshape(-1)[:first])
        stats = f"min={wide.min():.6g} max={wide.max():.6g} mean={wide.mean():.6g}"
        n_nan = int(np.isnan(wide).sum())
        if n_nan:
            stats += f" nan={n_nan}"
    return f"{head}  {stats}  first: [{values}{', ...' if arr.size > first else ''}]"


def _file_name(name: str, used: set[str]) -> str:
    base = re.sub(r"[^\w.-]", "_", name).strip(".") or "value"
    candidate, i = base, 1
    while candidate in used:
        candidate, i = f"{base}_{i}", i + 1
    used.add(candidate)
    return candidate


def _save(value: Any, folder: Path, stem: str) -> Path | None:
    if isinstance(value, np.ndarray):
        path = folder / f"{stem}.npy"
        np.save(path, value, allow_pickle=value.dtype == object)
        return path
    if isinstance(value, list) and all(isinstance(v, np.ndarray) for v in value):
        path = folder / f"{stem}.npz"
        np.savez(path, *value)
        return path
    return None


def cmd_run(args: argparse.Namespace) -> int:
    from ..api.options import SessionOptions
    from ..api.session import InferenceSession

    dims: dict[str, int] = {}
    for name, text in _parse_assignments(args.dim, "--dim").items():
        try:
            dims[name] = int(text)
        except ValueError:
            raise CliError(f"--dim {name}={text}: the value must be an integer") from None
        if dims[name] < 0:
            raise CliError(f"--dim {name}={text}: the value must be >= 0")
    files = _parse_assignments(args.input, "--input")

    t0 = time.perf_counter()
    session = InferenceSession(args.model, SessionOptions())
    load_ms = (time.perf_counter() - t0) * 1e3

    inputs = session.get_inputs()
    known = {a.name: a for a in [*inputs, *session.get_overridable_initializers()]}
    unknown = [n for n in files if n not in known]
    if unknown:
        raise CliError(
            f"--input {unknown[0]}: the model has no input of that name; its inputs are "
            f"{[a.name for a in inputs]}"
        )
    symbols = {d for a in inputs for d in (a.shape or ()) if isinstance(d, str)}
    notes = [f"--dim {n}: no input dimension has that name" for n in dims if n not in symbols]

    rng = np.random.default_rng(args.seed)
    feeds: dict[str, Any] = {}
    lines = []
    for name, path in files.items():
        feeds[name] = load_input(path)
        lines.append(f"  {name}: {describe(feeds[name])}  (from {path})")
    for a in inputs:
        if a.name in feeds:
            continue
        element = _element_name(a.type)
        if element is None or element not in _DTYPE_BY_NAME:
            raise CliError(
                f"input '{a.name}' has type {a.type}, which cannot be generated: "
                f"give it with --input {a.name}=FILE.npy"
            )
        shape = _resolve_shape(a.shape, dims)
        feeds[a.name] = generate_input(element, shape, rng)
        lines.append(f"  {a.name}: {describe(feeds[a.name])}  (random)")
    for note in notes:
        print(f"{PROG}: note: {note}", file=sys.stderr)

    t0 = time.perf_counter()
    outputs = session.run(None, feeds)
    first_ms = (time.perf_counter() - t0) * 1e3
    times = []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        session.run(None, feeds)
        times.append((time.perf_counter() - t0) * 1e3)

    out = [f"model: {args.model}  (session created in {load_ms:.1f} ms)", "inputs:"]
    out.extend(lines)
    out.append("outputs:")
    names = [o.name for o in session.get_outputs()]
    out.extend(f"  {n}: {summarize(v)}" for n, v in zip(names, outputs, strict=True))
    latency = f"latency: first run {first_ms:.2f} ms"
    if times:
        latency += (f", median of {len(times)} runs {statistics.median(times):.2f} ms "
                    f"(min {min(times):.2f} ms)")
    out.append(latency)

    if args.output_dir:
        folder = Path(args.output_dir)
        (folder / "inputs").mkdir(parents=True, exist_ok=True)
        used: set[str] = set()
        for n, v in zip(names, outputs, strict=True):
            saved = _save(v, folder, _file_name(n, used))
            out.append(f"saved {n} -> {saved}" if saved else f"not saved: {n} (not a tensor)")
        used_in: set[str] = set()
        for n, v in feeds.items():
            _save(np.asarray(v), folder / "inputs", _file_name(n, used_in))
        out.append(f"inputs saved under {folder / 'inputs'}")
    print("\n".join(out))
    return 0


# ------------------------------------------------------------------------------------------------
# entry point


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description="onnxrun: run and inspect ONNX models (an onnxruntime in Python)."
    )
    parser.add_argument("--traceback", action="store_true",
                        help="show the Python traceback of an error instead of one line")
    from .. import __version__

    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    # --traceback also after the command; SUPPRESS keeps the subparser from resetting it.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--traceback", action="store_true", default=argparse.SUPPRESS,
                        help=argparse.SUPPRESS)

    info = sub.add_parser("info", parents=[common], help="describe a model without running it")
    info.add_argument("model", help="path of the .onnx file")
    info.set_defaults(func=cmd_info)

    run = sub.add_parser(
        "run", parents=[common], help="run a model on given or random inputs and time it",
        description="Run MODEL once on the inputs given and random ones for the rest (floats "
        "standard normal, integers 0..9, random booleans, strings 'a'; symbolic dimensions 1 "
        "unless --dim names them), print each output and the latency.",
    )
    run.add_argument("model", help="path of the .onnx file")
    run.add_argument("--input", "-i", action="append", metavar="NAME=FILE",
                     help="read input NAME from FILE (.npy, or .pb TensorProto); repeatable")
    run.add_argument("--dim", "-d", action="append", metavar="NAME=VALUE",
                     help="value of the symbolic dimension NAME (default 1); repeatable")
    run.add_argument("--output-dir", "-o", metavar="DIR",
                     help="save every output as DIR/NAME.npy and the inputs under DIR/inputs/")
    run.add_argument("-r", "--repeat", type=int, default=5, metavar="N",
                     help="timed runs after the first (default 5; 0: the first run only)")
    run.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    run.set_defaults(func=cmd_run)

    from . import bench  # `onnxrun bench`: latency, optionally against onnxruntime

    bench.add_parser(sub, [common])
    from . import optimize  # `onnxrun optimize`: the graph optimizer, its report, the result

    optimize.add_parser(sub, [common])
    from ..quantization import command as quantize  # `onnxrun quantize`: int8 models

    quantize.add_parser(sub, [common])
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "repeat", 0) < 0:
        parser.error("-r/--repeat must be >= 0")
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except (CliError, OnnxRunError, OSError, ValueError, TypeError) as e:
        if args.traceback:
            raise
        print(f"{PROG}: error: {_one_line(e)}", file=sys.stderr)
        return 1
    except Exception as e:  # a bug: still one line, with the way to see more
        if args.traceback:
            raise
        print(f"{PROG}: internal error: {type(e).__name__}: {_one_line(e)} "
              "(rerun with --traceback for details)", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
