"""The CUDA execution provider itself: which nodes it runs, and moving values to and from its
device."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...dtypes import np_dtype
from ...ir import Node
from ...proto import onnx
from ..base import ExecutionProvider
from . import device as _device
from . import options as _options
from .kernels import cuda_kernels


class CUDAExecutionProvider(ExecutionProvider):
    name = "CUDAExecutionProvider"
    device = "cuda"

    def __init__(self, options: dict[str, Any] | None = None) -> None:
        opts = _options.parse(options)
        super().__init__(cuda_kernels, opts)
        limit = int(opts["gpu_mem_limit"])
        self.backend = _device.create(int(opts["device_id"]),
                                      0 if limit == _options.SIZE_MAX else limit)
        self.enable_cuda_graph = _options.flag(opts, "enable_cuda_graph")
        self.fast = None
        if isinstance(self.backend, _device.CuPyDevice):
            from . import cupy as fast
            from .array import register_matmul

            self.fast = fast
            register_matmul(self.backend.cp.ndarray, fast.blas.matmul)

    def can_run(self, node: Node, opset: int) -> bool:
        if node.graph is not None and node.graph.parent is not None:
            return False  # If / Loop / Scan bodies run on the CPU provider with their node
        if self.kernel_def(node, opset) is None or not self.registry.accepts(node):
            return False
        host = self.host_inputs(node)
        values = [v for i, v in enumerate(node.inputs) if v is not None and i not in host]
        outputs = node.graph.outputs if node.graph is not None else []
        values += [v for v in node.outputs if v.name and (v.uses or v in outputs)]
        return all(self._holds(v.type) for v in values)

    def _holds(self, tp: Any) -> bool:
        """Whether the device holds values of this type (unknown types: no)."""
        if tp is None or not tp.HasField("tensor_type") or not tp.tensor_type.elem_type:
            return False
        try:
            return self.backend.supports(np_dtype(tp.tensor_type.elem_type))
        except (KeyError, TypeError, ValueError):
            return False

    def host_inputs(self, node: Node) -> tuple[int, ...]:
        """The inputs the node's kernel reads as host values (the copy step reads this)."""
        return self.registry.host_inputs_of(node.domain, node.op_type)

    def unwanted_passes(self, model: Any) -> set[str]:
        """A GPU computes float16 itself: no float32 rewrite (made for numpy's sake), unless
        the model holds bfloat16, which CuPy has no type for: then the rewrite lets the GPU
        run it in float32 instead of leaving its nodes to the CPU."""
        if not self.backend.supports(np.dtype(np.float16)) or _has_bfloat16(model.graph):
            return set()
        return {"Float16ComputeInFloat32"}

    def to_device(self, value: Any) -> Any:
        if isinstance(value, np.ndarray) and self.backend.supports(value.dtype):
            return self.backend.to_device(value)
        return value

    def to_host(self, value: Any) -> Any:
        if self.backend.is_device_array(value):
            return self.backend.to_host(value)
        return value


def _has_bfloat16(graph: Any) -> bool:
    bf16 = onnx.TensorProto.BFLOAT16
    for v in [*graph.inputs, *graph.outputs, *graph.initializers.values()]:
        tp = v.type
        if tp is not None and tp.HasField("tensor_type") and tp.tensor_type.elem_type == bf16:
            return True
    return any(n.op_type == "Cast" and n.attr("to") == bf16 for n in graph.all_nodes())


__all__ = ["CUDAExecutionProvider"]
