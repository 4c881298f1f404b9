"""The CPU provider's kernel registry; ``op`` is the decorator every CPU kernel module uses.
Kernel modules are imported on the first lookup of one of their operators (see ``ops``)."""

from __future__ import annotations

from ..registry import KernelContext, KernelRegistry, takes_out, text_attribute
from . import ops

cpu_kernels = KernelRegistry("CPUExecutionProvider")
cpu_kernels.defer(ops.modules_by_operator(), ops.import_all)
op = cpu_kernels.register

__all__ = ["KernelContext", "cpu_kernels", "op", "takes_out", "text_attribute"]
