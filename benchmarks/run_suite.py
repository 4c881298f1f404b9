"""Run onnxrun's fixed benchmark suite against onnxruntime and write the table in
docs/PERFORMANCE.md (between the ``<!-- suite:begin -->`` and ``<!-- suite:end -->`` markers, or
those of ``--marker NAME``).

    python benchmarks/run_suite.py            # the whole suite (2 to 10 minutes on 2 cores)
    python benchmarks/run_suite.py --quick    # a subset, fewer runs (a few minutes)
    python benchmarks/run_suite.py --dry-run  # print the table, leave the doc alone

Every case goes through the same code as ``onnxrun bench --vs onnxruntime``
(``onnxrun.tools.bench.bench``): both engines in this process, run alternately, with the same
session options; each case runs with 1 and with 2 intra-op threads; session creation and peak
memory come from a fresh child process per engine (once per case, 1 thread). The suite:

- the nine light model-zoo CNNs shipped in the onnx package (onnx/backend/test/data/light; their
  batch is fixed at 1), on random inputs;
- the models of scripts/generate_bench_models.py, if they are in the cache folder (run that
  script first; it needs torch): BERT (MiniLM-L6 configuration, 2 x 128 tokens), a GPT-style
  decoder (32 tokens), MobileNetV2 at batch 1 and 8, an LSTM tagger (128 tokens);
- the model classes of issue #18, built by benchmarks/suite_models.py with onnx.helper (no
  torch; written to the cache folder on first use): a YOLOv8n-style detector, a DBNet-style text
  detector, CRNN and SVTR-style recognizers, a VAD-style streaming model (an If and one LSTM
  step per 512-sample chunk), DenseNet-121-style dense blocks and GoogLeNet Inception modules;
- a micro-benchmark: a chain of 1,000 tiny elementwise nodes (Add and Mul on 16 floats), whose
  median over 1,000 is the engine's cost per node.

A second table (``<!-- quant:begin -->`` / ``<!-- quant:end -->``; ``--only-quant`` runs it
alone) compares each generated model with its int8 and float16 variants on onnxrun: dynamic int8
(``quantize_dynamic``, per tensor and per channel), static int8 QDQ (``quantize_static`` over a
few random calibration batches) and float16 (``convert_float_to_float16``, float32 inputs and
outputs kept). The variants are written next to the float32 model in the cache folder the first
time (or when the float32 model is newer), with onnxrun's own tools: no torch needed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from onnxrun.tools.bench import (
    ENGINE,
    REFERENCE,
    SETTLE_SECONDS,
    BenchOptions,
    BenchResult,
    bench,
    create_session,
    fmt_time,
    time_alternating,
)
from onnxrun.tools.common import make_feeds

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "PERFORMANCE.md"
BEGIN, END = "<!-- suite:begin -->", "<!-- suite:end -->"
LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
CHAIN_NODES = 1000

QUICK_ZOO = {"squeezenet", "shufflenet", "resnet50"}
QUICK_SUITE_MODELS = {"yolo_style", "crnn_style", "vad_style", "densenet_style"}


@dataclass
class Case:
    name: str
    model: str
    input: str  # what the row says about the input, e.g. "1x3x224x224"
    files: dict[str, str] = field(default_factory=dict)
    dims: dict[str, int] = field(default_factory=dict)
    quick: bool = True
    per_node: int = 0  # micro-benchmark: report the median divided by this many nodes


def default_cache() -> Path:
    return Path(os.environ.get("ONNXRUN_BENCH_CACHE") or Path.home() / ".cache" / "onnxrun-bench")


def zoo_cases() -> list[Case]:
    cases = []
    for path in sorted(LIGHT.glob("light_*.onnx")):
        name = path.stem[len("light_"):]
        cases.append(Case(f"zoo {name}", str(path), "1x3x224x224", quick=name in QUICK_ZOO))
    return cases


def suite_model_cases(cache: Path, words: list[str], quick: bool) -> list[Case]:
    """The models of suite_models.py that ``words`` and ``quick`` select (as in main), written
    to ``cache`` first where missing."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    try:
        import suite_models
    finally:
        sys.path.pop(0)
    cases = []
    for name, (_, label, shape) in suite_models.MODELS.items():
        if (quick and name not in QUICK_SUITE_MODELS) or \
                (words and not any(w in label.lower() for w in words)):
            continue
        path = suite_models.ensure(name, cache)
        files = {p.stem: str(p) for p in sorted(path.parent.glob("*.npy"))}
        cases.append(Case(label, str(path), shape, files, quick=name in QUICK_SUITE_MODELS))
    return cases


def generated_cases(cache: Path) -> tuple[list[Case], list[str]]:
    def files(name: str) -> dict[str, str]:
        return {p.stem: str(p) for p in sorted((cache / name).glob("*.npy"))}

    specs = [
        ("bert_minilm_l6", "BERT MiniLM-L6", "2x128 tokens", {}, True),
        ("gpt_decoder", "GPT decoder 4x256", "1x32 tokens", {}, True),
        ("mobilenet_v2", "MobileNetV2", "1x3x224x224", {}, True),
        ("mobilenet_v2", "MobileNetV2", "8x3x224x224", {"batch": 8}, False),
        ("lstm_tagger", "LSTM 2x256 bidir", "1x128 tokens", {}, True),
    ]
    cases, missing = [], []
    for folder, label, shape, dims, quick in specs:
        model = cache / folder / "model.onnx"
        if not model.is_file():
            if folder not in missing:
                missing.append(folder)
            continue
        # A batch other than the stored inputs': generated inputs of that size instead.
        given = {} if dims else files(folder)
        cases.append(Case(label, str(model), shape, given, dims, quick))
    return cases, missing


# (cache folder, label, input, variants): which variants each generated model is measured in
QUANT_MODELS = [
    ("bert_minilm_l6", "BERT MiniLM-L6", "2x128 tokens", ("int8", "int8pc", "fp16")),
    ("gpt_decoder", "GPT decoder 4x256", "1x32 tokens", ("int8", "fp16")),
    ("mobilenet_v2", "MobileNetV2", "1x3x224x224", ("qdq", "int8", "fp16")),
    ("lstm_tagger", "LSTM 2x256 bidir", "1x128 tokens", ("int8",)),
]
VARIANTS = {
    "fp32": "float32",
    "int8": "int8 dynamic",
    "int8pc": "int8 dynamic, per channel",
    "qdq": "int8 static QDQ",
    "fp16": "float16",
}
CALIBRATION_BATCHES = 4


def make_variant(fp32: Path, variant: str, out: Path) -> None:
    """Write ``variant`` of the float32 model ``fp32`` to ``out`` with onnxrun's tools."""
    from onnxrun import quantization as q

    if variant in ("int8", "int8pc"):
        q.quantize_dynamic(fp32, out, per_channel=variant == "int8pc")
    elif variant == "qdq":
        import onnxrun

        session = onnxrun.InferenceSession(str(fp32))
        rng = np.random.default_rng(0)
        batches = []
        for _ in range(CALIBRATION_BATCHES):
            batches.append({i.name: rng.uniform(-1, 1, [d if isinstance(d, int) else 1
                                                        for d in i.shape]).astype(np.float32)
                            for i in session.get_inputs()})
        q.quantize_static(fp32, out, q.FeedsDataReader(batches), quant_format=q.QuantFormat.QDQ,
                          per_channel=True)
    elif variant == "fp16":
        from onnxrun.transformers.float16 import convert_float_to_float16

        onnx.save(convert_float_to_float16(onnx.load(str(fp32)), keep_io_types=True), str(out))
    else:
        raise ValueError(f"unknown variant {variant!r}")


def quant_cases(cache: Path, words: list[str]) -> list[tuple[Case, str, str]]:
    """(case, model label, variant) for every generated model in the cache whose label contains
    one of ``words`` (all without), the float32 original first; variants missing or older than
    it are made first."""
    out = []
    for folder, label, shape, variants in QUANT_MODELS:
        fp32 = cache / folder / "model.onnx"
        if not fp32.is_file() or (words and not any(w in label.lower() for w in words)):
            continue
        files = {p.stem: str(p) for p in sorted((cache / folder).glob("*.npy"))}
        out.append((Case(label, str(fp32), shape, files), label, "fp32"))
        for v in variants:
            path = cache / folder / f"model.{v}.onnx"
            if not path.is_file() or path.stat().st_mtime < fp32.stat().st_mtime:
                print(f"making {path} ...", file=sys.stderr, flush=True)
                make_variant(fp32, v, path)
            out.append((Case(f"{label} {VARIANTS[v]}", str(path), shape, files), label, v))
    return out


def chain_model(path: Path, n: int = CHAIN_NODES) -> Case:
    """Y = (...((X + X) * 0.5 + X) * 0.5 ...), n nodes: the cost of a node and nothing else. Adding
    the input (not a constant) between the Muls leaves no chain of constants for an optimizer to
    fold, and 0.5 is no no-op to remove; the values stay near X."""
    half = helper.make_tensor("half", TensorProto.FLOAT, [], [0.5])
    nodes, prev = [], "X"
    for i in range(n):
        out = "Y" if i == n - 1 else f"t{i}"
        other = "X" if i % 2 == 0 else "half"
        nodes.append(helper.make_node("Add" if i % 2 == 0 else "Mul", [prev, other], [out]))
        prev = out
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("X", 1, [1, 16])],
                              [helper.make_tensor_value_info("Y", 1, [1, 16])], [half])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.save(model, str(path))
    return Case(f"chain of {n} elementwise nodes", str(path), "1x16", per_node=n)


# ------------------------------------------------------------------------------------------------
# conditions


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = ""
    try:
        with open("/proc/meminfo", encoding="utf-8") as f:
            kib = int(f.readline().split()[1])
            mem = f", {kib / 2**20:.0f} GiB RAM"
    except (OSError, ValueError, IndexError):
        pass
    cores = f"{os.cpu_count()} logical cores"
    if hasattr(os, "sched_getaffinity") and len(os.sched_getaffinity(0)) != os.cpu_count():
        cores = f"{len(os.sched_getaffinity(0))} of {os.cpu_count()} logical cores usable"
    return f"{cpu}, {cores}{mem}, {platform.system()} {platform.release()}"


def blas() -> str:
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return "unknown (threadpoolctl not installed)"
    libs = [f"{i.get('internal_api')} {i.get('version')}" for i in threadpool_info()
            if i.get("user_api") == "blas"]
    return ", ".join(libs) or "none found"


def compiled_status() -> str:
    """The compiled kernels' target here, or why there is none (then every kernel is numpy)."""
    from onnxrun.providers.cpu import compiled

    reason = compiled.why_unavailable()
    if reason:
        return f"unavailable ({reason})"
    return f"target {compiled.target().name}"


def load() -> str:
    try:
        return "/".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def versions() -> str:
    import onnxruntime

    import onnxrun

    return (f"onnxrun {onnxrun.__version__}, onnxruntime {onnxruntime.__version__}, numpy "
            f"{np.__version__}, onnx {onnx.__version__}, Python {platform.python_version()}")


# ------------------------------------------------------------------------------------------------
# tables


def geomean(values: list[float]) -> float | None:
    values = [v for v in values if v is not None and v > 0 and math.isfinite(v)]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def mib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**20:.1f}"


def ab_cases(names, words: list[str]) -> list[tuple[str, str, dict | None]]:
    """(label, model path, feeds or None for random ones) of ``names`` that ``words`` select
    (by name or label), for the scripts that compare onnxrun variants in one process
    (cnn_gain.py, layout_gain.py): "zoo:NAME" a light zoo model, "bench:FOLDER" a model
    scripts/generate_bench_models.py wrote to the cache (MobileNetV2: bench:mobilenet_v2;
    skipped where missing), else a suite_models.py model, written to the cache first where
    missing."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    try:
        import suite_models
    finally:
        sys.path.pop(0)
    out = []
    for name in names:
        zoo, bench = name.startswith("zoo:"), name.startswith("bench:")
        label = f"zoo {name[4:]}" if zoo else name[6:] if bench else suite_models.MODELS[name][1]
        if words and not any(w in (name + " " + label).lower() for w in words):
            continue
        if zoo:
            out.append((label, str(LIGHT / f"light_{name[4:]}.onnx"), None))
            continue
        path = default_cache() / name[6:] / "model.onnx" if bench else \
            suite_models.ensure(name, default_cache())
        if not path.is_file():
            print(f"{name}: not generated ({path}; scripts/generate_bench_models.py)")
            continue
        feeds = {p.stem: np.load(p) for p in sorted(path.parent.glob("*.npy"))}
        out.append((label, str(path), feeds))
    return out


def markdown(header: list[str], rows: list[list[str]]) -> list[str]:
    align = ["---"] + ["--:"] * (len(header) - 1)
    return ["| " + " | ".join(r) + " |" for r in [header, align, *rows]]


def latency_table(runs: list[tuple[Case, int, BenchResult]], threads: list[int]) -> list[str]:
    header = ["model", "input"]
    for t in threads:
        header += [f"onnxrun {t}T", f"onnxruntime {t}T", f"ratio {t}T"]
    by_case: dict[int, dict[int, BenchResult]] = {}
    cases: dict[int, Case] = {}
    for case, t, r in runs:
        if case.per_node:
            continue
        by_case.setdefault(id(case), {})[t] = r
        cases[id(case)] = case
    rows, ratios = [], {t: [] for t in threads}
    for key, per_thread in by_case.items():
        row = [cases[key].name, cases[key].input]
        for t in threads:
            r = per_thread.get(t)
            a = r.engine(ENGINE) if r else None
            b = r.engine(REFERENCE) if r else None
            x = r.ratio(lambda e: e.stats.median) if r else None
            ratios[t].append(x)
            row += [fmt_time(a.stats.median) if a else "-", fmt_time(b.stats.median) if b else "-",
                    ratio(x)]
        rows.append(row)
    gm = ["**geometric mean**", ""]
    for t in threads:
        gm += ["", "", f"**{ratio(geomean(ratios[t]))}**"]
    rows.append(gm)
    return markdown(header, rows)


def compiled_cell(iso) -> str:
    """The compiled modules onnxrun's child loaded for the case ('none': all numpy)."""
    if iso is None or iso.compiled is None:
        return "-"
    return ", ".join(iso.compiled) or "none"


def session_table(runs: list[tuple[Case, int, BenchResult]]) -> list[str]:
    header = ["model", "input", "create onnxrun", "create onnxruntime", "ratio",
              "peak + onnxrun (MiB)", "peak + onnxruntime (MiB)", "ratio", "compiled kernels"]
    rows, create_ratios, mem_ratios = [], [], []
    for case, _, r in runs:
        a, b = r.engine(ENGINE), r.engine(REFERENCE)
        if a is None or b is None or (a.isolated is None and b.isolated is None):
            continue
        ia, ib = a.isolated, b.isolated
        cr = r.ratio(lambda e: None if e.isolated is None else e.isolated.create_s)
        mr = r.ratio(lambda e: None if e.isolated is None else float(e.isolated.delta_bytes))
        create_ratios.append(cr)
        mem_ratios.append(mr)
        rows.append([case.name, case.input, fmt_time(ia.create_s if ia else None),
                     fmt_time(ib.create_s if ib else None), ratio(cr),
                     mib(ia.delta_bytes if ia else None), mib(ib.delta_bytes if ib else None),
                     ratio(mr), compiled_cell(ia)])
    rows.append(["**geometric mean**", "", "", "", f"**{ratio(geomean(create_ratios))}**", "", "",
                 f"**{ratio(geomean(mem_ratios))}**", ""])
    return markdown(header, rows)


def interleaved_ratios(variants: list[tuple[Case, str, str]], threads: list[int],
                       args: argparse.Namespace) -> dict[tuple[int, int], float]:
    """(id(variant case), threads) -> the variant's onnxrun median over its float32 original's,
    both sessions in this process and run in turn (A B, B A, ...): on a shared VM whose speed
    drifts by tens of percent between the separate engine-vs-engine runs, only an interleaved
    comparison says which of two models is faster."""
    import onnxrun

    originals = {label: c for c, label, v in variants if v == "fp32"}
    out: dict[tuple[int, int], float] = {}
    for case, label, v in variants:
        fp32 = originals.get(label)
        if v == "fp32" or fp32 is None:
            continue
        for t in threads:
            opts = BenchOptions(warmup=args.warmup, repeat=args.repeat, intra_op_threads=t)
            try:
                a, _ = create_session(onnxrun, case.model, opts)
                b, _ = create_session(onnxrun, fp32.model, opts)
                feeds, _ = make_feeds(a, case.files, case.dims)
                # at 2+ threads, idle BLAS threads spin after a run: let them settle first
                times, _ = time_alternating([lambda a=a, f=feeds: a.run(None, f),
                                             lambda b=b, f=feeds: b.run(None, f)],
                                            max(args.warmup, 1), args.repeat,
                                            settle=SETTLE_SECONDS if t > 1 else 0.0)
            except Exception as e:  # a failing variant must not sink the table
                print(f"interleaved {case.name}: {type(e).__name__}: {e}", file=sys.stderr)
                continue
            out[(id(case), t)] = float(np.median(times[0]) / np.median(times[1]))
            print(f"[vs float32] {case.name}, {t} thread(s): "
                  f"{ratio(out[(id(case), t)])}", file=sys.stderr, flush=True)
    return out


def quant_table(runs: list[tuple[Case, int, BenchResult]], labels: dict[int, tuple[str, str]],
                threads: list[int], interleaved: dict[tuple[int, int], float] | None = None
                ) -> list[str]:
    header = ["model", "variant"]
    for t in threads:
        header += [f"onnxrun {t}T", f"vs float32 {t}T", f"onnxruntime {t}T"]
    header += ["file (MiB)", "peak + onnxrun (MiB)"]
    by_case: dict[int, dict[int, BenchResult]] = {}
    cases: dict[int, Case] = {}
    for case, t, r in runs:
        by_case.setdefault(id(case), {})[t] = r
        cases[id(case)] = case
    fp32: dict[tuple[str, int], float] = {}
    rows = []
    for key, per_thread in by_case.items():
        label, variant = labels[key]
        row = [label, VARIANTS[variant]]
        iso = None
        for t in threads:
            r = per_thread.get(t)
            a = r.engine(ENGINE) if r else None
            b = r.engine(REFERENCE) if r else None
            if a is not None and variant == "fp32":
                fp32[(label, t)] = a.stats.median
            base = fp32.get((label, t))
            vs = (interleaved or {}).get((key, t))
            if vs is None and variant != "fp32":
                vs = a.stats.median / base if a and base else None
            row += [fmt_time(a.stats.median) if a else "-",
                    ratio(1.0 if variant == "fp32" and a else vs),
                    fmt_time(b.stats.median) if b else "-"]
            if a is not None and a.isolated is not None:
                iso = a.isolated
        row += [mib(os.path.getsize(cases[key].model)), mib(iso.delta_bytes if iso else None)]
        rows.append(row)
    return markdown(header, rows)


def quant_section(runs: list[tuple[Case, int, BenchResult]], labels: dict[int, tuple[str, str]],
                  threads: list[int], args: argparse.Namespace, started: str,
                  interleaved: dict[tuple[int, int], float] | None = None) -> str:
    lines = [
        f"Quantized and float16 variants, run {started}: {args.warmup} warm-up + {args.repeat} "
        f"timed runs per engine and case; intra-op threads {' and '.join(map(str, threads))}.",
        "",
        f"- Machine: {machine()}; BLAS: {blas()}; load average before: {load()}.",
        f"- Versions: {versions()}.",
        "",
        "'vs float32' = the variant's onnxrun median over the float32 model's onnxrun median, "
        "the two onnxrun sessions run in turn in one process (below 1: the variant is faster; "
        "the absolute columns come from separate runs against onnxruntime, and this VM's "
        "speed drifts between them); onnxruntime runs the same file, for reference; "
        "'peak + onnxrun' is the peak resident size of a fresh onnxrun process after creating "
        "the session and one run (1 thread), minus the peak before.",
        "",
    ]
    return "\n".join(lines + quant_table(runs, labels, threads, interleaved))


def run_cases(cases: list[Case], threads: list[int], args: argparse.Namespace
              ) -> list[tuple[Case, int, BenchResult]]:
    runs: list[tuple[Case, int, BenchResult]] = []
    for case in cases:
        # The micro-benchmark measures per-node overhead: one thread count is enough.
        for i, t in enumerate(threads[:1] if case.per_node else threads):
            opts = BenchOptions(warmup=args.warmup, repeat=args.repeat, intra_op_threads=t,
                                isolate=i == 0 and not case.per_node)
            print(f"[{len(runs) + 1}] {case.name} {case.input}, {t} thread(s) ...", end=" ",
                  file=sys.stderr, flush=True)
            try:
                r = bench(case.model, opts, files=case.files, dims=case.dims, vs=REFERENCE)
            except Exception as e:  # one failing model must not sink the suite
                print(f"failed: {type(e).__name__}: {e}", file=sys.stderr)
                continue
            runs.append((case, t, r))
            print(f"onnxrun {fmt_time(r.engines[0].stats.median)}, onnxruntime "
                  f"{fmt_time(r.engines[1].stats.median)}, ratio "
                  f"{ratio(r.ratio(lambda e: e.stats.median))}", file=sys.stderr, flush=True)
    return runs


def baselines(runs: list[tuple[Case, int, BenchResult]]) -> str:
    """The child processes' footprint before any session: the import cost of each engine."""
    parts = []
    for name in (ENGINE, REFERENCE):
        values = [e.isolated.baseline_bytes for _, _, r in runs for e in r.engines
                  if e.name == name and e.isolated is not None]
        if values:
            parts.append(f"{name} {np.median(values) / 2**20:.0f} MiB")
    return ", ".join(parts)


def micro_lines(runs: list[tuple[Case, int, BenchResult]]) -> list[str]:
    out = []
    for case, t, r in runs:
        if not case.per_node:
            continue
        a, b = r.engine(ENGINE), r.engine(REFERENCE)
        per = [f"{e.stats.median / case.per_node * 1e6:.2f} µs" if e else "-" for e in (a, b)]
        out.append(f"- {case.name} ({case.input} floats, {t} thread): onnxrun {per[0]} per node "
                   f"(median {fmt_time(a.stats.median) if a else '-'} per run), "
                   f"onnxruntime {per[1]} per node, ratio "
                   f"{ratio(r.ratio(lambda e: e.stats.median))}")
    return out


def section(runs: list[tuple[Case, int, BenchResult]], threads: list[int], args: argparse.Namespace,
            started: str, load_before: str, load_after: str, missing: list[str]) -> str:
    mode = "quick mode (a subset of the cases)" if args.quick else "full suite"
    lines = [
        f"Suite run: {started}, {mode}; {args.warmup} warm-up + {args.repeat} timed runs per "
        f"engine and case, engines alternating; intra-op threads "
        f"{' and '.join(map(str, threads))}.",
        "",
        f"- Machine: {machine()}; BLAS: {blas()}; compiled kernels: {compiled_status()}.",
        f"- Load average (1/5/15 min) before: {load_before}, after: {load_after}.",
        f"- Versions: {versions()}.",
    ]
    if args.note:
        lines.append(f"- Note: {args.note.rstrip('.')}.")
    if missing:
        lines.append(f"- Not run (not generated; see scripts/generate_bench_models.py): "
                     f"{', '.join(missing)}.")
    lines += ["", "Latency, median per run (ratio = onnxrun / onnxruntime; above 1: onnxrun is "
              "slower):", ""]
    lines += latency_table(runs, threads)
    iso = [x for x in runs if any(e.isolated is not None for e in x[2].engines)]
    if iso:
        lines += ["", "Session creation and peak memory, each engine in a fresh child process "
                  "(1 intra-op thread; 'peak +' is the peak resident size after creating the "
                  "session and one run, minus the peak before it; the child's footprint before "
                  f"the session, median over the cases: {baselines(iso)}):", ""]
        lines += session_table(iso)
    micro = micro_lines(runs)
    if micro:
        lines += ["", "Micro-benchmark (per-node overhead):", ""] + micro
    return "\n".join(lines)


def write_doc(path: Path, text: str, marker: str = "suite",
              title: str = "Latest suite results") -> None:
    begin, end = f"<!-- {marker}:begin -->", f"<!-- {marker}:end -->"
    block = f"{begin}\n{text}\n{end}"
    old = path.read_text(encoding="utf-8") if path.is_file() else "# Performance\n"
    if begin in old and end in old:
        head, rest = old.split(begin, 1)
        new = head + block + rest.split(end, 1)[1]
    else:
        new = old.rstrip("\n") + f"\n\n## {title}\n\n" + block + "\n"
    path.write_text(new, encoding="utf-8")


# ------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="a subset of the models, 5 runs per case unless -r says otherwise")
    parser.add_argument("-r", "--repeat", type=int, default=None,
                        help="timed runs per engine and case (default 10; --quick 5)")
    parser.add_argument("-w", "--warmup", type=int, default=1, help="warm-up runs (default 1)")
    parser.add_argument("--threads", default="1,2", help="intra-op thread counts (default 1,2)")
    parser.add_argument("--models", default="",
                        help="run only the cases whose name contains one of these "
                        "comma-separated words")
    parser.add_argument("--cache", type=Path, default=None,
                        help="folder of generate_bench_models.py's models "
                        "(default $ONNXRUN_BENCH_CACHE or ~/.cache/onnxrun-bench)")
    parser.add_argument("--doc", type=Path, default=DOC, help=f"file to update (default {DOC})")
    parser.add_argument("--dry-run", action="store_true", help="print the section, write nothing")
    parser.add_argument("--json", type=Path, help="also write every result as JSON")
    parser.add_argument("--note", default="", help="a line about the conditions, for the doc")
    parser.add_argument("--marker", default="suite",
                        help="write between <!-- MARKER:begin --> and <!-- MARKER:end --> "
                        "(default suite)")
    parser.add_argument("--only-quant", action="store_true",
                        help="run only the table of quantized and float16 variants")
    parser.add_argument("--no-quant", action="store_true",
                        help="leave out the table of quantized and float16 variants")
    args = parser.parse_args(argv)
    if args.repeat is None:
        args.repeat = 5 if args.quick else 10
    threads = [int(t) for t in args.threads.split(",") if t.strip()]
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        print("run_suite: onnxruntime is not installed; it is the reference this suite compares "
              "with (pip install onnxruntime)", file=sys.stderr)
        return 1

    words = [w.strip().lower() for w in args.models.split(",") if w.strip()]
    started = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    runs: list[tuple[Case, int, BenchResult]] = []
    if not args.only_quant:
        tmp = tempfile.TemporaryDirectory(prefix="onnxrun-suite-")
        cache = args.cache or default_cache()
        generated, missing = generated_cases(cache)
        cases = zoo_cases() + generated + suite_model_cases(cache, words, args.quick)
        cases.append(chain_model(Path(tmp.name) / "chain.onnx"))
        if args.quick:
            cases = [c for c in cases if c.quick]
        if words:
            cases = [c for c in cases if any(w in c.name.lower() for w in words)]
        load_before = load()
        runs = run_cases(cases, threads, args)
        tmp.cleanup()
        text = section(runs, threads, args, started, load_before, load(), missing)
        print(text)
        if not args.dry_run:
            write_doc(args.doc, text, args.marker)
            print(f"\nwritten to {args.doc}", file=sys.stderr)
    if not args.no_quant:
        variants = quant_cases(args.cache or default_cache(), words)
        quant_runs = run_cases([c for c, _, _ in variants], threads, args)
        interleaved = interleaved_ratios(variants, threads, args)
        labels = {id(c): (label, v) for c, label, v in variants}
        text = quant_section(quant_runs, labels, threads, args, started, interleaved)
        print("\n" + text)
        runs += quant_runs
        if not args.dry_run:
            write_doc(args.doc, text, "quant", "Quantized and float16 models")
            print(f"\nwritten to {args.doc}", file=sys.stderr)
    if args.json:
        args.json.write_text(json.dumps(
            [{"case": c.name, "input": c.input, "threads": t, "result": asdict(r)}
             for c, t, r in runs], indent=1, default=str), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
