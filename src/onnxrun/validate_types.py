"""Element-type checks at load where onnx's shape inference is not available (Pyodide).

onnx's strict type inference refuses, at load, a node whose inputs bind one type parameter to
two types (``Add(float, int64)``): onnxruntime does the same, and a numpy kernel would instead
promote silently or fail mid-run. Without onnx, this walk propagates element types through the
operators whose typing is simple (same-type arithmetic, comparisons, shape-preserving ops,
Cast...) and refuses the same mismatches with the same words. Types it cannot derive stay
unknown and are not checked: it never refuses a model onnx would accept.
"""

from __future__ import annotations

import numpy as np

from .dtypes import elem_type, tensor_type_string
from .errors import InvalidGraph
from .ir import Graph, Model, Node
from .proto import onnx

# op_type -> indices of the inputs that share one type parameter (None: all inputs)
_SAME_TYPE: dict[str, tuple[int, ...] | None] = {
    **dict.fromkeys(("Add", "Sub", "Mul", "Div", "Sum", "Max", "Min", "Mean", "MatMul",
                     "Concat", "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual",
                     "And", "Or", "Xor", "BitShift", "BitwiseAnd", "BitwiseOr", "BitwiseXor",
                     "Mod", "PRelu"), None),
    "Gemm": (0, 1, 2), "Where": (1, 2), "Conv": (0, 1, 2), "ConvTranspose": (0, 1, 2),
}
_BOOL_OUT = {"Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "Not", "And", "Or",
             "Xor", "IsNaN", "IsInf"}
_INT64_OUT = {"Shape", "Size", "ArgMax", "ArgMin", "NonZero"}
# Output 0 has the type of this input.
_LIKE_INPUT = {
    **dict.fromkeys((
        "Add", "Sub", "Mul", "Div", "Sum", "Max", "Min", "Mean", "MatMul", "Concat", "Mod",
        "PRelu", "Gemm", "Pow", "Relu", "Sigmoid", "Tanh", "Abs", "Neg", "Exp", "Log", "Sqrt",
        "Softmax", "LogSoftmax", "Identity", "Transpose", "Reshape", "Flatten", "Squeeze",
        "Unsqueeze", "Gather", "GatherElements", "GatherND", "Slice", "Expand", "Tile", "Pad",
        "Conv", "ConvTranspose", "MaxPool", "AveragePool", "GlobalAveragePool",
        "GlobalMaxPool", "BatchNormalization", "LayerNormalization", "Clip", "LeakyRelu", "Erf",
        "Floor", "Ceil", "Round", "Reciprocal", "Dropout", "Split", "Sin", "Cos", "Elu",
        "Selu", "HardSigmoid", "Softplus", "Gelu", "ReduceMean", "ReduceSum", "ReduceMax",
        "ReduceMin", "ReduceProd", "Resize", "DepthToSpace", "SpaceToDepth",
        "InstanceNormalization", "LRN", "BitShift", "BitwiseAnd", "BitwiseOr", "BitwiseXor",
    ), 0),
    "Where": 1, "CastLike": 1,
}


def check_types(model: Model) -> None:
    """Refuse type-parameter mismatches (see the module's doc) in every graph of ``model``."""
    _check_graph(model.graph, {})


def _known(graph: Graph, outer: dict[str, int]) -> dict[str, int]:
    types = dict(outer)
    for v in [*graph.inputs, *graph.initializers.values()]:
        elem = _elem_of(v.type)
        if elem is None and v.const_value is not None:
            elem = _array_elem(v.const_value)
        if elem is not None:
            types[v.name] = elem
    for name, tp in graph.value_info.items():
        elem = _elem_of(tp)
        if elem is not None:
            types.setdefault(name, elem)
    return types


def _check_graph(graph: Graph, outer: dict[str, int]) -> None:
    types = _known(graph, outer)
    for node in graph.nodes:
        if node.domain == "":
            _check_node(node, types)
            out = _output_elem(node, types)
            if out is not None and node.outputs and node.outputs[0].name:
                types.setdefault(node.outputs[0].name, out)
        for v in node.outputs:
            elem = _elem_of(v.type)
            if elem is not None:
                types.setdefault(v.name, elem)
        for sub in node.subgraphs():
            _check_graph(sub, types)


def _check_node(node: Node, types: dict[str, int]) -> None:
    if node.op_type not in _SAME_TYPE:
        return
    indices = _SAME_TYPE[node.op_type]
    if indices is None:
        indices = tuple(range(len(node.inputs)))
    first: int | None = None
    for i in indices:
        v = node.inputs[i] if i < len(node.inputs) else None
        elem = types.get(v.name) if v is not None else None
        if elem is None:
            continue
        if first is None:
            first = elem
        elif elem != first:
            raise InvalidGraph(
                f"type/shape inference failed: [TypeInferenceError] Type parameter (T) of Optype "
                f"({node.op_type}) bound to different types ({tensor_type_string(first)} and "
                f"{tensor_type_string(elem)}) in node ({node.label})."
            )


def _output_elem(node: Node, types: dict[str, int]) -> int | None:
    op = node.op_type
    if op in _BOOL_OUT:
        return onnx.TensorProto.BOOL
    if op in _INT64_OUT:
        return onnx.TensorProto.INT64
    if op == "Cast":
        to = node.attr("to")
        return to if isinstance(to, int) else None
    if op == "Constant":
        value = node.attr("value")
        return _array_elem(value) if isinstance(value, np.ndarray) else None
    i = _LIKE_INPUT.get(op)
    if i is None or i >= len(node.inputs) or node.inputs[i] is None:
        return None
    return types.get(node.inputs[i].name)


def _elem_of(tp: onnx.TypeProto | None) -> int | None:
    if tp is None or tp.WhichOneof("value") != "tensor_type":
        return None
    return tp.tensor_type.elem_type or None


def _array_elem(arr: np.ndarray) -> int | None:
    try:
        return elem_type(arr.dtype)
    except TypeError:
        return None
