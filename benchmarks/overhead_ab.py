"""This checkout's executor overhead against another's (before / after), children taking turns.

Three small workloads whose time is mostly per-run and per-node cost, each measured in a fresh
child process per round (the two source trees alternating, the order reversed every round) as
the calling thread's CPU time, so a loaded machine's waits stay out:

- ``vad``: the suite's VAD-style streaming model (If, LSTM, 512 samples): median CPU per run;
- ``chain``: the suite's chain of 1000 Add/Mul nodes on 16 floats: median CPU per run (/ 1000:
  per node);
- ``decode``: the small int4 Llama (tests/genai/make_models.py, cached; skipped where it cannot
  be built): CPU per decode step (128-token prompt, 32 new tokens, best 3 of 5).

    python benchmarks/overhead_ab.py --baseline-src /path/to/other/checkout/src
    python benchmarks/overhead_ab.py --baseline-src ../main/src --quick --cases vad,chain
    python benchmarks/overhead_ab.py --baseline-src ../main/src --cases decode --threads 1

Each child imports onnxrun from the tree it is given (PYTHONPATH), so both run with this
interpreter and its packages. A run inside one process keeps its caches warm: compare these
figures with each other, and the side-by-side ratio to onnxruntime with run_overhead.py /
run_suite.py.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"

CHILD = r'''
import json, sys, time
from pathlib import Path
import numpy as np
case, bench, runs = sys.argv[1], sys.argv[2], int(sys.argv[3])
sys.path.insert(0, bench)
if case == "decode":
    sys.path.insert(0, str(Path(bench).parent / "tests" / "genai"))
    import make_models
    import onnxrun.genai as og
    folder = make_models.build("llama", "small", "int4")
    if int(sys.argv[4]):  # the folder with intra_op_num_threads set (genai.py's view)
        import tempfile
        sys.path.insert(0, str(Path(bench)))
        import genai
        folder = genai.threaded_view(folder, int(sys.argv[4]), Path(tempfile.mkdtemp()))
    model = og.Model(str(folder))
    vocab = json.loads((folder / "genai_config.json").read_text())["model"]["vocab_size"]
    prompt = np.random.default_rng(0).integers(5, vocab, (1, 128)).astype(np.int32)

    def once(n=32):
        p = og.GeneratorParams(model)
        p.set_search_options(max_length=128 + n + 1, do_sample=False)
        g = og.Generator(model, p)
        g.append_tokens(prompt)
        g.generate_next_token()
        c = time.thread_time()
        for _ in range(n - 1):
            g.generate_next_token()
        return (time.thread_time() - c) / (n - 1) * 1e6

    once()
    once()
    print(json.dumps(sorted(once() for _ in range(5))[:3]))
else:
    import onnxrun
    if case == "vad":
        import suite_models
        m, feeds = suite_models.build_vad()
        data = m.SerializeToString()
    else:
        import tempfile
        import run_suite
        path = Path(tempfile.mkdtemp()) / "chain.onnx"
        run_suite.chain_model(path)
        data, feeds = str(path), {"X": np.random.rand(1, 16).astype(np.float32)}
    so = onnxrun.SessionOptions()
    so.intra_op_num_threads = 1
    s = onnxrun.InferenceSession(data, so)
    for _ in range(30):
        s.run(None, feeds)
    ts = []
    for _ in range(runs):
        c = time.thread_time()
        s.run(None, feeds)
        ts.append(time.thread_time() - c)
    print(json.dumps([float(np.median(ts)) * 1e6]))
'''


def _child(src: Path, case: str, runs: int, threads: int = 0) -> list[float]:
    env = dict(os.environ, PYTHONPATH=str(src))
    out = subprocess.run([sys.executable, "-c", CHILD, case, str(HERE), str(runs),
                          str(threads)], env=env,
                         capture_output=True, text=True, cwd=str(HERE))
    if out.returncode:
        raise RuntimeError(f"{case} child ({src}) failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline-src", required=True, type=Path,
                    help="the src folder of the other checkout (before)")
    ap.add_argument("--cases", default="vad,chain,decode")
    ap.add_argument("--rounds", type=int, default=None, help="children per tree (default 6)")
    ap.add_argument("--quick", action="store_true", help="2 rounds, 200 runs a child")
    ap.add_argument("--threads", type=int, default=0,
                    help="decode: the session's intra_op_num_threads (default: the folder's, "
                         "i.e. onnxrun's default)")
    args = ap.parse_args(argv)
    rounds = args.rounds or (2 if args.quick else 6)
    runs = 200 if args.quick else 400
    trees = {"before": args.baseline_src.resolve(), "after": SRC.resolve()}
    load = "/".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"before: {trees['before']}\nafter:  {trees['after']}\nload before: {load}")
    for case in args.cases.split(","):
        got: dict[str, list[float]] = {k: [] for k in trees}
        try:
            for r in range(rounds):
                for name in (list(trees) if r % 2 == 0 else list(trees)[::-1]):
                    got[name] += _child(trees[name], case, runs, args.threads)
        except RuntimeError as e:
            print(f"{case}: skipped ({str(e).splitlines()[0]})")
            continue
        before, after = (float(np.median(got[k])) for k in trees)
        unit = "per decode step" if case == "decode" else "per run"
        extra = f" ({before / 1000:.2f} -> {after / 1000:.2f} µs a node)" if case == "chain" \
            else ""
        print(f"{case:7s} CPU {unit}: before {before:9.1f} µs, after {after:9.1f} µs, "
              f"after/before {after / before:.2f}{extra}")
    load = "/".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"load after: {load}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
