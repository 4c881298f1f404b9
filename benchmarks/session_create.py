"""Session creation time and peak memory, onnxrun next to onnxruntime (issue #18).

    python benchmarks/session_create.py --quick            # the suite's quick cases, 3 rounds
    python benchmarks/session_create.py --baseline-src /path/to/old/src   # before / after

Each measurement is one engine in a fresh child process (``tools.bench.measure_isolated``: the
imports and the inputs first, then the session created (timed) and run once; 'peak +' is the
peak resident size after that, minus the peak before it), the engines taking turns within each
round. ``--baseline-src`` adds a column for the onnxrun whose ``src`` folder is given (a
checkout of an older commit: ``git worktree add /tmp/old <commit>``), measured the same way.
'import + create': the engine's import in that child (after numpy's) and the creation, what a
fresh process waits before its first run (onnxruntime builds its kernel registry in its import;
onnxrun imports an operator family's kernels when a session first needs them).
Medians over the rounds. The cases and their inputs are run_suite.py's. ``--cpu``: the
creation's CPU time (the child process's) instead of wall time, steadier on a loaded machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np

from onnxrun.tools.bench import BenchOptions, measure_isolated

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run_suite  # noqa: E402


def cases(words: list[str], quick: bool) -> list[run_suite.Case]:
    cache = run_suite.default_cache()
    generated, _ = run_suite.generated_cases(cache)
    found = run_suite.zoo_cases() + generated + run_suite.suite_model_cases(cache, words, quick)
    if quick:
        found = [c for c in found if c.quick]
    if words:
        found = [c for c in found if any(w in c.name.lower() for w in words)]
    return found


def feeds_for(case: run_suite.Case, path: str) -> None:
    import onnxrun
    from onnxrun.tools.common import make_feeds

    sess = onnxrun.InferenceSession(case.model, providers=["CPUExecutionProvider"])
    feeds, _ = make_feeds(sess, case.files, case.dims, 0)
    np.savez(path, **{k: np.asarray(v) for k, v in feeds.items()})


def fmt_ms(s: float | None) -> str:
    return "-" if s is None else f"{s * 1e3:.0f} ms"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the suite's quick cases")
    parser.add_argument("-r", "--rounds", type=int, default=3, help="rounds (default 3)")
    parser.add_argument("--models", default="", help="comma-separated words of case names")
    parser.add_argument("--baseline-src", type=Path, default=None,
                        help="the src folder of another onnxrun to measure too ('before')")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads (default 1)")
    parser.add_argument("--cpu", action="store_true",
                        help="creation as the child's CPU time, not wall time (a loaded host)")
    args = parser.parse_args(argv)
    words = [w.strip().lower() for w in args.models.split(",") if w.strip()]
    opts = BenchOptions(intra_op_threads=args.threads)
    engines: list[tuple[str, str, dict[str, str] | None]] = []
    if args.baseline_src is not None:
        engines.append(("before", "onnxrun", {"PYTHONPATH": str(args.baseline_src.resolve())}))
    engines += [("onnxrun", "onnxrun", None), ("onnxruntime", "onnxruntime", None)]
    names = [e[0] for e in engines]
    rows = []
    with tempfile.TemporaryDirectory(prefix="onnxrun-create-") as tmp:
        for case in cases(words, args.quick):
            feeds = os.path.join(tmp, "feeds.npz")
            feeds_for(case, feeds)
            got: dict[str, list] = {n: [] for n in names}
            for r in range(args.rounds):
                order = engines if r % 2 == 0 else engines[::-1]
                for name, engine, env in order:
                    got[name].append(measure_isolated(engine, case.model, feeds, opts,
                                                      env_extra=env))
            create = {n: statistics.median(i.create_cpu_s if args.cpu else i.create_s
                                           for i in v) for n, v in got.items()}
            ready = {n: statistics.median(i.import_s + (i.create_cpu_s if args.cpu else
                                                        i.create_s) for i in v)
                     for n, v in got.items()}
            peak = {n: statistics.median((i.peak_bytes - i.baseline_bytes) / 2**20 for i in v)
                    for n, v in got.items()}
            rows.append((case, create, ready, peak))
            print(f"{case.name}: " + ", ".join(
                f"{n} {fmt_ms(create[n])} (with the import {fmt_ms(ready[n])}) "
                f"+{peak[n]:.1f} MiB" for n in names), file=sys.stderr, flush=True)
    ref = "onnxruntime"
    header = ["model"] + [f"create {n}" for n in names] + ["ratio"] + \
        [f"import + create {n}" for n in names] + ["ratio"] + \
        [f"peak + {n} (MiB)" for n in names] + ["ratio"]
    if args.baseline_src is not None:
        header.insert(len(names) + 2, "ratio before")
        header.insert(2 * len(names) + 4, "ratio before")
        header.append("ratio before")
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    geo: dict[str, list[float]] = {"c": [], "cb": [], "r": [], "rb": [], "p": [], "pb": []}
    for case, create, ready, peak in rows:
        cells = [case.name] + [fmt_ms(create[n]) for n in names]
        cells.append(f"{create['onnxrun'] / create[ref]:.2f}")
        geo["c"].append(create["onnxrun"] / create[ref])
        if "before" in create:
            cells.append(f"{create['before'] / create[ref]:.2f}")
            geo["cb"].append(create["before"] / create[ref])
        cells += [fmt_ms(ready[n]) for n in names]
        cells.append(f"{ready['onnxrun'] / ready[ref]:.2f}")
        geo["r"].append(ready["onnxrun"] / ready[ref])
        if "before" in ready:
            cells.append(f"{ready['before'] / ready[ref]:.2f}")
            geo["rb"].append(ready["before"] / ready[ref])
        cells += [f"{peak[n]:.1f}" for n in names]
        cells.append(f"{peak['onnxrun'] / peak[ref]:.2f}")
        geo["p"].append(peak["onnxrun"] / peak[ref])
        if "before" in peak:
            cells.append(f"{peak['before'] / peak[ref]:.2f}")
            geo["pb"].append(peak["before"] / peak[ref])
        lines.append("| " + " | ".join(cells) + " |")

    def gm(v: list[float]) -> str:
        return f"**{float(np.exp(np.mean(np.log(v)))):.2f}**" if v else ""

    last = ["**geometric mean**"] + [""] * len(names) + [gm(geo["c"])]
    if args.baseline_src is not None:
        last.append(gm(geo["cb"]))
    last += [""] * len(names) + [gm(geo["r"])]
    if args.baseline_src is not None:
        last.append(gm(geo["rb"]))
    last += [""] * len(names) + [gm(geo["p"])]
    if args.baseline_src is not None:
        last.append(gm(geo["pb"]))
    lines.append("| " + " | ".join(last) + " |")
    print("\n".join(lines))
    print(f"\nLoad average: {' / '.join(f'{x:.2f}' for x in os.getloadavg())}; "
          f"{args.rounds} rounds, medians; {args.threads} intra-op thread(s); creation "
          f"{'CPU' if args.cpu else 'wall'} time.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
