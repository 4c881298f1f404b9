"""What the server says about itself and its models, as the protocol's JSON objects: server
and model metadata, model configuration, statistics and the repository index. The REST
endpoint sends them as they are; the gRPC endpoint parses them into its messages (Triton's
REST JSON is the JSON form of its gRPC messages), so both protocols say the same."""

from __future__ import annotations

from typing import Any

from .._version import __version__
from .repository import Model, Repository

EXTENSIONS = ["binary_tensor_data", "statistics", "model_repository"]


def server_metadata() -> dict[str, Any]:
    return {"name": "onnxrun", "version": __version__, "extensions": EXTENSIONS}


def model_metadata(model: Model) -> dict[str, Any]:
    def tensors(specs):
        return [{"name": s.name, "datatype": s.datatype, "shape": model.shape_of(s)}
                for s in specs]
    return {"name": model.name, "versions": [model.version], "platform": "onnxruntime_onnx",
            "inputs": tensors(model.inputs), "outputs": tensors(model.outputs)}


def model_config(model: Model) -> dict[str, Any]:
    cfg = model.config

    def tensors(specs):
        return [{"name": s.name, "data_type": f"TYPE_{s.datatype.replace('BYTES', 'STRING')}",
                 "dims": s.dims} for s in specs]
    out: dict[str, Any] = {"name": model.name, "platform": "onnxruntime_onnx",
                           "backend": "onnxruntime", "max_batch_size": cfg.max_batch_size,
                           "input": tensors(model.inputs), "output": tensors(model.outputs),
                           "instance_group": [{"count": cfg.instance_count, "kind": "KIND_CPU"}],
                           "version_policy": {"latest": {"num_versions": 1}}}
    if cfg.dynamic_batching:
        out["dynamic_batching"] = {"preferred_batch_size": cfg.preferred_batch_size,
                                   "max_queue_delay_microseconds": cfg.max_queue_delay_us}
    return out


def model_statistics(model: Model) -> dict[str, Any]:
    s = model.scheduler.statistics()

    def d(x):
        return {"count": x.count, "ns": x.ns}
    zero = {"count": 0, "ns": 0}
    return {"name": model.name, "version": model.version,
            "last_inference": s.last_inference_ms, "inference_count": s.inference_count,
            "execution_count": s.execution_count,
            "inference_stats": {"success": d(s.success), "fail": d(s.fail), "queue": d(s.queue),
                                "compute_input": zero, "compute_infer": d(s.compute_infer),
                                "compute_output": zero},
            "batch_stats": [{"batch_size": b, "compute_input": zero,
                             "compute_infer": d(x), "compute_output": zero}
                            for b, x in sorted(s.batch_sizes.items())]}


def statistics(repository: Repository, name: str | None = None,
               version: str | None = None) -> dict[str, Any]:
    """Statistics of model ``name`` (every loaded model when no name is given)."""
    if name:
        models = [repository.model(name, version)]
    else:
        models = [e.model for e in repository.entries.values() if e.model is not None]
    return {"model_stats": [model_statistics(m) for m in models]}


def repository_index(repository: Repository, ready_only: bool = False) -> list[dict[str, Any]]:
    return [{"name": e.name, **({"version": e.version} if e.version else {}),
             "state": "READY" if e.ready else "UNAVAILABLE", "reason": e.reason}
            for e in repository.entries.values() if e.ready or not ready_only]


def server_ready(repository: Repository) -> bool:
    """Triton's strict readiness: ready when every model of the repository is."""
    return all(e.ready for e in repository.entries.values())
