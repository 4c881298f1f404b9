"""Where a model's time goes, per operator type (onnxrun's own profiler) and, with --cprofile,
per Python function: inside Pyodide (driven by profile_node.mjs) or natively, the same code.

    python tests/pyodide/profile_models.py MODEL.onnx [...] [--runs 3] [--cprofile 25]

Inputs as the browser benchmark's (bench.html): floats ``arange(n) / n``, BERT token ids
``7 i mod 30522``, mask ones.
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import glob
import json
import os
import pstats
import statistics
import sys
import tempfile
import time

import numpy as np

import onnxrun


def feeds(sess: onnxrun.InferenceSession, random: bool = False) -> dict[str, np.ndarray]:
    """The browser benchmark's inputs; ``random``: float inputs of random signs instead."""
    out = {}
    for i in sess.get_inputs():
        is_int = "int" in i.type
        shape = [1, 128] if is_int else [1, 3, 224, 224]
        n = int(np.prod(shape))
        if not is_int:
            out[i.name] = (np.random.default_rng(0).standard_normal(shape) if random else
                           (np.arange(n) / n).reshape(shape)).astype(np.float32)
        elif i.name == "input_ids":
            out[i.name] = (np.arange(n) * 7 % 30522).reshape(shape).astype(np.int64)
        elif i.name == "attention_mask":
            out[i.name] = np.ones(shape, np.int64)
        else:
            out[i.name] = np.zeros(shape, np.int64)
    return out


def profile(path: str, runs: int, cprofile: int, gemms: bool = False,
            ab_clip: bool = False) -> None:
    with open(path, "rb") as f:
        data = f.read()
    opts = onnxrun.SessionOptions()
    tmp = tempfile.mkdtemp()
    opts.enable_profiling = True
    opts.profile_file_prefix = os.path.join(tmp, "p")
    sess = onnxrun.InferenceSession(data, opts)
    f = feeds(sess)
    sess.run(None, f)  # warm-up
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        sess.run(None, f)
        times.append((time.perf_counter() - t0) * 1e3)
    events = json.load(open(sess.end_profiling()))
    per_op: dict[str, float] = collections.defaultdict(float)
    per_node: dict[str, float] = collections.defaultdict(float)
    shapes: dict[str, str] = {}
    count: dict[str, int] = collections.Counter()
    # the warm-up run is left out (it imports SciPy's BLAS, fills caches)
    first = min((e for e in events if e["name"] == "model_run"), key=lambda e: e["ts"])
    warm_end = first["ts"] + first["dur"]
    nruns = runs
    for e in events:
        if e["cat"] != "Node" or e["ts"] <= warm_end:
            continue
        op = e["args"]["op_name"]
        per_op[op] += e["dur"] / 1e3 / nruns
        per_node[e["name"]] += e["dur"] / 1e3 / nruns
        shapes[e["name"]] = f"{op} {e['args']['input_type_shape']}"
        count[op] += 1
    total = sum(per_op.values())
    print(f"== {os.path.basename(path)}: median run {statistics.median(times):.1f} ms "
          f"(profiled; nodes {total:.1f} ms)")
    for op, ms in sorted(per_op.items(), key=lambda kv: -kv[1]):
        print(f"  {op:28s} {ms:9.1f} ms {100 * ms / total:5.1f}%  x{count[op] // nruns}")
    print("  top nodes:")
    for name, ms in sorted(per_node.items(), key=lambda kv: -kv[1])[:12]:
        print(f"    {ms:8.1f} ms  {shapes[name][:150]}")
    if cprofile:
        sess2 = onnxrun.InferenceSession(data)
        sess2.run(None, f)
        prof = cProfile.Profile()
        prof.enable()
        sess2.run(None, f)
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(cprofile)
    if gemms:
        _gemm_ab(data, f)
    if ab_clip:
        _clip_ab(data, feeds(sess, random=True), runs)
    sys.stdout.flush()


def _gemm_ab(data: bytes, f: dict) -> None:
    """The float32 products of one run, each timed through the WebAssembly kernel and without
    it (SciPy's BLAS or numpy), interleaved: where the kernel wins and where it does not."""
    from onnxrun.providers.cpu import blas, wasm_gemm

    calls = []
    real = blas._gemm2

    def record(gemm, a, b, out):
        calls.append((gemm, a.copy() if a.ndim else a, b, a.shape, a.strides, b.shape, b.strides))
        return real(gemm, a, b, out)

    blas._gemm2 = record
    try:
        onnxrun.InferenceSession(data).run(None, f)
    finally:
        blas._gemm2 = real
    seen: dict = collections.OrderedDict()
    for gemm, a, b, ash, ast, bsh, bst in calls:
        seen.setdefault((ash, ast, bsh, bst), [gemm, a, b, 0])[3] += 1
    tot = [0.0, 0.0]
    min_macs = wasm_gemm.MIN_MACS
    for (ash, ast, bsh, bst), (gemm, a, b, n) in seen.items():
        t = [[], []]
        for _ in range(3):
            for on in (0, 1):
                wasm_gemm.MIN_MACS = min_macs if on else 1 << 62
                t0 = time.perf_counter()
                real(gemm, a, b, None)
                t[on].append(time.perf_counter() - t0)
        wasm_gemm.MIN_MACS = min_macs
        off, on = statistics.median(t[0]) * 1e3, statistics.median(t[1]) * 1e3
        tot[0] += n * off
        tot[1] += n * on
        print(f"  x{n} {ash}{ast} @ {bsh}{bst}: without {off:.2f} ms, wasm {on:.2f} ms")
    print(f"  products of one run: without {tot[0]:.1f} ms, wasm {tot[1]:.1f} ms")


def _clip_ab(data: bytes, f: dict, runs: int) -> None:
    """Whole runs on random-sign inputs with the WebAssembly clip and with numpy's,
    interleaved (numpy's clip branches per element there: its time depends on the values)."""
    from onnxrun.providers.cpu import wasm_gemm

    sess = onnxrun.InferenceSession(data)
    sess.run(None, f)
    default = wasm_gemm.MIN_CLIP
    t: list[list[float]] = [[], []]
    for _ in range(max(3, runs)):
        for on in (0, 1):
            wasm_gemm.MIN_CLIP = default if on else 1 << 62
            t0 = time.perf_counter()
            sess.run(None, f)
            t[on].append((time.perf_counter() - t0) * 1e3)
    wasm_gemm.MIN_CLIP = default
    off, on = statistics.median(t[0]), statistics.median(t[1])
    print(f"  random inputs: runs with numpy's clip {off:.1f} ms, the kernel's {on:.1f} ms")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("models", nargs="+")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--cprofile", type=int, default=0, help="top N functions by own time")
    p.add_argument("--ab-clip", action="store_true",
                   help="runs on random inputs with and without the WebAssembly clip")
    p.add_argument("--gemms", action="store_true",
                   help="time each float32 product with and without the WebAssembly kernel")
    a = p.parse_args(argv)
    for m in a.models:
        for path in sorted(glob.glob(m)) or [m]:
            profile(path, a.runs, a.cprofile, a.gemms, a.ab_clip)


if __name__ == "__main__":
    main()
