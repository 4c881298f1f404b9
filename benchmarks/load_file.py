"""Peak memory and time of loading a large model file (load.load_model), each in a fresh process.

    python benchmarks/load_file.py [--folder DIR] [--mib 200] [--repeat 5]

Writes two models of about ``--mib`` MiB of float32 weights (a chain of square MatMuls) into
DIR: one with the weights in the file (raw_data), one with them in an external data file.
For each, ``--repeat`` fresh processes import onnxrun, then time ``load_model`` (wall and CPU)
and report the growth of the peak resident size it causes (VmHWM, or ru_maxrss off Linux,
after minus before).
Prints the minimum of each figure over the processes.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

_CHILD = r"""
import json, resource, sys, time
import onnxrun.load as load
def peak_kib():
    # VmHWM: ru_maxrss keeps the parent's peak across fork and exec on Linux.
    try:
        with open("/proc/self/status") as f:
            return next(int(l.split()[1]) for l in f if l.startswith("VmHWM"))
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
path = sys.argv[1]
before = peak_kib()
t0, c0 = time.perf_counter(), time.process_time()
_, model = load.load_model(path)
t1, c1 = time.perf_counter(), time.process_time()
after = peak_kib()
weights = sum(v.const_value.nbytes for v in model.graph.initializers.values())
print(json.dumps({"wall_ms": (t1 - t0) * 1e3, "cpu_ms": (c1 - c0) * 1e3,
                  "peak_mib": (after - before) / 1024, "weights_mib": weights / 2**20}))
"""


def write_models(folder: Path, mib: int) -> tuple[Path, Path]:
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    folder.mkdir(parents=True, exist_ok=True)
    embedded, external = folder / "embedded.onnx", folder / "external.onnx"
    if embedded.exists() and external.exists():
        return embedded, external
    n, count = 2048, max(1, round(mib * 2**20 / (2048 * 2048 * 4)))
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((n, n), np.float32), f"W{i}")
             for i in range(count)]
    nodes = [helper.make_node("MatMul", ["x" if i == 0 else f"h{i}", f"W{i}"],
                              ["y" if i == count - 1 else f"h{i + 1}"]) for i in range(count)]
    graph = helper.make_graph(
        nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, n])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, embedded)
    onnx.save(model, external, save_as_external_data=True, all_tensors_to_one_file=True,
              location="external.onnx_data", size_threshold=1024)
    return embedded, external


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--folder", type=Path, default=Path("/tmp/onnxrun-load-bench"))
    ap.add_argument("--mib", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    for path in write_models(args.folder, args.mib):
        runs = [json.loads(subprocess.run([sys.executable, "-c", _CHILD, str(path)], check=True,
                                          capture_output=True, text=True).stdout)
                for _ in range(args.repeat)]
        best = {k: min(r[k] for r in runs) for k in runs[0]}
        print(f"{path.name:14s} weights {best['weights_mib']:.0f} MiB: "
              f"load {best['wall_ms']:.0f} ms wall, {best['cpu_ms']:.0f} ms CPU, "
              f"peak RSS + {best['peak_mib']:.0f} MiB (min of {args.repeat})")


if __name__ == "__main__":
    main()
