"""The KServe v2 REST endpoint (what Triton's HTTP endpoint speaks), on Starlette + uvicorn;
inference requests are answered by the ASGI app directly (``_App``), the rest through
Starlette's routes.

It only translates: a request's JSON and binary tensors become numpy arrays handed to the
model's scheduler, and its outputs become JSON or binary tensors again (Triton's binary-tensor
extension: a JSON header of ``Inference-Header-Content-Length`` bytes, then each binary tensor's
``binary_data_size`` bytes in order). A request the protocol or the model cannot take is a 400
whose ``error`` names what is wrong; the server and the other requests are unaffected."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

import numpy as np
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..errors import InvalidArgument, OnnxRunError
from . import access, describe
from .repository import Model, Repository, load_config_parameter
from .scheduler import Unavailable
from .tensors import (
    DATATYPES,
    MAX_REQUEST_BYTES,
    OFF_LOOP_BYTES,
    datatype_of_array,
    element_count,
    from_bytes,
    to_bytes,
)

log = logging.getLogger("onnxrun.serve")



class BadRequest(InvalidArgument):
    """A request that breaks the protocol (the endpoint answers 400 with this message)."""


# -- request decoding ---------------------------------------------------------------------

_JSON_TYPES = {"b": (bool,), "i": (int,), "u": (int,), "f": (int, float)}


def _flatten(data: Any, out: list) -> None:
    if isinstance(data, list):
        for item in data:
            _flatten(item, out)
    else:
        out.append(data)


def _json_tensor(name: str, datatype: str, shape: list[int], data: Any) -> np.ndarray:
    flat: list = []
    _flatten(data, flat)
    if len(flat) != element_count(shape):
        raise BadRequest(f"input '{name}': {len(flat)} values for shape {shape} "
                         f"({element_count(shape)} elements)")
    dtype = DATATYPES[datatype]
    if datatype == "BYTES":
        if not all(isinstance(x, str) for x in flat):
            raise BadRequest(f"input '{name}': BYTES data must be strings")
        try:  # JSON may escape lone surrogates, which are no UTF-8 text
            for x in flat:
                x.encode("utf-8")
        except UnicodeEncodeError:
            raise BadRequest(f"input '{name}': BYTES data is not valid UTF-8 text") from None
        return np.array(flat, dtype=object).reshape(shape)
    allowed = _JSON_TYPES[dtype.kind]
    for x in flat:
        if not isinstance(x, allowed) or (dtype.kind != "b" and isinstance(x, bool)):
            raise BadRequest(f"input '{name}': {x!r} is not a {datatype} value")
    try:
        return np.array(flat, dtype=dtype.newbyteorder("=")).reshape(shape)
    except OverflowError:
        raise BadRequest(f"input '{name}': a value is out of the range of {datatype}") from None


def _decode(header: Any, binary: bytes) -> tuple[dict[str, np.ndarray], dict[str, bool] | None,
                                                  bool, dict[str, Any]]:
    """The inputs, the requested outputs ({name: binary?} or None: all), the default
    binary flag and the outputs asked as classifications ({name: class count}) of an inference
    request."""
    if not isinstance(header, dict) or not isinstance(header.get("inputs"), list):
        raise BadRequest("the request must be a JSON object with an 'inputs' list")
    inputs: dict[str, np.ndarray] = {}
    offset = 0
    for item in header["inputs"]:
        if not isinstance(item, dict):
            raise BadRequest("each input must be a JSON object")
        name, datatype, shape = item.get("name"), item.get("datatype"), item.get("shape")
        if not isinstance(name, str):
            raise BadRequest("an input has no 'name'")
        if name in inputs:
            raise BadRequest(f"input '{name}' is given twice")
        if datatype not in DATATYPES:
            raise BadRequest(f"input '{name}': unknown datatype {datatype!r} (one of "
                             f"{', '.join(DATATYPES)})")
        if not isinstance(shape, list) or not all(
                isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
            raise BadRequest(f"input '{name}': 'shape' must be a list of integers >= 0, "
                             f"not {shape!r}")
        params = item.get("parameters") or {}
        size = params.get("binary_data_size") if isinstance(params, dict) else None
        if size is not None:
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise BadRequest(f"input '{name}': binary_data_size must be an integer >= 0")
            if offset + size > len(binary):
                raise BadRequest(f"input '{name}': binary_data_size {size} runs past the "
                                 f"{len(binary) - offset} binary bytes left in the request")
            inputs[name] = from_bytes(binary[offset:offset + size], datatype, shape, name)
            offset += size
        elif "data" in item:
            inputs[name] = _json_tensor(name, datatype, shape, item["data"])
        else:
            raise BadRequest(f"input '{name}' has neither 'data' nor a binary_data_size")
    if offset != len(binary):
        raise BadRequest(f"the inputs' binary_data_size add up to {offset} bytes, but "
                         f"{len(binary)} binary bytes follow the JSON header")
    params = header.get("parameters") or {}
    binary_default = bool(params.get("binary_data_output", False)) if isinstance(
        params, dict) else False
    outputs = header.get("outputs")
    if outputs is None:
        return inputs, None, binary_default, {}
    if not isinstance(outputs, list):
        raise BadRequest("'outputs' must be a list")
    requested: dict[str, bool] = {}
    classes: dict[str, Any] = {}  # the classification extension: output -> class count
    for item in outputs:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise BadRequest("each requested output must be a JSON object with a 'name'")
        oparams = item.get("parameters") or {}
        if not isinstance(oparams, dict):
            raise BadRequest(f"output '{item['name']}': 'parameters' must be an object")
        if "classification" in oparams:
            classes[item["name"]] = oparams["classification"]
        requested[item["name"]] = bool(oparams.get("binary_data", binary_default))
    return inputs, requested, binary_default, classes


def _encode(model: Model, header: dict, results: dict[str, np.ndarray],
            binary: dict[str, bool]) -> tuple[bytes, int | None]:
    """The reply body of an inference and the length of its JSON header when binary tensors
    follow it (None: the body is all JSON)."""
    outputs, chunks = [], []
    for name, array in results.items():
        array = np.asarray(array)
        out: dict[str, Any] = {"name": name, "datatype": datatype_of_array(array),
                               "shape": list(array.shape)}
        if binary[name]:
            raw = to_bytes(array)
            out["parameters"] = {"binary_data_size": len(raw)}
            chunks.append(raw)
        elif out["datatype"] == "BYTES":
            try:  # str holding escaped non-UTF-8 bytes (element_text) cannot be JSON text
                out["data"] = [x.decode() if isinstance(x, bytes) else str(x)
                               for x in array.reshape(-1)]
                for x in out["data"]:
                    x.encode("utf-8")
            except (UnicodeDecodeError, UnicodeEncodeError):
                raise BadRequest(f"output '{name}' holds bytes that are not UTF-8: request it "
                                 "with binary_data") from None
        else:
            out["data"] = array.reshape(-1).tolist()
        outputs.append(out)
    reply: dict[str, Any] = {"model_name": model.name, "model_version": model.version}
    if "id" in header:
        reply["id"] = header["id"]
    reply["outputs"] = outputs
    body = json.dumps(reply, separators=(",", ":")).encode()
    if not chunks:
        return body, None
    return b"".join([body, *chunks]), len(body)


class _Disconnected(OnnxRunError):
    """The client went away before its request body was read whole (an OnnxRunError: answered
    by the handlers, never logged as a bug)."""


async def read_body(content_length: str | bytes | None, receive: Any) -> bytes:
    """A request's body from ASGI ``receive``, refused (BadRequest) beyond MAX_REQUEST_BYTES,
    before it is read when Content-Length says so. A body of one chunk is not copied."""
    if content_length is not None and content_length.isdigit() and \
            int(content_length) > MAX_REQUEST_BYTES:
        raise BadRequest(f"the request body of {int(content_length)} bytes exceeds "
                         f"{MAX_REQUEST_BYTES}")
    parts, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _Disconnected
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_REQUEST_BYTES:
            raise BadRequest(f"the request body exceeds {MAX_REQUEST_BYTES} bytes")
        parts.append(chunk)
        if not message.get("more_body", False):
            return parts[0] if len(parts) == 1 else b"".join(parts)


async def infer(model: Model, body: bytes, header_length: str | bytes | None
                ) -> tuple[bytes, int | None]:
    """One inference request of the REST protocol: its body (and its
    Inference-Header-Content-Length) in, the reply's body and JSON header length out (see
    ``_encode``). Large tensors are converted off the event loop; the session runs on the
    model's instance thread."""
    view = memoryview(body)  # the binary tensors are numpy views of the body: no copies
    if header_length is None:
        head, binary = body, view[len(body):]
    else:
        if not header_length.isdigit() or int(header_length) > len(body):
            length = header_length.decode("latin-1") if isinstance(header_length, bytes) \
                else header_length
            raise BadRequest(f"Inference-Header-Content-Length {length!r} is not a length "
                             f"within the {len(body)}-byte body")
        head, binary = body[:int(header_length)], view[int(header_length):]
    try:
        header = json.loads(head)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BadRequest(f"the request's JSON is malformed: {e}") from None
    except RecursionError:
        raise BadRequest("the request's JSON is nested too deeply") from None
    try:
        if len(body) > OFF_LOOP_BYTES:
            inputs, requested, binary_default, classes = await asyncio.to_thread(
                _decode, header, binary)
        else:
            inputs, requested, binary_default, classes = _decode(header, binary)
    except RecursionError:
        raise BadRequest("an input's data is nested too deeply") from None
    params = header.get("parameters") or {}
    timeout = params.get("timeout") if isinstance(params, dict) else None
    if timeout is not None and (not isinstance(timeout, int) or isinstance(timeout, bool)
                                or timeout < 0):
        raise BadRequest(f"parameter 'timeout' must be microseconds >= 0, not {timeout!r}")
    future = model.scheduler.submit(inputs, list(requested) if requested is not None
                                    else None, timeout_us=timeout)
    results = await asyncio.wrap_future(future)
    for name, count in classes.items():
        results[name] = model.classify(name, results[name], count)
    binary_flags = requested or dict.fromkeys(results, binary_default)
    if sum(np.asarray(v).nbytes for v in results.values()) > OFF_LOOP_BYTES:
        return await asyncio.to_thread(_encode, model, header, results, binary_flags)
    return _encode(model, header, results, binary_flags)


def error_status(exc: Exception, method: str, path: str) -> int:
    """The HTTP status of an error of the core; a failure of the model or a bug is logged."""
    if isinstance(exc, _Disconnected):
        return 499  # nginx's "client closed request": nobody reads the answer
    if isinstance(exc, Unavailable):
        return 503
    if isinstance(exc, InvalidArgument):
        return 400
    if isinstance(exc, OnnxRunError):  # the model failed on a request it accepted
        log.warning("%s %s: %s", method, path, exc)
        return 500
    log.error("%s %s failed", method, path, exc_info=exc)
    return 500


def _error_message(exc: Exception) -> str:
    if isinstance(exc, OnnxRunError):
        return str(exc)
    return f"internal error: {type(exc).__name__}: {exc}"


# -- the application ----------------------------------------------------------------------

def _infer_target(path: str) -> tuple[str, str | None] | None:
    """(model, version or None) of an inference path, ``/v2/models/{name}[/versions/{v}]
    /infer``; None for any other path."""
    parts = path.split("/")
    if parts[-1] != "infer" or parts[1:3] != ["v2", "models"] or not parts[3]:
        return None
    if len(parts) == 5:
        return parts[3], None
    if len(parts) == 7 and parts[4] == "versions" and parts[5]:
        return parts[3], parts[5]
    return None


_JSON = b"application/json"
_BINARY = b"application/octet-stream"


def create_app(repository: Repository) -> Any:
    """The ASGI application serving ``repository``: inference requests on a direct path,
    everything else through Starlette's routes."""

    def model_of(request: Request) -> Model:
        p = request.path_params
        return repository.model(p["name"], p.get("version"))

    async def live(request: Request) -> Response:
        return Response(status_code=200)

    async def ready(request: Request) -> Response:
        return Response(status_code=200 if describe.server_ready(repository) else 400)

    async def server_metadata(request: Request) -> Response:
        return JSONResponse(describe.server_metadata())

    async def model_ready(request: Request) -> Response:
        try:
            model_of(request)
        except InvalidArgument:
            return Response(status_code=400)
        return Response(status_code=200)

    async def model_metadata(request: Request) -> Response:
        return JSONResponse(describe.model_metadata(repository, model_of(request)))

    async def model_config(request: Request) -> Response:
        return JSONResponse(describe.model_config(model_of(request)))

    async def model_stats(request: Request) -> Response:
        p = request.path_params
        return JSONResponse(describe.statistics(repository, p.get("name"), p.get("version")))

    async def repository_index(request: Request) -> Response:
        body = await read_body(request.headers.get("content-length"), request.receive)
        try:
            ready = bool(json.loads(body).get("ready", False)) if body.strip() else False
        except (UnicodeDecodeError, ValueError, AttributeError, RecursionError):
            raise BadRequest("the index request's JSON is malformed") from None
        return JSONResponse(describe.repository_index(repository, ready))

    async def load(request: Request) -> Response:
        body = await read_body(request.headers.get("content-length"), request.receive)
        params = {}
        if body.strip():
            try:
                params = json.loads(body).get("parameters") or {}
            except (UnicodeDecodeError, ValueError, AttributeError, RecursionError):
                raise BadRequest("the load request's JSON is malformed") from None
            if not isinstance(params, dict):
                raise BadRequest("the load request's 'parameters' must be an object")
        config = load_config_parameter(params)
        # loading builds sessions: off the event loop, which keeps serving the other models
        await run_in_threadpool(repository.load, request.path_params["name"], config)
        return Response(status_code=200)

    async def unload(request: Request) -> Response:
        await run_in_threadpool(repository.unload, request.path_params["name"])
        return Response(status_code=200)

    async def on_error(request: Request, exc: Exception) -> Response:
        status = error_status(exc, request.method, request.url.path)
        return JSONResponse({"error": _error_message(exc)}, status_code=status)

    m = "/v2/models/{name}"
    mv = "/v2/models/{name}/versions/{version}"
    routes = [
        Route("/v2/health/live", live), Route("/v2/health/ready", ready),
        Route("/v2", server_metadata),
        Route("/v2/models/stats", model_stats),
        Route("/v2/repository/index", repository_index, methods=["POST"]),
        Route("/v2/repository/models/{name}/load", load, methods=["POST"]),
        Route("/v2/repository/models/{name}/unload", unload, methods=["POST"]),
    ]
    for base in (m, mv):
        routes += [Route(base, model_metadata), Route(base + "/ready", model_ready),
                   Route(base + "/config", model_config), Route(base + "/stats", model_stats)]
    # OnnxRunError's handler answers and is done; Exception's (a bug) also logs the traceback.
    app = Starlette(routes=routes,
                    exception_handlers={OnnxRunError: on_error, Exception: on_error})
    return _App(repository, app)


class _App:
    """The ASGI application. An inference request, the hot path, is answered here directly:
    no route table, middleware stack or Request/Response objects; its headers are a few
    constant byte strings (about 15% less server CPU per request of a small model). Every
    other request goes to Starlette's routes. Each HTTP request gets an access record (see
    ``access.py``)."""

    def __init__(self, repository: Repository, routes: Any):
        self.repository, self.routes = repository, routes

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":  # lifespan
            return await self.routes(scope, receive, send)
        logged = access.enabled()
        start, status = time.perf_counter_ns() if logged else 0, [500]
        path = scope["path"]
        try:
            target = _infer_target(path)
            if target is not None:
                status[0] = await self._infer(target, scope, receive, send)
            elif logged:
                async def send_status(message: dict) -> None:
                    if message["type"] == "http.response.start":
                        status[0] = message["status"]
                    await send(message)
                await self.routes(scope, receive, send_status)
            else:
                await self.routes(scope, receive, send)
        finally:
            if logged:
                parts = path.split("/")
                model = parts[3] if len(parts) > 3 and parts[1:3] == ["v2", "models"] else ""
                client = scope.get("client")
                access.record("http", scope.get("method", ""), path, status[0], start,
                              model if model != "stats" else "",
                              f"{client[0]}:{client[1]}" if client else "")

    async def _infer(self, target: tuple[str, str | None], scope: dict, receive: Any,
                     send: Any) -> int:
        """Answer an inference request; its HTTP status (499: the client went away)."""
        extra: list[tuple[bytes, bytes]] = []
        try:
            if scope["method"] != "POST":
                extra.append((b"allow", b"POST"))
                raise _NotAllowed(f"{scope['method']} is not allowed on {scope['path']}: "
                                  "inference requests are POST")
            length = header_length = None
            for key, value in scope["headers"]:
                if key == b"content-length":
                    length = value
                elif key == b"inference-header-content-length":
                    header_length = value
            model = self.repository.model(*target)
            body = await read_body(length, receive)
            reply, json_length = await infer(model, body, header_length)
            status = 200
            if json_length is None:
                headers = [(b"content-type", _JSON)]
            else:
                headers = [(b"content-type", _BINARY), (b"inference-header-content-length",
                                                        b"%d" % json_length)]
        except _Disconnected:
            return 499
        except _NotAllowed as e:
            status, headers = 405, [(b"content-type", _JSON), *extra]
            reply = json.dumps({"error": str(e)}).encode()
        except Exception as e:  # noqa: BLE001 - every error is answered; bugs are logged
            status = error_status(e, scope["method"], scope["path"])
            headers = [(b"content-type", _JSON)]
            reply = json.dumps({"error": _error_message(e)}).encode()
        headers.append((b"content-length", b"%d" % len(reply)))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": reply})
        return status


class _NotAllowed(Exception):
    """A method other than POST on an inference path (405)."""
