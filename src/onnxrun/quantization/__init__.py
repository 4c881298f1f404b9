"""onnxruntime's quantization tool on onnxrun: ``onnxrun.quantization`` has the names of
``onnxruntime.quantization``, and the models it writes run on both engines.

    from onnxrun.quantization import quantize_dynamic, quantize_static, QuantFormat

    quantize_dynamic("model.onnx", "model.int8.onnx")              # weights int8, 2-4x smaller
    quantize_static("model.onnx", "model.qdq.onnx", data_reader)   # calibrated activations too

Dynamic quantization stores MatMul / Conv / LSTM weights and embedding tables as 8-bit integers
and quantizes activations at run time. Static quantization runs the model on onnxrun over the
calibration data (MinMax, Entropy or Percentile ranges) and writes QDQ (QuantizeLinear /
DequantizeLinear around float operators) or QOperator (QLinearConv, QLinearMatMul, ...) models.
"""

from __future__ import annotations

from .calibrate import (
    CalibraterBase,
    CalibrationDataReader,
    EntropyCalibrater,
    FeedsDataReader,
    HistogramCalibrater,
    MinMaxCalibrater,
    PercentileCalibrater,
    TensorData,
    TensorsData,
    create_calibrator,
    load_tensors_data,
    save_tensors_data,
)
from .dynamic import quantize_dynamic
from .preprocess import quant_pre_process
from .qdq import QDQQuantizer
from .qoperator import OperatorQuantizer
from .quant_types import (
    CalibrationMethod,
    QuantFormat,
    QuantizationMode,
    QuantType,
    compute_scale_zp,
    get_qmin_qmax_for_qType,
    quantize_data,
    quantize_nparray,
)
from .quant_utils import write_calibration_table
from .static import (
    DynamicQuantConfig,
    QuantConfig,
    StaticQuantConfig,
    get_qdq_config,
    quantize,
    quantize_static,
)

__all__ = [
    "CalibraterBase", "CalibrationDataReader", "CalibrationMethod", "DynamicQuantConfig",
    "EntropyCalibrater", "FeedsDataReader", "HistogramCalibrater", "MinMaxCalibrater",
    "OperatorQuantizer", "PercentileCalibrater", "QDQQuantizer", "QuantConfig", "QuantFormat",
    "QuantType", "QuantizationMode", "StaticQuantConfig", "TensorData", "TensorsData",
    "compute_scale_zp", "create_calibrator", "get_qdq_config", "load_tensors_data",
    "get_qmin_qmax_for_qType", "quant_pre_process", "quantize", "quantize_data",
    "quantize_dynamic", "quantize_nparray", "quantize_static", "save_tensors_data",
    "write_calibration_table",
]
