"""What the compiled float32 GEMM (providers/cpu/compiled/float_gemm.py) gains: onnxrun with
compiled kernels, onnxrun with them switched off (numpy/OpenBLAS), and onnxruntime, run
alternately in this one process with the same thread count, at 1 and 2 intra-op threads.

    python benchmarks/float_gemm.py            # BERT MiniLM-L6 and base-shaped, VGG-19, GEMMs
    python benchmarks/float_gemm.py --quick    # fewer runs, BERT base with 2 layers

Models: encoders in MiniLM-L6's configuration (6 layers, hidden 384) and in BERT-base's
(hidden 768, intermediate 3072; 4 layers, 2 with --quick), 2 x 128 tokens, random weights,
built by benchmarks/host_malloc.py's builder (no download); VGG-19 of the onnx package's light
model zoo. Then the bare products on the models' shapes (BERT, ResNet-50, VGG-19's Winograd,
MobileNetV2): the kernel against numpy.dot (BLAS held to one thread) and onnxruntime's MatMul
on a constant B, thread CPU time. Prints medians, the ratios, and the load average next to them.
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
    (256, 3072, 768), (32, 768, 768), (8, 768, 768), (1, 768, 3072),
    # ResNet-50's 1x1 and implicit-GEMM 3x3 layers (pixels x channels), VGG-19's Winograd
    # products (2x2 tiles x channels), MobileNetV2's expansions and projections
    (3136, 64, 256), (3136, 256, 64), (784, 512, 128), (196, 1024, 256), (49, 2048, 512),
    (3136, 576, 64), (196, 2304, 256), (49, 4608, 512), (784, 256, 256), (196, 512, 512),
    (3136, 24, 144), (3136, 144, 24)]


def _matmul_session(B: np.ndarray):
    """onnxruntime at one thread on one MatMul by the constant B (MLAS packs it once)."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    K, N = B.shape
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["A", "B"], ["Y"])], "matmul",
        [helper.make_tensor_value_info("A", TensorProto.FLOAT, [None, K])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, N])],
        [numpy_helper.from_array(B, "B")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    so = ort.SessionOptions()
    so.intra_op_num_threads = so.inter_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), so,
                                providers=["CPUExecutionProvider"])


def _gemm_times(A: np.ndarray, B: np.ndarray, repeat: int) -> tuple[float, float, float]:
    """Median seconds of this thread's CPU time of one product A @ B: the kernel, numpy.dot,
    onnxruntime's MatMul, over ``repeat`` interleaved rounds."""
    M, K = A.shape
    N = B.shape[1]
    P = float_gemm.PackedMatrix(B)
    sess = _matmul_session(B)
    out = np.empty((M, N), np.float32)
    feeds = {"A": A}
    runs = [lambda: P.run(A, out=out), lambda: np.dot(A, B, out=out),
            lambda: sess.run(None, feeds)]
    reps = max(1, int(3e7 / (M * K * N)))
    times: list[list[float]] = [[] for _ in runs]
    for run in runs:
        run()
    for _ in range(repeat):
        for run, kept in zip(runs, times, strict=True):
            t0 = time.thread_time()
            for _ in range(reps):
                run()
            kept.append((time.thread_time() - t0) / reps)
    return tuple(statistics.median(t) for t in times)


def bench_gemms(repeat: int) -> None:
    """GFLOP/s of the kernel, numpy.dot (BLAS held to one thread) and onnxruntime's MatMul
    on a constant B, all on this thread (its CPU time: other processes' load stretches wall
    time, not this)."""
    from threadpoolctl import threadpool_limits

    rng = np.random.default_rng(0)
    with threadpool_limits(1, user_api="blas"):
        for M, K, N in GEMM_SHAPES:
            A = rng.standard_normal((M, K), np.float32)
            B = rng.standard_normal((K, N), np.float32)
            c, n, o = _gemm_times(A, B, repeat)
            flops = 2 * M * K * N
            print(f"GEMM {M:5d}x{K:4d}x{N:4d} 1T  compiled {c * 1e3:7.3f} ms "
                  f"({flops / c / 1e9:5.1f} GFLOP/s)  numpy {flops / n / 1e9:5.1f}  "
                  f"onnxruntime {flops / o / 1e9:5.1f}  compiled / onnxruntime time "
                  f"{c / o:.2f}  load {os.getloadavg()[0]:.1f}", flush=True)


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
