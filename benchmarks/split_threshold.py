"""From what size a compiled float product pays to split over 2 threads (issue #18): for each
value of ``float_gemm.SPIN_MACS_PER_RANGE`` and each ``--scales`` factor of the smaller kernels'
thresholds (depthwise.MIN_TAPS_PER_RANGE, the pools' too; logistic._CHUNK; gelu._GELU_RANGE;
copy.MIN_BYTES_PER_RANGE; scale_shift.MIN_ELEMENTS_PER_RANGE: a child process each),
onnxrun and onnxruntime at 1 and 2 intra-op threads run alternately (a 0.15 s pause before
each engine's turn, so neither engine's spinning workers take a core from the other; then 3
runs, the first one after the pause reported apart as 'cold'), medians of the wall time and the
ratios to onnxruntime.

    python benchmarks/split_threshold.py --quick                 # squeezenet, GPT decoder
    python benchmarks/split_threshold.py --macs 262144,1048576,4194304 --models squeezenet -r 20
    python benchmarks/split_threshold.py --quick --macs 0 --scales 0.25,1,4,1000 \
        --models shufflenet,yolo_style,densenet_style     # 1000: the small kernels never split

The GPT decoder comes from the bench cache (scripts/generate_bench_models.py), the YOLO-,
DenseNet-style and other suite models from benchmarks/suite_models.py; the zoo CNNs from the
onnx package.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx

HERE = Path(__file__).resolve().parent
LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
CACHE = Path(os.environ.get("ONNXRUN_BENCH_CACHE", Path.home() / ".cache" / "onnxrun-bench"))


def _model(name: str) -> tuple[str, dict | None]:
    if name in ("squeezenet", "shufflenet", "resnet50"):
        return str(LIGHT / f"light_{name}.onnx"), None
    sys.path.insert(0, str(HERE))
    import suite_models

    if name in suite_models.MODELS:
        path = suite_models.ensure(name, CACHE)
    else:
        path = CACHE / name / "model.onnx"
        if not path.exists():
            raise SystemExit(f"{path} missing: run scripts/generate_bench_models.py {name}")
    return str(path), {p.stem: np.load(p) for p in sorted(path.parent.glob("*.npy"))}


def _scale_thresholds(scale: float) -> None:
    """The small kernels' split thresholds (not the GEMM's) times ``scale``."""
    from onnxrun.providers.cpu.compiled import copy, depthwise, gelu, logistic, pool, scale_shift
    from onnxrun.providers.cpu.ops import conv, tensor

    taps = max(1, int(depthwise.MIN_TAPS_PER_RANGE * scale))
    depthwise.MIN_TAPS_PER_RANGE = pool.MIN_TAPS_PER_RANGE = taps
    logistic._CHUNK = max(8, int(logistic._CHUNK * scale))
    gelu._GELU_RANGE = max(1, int(gelu._GELU_RANGE * scale))
    copy.MIN_BYTES_PER_RANGE = max(64, int(copy.MIN_BYTES_PER_RANGE * scale))
    tensor._SPLIT_FROM = 2 * copy.MIN_BYTES_PER_RANGE
    scale_shift.MIN_ELEMENTS_PER_RANGE = max(8, int(scale_shift.MIN_ELEMENTS_PER_RANGE * scale))
    conv._SCALE_SHIFT_SPLIT = 2 * scale_shift.MIN_ELEMENTS_PER_RANGE


def child(macs: int, names: list[str], rounds: int, scale: float = 1.0) -> None:
    import onnxruntime as ort

    import onnxrun
    from onnxrun.providers.cpu.compiled import float_gemm

    if macs:
        float_gemm.SPIN_MACS_PER_RANGE = macs
    if scale != 1:
        _scale_thresholds(scale)
    for name in names:
        path, feeds = _model(name)
        runners = {}
        for engine in ("onnxrun", "onnxruntime"):
            for t in (1, 2):
                mod = onnxrun if engine == "onnxrun" else ort
                so = mod.SessionOptions()
                so.intra_op_num_threads = t
                s = mod.InferenceSession(path, so, providers=["CPUExecutionProvider"])
                f = feeds or {s.get_inputs()[0].name: np.random.default_rng(0).standard_normal(
                    (1, 3, 224, 224)).astype(np.float32)}
                runners[f"{engine} {t}T"] = (s, f)
        warm = {k: [] for k in runners}
        cold = {k: [] for k in runners}
        for s, f in runners.values():
            for _ in range(3):
                s.run(None, f)
        order = list(runners.items())
        for r in range(rounds):
            for k, (s, f) in (order if r % 2 == 0 else order[::-1]):
                time.sleep(0.15)
                for j in range(3):
                    t0 = time.perf_counter()
                    s.run(None, f)
                    (cold if j == 0 else warm)[k].append(time.perf_counter() - t0)
        print(json.dumps({"model": name, "macs": macs or float_gemm.SPIN_MACS_PER_RANGE,
                          "scale": scale,
                          "warm": {k: statistics.median(v) * 1e3 for k, v in warm.items()},
                          "cold": {k: statistics.median(v) * 1e3 for k, v in cold.items()}}),
              flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="squeezenet,gpt_decoder")
    ap.add_argument("--macs", default="262144,1048576,4194304",
                    help="values of float_gemm.SPIN_MACS_PER_RANGE (0: the tree's own)")
    ap.add_argument("-r", "--rounds", type=int, default=None, help="rounds (10; --quick 6)")
    ap.add_argument("--quick", action="store_true", help="6 rounds unless -r says otherwise")
    ap.add_argument("--scales", default="1",
                    help="factors of the small kernels' thresholds (default 1: the tree's)")
    ap.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--child-scale", type=float, default=1.0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    names = args.models.split(",")
    if args.rounds is None:
        args.rounds = 6 if args.quick else 10
    if args.child is not None:
        child(args.child, names, args.rounds, args.child_scale)
        return
    print(f"load average {os.getloadavg()[0]:.2f}; medians of {args.rounds} rounds x 2 warm "
          "runs; ms; ratio = onnxrun / onnxruntime at the same threads\n")
    print("| SPIN_MACS_PER_RANGE | scale | model | onnxrun 1T / 2T | onnxruntime 1T / 2T | "
          "ratio 1T | ratio 2T | cold 2T (onnxrun / onnxruntime) |")
    print("|---|---|---|---|---|---|---|---|")
    for macs, scale in ((int(m), float(f)) for m in args.macs.split(",")
                        for f in args.scales.split(",")):
        out = subprocess.run([sys.executable, __file__, "--child", str(macs), "--child-scale",
                              str(scale), "--models", args.models, "-r", str(args.rounds)],
                             capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            if not line.startswith("{"):
                continue
            d = json.loads(line)
            w, c = d["warm"], d["cold"]
            print(f"| {d['macs']} | {d['scale']:g} | {d['model']} | "
                  f"{w['onnxrun 1T']:.2f} / {w['onnxrun 2T']:.2f}"
                  f" | {w['onnxruntime 1T']:.2f} / {w['onnxruntime 2T']:.2f} | "
                  f"{w['onnxrun 1T'] / w['onnxruntime 1T']:.2f} | "
                  f"{w['onnxrun 2T'] / w['onnxruntime 2T']:.2f} | "
                  f"{c['onnxrun 2T']:.2f} / {c['onnxruntime 2T']:.2f} |", flush=True)
    print(f"\nload average after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
