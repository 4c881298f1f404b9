"""What session 10's additions to the memory pattern (src/onnxrun/memory.py) gain, side by side
in one process: producers writing into Concat's slices and elementwise outputs written over
an input that dies there (in place), against the same arena without them, and against no
arena at all (``enable_mem_pattern = False``).

    python benchmarks/arena_gain.py --quick            # DenseNet-style, Inception, YOLO
    python benchmarks/arena_gain.py -r 30 --models densenet,inception,squeeze

Three sessions of each case in one process: reuse off; reuse on with the slices and the in
place writes turned off while it records (``_Recorder._slices`` / ``_in_place`` answering
none); reuse on. Each warmed up (12 runs: the pattern recorded, probed, the generated
function made), then ``-r`` rounds, each running the three once in turn (the order rotating);
per setting the median wall time, and the ratios of the medians. Also the arena's size and
how many steps write into a slice / over their input. The outputs of the three are compared
for equality first.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

import onnxrun
from onnxrun import memory
from onnxrun.tools.common import make_feeds

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run_suite  # noqa: E402

WARMUP = 12
QUICK = ("densenet", "inception", "yolo")  # the suite_models builds of these


def _session(model: str, reuse: bool, threads: int) -> onnxrun.InferenceSession:
    so = onnxrun.SessionOptions()
    so.intra_op_num_threads = threads
    so.enable_mem_pattern = reuse
    return onnxrun.InferenceSession(model, so)


def _pattern(sess: onnxrun.InferenceSession) -> memory.Pattern | None:
    found = [p for plan in sess._program._plans.values() if plan.memory is not None
             for p in plan.memory.patterns.values() if p is not None]
    return max(found, key=lambda p: p.nbytes, default=None)


def _warm(sess, feeds, plain: bool) -> list[np.ndarray]:
    """WARMUP runs (with ``plain``, the pattern made without slices and in place writes)."""
    saved = memory._Recorder._slices, memory._Recorder._in_place
    if plain:
        memory._Recorder._slices = lambda self, live: {}
        memory._Recorder._in_place = lambda self, live, parent: {}
    try:
        for _ in range(WARMUP):
            out = sess.run(None, feeds)
    finally:
        memory._Recorder._slices, memory._Recorder._in_place = saved
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="the DenseNet-style, Inception and YOLO builds only")
    parser.add_argument("--models", default="", help="comma-separated words of case names")
    parser.add_argument("-r", "--rounds", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    words = [w.strip().lower() for w in args.models.split(",") if w.strip()] or \
        (list(QUICK) if args.quick else [])
    found = ([] if args.quick else run_suite.zoo_cases()) + \
        run_suite.suite_model_cases(run_suite.default_cache(), words, False)
    if words:
        found = [c for c in found if any(w in c.name.lower() or w in c.model.lower()
                                         for w in words)]
    print(f"load before: {'/'.join(f'{x:.2f}' for x in os.getloadavg())}; {args.threads} "
          f"thread(s); {WARMUP} warm-up runs each, {args.rounds} rounds interleaved")
    header = ["model", "reuse off", "arena", "+ slices, in place", "new / arena",
              "new / off", "arena MiB before -> after", "slices", "in place"]
    print("| " + " | ".join(header) + " |")
    print("|" + " --- |" * len(header))
    for case in found:
        sessions = [_session(case.model, False, args.threads),
                    _session(case.model, True, args.threads),
                    _session(case.model, True, args.threads)]
        feeds, _ = make_feeds(sessions[0], case.files, case.dims)
        outs = [_warm(s, feeds, plain=i == 1) for i, s in enumerate(sessions)]
        for other in outs[1:]:
            for a, b in zip(outs[0], other, strict=True):
                np.testing.assert_array_equal(a, b)
        times: list[list[float]] = [[], [], []]
        for r in range(args.rounds):
            for k in range(3):
                i = (r + k) % 3
                t = time.perf_counter()
                sessions[i].run(None, feeds)
                times[i].append(time.perf_counter() - t)
        med = [statistics.median(t) for t in times]
        plain, new = _pattern(sessions[1]), _pattern(sessions[2])
        size = [p.nbytes / 2**20 if p is not None else 0.0 for p in (plain, new)]
        slices = len(new.slices) if new is not None else 0
        over = sum(x is not None for x in (new.over or ())) if new is not None else 0
        print(f"| {case.name} | {med[0] * 1e3:.2f} ms | {med[1] * 1e3:.2f} ms | "
              f"{med[2] * 1e3:.2f} ms | {med[2] / med[1]:.3f} | {med[2] / med[0]:.3f} | "
              f"{size[0]:.2f} -> {size[1]:.2f} | {slices} | {over} |", flush=True)
    print(f"load after: {'/'.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
