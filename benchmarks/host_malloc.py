"""What glibc's malloc settings do to a BERT run: onnxrun leaves them to the host process.

onnxrun once set glibc's mmap and trim thresholds (mallopt) for the whole process when a session
was created, so that the activations a run frees stay mapped for the next run. That is a
setting of the host, not of a library: now an application opts in itself, at start-up, with
glibc's own tunables. This script measures what the opt-in is worth: an encoder in MiniLM-L6's
configuration (6 layers, hidden 384, 12 heads, intermediate 1536; random weights, built here
with onnx.helper, no download), 2 x 128 tokens, intra_op_num_threads=1, in fresh processes with
and without

    GLIBC_TUNABLES=glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=268435456

(the values onnxrun used to set). The variants run alternately, ``--rounds`` processes each,
``--runs`` timed runs per process after 5 warm-up runs. Prints, per variant, the median run
time, the minor page faults and CPU time per run, and the peak resident size.

    python benchmarks/host_malloc.py --rounds 6 --runs 50
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPT_IN = "glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=268435456"
LAYERS, HIDDEN, HEADS, INTER, VOCAB, BATCH, SEQ = 6, 384, 12, 1536, 30522, 2, 128


def bert(path: Path) -> None:
    rng = np.random.default_rng(0)
    inits: list[TensorProto] = []
    nodes: list[onnx.NodeProto] = []

    def init(name: str, value: np.ndarray) -> str:
        inits.append(numpy_helper.from_array(value, name))
        return name

    def weight(name: str, *shape: int) -> str:
        return init(name, (rng.standard_normal(shape) * 0.05).astype(np.float32))

    def node(op: str, inputs: list[str], **attrs) -> str:
        out = f"t{len(nodes)}"
        nodes.append(helper.make_node(op, inputs, [out], **attrs))
        return out

    def layer_norm(x: str, name: str) -> str:
        g = init(f"{name}.g", np.ones(HIDDEN, np.float32))
        b = init(f"{name}.b", np.zeros(HIDDEN, np.float32))
        return node("LayerNormalization", [x, g, b], axis=-1, epsilon=1e-12)

    def dense(x: str, name: str, n_in: int, n_out: int) -> str:
        return node("Add", [node("MatMul", [x, weight(f"{name}.w", n_in, n_out)]),
                            weight(f"{name}.b", n_out)])

    heads = init("heads_shape", np.array([0, 0, HEADS, HIDDEN // HEADS], np.int64))
    merged = init("merged_shape", np.array([0, 0, HIDDEN], np.int64))
    positions = init("positions", np.arange(SEQ, dtype=np.int64)[None])
    h = node("Add", [node("Gather", [weight("word", VOCAB, HIDDEN), "input_ids"]),
                     node("Gather", [weight("position", 512, HIDDEN), positions])])
    h = layer_norm(node("Add", [h, node("Gather", [weight("type", 2, HIDDEN),
                                                    "token_type_ids"])]), "emb")
    mask = node("Cast", ["attention_mask"], to=TensorProto.FLOAT)
    mask = node("Mul", [node("Sub", [init("one", np.float32(1)), mask]),
                        init("neg", np.float32(-10000))])
    mask = node("Unsqueeze", [mask, init("axes", np.array([1, 2], np.int64))])
    scale = init("scale", np.float32(1 / np.sqrt(HIDDEN // HEADS)))
    for i in range(LAYERS):
        def split(x: str, perm: list[int]) -> str:
            return node("Transpose", [node("Reshape", [x, heads])], perm=perm)

        q = split(dense(h, f"l{i}.q", HIDDEN, HIDDEN), [0, 2, 1, 3])
        k = split(dense(h, f"l{i}.k", HIDDEN, HIDDEN), [0, 2, 3, 1])
        v = split(dense(h, f"l{i}.v", HIDDEN, HIDDEN), [0, 2, 1, 3])
        scores = node("Add", [node("Mul", [node("MatMul", [q, k]), scale]), mask])
        ctx = node("MatMul", [node("Softmax", [scores], axis=-1), v])
        ctx = node("Reshape", [node("Transpose", [ctx], perm=[0, 2, 1, 3]), merged])
        h = layer_norm(node("Add", [dense(ctx, f"l{i}.o", HIDDEN, HIDDEN), h]), f"l{i}.ln1")
        f = dense(h, f"l{i}.up", HIDDEN, INTER)
        erf = node("Erf", [node("Div", [f, init(f"l{i}.sqrt2", np.float32(np.sqrt(2)))])])
        f = node("Mul", [node("Mul", [f, init(f"l{i}.half", np.float32(0.5))]),
                         node("Add", [erf, init(f"l{i}.one", np.float32(1))])])
        h = layer_norm(node("Add", [dense(f, f"l{i}.down", INTER, HIDDEN), h]), f"l{i}.ln2")
    nodes[-1].output[0] = "last_hidden_state"
    ids = [helper.make_tensor_value_info(n, TensorProto.INT64, [BATCH, SEQ])
           for n in ("input_ids", "attention_mask", "token_type_ids")]
    out = helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT,
                                        [BATCH, SEQ, HIDDEN])
    graph = helper.make_graph(nodes, "bert", ids, [out], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                                ir_version=8), path)


CHILD = """
import json, resource, sys, time
import numpy as np
import onnxrun
path, runs, batch, seq, vocab = sys.argv[1], *map(int, sys.argv[2:])
so = onnxrun.SessionOptions()
so.intra_op_num_threads = 1
sess = onnxrun.InferenceSession(path, so)
rng = np.random.default_rng(1)
mask = np.ones((batch, seq), np.int64)
mask[1, 100:] = 0  # one padded row
feeds = {"input_ids": rng.integers(0, vocab, mask.shape), "attention_mask": mask,
         "token_type_ids": np.zeros_like(mask)}
for _ in range(5):
    sess.run(None, feeds)
times = []
r0 = resource.getrusage(resource.RUSAGE_SELF)
for _ in range(runs):
    t0 = time.perf_counter()
    sess.run(None, feeds)
    times.append(time.perf_counter() - t0)
r1 = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"times": times, "faults": (r1.ru_minflt - r0.ru_minflt) / runs,
                  "cpu": (r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime) / runs,
                  "sys": (r1.ru_stime - r0.ru_stime) / runs, "peak_kib": r1.ru_maxrss}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=6, help="processes per variant")
    parser.add_argument("--runs", type=int, default=50, help="timed runs per process")
    args = parser.parse_args()
    variants = {"glibc defaults (onnxrun's default)": {},
                "GLIBC_TUNABLES opt-in": {"GLIBC_TUNABLES": OPT_IN}}
    results: dict[str, list[dict]] = {v: [] for v in variants}
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "bert.onnx"
        bert(model)
        for _ in range(args.rounds):
            for name, env in variants.items():
                argv = [str(model), *map(str, (args.runs, BATCH, SEQ, VOCAB))]
                out = subprocess.run([sys.executable, "-c", CHILD, *argv],
                                     env={**os.environ, **env}, capture_output=True, text=True,
                                     check=True).stdout
                results[name].append(json.loads(out))
    print(f"BERT (MiniLM-L6 configuration), {BATCH} x {SEQ} tokens, 1 thread, "
          f"{args.rounds} processes x {args.runs} runs per variant, alternating")
    for name, rs in results.items():
        times = [t for r in rs for t in r["times"]]
        print(f"  {name:36s} median {statistics.median(times) * 1e3:7.2f} ms  "
              f"page faults/run {statistics.mean(r['faults'] for r in rs):8.0f}  "
              f"CPU/run {statistics.mean(r['cpu'] for r in rs) * 1e3:6.1f} ms "
              f"(kernel {statistics.mean(r['sys'] for r in rs) * 1e3:4.1f} ms)  "
              f"peak RSS {max(r['peak_kib'] for r in rs) / 1024:6.1f} MiB")


if __name__ == "__main__":
    main()
