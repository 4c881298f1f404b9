"""GroupQueryAttention's exact compiled path (compiled/gqa.py: onnxruntime's numbers bit for bit)
next to the numpy path it replaced, on onnxrun.genai's builder folders (int4,
tests/genai/make_models.py): one decode step and one prompt, the two paths taking turns in
one process (per token: the same generator, so both see the same cache lengths; per prompt:
a fresh generator each), medians of the process's CPU time and their ratio, and the thread
CPU time spent inside the GroupQueryAttention nodes alone (the figure the paths change; the
whole prompt or step varies more than that with the load).

    python benchmarks/gqa.py            # small (4 layers, hidden 256) and 0.5b, 1 thread
    python benchmarks/gqa.py --quick    # small only, fewer tokens
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "genai"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

MODELS = {"small": ("llama", "small"), "0.5b": ("qwen2", "0.5b")}


def _paths():
    from onnxrun.providers.cpu.ops.contrib import transformer

    cls = transformer.GroupQueryAttention
    exact, call = cls._exact_kernels, cls.__call__
    inside = [0.0]

    def timed(self, *args, **kwargs):
        t0 = time.thread_time()
        try:
            return call(self, *args, **kwargs)
        finally:
            inside[0] += time.thread_time() - t0

    cls.__call__ = timed

    def use(path: str) -> None:
        cls._exact_kernels = exact if path == "exact" else (lambda self, *a: None)

    def restore() -> None:
        cls._exact_kernels, cls.__call__ = exact, call

    return use, inside, restore


def measure(name: str, prompt: int, steps: int, prompts: int) -> str:
    import tempfile

    import make_models
    from genai import threaded_view

    from onnxrun import genai as og

    arch, size = MODELS[name]
    root = Path(tempfile.mkdtemp(prefix="gqa-bench-"))
    folder = threaded_view(make_models.build(arch, size, "int4"), 1, root)
    model = og.Model(og.Config(str(folder)))
    use, inside, restore = _paths()
    rng = np.random.default_rng(0)
    ids = np.array([rng.integers(5, 1000, prompt)], np.int32)

    def generator():
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=prompt + steps + 1, do_sample=False)
        return og.Generator(model, params)

    times = {p: {"prompt": [], "step": [], "gqa prompt": [], "gqa step": []}
             for p in ("exact", "numpy")}
    for path in ("exact", "numpy"):  # warm-up: kernels loaded, first-call costs paid
        use(path)
        generator().append_tokens(ids)
    for i in range(2 * prompts):
        path = ("exact", "numpy")[i % 2]
        use(path)
        gen = generator()
        inside[0] = 0.0
        t0 = time.process_time()
        gen.append_tokens(ids)
        times[path]["prompt"].append(time.process_time() - t0)
        times[path]["gqa prompt"].append(inside[0])
    for i in range(steps):
        path = ("exact", "numpy")[i % 2]
        use(path)
        inside[0] = 0.0
        t0 = time.process_time()
        gen.generate_next_token()
        times[path]["step"].append(time.process_time() - t0)
        times[path]["gqa step"].append(inside[0])
    restore()
    e, n = ({k: np.median(v) * 1e3 for k, v in times[p].items()} for p in ("exact", "numpy"))
    return " | ".join([f"| {name} | {prompt}"] + [
        f"{n[k]:.{d}f} / {e[k]:.{d}f} ({e[k] / n[k]:.2f}x)"
        for k, d in (("prompt", 0), ("gqa prompt", 1), ("step", 2), ("gqa step", 3))]) + " |"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small only, fewer tokens")
    ap.add_argument("--models", default=None, help="comma-separated: small, 0.5b")
    ap.add_argument("--prompt", type=int, default=128)
    args = ap.parse_args(argv)
    models = (args.models or ("small" if args.quick else "small,0.5b")).split(",")
    steps, prompts = (20, 2) if args.quick else (40, 3)
    print(f"GroupQueryAttention paths, 1 thread, process CPU ms, medians; load "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}\n")
    print("| model | prompt | prompt ms (numpy / exact) | its GQA nodes | decode step ms | "
          "its GQA nodes |")
    print("|---|---|---|---|---|---|")
    for name in models:
        print(measure(name, args.prompt, steps, prompts), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
