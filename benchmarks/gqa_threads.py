"""One GroupQueryAttention node at the 0.5b Qwen2 shape (14 heads, 2 kv heads, head size 64,
rotary, packed QKV) on 1 and 2 intra-op threads, onnxrun next to onnxruntime: a decode step
over caches of several lengths (onnxrun.genai's shared past/present buffer) and prompts,
the four sessions taking turns in one process, wall-clock medians and the 1 / 2 thread
ratios (compiled/gqa.py splits a step's heads and a prompt's rows over spin.py's workers).
Both engines give the same bits at each thread count (tests/test_gqa_exact.py).

    python benchmarks/gqa_threads.py            # decode over 129 / 513 / 1001 keys,
                                                # prompts of 128 / 512
    python benchmarks/gqa_threads.py --quick    # decode over 513 keys, prompt 128
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

N, NKV, H = 14, 2, 64


def _sessions(threads: int, share: bool):
    import onnxruntime as ort
    from test_gqa_exact import _model

    import onnxrun
    from onnxrun.providers.cpu.ops.contrib.transformer import SHARE_PAST_PRESENT

    data = _model(N, NKV, H, True, False, -1, True)
    so = onnxrun.SessionOptions()
    so.intra_op_num_threads = threads
    if share:
        so.add_session_config_entry(SHARE_PAST_PRESENT, "1")
    oso = ort.SessionOptions()
    oso.intra_op_num_threads = threads
    return {"onnxrun": onnxrun.InferenceSession(data, so),
            "onnxruntime": ort.InferenceSession(data, oso, providers=["CPUExecutionProvider"])}


def _feed(rng, S: int, past: int, P: int) -> dict:
    from test_gqa_exact import _caches

    return {"query": rng.standard_normal((1, S, (N + 2 * NKV) * H)).astype(np.float32),
            "past_key": rng.standard_normal((1, NKV, P, H)).astype(np.float32),
            "past_value": rng.standard_normal((1, NKV, P, H)).astype(np.float32),
            "seqlens_k": np.array([past + S - 1], np.int32),
            "total_sequence_length": np.array(max(P, past + S), np.int32), **_caches(H)}


def measure(label: str, S: int, past: int, P: int, share: bool, repeats: int) -> None:
    rng = np.random.default_rng(0)
    runs = {t: _sessions(t, share) for t in (1, 2)}
    feed = _feed(rng, S, past, P)
    times: dict = {(t, e): [] for t in (1, 2) for e in ("onnxrun", "onnxruntime")}
    for _ in range(repeats):
        for (t, e), ts in times.items():
            t0 = time.perf_counter()
            runs[t][e].run(None, feed)
            ts.append(time.perf_counter() - t0)
    med = {k: float(np.median(v)) * 1e3 for k, v in times.items()}
    cells = []
    for e in ("onnxrun", "onnxruntime"):
        one, two = med[(1, e)], med[(2, e)]
        cells.append(f"{one:.3f} / {two:.3f} ({one / two:.2f}x)")
    ratio = med[(2, "onnxrun")] / med[(2, "onnxruntime")]
    print(f"| {label} | {' | '.join(cells)} | {ratio:.2f}x |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f}; wall ms, median; 1 thread / 2 threads "
          "(speed-up)\n")
    print("| GroupQueryAttention, 14 / 2 heads x 64 | onnxrun | onnxruntime | "
          "onnxrun / onnxruntime at 2T |")
    print("|---|---|---|---|")
    for past in ((512,) if args.quick else (128, 512, 1000)):
        measure(f"decode, {past + 1} keys", 1, past, past + 1, True, 200 if args.quick else 400)
    for S in ((128,) if args.quick else (128, 512)):
        measure(f"prompt {S}", S, 0, 0, False, 10 if args.quick or S > 128 else 30)
    print(f"\nload average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
