"""SessionOptions, RunOptions and the enums, with onnxruntime's names, defaults and behaviour."""

from __future__ import annotations

import enum
from typing import Any

import numpy as np


class GraphOptimizationLevel(enum.IntEnum):
    ORT_DISABLE_ALL = 0
    ORT_ENABLE_BASIC = 1
    ORT_ENABLE_EXTENDED = 2
    ORT_ENABLE_LAYOUT = 3
    ORT_ENABLE_ALL = 99

    def __str__(self) -> str:
        return f"GraphOptimizationLevel.{self.name}"


class ExecutionMode(enum.IntEnum):
    ORT_SEQUENTIAL = 0
    ORT_PARALLEL = 1

    def __str__(self) -> str:
        return f"ExecutionMode.{self.name}"


class ExecutionOrder(enum.IntEnum):
    DEFAULT = 0
    PRIORITY_BASED = 1
    MEMORY_EFFICIENT = 2


class SessionOptions:
    """Options for an InferenceSession. Fields mirror onnxruntime's; see docs/ARCHITECTURE.md for
    which stage reads each one."""

    def __init__(self) -> None:
        self.graph_optimization_level = GraphOptimizationLevel.ORT_ENABLE_ALL
        self.optimized_model_filepath = ""
        self.intra_op_num_threads = 0  # 0: let the engine choose (all cores)
        self.inter_op_num_threads = 0
        self.execution_mode = ExecutionMode.ORT_SEQUENTIAL
        self.execution_order = ExecutionOrder.DEFAULT
        self.enable_profiling = False
        self.profile_file_prefix = "onnxruntime_profile_"
        self.log_severity_level = -1  # -1: the process-wide default (set_default_logger_severity)
        self.log_verbosity_level = 0
        self.logid = ""
        self.enable_cpu_mem_arena = True
        self.enable_mem_pattern = True
        self.enable_mem_reuse = True
        self.use_deterministic_compute = False
        self.use_per_session_threads = True
        self._config: dict[str, str] = {}
        self._free_dim_by_name: dict[str, int] = {}
        self._free_dim_by_denotation: dict[str, int] = {}
        self._initializers: dict[str, Any] = {}
        self._external_initializers: set[str] = set()  # names among _initializers
        self._external_files: dict[str, memoryview] = {}  # location -> the file's bytes
        self._custom_op_libraries: list[str] = []

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "graph_optimization_level":
            value = GraphOptimizationLevel(value)
        elif name == "execution_mode":
            value = ExecutionMode(value)
        elif name in ("intra_op_num_threads", "inter_op_num_threads"):
            value = int(value)
            if value < 0:
                raise ValueError(f"{name} must be >= 0, got {value}")
        object.__setattr__(self, name, value)

    def add_session_config_entry(self, key: str, value: str) -> None:
        self._config[str(key)] = str(value)

    def get_session_config_entry(self, key: str) -> str:
        try:
            return self._config[key]
        except KeyError:
            raise RuntimeError(
                f"SessionOptions does not have configuration with key: {key}"
            ) from None

    @property
    def session_config(self) -> dict[str, str]:
        return dict(self._config)

    def add_free_dimension_override_by_name(self, dim_name: str, dim_value: int) -> None:
        self._free_dim_by_name[str(dim_name)] = int(dim_value)

    def add_free_dimension_override_by_denotation(
        self, dim_denotation: str, dim_value: int
    ) -> None:
        self._free_dim_by_denotation[str(dim_denotation)] = int(dim_value)

    def add_initializer(self, name: str, value: Any) -> None:
        """Override (or supply) the initializer ``name`` with an OrtValue or numpy array."""
        from .ortvalue import OrtValue

        arr = value.numpy() if isinstance(value, OrtValue) else np.asarray(value)
        self._initializers[str(name)] = arr

    def add_external_initializers(self, names: list[str], values: list[Any]) -> None:
        """Supply initializers whose data the model keeps in external files: the session uses
        these values (OrtValues or arrays) and never opens those files."""
        if len(names) != len(values):
            raise ValueError(f"add_external_initializers: {len(names)} names and "
                             f"{len(values)} values")
        for n, v in zip(names, values, strict=True):
            self.add_initializer(n, v)
            self._external_initializers.add(str(n))

    def add_external_initializers_from_files_in_memory(
            self, file_names: list[str], buffers: list[Any], lengths: list[int]) -> None:
        """Give the contents of external-data files from memory: a tensor whose ``location``
        is one of ``file_names`` reads from the first ``lengths[i]`` bytes of ``buffers[i]``
        (not copied until the session loads them)."""
        if not len(file_names) == len(buffers) == len(lengths):
            raise ValueError(
                f"add_external_initializers_from_files_in_memory: {len(file_names)} file names, "
                f"{len(buffers)} buffers and {len(lengths)} lengths")
        for name, buffer, length in zip(file_names, buffers, lengths, strict=True):
            view = memoryview(buffer).cast("B")
            if not 0 <= int(length) <= len(view):
                raise ValueError(f"file '{name}': length {length} but the buffer holds "
                                 f"{len(view)} bytes")
            self._external_files[str(name)] = view[:int(length)]

    def register_custom_ops_library(self, library_path: str) -> None:
        raise RuntimeError(
            "onnxrun runs Python kernels: register custom operators with "
            "onnxrun.register_custom_op, not a shared library"
        )

    def __repr__(self) -> str:
        return (
            f"SessionOptions(graph_optimization_level={self.graph_optimization_level!s}, "
            f"intra_op_num_threads={self.intra_op_num_threads}, "
            f"execution_mode={self.execution_mode!s})"
        )


class RunOptions:
    """Per-run options; ``terminate`` may be set from another thread to stop a run between nodes."""

    def __init__(self) -> None:
        self.log_severity_level = -1
        self.log_verbosity_level = 0
        self.logid = ""
        self.terminate = False
        self.only_execute_path_to_fetches = False
        self._config: dict[str, str] = {}
        self._active_adapters: list[Any] = []

    def add_run_config_entry(self, key: str, value: str) -> None:
        self._config[str(key)] = str(value)

    def add_active_adapter(self, adapter: Any) -> None:
        """Run with a loaded LoraAdapter: its parameters are fed to the model inputs of the
        same names (several adapters may be active; their parameter names must differ)."""
        from .adapters import LoraAdapter

        if not isinstance(adapter, LoraAdapter):
            raise TypeError(f"add_active_adapter expects a LoraAdapter, got "
                            f"{type(adapter).__name__}")
        self._active_adapters.append(adapter)

    def get_run_config_entry(self, key: str) -> str:
        try:
            return self._config[key]
        except KeyError:
            raise RuntimeError(f"RunOptions does not have configuration with key: {key}") from None


# The session options a model may carry (metadata "ort_config" = {"session_options": {...}}),
# each an integer, with the values onnxruntime accepts.
_MODEL_OPTIONS = {
    "intra_op_num_threads": lambda v: v >= 0,
    "inter_op_num_threads": lambda v: v >= 0,
    "execution_mode": lambda v: v in (0, 1),
    "graph_optimization_level": lambda v: v in (0, 1, 2, 99),
    "enable_profiling": lambda v: v in (0, 1),
}


def options_from_model(options: SessionOptions, metadata: dict[str, str]) -> SessionOptions:
    """``options`` with the session options stored in the model's metadata
    (``ORT_LOAD_CONFIG_FROM_MODEL=1``, as onnxruntime reads them): a copy when there are any,
    the caller's object stays as it was. Other keys in the JSON are ignored, as in onnxruntime;
    a malformed JSON or value raises InvalidArgument."""
    import copy
    import json

    from ..errors import InvalidArgument

    text = metadata.get("ort_config")
    if text is None:
        return options
    try:
        config = json.loads(text)
    except ValueError as e:
        raise InvalidArgument(
            f"Json stored in the `ort_config` key cannot be parsed. Error message: {e}") from None
    stored = config.get("session_options") if isinstance(config, dict) else None
    if not isinstance(stored, dict):
        return options
    options = copy.copy(options)
    for key, value in stored.items():
        valid = _MODEL_OPTIONS.get(key)
        if valid is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool):
            raise InvalidArgument(f"{key} option in the model file must be an integer")
        if not valid(value):
            raise InvalidArgument(f"Unsupported value for {key} in the model's ORT config: "
                                  f"{value}")
        setattr(options, key, bool(value) if key == "enable_profiling" else value)
    return options
