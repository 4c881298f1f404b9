"""What reusing buffers for intermediates (src/onnxrun/memory.py) gains: onnxrun with it next to
onnxrun without it (``enable_mem_pattern = False``).

    python benchmarks/memory_reuse.py --quick                  # run_suite.py's quick cases
    python benchmarks/memory_reuse.py --models densenet,yolo,squeeze -r 20

What a fresh output costs depends on malloc's state: in a process that has already freed a
large block (a model's weights, another model's activations), glibc serves later large
arrays from its heap and keeps them, and no run pays page faults, with or without reuse; a
process that runs one model, as an application does, gets its large arrays mapped and
unmapped every run. So each setting runs in a fresh child process (the settings alternating,
``--rounds`` times each): the session created, 12 warm-up runs (the recorded run, the probe
run and the generated function among them), then ``-r`` timed runs. Per case and setting:
the median of the children's median wall times, the minor page faults per timed run, the
peak resident size after creation and all runs less the peak before the session; with
reuse, the steps that wrote into the arena of how many could, and the arena's size. The
outputs of both settings are compared for equality in the parent first.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np

import onnxrun
from onnxrun.tools.common import make_feeds

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run_suite  # noqa: E402

WARMUP = 12  # past CompiledSteps.GENERATE_AFTER: the generated function, patterns recorded


def session(model: str, reuse: bool, threads: int) -> onnxrun.InferenceSession:
    so = onnxrun.SessionOptions()
    so.intra_op_num_threads = threads
    so.enable_mem_pattern = reuse
    return onnxrun.InferenceSession(model, so)


def pooled(sess: onnxrun.InferenceSession) -> tuple[int, int, int]:
    """(steps given arena bytes, steps that could be, the arena's bytes), largest pattern."""
    best = (0, 0, 0)
    for plan in sess._program._plans.values():
        memory = plan.memory
        for p in memory.patterns.values() if memory is not None else ():
            if p is not None:
                best = max(best, (sum(s is not None for s in p.specs), len(memory.candidates),
                                  p.nbytes))
    return best


def child(cfg: dict) -> dict:
    """One setting in this (fresh) process."""
    import resource
    import time

    def peak() -> int:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))

    base = peak()
    sess = session(cfg["model"], cfg["reuse"], cfg["threads"])
    feeds, _ = make_feeds(sess, cfg["files"], cfg["dims"])
    for _ in range(WARMUP):
        sess.run(None, feeds)
    times = []
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(cfg["repeat"]):
        t = time.perf_counter()
        sess.run(None, feeds)
        times.append(time.perf_counter() - t)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
    return {"median": statistics.median(times), "faults": faults / cfg["repeat"],
            "peak": peak() - base, "pooled": pooled(sess)}


def run_child(case: run_suite.Case, reuse: bool, args: argparse.Namespace) -> dict:
    cfg = json.dumps({"model": case.model, "files": case.files, "dims": case.dims,
                      "reuse": reuse, "threads": args.threads, "repeat": args.repeat})
    out = subprocess.run([sys.executable, __file__, "--child", cfg], capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def same_outputs(case: run_suite.Case, threads: int) -> None:
    on, off = session(case.model, True, threads), session(case.model, False, threads)
    feeds, _ = make_feeds(on, case.files, case.dims)
    for _ in range(WARMUP):
        for a, b in zip(on.run(None, feeds), off.run(None, feeds), strict=True):
            np.testing.assert_array_equal(a, b)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="run_suite.py's quick cases")
    parser.add_argument("--models", default="", help="comma-separated words of case names")
    parser.add_argument("-r", "--repeat", type=int, default=10, help="timed runs per child")
    parser.add_argument("--rounds", type=int, default=2, help="children per setting")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return 0
    words = [w.strip().lower() for w in args.models.split(",") if w.strip()]
    cache = run_suite.default_cache()
    found = run_suite.zoo_cases() + run_suite.suite_model_cases(cache, words, args.quick)
    if args.quick:
        found = [c for c in found if c.quick]
    if words:
        found = [c for c in found if any(w in c.name.lower() for w in words)]
    print(f"load before: {'/'.join(f'{x:.2f}' for x in os.getloadavg())}; {args.threads} "
          f"thread(s); {args.rounds} fresh processes per setting, alternating, "
          f"{WARMUP} warm-up + {args.repeat} timed runs each")
    header = ["model", "reuse off", "reuse on", "on / off", "faults/run off", "on",
              "peak + off", "on", "steps pooled", "arena"]
    print("| " + " | ".join(header) + " |")
    print("|" + " --- |" * len(header))
    for case in found:
        same_outputs(case, args.threads)
        results: dict[bool, list[dict]] = {False: [], True: []}
        for _ in range(args.rounds):
            for reuse in (False, True):
                results[reuse].append(run_child(case, reuse, args))

        def med(reuse, key, results=results):
            return statistics.median(r[key] for r in results[reuse])

        n, c, nbytes = results[True][-1]["pooled"]
        print(f"| {case.name} | {med(False, 'median') * 1e3:.2f} ms | "
              f"{med(True, 'median') * 1e3:.2f} ms | "
              f"{med(True, 'median') / med(False, 'median'):.3f} | "
              f"{med(False, 'faults'):.0f} | {med(True, 'faults'):.0f} | "
              f"{med(False, 'peak') / 2**20:.1f} MiB | {med(True, 'peak') / 2**20:.1f} MiB | "
              f"{n} of {c} | {nbytes / 2**20:.1f} MiB |", flush=True)
    print(f"load after: {'/'.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
