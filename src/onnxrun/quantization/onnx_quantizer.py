"""``ONNXQuantizer``: onnxruntime's quantizer class for the QOperator format, whose mode picks
dynamic (IntegerOps: MatMulInteger, ConvInteger...) or static (QLinearOps) quantization."""

from __future__ import annotations

from onnx import ModelProto

from .dynamic import DynamicQuantizer
from .qoperator import OperatorQuantizer
from .quant_types import QuantizationMode


class ONNXQuantizer:
    """Same arguments as onnxruntime's; ``quantize_model()`` returns the quantized ModelProto
    (``.model`` is the ONNXModel being edited). Tensors shape inference could not type are an
    error, unless ``extra_options['DefaultTensorType']`` gives their type (onnxruntime's rule)."""

    def __init__(self, model: ModelProto, per_channel: bool, reduce_range: bool, mode,
                 static: bool, weight_qType, activation_qType, tensors_range,  # noqa: N803
                 nodes_to_quantize, nodes_to_exclude, op_types_to_quantize,
                 extra_options=None) -> None:
        args = (model, per_channel, reduce_range, weight_qType, activation_qType)
        ops = set(op_types_to_quantize or ())
        if mode == QuantizationMode.IntegerOps or not static:
            self._impl = DynamicQuantizer(*args, None, nodes_to_quantize, nodes_to_exclude,
                                          ops, extra_options, strict_types=True)
        else:
            self._impl = OperatorQuantizer(*args, tensors_range, nodes_to_quantize,
                                           nodes_to_exclude, ops, extra_options)
        self.mode = mode
        self.static = static

    @property
    def model(self):
        return self._impl.model

    def quantize_model(self) -> ModelProto:
        return self._impl.quantize_model()


__all__ = ["ONNXQuantizer"]
