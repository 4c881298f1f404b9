"""How onnxrun scales from 1 to 2 intra-op threads (issue #18): each model's 1- and 2-thread
sessions run alternately in this process; medians of the wall time, the calling thread's CPU
time (what the second thread did not take off it) and the process's CPU time (all threads:
more than at 1 thread means hand-off cost or spinning).

    python benchmarks/thread_scaling.py            # zoo CNNs, issue #18's models, VGG-19, BERT
    python benchmarks/thread_scaling.py --quick    # resnet50, squeezenet, YOLO, GPT, BERT
    python benchmarks/thread_scaling.py --models vgg,bert -r 9
    python benchmarks/thread_scaling.py --quick --pause 0.15   # each run after 0.15 s idle

``--pause``: every timed run follows that long a sleep, as half of run_suite.py's 2-thread
runs followed its pause between engines until session 11 (tools/bench.py SETTLE_SECONDS; an
untimed run follows the pause now): the same command with and without it says what the pause
alone costs each thread count (benchmarks/cold_runs.py: both engines).

The zoo CNNs come with the onnx package; YOLO, CRNN and DenseNet from benchmarks/suite_models.py
(written to the cache on first use); the GPT decoder and MobileNetV2 from the cache when
scripts/generate_bench_models.py wrote them; the BERT-shaped encoder (MiniLM-L6: 6 layers,
hidden 384, 12 heads, MLP 1536, 2 x 128 tokens, random weights) is built here with onnx.helper.
Run the same command on another checkout (PYTHONPATH=that/src) for a before/after figure.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import onnxrun

HERE = Path(__file__).resolve().parent
LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
CACHE = Path(os.environ.get("ONNXRUN_BENCH_CACHE", Path.home() / ".cache" / "onnxrun-bench"))


def bert_encoder(layers: int = 6, hidden: int = 384, heads: int = 12, mlp: int = 1536,
                 batch: int = 2, seq: int = 128) -> tuple[bytes, dict[str, np.ndarray]]:
    """A BERT-style encoder of MatMul / Add / Softmax / LayerNormalization / Gelu nodes."""
    rng = np.random.default_rng(0)
    nodes, inits = [], []

    def const(name: str, shape: tuple[int, ...], scale: float = 0.05) -> str:
        inits.append(numpy_helper.from_array(
            (rng.standard_normal(shape) * scale).astype(np.float32), name))
        return name

    def node(op: str, ins: list[str], out: str, **attrs) -> str:
        nodes.append(helper.make_node(op, ins, [out], **attrs))
        return out

    d = hidden // heads
    shape_heads = "shape_heads"
    inits.append(numpy_helper.from_array(np.array([batch, seq, heads, d], np.int64), shape_heads))
    inits.append(numpy_helper.from_array(np.array([batch, seq, hidden], np.int64), "shape_flat"))
    inits.append(numpy_helper.from_array(np.array(1 / np.sqrt(d), np.float32), "scale"))
    x = "X"
    for i in range(layers):
        p = f"l{i}_"
        parts = []
        for name in ("q", "k", "v"):
            t = node("Add", [node("MatMul", [x, const(p + name + "w", (hidden, hidden))],
                                  p + name + "m"), const(p + name + "b", (hidden,))], p + name)
            t = node("Reshape", [t, shape_heads], p + name + "r")
            parts.append(node("Transpose", [t], p + name + "t",
                              perm=[0, 2, 3, 1] if name == "k" else [0, 2, 1, 3]))
        s = node("Mul", [node("MatMul", parts[:2], p + "s"), "scale"], p + "ss")
        a = node("MatMul", [node("Softmax", [s], p + "sm", axis=-1), parts[2]], p + "a")
        a = node("Reshape", [node("Transpose", [a], p + "at", perm=[0, 2, 1, 3]), "shape_flat"],
                 p + "ar")
        o = node("Add", [node("MatMul", [a, const(p + "ow", (hidden, hidden))], p + "om"),
                         const(p + "ob", (hidden,))], p + "o")
        x = node("LayerNormalization", [node("Add", [x, o], p + "r1"),
                                        const(p + "g1", (hidden,), 1), const(p + "b1", (hidden,))],
                 p + "n1", axis=-1)
        h = node("Add", [node("MatMul", [x, const(p + "f1", (hidden, mlp))], p + "fm"),
                         const(p + "fb", (mlp,))], p + "f")
        h = node("Gelu", [h], p + "g")
        h = node("Add", [node("MatMul", [h, const(p + "f2", (mlp, hidden))], p + "hm"),
                         const(p + "hb", (hidden,))], p + "h")
        x = node("LayerNormalization", [node("Add", [x, h], p + "r2"),
                                        const(p + "g2", (hidden,), 1), const(p + "b2", (hidden,))],
                 p + "n2", axis=-1)
    nodes.append(helper.make_node("Identity", [x], ["Y"]))
    graph = helper.make_graph(
        nodes, "bert", [helper.make_tensor_value_info("X", TensorProto.FLOAT,
                                                      [batch, seq, hidden])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    feeds = {"X": rng.standard_normal((batch, seq, hidden)).astype(np.float32)}
    return model.SerializeToString(), feeds


def _suite(name: str) -> tuple[str, dict[str, np.ndarray]]:
    sys.path.insert(0, str(HERE))
    import suite_models

    path = suite_models.ensure(name, CACHE)
    return str(path), {}


def cases(quick: bool) -> list[tuple[str, object]]:
    out = [("resnet50", lambda: (str(LIGHT / "light_resnet50.onnx"), {})),
           ("squeezenet", lambda: (str(LIGHT / "light_squeezenet.onnx"), {})),
           ("yolo", lambda: _suite("yolo_style")),
           ("gpt", lambda: (str(CACHE / "gpt_decoder" / "model.onnx"), {})),
           ("bert", bert_encoder)]
    if not quick:
        out[2:2] = [("shufflenet", lambda: (str(LIGHT / "light_shufflenet.onnx"), {})),
                    ("mobilenet", lambda: (str(CACHE / "mobilenet_v2" / "model.onnx"), {})),
                    ("vgg19", lambda: (str(LIGHT / "light_vgg19.onnx"), {}))]
        out += [("crnn", lambda: _suite("crnn_style")),
                ("densenet", lambda: _suite("densenet_style"))]
    return out


def measure(model, feeds, repeat: int,
            pause: float = 0.0) -> dict[int, tuple[float, float, float]]:
    from onnxrun.tools.common import make_feeds

    sessions = {}
    for n in (1, 2):
        so = onnxrun.SessionOptions()
        so.intra_op_num_threads = n
        sessions[n] = onnxrun.InferenceSession(model, so)
    if not feeds:
        feeds = make_feeds(sessions[1], {}, {})[0]
    times: dict[int, list[tuple[float, float, float]]] = {1: [], 2: []}
    for n in (1, 2):
        sessions[n].run(None, feeds)
    for r in range(repeat):
        # the order turned every round (1 2, 2 1, ...): the session that runs second finds
        # the caches filled by the other one's weights as often as the first
        for n in ((1, 2) if r % 2 == 0 else (2, 1)):
            if pause:
                time.sleep(pause)
            t0, c0, p0 = time.perf_counter(), time.thread_time(), time.process_time()
            sessions[n].run(None, feeds)
            times[n].append((time.perf_counter() - t0, time.thread_time() - c0,
                             time.process_time() - p0))
    return {n: tuple(float(np.median([t[i] for t in times[n]])) * 1e3 for i in range(3))
            for n in (1, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="five models, 5 runs each")
    ap.add_argument("--models", default="", help="comma-separated names (default: all)")
    ap.add_argument("-r", "--repeat", type=int, default=0, help="timed runs per session")
    ap.add_argument("--pause", type=float, default=0.0,
                    help="seconds of sleep before every timed run (default 0)")
    args = ap.parse_args()
    repeat = args.repeat or (5 if args.quick else 9)
    wanted = {m for m in args.models.split(",") if m}
    print(f"load before: {' '.join(f'{v:.2f}' for v in os.getloadavg())}; "
          f"onnxrun from {Path(onnxrun.__file__).parent}"
          + (f"; {args.pause} s pause before every run" if args.pause else ""))
    print("| model | 1T wall | 2T wall | 2T speed-up | 1T CPU | 2T calling thread CPU "
          "| 2T process CPU |")
    print("| --- | --: | --: | --: | --: | --: | --: |")
    for name, make in cases(args.quick and not wanted):
        if wanted and name not in wanted:
            continue
        model, feeds = make()
        if isinstance(model, str) and not Path(model).exists():
            print(f"| {name} | not generated ({model}) | | | | | |")
            continue
        r = measure(model, feeds, repeat, args.pause)
        print(f"| {name} | {r[1][0]:.1f} ms | {r[2][0]:.1f} ms | {r[1][0] / r[2][0]:.2f}x "
              f"| {r[1][2]:.1f} ms | {r[2][1]:.1f} ms | {r[2][2]:.1f} ms |", flush=True)
    print(f"load after: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")


if __name__ == "__main__":
    main()
