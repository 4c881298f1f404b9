"""What a run costs outside the kernels: onnxrun's per-run fixed cost against onnxruntime's
whole run, on a small model (default: the suite's VAD-style streaming model, ~30 nodes, an If).

    python benchmarks/run_overhead.py                 # the VAD-style model, 2000 runs each
    python benchmarks/run_overhead.py --quick         # 300 runs each
    python benchmarks/run_overhead.py MODEL.onnx      # another model, random inputs
    python benchmarks/run_overhead.py --profile       # and where the fixed cost goes (cProfile)

Three sessions run in turn in this process, one thread each, the order reversed every round:
onnxruntime; onnxrun; and onnxrun with every kernel replaced by a replay of its first result
(control-flow kernels keep running: choosing a branch and entering its subgraph is part of the
fixed cost). The replay session's run time is the fixed cost: feed checks, plan lookup, shape
specialization, the run loop, subgraph entry, output wrapping. The figure issue #18 asks for
is fixed cost / onnxruntime's whole run (target: under 2).
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

import onnxrun
from onnxrun.plan import Subgraph
from onnxrun.providers.base import ExecutionProvider
from onnxrun.tools.common import make_feeds

HERE = Path(__file__).resolve().parent


class Replay:
    """A kernel that computes once, then returns that result: its call costs what the run loop
    pays for calling any kernel, and nothing of the kernel's own work."""

    def __init__(self, kernel: Any) -> None:
        self.kernel = kernel
        self.result: Any = Replay

    def __call__(self, *args: Any) -> Any:
        if self.result is Replay:
            self.result = self.kernel(*args)
        return self.result

    def __getattr__(self, name: str) -> Any:  # plan-time questions go to the real kernel
        return getattr(self.kernel, name)


def _has_subgraph(kernel: Any) -> bool:
    values = getattr(kernel, "__dict__", {}).values()
    return any(isinstance(v, Subgraph) or (isinstance(v, list) and v and
                                           isinstance(v[0], Subgraph)) for v in values)


@contextmanager
def replaying():
    """Sessions created inside the block get Replay kernels (control flow excepted)."""
    original = ExecutionProvider.create_kernel

    def create_kernel(self, node, opset, ctx, attrs):
        kernel = original(self, node, opset, ctx, attrs)
        return kernel if _has_subgraph(kernel) else Replay(kernel)

    ExecutionProvider.create_kernel = create_kernel
    try:
        yield
    finally:
        ExecutionProvider.create_kernel = original


def load_vad() -> tuple[bytes, dict[str, np.ndarray]]:
    sys.path.insert(0, str(HERE))
    try:
        import suite_models
    finally:
        sys.path.pop(0)
    model, feeds = suite_models.build_vad()
    return model.SerializeToString(), feeds


def measure(model: bytes | str, feeds: dict[str, np.ndarray] | None, runs: int,
            profile: bool = False) -> dict[str, float]:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.log_severity_level = 3
    reference = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    opts = onnxrun.SessionOptions()
    opts.intra_op_num_threads = 1
    engine = onnxrun.InferenceSession(model, opts)
    with replaying():
        fixed = onnxrun.InferenceSession(model, opts)
    if feeds is None:
        feeds, _ = make_feeds(engine, {}, {}, 0)
    runners = {"onnxruntime": lambda: reference.run(None, feeds),
               "onnxrun": lambda: engine.run(None, feeds),
               "onnxrun fixed cost": lambda: fixed.run(None, feeds)}
    for run in runners.values():
        for _ in range(20):
            run()
    times: dict[str, list[float]] = {k: [] for k in runners}
    cpu: dict[str, list[float]] = {k: [] for k in runners}
    order = list(runners.items())
    clock, thread_clock = time.perf_counter, time.thread_time
    for i in range(runs):
        for name, run in (order if i % 2 == 0 else order[::-1]):
            c0 = thread_clock()
            t0 = clock()
            run()
            times[name].append(clock() - t0)
            cpu[name].append(thread_clock() - c0)
    medians = {k: float(np.median(v)) for k, v in times.items()}
    medians |= {f"{k} cpu": float(np.median(v)) for k, v in cpu.items()}
    if profile:
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(runs):
            fixed.run(None, feeds)
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)
    return medians


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", help="an .onnx file (default: the VAD-style model)")
    parser.add_argument("-r", "--runs", type=int, default=None,
                        help="timed runs per session (default 2000; --quick 300)")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--profile", action="store_true",
                        help="then profile the fixed-cost session (cProfile, by own time)")
    args = parser.parse_args(argv)
    runs = args.runs or (300 if args.quick else 2000)
    if args.model:
        model, feeds, label = args.model, None, args.model
    else:
        (model, feeds), label = load_vad(), "VAD-style streaming model"
    load = "/".join(f"{x:.2f}" for x in os.getloadavg())
    m = measure(model, feeds, runs, args.profile)
    print(f"{label}: {runs} runs each, interleaved, 1 thread, medians of wall time and of the "
          f"calling thread's CPU time (steadier on a loaded machine); load before: {load}")
    for kind, suffix in (("wall", ""), ("CPU", " cpu")):
        ort_s, full = m["onnxruntime" + suffix], m["onnxrun" + suffix]
        fixed = m["onnxrun fixed cost" + suffix]
        print(f"  {kind:4}  onnxruntime, whole run {ort_s * 1e6:8.1f} µs; onnxrun, whole run "
              f"{full * 1e6:8.1f} µs (ratio {full / ort_s:.2f}); onnxrun, fixed cost "
              f"{fixed * 1e6:8.1f} µs (ratio {fixed / ort_s:.2f}, target < 2); kernels "
              f"{(full - fixed) * 1e6:8.1f} µs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
