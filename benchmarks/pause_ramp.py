"""How a session's runs speed up after an idle pause, onnxrun next to onnxruntime: the time of
a run after a pause (the suite's SETTLE_SECONDS) and 1, 3 or 10 untimed runs, and back to
back, per engine, at the given intra-op threads.

    python benchmarks/pause_ramp.py --models gpt,svtr --threads 2
    python benchmarks/pause_ramp.py --models yolo --threads 2 -r 25

Why: run_suite.py pauses before each engine's turn (so that the other engine's idle workers
stop spinning) and warms it with one run; on a 2-vCPU VM the two engines' 2-thread runs
reach their steady speed after different numbers of runs (docs/PERFORMANCE.md, session 14),
which that one warm run does not show. Each engine runs in this process in turn.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import onnxrun

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run_suite  # noqa: E402 - the benchmarks' shared helpers, beside this script

sys.path.pop(0)
CASES = ("bench:gpt_decoder", "svtr_style", "yolo_style", "zoo:shufflenet")
WARMS = (1, 3, 10)


def ramp(session, feeds: dict, repeat: int, pause: float) -> dict:
    """Medians (ms) of a run after ``pause`` s and each of WARMS untimed runs, and back to
    back."""
    for _ in range(10):
        session.run(None, feeds)
    out = {}
    for warm in WARMS:
        times = []
        for _ in range(repeat):
            time.sleep(pause)
            for _ in range(warm):
                session.run(None, feeds)
            t0 = time.perf_counter()
            session.run(None, feeds)
            times.append(time.perf_counter() - t0)
        out[f"after {warm}"] = statistics.median(times) * 1e3
    times = []
    for _ in range(3 * repeat):
        t0 = time.perf_counter()
        session.run(None, feeds)
        times.append(time.perf_counter() - t0)
    out["back to back"] = statistics.median(times) * 1e3
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="", help="comma-separated words to select cases")
    parser.add_argument("--threads", type=int, default=2, help="intra-op threads (default 2)")
    parser.add_argument("-r", "--repeat", type=int, default=15, help="timed runs per column")
    parser.add_argument("--pause", type=float, default=0.15, help="seconds idle before a run")
    args = parser.parse_args(argv)
    import onnxruntime as ort

    words = [w.strip().lower() for w in args.models.split(",") if w.strip()]
    rows = []
    for label, model, feeds in run_suite.ab_cases(CASES, words):
        if feeds is None:
            from onnxrun.tools.common import make_feeds

            feeds, _ = make_feeds(onnxrun.InferenceSession(model), {}, {}, 0)
        for name, mod in (("onnxrun", onnxrun), ("onnxruntime", ort)):
            so = mod.SessionOptions()
            so.intra_op_num_threads = args.threads
            session = mod.InferenceSession(model, so, providers=["CPUExecutionProvider"])
            got = ramp(session, feeds, args.repeat, args.pause)
            rows.append([label, name, *(f"{v:.2f}" for v in got.values())])
            del session
    print(f"{args.threads} intra-op thread(s), {args.pause} s pauses, medians of "
          f"{args.repeat} (ms)\n")
    print("\n".join(run_suite.markdown(["model", "engine", *(f"after {w} warm" for w in WARMS),
                                        "back to back"], rows)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
