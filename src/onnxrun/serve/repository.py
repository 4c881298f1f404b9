"""The model repository: Triton's layout, ``<repository>/<name>/<version>/model.onnx`` with an
optional ``<name>/config.pbtxt``; its version policy picks the versions served (default: the
highest). A single ``.onnx`` path serves one model, named after its file, as version 1.

Each version loads on its own: one that fails to load is listed with its reason (UNAVAILABLE
in the repository index) while the model's other versions and the other models serve; a model
none of whose versions loads (or whose config.pbtxt does not fit it) is kept with its reason,
not ready. (Triton aborts a load in which any version fails; onnxrun serves what loaded and
says what did not, and its strict readiness is false as Triton's while a version is not.)"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..api.session import InferenceSession
from ..errors import InvalidArgument, OnnxRunError
from .config import ModelConfig, TensorConfig, read_config, read_json_config
from .scheduler import Scheduler
from .tensors import DATATYPES, datatype_of_ort_type

log = logging.getLogger("onnxrun.serve")


@dataclass(frozen=True)
class TensorSpec:
    """An input or output as the protocol shows it: the batch dimension is left out of
    ``dims`` when the model batches (max_batch_size > 0), as Triton's config does."""

    name: str
    datatype: str
    dims: list[int]  # -1: any size


class ModelError(InvalidArgument):
    """A request that the model cannot take (the endpoint answers 400 with this message)."""


class UnknownModel(ModelError):
    """No ready model of that name and version (HTTP 400, gRPC NOT_FOUND)."""


class Model:
    """One served model: its metadata, its sessions (one per instance) and its scheduler."""

    def __init__(self, name: str, version: str, path: Path, config: ModelConfig):
        self.name, self.version, self.path, self.config = name, version, path, config
        sessions = [InferenceSession(str(path)) for _ in range(config.instance_count)]
        self.inputs = self._configured(self._specs(name, sessions[0].get_inputs(), "input"),
                                       config.inputs, "input")
        self.outputs = self._configured(self._specs(name, sessions[0].get_outputs(), "output"),
                                        config.outputs, "output")
        self.labels = {t.name: _labels(path.parent.parent / t.label_filename)
                       for t in config.outputs if t.label_filename}
        self.scheduler = Scheduler(self, sessions)

    def _specs(self, model: str, args: list, kind: str) -> list[TensorSpec]:
        specs = []
        for arg in args:
            datatype = datatype_of_ort_type(arg.type)
            if datatype is None:
                raise InvalidArgument(f"model '{model}': {kind} '{arg.name}' of type {arg.type} "
                                      "has no KServe v2 data type")
            dims = [d if isinstance(d, int) and d >= 0 else -1 for d in (arg.shape or [])]
            if self.config.max_batch_size > 0:
                if not dims or dims[0] != -1:
                    raise InvalidArgument(
                        f"model '{model}': max_batch_size {self.config.max_batch_size} needs a "
                        f"dynamic first dimension, but {kind} '{arg.name}' has shape {arg.shape}")
                dims = dims[1:]
            specs.append(TensorSpec(arg.name, datatype, dims))
        return specs

    def _configured(self, specs: list[TensorSpec], configured: list[TensorConfig],
                    kind: str) -> list[TensorSpec]:
        """The model's tensors as config.pbtxt's ``input`` / ``output`` entries say: each must
        name a tensor of the model with its data type and dims (a fixed size may narrow a
        dynamic one). Inputs, when listed, are listed all; outputs may be a subset, the ones
        served. An InvalidArgument naming the entry when they do not fit."""
        if not configured:
            return specs
        by_name = {s.name: s for s in specs}
        out = []
        for c in configured:
            spec = by_name.get(c.name)
            where = f"model '{self.name}': {self.config.source} {kind} '{c.name}'"
            if spec is None:
                raise InvalidArgument(f"{where} is not an {kind} of the model (its {kind}s: "
                                      f"{', '.join(by_name)})")
            if c.datatype is not None and c.datatype != spec.datatype:
                raise InvalidArgument(f"{where} is {c.datatype}, the model's is {spec.datatype}")
            dims = spec.dims
            if c.dims is not None:
                if len(c.dims) != len(spec.dims) or any(
                        d != m and -1 not in (d, m)
                        for d, m in zip(c.dims, spec.dims, strict=True)):
                    batch = " (without the batch dimension)" if self.config.max_batch_size else ""
                    raise InvalidArgument(f"{where} has dims {c.dims}, the model's are "
                                          f"{spec.dims}{batch}")
                dims = [m if d == -1 else d for d, m in zip(c.dims, spec.dims, strict=True)]
            out.append(TensorSpec(spec.name, spec.datatype, dims))
        if kind == "input" and len(out) != len(specs):
            missing = [s.name for s in specs if s.name not in {c.name for c in configured}]
            raise InvalidArgument(f"model '{self.name}': {self.config.source} lists {len(out)} "
                                  f"inputs, the model has {len(specs)} (missing: "
                                  f"{', '.join(missing)})")
        return out

    def shape_of(self, spec: TensorSpec) -> list[int]:
        """The shape shown in metadata: -1 first for the batch dimension when batching."""
        return ([-1] if self.config.max_batch_size > 0 else []) + list(spec.dims)

    def check_inputs(self, inputs: dict[str, np.ndarray]) -> int:
        """Check a request's tensors against the model; returns its batch size (1 when the
        model does not batch). Every mismatch is a ModelError naming the input."""
        expected = {s.name: s for s in self.inputs}
        for name in inputs:
            if name not in expected:
                raise ModelError(f"model '{self.name}' has no input '{name}' (its inputs: "
                                 f"{', '.join(expected)})")
        missing = [n for n in expected if n not in inputs]
        if missing:
            raise ModelError(f"model '{self.name}': missing input(s) {', '.join(missing)}")
        batch = None
        for spec in self.inputs:
            array = inputs[spec.name]
            if array.dtype != DATATYPES[spec.datatype].newbyteorder("="):
                if not (spec.datatype == "BYTES" and array.dtype == object):
                    raise ModelError(f"model '{self.name}': input '{spec.name}' is {spec.datatype},"
                                     f" not {array.dtype}")
            shape = list(array.shape)
            dims = shape
            if self.config.max_batch_size > 0:
                if not shape:
                    raise ModelError(f"model '{self.name}': input '{spec.name}' needs a batch "
                                     "dimension first")
                if batch is None:
                    batch = shape[0]
                elif shape[0] != batch:
                    raise ModelError(f"model '{self.name}': input '{spec.name}' has batch size "
                                     f"{shape[0]}, the others {batch}")
                dims = shape[1:]
            if len(dims) != len(spec.dims) or any(
                    d != e and e != -1 for d, e in zip(dims, spec.dims, strict=True)):
                raise ModelError(f"model '{self.name}': input '{spec.name}' has shape {shape}, "
                                 f"the model takes {self.shape_of(spec)}")
        if self.config.max_batch_size > 0:
            if batch is None or batch < 1:
                raise ModelError(f"model '{self.name}': batch size must be >= 1, not {batch}")
            if batch > self.config.max_batch_size:
                raise ModelError(f"model '{self.name}': batch size {batch} exceeds its "
                                 f"max_batch_size {self.config.max_batch_size}")
            return batch
        return 1

    def check_outputs(self, names: list[str] | None) -> list[str]:
        known = [s.name for s in self.outputs]
        if names is None:
            return known
        for name in names:
            if name not in known:
                raise ModelError(f"model '{self.name}' has no output '{name}' (its outputs: "
                                 f"{', '.join(known)})")
        return list(names)

    def classify(self, name: str, array: np.ndarray, count: int) -> np.ndarray:
        """The classification extension: output ``name`` as its ``count`` highest classes,
        best first, each ``"value:index"`` (``":label"`` added when the output has a label
        file), per batch item when the model batches."""
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise ModelError(f"output '{name}': classification wants a class count >= 1, not "
                             f"{count!r}")
        array = np.asarray(array)
        if array.dtype.kind not in "biuf":
            raise ModelError(f"output '{name}' of {array.dtype} is not class scores")
        batched = self.config.max_batch_size > 0
        rows = array.reshape((array.shape[0] if batched and array.ndim else 1, -1))
        labels = self.labels.get(name, [])
        k = min(count, rows.shape[1])
        order = np.argsort(-rows.astype(np.float64), axis=1, kind="stable")[:, :k]
        out = np.empty(order.shape, dtype=object)
        for b, row in enumerate(order):
            for j, index in enumerate(row):
                text = f"{rows[b, index]:f}:{index}"
                if index < len(labels):
                    text += f":{labels[index]}"
                out[b, j] = text
        return out if batched else out.reshape(k)

    def close(self) -> None:
        self.scheduler.close()


def _labels(path: Path) -> list[str]:
    """The lines of an output's label file (classification answers name the class)."""
    try:
        return path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise InvalidArgument(f"label file '{path.name}': {e}") from None


@dataclass
class Entry:
    """A model name in the repository: its served versions, the versions that failed to load
    with their reasons, and when none serves, why not."""

    name: str
    models: dict[str, Model]  # version -> model, in increasing version order
    reason: str = ""  # why no version serves
    version: str | None = None  # the version that reason is about, if one
    failed: dict[str, str] = field(default_factory=dict)  # version -> why it did not load

    @property
    def ready(self) -> bool:
        return bool(self.models)

    @property
    def versions(self) -> list[str]:
        return list(self.models)

    def failure(self) -> str:
        """What failed to load, each version with its reason ("" when nothing did)."""
        return "; ".join(f"version {v}: {r}" for v, r in self.failed.items())


class Repository:
    """The models of a repository folder (or of one ``.onnx`` file), loaded at start; a model
    can be loaded again (a new version, a new config) or unloaded while the others serve."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        if not self.path.exists():
            raise InvalidArgument(f"model repository '{path}' does not exist")
        if self.path.is_file() and self.path.suffix != ".onnx":
            raise InvalidArgument(f"'{path}' is neither a model repository folder nor an "
                                  ".onnx file")
        self._lock = threading.Lock()  # one load / unload at a time
        self.entries: dict[str, Entry] = {name: self._read(name) for name in self._names()}

    def _names(self) -> list[str]:
        if self.path.is_file():
            return [self.path.stem]
        return sorted(p.name for p in self.path.iterdir() if p.is_dir())

    def _read(self, name: str, config_json: str | None = None) -> Entry:
        """Load model ``name`` from the repository, with its config.pbtxt or, when given, the
        JSON ModelConfig ``config_json`` instead: its entry, with the reasons of what failed."""
        if self.path.is_file():
            config = ModelConfig() if config_json is None else read_json_config(config_json, name)
            return self._load(name, {"1": self.path}, config)
        folder = self.path / name
        found = sorted(int(p.name) for p in folder.iterdir()
                       if p.is_dir() and p.name.isdigit() and (p / "model.onnx").is_file())
        if not found:
            return Entry(name, {}, "no <version>/model.onnx found")
        try:
            config_path = folder / "config.pbtxt"
            if config_json is not None:
                config = read_json_config(config_json, name)
            else:
                config = (read_config(config_path.read_text()) if config_path.is_file()
                          else ModelConfig())
            versions = _served(config.version_policy, found)
        except (OnnxRunError, OSError, UnicodeDecodeError) as e:
            log.error("model '%s' not loaded: %s", name, e)
            return Entry(name, {}, str(e), str(found[-1]))
        return self._load(name, {str(v): folder / str(v) / "model.onnx" for v in versions},
                          config)

    def _load(self, name: str, paths: dict[str, Path], config: ModelConfig) -> Entry:
        models: dict[str, Model] = {}
        failed: dict[str, str] = {}
        for version, path in paths.items():
            try:
                models[version] = Model(name, version, path, config)
                log.info("model '%s' version %s loaded from %s", name, version, path)
            except (OnnxRunError, OSError, ValueError) as e:
                log.error("model '%s' version %s not loaded: %s", name, version, e)
                failed[version] = str(e)
        if models:
            return Entry(name, models, failed=failed)
        entry = Entry(name, {}, version=list(failed)[-1], failed=failed)
        entry.reason = failed[entry.version] if len(failed) == 1 else entry.failure()
        return entry

    def load(self, name: str, config_json: str | None = None) -> Entry:
        """(Re)load model ``name`` from the repository as it is now (with the JSON ModelConfig
        ``config_json`` instead of its config.pbtxt, when given). The versions that load
        replace the old model's, which then finish their queues; when none loads, the old
        model keeps serving. Any version that failed is a ModelError naming it and its
        reason (after the others were put in service)."""
        with self._lock:
            if name not in self._names():  # only a model of the repository, never a path
                raise ModelError(f"failed to load '{name}': no such model in the repository")
            entry = self._read(name, config_json)
            if not entry.ready:
                raise ModelError(f"failed to load '{name}': {entry.reason}")
            old = self.entries.get(name)
            self.entries[name] = entry
        if old is not None:
            for model in old.models.values():
                model.close()
        if entry.failed:
            raise ModelError(f"failed to load '{name}' {entry.failure()} (serving version(s) "
                             f"{', '.join(entry.versions)})")
        return entry

    def unload(self, name: str) -> None:
        """Stop serving model ``name``: new requests are refused, queued ones finish."""
        with self._lock:
            old = self.entries.get(name)
            if old is None:
                raise ModelError(f"failed to unload '{name}': no such model")
            self.entries[name] = Entry(name, {}, "unloaded", (old.versions or [old.version])[-1])
        for model in old.models.values():
            model.close()

    def model(self, name: str, version: str | None = None) -> Model:
        """The ready model of that name and version (the highest served when not given),
        else an UnknownModel."""
        entry = self.entries.get(name)
        if entry is None:
            raise UnknownModel(f"Request for unknown model: '{name}' is not found")
        if not entry.ready:
            raise UnknownModel(f"Request for unknown model: '{name}' is not ready: "
                               f"{entry.reason}")
        if version in (None, ""):
            return entry.models[entry.versions[-1]]
        if version not in entry.models:
            why = (f"failed to load: {entry.failed[version]}" if version in entry.failed
                   else "is not found")
            raise UnknownModel(f"Request for unknown model: '{name}' version {version} {why} "
                               f"(served: {', '.join(entry.versions)})")
        return entry.models[version]

    def models(self) -> list[Model]:
        """Every served model (each version of each name)."""
        return [m for e in list(self.entries.values()) for m in e.models.values()]

    def shutdown(self) -> None:
        """Every model refuses new requests and runs its queued ones at once."""
        for model in self.models():
            model.scheduler.shutdown()

    def close(self) -> None:
        for model in self.models():
            model.close()


def load_config_parameter(params: dict[str, Any]) -> str | None:
    """The JSON ModelConfig of a repository load request's parameters (``config``), None
    when it has none; a ModelError for any other parameter (Triton's ``file:<path>``
    overrides: onnxrun loads model files from the repository only)."""
    config = None
    for key, value in params.items():
        if key == "config":
            if not isinstance(value, str):
                raise ModelError("load parameter 'config' must be a string: a ModelConfig "
                                 "as JSON")
            config = value
        elif str(key).startswith("file:"):
            raise ModelError(f"load parameter '{key}' is not supported: model files are "
                             "loaded from the repository only")
        else:
            raise ModelError(f"load parameter '{key}' is not supported (only 'config')")
    return config


def _served(policy: tuple, found: list[int]) -> list[int]:
    """The versions a version policy serves out of those found (increasing)."""
    if policy[0] == "latest":
        return found[-policy[1]:]
    if policy[0] == "all":
        return found
    missing = [v for v in policy[1] if v not in found]
    if missing:
        raise InvalidArgument(f"version_policy specific: version(s) {missing} not found (the "
                              f"repository has {found})")
    return list(policy[1])
