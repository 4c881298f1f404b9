"""Constant folding: a node whose inputs are all constants is computed once, at session
creation, by the CPU provider's own kernel, and becomes an initializer. Shape and Size of
statically known shapes fold too, so whole shape-arithmetic subgraphs collapse. A
DequantizeLinear of an 8-bit weight read by Conv/MatMul/Gemm is left alone: folding it would
hold the weight as float32, 4x its size."""

from __future__ import annotations

from collections import Counter

import numpy as np

from ...dtypes import type_shape
from ...ir import Model, Node
from ...providers import KernelContext
from ...providers.cpu import CPUExecutionProvider
from ..base import BASIC, GraphPass, PassResult, register_pass
from ..graph_utils import constant_value, live_nodes, to_initializer

# Operators whose result differs between runs, or that must not run at load time.
_NONDETERMINISTIC = {
    "RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Bernoulli",
    "Multinomial",
}


def _narrow_weight(node: Node) -> bool:
    """A DequantizeLinear that keeps its int8 weight narrow (see the quantization kernels);
    imported here only when there is one, so a float model never loads that kernel family."""
    if node.op_type != "DequantizeLinear":
        return False
    from ...providers.cpu.ops.quantization import dequantizes_weight_per_run

    return dequantizes_weight_per_run(node)


@register_pass
class ConstantFolding(GraphPass):
    name = "ConstantFolding"
    level = BASIC
    order = 10

    def __init__(self) -> None:
        self._cpu: CPUExecutionProvider | None = None

    def run(self, model: Model) -> PassResult:
        if self._cpu is None:
            self._cpu = CPUExecutionProvider()
        changes: Counter = Counter()
        for graph, node in live_nodes(model):
            values = self._fold(model, node)
            if values is None:
                continue
            graph.remove(node)
            for v, arr in zip(node.outputs, values, strict=False):
                if v.name:
                    to_initializer(v, arr)
            changes[node.op_type] += 1
        return PassResult(bool(changes), changes)

    def _fold(self, model: Model, node: Node) -> list[np.ndarray] | None:
        if node.domain not in ("", "com.microsoft") or node.op_type in _NONDETERMINISTIC:
            return None
        if any(True for _ in node.subgraphs()) or _narrow_weight(node):
            return None  # a narrow weight stays narrow (dequantized per run by its kernel)
        static = _static_shape_result(node)
        if static is not None:
            return [static]
        inputs = [None if v is None else constant_value(v) for v in node.inputs]
        if any(v is not None and c is None for v, c in zip(node.inputs, inputs, strict=True)):
            return None
        if not node.inputs and node.op_type != "Constant":
            return None  # source ops other than Constant (e.g. EyeLike needs an input anyway)
        opset = model.node_opset(node)
        if opset is None or not self._cpu.can_run(node, opset):
            return None
        ctx = KernelContext(node=node, opset=opset, constants=inputs,
                            outputs_used=[bool(v.name) for v in node.outputs], provider=self._cpu)
        attrs = {k: a.value for k, a in node.attributes.items()}
        try:
            kernel = self._cpu.create_kernel(node, opset, ctx, attrs)
            with np.errstate(all="ignore"):
                result = kernel(*inputs)
        except Exception:
            return None  # leave it to run time, where the error names the node
        results = list(result) if type(result) is tuple else [result]
        arrays = []
        for v, r in zip(node.outputs, results, strict=False):
            if not v.name:
                arrays.append(None)
                continue
            if not isinstance(r, np.ndarray | np.generic):
                return None  # sequences, optionals, maps stay dynamic
            # Folded regardless of size, as onnxruntime does: a weight built by ConstantOfShape
            # would otherwise be rebuilt on every run.
            arrays.append(np.asarray(r))
        if len(arrays) < sum(1 for v in node.outputs if v.name):
            return None
        return arrays


def _static_shape_result(node: Node) -> np.ndarray | None:
    """Shape/Size of an input whose shape is fully known statically."""
    if node.domain != "" or node.op_type not in ("Shape", "Size") or not node.inputs:
        return None
    x = node.inputs[0]
    if x is None or constant_value(x) is not None:
        return None
    shape = type_shape(x.type)
    if shape is None or not all(isinstance(d, int) for d in shape):
        return None
    if node.op_type == "Size":
        return np.array(int(np.prod(shape, dtype=np.int64)), dtype=np.int64)
    start = node.attr("start", 0)
    end = node.attr("end", None)
    return np.array(shape[slice(start, end)], dtype=np.int64)
