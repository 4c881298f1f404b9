"""Dynamic quantization: weights stored as 8-bit integers, activations quantized at run time.

The graph written is onnxruntime's tool's (an engine that fuses the patterns, as onnxruntime
does into DynamicQuantizeMatMul / MatMulIntegerToFloat, runs them as one kernel):

- MatMul with a constant B (and Gemm, first rewritten as MatMul + Add):
  ``DynamicQuantizeLinear(A) -> MatMulInteger(A_q, B_q, A_zp, B_zp) -> Cast -> Mul(A_s * B_s)``,
  one DynamicQuantizeLinear per input however many MatMuls read it;
- Conv: the same around ``ConvInteger``, then the bias added;
- LSTM: ``DynamicQuantizeLSTM`` (com.microsoft) with its W and R quantized per direction (per
  gate row with ``per_channel``);
- Gather of a constant table (embeddings): the table stored quantized, a DequantizeLinear after.

With ``per_channel``, MatMul weights get one scale per output column and Conv weights one per
output channel (symmetric weights: the zero point stays a scalar 0, which every ConvInteger
implementation accepts), embedding tables one per hidden unit.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from onnx import ModelProto, NodeProto, TensorProto, helper

from .base import MS_DOMAIN, QValue, attributes, ensure_opset, load_model, save_model
from .qoperator import DIRECT_8BIT, OperatorQuantizer, direct_8bit, register
from .quant_types import QuantType, quantize_data

INTEGER_OPS = {"Conv", "MatMul", "Attention", "LSTM", "Gather", "Transpose",
               "EmbedLayerNormalization"}
INTEGER: dict[str, Any] = {}


class DynamicQuantizer(OperatorQuantizer):
    """IntegerOps quantization: no calibration, activations quantized by the graph."""

    def __init__(self, *args, **kwargs) -> None:
        self.strict_types = bool(kwargs.pop("strict_types", False))
        super().__init__(*args, static=False, **kwargs)
        self.dynamic_inputs: dict[str, tuple[str, str, str]] = {}

    handlers = INTEGER

    def prepare(self) -> None:
        """Gemm (alpha = beta = 1, A not transposed, constant B) -> MatMul (+ Add), as
        onnxruntime's tool does before a dynamic quantization."""
        rewritten: list[NodeProto] = []
        for node in self.nodes:
            if node.op_type == "Gemm" and self._gemm_as_matmul(node, rewritten):
                continue
            rewritten.append(node)
        self.nodes = rewritten

    def _gemm_as_matmul(self, node: NodeProto, out: list[NodeProto]) -> bool:
        a = attributes(node)
        b = node.input[1]
        if a.get("alpha", 1.0) != 1.0 or a.get("beta", 1.0) != 1.0 or a.get("transA", 0) \
                or not self.is_float_weight(b) or self.array(b).ndim != 2:
            return False
        probe = helper.make_node("MatMul", [], [], node.name or None)
        if not self.should_quantize_node(probe):
            return False
        if a.get("transB", 0):
            b = self.add_initializer(f"{b}_Transposed", np.ascontiguousarray(self.array(b).T))
        has_c = len(node.input) > 2 and bool(node.input[2])
        y = node.output[0]
        mm_out = self.unique(f"{y}_MatMul_output") if has_c else y
        mm = helper.make_node("MatMul", [node.input[0], b], [mm_out], node.name or None)
        out.append(mm)
        self.producer[mm_out] = mm
        if has_c:
            add = helper.make_node("Add", [mm_out, node.input[2]], [y],
                                   self.unique(f"{node.name or y}_Add"))
            out.append(add)
            self.producer[y] = add
            self.consumers[mm_out] = [add]
        return True

    def activation_type_of(self, name: str) -> int:
        """A tensor's element type; an untyped one (shape inference stopped at an operator it
        does not know) is float, or ``DefaultTensorType``; ``strict_types`` (onnxruntime's
        ONNXQuantizer) refuses it without that option, as onnxruntime does."""
        if name in self.value_types:
            return self.value_types[name]
        if "DefaultTensorType" in self.extra:
            return int(self.extra["DefaultTensorType"])
        if self.strict_types:
            raise RuntimeError(f"Unable to find data type for weight_name={name!r}: shape "
                               "inference could not type it; set extra_options "
                               "'DefaultTensorType' (e.g. onnx.TensorProto.FLOAT)")
        return TensorProto.FLOAT

    def dynamic_quantize(self, name: str) -> tuple[str, str, str]:
        """``DynamicQuantizeLinear(name)`` once per tensor: (quantized, scale, zero point)."""
        if name not in self.dynamic_inputs:
            self.need_float(name)
            src = name
            if self.value_types.get(name) == TensorProto.FLOAT16:
                # DynamicQuantizeLinear reads float32 only: a float16 model casts first
                src = self.unique(f"{name}_float32")
                self.out.append(self.make_node("Cast", [name], [src], f"{name}_Cast",
                                               to=TensorProto.FLOAT))
            outs = [self.unique(f"{name}_quantized"), self.unique(f"{name}_scale"),
                    self.unique(f"{name}_zero_point")]
            self.out.append(self.make_node("DynamicQuantizeLinear", [src], outs,
                                           f"{name}_QuantizeLinear"))
            self.dynamic_inputs[name] = (outs[0], outs[1], outs[2])
        return self.dynamic_inputs[name]

    def integer_output(self, op_type: str, inputs: list[str], output: str, w: QValue,
                       x_scale: str, channel_shape: list[int] | None, bias: str | None,
                       name: str, float_type: int = TensorProto.FLOAT, **attrs: Any) -> None:
        """``op_type`` in int32, then Cast to float, times x_scale * w_scale, (in a float16
        model, Cast to float16), + bias."""
        acc = self.unique(f"{output}_output_quantized")
        self.out.append(self.make_node(op_type, inputs, [acc], f"{name}_quant", **attrs))
        cast = self.unique(f"{output}_output_quantized_cast_output")
        self.out.append(self.make_node("Cast", [acc], [cast], f"{output}_cast",
                                       to=TensorProto.FLOAT))
        w_scale = w.scale
        ws = np.asarray(w.scale_value)
        reshape = channel_shape is not None and ws.size > 1
        if reshape or ws.dtype != np.float32:  # the scales are multiplied in float32
            w_scale = self.add_initializer(f"{w.scale}_reshaped" if reshape else
                                           f"{w.scale}_float32",
                                           (ws.reshape(channel_shape) if reshape else ws
                                            ).astype(np.float32))
        scales = self.unique(f"{output}_scales_mul_output")
        self.out.append(self.make_node("Mul", [x_scale, w_scale], [scales],
                                       f"{output}_scales_mul"))
        target = self.unique(f"{output}_scaled") if bias else output
        narrow = float_type != TensorProto.FLOAT
        scaled = self.unique(f"{output}_scaled_float32") if narrow else target
        self.out.append(self.make_node("Mul", [cast, scales], [scaled],
                                       f"{output}_output_scale_mul"))
        if narrow:
            self.out.append(self.make_node("Cast", [scaled], [target], f"{output}_cast_back",
                                           to=float_type))
        if bias:
            self.out.append(self.make_node("Add", [target, bias], [output], f"{output}_bias_add"))


@register(INTEGER, "MatMul")
def _matmul(self: DynamicQuantizer, node: NodeProto) -> bool:
    a, b = node.input
    if not self.is_float_weight(b) or self.activation_type_of(a) != TensorProto.FLOAT:
        return False
    w = self.quantize_weight(b, axis=-1 if self.per_channel else None,
                             symmetric=self.weight_symmetric)
    xq, xs, xzp = self.dynamic_quantize(a)
    self.integer_output("MatMulInteger", [xq, w.name, xzp, w.zero_point], node.output[0], w, xs,
                        None, None, node.name or node.output[0])
    return True


@register(INTEGER, "Conv")
def _conv(self: DynamicQuantizer, node: NodeProto) -> bool:
    x, wname = node.input[0], node.input[1]
    # float16 too, as onnxruntime's tool: DynamicQuantizeLinear takes float16 since opset 19
    float_type = self.value_types.get(x, TensorProto.FLOAT)
    if not self.is_float_weight(wname) or float_type not in (TensorProto.FLOAT,
                                                             TensorProto.FLOAT16):
        return False
    bias = node.input[2] if len(node.input) > 2 and node.input[2] else None
    if bias is not None and not self.is_float_weight(bias):
        return False
    # ConvInteger takes one zero point: per channel only with symmetric weights (zero point 0)
    per_channel = self.per_channel and bool(self.weight_symmetric)
    w = self.quantize_weight(wname, axis=0 if per_channel else None,
                             symmetric=self.weight_symmetric)
    zp = w.zero_point
    rank = self.array(wname).ndim
    if per_channel:
        zp = self.add_initializer(f"{wname}_zero_point_scalar", np.zeros((), w.zp_value.dtype))
    xq, xs, xzp = self.dynamic_quantize(x)
    bias_name = None
    if bias is not None:
        b = self.array(bias)
        bias_name = self.add_initializer(f"{bias}_reshaped",
                                         b.reshape((1, -1) + (1,) * (rank - 2)))
    self.integer_output("ConvInteger", [xq, w.name, xzp, zp], node.output[0], w, xs,
                        [1, -1] + [1] * (rank - 2), bias_name, node.name or node.output[0],
                        float_type=float_type, **attributes(node))
    return True


@register(INTEGER, "LSTM")
def _lstm(self: DynamicQuantizer, node: NodeProto) -> bool:
    W, R = node.input[1], node.input[2]
    attrs = attributes(node)
    if not (self.is_float_weight(W) and self.is_float_weight(R)) or attrs.get("layout", 0):
        return False
    Wa, Ra = self.array(W), self.array(R)
    if Wa.ndim != 3 or Ra.ndim != 3:
        return False
    ins = list(node.input) + [""] * (8 - len(node.input))
    params = []
    for name, arr in ((W, Wa), (R, Ra)):
        D, G, K = arr.shape
        # per direction, or per gate row with per_channel; always int8, symmetric
        flat = arr.reshape(D * G, K) if self.per_channel else arr
        zp, scale, q = quantize_data(flat, TensorProto.INT8, True, self.reduce_range,
                                     self.min_real_range, axis=0)
        shape = [D, G] if self.per_channel else [D]
        q = np.ascontiguousarray(q.reshape(D, G, K).transpose(0, 2, 1))  # [D, K, 4H]
        params.append((self.add_initializer(f"{name}_quantized", q),
                       self.add_initializer(f"{name}_scale", scale.reshape(shape)),
                       self.add_initializer(f"{name}_zero_point", zp.reshape(shape))))
    (wq, ws, wz), (rq, rs, rz) = params
    for i in (0, 3, 4, 5, 6, 7):
        if ins[i]:
            self.need_float(ins[i])
    inputs = [ins[0], wq, rq, *ins[3:8], ws, wz, rs, rz]
    self.out.append(self.make_node("DynamicQuantizeLSTM", inputs, list(node.output),
                                   f"{node.name}_quant" if node.name else "", domain=MS_DOMAIN,
                                   **{k: v for k, v in attrs.items() if k != "layout"}))
    return True


@register(INTEGER, "Gather")
def _gather(self: DynamicQuantizer, node: NodeProto) -> bool:
    """An embedding table stored quantized (uint8, as onnxruntime's tool: activation type),
    per hidden unit with ``per_channel``; DequantizeLinear after the lookup."""
    data = node.input[0]
    if data in self.qmap:
        return direct_8bit(self, node)
    if not self.is_float_weight(data) or self.array(data).ndim < 2:
        return False
    axis = attributes(node).get("axis", 0)
    per_column = self.per_channel and axis % self.array(data).ndim != self.array(data).ndim - 1
    q = self.quantize_weight(data, self.activation_qtype, axis=-1 if per_column else None,
                             reduce_range=False, symmetric=self.activation_symmetric)
    y = node.output[0]
    node.input[0] = q.name
    out = QValue(self.unique(f"{y}_quantized"), q.scale, q.zero_point, q.qtype, q.scale_value,
                 q.zp_value, -1 if per_column else None)
    node.output[0] = self.set_output(y, out)
    self.out.append(node)
    return True


@register(INTEGER, "Attention")
def _attention(self: DynamicQuantizer, node: NodeProto) -> bool:
    """QAttention: the input quantized at run time, the packed QKV weight stored 8-bit (per
    tensor), as onnxruntime's tool writes it."""
    ins = list(node.input) + [""] * (5 - len(node.input))
    if len(node.input) > 5 and any(node.input[5:]):
        return False  # attention_bias / past_sequence_length: not QAttention inputs
    x, w = ins[0], ins[1]
    if not self.is_float_weight(w) or self.array(w).ndim != 2 \
            or self.activation_type_of(x) != TensorProto.FLOAT:
        return False
    wq = self.quantize_weight(w, symmetric=self.weight_symmetric)
    xq, xs, xzp = self.dynamic_quantize(x)
    for i in (2, 3, 4):
        if ins[i]:
            self.need_float(ins[i])
    self.out.append(self.make_node(
        "QAttention", [xq, wq.name, ins[2], xs, wq.scale, ins[3], xzp, wq.zero_point, ins[4]],
        list(node.output), f"{node.name}_quant" if node.name else "", domain=MS_DOMAIN,
        **attributes(node)))
    return True


@register(INTEGER, "EmbedLayerNormalization")
def _embed_layer_norm(self: DynamicQuantizer, node: NodeProto) -> bool:
    """QEmbedLayerNormalization: the embedding tables, gamma and beta stored as 8-bit (the
    activation type, per tensor), as onnxruntime's tool writes it."""
    ins = list(node.input) + [""] * (8 - len(node.input))
    if len(node.input) > 8 and node.input[8]:
        return False  # position_ids: QEmbedLayerNormalization has no such input
    if len(node.output) > 2 and node.output[2] and self.consumers.get(node.output[2]):
        return False  # the embedding sum: not an output of the quantized operator
    weights = [ins[2], ins[3], ins[4], ins[5], ins[6]]  # word, position, segment, gamma, beta
    if not all(self.is_float_weight(w) for k, w in enumerate(weights) if w or k != 2):
        return False
    qs = [self.quantize_weight(w, self.activation_qtype, reduce_range=False, symmetric=False)
          if w else None for w in weights]
    names = [q.name if q else "" for q in qs]
    scales = [q.scale if q else "" for q in qs]
    zps = [q.zero_point if q else "" for q in qs]
    for i in (0, 1, 7):
        if ins[i]:
            self.need_float(ins[i])
    self.out.append(self.make_node(
        "QEmbedLayerNormalization", [ins[0], ins[1], *names, ins[7], *scales, *zps],
        list(node.output[:2]), f"{node.name}_quant" if node.name else "", domain=MS_DOMAIN,
        **attributes(node)))
    return True


for _t in DIRECT_8BIT & INTEGER_OPS - set(INTEGER):
    INTEGER[_t] = direct_8bit


def quantize_dynamic(model_input: str | Path | ModelProto, model_output: str | Path,
                     op_types_to_quantize=None, per_channel: bool = False,
                     reduce_range: bool = False, weight_type: QuantType = QuantType.QInt8,
                     nodes_to_quantize=None, nodes_to_exclude=None,
                     use_external_data_format: bool = False, extra_options=None) -> None:
    """Quantize a model's weights to 8 bits; activations are quantized at run time.

    Same arguments as ``onnxruntime.quantization.quantize_dynamic``. ``extra_options``:
    ``MatMulConstBOnly`` (default True), ``WeightSymmetric``, ``MinimumRealRange``,
    ``ForceQuantizeNoInputCheck``.
    """
    extra = dict(extra_options or {})
    extra.setdefault("MatMulConstBOnly", True)
    ops = set(op_types_to_quantize or INTEGER_OPS)
    if weight_type not in (QuantType.QInt8, QuantType.QUInt8):
        raise ValueError(f"dynamic quantization supports QInt8 and QUInt8 weights, not "
                         f"{weight_type}")
    model = load_model(model_input)
    needed = 13 if per_channel else 11
    model = ensure_opset(model, needed, "the quantized operators")
    quantizer = DynamicQuantizer(model, per_channel, reduce_range, weight_type, QuantType.QUInt8,
                                 None, nodes_to_quantize, nodes_to_exclude, ops, extra)
    save_model(quantizer.quantize_model(), model_output, use_external_data_format)


__all__ = ["DynamicQuantizer", "INTEGER_OPS", "quantize_dynamic"]
