"""Execution providers. ``available_providers()`` lists them in onnxruntime's priority order."""

from __future__ import annotations

from typing import Any

from .base import ExecutionProvider
from .registry import KernelContext, KernelRegistry

CPU = "CPUExecutionProvider"


def available_providers() -> list[str]:
    return [CPU]


def create_provider(name: str, options: dict[str, Any] | None = None) -> ExecutionProvider:
    if name == CPU:
        from .cpu import CPUExecutionProvider

        return CPUExecutionProvider(options)
    raise ValueError(f"unknown execution provider '{name}'; available: {available_providers()}")


__all__ = ["CPU", "ExecutionProvider", "KernelContext", "KernelRegistry", "available_providers",
           "create_provider"]
