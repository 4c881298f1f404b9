"""What the serve tests share: small models in ONNX text, a repository writer, and the real
``onnxrun serve`` process on free 127.0.0.1 ports (HTTP, gRPC, metrics)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import onnx
import onnx.parser
import pytest

ADDMUL = """<ir_version: 8, opset_import: ["" : 17]>
addmul (float[N, 4] x, float[N, 4] y) => (float[N, 4] sum, float[N, 4] prod) {
  sum = Add(x, y)
  prod = Mul(x, y)
}"""
# a dynamic non-batch dimension: requests of different M must never be merged
SEQ = """<ir_version: 8, opset_import: ["" : 17]>
seq (float[N, M] x) => (float[N] total, int64[N, M] positive) {
  axes = Constant <value: tensor = int64[1] {1}> ()
  total = ReduceSum <keepdims: int = 0> (x, axes)
  zero = Constant <value: tensor = float {0}> ()
  greater = Greater (x, zero)
  positive = Cast <to: int = 7> (greater)
}"""
ECHO = """<ir_version: 8, opset_import: ["" : 17]>
echo (string[N] text) => (string[N] same) {
  same = Identity (text)
}"""
SCORES = """<ir_version: 8, opset_import: ["" : 17]>
scores (float[N, 5] x) => (float[N, 5] probs) {
  probs = Softmax <axis: int = 1> (x)
}"""
BATCHING = "dynamic_batching {{ preferred_batch_size: [ {0} ] max_queue_delay_microseconds: " \
           "20000000 }}"  # 20 s: a group runs when it reaches its preferred size, not on time


def write_model(root, name, text, config=None, version=1):
    os.makedirs(root / name / str(version), exist_ok=True)
    onnx.save(onnx.parser.parse_model(text), str(root / name / str(version) / "model.onnx"))
    if config is not None:
        (root / name / "config.pbtxt").write_text(config)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(root, *extra):
    """The real server process on free ports, once it answers."""
    port, grpc_port, metrics_port = free_port(), free_port(), free_port()
    log = open(root / "server.log", "w+b")  # noqa: SIM115 - a file, not a pipe that could fill
    proc = subprocess.Popen([sys.executable, "-m", "onnxrun", "serve", str(root),
                             "--http-port", str(port), "--grpc-port", str(grpc_port),
                             "--metrics-port", str(metrics_port),
                             "--log-level", "warning", *extra],
                            stdout=log, stderr=subprocess.STDOUT)
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(f"127.0.0.1:{port}", concurrency=8)
    deadline = time.monotonic() + 60
    while True:
        try:
            if client.is_server_live():
                break
        except Exception:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            log.seek(0)
            pytest.fail(f"the server did not start: {log.read().decode()}")
        time.sleep(0.1)
    client.port, client.grpc_port, client.metrics_port = port, grpc_port, metrics_port
    return proc, client, log


def stop(proc, client, log):
    client.close()
    proc.terminate()  # graceful: uvicorn finishes, then exits by the signal it got
    assert proc.wait(timeout=30) in (0, -15)
    log.seek(0)
    text = log.read().decode()
    log.close()
    assert "Traceback" not in text, text  # no request crashed a handler
