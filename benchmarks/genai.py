"""onnxrun.genai next to onnxruntime-genai on the same model folder (issue #14's speed table).

Per model and thread count, both engines in one process, taking turns (the order reversed
every repeat): prompt processing time (a prompt of --prompt tokens, one ``append_tokens``),
decode speed (--new-tokens greedy ``generate_next_token`` calls after it, tokens/s, and the
per-token latency), and each engine's peak resident memory, measured in a child process of its own
(load, the prompt, the decode; VmHWM). Folders come from tests/genai/make_models.py (the
builder's int4 by default; built and cached on first use). Threads: a view of the folder (the
model files linked) whose genai_config.json sets ``session_options.intra_op_num_threads``.

    python benchmarks/genai.py            # small (4 layers, hidden 256) and 0.5b, 1 and 2 threads
    python benchmarks/genai.py --quick    # small only, short prompt, one thread
    python benchmarks/genai.py --profile --models small --threads 1   # where a token goes

``--profile`` adds, per model and thread count, onnxrun's decode step taken apart: the time in
each operator's kernels (onnxrun's node profiler, per token) and the rest of the step (the
generator, the search, ``InferenceSession.run`` and the run loop), the step's own time
measured without the profiler as the process's CPU time (with 2 threads, both threads' CPU).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "genai"))

MODELS = {"small": ("llama", "small"), "0.5b": ("qwen2", "0.5b")}


def _engine(name: str):
    if name == "onnxruntime-genai":
        import onnxruntime_genai as og

        return og
    import onnxrun.genai as og

    return og


def threaded_view(folder: Path, threads: int, root: Path) -> Path:
    """``folder`` with genai_config.json asking for ``threads`` intra-op threads."""
    view = root / f"{folder.name}-t{threads}"
    if not view.exists():
        view.mkdir(parents=True)
        for f in folder.iterdir():
            if f.name != "genai_config.json":
                (view / f.name).symlink_to(f.resolve())
        cfg = json.loads((folder / "genai_config.json").read_text())
        cfg["model"]["decoder"].setdefault("session_options", {})["intra_op_num_threads"] = threads
        (view / "genai_config.json").write_text(json.dumps(cfg, indent=2))
    return view


def prompt_tokens(folder: Path, length: int) -> np.ndarray:
    vocab = json.loads((folder / "genai_config.json").read_text())["model"]["vocab_size"]
    return np.random.default_rng(0).integers(5, vocab, (1, length)).astype(np.int32)


def one_run(og, model, prompt: np.ndarray, new_tokens: int, clock=time.perf_counter
            ) -> tuple[float, float]:
    """(prompt seconds, decode seconds for new_tokens tokens), on ``clock``."""
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=prompt.shape[1] + new_tokens + 1, do_sample=False)
    gen = og.Generator(model, params)
    t0 = clock()
    gen.append_tokens(prompt)
    t1 = clock()
    for _ in range(new_tokens):
        gen.generate_next_token()
    t2 = clock()
    return t1 - t0, t2 - t1


def decode_profile(model, prompt: np.ndarray, new_tokens: int) -> tuple[float, dict]:
    """(CPU ms per decode step without the profiler, the best of 3 runs; {operator: ms per
    step in its kernels, the median call times the calls})."""
    import onnxrun.genai as og
    from onnxrun import profile

    # the process's CPU time: what a loaded machine's waits would add to the wall time is out
    plain = min(one_run(og, model, prompt, new_tokens, time.process_time)[1] for _ in range(3))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=prompt.shape[1] + new_tokens + 1, do_sample=False)
    gen = og.Generator(model, params)
    gen.append_tokens(prompt)
    gen.generate_next_token()  # the prompt's token: its logits came with the prompt
    profiler = profile.Profiler(os.path.join(tempfile.gettempdir(), "onnxrun-genai-profile"))
    token = profiler.activate()
    try:
        for _ in range(new_tokens - 1):
            gen.generate_next_token()
    finally:
        profile.Profiler.deactivate(token)
    durations: dict[str, list[float]] = {}
    for event in profiler._events:
        if event["cat"] == "Node":
            durations.setdefault(event["args"]["op_name"], []).append(event["dur"] / 1e3)
    # median call times count the calls, not the preemptions of a loaded machine
    steps = new_tokens - 1
    per_op = {op: float(np.median(d)) * len(d) / steps for op, d in durations.items()}
    return plain / new_tokens * 1e3, per_op


def print_profile(name: str, threads: int, step_ms: float, per_op: dict,
                  genai_ms: float) -> None:
    kernels = sum(per_op.values())
    print(f"\n{name} threads={threads}: onnxrun decode step {step_ms:.2f} ms CPU "
          f"(onnxruntime-genai {genai_ms:.2f} ms CPU, {step_ms / genai_ms:.1f}x); kernels "
          f"{kernels:.2f} ms (profiled), the rest {max(0.0, step_ms - kernels):.2f} ms")
    for op, ms in sorted(per_op.items(), key=lambda kv: -kv[1]):
        if ms >= 0.005:
            print(f"  {op:34s} {ms:8.3f} ms  {100 * ms / step_ms:5.1f}%")


def child(engine: str, folder: str, prompt_len: int, new_tokens: int) -> None:
    og = _engine(engine)
    model = og.Model(folder)
    one_run(og, model, prompt_tokens(Path(folder), prompt_len), new_tokens)
    # VmHWM, not ru_maxrss: a child's ru_maxrss starts from its parent's at fork and is kept
    # across exec, VmHWM belongs to the new program's own memory
    status = Path("/proc/self/status").read_text().split("\n")
    print(next(ln.split()[1] for ln in status if ln.startswith("VmHWM:")))  # KiB


def peak_mib(engine: str, folder: Path, prompt_len: int, new_tokens: int) -> float:
    out = subprocess.run([sys.executable, __file__, "--child", engine, str(folder),
                          str(prompt_len), str(new_tokens)], capture_output=True, text=True,
                         check=True)
    return int(out.stdout.split()[-1]) / 1024


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--models", default=None, help="comma-separated: small, 0.5b")
    ap.add_argument("--threads", default=None, help="comma-separated thread counts")
    ap.add_argument("--prompt", type=int, default=None)
    ap.add_argument("--new-tokens", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--format", default="int4", choices=("int4", "fp32"))
    ap.add_argument("--profile", action="store_true",
                    help="also take onnxrun's decode step apart by operator")
    ap.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(args.child[0], args.child[1], int(args.child[2]), int(args.child[3]))
        return 0
    models = (args.models or ("small" if args.quick else "small,0.5b")).split(",")
    threads = [int(t) for t in (args.threads or ("1" if args.quick else "1,2")).split(",")]
    prompt_len = args.prompt or (64 if args.quick else 512)
    new_tokens = args.new_tokens or (16 if args.quick else 64)
    repeats = args.repeats or (2 if args.quick else 3)
    import make_models

    engines = ("onnxruntime-genai", "onnxrun")
    root = Path(tempfile.mkdtemp(prefix="onnxrun-genai-bench-"))
    rows, profiles = [], []
    for name in models:
        arch, size = MODELS[name]
        folder = make_models.build(arch, size, args.format)
        prompt = prompt_tokens(folder, prompt_len)
        for t in threads:
            view = threaded_view(folder, t, root)
            loaded = {e: (_engine(e), _engine(e).Model(str(view))) for e in engines}
            times: dict[str, list[tuple[float, float]]] = {e: [] for e in engines}
            for r in range(repeats):  # turns alternate: A B, B A, ...
                for e in engines if r % 2 == 0 else engines[::-1]:
                    og, model = loaded[e]
                    times[e].append(one_run(og, model, prompt, new_tokens))
            if args.profile:
                og_g, model_g = loaded["onnxruntime-genai"]
                genai_cpu = min(one_run(og_g, model_g, prompt, new_tokens, time.process_time)[1]
                                for _ in range(3)) / new_tokens * 1e3
                profiles.append((name, t, *decode_profile(loaded["onnxrun"][1], prompt,
                                                          new_tokens), genai_cpu))
            del loaded
            peaks = {e: peak_mib(e, view, prompt_len, new_tokens) for e in engines}
            med = {e: (float(np.median([p for p, _ in v])), float(np.median([d for _, d in v])))
                   for e, v in times.items()}
            rows.append((name, t, med, peaks))
            print(f"{name} threads={t}: " + "; ".join(
                f"{e}: prompt {med[e][0] * 1e3:.0f} ms, decode {new_tokens / med[e][1]:.1f} "
                f"tok/s, peak {peaks[e]:.0f} MiB" for e in engines), flush=True)
    load = os.getloadavg()
    print(f"\n{args.format}, prompt {prompt_len} tokens, {new_tokens} new tokens, median of "
          f"{repeats}, load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}\n")
    print("| model | threads | prompt ms (genai / onnxrun / ratio) | decode tok/s (genai / "
          "onnxrun / ratio) | ms per token (onnxrun / genai) | peak MiB (genai / onnxrun / "
          "ratio) |")
    print("|---|---|---|---|---|---|")
    g, o = engines
    for name, t, med, peaks in rows:
        pg, po = med[g][0] * 1e3, med[o][0] * 1e3
        dg, do = new_tokens / med[g][1], new_tokens / med[o][1]
        print(f"| {name} | {t} | {pg:.0f} / {po:.0f} / {po / pg:.2f}x | {dg:.1f} / {do:.1f} / "
              f"{do / dg:.2f}x | {1e3 / do:.1f} / {1e3 / dg:.1f} ({dg / do:.1f}x) | "
              f"{peaks[g]:.0f} / {peaks[o]:.0f} / {peaks[o] / peaks[g]:.2f}x |")
    for prof in profiles:
        print_profile(*prof)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
