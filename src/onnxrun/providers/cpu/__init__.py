"""The CPU execution provider: numpy on BLAS. Kernels live in ``ops/``, one module per family."""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

from ..base import ExecutionProvider
from .kernels import cpu_kernels

_loaded = False


def _load_kernels() -> None:
    """Import every module under ``ops/`` (sub-packages such as ``ops/ml`` and ``ops/contrib``
    included) once; each registers its kernels on import."""
    global _loaded
    if _loaded:
        return
    from . import ops

    for info in pkgutil.walk_packages(ops.__path__, prefix=f"{ops.__name__}."):
        importlib.import_module(info.name)
    _loaded = True


class CPUExecutionProvider(ExecutionProvider):
    name = "CPUExecutionProvider"
    device = "cpu"

    def __init__(self, options: dict[str, Any] | None = None) -> None:
        _load_kernels()
        super().__init__(cpu_kernels, options)


__all__ = ["CPUExecutionProvider", "cpu_kernels"]
