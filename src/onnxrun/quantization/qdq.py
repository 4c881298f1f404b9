"""The QDQ format: float operators between QuantizeLinear / DequantizeLinear pairs.

Every tensor an operator should see quantized gets ``QuantizeLinear -> DequantizeLinear`` after
its producer; weights are stored quantized with one ``DequantizeLinear``; Conv / Gemm biases are
stored as int32 with scale ``input_scale * weight_scale``. Data-movement operators (Reshape,
Transpose, MaxPool...) give their output their input's parameters, and a Relu or Clip after a
quantized tensor is dropped when activations are asymmetric: the quantization of its output
range already clamps. A runtime that fuses the patterns (onnxruntime) runs integer kernels; one
that does not runs the float operators on the dequantized values, with the same rounding.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from onnx import ModelProto, NodeProto, TensorProto, helper

from .base import MS_DOMAIN, QuantizerBase, QValue, attributes, weight_axis

# Operators whose output keeps their input's quantization parameters.
DIRECT_8BIT = {"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Resize", "MaxPool",
               "AveragePool", "Slice", "Pad", "TopK", "Gather", "GatherElements", "Split"}
REMOVABLE = {"Relu", "Clip"}
NORMALIZATION = {"InstanceNormalization", "LayerNormalization", "BatchNormalization"}
QDQ_OPS = {"Conv", "ConvTranspose", "Gemm", "MatMul", "CumSum", "Where", *DIRECT_8BIT,
           *REMOVABLE, *NORMALIZATION}


@dataclass
class _Mark:
    kind: str  # "act": own calibrated parameters, "weight", or "shared" with ``provider``
    axis: int | None = None
    provider: str | None = None
    as_activation: bool = False  # an initializer read as an activation: activation type


class QDQQuantizer(QuantizerBase):
    """Marks the tensors each quantized node wants quantized, then inserts the Q/DQ nodes."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.marks: dict[str, _Mark] = {}
        self.biases: list[tuple[NodeProto, str, str, str, float]] = []
        self.removed: set[int] = set()
        self.keep_activations = bool(self.extra.get("QDQKeepRemovableActivations", False))
        self.no_output_types = set(self.extra.get("OpTypesToExcludeOutputQuantization", ()))
        self.add_qdq_to_weight = bool(self.extra.get("AddQDQPairToWeight", False))
        self.dedicated_pairs = bool(self.extra.get("DedicatedQDQPair", False))
        self.quantize_biases = bool(self.extra.get("QuantizeBias", True))
        self.channel_axes = dict(self.extra.get("QDQOpTypePerChannelSupportToAxis", {}))
        # onnxruntime's contrib QuantizeLinear / DequantizeLinear, on request
        self.qdq_domain = MS_DOMAIN if self.extra.get("UseQDQContribOps", False) else ""
        self.block_size = int(self.extra.get("BlockSize", 0) or 0)  # block-wise weights

    def qdq_node(self, op_type: str, inputs: list[str], outputs: list[str], name: str,
                 axis: int | None = None, block_size: int | None = None) -> NodeProto:
        return self.make_node(op_type, inputs, outputs, name, domain=self.qdq_domain, axis=axis,
                              block_size=block_size)

    # -- marking ------------------------------------------------------------------------------

    def _quantizable(self, name: str) -> bool:
        return bool(name) and (self.is_float_weight(name) or
                               (not self.is_initializer(name) and self.is_float(name)))

    def mark(self, name: str) -> None:
        """Quantize ``name`` with its own parameters (an initializer: as a weight)."""
        if not self._quantizable(name) or name in self.marks or self.prequantized(name):
            return
        self.marks[name] = _Mark("weight", as_activation=True) if self.is_initializer(name) \
            else _Mark("act")

    def prequantized(self, name: str) -> QValue | None:
        """The parameters of a tensor the model already dequantizes (a DequantizeLinear with
        constant scale and zero point writes it): left as it is, onnxruntime does the same."""
        dq = self.producer.get(name)
        if dq is None or dq.op_type != "DequantizeLinear" or len(dq.input) < 2:
            return None
        scale = dq.input[1]
        zp = dq.input[2] if len(dq.input) > 2 else ""
        if not self.is_initializer(scale) or (zp and not self.is_initializer(zp)):
            return None
        zv = self.array(zp) if zp else None
        return QValue(name, scale, zp, self.initializers[zp].data_type if zp else 0,
                      self.array(scale), zv, attributes(dq).get("axis"))

    def mark_weight(self, name: str, axis: int | None) -> None:
        if not self.is_float_weight(name):
            self.mark(name)
            return
        m = self.marks.get(name)
        if m is None or m.kind != "weight" or m.as_activation:
            self.marks[name] = _Mark("weight", axis)

    def mark_shared(self, name: str, provider: str) -> None:
        if self._quantizable(name) and not self.is_initializer(name):
            self.marks[name] = _Mark("shared", provider=provider)

    def mark_outputs(self, node: NodeProto) -> None:
        if node.op_type not in self.no_output_types:
            for o in node.output:
                self.mark(o)

    def mark_bias(self, node: NodeProto, index: int, weight_index: int, beta: float = 1.0
                  ) -> None:
        if len(node.input) > index and node.input[index]:
            bias = node.input[index]
            if not self.quantize_biases:
                return
            if bias in self.overrides:  # overridden: quantized as a weight, as onnxruntime does
                self.mark_weight(bias, None)
                return
            w = node.input[weight_index]
            # the weight: a constant, already dequantized by the model, or an activation
            if self.is_float_weight(bias) and (self.is_float_weight(w) or self.prequantized(w)
                                               or self._quantizable(w)):
                self.biases.append((node, bias, node.input[0], node.input[weight_index], beta))
            elif not self.is_initializer(bias):
                self.mark(bias)

    def _weight(self, node: NodeProto, index: int) -> None:
        name = node.input[index]
        if self.is_float_weight(name):
            axis = None
            if self.per_channel:
                rank = self.array(name).ndim
                # onnxruntime's QDQ default for MatMul is axis 1, whatever the rank
                default = 1 if node.op_type == "MatMul" else weight_axis(node, index, rank)
                axis = self.channel_axes.get(node.op_type, default)
                axis = axis % rank if axis is not None and -rank <= axis < rank else None
            self.mark_weight(name, axis)
        else:
            self.mark(name)

    # -- operators ----------------------------------------------------------------------------

    def quantize_node(self, node: NodeProto) -> None:
        op = node.op_type
        if op in ("Conv", "ConvTranspose"):
            self.mark(node.input[0])
            self._weight(node, 1)
            self.mark_bias(node, 2, 1)
            self.mark_outputs(node)
        elif op == "Gemm":
            a = attributes(node)
            self.mark(node.input[0])
            self._weight(node, 1)
            if float(a.get("alpha", 1.0)) == 1.0:
                self.mark_bias(node, 2, 1, float(a.get("beta", 1.0)))
            elif len(node.input) > 2:
                self.mark(node.input[2])
            self.mark_outputs(node)
        elif op == "MatMul":
            if self.matmul_const_b_only and not self.is_initializer(node.input[1]):
                return
            self.mark(node.input[0])
            self._weight(node, 1)
            self.mark_outputs(node)
        elif op in REMOVABLE:
            if node.input[0] not in self.marks:
                return
            if not (self.activation_symmetric or self.keep_activations) \
                    and self._replace_upstream(node.input[0], node.output[0]):
                self.removed.add(id(node))
            else:
                self.mark(node.input[0])
            self.mark(node.output[0])
        elif op == "Pad":
            self._pad(node)
        elif op in DIRECT_8BIT:
            if op == "MaxPool" and self.opset < 12 or op == "Resize" and self.opset < 11:
                return
            src = node.input[0]
            if self.force_no_input_check or op == "Split" or \
                    op in ("Gather", "GatherElements") and self.is_float_weight(src):
                self.mark(src)
            if src not in self.marks or op in self.no_output_types:
                return
            outs = node.output if op == "Split" else node.output[:1]
            for o in outs:
                self.mark_shared(o, src)
        elif op in NORMALIZATION:
            self.mark(node.input[0])
            self._weight(node, 1)
            self.mark_bias(node, 2, 1)
            self.mark_outputs(node)
        elif op == "Where":
            if self.force_no_input_check:
                self.mark(node.input[1])
                self.mark(node.input[2])
            if node.input[1] in self.marks and node.input[2] in self.marks:
                self.mark_outputs(node)
        else:  # every float input and output with its own parameters
            if op == "Softmax":
                self.set_range(node.output[0], 0.0, 1.0)
            for i in node.input:
                self.mark(i)
            self.mark_outputs(node)

    def _pad(self, node: NodeProto) -> None:
        """Pad's input is quantized; its output shares the input's parameters unless a non-zero
        constant is padded in (then its own; the constant value is quantized too)."""
        src = node.input[0]
        self.mark(src)
        if src not in self.marks or node.op_type in self.no_output_types:
            return
        attrs = attributes(node)
        mode = attrs.get("mode", b"constant")
        mode = mode.decode() if isinstance(mode, bytes) else mode
        value = node.input[2] if len(node.input) > 2 and node.input[2] else None
        nonzero = False
        if mode == "constant":
            if value is not None:
                self.mark(value)
                nonzero = not (self.is_initializer(value) and not np.any(self.array(value)))
            else:
                nonzero = float(attrs.get("value", 0.0)) != 0.0  # Pad-2's attribute
        if nonzero:
            self.mark(node.output[0])
        else:
            self.mark_shared(node.output[0], src)

    def _convert_params(self, name: str) -> tuple[QValue, set[str] | None] | None:
        """A ``convert`` override's parameters and receiving nodes (None: every consumer)."""
        if not self.overrides.has_per_tensor_overrides(name):
            return None
        conv = self.overrides.get_per_tensor_overrides(name).get("convert")
        if not conv:
            return None
        cq = self.activation_params_for(name, conv, suffix="_convert")
        if cq is None:
            return None
        recv = conv.get("recv_nodes")
        return cq, set(recv) if recv is not None else None

    def _converted(self, name: str, qv: QValue, q_out: str, conv, is_output: bool,
                   readers: list[NodeProto], replace: dict[str, str],
                   reader_replace: dict[tuple[int, str], str]) -> list[NodeProto]:
        """The DequantizeLinear nodes after ``name``'s QuantizeLinear when some consumers read
        it re-quantized in another type (a ``convert`` override), as onnxruntime writes them:
        ``Q -> DQ -> Q' -> DQ'`` when every consumer converts (the graph output too), else
        ``Q -> DQ`` for the others and a second ``DQ -> Q' -> DQ'`` branch for the converted."""
        cq, recv = conv
        to_all = recv is None or all(r.name in recv for r in readers)
        nodes = []
        dq1 = name if is_output and not to_all else self.unique(f"{name}_DequantizeLinear_Output")
        nodes.append(self.qdq_node("DequantizeLinear", [q_out, qv.scale, qv.zero_point], [dq1],
                                   f"{name}_DequantizeLinear"))
        if to_all:
            src = dq1
            final = name if is_output else self.unique(f"{name}_DequantizeLinear_Output_convert")
            if not is_output:
                replace[name] = final
        else:
            if not is_output:
                replace[name] = dq1
            src = self.unique(f"{name}_DequantizeLinear_Output_1")
            nodes.append(self.qdq_node("DequantizeLinear", [q_out, qv.scale, qv.zero_point],
                                       [src], f"{name}_DequantizeLinear_1"))
            final = self.unique(f"{name}_DequantizeLinear_Output_convert")
            for reader in readers:
                if reader.name in recv:
                    reader_replace[(id(reader), name)] = final
        cq_out = self.unique(f"{name}_QuantizeLinear_Output_convert")
        nodes += [self.qdq_node("QuantizeLinear", [src, cq.scale, cq.zero_point], [cq_out],
                                f"{name}_QuantizeLinear_convert"),
                  self.qdq_node("DequantizeLinear", [cq_out, cq.scale, cq.zero_point], [final],
                                f"{name}_DequantizeLinear_convert")]
        return nodes

    def _replace_upstream(self, upstream: str, output: str) -> bool:
        """Drop an activation by having the upstream node write its output directly."""
        producer = self.producer.get(upstream)
        if (producer is None or id(producer) in self.removed or self.tensor_range(output) is None
                or len(self.consumers.get(upstream, ())) != 1 or upstream in self.graph_outputs
                or upstream in self.graph_inputs or upstream in self.outer_refs):
            return False
        for i, o in enumerate(producer.output):
            if o == upstream:
                producer.output[i] = output
        self.producer[output] = producer
        self.marks.pop(upstream, None)
        return True

    # -- emission -----------------------------------------------------------------------------

    def _params(self, name: str, seen: frozenset = frozenset()) -> QValue | None:
        m = self.marks.get(name)
        if m is None or name in seen:
            return None
        if m.kind == "shared":
            return self._params(m.provider, seen | {name})
        if m.kind == "weight":
            return self._weight_qvalue(name, m)
        if m.kind == "act":
            qv = self.activation_qvalue(name)
            if qv is None and self.tensors_range is not None and name in self.tensors_range:
                return None  # calibrated, but to an infinite range: left float
            if qv is None:
                raise ValueError(f"Quantization parameters are not specified for param {name}. "
                                 "In static mode quantization params for inputs and outputs of "
                                 "nodes to be quantized are required.")
            return qv
        return None

    def _weight_qvalue(self, name: str, m: _Mark, floor=None) -> QValue:
        if self.block_size and not m.as_activation and name not in self.overrides:
            return self.quantize_weight_blocked(name, self.block_size)
        if m.as_activation:
            return self.quantize_weight(name, self.activation_qtype, reduce_range=False,
                                        symmetric=self.activation_symmetric)
        return self.quantize_weight(name, axis=m.axis, min_scale=floor)

    def quantize_model(self) -> ModelProto:
        for node in self.nodes:
            if self.should_quantize_node(node):
                self.quantize_node(node)

        front: list[NodeProto] = []
        after: dict[int, list[NodeProto]] = {}  # by id() of the producer
        replace: dict[str, str] = {}
        reader_replace: dict[tuple[int, str], str] = {}  # (id(consumer), name): dedicated pairs
        # weights first wait for the floors the int32 biases put on their scales
        floors: dict[str, np.ndarray] = {}
        bias_inputs: dict[int, QValue] = {}
        for k, (_, bias, inp, w, _) in enumerate(self.biases):
            iq = self._params(inp) or self.prequantized(inp)
            wm = self.marks.get(w)
            if iq is not None and (self.prequantized(w) or (wm and wm.kind != "weight")):
                bias_inputs[k] = iq  # the weight's parameters: the model's or an activation's
                continue
            if iq is None or wm is None or wm.kind != "weight" or wm.as_activation:
                continue
            bias_inputs[k] = iq
            if w in self.overrides or self.block_size:  # parameters stay as given / blocked
                continue
            floor = self.bias_weight_floor(bias, iq.scale_value, self.marks[w].axis is not None)
            if floor is not None:
                floors[w] = np.maximum(floors[w], floor) if w in floors else floor

        for name, m in self.marks.items():
            if m.kind == "weight":
                qv = self._weight_qvalue(name, m, floors.get(name))
                out = self.unique(f"{name}_DequantizeLinear_Output")
                src = qv.name
                if self.add_qdq_to_weight:  # the float weight kept, quantized by the graph
                    src = self.unique(f"{name}_QuantizeLinear_Output")
                    front.append(self.qdq_node("QuantizeLinear", [name, qv.scale, qv.zero_point],
                                                [src], f"{name}_QuantizeLinear", axis=qv.axis,
                                                block_size=qv.block_size))
                front.append(self.qdq_node("DequantizeLinear", [src, qv.scale, qv.zero_point],
                                            [out], f"{name}_DequantizeLinear", axis=qv.axis,
                                            block_size=qv.block_size))
                replace[name] = out
                continue
            qv = self._params(name)
            if qv is None:
                continue
            producer = self.producer.get(name)
            readers = self.consumers.get(name, [])
            if self.dedicated_pairs and len(readers) > 1 and name not in self.graph_outputs:
                # one pair per consumer (onnxruntime's DedicatedQDQPair), suffixed _1, _2...
                pairs = []
                for k, reader in enumerate(readers, 1):
                    q_out = self.unique(f"{name}_QuantizeLinear_Output_{k}")
                    dq_out = self.unique(f"{name}_DequantizeLinear_Output_{k}")
                    pairs += [self.qdq_node("QuantizeLinear", [name, qv.scale, qv.zero_point],
                                            [q_out], f"{name}_QuantizeLinear_{k}"),
                              self.qdq_node("DequantizeLinear", [q_out, qv.scale, qv.zero_point],
                                            [dq_out], f"{name}_DequantizeLinear_{k}")]
                    reader_replace[(id(reader), name)] = dq_out
                (front if producer is None else after.setdefault(id(producer), [])).extend(pairs)
                continue
            q_out = self.unique(f"{name}_QuantizeLinear_Output")
            is_output = name in self.graph_outputs and producer is not None
            if is_output:
                q_in = self.unique(f"{name}_QuantizeLinear_Input")
                for i, o in enumerate(producer.output):
                    if o == name:
                        producer.output[i] = q_in
            else:
                q_in = name
            pair = [self.qdq_node("QuantizeLinear", [q_in, qv.scale, qv.zero_point], [q_out],
                                  f"{name}_QuantizeLinear")]
            conv = self._convert_params(name)
            if conv is None:
                dq_out = name if is_output else self.unique(f"{name}_DequantizeLinear_Output")
                pair.append(self.qdq_node("DequantizeLinear", [q_out, qv.scale, qv.zero_point],
                                          [dq_out], f"{name}_DequantizeLinear"))
                if not is_output:
                    replace[name] = dq_out
            else:
                pair += self._converted(name, qv, q_out, conv, is_output, readers, replace,
                                        reader_replace)
            if producer is None:
                front.extend(pair)
            else:
                after.setdefault(id(producer), []).extend(pair)

        for k, (node, bias, _, w, beta) in enumerate(self.biases):
            if self.weight_qtype == TensorProto.FLOAT8E4M3FN:
                # no float 8 bias: onnxruntime keeps it as float32 data Cast to the model's type
                data = self.array(bias)
                src = self.add_initializer(f"{bias}_quantized", data.astype(np.float32))
                out = self.unique(f"{bias}_Cast_Output")
                front.append(self.make_node("Cast", [src], [out], f"{bias}_Cast",
                                            to=helper.np_dtype_to_tensor_dtype(data.dtype)))
                node.input[2] = out
                continue
            if k not in bias_inputs:
                self.mark(bias)  # not quantizable as int32: a weight like any other
                continue
            wm = self.marks.get(w)
            wq = self.prequantized(w) or (self._params(w) if wm and wm.kind != "weight" else
                                          self.weights[(w, self.weight_qtype, wm.axis)])
            if wq is None:
                self.mark(bias)
                continue
            bq = self.quantize_bias(bias, bias_inputs[k].scale_value, wq, beta)
            if bq is None:
                self.mark(bias)
                continue
            out = self.unique(f"{bias}_DequantizeLinear_Output")
            front.append(self.qdq_node("DequantizeLinear", [bq.name, bq.scale, bq.zero_point],
                                        [out], f"{bias}_DequantizeLinear", axis=bq.axis))
            for i, x in enumerate(node.input):
                if x == bias and i == 2:
                    node.input[i] = out
            if node.op_type == "Gemm" and beta != 1.0:
                for a in node.attribute:
                    if a.name == "beta":
                        a.f = 1.0
        for name in [b for _, b, *_ in self.biases if b in self.marks and b not in replace]:
            qv = self.quantize_weight(name)  # a bias left as a plain weight
            out = self.unique(f"{name}_DequantizeLinear_Output")
            front.append(self.qdq_node("DequantizeLinear", [qv.name, qv.scale, qv.zero_point],
                                        [out], f"{name}_DequantizeLinear"))
            replace[name] = out

        nodes = list(front)
        for node in self.nodes:
            if id(node) in self.removed:
                continue
            for i, x in enumerate(node.input):
                if (id(node), x) in reader_replace:
                    node.input[i] = reader_replace[(id(node), x)]
                elif x in replace:
                    node.input[i] = replace[x]
            nodes.append(node)
            nodes.extend(after.get(id(node), ()))
        return self.finish(nodes)


__all__ = ["QDQQuantizer", "QDQ_OPS"]
