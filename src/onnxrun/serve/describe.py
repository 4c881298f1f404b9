"""What the server says about itself and its models, as the protocol's JSON objects: server
and model metadata, model configuration, statistics and the repository index. The REST
endpoint sends them as they are; the gRPC endpoint parses them into its messages (Triton's
REST JSON is the JSON form of its gRPC messages), so both protocols say the same."""

from __future__ import annotations

from typing import Any

from .._version import __version__
from .repository import Model, Repository

EXTENSIONS = ["classification", "binary_tensor_data", "statistics", "model_repository"]


def server_metadata() -> dict[str, Any]:
    return {"name": "onnxrun", "version": __version__, "extensions": EXTENSIONS}


def model_metadata(repository: Repository, model: Model) -> dict[str, Any]:
    def tensors(specs):
        return [{"name": s.name, "datatype": s.datatype, "shape": model.shape_of(s)}
                for s in specs]
    entry = repository.entries.get(model.name)
    versions = entry.versions if entry is not None and entry.ready else [model.version]
    return {"name": model.name, "versions": versions, "platform": "onnxruntime_onnx",
            "inputs": tensors(model.inputs), "outputs": tensors(model.outputs)}


def model_config(model: Model) -> dict[str, Any]:
    cfg = model.config

    def tensors(specs):
        return [{"name": s.name, "data_type": f"TYPE_{s.datatype.replace('BYTES', 'STRING')}",
                 "dims": s.dims} for s in specs]
    policy = cfg.version_policy
    outputs = tensors(model.outputs)
    for out in outputs:
        label = next((t.label_filename for t in cfg.outputs if t.name == out["name"]), "")
        if label:
            out["label_filename"] = label
    out: dict[str, Any] = {"name": model.name, "platform": "onnxruntime_onnx",
                           "backend": "onnxruntime", "max_batch_size": cfg.max_batch_size,
                           "input": tensors(model.inputs), "output": outputs,
                           "instance_group": [{"count": cfg.instance_count, "kind": "KIND_CPU"}],
                           "version_policy": {
                               "latest": {"latest": {"num_versions": policy[-1]}},
                               "all": {"all": {}},
                               "specific": {"specific": {"versions": policy[-1]}},
                           }[policy[0]]}
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
    if name and version:
        models = [repository.model(name, version)]
    elif name:  # every served version, as Triton
        repository.model(name)
        models = [m for m in repository.models() if m.name == name]
    else:
        models = repository.models()
    return {"model_stats": [model_statistics(m) for m in models]}


def repository_index(repository: Repository, ready_only: bool = False) -> list[dict[str, Any]]:
    """One row per version served (READY) or failed to load (UNAVAILABLE, with why), in
    version order, and one for a model name none of whose versions is known (with why)."""
    rows = []
    for e in list(repository.entries.values()):
        states = {v: ("READY", "") for v in e.versions}
        if not ready_only:
            states.update((v, ("UNAVAILABLE", r)) for v, r in e.failed.items())
        for v in sorted(states, key=int):
            rows.append({"name": e.name, "version": v, "state": states[v][0],
                         "reason": states[v][1]})
        if not e.ready and not e.failed and not ready_only:
            rows.append({"name": e.name, **({"version": e.version} if e.version else {}),
                         "state": "UNAVAILABLE", "reason": e.reason})
    return rows


def server_ready(repository: Repository) -> bool:
    """Triton's strict readiness: ready when every version of every model of the repository
    is (one unloaded on request does not count)."""
    return all((e.ready or e.reason == "unloaded") and not e.failed
               for e in repository.entries.values())
