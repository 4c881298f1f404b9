"""What a 0.15 s idle pause before a run costs each engine at 1 and 2 intra-op threads (issue
#18): run_suite.py's 2-thread columns paused before every switch of engine (tools/bench.py
SETTLE_SECONDS) and timed the run right after it, its 1-thread columns never paused, so a
cold run's cost read as a 2-thread loss. Since session 11 ``time_alternating`` runs once
untimed after each pause. Per model and engine, alternating 1T / 2T and warm / after-a-pause
runs in one process; medians of the wall time.

    python benchmarks/cold_runs.py --quick      # VAD-style, shufflenet; 10 rounds
    python benchmarks/cold_runs.py -r 20 --models vad,shufflenet,densenet,squeezenet
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import run_suite  # noqa: E402 - the benchmarks' shared helpers, beside this script

sys.path.pop(0)
CASES = ("vad_style", "zoo:shufflenet", "densenet_style", "zoo:squeezenet")
PAUSE = 0.15  # tools/bench.py SETTLE_SECONDS


def main(argv: list[str] | None = None) -> int:
    import onnxruntime as ort

    import onnxrun
    from onnxrun.tools.common import make_feeds

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="", help="comma-separated words to select cases")
    ap.add_argument("-r", "--rounds", type=int, default=None, help="rounds (20; quick 10)")
    ap.add_argument("--quick", action="store_true", help="VAD-style and shufflenet, 10 rounds")
    args = ap.parse_args(argv)
    words = [w.strip().lower() for w in args.models.split(",") if w.strip()] or \
        (["vad", "shufflenet"] if args.quick else [])
    rounds = args.rounds or (10 if args.quick else 20)
    print(f"load before: {'/'.join(f'{x:.2f}' for x in os.getloadavg())}; {rounds} rounds; "
          f"ms, medians; 'paused': the run right after a {PAUSE} s sleep")
    print("| model | engine | 1T warm | 2T warm | 1T paused | 2T paused |")
    print("| --- | --- | --: | --: | --: | --: |")
    for label, model, feeds in run_suite.ab_cases(CASES, words):
        if feeds is None:
            feeds, _ = make_feeds(onnxrun.InferenceSession(model), {}, {}, 0)
        for name, mod in (("onnxrun", onnxrun), ("onnxruntime", ort)):
            sessions = {}
            for t in (1, 2):
                so = mod.SessionOptions()
                so.intra_op_num_threads = t
                sessions[t] = mod.InferenceSession(model, so,
                                                   providers=["CPUExecutionProvider"])
                sessions[t].run(None, feeds)
            times: dict[tuple[int, bool], list[float]] = {
                (t, p): [] for t in (1, 2) for p in (False, True)}
            for r in range(rounds):
                for t in ((1, 2) if r % 2 == 0 else (2, 1)):
                    for paused in (False, True):
                        if paused:
                            time.sleep(PAUSE)
                        else:
                            sessions[t].run(None, feeds)  # warm: right after a run
                        t0 = time.perf_counter()
                        sessions[t].run(None, feeds)
                        times[(t, paused)].append(time.perf_counter() - t0)
            med = {k: float(np.median(v)) * 1e3 for k, v in times.items()}
            print(f"| {label} | {name} | {med[(1, False)]:.3f} | {med[(2, False)]:.3f} | "
                  f"{med[(1, True)]:.3f} | {med[(2, True)]:.3f} |", flush=True)
    print(f"load after: {'/'.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
