"""``onnxrun serve`` over gRPC: the real server process on 127.0.0.1 driven by tritonclient.grpc
unchanged (sync, async_infer, raw contents), by Triton's own generated stub for what the client
does not send (typed contents, malformed raw contents), and its status codes."""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import pytest

grpc = pytest.importorskip("grpc")
pytest.importorskip("grpc_tools")
pytest.importorskip("starlette")
grpcclient = pytest.importorskip("tritonclient.grpc")
from serve_harness import ADDMUL, BATCHING, ECHO, SCORES, launch, stop, write_model  # noqa: E402
from tritonclient.grpc import service_pb2, service_pb2_grpc  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

from onnxrun.serve.grpc import protocol  # noqa: E402

F16 = """<ir_version: 8, opset_import: ["" : 17]>
half (float16[N] x, int8[N] k) => (float16[N] y, int8[N] j) {
  y = Neg(x)
  j = Neg(k)
}"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("repository")
    write_model(root, "addmul", ADDMUL, "max_batch_size: 8\ninstance_group [ { count: 2 } ]")
    write_model(root, "batched", ADDMUL, f"max_batch_size: 8\n{BATCHING.format(4)}")
    # two requests wait (up to 2 s) for a third that never fits: a third is refused at once
    write_model(root, "small_queue", ADDMUL, "max_batch_size: 8\ndynamic_batching { "
                "preferred_batch_size: 3 max_queue_delay_microseconds: 2000000 "
                "default_queue_policy { max_queue_size: 2 } }")
    write_model(root, "fixed", ADDMUL)
    write_model(root, "echo", ECHO)
    write_model(root, "half", F16)
    write_model(root, "scores", SCORES, 'max_batch_size: 4\noutput [ { name: "probs" '
                'label_filename: "labels.txt" } ]')
    (root / "scores" / "labels.txt").write_text("cat\ndog\nfox\nowl\nyak\n")
    (root / "broken" / "1").mkdir(parents=True)
    (root / "broken" / "1" / "model.onnx").write_bytes(b"not a model")
    proc, http, log = launch(root)
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{http.grpc_port}")
    channel = grpc.insecure_channel(f"127.0.0.1:{http.grpc_port}")
    yield client, service_pb2_grpc.GRPCInferenceServiceStub(channel), http, root
    channel.close()
    client.close()
    stop(proc, http, log)


def _inputs(x, y):
    out = []
    for name, v in (("x", x), ("y", y)):
        i = grpcclient.InferInput(name, list(v.shape), "FP32")
        i.set_data_from_numpy(v)
        out.append(i)
    return out


def _http_inputs(x, y):
    import tritonclient.http as httpclient

    out = []
    for name, v in (("x", x), ("y", y)):
        i = httpclient.InferInput(name, list(v.shape), "FP32")
        i.set_data_from_numpy(v)
        out.append(i)
    return out


def _code(error: InferenceServerException) -> str:
    return error.status().removeprefix("StatusCode.")


def test_proto_matches_tritons():
    """Every field and RPC of onnxrun's .proto is Triton's (tritonclient's descriptors)."""
    p = protocol()
    theirs = service_pb2.DESCRIPTOR.pool

    def check(mine):
        other = theirs.FindMessageTypeByName(mine.full_name)
        for f in mine.fields:
            o = other.fields_by_name.get(f.name)
            assert o is not None, f"{mine.full_name}.{f.name}"
            assert (o.number, o.type, o.is_repeated) == (f.number, f.type, f.is_repeated), \
                f"{mine.full_name}.{f.name}"
        for nested in mine.nested_types:
            check(nested)

    for cls in vars(p).values():
        if isinstance(cls, type):
            check(cls.DESCRIPTOR)
    service = theirs.FindServiceByName("inference.GRPCInferenceService")
    for m in p.service.methods:
        o = service.methods_by_name[m.name]
        assert (o.input_type.full_name, o.output_type.full_name) == (
            m.input_type.full_name, m.output_type.full_name)


def test_health_metadata_index(server):
    client, _, _, _ = server
    assert client.is_server_live()
    assert not client.is_server_ready()  # strict: "broken" is not
    assert client.is_model_ready("addmul") and client.is_model_ready("addmul", "1")
    assert not client.is_model_ready("addmul", "2")
    assert not client.is_model_ready("broken") and not client.is_model_ready("nosuch")
    meta = client.get_model_metadata("addmul", as_json=True)
    assert meta["versions"] == ["1"] and meta["platform"] == "onnxruntime_onnx"
    assert meta["inputs"][0] == {"name": "x", "datatype": "FP32", "shape": ["-1", "4"]}
    assert client.get_server_metadata(as_json=True)["name"] == "onnxrun"
    config = client.get_model_config("batched", as_json=True)["config"]
    assert config["max_batch_size"] == 8
    assert config["dynamic_batching"]["preferred_batch_size"] == [4]
    assert config["input"][0]["data_type"] == "TYPE_FP32"
    index = {m["name"]: m for m in client.get_model_repository_index(as_json=True)["models"]}
    assert index["addmul"]["state"] == "READY"
    assert index["broken"]["state"] == "UNAVAILABLE" and "protobuf" in index["broken"]["reason"]


def test_infer_sync(server):
    client, _, _, _ = server
    rng = np.random.default_rng(0)
    x, y = (rng.standard_normal((3, 4), dtype=np.float32) for _ in range(2))
    result = client.infer("addmul", _inputs(x, y), request_id="r9")
    assert result.get_response().id == "r9"
    np.testing.assert_array_equal(result.as_numpy("sum"), x + y)
    np.testing.assert_array_equal(result.as_numpy("prod"), x * y)
    only = client.infer("fixed", _inputs(x, y), outputs=[grpcclient.InferRequestedOutput("prod")])
    assert [o.name for o in only.get_response().outputs] == ["prod"]
    np.testing.assert_array_equal(only.as_numpy("prod"), x * y)
    big = rng.standard_normal((20000, 4), dtype=np.float32)  # 320 KB: decoded off the loop
    np.testing.assert_array_equal(client.infer("fixed", _inputs(big, big)).as_numpy("sum"),
                                  big + big)


def test_bytes_and_fp16(server):
    client, _, _, _ = server
    text = np.array([b"hello", "w\u00f6rld".encode(), b"", b"\xff"], dtype=object)
    i = grpcclient.InferInput("text", [4], "BYTES")
    i.set_data_from_numpy(text)
    assert client.infer("echo", [i]).as_numpy("same").tolist() == text.tolist()
    x = np.array([1.5, -2, 65504], np.float16)
    k = np.array([1, -127, 127], np.int8)
    a, b = grpcclient.InferInput("x", [3], "FP16"), grpcclient.InferInput("k", [3], "INT8")
    a.set_data_from_numpy(x)
    b.set_data_from_numpy(k)
    result = client.infer("half", [a, b])
    np.testing.assert_array_equal(result.as_numpy("y"), -x)
    np.testing.assert_array_equal(result.as_numpy("j"), -k)


def _stats(client, name):
    return client.get_inference_statistics(name, as_json=True)["model_stats"][0]


def test_async_infer_is_batched(server):
    client, _, _, _ = server
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal((1, 4), dtype=np.float32) for _ in range(4)]
    before = _stats(client, "batched")
    done, results = threading.Semaphore(0), {}

    def callback(i, result, error):
        results[i] = error or result
        done.release()

    for i, x in enumerate(xs):  # tritonclient calls back with keywords result=, error=
        client.async_infer("batched", _inputs(x, x),
                           lambda result, error, i=i: callback(i, result, error))
    for _ in xs:
        assert done.acquire(timeout=60)
    for i, x in enumerate(xs):
        np.testing.assert_array_equal(results[i].as_numpy("prod"), x * x)
    after = _stats(client, "batched")
    assert int(after["execution_count"]) - int(before.get("execution_count", 0)) == 1
    assert int(after["inference_count"]) - int(before.get("inference_count", 0)) == 4


def _request(**inputs):
    """A ModelInferRequest of 'fixed' with typed contents: inputs name -> (datatype, shape,
    contents field, values)."""
    r = service_pb2.ModelInferRequest(model_name="fixed")
    for name, (datatype, shape, field, values) in inputs.items():
        t = r.inputs.add(name=name, datatype=datatype, shape=shape)
        getattr(t.contents, field).extend(values)
    return r


def test_typed_contents(server):
    _, stub, _, _ = server
    ones = ("FP32", [1, 4], "fp32_contents", [1, 2, 3, 4])
    reply = stub.ModelInfer(_request(x=ones, y=ones))
    sums = {o.name: np.frombuffer(raw, np.float32)
            for o, raw in zip(reply.outputs, reply.raw_output_contents, strict=True)}
    np.testing.assert_array_equal(sums["sum"], [2, 4, 6, 8])
    text = service_pb2.ModelInferRequest(model_name="echo")
    text.inputs.add(name="text", datatype="BYTES", shape=[2]).contents.bytes_contents.extend(
        [b"a", b"bc"])
    raw = stub.ModelInfer(text).raw_output_contents[0]
    assert raw == b"\x01\0\0\0a\x02\0\0\0bc"


@pytest.mark.parametrize("make, code, reason", [
    (lambda: _request(x=("FP32", [1, 4], "fp32_contents", [1] * 3),
                      y=("FP32", [1, 4], "fp32_contents", [1] * 4)), "INVALID_ARGUMENT",
     "3 values for shape [1, 4]"),
    (lambda: _request(x=("FP32", [1, 4], "int_contents", [1] * 4),
                      y=("FP32", [1, 4], "fp32_contents", [1] * 4)), "INVALID_ARGUMENT",
     "must be in fp32_contents, not int_contents"),
    (lambda: _request(x=("FP16", [1, 4], "fp32_contents", [1] * 4)), "INVALID_ARGUMENT",
     "raw_input_contents"),
    (lambda: _request(x=("INT8", [1], "int_contents", [300])), "INVALID_ARGUMENT",
     "out of the range of INT8"),
    (lambda: _request(x=("FP99", [1], "fp32_contents", [1])), "INVALID_ARGUMENT",
     "unknown datatype"),
    (lambda: _request(z=("FP32", [1, 4], "fp32_contents", [1] * 4),
                      y=("FP32", [1, 4], "fp32_contents", [1] * 4)), "INVALID_ARGUMENT",
     "no input 'z'"),
    (lambda: _request(x=("INT32", [1, 4], "int_contents", [1] * 4),
                      y=("FP32", [1, 4], "fp32_contents", [1] * 4)), "INVALID_ARGUMENT",
     "input 'x' is FP32"),
])
def test_bad_typed_requests(server, make, code, reason):
    _, stub, _, _ = server
    with pytest.raises(grpc.RpcError) as e:
        stub.ModelInfer(make())
    assert e.value.code().name == code and reason in e.value.details()


def test_bad_raw_requests(server):
    client, stub, _, _ = server
    x = np.ones((1, 4), np.float32).tobytes()
    good = service_pb2.ModelInferRequest(model_name="fixed")
    for name in ("x", "y"):
        good.inputs.add(name=name, datatype="FP32", shape=[1, 4])
    good.raw_input_contents.extend([x, x])
    assert len(stub.ModelInfer(good).raw_output_contents) == 2
    for change, reason in [
        (lambda r: r.raw_input_contents.__setitem__(1, x[:-1]), "15 bytes of data"),
        (lambda r: r.raw_input_contents.pop(), "1 raw_input_contents for 2 inputs"),
        (lambda r: r.inputs[0].shape.__setitem__(0, 2), "needs 32"),
        (lambda r: r.inputs[0].contents.fp32_contents.append(1), "both contents and raw"),
        (lambda r: r.inputs[1].__setattr__("name", "x"), "given twice"),
    ]:
        bad = service_pb2.ModelInferRequest()
        bad.CopyFrom(good)
        change(bad)
        with pytest.raises(grpc.RpcError) as e:
            stub.ModelInfer(bad)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, reason
        assert reason in e.value.details()
    x9 = np.ones((9, 4), np.float32)
    with pytest.raises(InferenceServerException, match="exceeds its max_batch_size") as e:
        client.infer("addmul", _inputs(x9, x9))
    assert _code(e.value) == "INVALID_ARGUMENT"
    for name in ("nosuch", "broken"):
        with pytest.raises(InferenceServerException, match="unknown model") as e:
            client.infer(name, _inputs(x9, x9))
        assert _code(e.value) == "NOT_FOUND"
    with pytest.raises(InferenceServerException) as e:
        client.get_cuda_shared_memory_status()  # not served: Triton's GPU extension
    assert _code(e.value) == "UNIMPLEMENTED"
    assert len(stub.ModelInfer(good).raw_output_contents) == 2  # still serving


def test_overload_is_resource_exhausted(server):
    client, _, http, _ = server
    x = np.ones((1, 4), np.float32)
    waiting = [client.async_infer("small_queue", _inputs(x, x), lambda result, error: None)
               for _ in range(2)]
    deadline = time.monotonic() + 30
    while http.get_inference_statistics("small_queue")["model_stats"][0][
            "inference_stats"]["fail"]["count"] == 0:
        try:  # refused at once as soon as the two wait in its queue
            client.infer("small_queue", _inputs(x, x))
        except InferenceServerException as e:
            assert _code(e) == "RESOURCE_EXHAUSTED" and "queue is full" in e.message()
            break
        assert time.monotonic() < deadline, "the queue never filled"
    else:
        pytest.fail("no request was refused")
    del waiting


def test_timeouts(server):
    client, _, _, _ = server
    x = np.ones((1, 4), np.float32)
    before = _stats(client, "batched")
    # alone in "batched" it would wait 20 s for a batch of 4
    with pytest.raises(InferenceServerException, match="timeout expired") as e:
        client.infer("batched", _inputs(x, x), timeout=1000)
    assert _code(e.value) == "DEADLINE_EXCEEDED"
    with pytest.raises(InferenceServerException) as e:  # the client's own deadline
        client.infer("batched", _inputs(x, x), client_timeout=0.5)
    assert _code(e.value) == "DEADLINE_EXCEEDED"
    deadline = time.monotonic() + 30
    while True:  # the server gave up on it too: two failures, no execution
        after = _stats(client, "batched")
        fails = int(after["inference_stats"]["fail"].get("count", 0))
        if fails - int(before["inference_stats"]["fail"].get("count", 0)) == 2:
            break
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert after.get("execution_count") == before.get("execution_count")


def test_load_and_unload(server):
    client, _, _, root = server
    i = grpcclient.InferInput("text", [1], "BYTES")
    i.set_data_from_numpy(np.array([b"a"], dtype=object))
    client.unload_model("echo")
    assert not client.is_model_ready("echo")
    with pytest.raises(InferenceServerException, match="unknown model"):
        client.infer("echo", [i])
    write_model(root, "echo", ECHO, version=2)
    client.load_model("echo")
    assert client.is_model_ready("echo", "2")
    assert client.infer("echo", [i]).as_numpy("same").tolist() == [b"a"]
    with pytest.raises(InferenceServerException, match="failed to load 'broken'") as e:
        client.load_model("broken")
    assert _code(e.value) == "INVALID_ARGUMENT"
    client.load_model("echo", config='{"max_batch_size": 4}')  # Triton's config override
    assert client.get_model_config("echo").config.max_batch_size == 4
    text = grpcclient.InferInput("text", [2], "BYTES")  # [N]: now a batch of 2
    text.set_data_from_numpy(np.array([b"a", b"b"], dtype=object))
    assert client.infer("echo", [text]).as_numpy("same").tolist() == [b"a", b"b"]
    with pytest.raises(InferenceServerException, match="config: a field has the wrong") as e:
        client.load_model("echo", config='{"max_batch_size": {"n": 1}}')
    assert _code(e.value) == "INVALID_ARGUMENT"
    with pytest.raises(InferenceServerException, match="'file:1/model.onnx' is not supported"):
        client.load_model("echo", config="{}", files={"file:1/model.onnx": b"x"})
    client.load_model("echo")
    assert client.get_model_config("echo").config.max_batch_size == 0


def test_sigterm_finishes_in_flight_and_refuses_new(tmp_path):
    write_model(tmp_path, "batched", ADDMUL, "max_batch_size: 8\ndynamic_batching { "
                "preferred_batch_size: 4 max_queue_delay_microseconds: 600000000 }")
    proc, http, log = launch(tmp_path)
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{http.grpc_port}")
    x = np.full((1, 4), 3, np.float32)
    done, outcome = threading.Event(), []
    client.async_infer("batched", _inputs(x, x),
                       lambda result, error: (outcome.append(error or result), done.set()))
    deadline = time.monotonic() + 30
    while not _pending(http):
        assert time.monotonic() < deadline, "the request never reached the queue"
        time.sleep(0.02)
    proc.terminate()
    try:
        assert done.wait(60), "the request in flight never finished"
        np.testing.assert_array_equal(outcome[0].as_numpy("prod"), x * x)
        with pytest.raises(InferenceServerException) as e:  # refused: stopping or stopped
            client.infer("batched", _inputs(x, x))
        assert _code(e.value) == "UNAVAILABLE"
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        client.close()
    stop(proc, http, log)


def _pending(http) -> bool:
    import urllib.request
    with urllib.request.urlopen(f"http://127.0.0.1:{http.metrics_port}/metrics",
                                timeout=30) as r:
        text = r.read().decode()
    return 'nv_inference_pending_request_count{model="batched",version="1"} 1' in text


def test_structured_access_log(tmp_path):
    write_model(tmp_path, "fixed", ADDMUL)
    proc, client, log = launch(tmp_path, "--log-level", "info", "--log-format", "json")
    try:
        x = np.ones((1, 4), np.float32)
        client.infer("fixed", _http_inputs(x, x))
        with pytest.raises(InferenceServerException):
            client.infer("nosuch", _http_inputs(x, x))
        with grpcclient.InferenceServerClient(f"127.0.0.1:{client.grpc_port}") as g:
            g.infer("fixed", _inputs(x, x))
            with pytest.raises(InferenceServerException):
                g.infer("fixed", _inputs(x, x[:, :2]))
    finally:
        stop(proc, client, log)
    records = [json.loads(line) for line in (tmp_path / "server.log").read_text().splitlines()
               if line.startswith("{")]
    access = [r for r in records if r["logger"] == "onnxrun.serve.access"]
    infer = [r for r in access if r["path"].endswith("/infer")]
    assert [(r["protocol"], r["method"], r["model"], r["status"]) for r in infer] == [
        ("http", "POST", "fixed", 200), ("http", "POST", "nosuch", 400)]
    assert all(r["duration_ms"] >= 0 and r["client"].startswith("127.0.0.1:") for r in infer)
    calls = [(r["path"], r["model"], r["status"]) for r in access if r["protocol"] == "grpc"]
    infer = "/inference.GRPCInferenceService/ModelInfer"
    assert calls[-2:] == [(infer, "fixed", "OK"), (infer, "fixed", "INVALID_ARGUMENT")]


def test_classification(server):
    client, _, _, _ = server
    x = np.array([[0.1, 2, -1, 3, 0.5]], np.float32)
    i = grpcclient.InferInput("x", [1, 5], "FP32")
    i.set_data_from_numpy(x)
    out = [grpcclient.InferRequestedOutput("probs", class_count=3)]
    got = client.infer("scores", [i], outputs=out).as_numpy("probs")
    assert got.shape == (1, 3)
    assert [v.decode().split(":")[1:] for v in got[0]] == [["3", "owl"], ["1", "dog"],
                                                            ["4", "yak"]]
