"""``get_qnn_qdq_config``: a static quantization configuration for QNN's QDQ models.

QNN's operators have constraints onnxruntime's generic QDQ graph does not meet by itself: 16-bit
Sigmoid and Tanh outputs with fixed parameters, MatMul / LayerNormalization weights in the
default weight type next to 16-bit activations, consistent types around mixed-precision tensors.
The configuration expresses all of them as tensor overrides on top of the user's.
"""

from __future__ import annotations

import copy
import logging
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from ...calibrate import CalibrationDataReader
from ...quant_types import CalibrationMethod, QuantType
from ...static import StaticQuantConfig
from ...tensor_quant_overrides import TensorQuantOverridesHelper
from .mixed_precision_overrides_utils import MixedPrecisionTensorQuantOverridesFixer

Q16_TYPES = {QuantType.QInt16, QuantType.QUInt16}
Q8_TYPES = {QuantType.QInt8, QuantType.QUInt8}
Q4_TYPES = {QuantType.QInt4, QuantType.QUInt4}
OP_TYPES_TO_EXCLUDE = {"Cast"}
MODEL_SIZE_THRESHOLD = 2147483648  # 2 GiB: beyond it the model needs external data

logger = logging.getLogger("onnxrun.quantization")

# QNN's fixed output parameters of 16-bit Sigmoid (range [0, 1]) and Tanh ([-1, 1])
_FIXED_16BIT = {
    ("Sigmoid", QuantType.QUInt16): (1.0 / 65536.0, np.uint16, 0),
    ("Sigmoid", QuantType.QInt16): (1.0 / 32768.0, np.int16, 0),
    ("Tanh", QuantType.QUInt16): (1.0 / 32768.0, np.uint16, 32768),
    ("Tanh", QuantType.QInt16): (1.0 / 32768.0, np.int16, 0),
}


def get_qnn_qdq_config(model_input: str | Path | onnx.ModelProto,
                       calibration_data_reader: CalibrationDataReader,
                       calibrate_method: CalibrationMethod = CalibrationMethod.MinMax,
                       activation_type: QuantType = QuantType.QUInt8,
                       weight_type: QuantType = QuantType.QUInt8, per_channel: bool = False,
                       init_overrides: dict[str, list[dict[str, Any]]] | None = None,
                       add_qtype_converts: bool = True, activation_symmetric: bool = False,
                       weight_symmetric: bool | None = None,
                       keep_removable_activations: bool = False, stride: int | None = None,
                       calibration_providers: list[str] | None = None,
                       op_types_to_quantize: list[str] | None = None,
                       nodes_to_exclude: list[str] | None = None) -> StaticQuantConfig:
    """A StaticQuantConfig whose QDQ model runs on QNN (same arguments as onnxruntime's).

    ``init_overrides`` (copied, never modified) are completed with the conversions mixed
    precision needs (``add_qtype_converts``) and QNN's operator constraints; the result is in
    ``config.extra_options["TensorQuantOverrides"]``.
    """
    if weight_symmetric is None:
        weight_symmetric = weight_type in (QuantType.QInt8, QuantType.QInt16)
    model = model_input if isinstance(model_input, onnx.ModelProto) \
        else onnx.load_model(str(model_input), load_external_data=False)
    initializers = {t.name: t for t in model.graph.initializer}
    external = any(onnx.external_data_helper.uses_external_data(t)
                   for t in model.graph.initializer)
    overrides = TensorQuantOverridesHelper(copy.deepcopy(init_overrides) if init_overrides
                                           else {})
    if not overrides.empty() and add_qtype_converts:
        fixer = MixedPrecisionTensorQuantOverridesFixer.create_from_model(overrides, model,
                                                                          activation_type)
        fixer.apply(activation_type, activation_symmetric)

    compat = QnnCompatibilityOverrides(activation_type, weight_type, activation_symmetric,
                                       weight_symmetric, per_channel, overrides, initializers)
    wanted = set(op_types_to_quantize) if op_types_to_quantize else None
    excluded = set(nodes_to_exclude) if nodes_to_exclude else set()
    op_types = set()
    for node in model.graph.node:
        if (wanted and node.op_type not in wanted) or node.name in excluded:
            continue
        op_types.add(node.op_type)
        compat.process_node(node)

    extra_options = {
        "MinimumRealRange": 0.0001,
        "DedicatedQDQPair": False,
        "QDQKeepRemovableActivations": keep_removable_activations,
        "TensorQuantOverrides": overrides.get_dict(),
        "ActivationSymmetric": activation_symmetric,
        "WeightSymmetric": weight_symmetric,
        "CalibStridedMinMax": stride,
    }
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    wide = Q16_TYPES | Q4_TYPES
    if opset < 21 and ({activation_type, weight_type} & wide
                       or overrides.get_quant_types() & wide):
        extra_options["UseQDQContribOps"] = True  # 16-/4-bit Q/DQ before opset 21
    return StaticQuantConfig(
        calibration_data_reader, calibrate_method=calibrate_method,
        activation_type=activation_type, weight_type=weight_type,
        op_types_to_quantize=op_types_to_quantize or sorted(op_types - OP_TYPES_TO_EXCLUDE),
        nodes_to_exclude=nodes_to_exclude, per_channel=per_channel,
        use_external_data_format=external or model.ByteSize() >= MODEL_SIZE_THRESHOLD,
        calibration_providers=calibration_providers, extra_options=extra_options)


class QnnCompatibilityOverrides:
    """Adds the overrides QNN's operators need, node by node."""

    def __init__(self, default_activation_qtype: QuantType, default_weight_qtype: QuantType,
                 activation_symmetric: bool, weight_symmetric: bool, per_channel: bool,
                 overrides: TensorQuantOverridesHelper,
                 initializers: dict[str, onnx.TensorProto]) -> None:
        self.default_activation_qtype = default_activation_qtype
        self.default_weight_qtype = default_weight_qtype
        self.activation_symmetric = activation_symmetric
        self.weight_symmetric = weight_symmetric
        self.per_channel = per_channel
        self.overrides = overrides
        self.initializers = initializers

    def process_node(self, node: onnx.NodeProto) -> None:
        if node.op_type == "MatMul":
            self._process_matmul(node)
        elif node.op_type == "LayerNormalization":
            if not self.per_channel:
                self._weight_in_default_type(node)
        elif node.op_type in ("Sigmoid", "Tanh"):
            self._fixed_16bit_output(node)

    def _weight_in_default_type(self, node: onnx.NodeProto) -> None:
        """An initializer read next to a 16-bit activation gets the default 8-bit weight type
        (onnxruntime's tool would give it the activation type otherwise)."""
        if self.default_weight_qtype not in Q8_TYPES:
            return
        act16 = weight = None
        for name in node.input[:2]:
            if not name:
                continue
            is_weight = name in self.initializers
            info = self.overrides.get_node_input_qtype_info(
                name, node.name, None if is_weight else self.default_activation_qtype)
            if info.axis is not None:
                return  # per channel: left as the user set it
            if is_weight and info.quant_type == self.default_weight_qtype \
                    and info.symmetric == self.weight_symmetric:
                return
            if is_weight:
                weight = name
            elif info.quant_type in Q16_TYPES:
                act16 = name
        if act16 and weight:
            done = self.overrides.update_tensor_overrides(
                weight, {"quant_type": self.default_weight_qtype,
                         "symmetric": self.weight_symmetric}, overwrite=False)
            if not done:
                logger.warning("Unable to override quant_type/symmetric for %s node's input "
                               "weight %s: it is already overridden", node.op_type, weight)

    def _process_matmul(self, node: onnx.NodeProto) -> None:
        if not self.per_channel:
            self._weight_in_default_type(node)
            return
        for name in node.input:
            if name in self.initializers and name not in self.overrides:
                self.overrides.update_tensor_overrides(
                    name, {"quant_type": self.default_weight_qtype,
                           "symmetric": self.weight_symmetric})

    def _fixed_16bit_output(self, node: onnx.NodeProto) -> None:
        qtype = self.overrides.get_node_output_qtype_info(node.output[0],
                                                          self.default_activation_qtype
                                                          ).quant_type
        fixed = _FIXED_16BIT.get((node.op_type, qtype))
        if fixed is not None:
            scale, dtype, zp = fixed
            self.overrides.update_tensor_overrides(
                node.output[0], {"quant_type": qtype, "scale": np.array(scale, np.float32),
                                 "zero_point": np.array(zp, dtype)})


__all__ = ["QnnCompatibilityOverrides", "get_qnn_qdq_config"]
