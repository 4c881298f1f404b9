"""Each kernel's own time in the suite's VAD-style streaming model (issue #18): the STFT Conv,
the four 1-D FusedConvs, the LSTM step and the FusedGemm + Sigmoid, one thread, medians over
runs of one session (each kernel's call timed around it: the run loop's cost is not in them).

    python benchmarks/vad_kernels.py            # 3000 runs
    python benchmarks/vad_kernels.py --quick    # 500 runs

To compare two trees, run it under each (PYTHONPATH=OTHER/src) in turn, twice, with the load
printed beside each figure.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

import onnxrun
from onnxrun.providers.cpu.ops import conv, rnn
from onnxrun.providers.cpu.ops.contrib import fused

HERE = Path(__file__).resolve().parent


def timed_kernels(runs: int) -> list[tuple[str, float]]:
    """(kernel class, median seconds a call) for each timed node, in run order."""
    sys.path.insert(0, str(HERE))
    try:
        import suite_models
    finally:
        sys.path.pop(0)
    times: dict[int, tuple[str, list[float]]] = {}
    originals = []
    try:  # FusedConv's own module since create5's lazy imports (669ac07: in fused.py)
        from onnxrun.providers.cpu.ops.contrib.fused_conv import FusedConv
    except ImportError:
        FusedConv = fused.FusedConv
    for cls in (conv.Conv, FusedConv, rnn.LSTM, fused.FusedGemm):
        call = cls.__dict__["__call__"]
        originals.append((cls, call))

        def timed(self, *args, _call=call, _name=cls.__name__):
            t0 = time.perf_counter()
            out = _call(self, *args)
            times.setdefault(id(self), (_name, []))[1].append(time.perf_counter() - t0)
            return out

        cls.__call__ = timed
    try:
        model, feeds = suite_models.build_vad()
        opts = onnxrun.SessionOptions()
        opts.intra_op_num_threads = 1
        sess = onnxrun.InferenceSession(model.SerializeToString(), opts)
        for _ in range(50):
            sess.run(None, feeds)
        times.clear()
        for _ in range(runs):
            sess.run(None, feeds)
    finally:
        for cls, call in originals:
            cls.__call__ = call
    return [(name, float(np.median(v))) for name, v in times.values()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    load = "/".join(f"{x:.2f}" for x in os.getloadavg())
    rows = timed_kernels(500 if args.quick else 3000)
    print(f"VAD-style model, kernels' own time a call (medians, 1 thread; load before {load}; "
          f"onnxrun from {Path(onnxrun.__file__).parent}):")
    for name, s in rows:
        print(f"  {name:10} {s * 1e6:7.1f} µs")
    print(f"  {'total':10} {sum(s for _, s in rows) * 1e6:7.1f} µs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
