"""What the quantizers share: the graph's bookkeeping, weight and bias quantization, activation
parameters from calibrated ranges, and the final assembly of the quantized model."""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import ModelProto, NodeProto, TensorProto, helper, numpy_helper

from ..validate import unknown_negative_dims
from .onnx_model import ONNXModel, subgraph_references
from .quant_types import (
    NP_TYPES,
    QuantType,
    compute_scale_zp,
    compute_scale_zp_blocked,
    compute_scale_zp_float8,
    default_weight_symmetric,
    get_qmin_qmax_for_qType,
    qtype_of,
    quantize_data,
    quantize_nparray,
    snap_zero_point_to_uint8,
)
from .tensor_quant_overrides import TensorQuantOverridesHelper

logger = logging.getLogger("onnxrun.quantization")

MS_DOMAIN = "com.microsoft"
FLOAT_TYPES = (TensorProto.FLOAT, TensorProto.FLOAT16)
PRODUCER = "onnxrun.quantize"
_INT32 = np.iinfo(np.int32)


@dataclass(frozen=True)
class QValue:
    """A quantized tensor: its name and the names (and values) of its scale and zero point."""

    name: str
    scale: str
    zero_point: str
    qtype: int
    scale_value: np.ndarray | None = None
    zp_value: np.ndarray | None = None
    axis: int | None = None  # per-channel axis of a weight (the blocked axis with block_size)
    block_size: int | None = None  # block-wise parameters (opset 21) along ``axis``


def attributes(node: NodeProto) -> dict[str, Any]:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def opset_of(model: ModelProto, domain: str = "") -> int:
    for o in model.opset_import:
        if o.domain in (domain, "ai.onnx" if domain == "" else domain):
            return o.version
    return 0


def ensure_opset(model: ModelProto, version: int, why: str) -> ModelProto:
    """The model converted to ai.onnx opset ``version`` when it is older (as onnxruntime's tool
    does for 16-bit types and per-channel parameters)."""
    current = opset_of(model)
    if current >= version:
        return model
    logger.warning("the model's opset %d does not support %s: converting it to opset %d",
                   current, why, version)
    from onnx import version_converter

    return version_converter.convert_version(model, version)


class QuantizerBase:
    """State common to the QDQ, QOperator and dynamic quantizers."""

    def __init__(self, model: ModelProto, per_channel: bool, reduce_range: bool,
                 weight_type: QuantType, activation_type: QuantType,
                 tensors_range: Mapping[str, Any] | None, nodes_to_quantize: Iterable[str] | None,
                 nodes_to_exclude: Iterable[str] | None, op_types_to_quantize: Iterable[str],
                 extra_options: Mapping[str, Any] | None) -> None:
        if _untyped_outputs(model):  # a model given without value_info: type every tensor
            try:
                model = onnx.shape_inference.infer_shapes(model)
            except Exception as e:  # noqa: BLE001 - quantize what can be typed
                logger.warning("shape inference failed (%s); quantizing without it", e)
        self.model_proto = model
        self.model = ONNXModel(model)  # onnxruntime's attribute: scripts call model.nodes()...
        self.graph = model.graph
        self.per_channel = per_channel
        self.reduce_range = reduce_range
        self.weight_qtype = qtype_of(weight_type)
        self.activation_qtype = qtype_of(activation_type)
        self.tensors_range = tensors_range
        self.nodes_to_quantize = set(nodes_to_quantize or ())
        self.nodes_to_exclude = set(nodes_to_exclude or ())
        self.op_types = set(op_types_to_quantize)
        self.extra = dict(extra_options or {})
        self.weight_symmetric = self.extra.get("WeightSymmetric",
                                               default_weight_symmetric(self.weight_qtype))
        self.activation_symmetric = bool(self.extra.get("ActivationSymmetric", False))
        # uint8 activations with their zero point at 0 or 128 only
        self.restricted_asymmetric = bool(self.extra.get("ActivationRestrictedAsymmetric", False))
        self.min_real_range = self.extra.get("MinimumRealRange")
        self.force_no_input_check = bool(self.extra.get("ForceQuantizeNoInputCheck", False))
        self.overrides = TensorQuantOverridesHelper(self.extra.get("TensorQuantOverrides"))
        self.matmul_const_b_only = bool(self.extra.get("MatMulConstBOnly", False))
        self.opset = opset_of(model)

        self.initializers = {t.name: t for t in self.graph.initializer}
        self._arrays: dict[str, np.ndarray] = {}
        self._finite: dict[str, bool] = {}
        self.value_types: dict[str, int] = {}
        for vi in [*self.graph.value_info, *self.graph.input, *self.graph.output]:
            if vi.type.HasField("tensor_type"):
                self.value_types[vi.name] = vi.type.tensor_type.elem_type
        for t in self.graph.initializer:
            self.value_types[t.name] = t.data_type
        self.graph_inputs = {i.name for i in self.graph.input}
        self.graph_outputs = {o.name for o in self.graph.output}
        self.nodes = [copy.deepcopy(n) for n in self.graph.node]
        self.consumers: dict[str, list[NodeProto]] = {}
        self.producer: dict[str, NodeProto] = {}
        self.outer_refs: set[str] = set()  # read by some subgraph: must stay available as float
        self.names: set[str] = set(self.initializers) | self.graph_inputs | self.graph_outputs
        for n in self.nodes:
            for i in n.input:
                if i:
                    self.consumers.setdefault(i, []).append(n)
            for o in n.output:
                if o:
                    self.producer[o] = n
            self.names.update(n.input)
            self.names.update(n.output)
            if n.name:
                self.names.add(n.name)
            refs = subgraph_references(n)
            self.outer_refs |= refs
            for r in refs:
                self.consumers.setdefault(r, []).append(n)
        if self.overrides:
            tensors = self.graph_inputs | self.graph_outputs | set(self.producer) \
                | set(self.consumers)
            ok, why = self.overrides.is_valid(self.initializers, tensors)
            if not ok:
                raise ValueError(why)
        self.new_initializers: list[TensorProto] = []
        self.weights: dict[tuple, QValue] = {}
        # weight -> its first quantized form and the axis as the quantizer asked for it (the
        # DequantizeLinear that float consumers read writes it so)
        self.weight_axis_attr: dict[str, tuple[QValue, int | None]] = {}
        self.activation_params: dict[str, QValue] = {}
        self.uses_ms_domain = False

    # -- graph queries ------------------------------------------------------------------------

    def should_quantize_node(self, node: NodeProto) -> bool:
        if self.nodes_to_quantize and node.name not in self.nodes_to_quantize:
            return False
        if node.op_type not in self.op_types or node.name in self.nodes_to_exclude:
            return False
        return not any(a.HasField("g") or len(a.graphs) for a in node.attribute)

    def is_initializer(self, name: str) -> bool:
        return name in self.initializers and name not in self.graph_inputs

    def is_float(self, name: str) -> bool:
        return self.value_types.get(name) in FLOAT_TYPES

    def is_float_weight(self, name: str) -> bool:
        """A float initializer with finite values (an infinite mask value cannot be scaled)."""
        if not (self.is_initializer(name) and self.initializers[name].data_type in FLOAT_TYPES):
            return False
        if name not in self._finite:
            self._finite[name] = bool(np.all(np.isfinite(self.array(name))))
        return self._finite[name]

    def array(self, name: str) -> np.ndarray:
        if name not in self._arrays:
            self._arrays[name] = numpy_helper.to_array(self.initializers[name])
        return self._arrays[name]

    def unique(self, base: str) -> str:
        name, i = base, 1
        while name in self.names:
            name = f"{base}_{i}"
            i += 1
        self.names.add(name)
        return name

    def add_initializer(self, base: str, value: np.ndarray, exact: bool = False,
                        as_list: bool = False) -> str:
        """A new initializer; ``as_list`` stores the values in the typed fields (int32_data,
        float_data...) rather than raw bytes, as onnxruntime's tool stores scales and zero
        points (scripts read ``zero_point.int32_data[0]``)."""
        name = base if exact else self.unique(base)
        self.names.add(name)
        value = np.asarray(value)
        if as_list:
            t = helper.make_tensor(name, helper.np_dtype_to_tensor_dtype(value.dtype),
                                   value.shape, value.ravel().tolist())
        else:
            t = numpy_helper.from_array(value, name)
        self.new_initializers.append(t)
        self.initializers[name] = t
        self._arrays[name] = np.asarray(value)
        self.value_types[name] = t.data_type
        return name

    def make_node(self, op_type: str, inputs: list[str], outputs: list[str], base_name: str,
                  domain: str = "", **attrs: Any) -> NodeProto:
        if domain == MS_DOMAIN:
            self.uses_ms_domain = True
        name = self.unique(base_name) if base_name else ""
        return helper.make_node(op_type, inputs, outputs, name or None, domain=domain or None,
                                **{k: v for k, v in attrs.items() if v is not None})

    # -- parameters ---------------------------------------------------------------------------

    def tensor_range(self, name: str) -> tuple[np.ndarray, np.ndarray] | None:
        if self.tensors_range is None or name not in self.tensors_range:
            return None
        td = self.tensors_range[name]
        lo, hi = td.range_value if hasattr(td, "range_value") else td
        lo, hi = np.asarray(lo), np.asarray(hi)
        if not (np.all(np.isfinite(lo)) and np.all(np.isfinite(hi))):
            # e.g. a -inf attention mask: no scale covers it, the tensor stays float
            logger.warning("tensor %s has an infinite range: not quantized", name)
            return None
        return lo, hi

    def set_range(self, name: str, lo: float, hi: float) -> None:
        from .calibrate import TensorData

        if self.tensors_range is not None:
            self.tensors_range[name] = TensorData(lowest=np.float32(lo), highest=np.float32(hi))

    def activation_qvalue(self, name: str, qtype: int | None = None, fixed=None
                          ) -> QValue | None:
        """Scale and zero point initializers of an activation, from its calibrated range (or
        ``fixed`` (scale, zero point)); None when the tensor was not calibrated."""
        if name in self.activation_params:
            return self.activation_params[name]
        ov = self.overrides.get_per_tensor_overrides(name) or {}
        qv = self.activation_params_for(name, ov, qtype, fixed)
        if qv is not None:
            self.activation_params[name] = qv
        return qv

    def activation_params_for(self, name: str, ov: Mapping[str, Any], qtype: int | None = None,
                              fixed=None, suffix: str = "") -> QValue | None:
        """New scale / zero point initializers for activation ``name`` under the overrides
        ``ov`` (quant_type, scale + zero_point, rmin / rmax, symmetric)."""
        qtype = self.activation_qtype if qtype is None else qtype
        if "quant_type" in ov:
            qtype = qtype_of(ov["quant_type"])
        if "scale" in ov:
            fixed = (ov["scale"], ov["zero_point"])
        symmetric = bool(ov.get("symmetric", self.activation_symmetric))
        if fixed is not None:
            scale = np.array(fixed[0], np.float32)
            zp = np.array(fixed[1]).astype(NP_TYPES[qtype])
        elif qtype == TensorProto.FLOAT8E4M3FN:
            td = None if self.tensors_range is None else self.tensors_range.get(name)
            if td is None:
                return None
            if not hasattr(td, "avg_std") or "std" not in getattr(td, "_attrs", ("std",)):
                raise ValueError(f"float 8 quantization of {name!r} needs its standard "
                                 "deviation: calibrate with CalibrationMethod.Distribution")
            std = np.asarray(td.avg_std[1])
            if self.value_types.get(name) == TensorProto.FLOAT16:
                std = std.astype(np.float16)
            zp, scale = compute_scale_zp_float8(qtype, std)
        else:
            r = self.tensor_range(name)
            if "rmin" in ov or "rmax" in ov:
                base = r if r is not None else (np.float32(0), np.float32(0))
                r = (np.asarray(ov.get("rmin", base[0])), np.asarray(ov.get("rmax", base[1])))
            if r is None:
                return None
            qmin, qmax = get_qmin_qmax_for_qType(qtype, symmetric=symmetric)
            lo, hi = r
            fdt = np.dtype(np.float32) if self.value_types.get(name) != TensorProto.FLOAT16 \
                else np.dtype(np.float16)
            if self.restricted_asymmetric and qtype == TensorProto.UINT8 and not symmetric:
                zp, scale = snap_zero_point_to_uint8(lo, hi, int(qmin), int(qmax),
                                                     self.min_real_range)
            else:
                zp, scale = compute_scale_zp(np.asarray(lo).astype(fdt),
                                             np.asarray(hi).astype(fdt), qmin, qmax, symmetric,
                                             self.min_real_range)
        # onnxruntime's order: zero point first
        zp_name = self.add_initializer(f"{name}_zero_point{suffix}", zp, as_list=True)
        return QValue(name, self.add_initializer(f"{name}_scale{suffix}", scale, as_list=True),
                      zp_name, qtype, scale, zp)

    def quantize_weight(self, name: str, qtype: int | None = None, axis: int | None = None,
                        reduce_range: bool | None = None, symmetric: bool | None = None,
                        min_scale: np.ndarray | float | None = None, keep_name: bool = False
                        ) -> QValue:
        """A float initializer quantized per tensor, or per channel along ``axis``; cached.
        Tensor overrides, when the weight has some, decide the type, axis and parameters."""
        qtype = self.weight_qtype if qtype is None else qtype
        key = (name, qtype, axis)
        if key in self.weights:
            return self.weights[key]
        if name in self.overrides:
            qv = self._overridden_weight(name, qtype, reduce_range, symmetric)
            self.weights[key] = qv
            return qv
        data = self.array(name)
        requested_axis = axis
        if axis is not None:
            axis = axis % data.ndim
        if symmetric is None:
            # per channel always symmetric: QLinear kernels take one zero point for all channels
            symmetric = axis is not None or (self.weight_symmetric if qtype == self.weight_qtype
                                             else self.activation_symmetric)
        rr = self.reduce_range if reduce_range is None else reduce_range
        zp, scale, q = quantize_data(data, qtype, symmetric, rr, self.min_real_range, axis)
        if min_scale is not None and symmetric:
            floor = np.broadcast_to(np.asarray(min_scale, np.float64), scale.shape)
            if np.any(scale < floor):  # so that an int32 bias keeps its range (see bias())
                scale = np.maximum(scale, floor).astype(scale.dtype)
                shape = [-1 if i == axis else 1 for i in range(data.ndim)] if axis is not None \
                    else []
                q = quantize_nparray(qtype, data, scale.reshape(shape) if shape else scale,
                                     zp.reshape(shape) if shape else zp)
        suffix = "" if len([k for k in self.weights if k[0] == name]) == 0 else f"_{qtype}"
        # onnxruntime's order of the new initializers: zero point, scale, quantized values
        zp_name = self.add_initializer(f"{name}{suffix}_zero_point", zp, as_list=True)
        scale_name = self.add_initializer(f"{name}{suffix}_scale", scale, as_list=True)
        qv = QValue(self.add_initializer(f"{name}{suffix}_quantized", q), scale_name, zp_name,
                    qtype, scale, zp, axis)
        self.weights[key] = qv
        self.weight_axis_attr.setdefault(name, (qv, requested_axis))
        return qv

    def _overridden_weight(self, name: str, qtype: int, reduce_range: bool | None,
                           symmetric: bool | None) -> QValue:
        data = self.array(name)
        if self.overrides.has_per_channel_overrides(name):
            dicts = self.overrides.get_per_channel_overrides(name)
            axis = dicts[0]["axis"] % data.ndim
            n = data.shape[axis]
            dicts = dicts * n if len(dicts) == 1 else dicts
        else:
            dicts, axis = [self.overrides.get_per_tensor_overrides(name)], None
        first = dicts[0]
        qtype = qtype_of(first.get("quant_type", qtype))
        if symmetric is None:
            symmetric = axis is not None or (self.weight_symmetric if qtype == self.weight_qtype
                                             else default_weight_symmetric(qtype))
        symmetric = bool(first.get("symmetric", symmetric))
        rr = bool(first.get("reduce_range", self.reduce_range if reduce_range is None
                            else reduce_range))
        if "scale" in first:
            scale = np.array([d["scale"] for d in dicts], np.float32).reshape(-1)
            zp = np.array([d["zero_point"] for d in dicts]).reshape(-1).astype(NP_TYPES[qtype])
        else:
            others = tuple(i for i in range(data.ndim) if i != axis) if axis is not None \
                else None
            lo = data.min(axis=others) if data.size else np.zeros(1, data.dtype)
            hi = data.max(axis=others) if data.size else np.zeros(1, data.dtype)
            lo = np.array([d.get("rmin", v)
                           for d, v in zip(dicts, np.reshape(lo, -1), strict=False)])
            hi = np.array([d.get("rmax", v)
                           for d, v in zip(dicts, np.reshape(hi, -1), strict=False)])
            qmin, qmax = get_qmin_qmax_for_qType(qtype, rr, symmetric)
            zp, scale = compute_scale_zp(lo.astype(np.float32), hi.astype(np.float32), qmin,
                                         qmax, symmetric, self.min_real_range)
        if axis is None:
            scale, zp = scale.reshape(()), zp.reshape(())
            q = quantize_nparray(qtype, data, scale, zp)
        else:
            shape = [-1 if i == axis else 1 for i in range(data.ndim)]
            q = quantize_nparray(qtype, data, scale.reshape(shape), zp.reshape(shape))
        zp_name = self.add_initializer(f"{name}_zero_point", zp, as_list=True)
        scale_name = self.add_initializer(f"{name}_scale", scale, as_list=True)
        return QValue(self.add_initializer(f"{name}_quantized", q), scale_name, zp_name, qtype,
                      scale, zp, axis)

    def quantize_weight_blocked(self, name: str, block_size: int) -> QValue:
        """A rank-2 weight quantized per block of ``block_size`` values along axis 0 (the
        ``BlockSize`` extra option): parameters of shape [ceil(K / block_size), N]."""
        key = (name, self.weight_qtype, ("block", block_size))
        if key in self.weights:
            return self.weights[key]
        data = self.array(name)
        zp, scale = compute_scale_zp_blocked(data, self.weight_qtype, 0, block_size,
                                             bool(self.weight_symmetric))
        q = quantize_nparray(self.weight_qtype, data, np.repeat(scale, block_size, 0)[
            :data.shape[0]], np.repeat(zp, block_size, 0)[:data.shape[0]])
        zp_name = self.add_initializer(f"{name}_zero_point", zp, as_list=True)
        scale_name = self.add_initializer(f"{name}_scale", scale, as_list=True)
        qv = QValue(self.add_initializer(f"{name}_quantized", q), scale_name, zp_name,
                    self.weight_qtype, scale, zp, 0, block_size)
        self.weights[key] = qv
        return qv

    def bias_weight_floor(self, bias: str, input_scale: np.ndarray, per_channel: bool
                          ) -> np.ndarray | None:
        """The smallest weight scale whose product with ``input_scale`` keeps the int32 bias
        in range (onnxruntime's weight adjustment for int32 biases)."""
        if self.extra.get("QDQDisableWeightAdjustForInt32Bias", False) \
                or not self.is_float_weight(bias):
            return None
        b = self.array(bias).astype(np.float64)
        qrange = float(_INT32.max) - float(_INT32.min + 1)
        if per_channel:
            absmax = np.abs(b).reshape(b.shape[0], -1).max(axis=1) if b.size else b
        else:
            absmax = np.abs(b).max() if b.size else np.float64(0)
        s = float(np.asarray(input_scale).reshape(-1)[0])
        if s <= 0:
            return None
        return 1.0001 * 2.0 * absmax / qrange / s

    def quantize_bias(self, bias: str, input_scale: np.ndarray, weight: QValue,
                      multiplier: float = 1.0) -> QValue | None:
        """``bias * multiplier`` as int32 with scale ``input_scale * weight_scale`` and zero point
        0 (None when the bias does not fit: per channel, it must be 1-D, one per channel)."""
        data = self.array(bias).astype(np.float64) * multiplier
        ws = np.asarray(weight.scale_value, np.float64).reshape(-1)
        per_channel = ws.size > 1
        if per_channel and (data.ndim != 1 or data.size != ws.size):
            return None
        # the scale has the model's float type: a float16 model's bias dequantizes to float16
        fdt = np.float16 if self.array(bias).dtype == np.float16 else np.float32
        scale = (float(np.asarray(input_scale).reshape(-1)[0]) * ws).astype(fdt)
        s = scale.astype(np.float64) if per_channel else np.float64(scale[0])
        with np.errstate(divide="ignore", invalid="ignore"):
            q = np.where(s != 0, np.round(data / np.where(s != 0, s, 1)), 0)
        q = np.clip(q, _INT32.min, _INT32.max).astype(np.int32)
        zp = np.zeros(scale.shape if per_channel else (), np.int32)
        return QValue(self.add_initializer(f"{bias}_quantized", q),
                      # per channel as raw bytes, per tensor in the typed fields (onnxruntime)
                      self.add_initializer(f"{bias}_quantized_scale", scale,
                                           as_list=not per_channel),
                      self.add_initializer(f"{bias}_quantized_zero_point", zp,
                                           as_list=not per_channel),
                      TensorProto.INT32, scale, zp, 0 if per_channel else None)

    # -- assembly -----------------------------------------------------------------------------

    def finish(self, nodes: list[NodeProto]) -> ModelProto:
        """The quantized model: ``nodes``, the used initializers (old and new), the domains."""
        g = self.graph
        del g.node[:]
        g.node.extend(nodes)
        used = set(self.graph_outputs)
        for n in nodes:
            used.update(n.input)
            used.update(subgraph_references(n))
        produced = {o for n in nodes for o in n.output}
        # a weight a node now computes (dequantized from its quantized form) is no initializer
        keep = [t for t in [*g.initializer, *self.new_initializers]
                if (t.name in used or t.name in self.graph_inputs) and t.name not in produced]
        seen: set[str] = set()
        unique = []
        for t in keep:
            if t.name not in seen:
                seen.add(t.name)
                unique.append(t)
        del g.initializer[:]
        g.initializer.extend(unique)
        # value_info of tensors whose type changed (quantized in place) would be stale
        keep_vi = [vi for vi in g.value_info if vi.name in produced and self._same_type(vi)]
        del g.value_info[:]
        g.value_info.extend(keep_vi)
        opsets = self.model_proto.opset_import
        if self.uses_ms_domain and not any(o.domain == MS_DOMAIN for o in opsets):
            self.model_proto.opset_import.append(helper.make_opsetid(MS_DOMAIN, 1))
        self.model.topological_sort()  # onnxruntime's node order (its tests compare it)
        self.model_proto.producer_name = PRODUCER
        from .._version import __version__

        self.model_proto.producer_version = __version__
        return self.model_proto

    def _same_type(self, vi: onnx.ValueInfoProto) -> bool:
        return self.value_types.get(vi.name) == vi.type.tensor_type.elem_type


def _untyped_outputs(model: ModelProto) -> bool:
    g = model.graph
    typed = {vi.name for vi in [*g.value_info, *g.output]}
    return any(o and o not in typed for n in g.node for o in n.output)


def weight_axis(node: NodeProto, input_index: int, rank: int) -> int | None:
    """The per-channel axis of a node's weight: output channels (Conv: 0, ConvTranspose: 1,
    Gemm: 0 or 1 by transB), MatMul's last axis, else onnxruntime's default 1; None (per
    tensor) when the weight has no such axis (a normalization's 1-D scale)."""
    if node.op_type == "Conv":
        axis = 0
    elif node.op_type == "ConvTranspose":
        axis = 1
    elif node.op_type == "Gemm":
        axis = 0 if attributes(node).get("transB", 0) else 1
    elif node.op_type == "MatMul":
        axis = rank - 1
    else:
        axis = 1
    return axis if 0 <= axis < rank else None


def load_model(model_input: str | Path | ModelProto) -> ModelProto:
    """A copy of the model with onnx's shape inference applied (types of every tensor)."""
    if isinstance(model_input, ModelProto):
        model = copy.deepcopy(model_input)
    else:
        model = onnx.load(str(model_input))
    unknown_negative_dims(model.graph)  # -1 sizes (Paddle2ONNX): inferred, not conflicting
    try:
        return onnx.shape_inference.infer_shapes(model)
    except Exception as e:  # noqa: BLE001 - quantize what can be typed
        logger.warning("shape inference failed (%s); quantizing without it", e)
        return model


def save_model(model: ModelProto, path: str | Path, use_external_data_format: bool = False
               ) -> None:
    path = Path(path)
    if use_external_data_format:
        onnx.save(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                  location=path.name + ".data", size_threshold=1024)
    else:
        onnx.save(model, str(path))
