"""Execution providers. ``available_providers()`` lists them in onnxruntime's priority order."""

from __future__ import annotations

from typing import Any

from .base import ExecutionProvider
from .registry import KernelContext, KernelRegistry

CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"


def available_providers() -> list[str]:
    """CUDA only where CuPy finds a GPU (or inside the tests' stand-in), then CPU."""
    from . import cuda

    return [CUDA, CPU] if cuda.available() else [CPU]


def create_provider(name: str, options: dict[str, Any] | None = None) -> ExecutionProvider:
    if name == CPU:
        from .cpu import CPUExecutionProvider

        return CPUExecutionProvider(options)
    if name == CUDA:
        from .cuda import CUDAExecutionProvider

        return CUDAExecutionProvider(options)
    raise ValueError(f"unknown execution provider '{name}'; available: {available_providers()}")


__all__ = ["CPU", "CUDA", "ExecutionProvider", "KernelContext", "KernelRegistry",
           "available_providers", "create_provider"]
