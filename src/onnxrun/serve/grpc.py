"""The KServe v2 gRPC endpoint (Triton's ``inference.GRPCInferenceService``) on grpcio's asyncio
server, beside the REST endpoint on the same event loop and the same repository.

The protocol's messages come from ``proto/kserve.proto``, compiled by grpcio-tools' protoc at
first use (about 0.3 s, once a process) into a descriptor pool of this module's own: nothing is
generated at build time or written to disk, a fresh clone's install needs no build step, and a
process that also imports tritonclient's generated modules (same names, other content) has no
clash in protobuf's default pool. The service is registered as a generic handler, which is
what generated ``_pb2_grpc`` code does.

It only translates: tensors (raw contents, or typed contents) become numpy arrays for the
model's scheduler and its outputs raw contents again; errors become gRPC status codes
(INVALID_ARGUMENT for a request the protocol or the model cannot take, NOT_FOUND for an unknown
model, RESOURCE_EXHAUSTED for a full queue, UNAVAILABLE while shutting down)."""

from __future__ import annotations

import asyncio
import functools
import logging
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import numpy as np
from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory

from ..errors import Fail, InvalidArgument, OnnxRunError
from . import access, describe
from .repository import Model, Repository, UnknownModel, load_config_parameter
from .scheduler import QueueFull, RequestTimeout, Unavailable
from .tensors import (
    DATATYPES,
    MAX_REQUEST_BYTES,
    OFF_LOOP_BYTES,
    datatype_of_array,
    element_count,
    element_text,
    from_bytes,
    to_bytes,
)

log = logging.getLogger("onnxrun.serve")

PROTO = Path(__file__).parent / "proto" / "kserve.proto"
SERVICE = "inference.GRPCInferenceService"
# RPCs in progress at most: more are answered RESOURCE_EXHAUSTED at once by grpcio
MAX_CONCURRENT_RPCS = 4096
# typed contents (InferTensorContents) of each data type; FP16 has none: raw contents only
_CONTENTS = {"BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents",
             "INT32": "int_contents", "INT64": "int64_contents", "UINT8": "uint_contents",
             "UINT16": "uint_contents", "UINT32": "uint_contents", "UINT64": "uint64_contents",
             "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents"}


@functools.cache
def protocol() -> SimpleNamespace:
    """The message classes of ``kserve.proto`` by name, and its service descriptor
    (``.service``), compiled at the first call."""
    from grpc_tools import protoc

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "kserve.pb"
        if protoc.main(["protoc", f"-I{PROTO.parent}", f"--descriptor_set_out={out}",
                        PROTO.name]) != 0:
            raise Fail(f"protoc could not compile {PROTO}")
        files = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    pool = descriptor_pool.DescriptorPool()
    for f in files.file:
        pool.Add(f)
    file = pool.FindFileByName(PROTO.name)
    classes = {name: message_factory.GetMessageClass(d)
               for name, d in file.message_types_by_name.items()}
    return SimpleNamespace(**classes, service=file.services_by_name["GRPCInferenceService"])


def status_of(error: Exception) -> grpc.StatusCode:
    """The gRPC status code of an error of the core."""
    for kind, code in ((QueueFull, grpc.StatusCode.RESOURCE_EXHAUSTED),
                       (RequestTimeout, grpc.StatusCode.DEADLINE_EXCEEDED),
                       (Unavailable, grpc.StatusCode.UNAVAILABLE),
                       (UnknownModel, grpc.StatusCode.NOT_FOUND),
                       (InvalidArgument, grpc.StatusCode.INVALID_ARGUMENT)):
        if isinstance(error, kind):
            return code
    return grpc.StatusCode.INTERNAL


# -- tensors --------------------------------------------------------------------------------

def _parameter(params: Any, name: str) -> Any:
    """The value of an InferParameter map entry, None when absent."""
    if name not in params:
        return None
    p = params[name]
    choice = p.WhichOneof("parameter_choice")
    return getattr(p, choice) if choice else None


def _contents(tensor: Any, name: str, datatype: str, shape: list[int]) -> np.ndarray:
    if datatype not in _CONTENTS:
        raise InvalidArgument(f"input '{name}': {datatype} data must come in raw_input_contents")
    values = getattr(tensor.contents, _CONTENTS[datatype])
    for other in set(_CONTENTS.values()) - {_CONTENTS[datatype]}:
        if len(getattr(tensor.contents, other)):
            raise InvalidArgument(f"input '{name}': {datatype} data must be in "
                                  f"{_CONTENTS[datatype]}, not {other}")
    if len(values) != element_count(shape):
        raise InvalidArgument(f"input '{name}': {len(values)} values for shape {shape} "
                              f"({element_count(shape)} elements)")
    if datatype == "BYTES":
        return np.array([element_text(v) for v in values], dtype=object).reshape(shape)
    dtype = DATATYPES[datatype].newbyteorder("=")
    array = np.array(values, dtype=np.int64 if dtype.kind in "iu" and dtype.itemsize < 8
                     else dtype)
    if array.dtype != dtype:  # int_contents / uint_contents for a narrower type
        info = np.iinfo(dtype)
        if array.size and (array.min() < info.min or array.max() > info.max):
            raise InvalidArgument(f"input '{name}': a value is out of the range of {datatype}")
        array = array.astype(dtype)
    return array.reshape(shape)


def decode_inputs(request: Any) -> dict[str, np.ndarray]:
    """The inputs of a ModelInferRequest as numpy arrays; InvalidArgument naming what is
    wrong."""
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise InvalidArgument(f"{len(raw)} raw_input_contents for {len(request.inputs)} inputs: "
                              "raw contents need one entry per input, in order")
    inputs: dict[str, np.ndarray] = {}
    for i, tensor in enumerate(request.inputs):
        name, datatype, shape = tensor.name, tensor.datatype, list(tensor.shape)
        if name in inputs:
            raise InvalidArgument(f"input '{name}' is given twice")
        if datatype not in DATATYPES:
            raise InvalidArgument(f"input '{name}': unknown datatype {datatype!r} (one of "
                                  f"{', '.join(DATATYPES)})")
        if any(d < 0 for d in shape):
            raise InvalidArgument(f"input '{name}': shape {shape} has a negative dimension")
        if raw:
            if tensor.HasField("contents"):
                raise InvalidArgument(f"input '{name}' has both contents and raw contents")
            inputs[name] = from_bytes(raw[i], datatype, shape, name)
        else:
            inputs[name] = _contents(tensor, name, datatype, shape)
    return inputs


def encode_outputs(protocol_: SimpleNamespace, model: Model, request: Any,
                   results: dict[str, np.ndarray]) -> Any:
    """A ModelInferResponse with every output as raw contents (as Triton answers)."""
    response = protocol_.ModelInferResponse(model_name=model.name, model_version=model.version,
                                            id=request.id)
    for name, array in results.items():
        array = np.asarray(array)
        out = response.outputs.add()
        out.name, out.datatype = name, datatype_of_array(array)
        out.shape.extend(array.shape)
        response.raw_output_contents.append(to_bytes(array))
    return response


# -- the service ----------------------------------------------------------------------------

def _rpc(fn: Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]):
    """``fn`` with the core's errors answered as gRPC status codes."""

    @functools.wraps(fn)
    async def handler(request: Any, context: grpc.aio.ServicerContext) -> Any:
        start, status = time.perf_counter_ns(), grpc.StatusCode.OK
        try:
            return await fn(request, context)
        except OnnxRunError as e:
            status = status_of(e)
            if status is grpc.StatusCode.INTERNAL:  # the model failed on a request
                log.warning("%s: %s", fn.__name__, e)
            await context.abort(status, str(e))
        except Exception as e:  # a bug: answered, and logged with its traceback
            status = grpc.StatusCode.INTERNAL
            log.exception("%s failed", fn.__name__)
            await context.abort(status, f"internal error: {type(e).__name__}: {e}")
        finally:
            if access.enabled():
                model = getattr(request, "model_name", None) or getattr(request, "name", "")
                access.record("grpc", "POST", f"/{SERVICE}/{fn.__name__}", status.name, start,
                              model, context.peer())
    return handler


def _service(repository: Repository) -> grpc.GenericRpcHandler:
    p = protocol()

    async def ServerLive(request, context):
        return p.ServerLiveResponse(live=True)

    async def ServerReady(request, context):
        return p.ServerReadyResponse(ready=describe.server_ready(repository))

    async def ModelReady(request, context):
        try:
            repository.model(request.name, request.version)
        except UnknownModel:
            return p.ModelReadyResponse(ready=False)
        return p.ModelReadyResponse(ready=True)

    async def ServerMetadata(request, context):
        return json_format.ParseDict(describe.server_metadata(), p.ServerMetadataResponse())

    async def ModelMetadata(request, context):
        model = repository.model(request.name, request.version)
        return json_format.ParseDict(describe.model_metadata(repository, model),
                                     p.ModelMetadataResponse())

    async def ModelConfig(request, context):
        model = repository.model(request.name, request.version)
        return json_format.ParseDict({"config": describe.model_config(model)},
                                     p.ModelConfigResponse())

    async def ModelStatistics(request, context):
        stats = describe.statistics(repository, request.name, request.version)
        return json_format.ParseDict(stats, p.ModelStatisticsResponse())

    async def RepositoryIndex(request, context):
        index = describe.repository_index(repository, request.ready)
        return json_format.ParseDict({"models": index}, p.RepositoryIndexResponse())

    async def RepositoryModelLoad(request, context):
        config = load_config_parameter({k: _parameter(request.parameters, k)
                                        for k in request.parameters})
        # loading builds sessions: off the event loop, which keeps serving the other models
        await asyncio.to_thread(repository.load, request.model_name, config)
        return p.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(request, context):
        await asyncio.to_thread(repository.unload, request.model_name)
        return p.RepositoryModelUnloadResponse()

    async def ModelInfer(request, context):
        model = repository.model(request.model_name, request.model_version)
        size = sum(len(r) for r in request.raw_input_contents)
        if size > OFF_LOOP_BYTES:
            inputs = await asyncio.to_thread(decode_inputs, request)
        else:
            inputs = decode_inputs(request)
        classes = {o.name: _parameter(o.parameters, "classification") for o in request.outputs
                   if "classification" in o.parameters}
        timeout = _parameter(request.parameters, "timeout")
        if timeout is not None and (not isinstance(timeout, int) or isinstance(timeout, bool)
                                    or timeout < 0):
            raise InvalidArgument(f"parameter 'timeout' must be microseconds >= 0, not "
                                  f"{timeout!r}")
        remaining = context.time_remaining()  # the client's deadline bounds the queue wait
        if remaining is not None:
            deadline_us = max(1, int(remaining * 1e6))
            timeout = min(timeout, deadline_us) if timeout else deadline_us
        names = [o.name for o in request.outputs] or None
        future = model.scheduler.submit(inputs, names, timeout_us=timeout)
        results = await asyncio.wrap_future(future)
        for name, count in classes.items():
            results[name] = model.classify(name, results[name], count)
        if sum(np.asarray(v).nbytes for v in results.values()) > OFF_LOOP_BYTES:
            return await asyncio.to_thread(encode_outputs, p, model, request, results)
        return encode_outputs(p, model, request, results)

    functions = {f.__name__: f for f in (
        ServerLive, ServerReady, ModelReady, ServerMetadata, ModelMetadata, ModelConfig,
        ModelStatistics, RepositoryIndex, RepositoryModelLoad, RepositoryModelUnload,
        ModelInfer)}
    handlers = {}
    for method in p.service.methods:
        request_class = getattr(p, method.input_type.name)
        response_class = getattr(p, method.output_type.name)
        handlers[method.name] = grpc.unary_unary_rpc_method_handler(
            _rpc(functions[method.name]), request_deserializer=request_class.FromString,
            response_serializer=response_class.SerializeToString)
    return grpc.method_handlers_generic_handler(SERVICE, handlers)


async def start_server(repository: Repository, host: str, port: int) -> grpc.aio.Server:
    """The gRPC endpoint serving ``repository`` on ``host:port``, started on the running
    event loop; ``await server.stop(grace)`` refuses new calls and lets those in flight
    finish."""
    server = grpc.aio.server(
        options=[("grpc.max_receive_message_length", MAX_REQUEST_BYTES),
                 ("grpc.max_send_message_length", MAX_REQUEST_BYTES),
                 ("grpc.so_reuseport", 0)],
        maximum_concurrent_rpcs=MAX_CONCURRENT_RPCS)
    server.add_generic_rpc_handlers((_service(repository),))
    try:
        bound = server.add_insecure_port(f"{host}:{port}")
    except RuntimeError as e:
        bound, reason = 0, str(e)
    else:
        reason = "address in use?"
    if bound == 0:
        raise Fail(f"onnxrun serve: cannot listen for gRPC on {host}:{port} ({reason})")
    await server.start()
    return server
