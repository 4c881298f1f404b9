"""The CPU execution provider: numpy on BLAS. Kernels live in ``ops/``, one module per family."""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

from ..base import ExecutionProvider
from .kernels import cpu_kernels

_loaded = False


def _load_kernels() -> None:
    """Import every module of ``ops/`` once; each registers its kernels on import."""
    global _loaded
    if _loaded:
        return
    from . import ops

    for info in pkgutil.iter_modules(ops.__path__):
        importlib.import_module(f"{ops.__name__}.{info.name}")
    _loaded = True


class CPUExecutionProvider(ExecutionProvider):
    name = "CPUExecutionProvider"
    device = "cpu"

    def __init__(self, options: dict[str, Any] | None = None) -> None:
        _load_kernels()
        super().__init__(cpu_kernels, options)


__all__ = ["CPUExecutionProvider", "cpu_kernels"]
