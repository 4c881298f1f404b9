"""The execution-provider interface: what a provider (CPU now, CUDA later) implements."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..ir import Node
from .registry import KernelContext, KernelDef, KernelRegistry


class ExecutionProvider:
    """A device and the kernels that run on it.

    The partitioner asks each provider, in priority order, which nodes it can run
    (``can_run``); the planner asks the chosen provider for a prepared kernel
    (``create_kernel``). Values cross between providers through ``to_device``/``to_host``.
    """

    name = "ExecutionProvider"
    device = "cpu"

    def __init__(self, registry: KernelRegistry, options: dict[str, Any] | None = None) -> None:
        self.registry = registry
        self.options = dict(options or {})

    def kernel_def(self, node: Node, opset: int) -> KernelDef | None:
        return self.registry.lookup(node.domain, node.op_type, opset)

    def can_run(self, node: Node, opset: int) -> bool:
        return self.kernel_def(node, opset) is not None

    def create_kernel(
        self, node: Node, opset: int, ctx: KernelContext, attrs: dict[str, Any]
    ) -> Callable[..., Any]:
        kdef = self.kernel_def(node, opset)
        if kdef is None:
            raise LookupError(f"{self.name} has no kernel for {node.op_type}")
        return kdef.instantiate(ctx, attrs)

    def unwanted_passes(self, model: Any) -> set[str]:
        """Optimizer passes that would only slow this provider down on ``model``."""
        return set()

    def to_device(self, value: Any) -> Any:
        return value

    def to_host(self, value: Any) -> Any:
        return value
