"""``onnxrun bench``: how fast a model runs, side by side with onnxruntime.

In the spirit of ``onnxruntime_perf_test``: inputs are generated (as ``onnxrun run`` does) or
read with ``--input``, a few warm-up runs are followed by ``-r N`` timed runs (or as many as fit
in ``-m SECONDS``), and the median, p90, min, mean and throughput are printed.

``--vs onnxruntime`` opens an onnxruntime session on the same model with the same options and
runs the two engines *alternately* in one process (A B, B A, A B, ...), so that a change of load
on the machine hits both alike; the figure to quote is the ratio of the medians. With more than
one intra-op thread, a pause (SETTLE_SECONDS) before each switch of engine lets the idle worker
threads of the engine that just ran stop spinning, so they do not slow the other one down; an
untimed run after the pause warms the next engine again, so that no timed run is a cold one.
onnxruntime is not a dependency of onnxrun: it is imported only when asked for.

Session creation time and peak memory are measured in a fresh child process per engine (see
``_CHILD``): it imports numpy and the engine and loads the inputs, notes its peak resident size
(the *baseline*: ``VmHWM`` on Linux, ``ru_maxrss`` elsewhere), creates the session (timed), runs
once, and notes the peak again.
The report gives the increase over the baseline (what the session and one run cost) and the raw
peak of the process. The child runs the engine's Python modules from bytecode, as an installed
package does: before timing it compiles the engine's package (compileall: nothing is imported),
into a cache of its own when this process writes no bytecode (PYTHONDONTWRITEBYTECODE, -B).
Otherwise each child would compile from source the modules a session imports on first use
(onnxrun's kernel families and passes): work of CPython's compiler that no installed copy does
after its first import, and that onnxruntime, whose kernels are native code, never does.

``--profile`` runs a separate, profiled session after the timed runs (so the timings are not
slowed by the profiler), reads its Chrome-trace JSON and prints the operators and nodes that took
the most time; with ``--vs`` onnxruntime's trace is summarized the same way.

The Python API (``BenchOptions``, ``bench``, ``format_report``) is what ``benchmarks/`` uses.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .common import CliError, describe, make_feeds, one_line, parse_assignments, parse_dims

ENGINE = "onnxrun"
REFERENCE = "onnxruntime"

# -o accepts onnxruntime_perf_test's numbers or a name.
_LEVELS = {
    "0": 0, "disable": 0, "1": 1, "basic": 1, "2": 2, "extended": 2, "3": 3, "layout": 3,
    "99": 99, "all": 99,
}
_LEVEL_ENUM = {0: "ORT_DISABLE_ALL", 1: "ORT_ENABLE_BASIC", 2: "ORT_ENABLE_EXTENDED",
               3: "ORT_ENABLE_LAYOUT", 99: "ORT_ENABLE_ALL"}
_LEVEL_WORD = {0: "disable", 1: "basic", 2: "extended", 3: "layout", 99: "all"}


def parse_level(text: str) -> int:
    level = _LEVELS.get(str(text).strip().lower())
    if level is None:
        raise CliError(f"-o {text}: expected 0/1/2/99 or disable/basic/extended/all")
    return level


@dataclass
class BenchOptions:
    """What both engines are given; 0 threads means each engine's own default."""

    warmup: int = 1
    repeat: int = 10
    duration: float | None = None  # seconds; when set, replaces ``repeat``
    intra_op_threads: int = 0
    inter_op_threads: int = 0
    parallel: bool = False
    opt_level: int = 99
    isolate: bool = True  # creation time and memory in child processes
    profile: bool = False
    profile_prefix: str = "onnxrun_bench_profile"
    top: int = 10

    def describe(self) -> str:
        runs = (f"as many runs as fit in {self.duration:g} s" if self.duration is not None
                else f"{self.repeat} runs")
        threads = ", ".join(
            f"{name} {n if n else 'default'}"
            for name, n in (("intra-op threads", self.intra_op_threads),
                            ("inter-op threads", self.inter_op_threads))
        )
        mode = "parallel" if self.parallel else "sequential"
        return (f"{self.warmup} warm-up + {runs} per engine; {threads}; {mode} execution; "
                f"optimization level {self.opt_level} ({_LEVEL_WORD.get(self.opt_level, '?')})")


@dataclass
class Stats:
    runs: int
    median: float  # seconds
    p90: float
    min: float
    mean: float
    throughput: float  # runs per second

    @classmethod
    def of(cls, times: Sequence[float]) -> Stats:
        arr = np.asarray(times, dtype=np.float64)
        return cls(runs=len(arr), median=float(np.median(arr)), p90=float(np.percentile(arr, 90)),
                   min=float(arr.min()), mean=float(arr.mean()),
                   throughput=len(arr) / float(arr.sum()) if arr.sum() > 0 else math.inf)


@dataclass
class Isolated:
    """One engine measured in a fresh child process."""

    create_s: float
    first_run_s: float
    baseline_bytes: int  # peak RSS after the imports and the inputs, before the session
    peak_bytes: int  # peak RSS after creating the session and one run
    compiled: list[str] | None = None  # onnxrun: the compiled modules loaded (name/target)
    create_cpu_s: float | None = None  # the process's CPU time of the creation (a loaded host)
    import_s: float | None = None  # the engine's import (after numpy's), before the session

    @property
    def delta_bytes(self) -> int:
        return max(0, self.peak_bytes - self.baseline_bytes)


@dataclass
class ProfileSummary:
    trace: str
    runs: int
    total_us: float
    by_op: list[tuple[str, int, float]]  # (operator, calls, total µs), largest first
    by_node: list[tuple[str, str, int, float]]  # (node, operator, calls, total µs)


@dataclass
class EngineResult:
    name: str
    version: str
    stats: Stats
    create_s: float  # in this process (see ``isolated`` for the fresh-process figure)
    isolated: Isolated | None = None
    isolated_error: str | None = None
    profile: ProfileSummary | None = None


@dataclass
class BenchResult:
    model: str
    options: BenchOptions
    inputs: list[str]  # "name: float32 [1, 3] (random)"
    engines: list[EngineResult]
    max_abs_diff: float | None = None  # between the engines' outputs, float outputs only
    notes: list[str] = field(default_factory=list)

    def engine(self, name: str) -> EngineResult | None:
        return next((e for e in self.engines if e.name == name), None)

    def ratio(self, get: Callable[[EngineResult], float | None]) -> float | None:
        """onnxrun's figure over onnxruntime's (None without both)."""
        a, b = self.engine(ENGINE), self.engine(REFERENCE)
        if a is None or b is None:
            return None
        x, y = get(a), get(b)
        if x is None or y is None or y <= 0:
            return None
        return x / y


# ------------------------------------------------------------------------------------------------
# engines and inputs


def import_engine(name: str) -> Any:
    if name == ENGINE:
        import onnxrun

        return onnxrun
    if name != REFERENCE:
        raise CliError(f"--vs {name}: the only engine to compare with is {REFERENCE}")
    try:
        import onnxruntime
    except ImportError:
        raise CliError(
            "--vs onnxruntime needs the onnxruntime package, which is not installed "
            "(pip install onnxruntime); onnxrun never needs it, it is only the reference to "
            "compare with"
        ) from None
    onnxruntime.set_default_logger_severity(3)  # its graph warnings would bury the table
    return onnxruntime


def session_options(rt: Any, opts: BenchOptions, profile_prefix: str | None = None) -> Any:
    """The same settings for either engine (both expose onnxruntime's SessionOptions)."""
    so = rt.SessionOptions()
    so.intra_op_num_threads = opts.intra_op_threads
    so.inter_op_num_threads = opts.inter_op_threads
    so.execution_mode = (rt.ExecutionMode.ORT_PARALLEL if opts.parallel
                         else rt.ExecutionMode.ORT_SEQUENTIAL)
    so.graph_optimization_level = getattr(rt.GraphOptimizationLevel, _LEVEL_ENUM[opts.opt_level])
    so.log_severity_level = 3
    if profile_prefix:
        so.enable_profiling = True
        so.profile_file_prefix = profile_prefix
    return so


def create_session(rt: Any, model: str, opts: BenchOptions,
                   profile_prefix: str | None = None) -> tuple[Any, float]:
    t0 = time.perf_counter()
    sess = rt.InferenceSession(model, session_options(rt, opts, profile_prefix),
                               providers=["CPUExecutionProvider"])
    return sess, time.perf_counter() - t0


# ------------------------------------------------------------------------------------------------
# timing


# With several intra-op threads, each engine's idle worker threads keep spinning for a while
# after a run (OpenBLAS's for up to ~0.1 s, onnxruntime's thread pool too) and would take a core
# from the other engine's next run: something that never happens to an application, which
# runs one engine. The pause between the two engines' runs lets them go idle first.
SETTLE_SECONDS = 0.15


def time_alternating(runners: Sequence[Callable[[], Any]], warmup: int, repeat: int,
                     duration: float | None = None, settle: float = 0.0
                     ) -> tuple[list[list[float]], list[Any]]:
    """Warm every runner up, then time them in turn, the order reversed every round (A B, B A,
    ...) so that neither always runs right after the other, pausing ``settle`` seconds before
    each switch to another runner and then running it once untimed: a run right after an idle
    pause is a cold one (caches, the idle vCPU's wake, the engine's sleeping workers: the VAD
    model 0.57 -> 1.35 ms in either engine, 2-vCPU VM), which an application calling one
    engine does not see, and which the 1-thread runs, never paused, did not pay. Returns the
    times in seconds of each runner and the result of each one's first call."""
    first: list[Any] = [None] * len(runners)
    for k, run in enumerate(runners):
        for i in range(warmup):
            out = run()
            if i == 0:
                first[k] = out
    times: list[list[float]] = [[] for _ in runners]
    clock = time.perf_counter
    start = clock()
    rounds = 0
    previous = None
    while True:
        order = range(len(runners)) if rounds % 2 == 0 else range(len(runners) - 1, -1, -1)
        for k in order:
            if settle and previous is not None and previous != k:
                time.sleep(settle)
                runners[k]()  # warm again after the pause: untimed
            previous = k
            t0 = clock()
            out = runners[k]()
            times[k].append(clock() - t0)
            if first[k] is None:
                first[k] = out
        rounds += 1
        if (clock() - start >= duration) if duration is not None else rounds >= repeat:
            return times, first


def max_abs_diff(a: Sequence[Any], b: Sequence[Any]) -> float | None:
    """Largest |a - b| over the floating-point outputs both engines returned (None: none)."""
    worst = None
    for x, y in zip(a, b, strict=False):
        if not (isinstance(x, np.ndarray) and isinstance(y, np.ndarray)):
            continue
        if x.dtype.kind != "f" or x.shape != y.shape:
            continue
        if x.size == 0:
            continue
        d = np.abs(x.astype(np.float64) - y.astype(np.float64))
        finite = np.isfinite(d)
        value = float(d[finite].max()) if finite.any() else 0.0
        worst = value if worst is None else max(worst, value)
    return worst


# ------------------------------------------------------------------------------------------------
# creation time and memory in a child process

# Runs as ``python -c _CHILD CONFIG_JSON``; self-contained so that the child imports only numpy
# and the engine measured. Peak RSS is Linux's VmHWM: ru_maxrss would do elsewhere, but on Linux
# it survives fork+exec, so a child would start with its parent's peak (KiB on Linux, bytes on
# macOS).
_CHILD = r"""
import json, resource, sys, time
cfg = json.loads(sys.argv[1])
import compileall, importlib.util, os
compileall.compile_dir(os.path.dirname(importlib.util.find_spec(cfg["engine"]).origin), quiet=2)
import numpy as np
t_import = time.perf_counter()
if cfg["engine"] == "onnxruntime":
    import onnxruntime as rt
    rt.set_default_logger_severity(3)
else:
    import onnxrun as rt
import_s = time.perf_counter() - t_import
with np.load(cfg["feeds"], allow_pickle=True) as z:
    feeds = {k: z[k] for k in z.files}
def peak():
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    scale = 1 if sys.platform == "darwin" else 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale
so = rt.SessionOptions()
so.intra_op_num_threads = cfg["intra"]
so.inter_op_num_threads = cfg["inter"]
so.execution_mode = getattr(rt.ExecutionMode, cfg["mode"])
so.graph_optimization_level = getattr(rt.GraphOptimizationLevel, cfg["level"])
so.log_severity_level = 3
baseline = peak()
c0, t0 = time.process_time(), time.perf_counter()
sess = rt.InferenceSession(cfg["model"], so, providers=["CPUExecutionProvider"])
t1, c1 = time.perf_counter(), time.process_time()
sess.run(None, feeds)
t2 = time.perf_counter()
compiled = None
if cfg["engine"] == "onnxrun":
    from onnxrun.providers.cpu import compiled as ck
    compiled = ck.loaded()
print("BENCH-CHILD " + json.dumps({"create_s": t1 - t0, "create_cpu_s": c1 - c0,
                                   "first_run_s": t2 - t1, "import_s": import_s,
                                   "baseline": baseline, "peak": peak(), "compiled": compiled}))
"""


def measure_isolated(engine: str, model: str, feeds_file: str, opts: BenchOptions,
                     timeout: float = 900, env_extra: Mapping[str, str] | None = None
                     ) -> Isolated:
    """Creation time and peak memory of ``engine`` in a fresh child; ``env_extra``: variables
    set for it (e.g. PYTHONPATH of another onnxrun checkout, to measure a change)."""
    cfg = {
        "engine": engine, "model": os.path.abspath(model), "feeds": feeds_file,
        "intra": opts.intra_op_threads, "inter": opts.inter_op_threads,
        "mode": "ORT_PARALLEL" if opts.parallel else "ORT_SEQUENTIAL",
        "level": _LEVEL_ENUM[opts.opt_level],
    }
    env = None
    if sys.dont_write_bytecode:  # the child's bytecode goes to a cache outside the source tree
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env["PYTHONPYCACHEPREFIX"] = os.path.join(tempfile.gettempdir(), "onnxrun-bench-pycache")
    if env_extra:
        env = {**(env if env is not None else os.environ), **env_extra}
    proc = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(cfg)], capture_output=True,
                          text=True, timeout=timeout, env=env)
    for line in proc.stdout.splitlines():
        if line.startswith("BENCH-CHILD "):
            r = json.loads(line[len("BENCH-CHILD "):])
            return Isolated(r["create_s"], r["first_run_s"], int(r["baseline"]), int(r["peak"]),
                            r.get("compiled"), r.get("create_cpu_s"), r.get("import_s"))
    tail = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
    raise RuntimeError(f"the {engine} child process failed: {tail}")


# ------------------------------------------------------------------------------------------------
# profiles


def summarize_trace(path: str, skip_runs: int = 0, top: int = 10) -> ProfileSummary:
    """Total kernel time per operator and per node in a Chrome-trace profile (onnxrun's or
    onnxruntime's), leaving out the node events of the first ``skip_runs`` runs (warm-up)."""
    with open(path, encoding="utf-8") as f:
        events = json.load(f)
    runs = sorted(e["ts"] for e in events
                  if e.get("cat") == "Session" and e.get("name") == "model_run")
    cutoff = runs[skip_runs] if 0 < skip_runs < len(runs) else -math.inf
    n_runs = max(1, len(runs) - (skip_runs if 0 < skip_runs < len(runs) else 0))
    ops: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])
    nodes: dict[str, list[Any]] = {}
    total = 0.0
    for e in events:
        name = e.get("name", "")
        if e.get("cat") != "Node" or not name.endswith("_kernel_time") or e["ts"] < cutoff:
            continue
        op = e.get("args", {}).get("op_name", "?")
        dur = float(e.get("dur", 0))
        total += dur
        ops[op][0] += 1
        ops[op][1] += dur
        entry = nodes.setdefault(name[: -len("_kernel_time")], [op, 0, 0.0])
        entry[1] += 1
        entry[2] += dur
    by_op = sorted(((k, int(c), t) for k, (c, t) in ops.items()), key=lambda r: -r[2])
    by_node = sorted(((k, o, int(c), t) for k, (o, c, t) in nodes.items()), key=lambda r: -r[3])
    return ProfileSummary(path, n_runs, total, by_op[:top], by_node[:top])


def _profile(rt: Any, engine: str, model: str, feeds: dict[str, Any], opts: BenchOptions,
             n_runs: int) -> ProfileSummary:
    sess, _ = create_session(rt, model, opts, f"{opts.profile_prefix}_{engine}")
    for _ in range(opts.warmup + n_runs):
        sess.run(None, feeds)
    trace = sess.end_profiling()
    if not trace:
        raise CliError(f"--profile: this {engine} session wrote no profile")
    return summarize_trace(trace, opts.warmup, opts.top)


# ------------------------------------------------------------------------------------------------
# the benchmark


def bench(model: str, opts: BenchOptions, *, feeds: Mapping[str, Any] | None = None,
          files: Mapping[str, str] | None = None, dims: Mapping[str, int] | None = None,
          seed: int = 0, vs: str | None = None, isolate_opts: BenchOptions | None = None,
          ) -> BenchResult:
    """Time ``model`` with onnxrun (and ``vs`` alternately). ``feeds`` (complete) replaces the
    generated inputs; ``files``/``dims`` work as ``--input``/``--dim``. ``isolate_opts``, if
    given, are the options of the child-process measurement (default ``opts``)."""
    engines = [ENGINE] + ([vs] if vs else [])
    modules = [import_engine(name) for name in engines]
    sessions, creates = [], []
    for rt in modules:
        sess, seconds = create_session(rt, model, opts)
        sessions.append(sess)
        creates.append(seconds)
    notes: list[str] = []
    if feeds is None:
        feeds, input_lines = make_feeds(sessions[0], files, dims, seed)
    else:
        feeds = dict(feeds)
        input_lines = [f"{k}: {describe(v)} (given)" for k, v in feeds.items()]
    if opts.inter_op_threads and not opts.parallel:
        notes.append("-y (inter-op threads) matters only with -P (ORT_PARALLEL), in both engines")

    runners = [(lambda s=s: s.run(None, feeds)) for s in sessions]
    settle = SETTLE_SECONDS if len(runners) > 1 and opts.intra_op_threads != 1 else 0.0
    times, first = time_alternating(runners, opts.warmup, opts.repeat, opts.duration, settle)
    results = [
        EngineResult(name, getattr(rt, "__version__", "?"), Stats.of(t), c)
        for name, rt, t, c in zip(engines, modules, times, creates, strict=True)
    ]
    diff = max_abs_diff(first[0], first[1]) if len(first) > 1 else None
    del sessions, runners

    if opts.profile:
        n = min(max(r.stats.runs for r in results), 100)
        for r, rt in zip(results, modules, strict=True):
            r.profile = _profile(rt, r.name, model, feeds, opts, n)

    if opts.isolate:
        with tempfile.TemporaryDirectory(prefix="onnxrun-bench-") as tmp:
            feeds_file = os.path.join(tmp, "feeds.npz")
            np.savez(feeds_file, **{k: np.asarray(v) for k, v in feeds.items()})
            for r in results:
                try:
                    r.isolated = measure_isolated(r.name, model, feeds_file, isolate_opts or opts)
                except (RuntimeError, subprocess.TimeoutExpired) as e:
                    r.isolated_error = one_line(e)
    return BenchResult(model, opts, input_lines, results, diff, notes)


# ------------------------------------------------------------------------------------------------
# formatting


def fmt_time(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "-"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.3f} s"


def fmt_mib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**20:.1f} MiB"


def fmt_ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def _columns(rows: list[list[str]], right: set[int]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = []
    for r in rows:
        cells = [c.rjust(w) if i in right else c.ljust(w)
                 for i, (c, w) in enumerate(zip(r, widths, strict=True))]
        out.append("  " + "  ".join(cells).rstrip())
    return out


def format_report(result: BenchResult) -> str:
    opts = result.options
    lines = [f"model:    {result.model}", f"settings: {opts.describe()}"]
    if len(result.engines) > 1:
        lines[-1] += "; engines run alternately"
    lines.append("inputs:")
    lines.extend(f"  {x}" for x in result.inputs)
    for note in result.notes:
        lines.append(f"note:     {note}")
    if result.max_abs_diff is not None:
        lines.append(f"outputs:  max |onnxrun - onnxruntime| = {result.max_abs_diff:.3g} "
                     "(floating-point outputs)")

    isolate = opts.isolate
    head = ["engine", "runs", "median", "p90", "min", "mean", "runs/s", "create"]
    if isolate:
        head += ["peak RSS +", "process peak"]
    rows = [head]
    for e in result.engines:
        s = e.stats
        row = [f"{e.name} {e.version}", str(s.runs), fmt_time(s.median), fmt_time(s.p90),
               fmt_time(s.min), fmt_time(s.mean), f"{s.throughput:.2f}"]
        if isolate:
            iso = e.isolated
            row += [fmt_time(iso.create_s if iso else None),
                    fmt_mib(iso.delta_bytes if iso else None),
                    fmt_mib(iso.peak_bytes if iso else None)]
        else:
            row.append(fmt_time(e.create_s))
        rows.append(row)
    if len(result.engines) > 1:
        def iso_get(attr: str) -> Callable[[EngineResult], float | None]:
            return lambda e: None if e.isolated is None else float(getattr(e.isolated, attr))

        row = ["onnxrun / onnxruntime", "", fmt_ratio(result.ratio(lambda e: e.stats.median)),
               fmt_ratio(result.ratio(lambda e: e.stats.p90)),
               fmt_ratio(result.ratio(lambda e: e.stats.min)),
               fmt_ratio(result.ratio(lambda e: e.stats.mean)),
               fmt_ratio(result.ratio(lambda e: 1 / e.stats.throughput))]
        if isolate:
            row += [fmt_ratio(result.ratio(iso_get("create_s"))),
                    fmt_ratio(result.ratio(iso_get("delta_bytes"))),
                    fmt_ratio(result.ratio(iso_get("peak_bytes")))]
        else:
            row.append(fmt_ratio(result.ratio(lambda e: e.create_s)))
        rows.append(row)
    lines.append("")
    lines.extend(_columns(rows, right=set(range(1, len(head)))))
    if len(result.engines) > 1:
        lines.append("  (ratios: onnxrun's figure over onnxruntime's; above 1 means onnxrun is "
                     "slower or larger; runs/s compares time per run)")
    if isolate:
        lines.append("  create, peak RSS: measured in a fresh child process per engine; 'peak RSS "
                     "+' is its peak resident size after creating the session and running once, "
                     "minus the peak before (engine imported, inputs loaded)")
        for e in result.engines:
            if e.isolated_error:
                lines.append(f"  {e.name}: no child-process figures: {e.isolated_error}")
    for e in result.engines:
        if e.profile is not None:
            lines.append("")
            lines.extend(format_profile(e.name, e.profile))
    return "\n".join(lines)


def format_profile(engine: str, p: ProfileSummary) -> list[str]:
    total = p.total_us or 1.0
    out = [f"profile of {engine}: {p.runs} profiled runs after warm-up, kernel time "
           f"{fmt_time(p.total_us / p.runs / 1e6)} per run (trace: {p.trace})"]
    out.append("  top operators by total time:")
    rows = [["operator", "calls/run", "time/run", "share", "avg/call"]]
    rows += [[op, f"{calls / p.runs:g}", fmt_time(t / p.runs / 1e6), f"{100 * t / total:.1f}%",
              fmt_time(t / calls / 1e6)] for op, calls, t in p.by_op]
    out.extend("  " + x for x in _columns(rows, right={1, 2, 3, 4}))
    out.append("  top nodes by total time:")
    rows = [["node", "operator", "time/run", "share"]]
    rows += [[name, op, fmt_time(t / p.runs / 1e6), f"{100 * t / total:.1f}%"]
             for name, op, _, t in p.by_node]
    out.extend("  " + x for x in _columns(rows, right={2, 3}))
    return out


# ------------------------------------------------------------------------------------------------
# command line


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text}")
    return value


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {text}")
    return value


def add_parser(sub: Any, parents: list[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "bench", parents=parents, help="time a model, optionally against onnxruntime",
        description="Time MODEL on generated (or given) inputs: warm-up runs, then -r N runs or "
        "-m SECONDS; print median, p90, min, mean, runs/s, session-creation time and peak "
        "memory (both from a fresh child process). With --vs onnxruntime the two engines run "
        "alternately in this process and their ratio is printed.",
    )
    p.add_argument("model", help="path of the .onnx file")
    p.add_argument("--input", "-i", action="append", metavar="NAME=FILE",
                   help="read input NAME from FILE (.npy, or .pb TensorProto); repeatable")
    p.add_argument("--dim", "-d", action="append", metavar="NAME=VALUE",
                   help="size of the symbolic dimension NAME in generated inputs (default 1)")
    p.add_argument("-w", "--warmup", type=_non_negative_int, default=1, metavar="N",
                   help="warm-up runs per engine, not timed (default 1)")
    p.add_argument("-r", "--repeat", type=_positive_int, default=10, metavar="N",
                   help="timed runs per engine (default 10)")
    p.add_argument("-m", "--duration", type=_positive_float, metavar="SECONDS",
                   help="run for this long instead of -r N runs")
    p.add_argument("-x", "--intra-op-threads", type=_non_negative_int, default=0, metavar="N",
                   help="intra-op threads (default 0: engine default)")
    p.add_argument("-y", "--inter-op-threads", type=_non_negative_int, default=0, metavar="N",
                   help="inter-op threads, used with -P (default 0: engine default)")
    p.add_argument("-P", "--parallel", action="store_true",
                   help="ExecutionMode.ORT_PARALLEL: independent nodes run concurrently")
    p.add_argument("-o", "--opt-level", default="99", metavar="LEVEL",
                   help="graph optimization: 0/1/2/99 or disable/basic/extended/all (default 99)")
    p.add_argument("--vs", metavar="ENGINE", choices=[REFERENCE],
                   help="also run onnxruntime, alternately, and print the ratios")
    p.add_argument("--profile", action="store_true",
                   help="profile a separate session after the timed runs and print the top "
                   "operators and nodes (trace files PREFIX_<engine>_<date>.json)")
    p.add_argument("--profile-prefix", default="onnxrun_bench_profile", metavar="PREFIX",
                   help="prefix of the profile traces (default onnxrun_bench_profile)")
    p.add_argument("--top", type=_positive_int, default=10, metavar="N",
                   help="operators and nodes listed by --profile (default 10)")
    p.add_argument("--no-isolate", dest="isolate", action="store_false",
                   help="skip the child processes: creation time measured in this process, no "
                   "memory figures")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    p.set_defaults(func=cmd_bench)
    return p


def cmd_bench(args: argparse.Namespace) -> int:
    dims = parse_dims(args.dim)
    files = parse_assignments(args.input, "--input")
    if not Path(args.model).is_file():
        raise CliError(f"model file '{args.model}' does not exist")
    opts = BenchOptions(
        warmup=args.warmup, repeat=args.repeat, duration=args.duration,
        intra_op_threads=args.intra_op_threads, inter_op_threads=args.inter_op_threads,
        parallel=args.parallel, opt_level=parse_level(args.opt_level), isolate=args.isolate,
        profile=args.profile, profile_prefix=args.profile_prefix, top=args.top,
    )
    result = bench(args.model, opts, files=files, dims=dims, seed=args.seed, vs=args.vs)
    print(format_report(result))
    return 0
