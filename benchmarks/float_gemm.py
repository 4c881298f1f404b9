"""What the compiled float32 GEMM (providers/cpu/compiled/float_gemm.py) gains: onnxrun with
compiled kernels, onnxrun with them switched off (numpy/OpenBLAS), and onnxruntime, run
alternately in this one process with the same thread count, at 1 and 2 intra-op threads.

    python benchmarks/float_gemm.py            # BERT MiniLM-L6 and base-shaped, VGG-19, GEMMs
    python benchmarks/float_gemm.py --quick    # fewer runs, BERT base with 2 layers

Models: encoders in MiniLM-L6's configuration (6 layers, hidden 384) and in BERT-base's
(hidden 768, intermediate 3072; 4 layers, 2 with --quick), 2 x 128 tokens, random weights,
built by benchmarks/host_malloc.py's builder (no download); VGG-19 of the onnx package's light
model zoo. Then the bare products on the models' shapes: the kernel against numpy.dot (BLAS
held to one thread). Prints medians, the ratios, and the load average next to them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parent))
import host_malloc  # noqa: E402  (the BERT builder)

from onnxrun.providers.cpu.compiled import float_gemm, jit  # noqa: E402
from onnxrun.tools.bench import time_alternating  # noqa: E402

LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"


def build_bert(path: Path, layers: int, hidden: int, heads: int, inter: int) -> None:
    host_malloc.LAYERS, host_malloc.HIDDEN = layers, hidden
    host_malloc.HEADS, host_malloc.INTER = heads, inter
    host_malloc.bert(path)


def feeds_for(path: Path) -> dict[str, np.ndarray]:
    model = onnx.load(str(path), load_external_data=False)
    rng = np.random.default_rng(0)
    feeds = {}
    constant = {t.name for t in model.graph.initializer}
    for v in model.graph.input:
        if v.name in constant:
            continue
        dims = [d.dim_value or 1 for d in v.type.tensor_type.shape.dim]
        if v.type.tensor_type.elem_type == onnx.TensorProto.INT64:
            feeds[v.name] = rng.integers(0, 100, dims).astype(np.int64) if v.name == \
                "input_ids" else np.ones(dims, np.int64) * (v.name == "attention_mask")
        else:
            feeds[v.name] = rng.standard_normal(dims).astype(np.float32)
    return feeds


def sessions(path: Path, threads: int):
    import onnxruntime as ort

    import onnxrun

    so = onnxrun.SessionOptions()
    so.intra_op_num_threads = threads
    compiled = onnxrun.InferenceSession(str(path), so)
    with jit.disabled():
        numpy_path = onnxrun.InferenceSession(str(path), so)
    ro = ort.SessionOptions()
    ro.intra_op_num_threads = threads
    ro.inter_op_num_threads = 1
    reference = ort.InferenceSession(str(path), ro, providers=["CPUExecutionProvider"])
    return {"onnxrun compiled": compiled, "onnxrun numpy": numpy_path,
            "onnxruntime": reference}


def bench_model(name: str, path: Path, repeat: int) -> None:
    feeds = feeds_for(path)
    for threads in (1, 2):
        engines = sessions(path, threads)
        runners = [lambda s=s: s.run(None, feeds) for s in engines.values()]
        times, firsts = time_alternating(runners, warmup=2, repeat=repeat)
        med = {k: statistics.median(t) for k, t in zip(engines, times, strict=True)}
        diff = float(np.abs(firsts[0][0] - firsts[2][0]).max())
        ref = med["onnxruntime"]
        print(f"{name:22s} {threads}T  " + "  ".join(
            f"{k} {v * 1e3:8.2f} ms ({v / ref:.2f}x)" for k, v in med.items()) +
            f"  max|diff| {diff:.1e}  load {os.getloadavg()[0]:.1f}", flush=True)


GEMM_SHAPES = [  # (M, K, N): BERT MiniLM / base at 2 x 128 tokens, 32 tokens, and a GEMV
    (256, 384, 384), (256, 384, 1536), (256, 1536, 384), (256, 768, 768), (256, 768, 3072),
    (256, 3072, 768), (32, 768, 768), (8, 768, 768), (1, 768, 3072)]


def bench_gemms(repeat: int) -> None:
    from threadpoolctl import threadpool_limits

    rng = np.random.default_rng(0)
    with threadpool_limits(1, user_api="blas"):
        for M, K, N in GEMM_SHAPES:
            A = rng.standard_normal((M, K), np.float32)
            B = rng.standard_normal((K, N), np.float32)
            P = float_gemm.PackedMatrix(B)
            out = np.empty((M, N), np.float32)
            reps = max(1, int(3e7 / (M * K * N)))

            def numpy_dot(A=A, B=B, out=out, reps=reps):
                for _ in range(reps):
                    np.dot(A, B, out=out)

            def compiled(A=A, P=P, out=out, reps=reps):
                for _ in range(reps):
                    P.run(A, out=out)

            times, _ = time_alternating([compiled, numpy_dot], warmup=1, repeat=repeat)
            c, n = (statistics.median(t) / reps for t in times)
            flops = 2 * M * K * N
            print(f"GEMM {M:4d}x{K:4d}x{N:4d} 1T  compiled {c * 1e3:7.3f} ms "
                  f"({flops / c / 1e9:5.1f} GFLOP/s)  numpy {n * 1e3:7.3f} ms "
                  f"({flops / n / 1e9:5.1f})  ratio {c / n:.2f}  load {os.getloadavg()[0]:.1f}",
                  flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer runs, smaller BERT base")
    parser.add_argument("--only", choices=["models", "gemms"], help="one part only")
    args = parser.parse_args()
    reason = float_gemm.unavailable()
    if reason:
        sys.exit(f"the compiled float GEMM does not run here: {reason}")
    print(f"target {jit.target().name}, load {os.getloadavg()}, {time.ctime()}")
    repeat = 5 if args.quick else 15
    if args.only != "models":
        bench_gemms(repeat)
    if args.only == "gemms":
        return
    with tempfile.TemporaryDirectory() as tmp:
        mini, base = Path(tmp) / "minilm.onnx", Path(tmp) / "base.onnx"
        build_bert(mini, 6, 384, 12, 1536)
        build_bert(base, 2 if args.quick else 4, 768, 12, 3072)
        bench_model("BERT MiniLM-L6 2x128", mini, repeat)
        bench_model(f"BERT base {2 if args.quick else 4}L 2x128", base, repeat)
    bench_model("VGG-19 (light zoo)", LIGHT / "light_vgg19.onnx", max(3, repeat // 3))


if __name__ == "__main__":
    main()
