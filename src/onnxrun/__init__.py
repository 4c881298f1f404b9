"""onnxrun: ONNX Runtime for Python, written in Python.

The API mirrors onnxruntime's, so ``import onnxrun as ort`` (or ``onnxrun.compat.install()``)
runs code written for onnxruntime::

    import onnxrun
    sess = onnxrun.InferenceSession("model.onnx")
    outputs = sess.run(None, {"input": x})
"""

from __future__ import annotations

import logging

from ._version import __version__
from .api.adapters import AdapterFormat, LoraAdapter
from .api.devices import (
    OrtAllocatorType,
    OrtArenaCfg,
    OrtDevice,
    OrtDeviceMemoryType,
    OrtDeviceVendorId,
    OrtHardwareDeviceType,
    OrtMemoryInfo,
    OrtMemoryInfoDeviceType,
    OrtMemType,
    create_and_register_allocator,
    create_and_register_allocator_v2,
)
from .api.ep_devices import OrtEpDevice, OrtHardwareDevice, get_ep_devices
from .api.iobinding import IOBinding
from .api.options import (
    ExecutionMode,
    ExecutionOrder,
    GraphOptimizationLevel,
    RunOptions,
    SessionOptions,
)
from .api.ortvalue import OrtValue
from .api.session import InferenceSession, ModelMetadata, NodeArg
from .api.sparse import OrtSparseFormat, SparseTensor
from .api.thread_pools import set_global_thread_pool_sizes
from .custom_ops import register_custom_op
from .errors import (
    EPFail,
    Fail,
    InvalidArgument,
    InvalidGraph,
    InvalidProtobuf,
    NoSuchFile,
    NotImplemented,
    OnnxRunError,
    RuntimeException,
)
from .providers import available_providers as _available_providers

version = __version__
logging.getLogger("onnxrun").addHandler(logging.NullHandler())

# onnxruntime's severities: 0 verbose, 1 info, 2 warning, 3 error, 4 fatal.
_SEVERITY_TO_LEVEL = {0: logging.DEBUG, 1: logging.INFO, 2: logging.WARNING, 3: logging.ERROR,
                      4: logging.CRITICAL}


def get_available_providers() -> list[str]:
    """Execution providers this installation can run, in priority order."""
    return _available_providers()


def get_all_providers() -> list[str]:
    return _available_providers()


def get_device() -> str:
    """"GPU" where the CUDA provider is available (as onnxruntime-gpu reports it), else
    "CPU"."""
    return "GPU" if "CUDAExecutionProvider" in _available_providers() else "CPU"


def get_version_string() -> str:
    return __version__


def get_build_info() -> str:
    return f"onnxrun Build Info: version={__version__}, pure Python, numpy backend"


def set_default_logger_severity(severity: int) -> None:
    """Set the process-wide log level (0 verbose ... 4 fatal) of the ``onnxrun`` logger."""
    if severity not in _SEVERITY_TO_LEVEL:
        # RuntimeError as onnxruntime raises it, and ValueError: a bad argument
        raise InvalidArgument(f"severity must be between 0 and 4, got {severity}")
    logging.getLogger("onnxrun").setLevel(_SEVERITY_TO_LEVEL[severity])


def set_default_logger_verbosity(verbosity: int) -> None:
    """Accepted for compatibility; verbosity only matters at severity 0 (verbose)."""


def disable_telemetry_events() -> None:
    """onnxrun sends no telemetry; accepted for compatibility."""


def enable_telemetry_events() -> None:
    """onnxrun sends no telemetry; accepted for compatibility."""


def set_seed(seed: int) -> None:
    """Seed the generators used by random operators (RandomNormal, Dropout in training...)."""
    from .providers.cpu import random_state

    random_state.seed(seed)


__all__ = [
    "AdapterFormat", "EPFail", "ExecutionMode", "ExecutionOrder", "Fail",
    "GraphOptimizationLevel", "IOBinding", "InferenceSession", "InvalidArgument", "InvalidGraph",
    "InvalidProtobuf", "LoraAdapter", "ModelMetadata", "NoSuchFile", "NodeArg", "NotImplemented",
    "OnnxRunError", "OrtAllocatorType", "OrtArenaCfg", "OrtDevice", "OrtDeviceMemoryType",
    "OrtDeviceVendorId", "OrtEpDevice", "OrtHardwareDevice", "OrtHardwareDeviceType",
    "OrtMemType", "OrtMemoryInfo", "OrtMemoryInfoDeviceType", "OrtSparseFormat", "OrtValue",
    "RunOptions", "RuntimeException", "SessionOptions", "SparseTensor", "__version__",
    "create_and_register_allocator",
    "create_and_register_allocator_v2", "disable_telemetry_events", "enable_telemetry_events",
    "get_all_providers", "get_available_providers", "get_build_info", "get_device",
    "get_ep_devices", "get_version_string", "register_custom_op", "set_default_logger_severity",
    "set_default_logger_verbosity", "set_global_thread_pool_sizes", "set_seed", "version",
]
