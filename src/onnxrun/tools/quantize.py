"""``onnxrun quantize MODEL -o OUT``: the quantization tool as a command.

Dynamic quantization by default (int8 weights, activations quantized at run time); ``--static``
calibrates activations on ``--calibration-dir DIR``, a folder of ``.npy`` files, one per model
input and batch: ``<input>.npy`` (one batch, or the same value for every batch) or
``<input>_<i>.npy`` (batch ``i``; inputs whose name is not a valid file name are looked up with
every character other than letters, digits, ``.``, ``-`` and ``_`` replaced by ``_``). The
static model is written in the QDQ format unless ``--format qoperator``.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import time
from pathlib import Path
from typing import Any

import numpy as np

from .common import CliError, format_bytes, table

_TYPES = {"int8": "QInt8", "uint8": "QUInt8", "int16": "QInt16", "uint16": "QUInt16",
          "int4": "QInt4", "uint4": "QUInt4"}
_METHODS = {"minmax": "MinMax", "entropy": "Entropy", "percentile": "Percentile"}


def _file_stem(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)


def calibration_feeds(folder: str | Path, input_names: list[str]) -> list[dict[str, np.ndarray]]:
    """The batches of ``folder``: ``<input>.npy`` and ``<input>_<i>.npy`` files, by batch index."""
    folder = Path(folder)
    if not folder.is_dir():
        raise CliError(f"calibration folder '{folder}' does not exist")
    files = {p.name: p for p in folder.iterdir() if p.suffix == ".npy"}
    per_input: dict[str, dict[int, Path]] = {}
    shared: dict[str, Path] = {}
    for name in input_names:
        batches: dict[int, Path] = {}
        for stem in dict.fromkeys([name, _file_stem(name)]):
            if f"{stem}.npy" in files:
                shared[name] = files[f"{stem}.npy"]
            pattern = re.compile(re.escape(stem) + r"_(\d+)\.npy")
            for fname, path in files.items():
                m = pattern.fullmatch(fname)
                if m:
                    batches[int(m.group(1))] = path
        if not batches and name not in shared:
            raise CliError(f"no calibration data for input '{name}' in '{folder}' (expected "
                           f"{_file_stem(name)}.npy or {_file_stem(name)}_0.npy, ...)")
        per_input[name] = batches
    indices = sorted({i for b in per_input.values() for i in b})
    for name, batches in per_input.items():
        if batches and sorted(batches) != indices:
            missing = sorted(set(indices) - set(batches))
            raise CliError(f"input '{name}' lacks calibration batch(es) {missing} in '{folder}'")
    if not indices:
        indices = [0]
    feeds = []
    for i in indices:
        feeds.append({name: np.load(per_input[name][i] if i in per_input[name] else shared[name])
                      for name in input_names})
    return feeds


def _op_counts(path: str) -> collections.Counter:
    import onnx

    model = onnx.load(path, load_external_data=False)
    return collections.Counter(
        f"{'' if n.domain in ('', 'ai.onnx') else n.domain + ':'}{n.op_type}"
        for n in model.graph.node)


def cmd_quantize(args: argparse.Namespace) -> int:
    from ..quantization import (
        CalibrationMethod,
        FeedsDataReader,
        QuantFormat,
        QuantType,
        quant_pre_process,
        quantize_dynamic,
        quantize_static,
    )

    if not os.path.isfile(args.model):
        raise CliError(f"model file '{args.model}' does not exist")
    if os.path.abspath(args.output) == os.path.abspath(args.model):
        raise CliError("-o/--output names the model itself: write the result elsewhere")
    if args.calibration_dir and not args.static:
        raise CliError("--calibration-dir is for --static quantization")
    if args.static and not args.calibration_dir:
        raise CliError("--static needs --calibration-dir DIR (a folder of .npy inputs)")
    op_types = [t for t in (args.op_types or "").split(",") if t] or None
    weight_type = QuantType[_TYPES[args.weight_type]]
    model: Any = args.model
    t0 = time.perf_counter()
    if args.preprocess:
        model = quant_pre_process(args.model)
    if args.static:
        import onnx

        proto = model if not isinstance(model, str) else onnx.load(model, load_external_data=False)
        inits = {t.name for t in proto.graph.initializer}
        names = [i.name for i in proto.graph.input if i.name not in inits]
        feeds = calibration_feeds(args.calibration_dir, names)
        quantize_static(
            model, args.output, FeedsDataReader(feeds),
            quant_format=QuantFormat.QOperator if args.format == "qoperator" else QuantFormat.QDQ,
            op_types_to_quantize=op_types, per_channel=args.per_channel,
            reduce_range=args.reduce_range,
            activation_type=QuantType[_TYPES[args.activation_type]], weight_type=weight_type,
            nodes_to_exclude=args.exclude,
            calibrate_method=CalibrationMethod[_METHODS[args.calibrate_method]],
            extra_options={"CalibShowProgress": not args.quiet})
        what = f"static {args.format}, {len(feeds)} calibration batch(es), " \
               f"{args.calibrate_method}"
    else:
        quantize_dynamic(model, args.output, op_types_to_quantize=op_types,
                         per_channel=args.per_channel, reduce_range=args.reduce_range,
                         weight_type=weight_type, nodes_to_exclude=args.exclude)
        what = "dynamic"
    elapsed = time.perf_counter() - t0
    before, after = os.path.getsize(args.model), os.path.getsize(args.output)
    out = [f"quantized ({what}, weights {args.weight_type}"
           f"{', per channel' if args.per_channel else ''}) in {elapsed:.2f} s",
           f"saved: {args.output}: {format_bytes(after)} "
           f"({100.0 * after / max(before, 1):.1f}% of {format_bytes(before)})"]
    old, new = _op_counts(args.model), _op_counts(args.output)
    changed = sorted((op for op in {*old, *new} if old[op] != new[op]),
                     key=lambda op: (-abs(old[op] - new[op]), op))
    if changed:
        out.append("nodes per operator (before -> after):")
        out.extend(table([(op, str(old[op]), "->", str(new[op])) for op in changed]))
    print("\n".join(out))
    return 0


def add_parser(sub: Any, parents: list[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "quantize", parents=parents, help="quantize a model to 8-bit integers",
        description="Quantize MODEL and save it to OUT: dynamically by default (int8 weights, "
        "activations quantized at run time), or statically with --static, activations "
        "calibrated on the .npy inputs of --calibration-dir (<input>.npy or <input>_<i>.npy).",
    )
    p.add_argument("model", help="path of the float .onnx file")
    p.add_argument("-o", "--output", required=True, metavar="OUT",
                   help="where to save the quantized model")
    p.add_argument("--static", action="store_true",
                   help="static quantization, calibrated on --calibration-dir")
    p.add_argument("--calibration-dir", metavar="DIR",
                   help="folder of .npy calibration inputs: <input>.npy or <input>_<i>.npy")
    p.add_argument("--format", choices=["qdq", "qoperator"], default="qdq",
                   help="static model format (default qdq)")
    p.add_argument("--per-channel", action="store_true",
                   help="one scale per output channel of each weight")
    p.add_argument("--reduce-range", action="store_true", help="7-bit weights")
    p.add_argument("--weight-type", choices=list(_TYPES), default="int8",
                   help="weight type (default int8)")
    p.add_argument("--activation-type", choices=list(_TYPES), default="int8",
                   help="activation type of --static (default int8)")
    p.add_argument("--calibrate-method", choices=list(_METHODS), default="minmax",
                   help="how --static turns calibration data into ranges (default minmax)")
    p.add_argument("--op-types", metavar="OPS",
                   help="comma-separated operator types to quantize (default: all supported)")
    p.add_argument("--exclude", action="append", metavar="NODE",
                   help="leave the named node float; repeatable")
    p.add_argument("--preprocess", action="store_true",
                   help="optimize (basic level) and shape-infer the model first")
    p.add_argument("-q", "--quiet", action="store_true", help="no calibration progress bar")
    p.set_defaults(func=cmd_quantize)
    return p


__all__ = ["add_parser", "calibration_feeds", "cmd_quantize"]
