"""Load, soak and Ray Data figures of ``onnxrun serve`` (issue 17); prints a Markdown table.

    python benchmarks/serve_load.py              # tiny, BERT, CNN; HTTP binary, gRPC; batching
                                                 # off / on, concurrency 1, 8, 32
    python benchmarks/serve_load.py --quick      # fewer requests per level (a few minutes)
    python benchmarks/serve_load.py --soak 10    # 10 minutes at concurrency 16, 1% malformed
    python benchmarks/serve_load.py --ray        # Ray Data, 20,000 rows: 2-CPU cluster vs a loop
    python benchmarks/serve_load.py --versus SRC # overhead vs a server running onnxrun from SRC
    python benchmarks/serve_load.py --batch-cost # BERT session alone: time per item by batch size

The server is the real ``onnxrun serve`` process on 127.0.0.1 (free ports); the load generator
is this process: C threads, each with its own keep-alive HTTP connection or gRPC channel, send
the same prebuilt request (Triton's binary tensors over HTTP; raw contents over gRPC) until N
requests are answered. Server overhead = end-to-end p50 at concurrency 1 minus the session's own
time (the server's compute_infer statistics over the same requests). Models: a MiniLM-L6-shaped
BERT (6 layers, hidden 384, 12 heads, FFN 1536, 128 tokens, mean-pooled; random weights, built
with onnx.helper) and the light model zoo's SqueezeNet with a dynamic batch dimension; and
"tiny", one Add, whose session time is ~0: its latency is the server's overhead alone.
"server CPU us/req" is the server process's CPU time (user + system, from /proc) over a level
divided by its requests: what the server spends per request, less sensitive to the machine's
load than latency.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import onnx
import onnx.parser
from onnx import TensorProto, helper, numpy_helper

BATCHING = ("max_batch_size: 32\ndynamic_batching { max_queue_delay_microseconds: 2000 "
            "default_queue_policy { max_queue_size: 4096 } }")
NO_BATCHING = "max_batch_size: 32"


# -- models -------------------------------------------------------------------------------

def build_bert(layers: int = 6, hidden: int = 384, heads: int = 12, ffn: int = 1536,
               vocab: int = 30522, max_pos: int = 512, seed: int = 0) -> onnx.ModelProto:
    """A MiniLM-L6-shaped BERT encoder (random weights), mean-pooled: input_ids and
    attention_mask int64 [N, S] -> embedding float [N, hidden]."""
    rng = np.random.default_rng(seed)
    inits, nodes = [], []

    def w(name, *shape, scale=0.02):
        inits.append(numpy_helper.from_array(
            (rng.standard_normal(shape) * scale).astype(np.float32), name))
        return name

    def const(name, value):
        inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def node(op, inputs, output, **attrs):
        nodes.append(helper.make_node(op, inputs, [output], **attrs))
        return output

    d = hidden // heads
    const("zero", np.array([0], np.int64))
    const("one", np.array([1], np.int64))
    const("heads_shape", np.array([0, 0, heads, d], np.int64))
    const("merge_shape", np.array([0, 0, hidden], np.int64))
    const("scale", np.array(1 / np.sqrt(d), np.float32))
    const("half", np.array(0.5, np.float32))
    const("onef", np.array(1.0, np.float32))
    const("sqrt2", np.array(np.sqrt(2), np.float32))
    const("neg", np.array(-10000.0, np.float32))
    const("axes12", np.array([1, 2], np.int64))
    node("Shape", ["input_ids"], "seq", start=1, end=2)
    node("Slice", [w("pos_emb", max_pos, hidden), "zero", "seq"], "pos")
    node("Gather", [w("word_emb", vocab, hidden), "input_ids"], "words")
    node("Add", ["words", "pos"], "emb")
    h = node("LayerNormalization", ["emb", const("ln0_g", np.ones(hidden, np.float32)),
                                    const("ln0_b", np.zeros(hidden, np.float32))], "h0",
             axis=-1, epsilon=1e-12)
    node("Cast", ["attention_mask"], "maskf", to=TensorProto.FLOAT)
    node("Sub", ["onef", "maskf"], "inv")
    node("Mul", ["inv", "neg"], "bias2")
    node("Unsqueeze", ["bias2", "axes12"], "bias")  # [N, 1, 1, S]
    for i in range(layers):
        p = f"l{i}_"

        def dense(x, n_in, n_out, name, p=p):
            y = node("MatMul", [x, w(p + name + "_w", n_in, n_out)], p + name + "_mm")
            return node("Add", [y, const(p + name + "_b", np.zeros(n_out, np.float32))],
                        p + name)

        def split_heads(x, name, perm, p=p):
            r = node("Reshape", [x, "heads_shape"], p + name + "_r")
            return node("Transpose", [r], p + name + "_t", perm=perm)

        q = split_heads(dense(h, hidden, hidden, "q"), "q", [0, 2, 1, 3])
        k = split_heads(dense(h, hidden, hidden, "k"), "k", [0, 2, 3, 1])
        v = split_heads(dense(h, hidden, hidden, "v"), "v", [0, 2, 1, 3])
        s = node("MatMul", [q, k], p + "scores")
        s = node("Mul", [s, "scale"], p + "scaled")
        s = node("Add", [s, "bias"], p + "masked")
        a = node("Softmax", [s], p + "probs", axis=-1)
        c = node("MatMul", [a, v], p + "ctx")
        c = node("Transpose", [c], p + "ctx_t", perm=[0, 2, 1, 3])
        c = node("Reshape", [c, "merge_shape"], p + "ctx_m")
        o = dense(c, hidden, hidden, "o")
        h = node("LayerNormalization", [node("Add", [h, o], p + "res1"),
                                        const(p + "ln1_g", np.ones(hidden, np.float32)),
                                        const(p + "ln1_b", np.zeros(hidden, np.float32))],
                 p + "h1", axis=-1, epsilon=1e-12)
        f = dense(h, hidden, ffn, "f1")
        g = node("Div", [f, "sqrt2"], p + "g_div")
        g = node("Erf", [g], p + "g_erf")
        g = node("Add", [g, "onef"], p + "g_add")
        g = node("Mul", [f, g], p + "g_mul")
        g = node("Mul", [g, "half"], p + "gelu")
        f = dense(g, ffn, hidden, "f2")
        h = node("LayerNormalization", [node("Add", [h, f], p + "res2"),
                                        const(p + "ln2_g", np.ones(hidden, np.float32)),
                                        const(p + "ln2_b", np.zeros(hidden, np.float32))],
                 p + "h2", axis=-1, epsilon=1e-12)
    node("ReduceMean", [h], "embedding", axes=[1], keepdims=0)
    graph = helper.make_graph(
        nodes, "minilm_shaped_bert",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["N", "S"]),
         helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["N", "S"])],
        [helper.make_tensor_value_info("embedding", TensorProto.FLOAT, ["N", hidden])],
        inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def build_cnn() -> onnx.ModelProto:
    """The light zoo's SqueezeNet (shipped in the onnx package) with a dynamic batch."""
    path = Path(onnx.__file__).parent / "backend/test/data/light/light_squeezenet.onnx"
    model = onnx.load(str(path))
    for vi in list(model.graph.input) + list(model.graph.output):
        vi.type.tensor_type.shape.dim[0].dim_param = "N"
    del model.graph.value_info[:]
    return model


def feeds_of(name: str) -> dict[str, np.ndarray]:
    """One request's inputs (batch 1)."""
    rng = np.random.default_rng(1)
    if name == "tiny":
        return {"x": np.ones((1, 4), np.float32)}
    if name == "bert":
        return {"input_ids": rng.integers(0, 30522, (1, 128), dtype=np.int64),
                "attention_mask": np.ones((1, 128), np.int64)}
    return {"data_0": rng.standard_normal((1, 3, 224, 224), dtype=np.float32)}


def build_mlp(features: int = 256, width: int = 1024, classes: int = 16) -> onnx.ModelProto:
    """The Ray Data model: a 3-layer MLP, x float [N, features] -> logits [N, classes]."""
    rng = np.random.default_rng(2)
    inits, nodes, x = [], [], "x"
    for i, (a, b) in enumerate([(features, width), (width, width), (width, classes)]):
        inits += [numpy_helper.from_array((rng.standard_normal((a, b)) / np.sqrt(a))
                                          .astype(np.float32), f"w{i}"),
                  numpy_helper.from_array(np.zeros(b, np.float32), f"b{i}")]
        nodes += [helper.make_node("Gemm", [x, f"w{i}", f"b{i}"], [f"g{i}"])]
        x = f"g{i}"
        if i < 2:
            nodes.append(helper.make_node("Relu", [x], [f"r{i}"]))
            x = f"r{i}"
    nodes.append(helper.make_node("Identity", [x], ["logits"]))
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", features])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", classes])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def build_tiny() -> onnx.ModelProto:
    """One Add on [N, 4]: its session time is ~0, so its end-to-end time is the overhead."""
    return onnx.parser.parse_model("""<ir_version: 8, opset_import: ["" : 17]>
tiny (float[N, 4] x) => (float[N, 4] y) { y = Add(x, x) }""")


BUILDERS = {"bert": build_bert, "cnn": build_cnn, "tiny": build_tiny}


def write_repository(root: Path, models: list[str], instances: int = 1) -> None:
    """<name>_off (no batching) and <name>_on (dynamic batching) for each model, each with
    ``instances`` sessions (instance_group count)."""
    group = f"\ninstance_group [ {{ count: {instances} }} ]" if instances > 1 else ""
    for name in models:
        model = BUILDERS[name]()
        for suffix, config in (("off", NO_BATCHING), ("on", BATCHING)):
            folder = root / f"{name}_{suffix}"
            (folder / "1").mkdir(parents=True, exist_ok=True)
            onnx.save(model, str(folder / "1" / "model.onnx"))
            (folder / "config.pbtxt").write_text(config + group)


# -- the server ---------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """The real ``onnxrun serve`` process on free 127.0.0.1 ports."""

    def __init__(self, repository: Path, *extra: str, src: str | None = None):
        """``src``: the onnxrun source folder the server runs (PYTHONPATH), else this one."""
        self.http_port, self.grpc_port = free_port(), free_port()
        self.log = tempfile.TemporaryFile()
        env = None if src is None else {**os.environ, "PYTHONPATH": src}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "onnxrun", "serve", str(repository), "--http-port",
             str(self.http_port), "--grpc-port", str(self.grpc_port), "--metrics-port", "0",
             "--log-level", "warning", "--no-access-log", *extra],
            stdout=self.log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + 300
        while True:
            try:
                if self.get("/v2/health/live")[0] == 200:
                    break
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.proc.kill()
                self.log.seek(0)
                raise RuntimeError(f"the server did not start: {self.log.read().decode()}")
            time.sleep(0.2)

    def get(self, path: str) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.http_port, timeout=60)
        try:
            conn.request("GET", path)
            r = conn.getresponse()
            return r.status, r.read()
        finally:
            conn.close()

    def stats(self, model: str) -> dict:
        return json.loads(self.get(f"/v2/models/{model}/stats")[1])["model_stats"][0]

    def cpu_s(self) -> float:
        """The server process's CPU time so far (user + system), in seconds."""
        with open(f"/proc/{self.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def rss_kb(self) -> int:
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=120)
        self.log.close()


# -- clients ------------------------------------------------------------------------------

def http_body(feeds: dict[str, np.ndarray]) -> tuple[bytes, dict[str, str]]:
    """A request with Triton's binary tensors, outputs asked as binary."""
    datatypes = {np.dtype(np.float32): "FP32", np.dtype(np.int64): "INT64"}
    header = {"inputs": [{"name": n, "datatype": datatypes[a.dtype], "shape": list(a.shape),
                          "parameters": {"binary_data_size": a.nbytes}}
                         for n, a in feeds.items()],
              "parameters": {"binary_data_output": True}}
    head = json.dumps(header).encode()
    body = head + b"".join(a.tobytes() for a in feeds.values())
    return body, {"Inference-Header-Content-Length": str(len(head)),
                  "Content-Type": "application/octet-stream"}


class HttpClient:
    def __init__(self, port: int, model: str, body: bytes, headers: dict[str, str]):
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        self.path, self.body, self.headers = f"/v2/models/{model}/infer", body, headers

    def call(self, body: bytes | None = None, headers: dict | None = None) -> int:
        self.conn.request("POST", self.path, body or self.body, headers or self.headers)
        r = self.conn.getresponse()
        r.read()
        return r.status

    def close(self) -> None:
        self.conn.close()


class GrpcClient:
    def __init__(self, port: int, model: str, feeds: dict[str, np.ndarray]):
        import grpc
        from tritonclient.grpc import service_pb2, service_pb2_grpc

        datatypes = {np.dtype(np.float32): "FP32", np.dtype(np.int64): "INT64"}
        self.channel = grpc.insecure_channel(
            f"127.0.0.1:{port}", options=[("grpc.max_receive_message_length", 1 << 28),
                                          ("grpc.max_send_message_length", 1 << 28)])
        self.stub = service_pb2_grpc.GRPCInferenceServiceStub(self.channel)
        self.request = service_pb2.ModelInferRequest(model_name=model)
        for n, a in feeds.items():
            self.request.inputs.add(name=n, datatype=datatypes[a.dtype], shape=a.shape)
            self.request.raw_input_contents.append(a.tobytes())
        self.error = grpc.RpcError

    def call(self, request=None) -> int:
        try:
            self.stub.ModelInfer(request or self.request, timeout=600)
            return 200
        except self.error as e:
            return 400 if e.code().name == "INVALID_ARGUMENT" else 500

    def close(self) -> None:
        self.channel.close()


def run_level(make_client, concurrency: int, requests: int) -> dict:
    """``requests`` calls from ``concurrency`` threads; latencies, throughput, failures."""
    latencies: list[float] = []
    failures = [0]
    lock = threading.Lock()
    left = [requests]

    def worker():
        client = make_client()
        try:
            while True:
                with lock:
                    if left[0] == 0:
                        return
                    left[0] -= 1
                t0 = time.perf_counter()
                try:
                    status = client.call()
                except (OSError, http.client.HTTPException):  # a timeout: counted, reconnect
                    status = 0
                    client.close()
                    client = make_client()
                dt = time.perf_counter() - t0
                with lock:
                    latencies.append(dt)
                    if status != 200:
                        failures[0] += 1
        finally:
            client.close()

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    ms = np.array(latencies) * 1e3
    return {"throughput": requests / wall, "p50_ms": float(np.percentile(ms, 50)),
            "p99_ms": float(np.percentile(ms, 99)), "failures": failures[0]}


def client_factory(protocol: str, server: Server, model: str, feeds: dict[str, np.ndarray]):
    if protocol == "http":
        body, headers = http_body(feeds)
        return lambda: HttpClient(server.http_port, model, body, headers)
    return lambda: GrpcClient(server.grpc_port, model, feeds)


def load(args: argparse.Namespace) -> None:
    models = args.models.split(",")
    protocols = args.protocols.split(",")
    levels = [int(c) for c in args.concurrency.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_repository(root, models, args.instances)
        server = Server(root)
        try:
            for name in models:
                feeds = feeds_of(name)
                for protocol in protocols:
                    for batching in ("off", "on"):
                        model = f"{name}_{batching}"
                        make = client_factory(protocol, server, model, feeds)
                        run_level(make, 1, 3)  # warm-up: first runs plan and allocate
                        for c in levels:
                            # each thread twice at least; tiny is cheap: 200 for its p50
                            n = max(args.requests, 2 * c, 200 if name == "tiny" else 0)
                            before, cpu = server.stats(model), server.cpu_s()
                            r = run_level(make, c, n)
                            cpu = server.cpu_s() - cpu
                            after = server.stats(model)
                            infer = [s["inference_stats"]["compute_infer"] for s in
                                     (before, after)]
                            execs = after["execution_count"] - before["execution_count"]
                            session_ms = (infer[1]["ns"] - infer[0]["ns"]) / max(execs, 1) / 1e6
                            r.update(model=name, protocol=protocol, batching=batching,
                                     concurrency=c, requests=n, session_ms=session_ms,
                                     server_cpu_us=cpu / n * 1e6,
                                     mean_batch=(after["inference_count"]
                                                 - before["inference_count"]) / max(execs, 1))
                            if c == 1:
                                r["overhead_ms"] = r["p50_ms"] - session_ms
                            rows.append(r)
                            print(_row(r), flush=True)
        finally:
            server.stop()
    print()
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


def _row(r: dict) -> str:
    overhead = f"{r['overhead_ms']:.2f}" if "overhead_ms" in r else ""
    return (f"| {r['model']} | {r['protocol']} | {r['batching']} | {r['concurrency']} | "
            f"{r['throughput']:.1f} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | "
            f"{r['mean_batch']:.1f} | {r['session_ms']:.1f} | {overhead} | "
            f"{r['server_cpu_us']:.0f} | {r['failures']} |")


def table(rows: list[dict]) -> str:
    head = ("| model | protocol | batching | concurrency | req/s | p50 ms | p99 ms | mean batch |"
            " session ms/run | overhead ms (c=1) | server CPU us/req | failed |\n"
            "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    lines = [head] + [_row(r) for r in rows]
    speedups = []
    for name in sorted({r["model"] for r in rows}):
        for protocol in sorted({r["protocol"] for r in rows}):
            top = max(r["concurrency"] for r in rows)
            pick = {r["batching"]: r["throughput"] for r in rows if r["model"] == name
                    and r["protocol"] == protocol and r["concurrency"] == top}
            if len(pick) == 2:
                ratio = pick["on"] / pick["off"]
                speedups.append(f"{name} {protocol} c={top}: batching {ratio:.2f}x")
    return "\n".join(lines) + "\n\n" + "; ".join(speedups)


def versus(args: argparse.Namespace) -> None:
    """Server overhead side by side: this tree's server and one running the onnxrun sources
    of ``args.versus`` (e.g. an older commit's ``src``), on the tiny model at concurrency 1,
    in interleaved rounds of 500 requests; medians of the rounds."""
    rounds, n = (4, 300) if args.quick else (8, 500)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_repository(root, ["tiny"])
        servers = {"this tree": Server(root), args.versus: Server(root, src=args.versus)}
        feeds = feeds_of("tiny")
        try:
            for protocol in args.protocols.split(","):
                clients = {k: client_factory(protocol, s, "tiny_off", feeds)()
                           for k, s in servers.items()}
                cpu_us: dict[str, list[float]] = {k: [] for k in servers}
                p50_ms: dict[str, list[float]] = {k: [] for k in servers}
                for c in clients.values():
                    for _ in range(100):  # warm-up
                        c.call()
                for _ in range(rounds):
                    for k, c in clients.items():
                        cpu, latencies = servers[k].cpu_s(), []
                        for _ in range(n):
                            t0 = time.perf_counter()
                            c.call()
                            latencies.append(time.perf_counter() - t0)
                        cpu_us[k].append((servers[k].cpu_s() - cpu) / n * 1e6)
                        p50_ms[k].append(float(np.median(latencies)) * 1e3)
                for k, c in clients.items():
                    c.close()
                    print(f"| {protocol} | {k} | {np.median(p50_ms[k]):.3f} | "
                          f"{np.median(cpu_us[k]):.0f} |", flush=True)
        finally:
            for server in servers.values():
                server.stop()


def batch_cost(args: argparse.Namespace) -> None:
    """What dynamic batching can gain on the BERT model, from the session alone: the wall and
    CPU time per item of one run at each batch size (runs interleaved, medians), and two
    sessions run by two threads at once (instance_group count 2) against one."""
    import onnxrun

    sizes = [1, 4, 16] if args.quick else [1, 2, 4, 8, 16, 32]
    rounds = 2 if args.quick else 3
    model = build_bert().SerializeToString()
    session = onnxrun.InferenceSession(model)
    rng = np.random.default_rng(1)

    def feeds(n):
        return {"input_ids": rng.integers(0, 30522, (n, 128), dtype=np.int64),
                "attention_mask": np.ones((n, 128), np.int64)}

    def timed(fn):
        t, c = time.perf_counter(), time.process_time()
        fn()
        return time.perf_counter() - t, time.process_time() - c

    inputs = {n: feeds(n) for n in sizes}
    for n in sizes:  # warm-up: plans and buffers per shape
        session.run(None, inputs[n])
    wall: dict[int, list[float]] = {n: [] for n in sizes}
    cpu: dict[int, list[float]] = {n: [] for n in sizes}
    for _ in range(rounds):
        for n in sizes:
            w, c = timed(lambda n=n: session.run(None, inputs[n]))
            wall[n].append(w / n)
            cpu[n].append(c / n)
    print("| batch | wall ms/item | CPU ms/item | wall per item vs batch 1 |\n"
          "|---:|---:|---:|---:|")
    base = np.median(wall[1])
    for n in sizes:
        print(f"| {n} | {np.median(wall[n]) * 1e3:.0f} | {np.median(cpu[n]) * 1e3:.0f} | "
              f"{base / np.median(wall[n]):.2f}x |", flush=True)
    # instance_group count 2: two sessions on two threads, 4 items each, against one session
    second = onnxrun.InferenceSession(model)
    second.run(None, inputs[1])
    one, two = [], []

    def both() -> None:
        threads = [threading.Thread(target=lambda s=s: [s.run(None, inputs[1])
                                                          for _ in range(4)])
                   for s in (session, second)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    from threadpoolctl import threadpool_limits

    held = []
    for _ in range(rounds):
        one.append(timed(lambda: [session.run(None, inputs[1]) for _ in range(8)]))
        two.append(timed(both))
        with threadpool_limits(limits=1, user_api="blas"):  # as onnxrun serve does
            held.append(timed(both))
    print(f"8 items at batch 1: one session {np.median([w for w, _ in one]):.2f} s "
          f"(CPU {np.median([c for _, c in one]):.2f} s), two sessions on two threads "
          f"{np.median([w for w, _ in two]):.2f} s (CPU {np.median([c for _, c in two]):.2f} s), "
          f"the same with BLAS held at one thread (as onnxrun serve holds it) "
          f"{np.median([w for w, _ in held]):.2f} s (CPU {np.median([c for _, c in held]):.2f} s)")


# -- soak ---------------------------------------------------------------------------------

def malformed_http(body: bytes, headers: dict, i: int) -> tuple[bytes, dict]:
    """A malformed request (four kinds in turn): truncated binary, bad JSON, wrong datatype,
    wrong shape."""
    head_len = int(headers["Inference-Header-Content-Length"])
    head = json.loads(body[:head_len])
    kind = i % 4
    if kind == 0:
        return body[:-7], headers
    if kind == 1:
        return b"[" + body[1:], headers
    head["inputs"][0]["datatype"] = "FP64" if kind == 2 else head["inputs"][0]["datatype"]
    if kind == 3:
        head["inputs"][0]["shape"] = [2] + head["inputs"][0]["shape"][1:]
    new = json.dumps(head).encode()
    return new + body[head_len:], {**headers, "Inference-Header-Content-Length": str(len(new))}


def soak(repository: Path, model: str, feeds: dict[str, np.ndarray], seconds: float,
         concurrency: int = 16, malformed_every: int = 100, sample_s: float = 10.0) -> dict:
    """``concurrency`` HTTP clients for ``seconds``, one request in ``malformed_every``
    malformed; well-formed answers other than 200, malformed ones other than 400, and the
    server's RSS sampled every ``sample_s``."""
    server = Server(repository)
    body, headers = http_body(feeds)
    counts = {"ok": 0, "failed": 0, "malformed": 0, "malformed_not_400": 0}
    lock = threading.Lock()
    stop_at = time.monotonic() + seconds
    sequence = [0]

    def worker():
        client = HttpClient(server.http_port, model, body, headers)
        try:
            while time.monotonic() < stop_at:
                with lock:
                    sequence[0] += 1
                    i = sequence[0]
                if i % malformed_every == 0:
                    try:
                        status = client.call(*malformed_http(body, headers, i // malformed_every))
                    except (OSError, http.client.HTTPException):
                        client.close()  # the server may close a connection it cannot parse
                        client = HttpClient(server.http_port, model, body, headers)
                        status = 400
                    with lock:
                        counts["malformed"] += 1
                        counts["malformed_not_400"] += status != 400
                else:
                    status = client.call()
                    with lock:
                        counts["ok" if status == 200 else "failed"] += 1
        finally:
            client.close()

    rss = [server.rss_kb()]
    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        time.sleep(min(sample_s, max(0.05, stop_at - time.monotonic())))
        rss.append(server.rss_kb())
    for t in threads:
        t.join()
    rss.append(server.rss_kb())
    server.stop()
    return {**counts, "seconds": seconds, "rss_mb": [round(r / 1024, 1) for r in rss]}


def soak_main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_repository(root, [args.soak_model])
        result = soak(root, f"{args.soak_model}_on", feeds_of(args.soak_model), args.soak * 60)
    rss = result["rss_mb"]
    print(f"soak {args.soak} min, {args.soak_model} (batching on), concurrency 16, 1% "
          f"malformed: {result['ok']} ok, "
          f"{result['failed']} failed well-formed, {result['malformed']} malformed "
          f"({result['malformed_not_400']} not answered 400); server RSS MB first "
          f"{rss[1]}, last {rss[-1]}, max {max(rss)} ({len(rss)} samples: {rss})")


# -- Ray Data -----------------------------------------------------------------------------

def ray_main(args: argparse.Namespace) -> None:
    import ray

    import onnxrun
    import onnxrun.ray

    rows = 20_000
    x = np.random.default_rng(3).standard_normal((rows, 256), dtype=np.float32)
    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "mlp.onnx")
        onnx.save(build_mlp(), path)
        # the same loop in one process: batches of 1,024 rows through one session
        session = onnxrun.InferenceSession(path)
        t0 = time.perf_counter()
        local = [session.run(None, {"x": x[i:i + 1024]})[0] for i in range(0, rows, 1024)]
        one = time.perf_counter() - t0
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        try:
            ds = ray.data.from_numpy(x).materialize()  # column "data"
            t0 = time.perf_counter()
            out = ds.map_batches(onnxrun.ray.Predictor, fn_constructor_kwargs={
                "model": path, "columns": {"data": "x"}}, batch_size=1024,
                batch_format="numpy", concurrency=2).materialize()
            cluster = time.perf_counter() - t0
            got = np.concatenate([b["logits"] for b in out.iter_batches(batch_format="numpy")])
        finally:
            ray.shutdown()
    assert got.shape == (rows, 16)
    np.testing.assert_allclose(np.sort(got.sum(1)), np.sort(np.concatenate(local).sum(1)),
                               rtol=1e-4, atol=1e-3)
    print(f"Ray Data, {rows} rows, MLP 256-1024-1024-16, batches of 1024: local 2-CPU cluster "
          f"(2 actors) {cluster:.2f} s ({rows / cluster:.0f} rows/s) vs one process "
          f"{one:.2f} s ({rows / one:.0f} rows/s)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer requests per level")
    p.add_argument("--models", default="tiny,bert,cnn",
                   help="tiny (one Add: the server's own overhead), bert, cnn")
    p.add_argument("--protocols", default="http,grpc")
    p.add_argument("--concurrency", default="1,8,32")
    p.add_argument("--requests", type=int, default=None, help="requests per level")
    p.add_argument("--soak", type=float, default=None, metavar="MINUTES")
    p.add_argument("--soak-model", default="bert", choices=sorted(BUILDERS))
    p.add_argument("--ray", action="store_true", help="the Ray Data comparison")
    p.add_argument("--json", help="also write the load rows to this file")
    p.add_argument("--instances", type=int, default=1,
                   help="instance_group count of every model (sessions run at once)")
    p.add_argument("--batch-cost", action="store_true", help="what batching can gain on "
                   "BERT: the session's time per item by batch size, 1 vs 2 instances")
    p.add_argument("--versus", metavar="SRC", help="overhead side by side with a server "
                   "running the onnxrun sources in SRC (e.g. an older commit's src folder)")
    args = p.parse_args()
    if args.requests is None:
        args.requests = 8 if args.quick else 200
    print(f"# load: {os.getloadavg()[0]:.2f} (1-min average), {os.cpu_count()} CPUs", flush=True)
    if args.soak is not None:
        soak_main(args)
    elif args.batch_cost:
        batch_cost(args)
    elif args.versus:
        print("| protocol | server | p50 ms (c=1, tiny) | server CPU us/req |\n|---|---|---:|---:|")
        versus(args)
    elif args.ray:
        ray_main(args)
    else:
        load(args)
    print(f"# load after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
