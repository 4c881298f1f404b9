"""What one optimizer pass gains: onnxrun with the pass against onnxrun without it
(``disabled_optimizers``), both sessions in this process, run in turn
(``tools.bench.time_alternating``: the order reversed every round), so a loaded machine's slow
windows hit both alike.

    python benchmarks/pass_gain.py --passes BatchNormMulAddFusion --models zoo:densenet121
    python benchmarks/pass_gain.py --passes BatchNormReluFusion --models densenet_style \\
        --threads 1,2 -r 30

``--models``: run_suite.ab_cases names ("zoo:NAME", "bench:FOLDER", a suite_models.py name).
Medians in ms and the ratio (with / without: below 1, the pass helps); the outputs of the two
sessions are compared (largest absolute difference) so a pass that changed the numbers shows.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import onnxrun
from onnxrun.tools.bench import max_abs_diff, time_alternating

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import run_suite  # noqa: E402 - the benchmarks' shared helpers, beside this script

sys.path.pop(0)


def session(model: str, threads: int, disabled: list[str]) -> onnxrun.InferenceSession:
    so = onnxrun.SessionOptions()
    so.intra_op_num_threads = threads
    return onnxrun.InferenceSession(model, so, providers=["CPUExecutionProvider"],
                                    disabled_optimizers=disabled)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--passes", required=True, help="comma-separated pass names to switch off")
    ap.add_argument("--models", required=True, help="comma-separated run_suite.ab_cases names")
    ap.add_argument("--threads", default="1", help="comma-separated intra-op thread counts")
    ap.add_argument("-r", "--rounds", type=int, default=20)
    args = ap.parse_args(argv)
    passes = [p.strip() for p in args.passes.split(",") if p.strip()]
    names = [m.strip() for m in args.models.split(",") if m.strip()]
    print("| model | threads | with (ms) | without (ms) | ratio | max abs diff |")
    print("|---|---:|---:|---:|---:|---:|")
    for label, model, feeds in run_suite.ab_cases(names, []):
        for threads in (int(t) for t in args.threads.split(",")):
            with_pass = session(model, threads, [])
            without = session(model, threads, passes)
            if feeds is None:
                from onnxrun.tools.common import make_feeds

                feeds, _ = make_feeds(with_pass, {}, {}, 0)
            times, firsts = time_alternating(
                [lambda s=s, f=feeds: s.run(None, f) for s in (with_pass, without)],
                warmup=3, repeat=args.rounds)
            a, b = (statistics.median(t) * 1e3 for t in times)
            diff = max_abs_diff(*firsts)
            shown = "-" if diff is None else f"{diff:.1e}"
            print(f"| {label} | {threads} | {a:.2f} | {b:.2f} | {a / b:.3f} | {shown} |",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
