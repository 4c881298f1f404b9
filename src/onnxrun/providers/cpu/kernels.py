"""The CPU provider's kernel registry; ``op`` is the decorator every CPU kernel module uses."""

from __future__ import annotations

from ..registry import KernelContext, KernelRegistry

cpu_kernels = KernelRegistry("CPUExecutionProvider")
op = cpu_kernels.register

__all__ = ["KernelContext", "cpu_kernels", "op"]
