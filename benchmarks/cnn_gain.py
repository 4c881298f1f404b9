"""What each CNN change of issue #18 gains: onnxruntime, onnxrun, and onnxrun with one change
undone, all in this process, run in turn (the order rotating every round), 1 intra-op thread
by default; medians of the calling thread's CPU time (steadier than wall time on a loaded
machine; at 1 thread both engines compute on the calling thread) and of wall time.

    python benchmarks/cnn_gain.py                  # every change on the suite's CNN cases
    python benchmarks/cnn_gain.py --quick          # fewer rounds, YOLO and squeezenet
    python benchmarks/cnn_gain.py --changes layout --models yolo -r 30

Changes (each undone when its session is created; kernels keep their choices for the run):
  silu    QuickGelu / SiLU in one compiled pass (compiled/logistic.py, else gelu.quick_gelu)
  nhwc    channels-last convolutions on the compiled GEMM (implicit GEMM, im2col)
  layout  Concat / Split / pools / Resize keep channels-last memory at the layout level
  shuffle grouped 1x1 convolutions on the compiled GEMM and the channel shuffle in
          channels-last memory (ShuffleNet)
  pool    MaxPool / AveragePool of channels-last input on the compiled kernel
          (compiled/pool.py) instead of numpy's strided passes
  slices  convolutions whose compiled GEMM takes K in one block write into their range of a
          Concat's channels (memory.py's slices, Conv.streams_out); undone: they write
          buffers of their own, which the Concat copies
  depthwise  the float depthwise kernel's loops of session 10 (chunks of the target's
          vector width, several pixels a step, each input pixel loaded once per step);
          undone: session 9's (16 lanes, a pixel at a time), called the same way
"""

from __future__ import annotations

import argparse
import contextlib
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
CASES = ("yolo_style", "densenet_style", "zoo:squeezenet", "zoo:shufflenet", "zoo:resnet50")
QUICK = ("yolo_style", "zoo:squeezenet")


@contextlib.contextmanager
def undone(change: str):
    """Session creation with ``change`` undone."""
    from onnxrun.providers.cpu.ops import conv
    from onnxrun.providers.cpu.ops.contrib import fused

    if change == "silu":
        old = fused.QuickGelu.__init__

        def init(self, ctx, *, alpha=1.702):
            old(self, ctx, alpha=alpha)
            self.compiled = self.exact = None  # gelu.py's pass, logistic.py's exact one

        fused.QuickGelu.__init__ = init
        try:
            yield
        finally:
            fused.QuickGelu.__init__ = old
        return
    if change == "shuffle":
        saved = conv._grouped_1x1_packable, conv.channel_shuffle, conv._LAYOUT_DEPTH
        conv._grouped_1x1_packable = lambda _: False
        conv.channel_shuffle = lambda _: None
        conv._LAYOUT_DEPTH = 12
        try:
            yield
        finally:
            conv._grouped_1x1_packable, conv.channel_shuffle, conv._LAYOUT_DEPTH = saved
        return
    if change == "depthwise":
        from onnxrun.providers.cpu.compiled import depthwise, jit

        saved = depthwise.function
        depthwise.function = lambda kh, kw: jit.compile_module(
            f"depthwise_f32_{kh}x{kw}_single", depthwise.single_pixel_module_ir(kh, kw),
            {"dw_job": depthwise._PROTO}, depthwise.REQUIRES).dw_job
        try:
            yield
        finally:
            depthwise.function = saved
        return
    if change == "slices":  # (the plan's memory is made by the first runs: see compare)
        saved = conv.Conv.streams_out
        conv.Conv.streams_out = False
        try:
            yield
        finally:
            conv.Conv.streams_out = saved
        return
    if change == "pool":
        from onnxrun.providers.cpu.ops import pool

        pool.COMPILED = False
        try:
            yield
        finally:
            pool.COMPILED = True
        return
    name = {"nhwc": "_packable", "layout": "_follows_layout"}[change]
    old = getattr(conv, name)
    setattr(conv, name, lambda _: False)
    try:
        yield
    finally:
        setattr(conv, name, old)


def cases(words: list[str], quick: bool):
    return run_suite.ab_cases(QUICK if quick else CASES, words)


def compare(model: str, feeds, change: str, runs: int, threads: int) -> dict[str, float]:
    import onnxruntime as ort

    from onnxrun.tools.common import make_feeds

    so = onnxrun.SessionOptions()
    so.intra_op_num_threads = threads
    after = onnxrun.InferenceSession(model, so)
    if feeds is None:
        feeds, _ = make_feeds(after, {}, {}, 0)
    with undone(change):
        before = onnxrun.InferenceSession(model, so)
        if change == "slices":  # the memory pattern, recorded in the first runs
            for _ in range(3):
                before.run(None, feeds)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    reference = ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
    engines = {"after": after, "before": before, "ort": reference}
    first = {k: s.run(None, feeds) for k, s in engines.items()}
    diff = max(float(np.max(np.abs(a - b))) for a, b in zip(first["after"], first["before"],
                                                             strict=True))
    cpu: dict[str, list[float]] = {k: [] for k in engines}
    wall: dict[str, list[float]] = {k: [] for k in engines}
    order = list(engines.items())
    for i in range(runs):
        turn = order[i % 3:] + order[:i % 3]
        for k, s in turn:
            c0, t0 = time.thread_time(), time.perf_counter()
            s.run(None, feeds)
            wall[k].append(time.perf_counter() - t0)
            cpu[k].append(time.thread_time() - c0)
    med = {f"{m}_{k}": float(np.median(v[k])) for m, v in (("cpu", cpu), ("wall", wall))
           for k in engines}
    return dict(med, diff=diff)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="", help="comma-separated words to select cases")
    parser.add_argument("--changes", default="silu,nhwc,layout")
    parser.add_argument("-r", "--runs", type=int, default=None, help="rounds (default 15; "
                        "quick 7)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    runs = args.runs or (7 if args.quick else 15)
    words = [w.strip().lower() for w in args.models.split(",") if w.strip()]
    load = "/".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"onnxrun with each change undone -> with it, ratio to onnxruntime; medians of {runs} "
          f"interleaved rounds, {args.threads} thread(s); load before: {load}")
    header = ["change", "model", "CPU before", "CPU after", "onnxruntime",
              "ratio before -> after (CPU)", "wall ratio before -> after", "max diff"]
    print("\n".join(run_suite.markdown(header, [])))
    for change in [c.strip() for c in args.changes.split(",") if c.strip()]:
        for label, model, feeds in cases(words, args.quick):
            r = compare(model, feeds, change, runs, args.threads)
            row = [change, label, f"{r['cpu_before'] * 1e3:.1f} ms",
                   f"{r['cpu_after'] * 1e3:.1f} ms", f"{r['cpu_ort'] * 1e3:.1f} ms",
                   f"{r['cpu_before'] / r['cpu_ort']:.2f} -> {r['cpu_after'] / r['cpu_ort']:.2f}",
                   f"{r['wall_before'] / r['wall_ort']:.2f} -> "
                   f"{r['wall_after'] / r['wall_ort']:.2f}", f"{r['diff']:.1e}"]
            print(run_suite.markdown(header, [row])[-1], flush=True)
    print(f"load after: {'/'.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
