"""The CPU execution provider: numpy on BLAS. Kernels live in ``ops/``, one module per family,
imported when the session first looks up one of their operators."""

from __future__ import annotations

from typing import Any

from ..base import ExecutionProvider
from .kernels import cpu_kernels


def _load_kernels() -> None:
    """Import every kernel module now (``cpu_kernels.operators()`` does too)."""
    cpu_kernels.import_all()


class CPUExecutionProvider(ExecutionProvider):
    name = "CPUExecutionProvider"
    device = "cpu"

    def __init__(self, options: dict[str, Any] | None = None) -> None:
        super().__init__(cpu_kernels, options)


__all__ = ["CPUExecutionProvider", "cpu_kernels"]
