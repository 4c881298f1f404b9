"""Command line static quantization of a model next to its ``test_data_set_*`` folders.

    python -m onnxrun.quantization.static_quantize_runner -i model.onnx -o model.qdq.onnx

The calibration inputs are the ``input_<k>.pb`` tensors of every ``test_data_set_*`` folder
beside the model (the layout of the ONNX model zoo). The options are onnxruntime's
``static_quantize_runner`` options, mapped onto ``quantize_static``'s ``extra_options``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from .calibrate import CalibrationDataReader
from .quant_types import CalibrationMethod, QuantFormat, QuantType

_TYPES = {"qint8": QuantType.QInt8, "quint8": QuantType.QUInt8, "qint16": QuantType.QInt16,
          "quint16": QuantType.QUInt16, "qint4": QuantType.QInt4, "quint4": QuantType.QUInt4,
          "qfloat8e4m3fn": QuantType.QFLOAT8E4M3FN}
_METHODS = {"minmax": CalibrationMethod.MinMax, "entropy": CalibrationMethod.Entropy,
            "percentile": CalibrationMethod.Percentile,
            "distribution": CalibrationMethod.Distribution}
_FORMATS = {"qdq": QuantFormat.QDQ, "qoperator": QuantFormat.QOperator}


class OnnxModelCalibrationDataReader(CalibrationDataReader):
    """Feeds from the ``test_data_set_*/input_<k>.pb`` files beside ``model_path``."""

    def __init__(self, model_path: str | Path) -> None:
        model_path = Path(model_path)
        graph = onnx.load(str(model_path), load_external_data=False).graph
        inits = {t.name for t in graph.initializer}
        names = [i.name for i in graph.input if i.name not in inits]
        folders = sorted(p for p in model_path.parent.iterdir()
                         if p.is_dir() and p.name.startswith("test_data_set_"))
        if not folders:
            raise FileNotFoundError(f"no test_data_set_* folder beside {model_path}")
        self.feeds = [{n: _read_tensor(d / f"input_{k}.pb") for k, n in enumerate(names)}
                      for d in folders]
        self._it = iter(self.feeds)

    def get_next(self) -> dict | None:
        return next(self._it, None)


def _read_tensor(path: Path) -> np.ndarray:
    t = onnx.TensorProto()
    t.ParseFromString(path.read_bytes())
    return numpy_helper.to_array(t)


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Static quantization of an ONNX model")
    p.add_argument("-i", "--input_model_path", required=True, help="the float model")
    p.add_argument("-o", "--output_quantized_model_path", required=True,
                   help="where to write the quantized model")
    p.add_argument("--activation_type", choices=list(_TYPES), default="quint8")
    p.add_argument("--weight_type", choices=list(_TYPES), default="qint8")
    p.add_argument("--enable_subgraph", action="store_true", help="quantize subgraphs too")
    p.add_argument("--force_quantize_no_input_check", action="store_true",
                   help="quantize data-movement operators even after a float producer")
    p.add_argument("--matmul_const_b_only", action="store_true",
                   help="quantize only MatMuls whose B is a constant")
    p.add_argument("--add_qdq_pair_to_weight", action="store_true",
                   help="keep weights float with a QuantizeLinear/DequantizeLinear pair")
    p.add_argument("--dedicated_qdq_pair", action="store_true",
                   help="one QuantizeLinear/DequantizeLinear pair per consumer")
    p.add_argument("--op_types_to_exclude_output_quantization", nargs="+", default=[])
    p.add_argument("--calibration_method", default="minmax", choices=list(_METHODS))
    p.add_argument("--quant_format", default="qdq", choices=list(_FORMATS))
    p.add_argument("--calib_tensor_range_symmetric", action="store_true")
    p.add_argument("--calib_moving_average", action="store_true")
    p.add_argument("--disable_quantize_bias", action="store_true",
                   help="leave Conv/Gemm biases float")
    p.add_argument("--use_qdq_contrib_ops", action="store_true",
                   help="com.microsoft QuantizeLinear / DequantizeLinear")
    p.add_argument("--minimum_real_range", type=float, default=0.0001)
    p.add_argument("--qdq_keep_removable_activations", action="store_true")
    p.add_argument("--qdq_disable_weight_adjust_for_int32_bias", action="store_true")
    p.add_argument("--per_channel", action="store_true")
    p.add_argument("--nodes_to_quantize", nargs="+", default=None)
    p.add_argument("--nodes_to_exclude", nargs="+", default=None)
    p.add_argument("--op_per_channel_axis", nargs=2, action="append", default=[],
                   metavar=("OP_TYPE", "PER_CHANNEL_AXIS"))
    p.add_argument("--tensor_quant_overrides", help="a JSON file of tensor overrides")
    return p.parse_args(argv)


def get_tensor_quant_overrides(path: str | None) -> dict:
    """The JSON overrides with their scales and zero points as arrays."""
    if not path:
        return {}
    with open(path) as f:
        overrides = json.load(f)
    for encodings in overrides.values():
        for enc in encodings:
            if "scale" in enc:
                enc["scale"] = np.array(enc["scale"], dtype=np.float32)
            if "zero_point" in enc:
                enc["zero_point"] = np.array(enc["zero_point"])
    return overrides


def main(argv: list[str] | None = None) -> None:
    from .static import StaticQuantConfig, quantize

    args = parse_arguments(argv)
    extra = {
        "EnableSubgraph": args.enable_subgraph,
        "ForceQuantizeNoInputCheck": args.force_quantize_no_input_check,
        "MatMulConstBOnly": args.matmul_const_b_only,
        "AddQDQPairToWeight": args.add_qdq_pair_to_weight,
        "OpTypesToExcludeOutputQuantization": args.op_types_to_exclude_output_quantization,
        "DedicatedQDQPair": args.dedicated_qdq_pair,
        "QDQOpTypePerChannelSupportToAxis": {op: int(ax) for op, ax in args.op_per_channel_axis},
        "CalibTensorRangeSymmetric": args.calib_tensor_range_symmetric,
        "CalibMovingAverage": args.calib_moving_average,
        "QuantizeBias": not args.disable_quantize_bias,
        "UseQDQContribOps": args.use_qdq_contrib_ops,
        "MinimumRealRange": args.minimum_real_range,
        "QDQKeepRemovableActivations": args.qdq_keep_removable_activations,
        "QDQDisableWeightAdjustForInt32Bias": args.qdq_disable_weight_adjust_for_int32_bias,
        "TensorQuantOverrides": get_tensor_quant_overrides(args.tensor_quant_overrides),
    }
    config = StaticQuantConfig(
        calibration_data_reader=OnnxModelCalibrationDataReader(args.input_model_path),
        calibrate_method=_METHODS[args.calibration_method],
        quant_format=_FORMATS[args.quant_format], activation_type=_TYPES[args.activation_type],
        weight_type=_TYPES[args.weight_type], op_types_to_quantize=None,
        nodes_to_quantize=args.nodes_to_quantize, nodes_to_exclude=args.nodes_to_exclude,
        per_channel=args.per_channel, reduce_range=False, use_external_data_format=False,
        extra_options=extra)
    quantize(args.input_model_path, args.output_quantized_model_path, config)


if __name__ == "__main__":
    main()
