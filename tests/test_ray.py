"""onnxrun on Ray: the Ray Data predictor (one session per actor, numpy dict batches) and the
Ray Serve deployment (replicas, Serve's batching, handle and HTTP calls), on a local cluster
of 2 CPUs started here; nothing outside the machine."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request

import numpy as np
import onnx
import onnx.parser
import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("ray.data")
serve = pytest.importorskip("ray.serve")

from serve_harness import ADDMUL, free_port  # noqa: E402

import onnxrun  # noqa: E402
import onnxrun.ray  # noqa: E402

# y = x; n: the size of the batch the session ran, on each row (shows Serve's merging)
COUNT = """<ir_version: 8, opset_import: ["" : 17]>
count (float[N, M] x) => (float[N, M] y, float[N, M] n) {
  y = Identity(x)
  s = Shape(x)
  b = Shape <start: int = 0, end: int = 1> (x)
  f = Cast <to: int = 1> (b)
  n = Expand(f, s)
}"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    paths = {}
    for name, text in (("addmul", ADDMUL), ("count", COUNT)):
        paths[name] = str(root / f"{name}.onnx")
        onnx.save(onnx.parser.parse_model(text), paths[name])
    for attempt in (1, 2, 3):
        try:
            ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
            break
        except Exception as e:  # Ray gives its raylet 30 s to register: once more if it is
            ray.shutdown()      # a loaded machine's slow start, not an error of ours
            if attempt == 3 or "timed out during startup" not in str(e):
                raise
    try:
        yield paths
    finally:
        serve.shutdown()
        ray.shutdown()


def test_ray_data_predictor(cluster):
    # defined here, so that Ray ships the class by value (workers cannot import this module)
    class CountingPredictor(onnxrun.ray.Predictor):
        """The predictor, with how many times this process built one."""

        built = 0

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            type(self).built += 1

        def __call__(self, batch):
            out = super().__call__(batch)
            rows = len(batch["id"])
            out["pid"] = np.full(rows, os.getpid())
            out["built"] = np.full(rows, type(self).built)
            return out

    rng = np.random.default_rng(0)
    x = rng.standard_normal((1000, 4), dtype=np.float32)
    y = rng.standard_normal((1000, 4), dtype=np.float32)
    ds = ray.data.from_items([{"id": i, "a": x[i], "y": y[i]} for i in range(1000)])
    out = ds.map_batches(CountingPredictor, fn_constructor_kwargs={
        "model": cluster["addmul"], "columns": {"a": "x", "y": "y"}, "keep": ["id"],
        "outputs": ["sum"]}, batch_size=128, batch_format="numpy", concurrency=2)
    rows = sorted(out.take_all(), key=lambda r: r["id"])
    assert [r["id"] for r in rows] == list(range(1000))
    np.testing.assert_array_equal(np.stack([r["sum"] for r in rows]), x + y)
    assert set(rows[0]) == {"id", "sum", "pid", "built"}  # only the outputs asked for
    assert {r["built"] for r in rows} == {1}  # one session per actor, built once
    assert len({r["pid"] for r in rows}) <= 2


def test_ray_data_predictor_errors(cluster):
    with pytest.raises(onnxrun.errors.InvalidArgument, match="not inputs of the model"):
        onnxrun.ray.Predictor(cluster["addmul"], columns={"a": "z"})
    predictor = onnxrun.ray.Predictor(cluster["addmul"])
    with pytest.raises(onnxrun.errors.InvalidArgument, match="no column 'y'"):
        predictor({"x": np.ones((2, 4), np.float32)})
    # a column of equal-shape arrays left as objects is stacked; ints cast to the input type
    column = np.empty(2, dtype=object)
    column[:] = [np.ones(4), np.ones(4)]
    out = predictor({"x": column, "y": np.ones((2, 4), np.int64)})
    np.testing.assert_array_equal(out["sum"], np.full((2, 4), 2, np.float32))


def test_ray_serve_deployment(cluster):
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    app = onnxrun.ray.deployment(cluster["count"], num_replicas=1, max_batch_size=4,
                                 batch_wait_timeout_s=5.0).bind()
    handle = serve.run(app, name="count", route_prefix="/count")
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal((1, 3), dtype=np.float32) for _ in range(4)]
    responses = [handle.remote({"x": x}) for x in xs]
    for x, r in zip(xs, responses, strict=True):
        result = r.result(timeout_s=120)
        np.testing.assert_array_equal(result["y"], x)
        np.testing.assert_array_equal(result["n"], np.full((1, 3), 4))  # one run of 4
    # different non-batch shapes in one Serve batch are run apart, never merged
    xs = [rng.standard_normal((1, m), dtype=np.float32) for m in (2, 5, 2, 5)]
    responses = [handle.remote({"x": x}) for x in xs]
    for x, r in zip(xs, responses, strict=True):
        result = r.result(timeout_s=120)
        np.testing.assert_array_equal(result["y"], x)
        np.testing.assert_array_equal(result["n"], np.full(x.shape, 2))
    # a bad request fails alone
    bad, good = handle.remote({"z": xs[0]}), handle.remote({"x": xs[0]})
    with pytest.raises(Exception, match="no column 'x'"):
        bad.result(timeout_s=120)
    np.testing.assert_array_equal(good.result(timeout_s=120)["y"], xs[0])
    # HTTP through Serve's proxy on 127.0.0.1
    body = json.dumps({"inputs": {"x": [[1.0, 2.0]]}}).encode()
    with urllib.request.urlopen(urllib.request.Request(
            f"http://127.0.0.1:{port}/count", body, method="POST"), timeout=120) as r:
        assert json.loads(r.read())["outputs"]["y"] == [[1.0, 2.0]]
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(urllib.request.Request(
            f"http://127.0.0.1:{port}/count", b"{", method="POST"), timeout=120)
    assert e.value.code == 400
    serve.delete("count")


def test_ray_serve_replicas(cluster):
    app = onnxrun.ray.deployment(cluster["addmul"], num_replicas=2, max_batch_size=1,
                                 ray_actor_options={"num_cpus": 0.5}).bind()
    handle = serve.run(app, name="addmul", route_prefix=None)
    x = np.ones((3, 4), np.float32)
    results = [handle.remote({"x": x, "y": x}) for _ in range(8)]
    for r in results:
        np.testing.assert_array_equal(r.result(timeout_s=120)["prod"], x)
    status = serve.status().applications["addmul"].deployments["addmul"]
    assert status.replica_states.get("RUNNING") == 2
    serve.delete("addmul")
