"""The QOperator format: quantized operators that read and write 8-bit tensors.

Nodes are rewritten in topological order. A tensor that a quantized operator needs is quantized
once (a QuantizeLinear, or an initializer stored quantized) and then passed along in its
quantized form; a float consumer (an operator left float, a graph output, a subgraph) gets it
back through a DequantizeLinear placed just before its first use. Conv -> QLinearConv, MatMul ->
QLinearMatMul, Gemm -> QGemm, Add/Mul -> QLinearAdd/QLinearMul, pooling, Concat, Softmax,
Sigmoid, LeakyRelu -> their com.microsoft QLinear forms; data-movement operators run on the
quantized tensor unchanged, and a Relu or Clip after a quantized tensor folds into its
producer's output range. Dynamic quantization (``dynamic.py``) reuses this walk with its own
operator set.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from onnx import ModelProto, NodeProto, TensorProto

from .base import (
    MS_DOMAIN,
    QuantizerBase,
    QValue,
    attributes,
    subgraph_references,
    weight_axis,
)
from .quant_types import quantize_nparray

Handler = Callable[["OperatorQuantizer", NodeProto], bool]

DIRECT_8BIT = {"Reshape", "Squeeze", "Unsqueeze", "Flatten", "Transpose", "MaxPool", "Resize",
               "Split", "Gather", "Pad", "ArgMax"}
QLINEAR_OPS = {"Conv", "Gemm", "MatMul", "Add", "Mul", "Relu", "Clip", "LeakyRelu", "Sigmoid",
               "MaxPool", "GlobalAveragePool", "Split", "Pad", "Reshape", "Squeeze", "Unsqueeze",
               "Flatten", "Resize", "AveragePool", "Concat", "Softmax", "Where", "ArgMax",
               "Gather", "Transpose", "EmbedLayerNormalization"}


def _copy_attrs(node: NodeProto, drop: tuple[str, ...] = ()) -> dict:
    return {k: v for k, v in attributes(node).items() if k not in drop}


class OperatorQuantizer(QuantizerBase):
    """Rewrites nodes into quantized operators, tracking each tensor's quantized form."""

    handlers: dict[str, Handler] = {}

    def __init__(self, *args, static: bool = True, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.static = static
        self.qmap: dict[str, QValue] = {}  # float tensor -> its quantized form
        self.replaced: set[str] = set()  # float tensors no longer computed as such
        self.dequantized: set[str] = set()
        self.out: list[NodeProto] = []

    # -- tensors ------------------------------------------------------------------------------

    def can_quantize(self, name: str) -> bool:
        """Whether ``name`` has (or can get) a quantized form."""
        if name in self.qmap or self.is_float_weight(name):
            return True
        return self.static and self.is_float(name) and self.tensor_range(name) is not None

    def quantize_input(self, name: str, weight: bool = False, axis: int | None = None
                       ) -> QValue | None:
        """The quantized form of ``name``: a weight stored quantized, or a QuantizeLinear."""
        if name in self.qmap:
            return self.qmap[name]
        if self.is_float_weight(name):
            if weight:
                return self.quantize_weight(name, axis=axis)
            # onnxruntime: symmetric like a weight when both types agree
            sym = self.weight_symmetric if self.activation_qtype == self.weight_qtype \
                else self.activation_symmetric
            return self.quantize_weight(name, self.activation_qtype, reduce_range=False,
                                        symmetric=sym)
        qv = self.activation_qvalue(name) if self.static else None
        if qv is None:
            return None
        q = self.unique(f"{name}_quantized")
        self.out.append(self.make_node("QuantizeLinear", [name, qv.scale, qv.zero_point], [q],
                                       f"{name}_QuantizeLinear"))
        qv = QValue(q, qv.scale, qv.zero_point, qv.qtype, qv.scale_value, qv.zp_value)
        self.qmap[name] = qv
        return qv

    def set_output(self, name: str, qv: QValue) -> str:
        """Record that ``name`` is now produced quantized (as ``qv.name``)."""
        self.qmap[name] = qv
        self.replaced.add(name)
        return qv.name

    def output_qvalue(self, name: str, fixed=None) -> QValue | None:
        """A fresh quantized name for output ``name`` with its calibrated parameters."""
        p = self.activation_qvalue(name, fixed=fixed)
        if p is None:
            return None
        return QValue(self.unique(f"{name}_quantized"), p.scale, p.zero_point, p.qtype,
                      p.scale_value, p.zp_value)

    def need_float(self, name: str) -> None:
        """Make the float value of ``name`` exist again (DequantizeLinear) if it was replaced."""
        if name in self.replaced and name not in self.dequantized:
            qv = self.qmap[name]
            self.out.append(self.make_node("DequantizeLinear", [qv.name, qv.scale, qv.zero_point],
                                           [name], f"{name}_DequantizeLinear",
                                           axis=qv.axis if qv.axis is not None else None))
            self.dequantized.add(name)

    def float_weight(self, name: str) -> None:
        """A float consumer of a weight this quantizer stored quantized reads it through a
        DequantizeLinear (onnxruntime's tool drops the float copy the same way)."""
        if name not in self.weight_axis_attr or name in self.dequantized or self.static:
            return
        qv, axis = self.weight_axis_attr[name]
        self.out.append(self.make_node("DequantizeLinear", [qv.name, qv.scale, qv.zero_point],
                                       [name], f"{name}_DequantizeLinear",
                                       axis=axis if np.asarray(qv.scale_value).size > 1
                                       else None))
        self.dequantized.add(name)

    def keep_float(self, node: NodeProto) -> None:
        for i in node.input:
            self.need_float(i)
            self.float_weight(i)
        for r in _outer(node):
            self.need_float(r)
        self.out.append(node)

    # -- the walk -----------------------------------------------------------------------------

    def adjust_tensor_ranges(self) -> None:
        """A Relu/Clip's only input takes its output's range; Softmax outputs lie in [0, 1]."""
        if self.tensors_range is None:
            return
        for node in self.nodes:
            if not self.should_quantize_node(node):
                continue
            if node.op_type in ("Relu", "Clip"):
                src = node.input[0]
                if len(self.consumers.get(src, ())) == 1 and src not in self.graph_outputs \
                        and node.output[0] in self.tensors_range and src in self.tensors_range:
                    self.tensors_range[src] = self.tensors_range[node.output[0]]
            elif node.op_type == "Softmax":
                self.set_range(node.output[0], 0.0, 1.0)

    def prepare(self) -> None:
        """Rewrites before the walk (the dynamic quantizer turns Gemm into MatMul + Add)."""

    def quantize_model(self) -> ModelProto:
        self.prepare()
        self.adjust_tensor_ranges()
        for node in self.nodes:
            handler = self.handlers.get(node.op_type)
            done = False
            if handler is not None and self.should_quantize_node(node):
                done = handler(self, node)
            if not done:
                self.keep_float(node)
        for name in self.graph.output:
            self.need_float(name.name)
        return self.finish(self.out)

    # -- helpers for handlers -----------------------------------------------------------------

    def simple_qlinear(self, node: NodeProto, op_type: str, inputs: list[int], domain: str,
                       fixed=None, **attrs) -> bool:
        """``op_type(x, x_scale, x_zp, ..., y_scale, y_zp)`` over the quantized inputs."""
        if not all(self.can_quantize(node.input[i]) for i in inputs):
            return False
        y = self.output_qvalue(node.output[0], fixed)
        if y is None:
            return False
        args: list[str] = []
        for i in inputs:
            q = self.quantize_input(node.input[i])
            if q is None:
                return False
            args += [q.name, q.scale, q.zero_point]
        self.out.append(self.make_node(op_type, [*args, y.scale, y.zero_point],
                                       [self.set_output(node.output[0], y)],
                                       f"{node.name}_quant" if node.name else "",
                                       domain=domain, **attrs))
        return True


def _outer(node: NodeProto) -> set[str]:
    return subgraph_references(node) if any(a.HasField("g") or len(a.graphs)
                                            for a in node.attribute) else set()


def register(registry: dict[str, Handler], *op_types: str):
    def deco(fn: Handler) -> Handler:
        for t in op_types:
            registry[t] = fn
        return fn
    return deco


QLINEAR: dict[str, Handler] = {}


@register(QLINEAR, "Conv")
def _conv(self: OperatorQuantizer, node: NodeProto) -> bool:
    x, w = node.input[0], node.input[1]
    if not (self.can_quantize(x) and self.is_float_weight(w)):
        return False
    bias = node.input[2] if len(node.input) > 2 and node.input[2] else None
    if bias is not None and not self.is_float_weight(bias):
        return False
    y = self.output_qvalue(node.output[0])
    if y is None:
        return False
    xq = self.quantize_input(x)
    floor = self.bias_weight_floor(bias, xq.scale_value, self.per_channel) if bias else None
    if self.per_channel:  # int8 per channel, whatever weight_type: onnxruntime's QLinearConv
        wq = self.quantize_weight(w, TensorProto.INT8, axis=0, min_scale=floor,
                                  symmetric=bool(self.extra.get("WeightSymmetric", True)))
    else:
        wq = self.quantize_weight(w, min_scale=floor, symmetric=self.weight_symmetric)
    inputs = [xq.name, xq.scale, xq.zero_point, wq.name, wq.scale, wq.zero_point, y.scale,
              y.zero_point]
    if bias is not None:
        bq = self.quantize_bias(bias, xq.scale_value, wq)
        if bq is None:
            return False
        inputs.append(bq.name)
    self.out.append(self.make_node("QLinearConv", inputs, [self.set_output(node.output[0], y)],
                                   f"{node.name}_quant" if node.name else "",
                                   **_copy_attrs(node)))
    return True


@register(QLINEAR, "MatMul")
def _matmul(self: OperatorQuantizer, node: NodeProto) -> bool:
    a, b = node.input
    if self.matmul_const_b_only and not self.is_initializer(b):
        return False
    if not (self.can_quantize(a) and self.can_quantize(b)):
        return False
    y = self.output_qvalue(node.output[0])
    if y is None:
        return False
    aq = self.quantize_input(a)
    if self.is_float_weight(b):
        axis = weight_axis(node, 1, self.array(b).ndim) if self.per_channel else None
        bq = self.quantize_weight(b, axis=axis, symmetric=self.weight_symmetric)
    else:
        bq = self.quantize_input(b)
    self.out.append(self.make_node(
        "QLinearMatMul", [aq.name, aq.scale, aq.zero_point, bq.name, bq.scale, bq.zero_point,
                          y.scale, y.zero_point],
        [self.set_output(node.output[0], y)], f"{node.name}_quant" if node.name else "",
        # float 8 weights: onnxruntime's quantizer writes com.microsoft's QLinearMatMul (no
        # runtime defines it; the default domain's accepts float 8 only from opset 21)
        domain=MS_DOMAIN if self.weight_qtype == TensorProto.FLOAT8E4M3FN else ""))
    return True


@register(QLINEAR, "Gemm")
def _gemm(self: OperatorQuantizer, node: NodeProto) -> bool:
    attrs = attributes(node)
    a, b = node.input[0], node.input[1]
    c = node.input[2] if len(node.input) > 2 and node.input[2] else None
    if not (self.can_quantize(a) and self.is_float_weight(b)) or attrs.get("alpha", 1.0) != 1.0:
        return False
    if c is not None and not (self.is_float_weight(c) and self.array(c).ndim == 1):
        return False
    y = self.output_qvalue(node.output[0])
    if y is None:
        return False
    aq = self.quantize_input(a)
    axis = weight_axis(node, 1, 2) if self.per_channel else None
    floor = self.bias_weight_floor(c, aq.scale_value, self.per_channel) if c else None
    bq = self.quantize_weight(b, axis=axis, min_scale=floor, symmetric=self.weight_symmetric)
    inputs = [aq.name, aq.scale, aq.zero_point, bq.name, bq.scale, bq.zero_point]
    if c is not None:
        cq = self.quantize_bias(c, aq.scale_value, bq, float(attrs.get("beta", 1.0)))
        if cq is None:
            return False
        inputs.append(cq.name)
    else:
        inputs.append("")
    inputs += [y.scale, y.zero_point]
    self.out.append(self.make_node(
        "QGemm", inputs, [self.set_output(node.output[0], y)],
        f"{node.name}_quant" if node.name else "", domain=MS_DOMAIN,
        **_copy_attrs(node, ("beta",))))
    return True


@register(QLINEAR, "Add", "Mul")
def _binary(self: OperatorQuantizer, node: NodeProto) -> bool:
    return self.simple_qlinear(node, f"QLinear{node.op_type}", [0, 1], MS_DOMAIN)


@register(QLINEAR, "Relu", "Clip")
def _relu(self: OperatorQuantizer, node: NodeProto) -> bool:
    """Folded into the producer: its output range was set to this node's (adjust_tensor_ranges)."""
    src = node.input[0]
    if src not in self.qmap or self.activation_symmetric or src in self.graph_outputs \
            or src in self.outer_refs or len(self.consumers.get(src, ())) != 1 \
            or self.tensor_range(node.output[0]) is None:
        return False
    self.set_output(node.output[0], self.qmap[src])
    return True


@register(QLINEAR, "Sigmoid", "LeakyRelu")
def _activation(self: OperatorQuantizer, node: NodeProto) -> bool:
    return self.simple_qlinear(node, f"QLinear{node.op_type}", [0], MS_DOMAIN,
                               **_copy_attrs(node))


@register(QLINEAR, "Softmax")
def _softmax(self: OperatorQuantizer, node: NodeProto) -> bool:
    zp = 0 if self.activation_qtype == TensorProto.UINT8 else -128
    return self.simple_qlinear(node, "QLinearSoftmax", [0], MS_DOMAIN, fixed=(1 / 256.0, zp),
                               opset=self.opset, **_copy_attrs(node))


@register(QLINEAR, "Where")
def _where(self: OperatorQuantizer, node: NodeProto) -> bool:
    """QLinearWhere when both branches are quantized (or ForceQuantizeNoInputCheck)."""
    x, y = node.input[1], node.input[2]
    if not self.force_no_input_check and not (x in self.qmap and y in self.qmap):
        return False
    if not (self.can_quantize(x) and self.can_quantize(y)):
        return False
    out = self.output_qvalue(node.output[0])
    if out is None:
        return False
    xq, yq = self.quantize_input(x), self.quantize_input(y)
    if xq is None or yq is None:
        return False
    self.need_float(node.input[0])
    self.out.append(self.make_node(
        "QLinearWhere", [node.input[0], xq.name, xq.scale, xq.zero_point, yq.name, yq.scale,
                         yq.zero_point, out.scale, out.zero_point],
        [self.set_output(node.output[0], out)], f"{node.name}_quant" if node.name else "",
        domain=MS_DOMAIN))
    return True


@register(QLINEAR, "GlobalAveragePool")
def _global_average_pool(self: OperatorQuantizer, node: NodeProto) -> bool:
    if node.input[0] not in self.qmap:  # onnxruntime: only after a quantized producer
        return False
    return self.simple_qlinear(node, "QLinearGlobalAveragePool", [0], MS_DOMAIN, channels_last=0)


@register(QLINEAR, "AveragePool")
def _average_pool(self: OperatorQuantizer, node: NodeProto) -> bool:
    return self.simple_qlinear(node, "QLinearAveragePool", [0], MS_DOMAIN, **_copy_attrs(node))


@register(QLINEAR, "Concat")
def _concat(self: OperatorQuantizer, node: NodeProto) -> bool:
    if not all(self.can_quantize(i) for i in node.input):
        return False
    y = self.output_qvalue(node.output[0])
    if y is None:
        return False
    args = [y.scale, y.zero_point]
    for i in node.input:
        q = self.quantize_input(i)
        args += [q.name, q.scale, q.zero_point]
    self.out.append(self.make_node("QLinearConcat", args, [self.set_output(node.output[0], y)],
                                   f"{node.name}_quant" if node.name else "", domain=MS_DOMAIN,
                                   **_copy_attrs(node)))
    return True


def direct_8bit(self: OperatorQuantizer, node: NodeProto) -> bool:
    """Data movement on the quantized tensor, which keeps its input's parameters."""
    src = node.input[0]
    op = node.op_type
    if op == "MaxPool" and (self.opset < 12 or (len(node.output) > 1 and node.output[1])):
        return False
    if op == "Resize" and self.opset < 11:
        return False
    if src not in self.qmap:
        if not ((self.force_no_input_check and self.can_quantize(src)) or
                (op == "Gather" and self.is_float_weight(src) and self.static)):
            return False
    inputs = list(node.input)
    if op == "Pad":
        mode = attributes(node).get("mode", b"constant")
        mode = mode.decode() if isinstance(mode, bytes) else mode
        if self.opset < 11:
            return False
        value = inputs[2] if mode == "constant" and len(inputs) > 2 and inputs[2] else None
        if value is not None and not (self.is_float_weight(value) or self.is_float(value)):
            return False
    qv = self.quantize_input(src)
    if qv is None:
        return False
    inputs[0] = qv.name
    if op == "Pad" and mode == "constant":
        while len(inputs) < 3:
            inputs.append("")
        if value is None or (self.is_float_weight(value) and not np.any(self.array(value))):
            inputs[2] = qv.zero_point  # zero pads as the zero point
        elif self.is_float_weight(value):  # the constant on the input's scale
            inputs[2] = self.add_initializer(f"{value}_quantized", quantize_nparray(
                qv.qtype, self.array(value), qv.scale_value, qv.zp_value))
        else:  # a padding value fed at run time, quantized with the input's parameters
            self.need_float(value)
            inputs[2] = self.unique(f"{value}_quantized")
            self.out.append(self.make_node("QuantizeLinear", [value, qv.scale, qv.zero_point],
                                           [inputs[2]], f"{value}_QuantizeLinear"))
    node.input[:] = inputs
    if op == "ArgMax":
        self.out.append(node)
        return True
    outs = range(len(node.output)) if op == "Split" else range(1)
    for k in outs:
        o = node.output[k]
        if not o:
            continue
        node.output[k] = self.set_output(o, QValue(self.unique(f"{o}_quantized"), qv.scale,
                                                   qv.zero_point, qv.qtype, qv.scale_value,
                                                   qv.zp_value, qv.axis))
    self.out.append(node)
    return True


for _t in DIRECT_8BIT:
    QLINEAR[_t] = direct_8bit

OperatorQuantizer.handlers = QLINEAR

__all__ = ["DIRECT_8BIT", "OperatorQuantizer", "QLINEAR", "QLINEAR_OPS", "direct_8bit",
           "register"]
