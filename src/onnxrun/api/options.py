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
        for n, v in zip(names, values, strict=True):
            self.add_initializer(n, v)

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

    def add_run_config_entry(self, key: str, value: str) -> None:
        self._config[str(key)] = str(value)

    def get_run_config_entry(self, key: str) -> str:
        try:
            return self._config[key]
        except KeyError:
            raise RuntimeError(f"RunOptions does not have configuration with key: {key}") from None
