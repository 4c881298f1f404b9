"""QDQ node groups -> integer operators, as onnxruntime's QDQSelectorActionTransformer does.

A statically quantized (QDQ) model computes in float between DequantizeLinear and QuantizeLinear:

    DQ(x) ──┐
    DQ(w) ──┼── Conv ── Q(y)          =>   QLinearConv(xq, xs, xzp, wq, ws, wzp, ys, yzp, bq)
    DQ(b) ──┘

A group whose parameters the integer operator takes becomes that operator, reading and writing
the 8-bit tensors, so 8-bit activations flow from one integer kernel to the next:

- Conv -> QLinearConv; MatMul -> QLinearMatMul; Gemm -> com.microsoft QGemm (without a Q, QGemm
  writes the float output);
- Add, Mul, Concat -> com.microsoft QLinearAdd / QLinearMul / QLinearConcat;
  GlobalAveragePool, AveragePool, Sigmoid, LeakyRelu, Softmax -> com.microsoft
  QLinearGlobalAveragePool / QLinearAveragePool / QLinearSigmoid / QLinearLeakyRelu /
  QLinearSoftmax;
- operators that only move elements (Reshape, Flatten, Transpose, Squeeze, Unsqueeze, Gather,
  Slice, Expand, Tile, MaxPool...) between a DQ and a Q of the same scale and zero point run on
  the 8-bit tensor itself, the DQ and Q dropped.

onnxruntime's rules are kept: activations (each DQ input and the Q) have constant scalar scales
and zero points, of one 8-bit type; int8 activations take int8 weights only; the operator's
output is read by its Q alone. Weights are constant: per tensor, or per output channel. A bias is
an int32 constant with zero point 0 and scale x_scale * w_scale (onnxruntime takes any int32
bias as if it had that scale; a bias of another scale leaves the group in float here), and
QLinearConv's weight zero points are all equal (onnxruntime's kernel refuses others). A DQ also
read outside the group stays for its other readers (onnxruntime copies such DQs first); the
group reads the DQ's input directly.

Before grouping, int8 activations become uint8 (onnxruntime's QDQS8ToU8Transformer): a Q whose
every reader is a DQ has both zero points moved by 128, which changes no value, and the integer
kernels' fast path multiplies uint8 activations by int8 weights.

Constant folding (basic level, run first) folds a convolution's DequantizeLinear(weight) into a
float initializer, as a session at the basic level needs; it records what it folded
(basic/constant_folding.dequantized_from), and the 8-bit weight is taken back from there.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from ...ir import Graph, Model, Node, Value
from ...proto import onnx
from ..base import EXTENDED, GraphPass, PassResult, register_pass
from ..basic.constant_folding import dequantized_from
from ..graph_utils import constant_value, is_graph_output, live_nodes, make_initializer
from ._helpers import MS, elem_type, make_node, take_over

U8, I8, I32 = np.dtype(np.uint8), np.dtype(np.int8), np.dtype(np.int32)
F32 = np.dtype(np.float32)
EIGHT_BIT = (U8, I8)
_ELEM = {onnx.TensorProto.UINT8: U8, onnx.TensorProto.INT8: I8, onnx.TensorProto.INT32: I32}

# DQ -> op -> Q with equal parameters: the op runs on the codes (onnxruntime's "drop" rules).
_DATA_MOVEMENT = {"Expand", "Flatten", "Gather", "GatherElements", "Reshape", "Slice", "Squeeze",
                  "Tile", "Transpose", "Unsqueeze"}
# ... and those that also compare elements: only for a positive scale (order kept).
_ORDER_PRESERVING = {"MaxPool"}
# One DQ input, one Q output: com.microsoft's QLinear<op> with the op's attributes.
_UNARY = {"GlobalAveragePool": ("QLinearGlobalAveragePool", ()),
          "AveragePool": ("QLinearAveragePool", ("auto_pad", "ceil_mode", "count_include_pad",
                                                 "kernel_shape", "pads", "strides")),
          "Sigmoid": ("QLinearSigmoid", ()),
          "LeakyRelu": ("QLinearLeakyRelu", ("alpha",)),
          "Softmax": ("QLinearSoftmax", ("axis",))}
_BINARY = {"Add": "QLinearAdd", "Mul": "QLinearMul"}


@dataclass
class _Quant:
    """The quantization behind a float value: a DequantizeLinear's input (``codes``), or the
    output of a QuantizeLinear, with constant scale and zero point. ``node`` is None for a
    constant that constant folding dequantized (its codes are then only ``array``)."""

    node: Node | None
    codes: Value | None
    array: np.ndarray | None  # the codes when they are constant
    scale: np.ndarray
    zero_point: np.ndarray | None
    dtype: np.dtype
    axis: int

    @property
    def per_tensor(self) -> bool:
        return self.scale.size == 1 and (self.zero_point is None or self.zero_point.size == 1)

    def same_as(self, other: _Quant) -> bool:
        """One scale and zero point, per tensor (a DQ -> op -> Q that can drop both)."""
        return (self.per_tensor and other.per_tensor and self.dtype == other.dtype
                and float(self.scale.reshape(())) == float(other.scale.reshape(()))
                and _zp(self) == _zp(other))

    def inputs(self, graph: Graph, name: str, codes: bool = True) -> list[Value]:
        """[codes,] scale, zero point as values of ``graph``, made initializers where the
        graph has none (a folded constant, an omitted zero point)."""
        if self.node is None:
            made = [make_initializer(graph, f"{name}_scale", self.scale),
                    _zero_point_value(graph, name, self)]
            return [make_initializer(graph, f"{name}_quantized", self.array), *made] if codes \
                else made
        scale = self.node.inputs[1]
        zp = self.node.inputs[2] if len(self.node.inputs) > 2 else None
        if zp is None:
            zp = _zero_point_value(graph, name, self)
        return [self.codes, scale, zp] if codes else [scale, zp]


def _zp(q: _Quant) -> int:
    return 0 if q.zero_point is None else int(q.zero_point.reshape(-1)[0])


def _zero_point_value(graph: Graph, name: str, q: _Quant) -> Value:
    zp = q.zero_point if q.zero_point is not None else np.zeros(q.scale.shape, q.dtype)
    return make_initializer(graph, f"{name}_zero_point", zp)


def _params(node: Node) -> tuple[np.ndarray, np.ndarray | None] | None:
    """A Q's or DQ's constant float32 scale and zero point (None when omitted); None when either
    is computed, or the node is blocked or not float32."""
    if node.domain != "" or node.attr("block_size", 0) or node.attr("precision", 0):
        return None
    if node.op_type == "DequantizeLinear" and node.attr("output_dtype", 0) not in (
            0, onnx.TensorProto.FLOAT):
        return None
    scale = constant_value(node.inputs[1]) if len(node.inputs) > 1 else None
    if scale is None or scale.dtype != F32:
        return None
    zp_value = node.inputs[2] if len(node.inputs) > 2 else None
    zp = constant_value(zp_value)
    if zp_value is not None and zp is None:
        return None
    return scale, zp


def _dequantized(v: Value | None, graph: Graph) -> _Quant | None:
    """What ``v`` is the dequantization of: a DequantizeLinear of this graph, or a constant that
    constant folding dequantized."""
    if v is None:
        return None
    dq = v.producer
    if dq is None:
        folded = dequantized_from(v)
        if folded is None:
            return None
        codes, scale, zp, axis = folded
        return _Quant(None, None, codes, scale, zp, codes.dtype, axis)
    if dq.op_type != "DequantizeLinear" or dq.graph is not graph:
        return None
    params = _params(dq)
    if params is None:
        return None
    scale, zp = params
    codes = constant_value(dq.inputs[0])
    dtype = zp.dtype if zp is not None else codes.dtype if codes is not None else \
        _ELEM.get(elem_type(dq.inputs[0]))
    if dtype is None:
        return None
    return _Quant(dq, dq.inputs[0], codes, scale, zp, np.dtype(dtype), dq.attr("axis", 1))


def _quantized_by(node: Node) -> _Quant | None:
    """The QuantizeLinear that alone reads ``node``'s output (which is not a graph output)."""
    out = node.outputs[0]
    if is_graph_output(out) or len(out.uses) != 1 or any(
            v.name and (v.uses or is_graph_output(v)) for v in node.outputs[1:]):
        return None
    q, index = out.uses[0]
    if q.op_type != "QuantizeLinear" or index != 0 or q.graph is not node.graph:
        return None
    params = _params(q)
    if params is None:
        return None
    scale, zp = params
    if zp is not None:
        dtype = zp.dtype
    else:
        dtype = _ELEM.get(q.attr("output_dtype", 0) or onnx.TensorProto.UINT8)
    if dtype is None:
        return None
    return _Quant(q, q.outputs[0], None, scale, zp, np.dtype(dtype), q.attr("axis", 1))


def _activation(q: _Quant | None) -> bool:
    return q is not None and q.per_tensor and q.dtype in EIGHT_BIT


def _weight(w: _Quant | None, channels: int | None, axis: int) -> bool:
    """A constant 8-bit weight, quantized per tensor or per channel along ``axis`` (which holds
    ``channels`` elements)."""
    if w is None or w.array is None or w.dtype not in EIGHT_BIT or w.array.dtype != w.dtype:
        return False
    if w.per_tensor:
        return True
    rank = w.array.ndim
    return (channels is not None and w.axis % max(rank, 1) == axis % max(rank, 1)
            and w.scale.shape == (channels,)
            and (w.zero_point is None or w.zero_point.shape == (channels,)))


def _bias(b: _Quant | None, x: _Quant, w: _Quant, channels: int | None, alpha: float = 1.0
          ) -> bool:
    """An int32 constant of zero point 0 and scale alpha * x_scale * w_scale (float32, per
    channel where the weight is): what the integer operators add to their int32 accumulators
    (QGemm scales the sum by alpha)."""
    if b is None or b.array is None or b.array.dtype != I32 or b.array.ndim != 1:
        return False
    if b.array.shape[0] not in (1, channels) or (
            b.zero_point is not None and np.any(b.zero_point)):
        return False
    scale = b.scale.reshape(-1)
    expected = np.float32(alpha) * np.float32(x.scale.reshape(())) * w.scale.reshape(-1)
    if scale.size != expected.size and 1 not in (scale.size, expected.size):
        return False
    return bool(np.allclose(scale, expected, rtol=1e-6, atol=0))


def _uniform(zp: np.ndarray | None) -> bool:
    return zp is None or zp.size <= 1 or bool(np.all(zp == zp.reshape(-1)[0]))


@register_pass
class QDQSelectorActionTransformer(GraphPass):
    name = "QDQSelectorActionTransformer"
    level = EXTENDED
    order = 4  # before QuantizeDequantizeFusion takes the Q -> DQ pairs between groups

    def run(self, model: Model) -> PassResult:
        changes: Counter = Counter()
        if (model.opset("") or 0) < 10:
            return PassResult(False, changes)
        for _, node in live_nodes(model):
            if node.op_type == "QuantizeLinear" and _activation_to_uint8(node):
                changes["int8 activation -> uint8"] += 1
        for graph, node in live_nodes(model):
            if node.domain != "":
                continue
            done = _convert(model, graph, node)
            if done:
                changes[done] += 1
        return PassResult(bool(changes), changes)


def _convert(model: Model, graph: Graph, node: Node) -> str | None:
    op = node.op_type
    if op == "Conv":
        return _conv(model, graph, node)
    if op == "MatMul":
        return _matmul(model, graph, node)
    if op == "Gemm":
        return _gemm(model, graph, node)
    if op in _BINARY:
        return _binary(model, graph, node)
    if op == "Concat":
        return _concat(model, graph, node)
    if op in _UNARY:
        return _unary(model, graph, node)
    if op in _DATA_MOVEMENT or op in _ORDER_PRESERVING:
        return _drop(model, graph, node)
    return None


# -- int8 activations -> uint8 ------------------------------------------------------------------


def _activation_to_uint8(q: Node) -> bool:
    """Q(x, s, zp: int8) -> DQ(., s', zp': int8) ... becomes the same with uint8 zero points
    zp + 128: the codes move by 128 with their zero points, every value stays."""
    out = q.outputs[0]
    params = _params(q)
    if params is None or params[1] is None or params[1].dtype != I8 or params[1].size != 1:
        return False
    if constant_value(q.inputs[0]) is not None or is_graph_output(out) or not out.uses:
        return False
    readers = [n for n, _ in out.uses]
    for n, index in out.uses:
        p = _params(n) if n.op_type == "DequantizeLinear" and index == 0 else None
        if p is None or p[1] is None or p[1].dtype != I8 or p[1].size != 1 or (
                n.graph is not q.graph):
            return False
    shifted: dict[int, Value] = {}
    for n in [q, *dict.fromkeys(readers)]:
        zp = n.inputs[2]
        if id(zp) not in shifted:
            value = (zp.const_value.astype(np.int16) + 128).astype(U8)
            shifted[id(zp)] = make_initializer(q.graph, f"{zp.name}_uint8", value)
        n.set_input(2, shifted[id(zp)])
    if out.type is not None and out.type.HasField("tensor_type"):
        t = onnx.TypeProto()
        t.CopyFrom(out.type)
        t.tensor_type.elem_type = onnx.TensorProto.UINT8
        out.type = t
    return True


# -- the groups ----------------------------------------------------------------------------------


def _replace(graph: Graph, target: Node, q: _Quant | None, new: Node,
             inputs: list[_Quant]) -> None:
    """``new`` takes the place of ``target`` and its Q (writing the Q's output, or the
    target's when there is no Q); DQs nobody reads any more go."""
    take_over(new, 0, q.codes if q is not None else target.outputs[0])
    new.graph = graph
    graph.nodes.insert(graph.nodes.index(target), new)
    if q is not None:
        graph.remove(q.node)
    graph.remove(target)
    _remove_unread(graph, inputs)


def _remove_unread(graph: Graph, inputs: list[_Quant]) -> None:
    for dq in dict.fromkeys(i.node for i in inputs if i.node is not None):
        if dq.graph is graph and not dq.outputs[0].uses and not is_graph_output(dq.outputs[0]):
            graph.remove(dq)


def _conv(model: Model, graph: Graph, node: Node) -> str | None:
    if len(node.inputs) < 2:
        return None
    x, y = _dequantized(node.inputs[0], graph), _quantized_by(node)
    if not (_activation(x) and _activation(y)) or x.dtype != y.dtype:
        return None
    w = _dequantized(node.inputs[1], graph)
    channels = w.array.shape[0] if w is not None and w.array is not None and w.array.ndim else None
    if not _weight(w, channels, 0) or w.array.ndim < 3 or not _uniform(w.zero_point):
        return None
    if x.dtype == I8 and w.dtype != I8:
        return None
    b = _dequantized(node.inputs[2], graph) if len(node.inputs) > 2 else None
    if b is None and len(node.inputs) > 2 and node.inputs[2] is not None:
        return None
    if b is not None and not (_bias(b, x, w, channels) and b.array.shape == (channels,)):
        return None
    name = node.label
    inputs = [*x.inputs(graph, f"{name}_x"), *w.inputs(graph, f"{name}_w"),
              *y.inputs(graph, f"{name}_y", codes=False)]
    if b is not None:
        inputs.append(b.inputs(graph, f"{name}_b")[0])
    new = make_node(graph, model, "QLinearConv", inputs, name=f"{name}_quant",
                    **node.attributes)
    _replace(graph, node, y, new, [x, w, *([b] if b else [])])
    return "Conv -> QLinearConv"


def _matmul(model: Model, graph: Graph, node: Node) -> str | None:
    a, y = _dequantized(node.inputs[0], graph), _quantized_by(node)
    if not (_activation(a) and _activation(y)) or a.dtype != y.dtype:
        return None
    b = _dequantized(node.inputs[1], graph)
    # B per tensor, or a constant (K, N) per column
    columns = b.array.shape[-1] if b is not None and b.array is not None and \
        b.array.ndim == 2 else None
    if not (_activation(b) or _weight(b, columns, 1)):
        return None
    if a.dtype == I8 and b.dtype != I8:
        return None
    name = node.label
    inputs = [*a.inputs(graph, f"{name}_a"), *b.inputs(graph, f"{name}_b"),
              *y.inputs(graph, f"{name}_y", codes=False)]
    new = make_node(graph, model, "QLinearMatMul", inputs, name=f"{name}_quant")
    _replace(graph, node, y, new, [a, b])
    return "MatMul -> QLinearMatMul"


def _gemm(model: Model, graph: Graph, node: Node) -> str | None:
    a, b = _dequantized(node.inputs[0], graph), _dequantized(node.inputs[1], graph)
    if not _activation(a):
        return None
    trans_b = node.attr("transB", 0)
    columns = None
    if b is not None and b.array is not None and b.array.ndim == 2:
        columns = b.array.shape[0 if trans_b else 1]
    if not (_activation(b) or _weight(b, columns, 0 if trans_b else 1)):
        return None
    if a.dtype == I8 and b.dtype != I8:
        return None
    out = node.outputs[0]
    y = _quantized_by(node)
    if y is None:  # no Q at all: QGemm writes the float output
        if any(n.op_type == "QuantizeLinear" for n, _ in out.uses) or elem_type(out) not in (
                None, onnx.TensorProto.FLOAT):
            return None
    elif not _activation(y) or y.dtype != a.dtype:
        return None
    c = None
    if len(node.inputs) > 2 and node.inputs[2] is not None:
        c = _dequantized(node.inputs[2], graph)
        alpha = node.attr("alpha", 1.0)
        if c is None or not _bias(c, a, b, columns, alpha) or node.attr("beta", 1.0) != 1.0:
            return None
    name = node.label
    inputs: list[Value | None] = [*a.inputs(graph, f"{name}_a"), *b.inputs(graph, f"{name}_b")]
    if c is not None or y is not None:
        inputs.append(c.inputs(graph, f"{name}_c")[0] if c is not None else None)
    if y is not None:
        inputs += y.inputs(graph, f"{name}_y", codes=False)
    attrs = {k: node.attributes[k] for k in ("alpha", "transA", "transB")
             if k in node.attributes}
    new = make_node(graph, model, "QGemm", inputs, domain=MS, name=f"{name}_quant", **attrs)
    _replace(graph, node, y, new, [a, b, *([c] if c else [])])
    return "Gemm -> QGemm"


def _binary(model: Model, graph: Graph, node: Node) -> str | None:
    a, b = _dequantized(node.inputs[0], graph), _dequantized(node.inputs[1], graph)
    y = _quantized_by(node)
    if not (_activation(a) and _activation(b) and _activation(y)):
        return None
    if not a.dtype == b.dtype == y.dtype:
        return None
    name = node.label
    inputs = [*a.inputs(graph, f"{name}_a"), *b.inputs(graph, f"{name}_b"),
              *y.inputs(graph, f"{name}_y", codes=False)]
    op = _BINARY[node.op_type]
    new = make_node(graph, model, op, inputs, domain=MS, name=f"{name}_quant")
    _replace(graph, node, y, new, [a, b])
    return f"{node.op_type} -> {op}"


def _concat(model: Model, graph: Graph, node: Node) -> str | None:
    xs, y = [_dequantized(v, graph) for v in node.inputs], _quantized_by(node)
    if not _activation(y) or not all(_activation(x) and x.dtype == y.dtype for x in xs):
        return None
    name = node.label
    inputs = y.inputs(graph, f"{name}_y", codes=False)
    for i, x in enumerate(xs):
        inputs += x.inputs(graph, f"{name}_x{i}")
    new = make_node(graph, model, "QLinearConcat", inputs, domain=MS, name=f"{name}_quant",
                    axis=node.attributes["axis"])
    _replace(graph, node, y, new, xs)
    return "Concat -> QLinearConcat"


def _unary(model: Model, graph: Graph, node: Node) -> str | None:
    x, y = _dequantized(node.inputs[0], graph), _quantized_by(node)
    if not (_activation(x) and _activation(y)) or x.dtype != y.dtype:
        return None
    op, attr_names = _UNARY[node.op_type]
    if node.op_type == "AveragePool" and any(d != 1 for d in node.attr("dilations", [])):
        return None  # QLinearAveragePool has no dilations
    attrs = {k: node.attributes[k] for k in attr_names if k in node.attributes}
    if node.op_type == "GlobalAveragePool":
        attrs["channels_last"] = 0
    if node.op_type == "Softmax":  # which Softmax: rows of the flattened 2-D (before 13) or an axis
        attrs["opset"] = 13 if (model.node_opset(node) or 0) >= 13 else 1
    name = node.label
    inputs = [*x.inputs(graph, f"{name}_x"), *y.inputs(graph, f"{name}_y", codes=False)]
    new = make_node(graph, model, op, inputs, domain=MS, name=f"{name}_quant", **attrs)
    _replace(graph, node, y, new, [x])
    return f"{node.op_type} -> {op}"


def _drop(model: Model, graph: Graph, node: Node) -> str | None:
    """DQ -> op -> Q of one scale and zero point: the op reads the DQ's input and writes the
    Q's output."""
    x, y = _dequantized(node.inputs[0], graph), _quantized_by(node)
    if x is None or x.node is None or y is None or not _activation(x) or not x.same_as(y):
        return None
    if any(_dequantized(v, graph) is not None for v in node.inputs[1:]):
        return None
    if node.op_type in _ORDER_PRESERVING:
        if float(x.scale.reshape(())) <= 0 or (model.node_opset(node) or 0) < 12:
            return None  # a negative scale reverses the order; 8-bit MaxPool since opset 12
    node.set_input(0, x.codes)
    old = node.outputs[0]
    take_over(node, 0, y.codes)
    old.producer = None
    graph.remove(y.node)
    _remove_unread(graph, [x])
    return f"{node.op_type} on 8 bits"
