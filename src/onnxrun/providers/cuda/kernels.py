"""The CUDA provider's kernel registry; ``op`` is the decorator its kernel modules use.

``host_inputs`` names the inputs a kernel reads as host (numpy) values: shapes, axes, pads,
starts and ends, which onnxruntime's CUDA kernels also take in CPU memory. The copy step
(``onnxrun.memcpy``) gives those inputs host values and every other input a device array.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from ...ir import Node
from ..registry import KernelContext, KernelRegistry, text_attribute

# kernel modules under ops/, imported when the provider is first created
MODULES = ("activation", "attention", "conv", "elementwise", "integer", "linalg", "memcpy",
           "normalization", "pool", "quantization", "reduction", "tensor")


class DeviceKernelRegistry(KernelRegistry):
    def __init__(self, provider_name: str) -> None:
        super().__init__(provider_name)
        self.host_inputs: dict[tuple[str, str], tuple[int, ...]] = {}
        self.checks: dict[tuple[str, str], Callable[[Node], bool]] = {}

    def register(self, op_type: str, *since_versions: int, domain: str = "",
                 host_inputs: tuple[int, ...] = (),
                 check: Callable[[Node], bool] | None = None) -> Callable[[Any], Any]:
        """``check(node)``: whether the kernel handles this node (the cases it leaves to the
        CPU provider are refused at partition time, never at run time)."""
        domain = "" if domain == "ai.onnx" else domain
        if host_inputs:
            self.host_inputs[(domain, op_type)] = tuple(host_inputs)
        if check is not None:
            self.checks[(domain, op_type)] = check
        return super().register(op_type, *since_versions, domain=domain)

    def accepts(self, node: Node) -> bool:
        check = self.checks.get((node.domain, node.op_type))
        return check is None or check(node)

    def host_inputs_of(self, domain: str, op_type: str) -> tuple[int, ...]:
        return self.host_inputs.get(("" if domain == "ai.onnx" else domain, op_type), ())


cuda_kernels = DeviceKernelRegistry("CUDAExecutionProvider")
op = cuda_kernels.register


def _import_all() -> None:
    for name in MODULES:
        importlib.import_module(f"{__package__}.ops.{name}")


cuda_kernels.defer({}, _import_all)

__all__ = ["KernelContext", "cuda_kernels", "op", "text_attribute"]
