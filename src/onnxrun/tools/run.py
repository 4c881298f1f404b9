"""``onnxrun run MODEL [--input NAME=FILE ...] [--dim NAME=VALUE ...] [--output-dir DIR] [-r N]``:
run a model once on the inputs given (``.npy`` or ``.pb`` TensorProto files) and on random inputs
for the others, print a summary of every output, and time the first run and the median of ``N``
more. Symbolic and unknown dimensions are 1 unless ``--dim`` names them."""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from .common import PROG, describe, make_feeds, parse_assignments, parse_dims


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

    dims = parse_dims(args.dim)
    files = parse_assignments(args.input, "--input")

    t0 = time.perf_counter()
    session = InferenceSession(args.model, SessionOptions())
    load_ms = (time.perf_counter() - t0) * 1e3

    inputs = session.get_inputs()
    symbols = {d for a in inputs for d in (a.shape or ()) if isinstance(d, str)}
    notes = [f"--dim {n}: no input dimension has that name" for n in dims if n not in symbols]

    feeds, lines = make_feeds(session, files, dims, args.seed)
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
    out.extend(f"  {line}" for line in lines)
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


def add_parser(sub: Any, parents: list[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    run = sub.add_parser(
        "run", parents=parents, help="run a model on given or random inputs and time it",
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
    return run
