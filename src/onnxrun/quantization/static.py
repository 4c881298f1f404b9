"""Static quantization: activation ranges calibrated on sample inputs, then QDQ or QOperator.

``quantize_static`` has onnxruntime's signature and defaults. Calibration runs the model on
onnxrun (``calibrate.py``); the quantized model is written in the QDQ format (``qdq.py``) or the
QOperator format (``qoperator.py``).
"""

from __future__ import annotations

import copy
import logging
from pathlib import Path
from typing import Any

import onnx
from onnx import ModelProto

from .base import ensure_opset, load_model, opset_of, save_model
from .calibrate import (
    CalibrationDataReader,
    TensorsData,
    create_calibrator,
    load_tensors_data,
    save_tensors_data,
)
from .dynamic import quantize_dynamic
from .qdq import QDQ_OPS, QDQQuantizer
from .qoperator import QLINEAR_OPS, OperatorQuantizer
from .quant_types import CalibrationMethod, QuantFormat, QuantType
from .tensor_quant_overrides import TensorQuantOverridesHelper

logger = logging.getLogger("onnxrun.quantization")

# extra_options -> create_calibrator's options, as onnxruntime maps them
_CALIB_OPTIONS = [("CalibTensorRangeSymmetric", "symmetric"),
                  ("CalibMovingAverage", "moving_average"),
                  ("CalibMovingAverageConstant", "averaging_constant"),
                  ("CalibMaxIntermediateOutputs", "max_intermediate_outputs"),
                  ("CalibPercentile", "percentile"), ("CalibNumBins", "num_bins"),
                  ("CalibNumQuantizedBins", "num_quantized_bins"),
                  ("CalibShowProgress", "show_progress")]
_SIXTEEN = (QuantType.QInt16, QuantType.QUInt16)
_FOUR = (QuantType.QInt4, QuantType.QUInt4)


def check_static_quant_arguments(quant_format: QuantFormat, activation_type: QuantType,
                                 weight_type: QuantType) -> None:
    if activation_type == QuantType.QInt8 and weight_type == QuantType.QUInt8:
        raise ValueError("ONNXRuntime quantization doesn't support data format:"
                         "activation_type=QuantType.QInt8, weight_type=QuantType.QUInt8")
    if (activation_type == QuantType.QFLOAT8E4M3FN) != (weight_type == QuantType.QFLOAT8E4M3FN):
        raise ValueError("float 8 quantization needs both activation_type and weight_type "
                         "QFLOAT8E4M3FN")
    wide = (*_SIXTEEN, *_FOUR)
    if (activation_type in wide or weight_type in wide) and quant_format != QuantFormat.QDQ:
        raise ValueError("Only QuantFormat.QDQ supports 16-bit and 4-bit quantization types.")
    if activation_type in _FOUR:
        raise ValueError("4-bit types are for weights only")


def _required_opset(quant_format: QuantFormat, per_channel: bool, activation_type: QuantType,
                    weight_type: QuantType, override_types=frozenset()) -> int:
    wide = {*_SIXTEEN, *_FOUR}
    if activation_type in _SIXTEEN or weight_type in wide or wide & set(override_types):
        return 21
    if QuantType.QFLOAT8E4M3FN in (activation_type, weight_type):
        return 19  # QuantizeLinear's float 8 types
    if per_channel and quant_format == QuantFormat.QDQ:
        return 13  # DequantizeLinear's axis
    return 10  # QuantizeLinear / DequantizeLinear exist from opset 10 on


def calibrate(model: ModelProto, calibration_data_reader: CalibrationDataReader,
              op_types_to_quantize, calibrate_method: CalibrationMethod,
              extra_options: dict[str, Any], providers=None) -> TensorsData:
    options = {key: extra_options[name] for name, key in _CALIB_OPTIONS if name in extra_options}
    calibrator = create_calibrator(model, op_types_to_quantize, calibrate_method=calibrate_method,
                                   providers=providers, extra_options=options)
    stride = extra_options.get("CalibStridedMinMax")
    if stride:
        total = len(calibration_data_reader)
        if total % stride:
            raise ValueError(f"Total data size ({total}) is not divisible by stride size "
                             f"({stride}).")
        for start in range(0, total, stride):
            calibration_data_reader.set_range(start_index=start, end_index=start + stride)
            calibrator.collect_data(calibration_data_reader)
    else:
        calibrator.collect_data(calibration_data_reader)
    return calibrator.compute_data()


def quantize_static(model_input: str | Path | ModelProto, model_output: str | Path,
                    calibration_data_reader: CalibrationDataReader,
                    quant_format: QuantFormat = QuantFormat.QDQ, op_types_to_quantize=None,
                    per_channel: bool = False, reduce_range: bool = False,
                    activation_type: QuantType = QuantType.QInt8,
                    weight_type: QuantType = QuantType.QInt8, nodes_to_quantize=None,
                    nodes_to_exclude=None, use_external_data_format: bool = False,
                    calibrate_method: CalibrationMethod = CalibrationMethod.MinMax,
                    calibration_providers=None, extra_options=None,
                    calibration_cache_path: str | Path | None = None) -> None:
    """Quantize weights and activations with ranges calibrated on ``calibration_data_reader``.

    Same arguments as ``onnxruntime.quantization.quantize_static``. The ``extra_options`` read:
    ``ActivationSymmetric``, ``WeightSymmetric``, ``MatMulConstBOnly``,
    ``ForceQuantizeNoInputCheck``, ``AddQDQPairToWeight``, ``OpTypesToExcludeOutputQuantization``,
    ``QDQKeepRemovableActivations``, ``QDQDisableWeightAdjustForInt32Bias``,
    ``MinimumRealRange``, ``CalibTensorRangeSymmetric``, ``CalibMovingAverage``,
    ``CalibMovingAverageConstant``, ``CalibMaxIntermediateOutputs``, ``CalibPercentile``,
    ``CalibNumBins``, ``CalibNumQuantizedBins``, ``CalibStridedMinMax`` and
    ``CalibShowProgress`` (the progress bar on stderr, default True).

    ``calibration_cache_path``: calibration results are read from this JSON file when it holds
    results of the same method (then ``calibration_data_reader`` may be None), else computed
    and written there.
    """
    extra = dict(extra_options or {})
    ops = set(op_types_to_quantize or (QLINEAR_OPS | QDQ_OPS))
    check_static_quant_arguments(quant_format, activation_type, weight_type)
    model = load_model(model_input)
    override_types = TensorQuantOverridesHelper(extra.get("TensorQuantOverrides")
                                                ).get_quant_types()
    required = _required_opset(quant_format, per_channel, activation_type, weight_type,
                               override_types)
    if extra.get("BlockSize"):
        required = 21  # block-wise QuantizeLinear / DequantizeLinear
    if opset_of(model) < required:  # as onnxruntime: an opset below 10 goes to 11
        model = ensure_opset(model, max(required, 11), "the quantization types")
    smooth = bool(extra.get("SmoothQuant", False))
    ranges = _cached_ranges(calibration_cache_path, calibrate_method, smooth,
                            calibration_data_reader is None)
    if ranges is None:
        if calibration_data_reader is None:
            raise ValueError("quantize_static needs a calibration_data_reader (or a "
                             "calibration_cache_path holding calibration results)")
        ranges = calibrate(model, calibration_data_reader, list(ops), calibrate_method, extra,
                           calibration_providers)
        if calibration_cache_path is not None:
            save_tensors_data(ranges, calibration_cache_path, smooth_quant=smooth)
    args = (model, per_channel, reduce_range, weight_type, activation_type, ranges,
            nodes_to_quantize, nodes_to_exclude, ops, extra)
    if quant_format == QuantFormat.QOperator:
        quantizer = OperatorQuantizer(*args)
    else:
        quantizer = QDQQuantizer(*args)
    save_model(quantizer.quantize_model(), model_output, use_external_data_format)


def _cached_ranges(path: str | Path | None, method: CalibrationMethod, smooth_quant: bool,
                   required: bool) -> TensorsData | None:
    """The calibration results cached at ``path`` if they were computed the same way."""
    if path is None or not Path(path).is_file():
        return None
    import json

    with open(path) as f:
        cached_smooth = bool(json.load(f).get("smooth_quant", False))
    cached = load_tensors_data(path)
    why = None
    if cached.calibration_method != method:
        why = (f"the calibration cache {path} holds {cached.calibration_method} results, not "
               f"{method}")
    elif cached_smooth != smooth_quant:
        why = (f"the calibration cache {path} was computed with smooth_quant={cached_smooth}, "
               f"this run uses smooth_quant={smooth_quant}")
    if why is None:
        return cached
    if required:
        raise ValueError(why + " and no calibration_data_reader was given")
    logger.warning("%s: calibrating again", why)
    return None


# -- configuration objects, as onnxruntime's quantize() takes them ------------------------------


class QuantConfig:
    def __init__(self, activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                 op_types_to_quantize=None, nodes_to_quantize=None, nodes_to_exclude=None,
                 per_channel=False, reduce_range=False, use_external_data_format=False) -> None:
        self.activation_type = activation_type
        self.weight_type = weight_type
        self.op_types_to_quantize = op_types_to_quantize or []
        self.nodes_to_quantize = nodes_to_quantize or []
        self.nodes_to_exclude = nodes_to_exclude or []
        self.per_channel = per_channel
        self.reduce_range = reduce_range
        self.use_external_data_format = use_external_data_format


class StaticQuantConfig(QuantConfig):
    def __init__(self, calibration_data_reader: CalibrationDataReader,
                 calibrate_method=CalibrationMethod.MinMax, quant_format=QuantFormat.QDQ,
                 activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
                 op_types_to_quantize=None, nodes_to_quantize=None, nodes_to_exclude=None,
                 per_channel=False, reduce_range=False, use_external_data_format=False,
                 calibration_providers=None, extra_options=None) -> None:
        super().__init__(activation_type, weight_type, op_types_to_quantize, nodes_to_quantize,
                         nodes_to_exclude, per_channel, reduce_range, use_external_data_format)
        self.calibration_data_reader = calibration_data_reader
        self.calibrate_method = calibrate_method
        self.quant_format = quant_format
        self.calibration_providers = calibration_providers
        self.extra_options = extra_options or {}


class DynamicQuantConfig(QuantConfig):
    def __init__(self, weight_type=QuantType.QInt8, op_types_to_quantize=None,
                 nodes_to_quantize=None, nodes_to_exclude=None, per_channel=False,
                 reduce_range=False, use_external_data_format=False, extra_options=None) -> None:
        super().__init__(QuantType.QUInt8, weight_type, op_types_to_quantize, nodes_to_quantize,
                         nodes_to_exclude, per_channel, reduce_range, use_external_data_format)
        self.extra_options = extra_options or {}


def get_qdq_config(model_input: str | Path | ModelProto,
                   calibration_data_reader: CalibrationDataReader,
                   calibrate_method: CalibrationMethod = CalibrationMethod.MinMax,
                   calibrate_args: dict[str, Any] | None = None,
                   activation_type: QuantType = QuantType.QUInt8,
                   weight_type: QuantType = QuantType.QInt8, activation_symmetric: bool = False,
                   weight_symmetric: bool | None = None, per_channel: bool = False,
                   reduce_range: bool = False, keep_removable_activations: bool = False,
                   min_real_range: float | None = None,
                   tensor_quant_overrides: dict[str, list[dict[str, Any]]] | None = None,
                   calibration_providers: list[str] | None = None,
                   op_types_to_quantize: list[str] | None = None,
                   nodes_to_exclude=None, extra_options: dict | None = None
                   ) -> StaticQuantConfig:
    """A QDQ configuration that quantizes every operator of the model (onnxruntime's helper).

    ``nodes_to_exclude`` is a list of node names or a function ``(model, node) -> bool``;
    ``calibrate_args`` takes ``symmetric``, ``moving_average``, ``averaging_constant``,
    ``max_intermediate_outputs`` and ``percentile``; ``extra_options`` override the rest.
    """
    model = model_input if isinstance(model_input, ModelProto) \
        else onnx.load_model(str(model_input), load_external_data=False)
    overrides = TensorQuantOverridesHelper(copy.deepcopy(tensor_quant_overrides or {}))
    external = any(onnx.external_data_helper.uses_external_data(t)
                   for t in model.graph.initializer)
    wanted = set(op_types_to_quantize) if op_types_to_quantize else None
    excluded = set(nodes_to_exclude) if isinstance(nodes_to_exclude, list) else set()
    op_types = set()
    for node in model.graph.node:
        if (wanted and node.op_type not in wanted) or node.name in excluded:
            continue
        if callable(nodes_to_exclude) and nodes_to_exclude(model, node):
            excluded.add(node.name)
        else:
            op_types.add(node.op_type)
    options: dict[str, Any] = {
        "MinimumRealRange": min_real_range,
        "QDQKeepRemovableActivations": keep_removable_activations,
        "ActivationSymmetric": activation_symmetric,
        "WeightSymmetric": weight_symmetric,
        "ForceQuantizeNoInputCheck": True,
        "TensorQuantOverrides": overrides.get_dict(),
    }
    calib_keys = (("symmetric", "CalibTensorRangeSymmetric"),
                  ("moving_average", "CalibMovingAverage"),
                  ("averaging_constant", "CalibMovingAverageConstant"),
                  ("max_intermediate_outputs", "CalibMaxIntermediateOutputs"),
                  ("percentile", "CalibPercentile"))
    for arg, key in calib_keys:
        if calibrate_args and arg in calibrate_args:
            options[key] = calibrate_args[arg]
    # below opset 21, 4-bit Q/DQ need onnxruntime's contrib operators, unless a 16-bit type
    # makes quantize_static move the model to opset 21 anyway
    override_types = overrides.get_quant_types()
    if _opset(model) < 21 and not ({activation_type, weight_type, *override_types}
                                   & set(_SIXTEEN)) \
            and {activation_type, weight_type, *override_types} & set(_FOUR):
        options["UseQDQContribOps"] = True
    options.update(extra_options or {})
    return StaticQuantConfig(
        calibration_data_reader, calibrate_method=calibrate_method, quant_format=QuantFormat.QDQ,
        activation_type=activation_type, weight_type=weight_type,
        op_types_to_quantize=op_types_to_quantize or sorted(
            op_types - {"Cast", "DequantizeLinear", "QuantizeLinear"}),
        nodes_to_exclude=sorted(excluded), per_channel=per_channel, reduce_range=reduce_range,
        use_external_data_format=external or model.ByteSize() >= 2147483648,
        calibration_providers=calibration_providers, extra_options=options)


def _opset(model: ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def quantize(model_input: str | Path | ModelProto, model_output: str | Path,
             quant_config: QuantConfig) -> None:
    """Quantize with a StaticQuantConfig or a DynamicQuantConfig."""
    c = quant_config
    if isinstance(c, StaticQuantConfig):
        quantize_static(model_input, model_output, c.calibration_data_reader,
                        quant_format=c.quant_format, op_types_to_quantize=c.op_types_to_quantize,
                        per_channel=c.per_channel, reduce_range=c.reduce_range,
                        activation_type=c.activation_type, weight_type=c.weight_type,
                        nodes_to_quantize=c.nodes_to_quantize,
                        nodes_to_exclude=c.nodes_to_exclude,
                        use_external_data_format=c.use_external_data_format,
                        calibrate_method=c.calibrate_method,
                        calibration_providers=c.calibration_providers,
                        extra_options=c.extra_options)
    elif isinstance(c, DynamicQuantConfig):
        quantize_dynamic(model_input, model_output, op_types_to_quantize=c.op_types_to_quantize,
                         per_channel=c.per_channel, reduce_range=c.reduce_range,
                         weight_type=c.weight_type, nodes_to_quantize=c.nodes_to_quantize,
                         nodes_to_exclude=c.nodes_to_exclude,
                         use_external_data_format=c.use_external_data_format,
                         extra_options=c.extra_options)
    else:
        raise TypeError("quant_config must be a StaticQuantConfig or a DynamicQuantConfig")


__all__ = ["DynamicQuantConfig", "QuantConfig", "StaticQuantConfig",
           "check_static_quant_arguments", "get_qdq_config", "load_model", "quantize",
           "quantize_static", "save_model"]
