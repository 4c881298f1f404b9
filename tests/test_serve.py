"""``onnxrun serve``: the real server process on 127.0.0.1, driven by tritonclient unchanged
(KServe v2 over HTTP, JSON and binary tensors), its dynamic batcher (checked through the
server's statistics, never timing) and its 400s for bad requests."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import time

import numpy as np
import onnx
import onnx.parser
import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
httpclient = pytest.importorskip("tritonclient.http")
from serve_harness import (  # noqa: E402
    ADDMUL,
    BATCHING,
    ECHO,
    SCORES,
    SEQ,
    free_port,
    launch,
    stop,
    write_model,
)
from tritonclient.utils import InferenceServerException  # noqa: E402

import onnxrun  # noqa: E402
from onnxrun.errors import InvalidArgument  # noqa: E402
from onnxrun.serve.config import read_config  # noqa: E402
from onnxrun.serve.repository import Repository, UnknownModel  # noqa: E402
from onnxrun.serve.scheduler import Unavailable  # noqa: E402


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("repository")
    write_model(root, "addmul", ADDMUL, "max_batch_size: 8\ninstance_group [ { count: 2 } ]")
    write_model(root, "addmul", ADDMUL, "max_batch_size: 8", version=3)  # the latest is served
    write_model(root, "batched", ADDMUL, f"max_batch_size: 8\n{BATCHING.format(4)}")
    write_model(root, "seq", SEQ, f'name: "seq"\nmax_batch_size: 4\n{BATCHING.format(2)}')
    write_model(root, "fixed", ADDMUL)  # no config: its own shapes, no batching
    write_model(root, "echo", ECHO)
    # two requests wait (up to 2 s) for a third that never fits: a third is refused at once
    write_model(root, "small_queue", ADDMUL, "max_batch_size: 8\ndynamic_batching { "
                "preferred_batch_size: 3 max_queue_delay_microseconds: 2000000 "
                "default_queue_policy { max_queue_size: 2 } }")
    os.makedirs(root / "broken" / "1")
    (root / "broken" / "1" / "model.onnx").write_bytes(b"not a model")
    proc, client, log = launch(root)
    yield client, client.port, root
    stop(proc, client, log)


def _inputs(x, y, binary=True):
    out = []
    for name, v in (("x", x), ("y", y)):
        i = httpclient.InferInput(name, list(v.shape), "FP32")
        i.set_data_from_numpy(v, binary_data=binary)
        out.append(i)
    return out


def _reference(name, feeds):
    text = {"addmul": ADDMUL, "seq": SEQ}[name]
    sess = onnxrun.InferenceSession(onnx.parser.parse_model(text).SerializeToString())
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds), strict=True))


def test_health_and_metadata(server):
    client, _, _ = server
    assert client.is_server_live()
    assert not client.is_server_ready()  # strict readiness: the broken model is not
    assert client.is_model_ready("addmul")
    assert client.is_model_ready("addmul", "3")
    assert not client.is_model_ready("addmul", "1")
    assert not client.is_model_ready("broken")
    assert not client.is_model_ready("nosuch")
    meta = client.get_model_metadata("addmul")
    assert meta["versions"] == ["3"]
    assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 4]},
                              {"name": "y", "datatype": "FP32", "shape": [-1, 4]}]
    assert [o["name"] for o in meta["outputs"]] == ["sum", "prod"]
    assert client.get_model_metadata("fixed")["inputs"][0]["shape"] == [-1, 4]
    assert client.get_server_metadata()["name"] == "onnxrun"
    config = client.get_model_config("batched")
    assert config["max_batch_size"] == 8
    assert config["dynamic_batching"]["preferred_batch_size"] == [4]
    index = {m["name"]: m for m in client.get_model_repository_index()}
    assert index["addmul"]["state"] == "READY" and index["addmul"]["version"] == "3"
    assert index["broken"]["state"] == "UNAVAILABLE"
    assert "protobuf" in index["broken"]["reason"]


@pytest.mark.parametrize("binary", [True, False])
def test_infer_matches_session(server, binary):
    client, _, _ = server
    rng = np.random.default_rng(0)
    x, y = (rng.standard_normal((3, 4), dtype=np.float32) for _ in range(2))
    expected = _reference("addmul", {"x": x, "y": y})
    outputs = [httpclient.InferRequestedOutput(n, binary_data=binary) for n in ("sum", "prod")]
    result = client.infer("addmul", _inputs(x, y, binary), outputs=outputs, request_id="r7")
    assert result.get_response()["id"] == "r7"
    for name in ("sum", "prod"):
        np.testing.assert_array_equal(result.as_numpy(name), expected[name])
    # requested outputs: only those come back; no outputs named: all of them, binary
    only = client.infer("fixed", _inputs(x[:1], y[:1], binary),
                        outputs=[httpclient.InferRequestedOutput("prod", binary_data=binary)])
    assert [o["name"] for o in only.get_response()["outputs"]] == ["prod"]
    np.testing.assert_array_equal(only.as_numpy("prod"), expected["prod"][:1])
    every = client.infer("addmul", _inputs(x, y, binary), model_version="3")
    np.testing.assert_array_equal(every.as_numpy("sum"), expected["sum"])


@pytest.mark.parametrize("binary", [True, False])
def test_bytes_tensors(server, binary):
    client, _, _ = server
    text = np.array([b"hello", "w\u00f6rld".encode(), b""], dtype=object)
    i = httpclient.InferInput("text", [3], "BYTES")
    i.set_data_from_numpy(text, binary_data=binary)
    result = client.infer("echo", [i], outputs=[
        httpclient.InferRequestedOutput("same", binary_data=binary)])
    # tritonclient gives JSON BYTES back as str, binary ones as bytes (as from Triton)
    expected = text.tolist() if binary else [t.decode() for t in text]
    assert result.as_numpy("same").tolist() == expected
    # bytes that are not UTF-8 can only come back as binary data
    i.set_shape([1])
    i.set_data_from_numpy(np.array([b"\xff"], dtype=object), binary_data=True)
    with pytest.raises(InferenceServerException, match="not UTF-8") as e:
        client.infer("echo", [i], outputs=[
            httpclient.InferRequestedOutput("same", binary_data=False)])
    assert e.value.status() == "400"
    same = client.infer("echo", [i]).as_numpy("same")
    assert same.tolist() == [b"\xff"]


@pytest.mark.parametrize("binary", [True, False])
def test_large_tensors(server, binary):
    client, _, _ = server
    x = np.random.default_rng(3).standard_normal((5000, 4), dtype=np.float32)  # 80 KB each
    outputs = [httpclient.InferRequestedOutput("sum", binary_data=binary)]
    result = client.infer("fixed", _inputs(x, x, binary), outputs=outputs)
    np.testing.assert_array_equal(result.as_numpy("sum"), x + x)


def _stats(client, name):
    return client.get_inference_statistics(name)["model_stats"][0]


def test_dynamic_batcher_merges_concurrent_requests(server):
    client, _, _ = server
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal((1, 4), dtype=np.float32) for _ in range(4)]
    before = _stats(client, "batched")
    pending = [client.async_infer("batched", _inputs(x, x)) for x in xs]
    for x, p in zip(xs, pending, strict=True):
        np.testing.assert_array_equal(p.get_result().as_numpy("prod"), x * x)
    after = _stats(client, "batched")
    assert after["inference_count"] - before["inference_count"] == 4
    assert after["execution_count"] - before["execution_count"] == 1  # one session call
    assert {b["batch_size"]: b["compute_infer"]["count"] for b in after["batch_stats"]} == {4: 1}


def test_dynamic_batcher_never_merges_different_shapes(server):
    client, _, _ = server
    rng = np.random.default_rng(2)
    xs = [rng.standard_normal((1, m), dtype=np.float32) for m in (3, 5, 3, 5)]
    pending = []
    for x in xs:
        i = httpclient.InferInput("x", list(x.shape), "FP32")
        i.set_data_from_numpy(x)
        pending.append(client.async_infer("seq", [i]))
    for x, p in zip(xs, pending, strict=True):
        result = p.get_result()
        expected = _reference("seq", {"x": x})
        np.testing.assert_array_equal(result.as_numpy("total"), expected["total"])
        np.testing.assert_array_equal(result.as_numpy("positive"), expected["positive"])
    stats = _stats(client, "seq")
    assert stats["inference_count"] == 4 and stats["execution_count"] == 2
    assert {b["batch_size"]: b["compute_infer"]["count"] for b in stats["batch_stats"]} == {2: 2}


def _post(port, path, body: bytes, headers=None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("POST", path, body, headers or {})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def _json_request(x_shape=(1, 4), x_type="FP32", x_data=None, name="x", y_batch=None):
    data = x_data if x_data is not None else [0.5] * int(np.prod(x_shape))
    y_batch = x_shape[0] if y_batch is None else y_batch
    return {"inputs": [{"name": name, "datatype": x_type, "shape": list(x_shape), "data": data},
                       {"name": "y", "datatype": "FP32", "shape": [y_batch, 4],
                        "data": [1] * 4 * y_batch}]}


@pytest.mark.parametrize("body, reason", [
    (b'{"inputs": [', "malformed"),
    (b'[1, 2]', "'inputs' list"),
    (json.dumps(_json_request(name="z")).encode(), "no input 'z'"),
    (json.dumps(_json_request(x_type="INT32", x_data=[1] * 4)).encode(), "input 'x' is FP32"),
    (json.dumps(_json_request(x_type="FP99")).encode(), "unknown datatype"),
    (json.dumps(_json_request(x_shape=(1, 5))).encode(), "shape [1, 5]"),
    (json.dumps(_json_request(x_shape=(1, 4), x_data=[1.0] * 3)).encode(), "3 values"),
    (json.dumps(_json_request(x_shape=(10**30, 4), x_data=[1.0] * 4, y_batch=1)).encode(),
     "4 values"),
    (json.dumps(_json_request(x_type="INT8", x_data=[300] * 4)).encode(), "out of the range"),
    (json.dumps(_json_request(x_type="INT64", x_data=[1.5] * 4)).encode(), "not a INT64"),
    (json.dumps(_json_request(x_shape=(9, 4))).encode(), "exceeds its max_batch_size 8"),
    (json.dumps(_json_request(x_shape=(2, 4), y_batch=1)).encode(), "batch size 1, the others 2"),
    (b'{"inputs": [{"name": "x", "datatype": "BYTES", "shape": [1], "data": ["\\ud800"]}]}',
     "not valid UTF-8"),
])
def test_bad_json_requests_get_400(server, body, reason):
    _, port, _ = server
    status, reply = _post(port, "/v2/models/addmul/infer", body)
    assert status == 400, reply
    assert reason in json.loads(reply)["error"]


def test_bad_binary_requests_get_400(server):
    client, port, _ = server
    x = np.ones((1, 4), np.float32)
    header = {"inputs": [{"name": n, "datatype": "FP32", "shape": [1, 4],
                          "parameters": {"binary_data_size": 16}} for n in ("x", "y")]}
    head = json.dumps(header).encode()
    good = head + x.tobytes() * 2
    hl = {"Inference-Header-Content-Length": str(len(head))}
    status, reply = _post(port, "/v2/models/addmul/infer", good, hl)
    assert status == 200, reply
    for body, headers, reason in [
        (good[:-1], hl, "runs past"),                       # truncated payload
        (good + b"\0", hl, "add up to 32 bytes, but 33"),    # bytes left over
        (good, {"Inference-Header-Content-Length": str(len(good) + 1)}, "not a length"),
        (good, {"Inference-Header-Content-Length": "3"}, "malformed"),
    ]:
        status, reply = _post(port, "/v2/models/addmul/infer", body, headers)
        assert status == 400, reply
        assert reason in json.loads(reply)["error"]
    with pytest.raises(InferenceServerException, match="exceeds its max_batch_size") as e:
        big = np.ones((9, 4), np.float32)
        client.infer("addmul", _inputs(big, big))
    assert e.value.status() == "400"
    with pytest.raises(InferenceServerException, match="unknown model") as e:
        client.infer("broken", _inputs(x, x))
    assert e.value.status() == "400"
    assert client.is_server_live()  # and still serving
    np.testing.assert_array_equal(client.infer("addmul", _inputs(x, x)).as_numpy("sum"), 2 * x)



def test_infer_path_wants_post(server):
    _, port, _ = server
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        for path in ("/v2/models/addmul/infer", "/v2/models/addmul/versions/3/infer"):
            conn.request("GET", path)
            response = conn.getresponse()
            reply = response.read()
            assert response.status == 405, reply
            assert response.getheader("allow") == "POST"
            assert "inference requests are POST" in json.loads(reply)["error"]
    finally:
        conn.close()
    status, reply = _post(port, "/v2/models/addmul/versions/2/infer", b"{}")
    assert status == 400 and "version 2 is not found" in json.loads(reply)["error"]


def test_binary_inputs_are_views_of_the_body(tmp_path):
    """The REST endpoint hands the session numpy views of the request body (no copies) where
    a tensor's bytes are aligned for its dtype, and aligned copies where they are not."""
    import asyncio

    from onnxrun.serve import http as rest

    write_model(tmp_path, "addmul", ADDMUL, "max_batch_size: 8")
    repository = Repository(tmp_path)
    model = repository.model("addmul")
    seen = {}
    submit = model.scheduler.submit

    def spy(inputs, *args, **kwargs):
        seen.update(inputs)
        return submit(inputs, *args, **kwargs)

    model.scheduler.submit = spy
    x, y = np.arange(8, dtype=np.float32).reshape(2, 4), np.ones((2, 4), np.float32)
    try:
        for pad in (0, 1):  # header length 0 or 1 mod 8 (a bytes object's data is aligned)
            head = json.dumps({"inputs": [
                {"name": n, "datatype": "FP32", "shape": [2, 4],
                 "parameters": {"binary_data_size": 32}} for n in ("x", "y")],
                "parameters": {"binary_data_output": True}}).encode()
            head += b" " * ((-len(head)) % 8 + pad)
            body = head + x.tobytes() + y.tobytes()
            reply, length = asyncio.run(rest.infer(model, body, str(len(head)).encode()))
            out = json.loads(reply[:length])["outputs"]
            assert [o["name"] for o in out] == ["sum", "prod"]
            np.testing.assert_array_equal(
                np.frombuffer(reply[length:length + 32], np.float32).reshape(2, 4), x + y)
            np.testing.assert_array_equal(seen["x"], x)
            assert all(a.flags.aligned for a in seen.values())
            shared = np.shares_memory(seen["x"], np.frombuffer(body, np.uint8))
            assert shared == (pad == 0), pad
    finally:
        repository.close()


def _metrics(port) -> dict[tuple[str, str], float]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", "/metrics")
        response = conn.getresponse()
        assert response.status == 200
        text = response.read().decode()
    finally:
        conn.close()
    values = {}
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        name_labels, value = line.rsplit(" ", 1)
        name, labels = name_labels.split("{")
        model = labels.split('model="')[1].split('"')[0]
        values[name, model] = float(value)
    assert "# TYPE nv_inference_count counter" in text
    return values


def test_metrics_in_triton_names(server):
    client, port, _ = server
    before = _metrics(client.metrics_port)
    x = np.ones((1, 4), np.float32)
    client.infer("fixed", _inputs(x, x))
    with pytest.raises(InferenceServerException, match="shape"):
        client.infer("fixed", _inputs(np.ones((1, 5), np.float32), x))
    after = _metrics(client.metrics_port)
    delta = {k: after[k] - before.get(k, 0) for k in after if k[1] == "fixed"}
    assert delta["nv_inference_request_success", "fixed"] == 1
    assert delta["nv_inference_request_failure", "fixed"] == 1  # rejected: counted as Triton does
    assert delta["nv_inference_count", "fixed"] == 1
    assert delta["nv_inference_exec_count", "fixed"] == 1
    assert delta["nv_inference_queue_duration_us", "fixed"] >= 0
    assert ("nv_inference_count", "broken") not in after  # not loaded: no series


def test_sigterm_finishes_queued_requests(tmp_path):
    write_model(tmp_path, "batched", ADDMUL, "max_batch_size: 8\ndynamic_batching { "
                "preferred_batch_size: 4 max_queue_delay_microseconds: 600000000 }")
    proc, client, log = launch(tmp_path)
    x = np.full((1, 4), 3, np.float32)
    pending = client.async_infer("batched", _inputs(x, x))  # alone: would wait 10 min for 3 more
    deadline = time.monotonic() + 30
    while _metrics(client.metrics_port)["nv_inference_pending_request_count", "batched"] != 1:
        assert time.monotonic() < deadline, "the request never reached the queue"
        time.sleep(0.02)
    proc.terminate()
    try:
        # the queued request runs at once and its answer comes back before the process ends
        np.testing.assert_array_equal(pending.get_result(timeout=60).as_numpy("prod"), x * x)
        # a new request is refused: a 503 while stopping, no connection once stopped
        with pytest.raises((InferenceServerException, OSError)) as e:
            client.infer("batched", _inputs(x, x))
        if isinstance(e.value, InferenceServerException) and e.value.status() is not None:
            assert e.value.status() == "503"
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    stop(proc, client, log)


def test_single_onnx_file_is_one_model(tmp_path):
    path = tmp_path / "mymodel.onnx"
    onnx.save(onnx.parser.parse_model(ADDMUL), str(path))
    repository = Repository(path)
    try:
        model = repository.model("mymodel")
        assert model.version == "1" and model.config.max_batch_size == 0
        x = np.ones((2, 4), np.float32)
        result = model.scheduler.submit({"x": x, "y": x}, ["sum"]).result(timeout=30)
        assert list(result) == ["sum"]
        np.testing.assert_array_equal(result["sum"], 2 * x)
    finally:
        repository.close()


def test_full_queue_refuses_at_once(tmp_path):
    write_model(tmp_path, "m", ADDMUL, "max_batch_size: 8\ndynamic_batching { "
                "preferred_batch_size: 4 max_queue_delay_microseconds: 20000000 "
                "default_queue_policy { max_queue_size: 2 } }")
    repository = Repository(tmp_path)
    x = np.ones((1, 4), np.float32)
    try:
        scheduler = repository.model("m").scheduler
        waiting = [scheduler.submit({"x": x, "y": x}) for _ in range(2)]  # waiting for 4
        with pytest.raises(Unavailable, match="queue is full"):
            scheduler.submit({"x": x, "y": x})
        assert scheduler.statistics().fail.count == 1
    finally:
        repository.close()  # runs what is queued, then stops
    for future in waiting:
        np.testing.assert_array_equal(future.result(timeout=30)["sum"], 2 * x)
    with pytest.raises(Unavailable, match="shutting down"):
        scheduler.submit({"x": x, "y": x})




def test_overload_is_503_at_once(server):
    client, _, _ = server
    x = np.ones((1, 4), np.float32)
    waiting = [client.async_infer("small_queue", _inputs(x, x)) for _ in range(2)]
    deadline = time.monotonic() + 30
    while _stats(client, "small_queue")["inference_stats"]["fail"]["count"] == 0:
        try:  # refused at once as soon as the two wait in its queue
            client.infer("small_queue", _inputs(x, x))
        except InferenceServerException as e:
            assert e.status() == "503" and "queue is full" in e.message()
            break
        assert time.monotonic() < deadline, "the queue never filled"
    else:
        pytest.fail("no request was refused")
    for pending in waiting:  # the two queued ones are answered (after the 2 s delay)
        np.testing.assert_array_equal(pending.get_result(timeout=60).as_numpy("sum"), 2 * x)



def test_client_gone_mid_body(server):
    """A client that closes its connection before sending the whole body: nothing to answer,
    nothing logged as an error (the fixture's teardown checks the log), the server serves on."""
    import socket

    client, port, _ = server
    for path in ("/v2/models/addmul/infer", "/v2/repository/models/echo/load"):
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n"
                         "\r\n{\"inputs\": [".encode())
            time.sleep(0.2)  # the server is waiting for the rest of the body
    x = np.ones((1, 4), np.float32)
    np.testing.assert_array_equal(client.infer("addmul", _inputs(x, x)).as_numpy("sum"), 2 * x)

def test_request_size_is_bounded(server):
    from onnxrun.serve.tensors import MAX_REQUEST_BYTES

    _, port, _ = server
    for path in ("/v2/models/addmul/infer", "/v2/repository/models/echo/load"):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        try:  # refused from its Content-Length, before the body is read
            conn.putrequest("POST", path)
            conn.putheader("Content-Length", str(MAX_REQUEST_BYTES + 1))
            conn.endheaders(b"{}")
            response = conn.getresponse()
            reply = response.read()
        finally:
            conn.close()
        assert response.status == 400, reply
        assert f"exceeds {MAX_REQUEST_BYTES}" in json.loads(reply)["error"]
    assert _post(port, "/v2/models/addmul/infer", json.dumps(_json_request()).encode())[0] == 200


def test_instances_run_concurrently():
    """instance_group { count: 2 }: two sessions, each run by its own thread. Each fake
    session waits for the other at a barrier, so both requests finish only if they ran at
    the same time."""
    import threading
    from types import SimpleNamespace

    from onnxrun.serve.config import ModelConfig
    from onnxrun.serve.repository import TensorSpec
    from onnxrun.serve.scheduler import Scheduler

    barrier = threading.Barrier(2, timeout=60)

    class Session:
        def run(self, names, feeds):
            barrier.wait()
            return [feeds["x"] + 1]

    model = SimpleNamespace(name="m", config=ModelConfig(instance_count=2),
                            outputs=[TensorSpec("y", "FP32", [4])],
                            check_inputs=lambda inputs: 1, check_outputs=lambda names: ["y"])
    scheduler = Scheduler(model, [Session(), Session()])
    try:
        x = np.zeros(4, np.float32)
        futures = [scheduler.submit({"x": x + i}) for i in range(2)]
        assert [f.result(timeout=90)["y"][0] for f in futures] == [1, 2]
        assert scheduler.statistics().execution_count == 2
    finally:
        scheduler.close()


def test_cancelled_and_expired_requests_leave_the_instance_serving(tmp_path):
    """A request whose caller cancelled it (a client that went away) is dropped from the
    queue, and several requests timing out together fail alone: the instance's thread goes on
    serving the others."""
    write_model(tmp_path, "m", ADDMUL, "max_batch_size: 8\ndynamic_batching { "
                "preferred_batch_size: 4 max_queue_delay_microseconds: 20000000 }")
    repository = Repository(tmp_path)
    x = np.ones((1, 4), np.float32)
    try:
        scheduler = repository.model("m").scheduler
        gone = scheduler.submit({"x": x, "y": x})
        assert gone.cancel()  # still queued: cancelled, as asyncio's wrap_future does
        kept = [scheduler.submit({"x": x, "y": x}) for _ in range(4)]  # a batch of 4
        for future in kept:
            np.testing.assert_array_equal(future.result(timeout=30)["sum"], 2 * x)
        late = [scheduler.submit({"x": x, "y": x}, timeout_us=1000) for _ in range(3)]
        for future in late:  # 3 < 4: they wait, and time out together
            with pytest.raises(Unavailable, match="timeout expired"):
                future.result(timeout=30)
        kept = [scheduler.submit({"x": x, "y": x}) for _ in range(4)]
        for future in kept:
            np.testing.assert_array_equal(future.result(timeout=30)["prod"], x)
        assert all(t.is_alive() for t in scheduler._threads)
        assert scheduler.statistics().fail.count == 4
    finally:
        repository.close()

def test_request_timeout_in_queue(server):
    client, port, _ = server
    x = np.ones((1, 4), np.float32)
    before = _stats(client, "batched")
    # alone in "batched" it would wait 20 s for a batch of 4: its 1 ms timeout fails it first
    with pytest.raises(InferenceServerException, match="timeout expired") as e:
        client.infer("batched", _inputs(x, x), timeout=1000)
    assert e.value.status() == "503"
    after = _stats(client, "batched")
    fails = [s["inference_stats"]["fail"]["count"] for s in (before, after)]
    assert fails[1] == fails[0] + 1
    assert after["execution_count"] == before["execution_count"]
    request = _json_request() | {"parameters": {"timeout": "soon"}}
    status, reply = _post(port, "/v2/models/fixed/infer", json.dumps(request).encode())
    assert status == 400 and "'timeout' must be" in json.loads(reply)["error"]


def test_load_and_unload(server):
    client, _, root = server
    text = np.array([b"a"], dtype=object)
    i = httpclient.InferInput("text", [1], "BYTES")
    i.set_data_from_numpy(text)
    client.unload_model("echo")
    assert not client.is_model_ready("echo")
    with pytest.raises(InferenceServerException, match="unknown model"):
        client.infer("echo", [i])
    index = {m["name"]: m for m in client.get_model_repository_index()}
    assert index["echo"]["state"] == "UNAVAILABLE" and index["echo"]["reason"] == "unloaded"
    write_model(root, "echo", ECHO, version=2)  # a new version appears: a load serves it
    client.load_model("echo")
    assert client.is_model_ready("echo", "2")
    assert client.infer("echo", [i]).as_numpy("same").tolist() == [b"a"]
    with pytest.raises(InferenceServerException, match="failed to load 'broken': .*protobuf"):
        client.load_model("broken")
    with pytest.raises(InferenceServerException, match="no such model in the repository"):
        client.load_model("nosuch")
    with pytest.raises(InferenceServerException, match="'file:1/model.onnx' is not supported"):
        client.load_model("echo", config='{}', files={"file:1/model.onnx": b"x"})
    assert client.is_model_ready("fixed")  # the others kept serving


def test_load_with_config_override(server):
    """Triton's load parameter 'config': a ModelConfig as JSON, used instead of config.pbtxt
    for this load (protobuf's JSON mapping: camelCase names, int64 as strings)."""
    client, _, _ = server
    assert client.get_model_config("fixed")["max_batch_size"] == 0
    override = {"name": "fixed", "maxBatchSize": 4, "instance_group": [{"count": 2}],
                "dynamic_batching": {"preferred_batch_size": [2],
                                     "max_queue_delay_microseconds": "1000"}}
    client.load_model("fixed", config=json.dumps(override))
    try:
        config = client.get_model_config("fixed")
        assert config["max_batch_size"] == 4 and config["instance_group"][0]["count"] == 2
        assert config["dynamic_batching"] == {"preferred_batch_size": [2],
                                              "max_queue_delay_microseconds": 1000}
        x = np.ones((3, 4), np.float32)  # a batch of 3: the model's own shapes allow any N
        np.testing.assert_array_equal(client.infer("fixed", _inputs(x, x)).as_numpy("sum"),
                                      2 * x)
        with pytest.raises(InferenceServerException, match="exceeds its max_batch_size 4"):
            client.infer("fixed", _inputs(np.ones((5, 4), np.float32),
                                          np.ones((5, 4), np.float32)))
        for bad, reason in [("{", "config: the JSON is malformed"),
                            ('{"name": "other"}', "its name 'other' is not the model's"),
                            ('{"max_batch_size": "many"}', "config: a field has the wrong type"),
                            ('{"input": [{"name": "z"}]}', "config input 'z' is not an input"),
                            ('["max_batch_size"]', "must be an object")]:
            with pytest.raises(InferenceServerException, match=reason) as e:
                client.load_model("fixed", config=bad)
            assert e.value.status() == "400"
            assert client.get_model_config("fixed")["max_batch_size"] == 4  # still serving
    finally:
        client.load_model("fixed")  # without parameters: config.pbtxt (none) again
    assert client.get_model_config("fixed")["max_batch_size"] == 0


def test_a_version_that_fails_leaves_the_others_serving(tmp_path):
    write_model(tmp_path, "multi", ADDMUL, "max_batch_size: 8\n"
                "version_policy: { all: { } }")
    write_model(tmp_path, "multi", ADDMUL, version=3)
    (tmp_path / "multi" / "2").mkdir()
    (tmp_path / "multi" / "2" / "model.onnx").write_bytes(b"not a model")
    write_model(tmp_path, "fixed", ADDMUL)
    proc, client, log = launch(tmp_path)
    try:
        x = np.ones((1, 4), np.float32)
        for version in ("1", "3"):
            assert client.is_model_ready("multi", version)
            result = client.infer("multi", _inputs(x, x), model_version=version)
            np.testing.assert_array_equal(result.as_numpy("sum"), 2 * x)
        assert client.is_model_ready("multi")  # the highest served version: 3
        assert not client.is_model_ready("multi", "2")
        assert not client.is_server_ready()  # strict readiness, as Triton's
        assert client.get_model_metadata("multi")["versions"] == ["1", "3"]
        with pytest.raises(InferenceServerException,
                           match="version 2 failed to load: .*protobuf.*served: 1, 3"):
            client.infer("multi", _inputs(x, x), model_version="2")
        index = [(m["name"], m["version"], m["state"])
                 for m in client.get_model_repository_index()]
        assert index == [("fixed", "1", "READY"), ("multi", "1", "READY"),
                         ("multi", "2", "UNAVAILABLE"), ("multi", "3", "READY")]
        reasons = {m["version"]: m["reason"] for m in client.get_model_repository_index()
                   if m["name"] == "multi"}
        assert reasons["1"] == reasons["3"] == "" and "protobuf" in reasons["2"]
        ready = client.get_model_repository_index()  # tritonclient posts {} : all
        assert len(ready) == 4
        # a reload answers the failure, and what loaded serves
        with pytest.raises(InferenceServerException,
                           match="failed to load 'multi' version 2: .*serving version.s. 1, 3"):
            client.load_model("multi")
        assert client.is_model_ready("multi", "1") and client.is_model_ready("multi", "3")
        # the broken version fixed: a reload serves all three, and the server is ready
        write_model(tmp_path, "multi", ADDMUL, version=2)
        client.load_model("multi")
        assert client.get_model_metadata("multi")["versions"] == ["1", "2", "3"]
        assert client.is_server_ready()
        client.unload_model("fixed")  # unloaded on request: the server stays ready
        assert client.is_server_ready()
    finally:
        stop(proc, client, log)


@pytest.mark.parametrize("make, reason", [
    (lambda p: p / "nosuch", "does not exist"),
    (lambda p: p, "no model found"),  # an empty folder
    (lambda p: (p / "m.txt").write_text("x") and p / "m.txt", "neither a model repository"),
])
def test_cli_errors_are_one_line(tmp_path, make, reason):
    result = subprocess.run([sys.executable, "-m", "onnxrun", "serve", str(make(tmp_path)),
                             "--http-port", str(free_port()), "--grpc-port", "0",
                             "--metrics-port", "0"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert reason in result.stderr and "Traceback" not in result.stderr


def test_config_subset():
    cfg = read_config("""
        name: "m"  # a comment
        max_batch_size: 16
        input [ { name: "x" data_type: TYPE_FP32 dims: [ -1, 3 ] } ]
        dynamic_batching { preferred_batch_size: [ 8, 4 ] max_queue_delay_microseconds: 100
                           default_queue_policy { max_queue_size: 7 } }
        instance_group [ { count: 2 kind: KIND_CPU }, { count: 1 } ]
        version_policy: { latest: { num_versions: 1 } }
    """)
    assert (cfg.max_batch_size, cfg.preferred_batch_size, cfg.max_queue_delay_us,
            cfg.instance_count, cfg.max_queue_size) == (16, [4, 8], 100, 3, 7)
    assert read_config("").max_queue_size == 1024  # bounded even when unsaid
    with pytest.raises(InvalidArgument, match="preferred_batch_size 32"):
        read_config("max_batch_size: 8 dynamic_batching { preferred_batch_size: 32 }")
    with pytest.raises(InvalidArgument, match="needs max_batch_size"):
        read_config("dynamic_batching { }")
    assert read_config("version_policy: { all: { } }").version_policy == ("all",)
    assert read_config("version_policy: { latest { num_versions: 2 } }").version_policy == (
        "latest", 2)
    assert read_config("version_policy: { specific { versions: [3, 1] } }").version_policy == (
        "specific", [1, 3])
    with pytest.raises(InvalidArgument, match="version_policy must be one of"):
        read_config("version_policy: { newest: { } }")
    with pytest.raises(InvalidArgument, match="names no versions"):
        read_config("version_policy: { specific: { } }")
    with pytest.raises(InvalidArgument, match="unknown data_type TYPE_FP99"):
        read_config('input [ { name: "x" data_type: TYPE_FP99 dims: [ 4 ] } ]')
    with pytest.raises(InvalidArgument, match="missing"):
        read_config("dynamic_batching { max_queue_delay_microseconds: 1")


# version v adds v: which version answered is in the numbers
ADD_V = """<ir_version: 8, opset_import: ["" : 17]>
add_v (float[N, 4] x) => (float[N, 4] y) {{
  v = Constant <value: tensor = float {{{0}}}> ()
  y = Add(x, v)
}}"""


@pytest.mark.parametrize("policy, served", [
    ("", ["3"]),
    ("version_policy: { latest: { num_versions: 2 } }", ["2", "3"]),
    ("version_policy: { all: { } }", ["1", "2", "3"]),
    ("version_policy: { specific: { versions: [1, 3] } }", ["1", "3"]),
])
def test_version_policies(tmp_path, policy, served):
    for v in (1, 2, 3):
        write_model(tmp_path, "m", ADD_V.format(v), f"max_batch_size: 4\n{policy}", version=v)
    repository = Repository(tmp_path)
    x = np.zeros((1, 4), np.float32)
    try:
        assert repository.entries["m"].versions == served
        for v in ("1", "2", "3"):
            if v in served:
                model = repository.model("m", v)
                np.testing.assert_array_equal(model.scheduler.submit({"x": x}).result(30)["y"],
                                              x + int(v))
            else:
                with pytest.raises(UnknownModel, match=f"version {v} is not found"):
                    repository.model("m", v)
        assert repository.model("m").version == served[-1]  # no version: the highest
    finally:
        repository.close()


def test_specific_version_missing_is_a_load_error(tmp_path):
    write_model(tmp_path, "m", ADD_V.format(1), "version_policy: { specific: { versions: 2 } }")
    write_model(tmp_path, "other", ADD_V.format(1))
    repository = Repository(tmp_path)
    try:
        assert not repository.entries["m"].ready
        assert "version(s) [2] not found" in repository.entries["m"].reason
        assert repository.model("other").version == "1"
    finally:
        repository.close()


@pytest.mark.parametrize("tensors, reason", [
    ('input [ { name: "z" data_type: TYPE_FP32 dims: [ 4 ] } ]',
     "config.pbtxt input 'z' is not an input of the model (its inputs: x, y)"),
    ('input [ { name: "x" data_type: TYPE_INT32 dims: [ 4 ] },'
     ' { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]',
     "config.pbtxt input 'x' is INT32, the model's is FP32"),
    ('input [ { name: "x" data_type: TYPE_FP32 dims: [ 5 ] },'
     ' { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]',
     "input 'x' has dims [5], the model's are [4] (without the batch dimension)"),
    ('input [ { name: "x" data_type: TYPE_FP32 dims: [ 1, 4 ] },'
     ' { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]', "has dims [1, 4]"),
    ('input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]', "missing: y"),
    ('output [ { name: "sum" data_type: TYPE_FP16 dims: [ 4 ] } ]',
     "config.pbtxt output 'sum' is FP16, the model's is FP32"),
    ('output [ { name: "out" dims: [ 4 ] } ]', "output 'out' is not an output"),
])
def test_config_tensors_must_fit_the_model(tmp_path, tensors, reason):
    write_model(tmp_path, "bad", ADDMUL, f"max_batch_size: 8\n{tensors}")
    write_model(tmp_path, "good", ADDMUL, 'max_batch_size: 8\ninput [ { name: "x" data_type: '
                'TYPE_FP32 dims: [ 4 ] }, { name: "y" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
                'output [ { name: "prod" data_type: TYPE_FP32 dims: [ 4 ] } ]')
    repository = Repository(tmp_path)
    try:
        assert not repository.entries["bad"].ready
        assert reason in repository.entries["bad"].reason
        good = repository.model("good")  # the other model serves
        assert [o.name for o in good.outputs] == ["prod"]  # the outputs the config lists
        x = np.ones((2, 4), np.float32)
        assert list(good.scheduler.submit({"x": x, "y": x}).result(30)) == ["prod"]
    finally:
        repository.close()


def _classes(probs, k, labels=None):
    """Triton's classification strings of each row of ``probs``."""
    out = []
    for row in probs.reshape(probs.shape[0], -1):
        best = np.argsort(-row.astype(np.float64), kind="stable")[:k]
        out.append([f"{row[i]:f}:{i}" + (f":{labels[i]}" if labels else "") for i in best])
    return out


@pytest.mark.parametrize("binary", [True, False])
def test_classification_extension(tmp_path, binary):
    write_model(tmp_path, "scores", SCORES, 'max_batch_size: 4\noutput [ { name: "probs" '
                'data_type: TYPE_FP32 dims: [ 5 ] label_filename: "labels.txt" } ]')
    labels = ["cat", "dog", "fox", "owl", "yak"]
    (tmp_path / "scores" / "labels.txt").write_text("\n".join(labels) + "\n")
    write_model(tmp_path, "plain", SCORES)  # no labels, not batched
    proc, client, log = launch(tmp_path)
    try:
        x = np.array([[0.1, 2, -1, 3, 0.5], [5, 1, 1, 0, 2]], np.float32)
        probs = np.exp(x) / np.exp(x).sum(1, keepdims=True)
        i = httpclient.InferInput("x", [2, 5], "FP32")
        i.set_data_from_numpy(x, binary_data=binary)
        out = [httpclient.InferRequestedOutput("probs", binary_data=binary, class_count=2)]
        got = client.infer("scores", [i], outputs=out).as_numpy("probs")
        assert got.shape == (2, 2)
        as_text = [[v.decode() if isinstance(v, bytes) else v for v in row] for row in got]
        expected = _classes(probs, 2, labels)
        assert [[t.rsplit(":", 2)[1:] for t in row] for row in as_text] == [
            [t.rsplit(":", 2)[1:] for t in row] for row in expected]  # indices and labels
        for row, want in zip(as_text, expected, strict=True):
            for t, w in zip(row, want, strict=True):
                assert abs(float(t.split(":")[0]) - float(w.split(":")[0])) < 1e-5
        out = [httpclient.InferRequestedOutput("probs", binary_data=binary, class_count=12)]
        got = client.infer("plain", [i], outputs=out).as_numpy("probs")
        assert got.shape == (10,)  # not batched: the whole output is one row; k clipped
        best = got[0].decode() if isinstance(got[0], bytes) else got[0]
        assert best.split(":")[1] == "5"
        assert abs(float(best.split(":")[0]) - probs.max()) < 1e-5
        status, reply = _post(client.port, "/v2/models/scores/infer", json.dumps(
            {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 5], "data": [1] * 5}],
             "outputs": [{"name": "probs", "parameters": {"classification": 0}}]}).encode())
        assert status == 400 and "class count >= 1" in json.loads(reply)["error"]
    finally:
        stop(proc, client, log)
