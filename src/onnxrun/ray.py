"""onnxrun on Ray (``pip install "onnxrun[ray]"``): a Ray Data predictor for offline batch
inference and a Ray Serve deployment for online traffic, both running an onnxrun session.

Ray Data::

    import ray, onnxrun.ray
    ds = ray.data.from_items([{"x": row} for row in rows])
    out = ds.map_batches(onnxrun.ray.Predictor, fn_constructor_kwargs={"model": "model.onnx"},
                         batch_size=256, batch_format="numpy", concurrency=2)

Each actor holds one session, created once; a batch is a dict of numpy arrays (its columns),
the model's inputs read by name. Ray Serve::

    from ray import serve
    app = onnxrun.ray.deployment("model.onnx", num_replicas=2, max_batch_size=16).bind()
    handle = serve.run(app)
    handle.remote({"x": x}).result()  # {output name: array}

Each replica holds one session; Serve's own batching (``@serve.batch``) gathers concurrent
requests, merged along dimension 0 when they have the same inputs, dtypes and non-batch
dimensions (others are run apart), and split back. An HTTP request to the deployment's route
takes and answers JSON ``{"inputs": {name: nested lists}}`` / ``{"outputs": {...}}``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from .api.session import InferenceSession
from .errors import InvalidArgument

_NUMPY_OF_ORT = {"tensor(float)": np.float32, "tensor(double)": np.float64,
                 "tensor(float16)": np.float16, "tensor(int64)": np.int64,
                 "tensor(int32)": np.int32, "tensor(int16)": np.int16, "tensor(int8)": np.int8,
                 "tensor(uint8)": np.uint8, "tensor(uint16)": np.uint16,
                 "tensor(uint32)": np.uint32, "tensor(uint64)": np.uint64,
                 "tensor(bool)": np.bool_, "tensor(string)": object}


class _Runner:
    """One session and how a dict of columns becomes its feeds."""

    def __init__(self, model: str | os.PathLike | bytes, columns: Mapping[str, str] | None,
                 outputs: list[str] | None, session_options: Any, providers: Any):
        self.session = InferenceSession(model if isinstance(model, bytes) else str(model),
                                        sess_options=session_options, providers=providers)
        self.inputs = {i.name: i for i in self.session.get_inputs()}
        self.columns = dict(columns) if columns else {n: n for n in self.inputs}  # col -> input
        unknown = [i for i in self.columns.values() if i not in self.inputs]
        if unknown:
            raise InvalidArgument(f"columns map to {unknown}, which are not inputs of the model "
                                  f"(its inputs: {', '.join(self.inputs)})")
        self.outputs = outputs

    def feeds(self, batch: Mapping[str, Any]) -> dict[str, np.ndarray]:
        feeds = {}
        for column, name in self.columns.items():
            if column not in batch:
                raise InvalidArgument(f"the batch has no column '{column}' for input '{name}' "
                                      f"(its columns: {', '.join(batch)})")
            value = batch[column]
            dtype = _NUMPY_OF_ORT.get(self.inputs[name].type)
            if isinstance(value, np.ndarray) and value.dtype == object and dtype is not object:
                value = np.stack(value)  # a column of equal-shape arrays Ray left as objects
            feeds[name] = np.asarray(value, dtype=dtype) if dtype is not None else value
        return feeds

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        names = self.outputs or [o.name for o in self.session.get_outputs()]
        return dict(zip(names, self.session.run(names, feeds), strict=True))


class Predictor:
    """A callable class for ``Dataset.map_batches``: one session per actor, numpy dict batches.

    ``model``: a path or the model's bytes. ``columns``: {column: input name} when the columns
    are not named as the inputs. ``outputs``: the outputs to compute (default: all).
    ``keep``: columns passed through to the result (an id, a label). Outputs must have the
    batch's rows along dimension 0."""

    def __init__(self, model: str | os.PathLike | bytes, *,
                 columns: Mapping[str, str] | None = None, outputs: list[str] | None = None,
                 keep: list[str] | None = None, session_options: Any = None,
                 providers: Any = None):
        self._runner = _Runner(model, columns, outputs, session_options, providers)
        self._keep = list(keep or [])

    def __call__(self, batch: Mapping[str, Any]) -> dict[str, np.ndarray]:
        out = self._runner.run(self._runner.feeds(batch))
        rows = len(next(iter(batch.values()))) if batch else 0
        for name, value in out.items():
            if np.ndim(value) == 0 or len(value) != rows:
                raise InvalidArgument(f"output '{name}' has shape {list(np.shape(value))}, not "
                                      f"one row per row of the batch ({rows})")
        for column in self._keep:
            out[column] = batch[column]
        return out


def _signature(feeds: dict[str, np.ndarray]) -> tuple:
    return tuple((n, a.dtype.str, a.shape[1:]) for n, a in sorted(feeds.items()))


def run_merged(runner: _Runner, requests: list[dict[str, np.ndarray]]) -> list[Any]:
    """Run requests (feeds) as few session calls as their shapes allow: those of equal
    signature merged along dimension 0 and split back. A request that fails gets its own
    error (an exception object) in its place; the others their outputs."""
    results: list[Any] = [None] * len(requests)
    groups: dict[tuple, list[int]] = {}
    for i, feeds in enumerate(requests):
        if isinstance(feeds, Exception):
            results[i] = feeds
        else:
            groups.setdefault(_signature(feeds), []).append(i)
    for members in groups.values():
        batch = [requests[i] for i in members]
        try:
            if len(batch) == 1:
                results[members[0]] = runner.run(batch[0])
                continue
            sizes = [len(next(iter(f.values()))) for f in batch]
            merged = runner.run({n: np.concatenate([f[n] for f in batch]) for n in batch[0]})
            bounds = np.cumsum([0] + sizes)
            for k, i in enumerate(members):
                results[i] = {n: v[bounds[k]:bounds[k + 1]] for n, v in merged.items()}
        except Exception as e:  # noqa: BLE001 - each request of the group gets the error
            for i in members:
                results[i] = e
    return results


def deployment(model: str | os.PathLike | bytes, *, name: str | None = None,
               num_replicas: int = 1, max_batch_size: int = 8,
               batch_wait_timeout_s: float = 0.005, columns: Mapping[str, str] | None = None,
               outputs: list[str] | None = None, session_options: Any = None,
               providers: Any = None, ray_actor_options: dict | None = None) -> Any:
    """A Ray Serve deployment of ``model``: ``num_replicas`` replicas, each with one session,
    and Serve's batching up to ``max_batch_size`` requests within ``batch_wait_timeout_s``
    (``max_batch_size=1``: no batching). ``.bind()`` it and ``serve.run`` the application;
    a handle call takes a dict of numpy arrays (batch dimension first when batching) and
    returns {output name: array}."""
    from ray import serve

    if isinstance(model, os.PathLike | str) and not os.path.isfile(model):
        raise InvalidArgument(f"model '{model}' is not a file")
    name = name or (os.path.splitext(os.path.basename(str(model)))[0]
                    if not isinstance(model, bytes) else "onnxrun")

    @serve.deployment(name=name, num_replicas=num_replicas,
                      ray_actor_options=ray_actor_options or {"num_cpus": 1})
    class OnnxrunDeployment:
        def __init__(self) -> None:
            self.runner = _Runner(model, columns, outputs, session_options, providers)

        @serve.batch(max_batch_size=max_batch_size, batch_wait_timeout_s=batch_wait_timeout_s)
        async def _infer(self, requests: list[Any]) -> list[Any]:
            feeds = []
            for r in requests:
                try:
                    feeds.append(self.runner.feeds(r))
                except Exception as e:  # noqa: BLE001 - answered to that request alone
                    feeds.append(e)
            return run_merged(self.runner, feeds)

        async def infer(self, inputs: dict[str, Any]) -> dict[str, np.ndarray]:
            result = await self._infer(inputs)
            if isinstance(result, Exception):
                raise result
            return result

        async def __call__(self, request: Any) -> Any:
            if not hasattr(request, "json"):  # a handle call: a dict of arrays
                return await self.infer(request)
            from starlette.responses import JSONResponse

            try:
                body = await request.json()
                inputs = body["inputs"]
                if not isinstance(inputs, dict):
                    raise TypeError("'inputs' must be an object")
                result = await self.infer(inputs)
            except Exception as e:  # noqa: BLE001 - a bad request is a 400 naming why
                return JSONResponse({"error": f"{type(e).__name__}: {e}"}, status_code=400)
            return JSONResponse({"outputs": {n: np.asarray(v).tolist()
                                             for n, v in result.items()}})

    return OnnxrunDeployment
