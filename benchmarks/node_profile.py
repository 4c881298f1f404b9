"""Where a CNN's run goes, node by node, in onnxrun and in onnxruntime: both engines' own
profilers (SessionOptions.enable_profiling, onnxruntime's Chrome-trace format), 1 intra-op
thread, the kernel time per operator type and the slowest nodes with their shapes beside
onnxruntime's nodes of the same operator and shapes (its node names differ: fusions, NCHWc).

    python benchmarks/node_profile.py                       # the suite's CNN cases
    python benchmarks/node_profile.py --quick               # fewer runs, YOLO and squeezenet
    python benchmarks/node_profile.py --models shufflenet -r 20 --top 30
    python benchmarks/node_profile.py --threads 1,2 --models squeezenet   # onnxrun 1T vs 2T
    python benchmarks/node_profile.py --threads 1,2 --models mobilenet    # (the cache's, generated)
    python benchmarks/node_profile.py --models bert     # also bert, svtr, vad: by name only

Profiled times include each engine's per-node cost of the profiler; compare rows, not the
totals with run_suite.py's. Each row is the median over the runs of its nodes' time in a run.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

import onnxrun

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import run_suite  # noqa: E402 - the benchmarks' shared helpers, beside this script

sys.path.pop(0)
CASES = ("yolo_style", "zoo:squeezenet", "zoo:shufflenet", "densenet_style", "zoo:resnet50",
         "bench:mobilenet_v2")
QUICK = ("yolo_style", "zoo:squeezenet")
# not CNNs, profiled when --models names them: python benchmarks/node_profile.py --models bert
NAMED_ONLY = ("bench:bert_minilm_l6", "svtr_style", "vad_style", "dbnet_style", "crnn_style",
              "regnet_style", "efficientnet_style", "inception_style",
              "bench:gpt_decoder")
# runs before the profiled ones: onnxrun's memory pattern is recorded by the second run and
# probed by the third (memory.py); from the fourth, the intermediates are in its arena
WARM_UP = 3


def node_events(engine: str, model: str, feeds: dict, runs: int,
                threads: int = 1) -> list[dict]:
    """The kernel-time events of ``runs`` profiled runs (after WARM_UP runs) of ``engine``."""
    import onnxruntime as ort

    folder = tempfile.mkdtemp(prefix="node-profile-")
    mod = ort if engine == "onnxruntime" else onnxrun
    so = mod.SessionOptions()
    so.intra_op_num_threads = threads
    so.enable_profiling = True
    so.profile_file_prefix = os.path.join(folder, engine)
    sess = mod.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    for _ in range(runs + WARM_UP):
        sess.run(None, feeds)
    with open(sess.end_profiling()) as f:
        events = [e for e in json.load(f) if e.get("cat") == "Node" and
                  e["name"].endswith("_kernel_time")]
    # the warm-up's events are the first ones of each node: dropped
    seen: collections.Counter[str] = collections.Counter()
    kept = []
    for e in events:
        if seen[e["name"]] >= WARM_UP:
            kept.append(e)
        seen[e["name"]] += 1
    return kept


def _key(e: dict) -> tuple[str, str]:
    a = e["args"]
    shapes = [list(s.values())[0] for s in a.get("input_type_shape", [])[:2]]
    return a.get("op_name", "?"), " ".join("x".join(map(str, s)) for s in shapes)


def _medians(events: list[dict], group) -> dict:
    """Per group of nodes, the median over the runs of the group's time in a run (a run's
    events: each node's n-th event is in run n; a mean let one descheduled node of one run
    outweigh the rest, ~3 ms on YOLO's 0.15 ms of 128 x 10 x 10 QuickGelus at load 1)."""
    seen: collections.Counter[str] = collections.Counter()
    sums: dict = collections.defaultdict(lambda: collections.defaultdict(float))
    for e in events:
        sums[group(e)][seen[e["name"]]] += e["dur"]
        seen[e["name"]] += 1
    return {k: statistics.median(v.values()) for k, v in sums.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="", help="comma-separated words to select cases")
    parser.add_argument("-r", "--runs", type=int, default=None, help="profiled runs (10; "
                        "quick 5)")
    parser.add_argument("--top", type=int, default=20, help="slowest node groups shown")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--threads", default="",
                        help="two thread counts (1,2): onnxrun at each, instead of the engines")
    args = parser.parse_args(argv)
    counts = [int(t) for t in args.threads.split(",") if t.strip()]
    if counts and len(counts) != 2:
        parser.error("--threads takes two counts, such as 1,2")
    runs = args.runs or (5 if args.quick else 10)
    words = [w.strip().lower() for w in args.models.split(",") if w.strip()]
    print(f"load before: {'/'.join(f'{x:.2f}' for x in os.getloadavg())}; {runs} profiled "
          "runs per engine, "
          + ("onnxrun at {} and {} threads".format(*counts) if counts else "1 thread")
          + "; microseconds per run")
    for label, model, feeds in run_suite.ab_cases(
            QUICK if args.quick else CASES + NAMED_ONLY if words else CASES, words):
        if feeds is None:
            from onnxrun.tools.common import make_feeds

            feeds, _ = make_feeds(onnxrun.InferenceSession(model), {}, {}, 0)
        if counts:  # the same engine at both counts
            names = [f"onnxrun {t}T" for t in counts]
            ours, theirs = (node_events("onnxrun", model, feeds, runs, t) for t in counts)
        else:
            names = ["onnxrun", "onnxruntime"]
            ours, theirs = (node_events(e, model, feeds, runs)
                            for e in ("onnxrun", "onnxruntime"))
        per_op: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0])
        per_key: dict[tuple, list[float]] = collections.defaultdict(lambda: [0.0, 0.0])
        for i, events in enumerate((ours, theirs)):
            for group, table in ((lambda e: e["args"].get("op_name", "?"), per_op),
                                 (_key, per_key)):
                for k, v in _medians(events, group).items():
                    table[k][i] = v
        total = [sum(v[i] for v in per_op.values()) for i in (0, 1)]
        print(f"\n## {label}: kernels {total[0]:.0f} us ({names[0]}), {total[1]:.0f} us "
              f"({names[1]})\n")
        print("\n".join(run_suite.markdown(
            ["operator", *names],
            [[op, f"{a:.0f}", f"{b:.0f}"] for op, (a, b) in
             sorted(per_op.items(), key=lambda kv: -max(kv[1]))])))
        print()
        rows = sorted(per_key.items(), key=lambda kv: -(kv[1][0] - kv[1][1]))[:args.top]
        print("\n".join(run_suite.markdown(
            ["operator", "inputs", *names, "gap"],
            [[op, shapes, f"{a:.0f}", f"{b:.0f}", f"{a - b:+.0f}"]
             for (op, shapes), (a, b) in rows])), flush=True)
    print(f"\nload after: {'/'.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
