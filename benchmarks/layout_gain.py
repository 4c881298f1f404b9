"""What the layout level (ORT_ENABLE_LAYOUT, 3: channels-last activations between convolutions)
gains: onnxrun at level 3 against onnxrun at ORT_ENABLE_EXTENDED (2), both sessions in this
process, run in turn (the order reversed every round), 1 intra-op thread by default.

    python benchmarks/layout_gain.py                  # the suite's CNN cases, 20 runs each
    python benchmarks/layout_gain.py --quick          # YOLO and DenseNet, 5 runs each
    python benchmarks/layout_gain.py --models yolo,densenet -r 30 --threads 2

Medians of wall time and of the calling thread's CPU time (steadier on a loaded machine; at
more than 1 thread the CPU time leaves out the pool's threads: read the wall column). Also
how many convolutions write their output channels-last at each level.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

import onnxrun

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import run_suite  # noqa: E402 - the benchmarks' shared helpers, beside this script

sys.path.pop(0)
LIGHT_CNNS = ("densenet121", "inception_v1", "inception_v2", "resnet50", "shufflenet",
              "squeezenet")
SUITE_CNNS = ("yolo_style", "dbnet_style", "densenet_style", "inception_style")
QUICK = ("yolo_style", "densenet_style")


def cases(words: list[str], quick: bool) -> list[tuple[str, str, dict[str, np.ndarray] | None]]:
    """(label, model path, feeds or None for random ones)."""
    names = QUICK if quick else SUITE_CNNS + tuple(f"zoo:{n}" for n in LIGHT_CNNS)
    return run_suite.ab_cases(names, words)


def channels_last_convs(sess: onnxrun.InferenceSession) -> tuple[int, int]:
    steps = [s for s in sess._program.steps if s.node.op_type in ("Conv", "FusedConv")]
    return sum(bool(getattr(s.kernel, "channels_last", False)) for s in steps), len(steps)


def compare(model: str, feeds, runs: int, threads: int) -> dict[str, float]:
    from onnxrun.tools.common import make_feeds

    sessions = {}
    for level in (onnxrun.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
                  onnxrun.GraphOptimizationLevel.ORT_ENABLE_LAYOUT):
        so = onnxrun.SessionOptions()
        so.graph_optimization_level = level
        so.intra_op_num_threads = threads
        sessions[int(level)] = onnxrun.InferenceSession(model, so)
    if feeds is None:
        feeds, _ = make_feeds(sessions[2], {}, {}, 0)
    first = {k: s.run(None, feeds) for k, s in sessions.items()}
    diff = max(float(np.max(np.abs(a - b))) for a, b in zip(first[2], first[3], strict=True))
    wall: dict[int, list[float]] = {k: [] for k in sessions}
    cpu: dict[int, list[float]] = {k: [] for k in sessions}
    order = list(sessions.items())
    for i in range(runs):
        for level, sess in (order if i % 2 == 0 else order[::-1]):
            c0, t0 = time.thread_time(), time.perf_counter()
            sess.run(None, feeds)
            wall[level].append(time.perf_counter() - t0)
            cpu[level].append(time.thread_time() - c0)
    cl2, n = channels_last_convs(sessions[2])
    cl3, _ = channels_last_convs(sessions[3])
    return {"wall2": float(np.median(wall[2])), "wall3": float(np.median(wall[3])),
            "cpu2": float(np.median(cpu[2])), "cpu3": float(np.median(cpu[3])),
            "convs": n, "cl2": cl2, "cl3": cl3, "diff": diff}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="", help="comma-separated words to select cases")
    parser.add_argument("-r", "--runs", type=int, default=None, help="runs (default 20; quick 5)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    runs = args.runs or (5 if args.quick else 20)
    words = [w.strip().lower() for w in args.models.split(",") if w.strip()]
    load = "/".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"level 3 (ORT_ENABLE_LAYOUT) vs level 2 (ORT_ENABLE_EXTENDED), onnxrun, {runs} runs "
          f"each, interleaved, {args.threads} thread(s); load before: {load}")
    header = ["model", "channels-last convs (2 -> 3)", "wall 2", "wall 3", "3/2", "CPU 2",
              "CPU 3", "3/2", "max diff"]
    print("\n".join(run_suite.markdown(header, [])))
    for label, model, feeds in cases(words, args.quick):
        r = compare(model, feeds, runs, args.threads)
        row = [label, f"{r['cl2']} -> {r['cl3']} of {r['convs']}", f"{r['wall2'] * 1e3:.1f} ms",
               f"{r['wall3'] * 1e3:.1f} ms", f"{r['wall3'] / r['wall2']:.2f}",
               f"{r['cpu2'] * 1e3:.1f} ms", f"{r['cpu3'] * 1e3:.1f} ms",
               f"{r['cpu3'] / r['cpu2']:.2f}", f"{r['diff']:.1e}"]
        print(run_suite.markdown(header, [row])[-1], flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
