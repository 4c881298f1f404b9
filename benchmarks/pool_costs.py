"""The fixed costs of onnxrun's thread pools at 2 threads: what a hand-off costs before any
work is split, and from what size a 2-way split of a product pays.

- spin.py (compiled/spin.py, the compiled kernels' pool): an empty fork round trip with the
  worker spinning (the previous fork < 1 ms ago) and asleep (woken through its Event), and
  `run_blocks` of an empty job (the Python around the fork: the grab block, the arrays);
- parallel.py's queue (`run_ranges`): an empty 2-range round trip;
- the compiled float GEMM (the float32 products' kernel) at 1 and 2 threads on products of
  0.5M-32M multiply-adds, with the split forced (every size cut in two) and as the kernel cuts
  it (`parallel.MIN_MACS_PER_RANGE`): the size from which the second thread pays;
- BLAS (threadpoolctl): its thread count inside a run at 2 threads, small GEMMs at 1 and 2
  BLAS threads, and a spin.py fork right after a 2-thread BLAS call (OpenBLAS's threads
  still spinning) against one after a pause.

Medians of interleaved repeats, microseconds; the load average is printed beside them.

    python benchmarks/pool_costs.py            # 2000 hand-offs, 200 products a size
    python benchmarks/pool_costs.py --quick    # a tenth of that
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np


def _median_us(times: list[float]) -> float:
    return float(np.median(times)) * 1e6


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def spin_costs(n: int) -> dict[str, float]:
    from onnxrun.providers.cpu.compiled import jit, spin

    pool = spin.pool()
    empty = np.zeros(5, np.int64)  # grab's block with no rows: returns at once
    argv = np.full(2, jit.address(empty), np.int64)
    at = jit.address(argv)
    clock = time.perf_counter
    pool.fork(pool.grab, argv, at)  # start the worker
    hot, cold, alone = [], [], []
    for _i in range(n):
        t0 = clock()
        pool.fork(pool.grab, argv, at)
        hot.append(clock() - t0)
    for _i in range(max(10, n // 20)):
        time.sleep(0.003)  # past the worker's ~1 ms of polling: asleep
        t0 = clock()
        pool.fork(pool.grab, argv, at)
        cold.append(clock() - t0)
    one = np.full(1, jit.address(empty), np.int64)
    for _i in range(n):
        t0 = clock()
        pool.fork(pool.grab, one, jit.address(one))
        alone.append(clock() - t0)
    # run_blocks as the kernels call it: 2 rows of a no-op job (grab of an empty block)
    blocks = np.zeros((2, 5), np.int64)
    import ctypes

    grab = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(pool.grab)
    rb = []
    for _i in range(n):
        t0 = clock()
        spin.run_blocks(grab, blocks, 2)
        rb.append(clock() - t0)
    return {"spin fork, 1 part (no worker)": _median_us(alone),
            "spin fork, 2 parts, worker spinning": _median_us(hot),
            "spin fork, 2 parts, worker asleep": _median_us(cold),
            "spin run_blocks, 2 empty rows": _median_us(rb)}


def queue_costs(n: int) -> dict[str, float]:
    from onnxrun.providers.cpu import parallel

    clock = time.perf_counter
    ranges = [(0, 1), (1, 2)]
    parallel.run_ranges(lambda a, b: None, ranges)
    hot = []
    for _i in range(n):
        t0 = clock()
        parallel.run_ranges(lambda a, b: None, ranges)
        hot.append(clock() - t0)
    return {"parallel.run_ranges, 2 empty ranges": _median_us(hot)}


def gemm_costs(n: int) -> list[tuple[str, float, float, float]]:
    """(shape, 1 thread us, 2 threads as the kernel cuts it, 2 threads forced in two)."""
    from onnxrun.providers.cpu import parallel
    from onnxrun.providers.cpu.compiled import float_gemm

    rng = np.random.default_rng(0)
    rows = []
    for M, K, N in ((32, 128, 128), (32, 256, 256), (64, 256, 256), (196, 256, 128),
                    (256, 384, 384), (784, 128, 256), (3136, 64, 64), (3025, 16, 64),
                    (3025, 144, 64), (784, 512, 256)):
        B = rng.standard_normal((K, N)).astype(np.float32)
        A = rng.standard_normal((M, K)).astype(np.float32)
        p = float_gemm.pack(B)
        if p is None:
            return rows
        runs = {}
        variants = [("1T", 1, False), ("2T", 2, False), ("2T forced", 2, True)]
        for name, _, _ in variants:
            runs[name] = []
        keep = float_gemm.work_ranges
        for i in range(n):
            for name, t, forced in (variants if i % 2 == 0 else variants[::-1]):
                if forced:
                    float_gemm.work_ranges = (lambda n_, th, w, least=None, per_thread=4:
                                              parallel.split(n_, min(th, n_)))
                t0 = time.perf_counter()
                p.run(A, threads=t)
                runs[name].append(time.perf_counter() - t0)
                float_gemm.work_ranges = keep
        rows.append((f"{M}x{K}x{N} ({M * K * N / 1e6:.1f}M MACs)", _median_us(runs["1T"]),
                     _median_us(runs["2T"]), _median_us(runs["2T forced"])))
    return rows


def blas_costs(n: int) -> list[str]:
    from threadpoolctl import threadpool_info, threadpool_limits

    from onnxrun.providers.cpu.compiled import jit, spin

    lines = []
    blas = [i for i in threadpool_info() if i.get("user_api") == "blas"]
    lines.append("BLAS: " + ", ".join(f"{i['internal_api']} {i.get('version')} "
                                      f"{i['num_threads']} threads" for i in blas))
    rng = np.random.default_rng(1)
    for s in (32, 64, 128, 256):
        a = rng.standard_normal((s, s)).astype(np.float32)
        t1, t2 = [], []
        for i in range(n):
            for t, acc in ((1, t1), (2, t2)) if i % 2 == 0 else ((2, t2), (1, t1)):
                with threadpool_limits(t, user_api="blas"):
                    t0 = time.perf_counter()
                    a @ a
                    acc.append(time.perf_counter() - t0)
        lines.append(f"BLAS sgemm {s}x{s}x{s}: 1 thread {_median_us(t1):.1f} us, "
                     f"2 threads {_median_us(t2):.1f} us")
    # a spin.py fork right after a 2-thread BLAS call against one after 2 ms of quiet
    pool = spin.pool()
    empty = np.zeros(5, np.int64)
    argv = np.full(2, jit.address(empty), np.int64)
    a = rng.standard_normal((256, 256)).astype(np.float32)
    after, quiet = [], []
    with threadpool_limits(2, user_api="blas"):
        for _ in range(max(10, n // 4)):
            a @ a
            t0 = time.perf_counter()
            pool.fork(pool.grab, argv)
            after.append(time.perf_counter() - t0)
            time.sleep(0.2)  # OpenBLAS's threads asleep again
            pool.fork(pool.grab, argv)  # the spin worker awake
            t0 = time.perf_counter()
            pool.fork(pool.grab, argv)
            quiet.append(time.perf_counter() - t0)
    lines.append(f"spin fork right after a 2-thread BLAS call: {_median_us(after):.1f} us; "
                 f"with BLAS's threads asleep: {_median_us(quiet):.1f} us")
    return lines


def session_blas_threads() -> str:
    """BLAS's thread count seen from inside a run at 2 intra-op threads (a custom op would
    see it; here: a session run wraps it, threadpoolctl reads it right after)."""
    from onnx import TensorProto, helper
    from threadpoolctl import threadpool_info

    import onnxrun

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 64])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 64])
    g = helper.make_graph([helper.make_node("MatMul", ["x", "x"], ["y"])], "g", [x], [y])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    so = onnxrun.SessionOptions()
    so.intra_op_num_threads = 2
    s = onnxrun.InferenceSession(m.SerializeToString(), so)
    before = [i["num_threads"] for i in threadpool_info() if i.get("user_api") == "blas"]
    s.run(None, {"x": np.ones((64, 64), np.float32)})
    after = [i["num_threads"] for i in threadpool_info() if i.get("user_api") == "blas"]
    return f"BLAS threads before / after a 2-thread run: {before} / {after}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a tenth of the repeats")
    args = ap.parse_args()
    n = 200 if args.quick else 2000
    print(f"load before: {_load()}")
    for k, v in {**spin_costs(n), **queue_costs(n)}.items():
        print(f"{k}: {v:.1f} us")
    print("\n| product | 1T us | 2T as cut | 2T forced in two |\n| --- | --: | --: | --: |")
    for shape, a, b, c in gemm_costs(max(20, n // 10)):
        print(f"| {shape} | {a:.1f} | {b:.1f} ({a / b:.2f}x) | {c:.1f} ({a / c:.2f}x) |")
    print()
    for line in blas_costs(max(20, n // 10)):
        print(line)
    print(session_blas_threads())
    print(f"load after: {_load()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
