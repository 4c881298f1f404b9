"""MatMulNBits for one row (an LLM's decode step), its kernels side by side on the 0.5b
Qwen2's product shapes (issue #14): onnxruntime, onnxrun's default (blocks of 32:
compiled/nbits_gemm.py's exact M == 1 kernel, MLAS's numbers; other blocks:
compiled/nbits_blocks.py's), and for blocks of 32 compiled/nbits_gemv.py's gemv8 (Gemv.decode,
not MLAS's float order). One session per engine and path, all in this
process, run in turn (the order reversed every round), 1 thread (--threads); medians of the calling
thread's CPU time (steadier than wall time on a loaded machine), and per token: each shape's
median times its calls in one 0.5b token.

    python benchmarks/nbits_decode.py            # block 32, 30 rounds (lm_head 8)
    python benchmarks/nbits_decode.py --quick    # 8 rounds (lm_head 3)
    python benchmarks/nbits_decode.py --block 128
    python benchmarks/nbits_decode.py --quick --threads 2   # wall time (the split's gain)

At 2+ threads the medians are wall time (thread CPU misses the workers' share).
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

import onnxrun

# (K, N, calls per token): q/o, k/v, gate/up, down (24 layers), lm_head
SHAPES = ((896, 896, 48), (896, 128, 48), (896, 4864, 48), (4864, 896, 24), (896, 151936, 1))


def model(K: int, N: int, block: int, rng) -> bytes:
    kb = -(-K // block)
    B = rng.integers(0, 256, (N, kb, block // 2), dtype=np.uint8)
    S = (rng.random(N * kb, dtype=np.float32) * 0.02 + 1e-3).astype(np.float32)
    node = helper.make_node("MatMulNBits", ["A", "B", "S"], ["Y"], domain="com.microsoft", K=K,
                            N=N, block_size=block, bits=4, accuracy_level=4)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("A", TP.FLOAT, [1, K])],
                          [helper.make_tensor_value_info("Y", TP.FLOAT, [1, N])],
                          [numpy_helper.from_array(B, "B"), numpy_helper.from_array(S, "S")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                            helper.make_opsetid("com.microsoft", 1)])
    return m.SerializeToString()


def sessions(data: bytes, threads: int = 1) -> dict:
    so = onnxrun.SessionOptions()
    so.intra_op_num_threads = threads
    out = {"onnxrun": onnxrun.InferenceSession(data, so)}
    gemv8 = onnxrun.InferenceSession(data, so)
    kernel = gemv8._program.steps[0].kernel
    if getattr(kernel, "gemm", None) is not None:  # blocks of 32: take gemv8 instead
        kernel.gemm = None
        out["gemv8"] = gemv8
    try:
        import onnxruntime as ort

        o = ort.SessionOptions()
        o.intra_op_num_threads = threads
        out["onnxruntime"] = ort.InferenceSession(data, o, providers=["CPUExecutionProvider"])
    except ImportError:
        pass
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--block", type=int, default=32)
    ap.add_argument("-r", "--rounds", type=int, default=None)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    rounds = args.rounds or (8 if args.quick else 30)
    rng = np.random.default_rng(0)
    totals: dict[str, float] = {}
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    clock, what = (time.thread_time, "thread CPU") if args.threads == 1 else \
        (time.perf_counter, "wall")
    print(f"block {args.block}, {args.threads} thread(s), load average {load}")
    print(f"| K x N | calls per token | median {what} ms per engine |")
    for K, N, calls in SHAPES:
        sess = sessions(model(K, N, args.block, rng), args.threads)
        a = {"A": rng.standard_normal((1, K)).astype(np.float32)}
        times: dict[str, list[float]] = {name: [] for name in sess}
        names = list(sess)
        for r in range(rounds if N < 100_000 else max(3, rounds // 4)):
            for name in names if r % 2 else names[::-1]:
                t = clock()
                sess[name].run(None, a)
                times[name].append(clock() - t)
        med = {name: float(np.median(v)) * 1e3 for name, v in times.items()}
        for name, v in med.items():
            totals[name] = totals.get(name, 0.0) + v * calls
        print(f"| {K}x{N} | {calls} | " + ", ".join(f"{n} {v:.3f}" for n, v in med.items())
              + " |")
    print("per 0.5b token (products only): "
          + ", ".join(f"{n} {v:.1f} ms" for n, v in totals.items()))


if __name__ == "__main__":
    main()
