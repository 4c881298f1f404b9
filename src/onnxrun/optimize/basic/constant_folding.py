"""Constant folding: a node whose inputs are all constants is computed once, at session
creation, by the CPU provider's own kernel, and becomes an initializer. Shape and Size of
statically known shapes fold too, so whole shape-arithmetic subgraphs collapse. A
DequantizeLinear of an 8-bit weight read by MatMul/Gemm is left alone: folding it would hold the
weight as float32, 4x its size (see dequantizes_weight_per_run).

A DequantizeLinear that is folded (a convolution's weight, a bias) is remembered: onnxruntime's
constant folding leaves DequantizeLinear alone so that its extended-level QDQ fusions still see
the integer weights, but folding here cannot know the session's level, and a basic-level session
needs a convolution's weight folded (its kernel lays a constant weight out once, and re-lays one
that arrives at each run). ``dequantized_from`` gives the integers back to those fusions.
"""

from __future__ import annotations

import collections
import weakref
from collections import Counter

import numpy as np

from ...dtypes import type_shape
from ...ir import Model, Node, Value
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
            if node.op_type == "DequantizeLinear" and node.outputs[0].name:
                _remember(node, node.outputs[0].const_value)
            changes[node.op_type] += 1
        return PassResult(bool(changes), changes)

    def _fold(self, model: Model, node: Node) -> list[np.ndarray] | None:
        if node.domain not in ("", "com.microsoft") or node.op_type in _NONDETERMINISTIC:
            return None
        if node.op_type not in _SHAPE_OPS and any(
                v is not None and constant_value(v) is None for v in node.inputs):
            return None  # the usual node, asked first (every sweep asks it of every node)
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
        if node.op_type == "ConstantOfShape" and opset is not None and opset >= 9:
            filled = _constant_of_shape(node, inputs[0])
            if filled is not None:
                return [filled]
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


_SHAPE_OPS = ("Shape", "Size")  # folded from a non-constant input's static shape


def _static_shape_result(node: Node) -> np.ndarray | None:
    """Shape/Size of an input whose shape is fully known statically."""
    if node.domain != "" or node.op_type not in _SHAPE_OPS or not node.inputs:
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


def _constant_of_shape(node: Node, shape: np.ndarray | None) -> np.ndarray | None:
    """ConstantOfShape of a constant shape filled as its kernel fills it (ops/tensor.py),
    without preparing a kernel for it: the zoo's light models hold their weights as
    ConstantOfShape nodes (ShuffleNet: 243). None leaves the node to the kernel (its errors,
    unusual operands)."""
    value = node.attr("value", None)
    if node.domain != "" or len(node.inputs) != 1 or len(node.outputs) != 1 or \
            shape is None or shape.dtype != np.int64 or shape.ndim != 1 or \
            (value is not None and (type(value) is not np.ndarray or value.size != 1)):
        return None
    dims = tuple(shape.tolist())
    if any(d < 0 for d in dims):
        return None
    try:
        if value is None:
            return np.zeros(dims, dtype=np.float32)
        return np.full(dims, value.reshape(-1)[0], dtype=value.dtype)
    except (ValueError, MemoryError):
        return None  # too large to fold: the kernel says so at run time, naming the node


# -- folded dequantizations ---------------------------------------------------------------------


class _Folded(collections.namedtuple("_Folded", "array ints dtype scale zero_point axis")):
    # (not a frozen dataclass: creating that class cost ~1 ms of every first session)
    __slots__ = ()
    array: weakref.ref  # the folded float array (an initializer's value while it lives)
    ints: np.ndarray | None  # int32 codes (a bias); 8-bit codes are recovered from the floats
    dtype: np.dtype
    scale: np.ndarray
    zero_point: np.ndarray | None
    axis: int


# id(folded array) -> how it was computed; an entry goes with its array.
_FOLDED: dict[int, _Folded] = {}
_REMEMBERED = {np.dtype(t) for t in (np.int8, np.uint8, np.int32)}


def _remember(node: Node, folded: np.ndarray) -> None:
    x, scale = (constant_value(v) for v in node.inputs[:2])
    zp_value = node.inputs[2] if len(node.inputs) > 2 else None
    zp = constant_value(zp_value)
    if x is None or scale is None or x.dtype not in _REMEMBERED or node.attr("block_size", 0) \
            or (zp_value is not None and zp is None):
        return
    # 1-D int32 only: biases, a few values per channel, not large int32 tensors held twice
    ints = x if x.dtype.itemsize == 4 and x.ndim <= 1 else None
    if x.dtype.itemsize == 4 and ints is None:
        return
    _FOLDED[id(folded)] = _Folded(weakref.ref(folded), ints, x.dtype, scale, zp,
                                  int(node.attr("axis", 1)))
    weakref.finalize(folded, _FOLDED.pop, id(folded), None)


def dequantized_from(v: Value) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, int] | None:
    """(codes, scale, zero point, axis) of the DequantizeLinear that constant folding turned
    into the constant ``v``, or None. 8-bit codes are recovered from the floats, and given only
    when they dequantize to exactly those floats again."""
    arr = constant_value(v)
    entry = _FOLDED.get(id(arr)) if arr is not None else None
    if entry is None or entry.array() is not arr:
        return None
    codes = entry.ints if entry.ints is not None else _recover(arr, entry)
    if codes is None:
        return None
    return codes, entry.scale, entry.zero_point, entry.axis


def _recover(arr: np.ndarray, entry: _Folded) -> np.ndarray | None:
    """The codes q with dequantize(q) == arr. arr is (q - zp) * s rounded to float32, so arr / s
    is within 255 * 2**-24 of the whole number q - zp: rounding finds it."""
    from ...providers.cpu.ops.quantization import broadcast_param, dequantize

    try:
        s = broadcast_param(entry.scale, arr.shape, entry.axis).astype(np.float64)
        zp = 0 if entry.zero_point is None else \
            broadcast_param(entry.zero_point, arr.shape, entry.axis).astype(np.float64)
    except ValueError:
        return None
    with np.errstate(all="ignore"):
        q = np.rint(arr.astype(np.float64) / s) + zp
    info = np.iinfo(entry.dtype)
    if not np.all((q >= info.min) & (q <= info.max)):  # NaN fails too
        return None
    codes = q.astype(entry.dtype)
    again = dequantize(codes, entry.scale, entry.zero_point, arr.dtype, entry.axis)
    return codes if np.array_equal(again, arr) else None
