"""``onnxruntime.quantization.quant_utils``'s public helpers on onnxrun's quantizer.

Scripts written for onnxruntime's tool import these names from ``quant_utils``: the enums, the
scale / zero point arithmetic (``quant_types.py`` holds it), opset and metadata helpers, the
naming conventions of Q/DQ tensors, 4-bit packing and block-wise weight quantization.
"""

from __future__ import annotations

import copy
import tempfile
from enum import Enum
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
from onnx import ModelProto, TensorProto, external_data_helper, helper, numpy_helper

from .base import MS_DOMAIN, ensure_opset, opset_of
from .quant_types import (
    NP_TYPES,
    QuantFormat,
    QuantizationMode,
    QuantType,
    compute_scale_zp,
    compute_scale_zp_blocked,
    get_qmin_qmax_for_qType,
    qtype_of,
    quantize_data,
    quantize_nparray,
    snap_zero_point_to_uint8,
)

ms_domain = MS_DOMAIN
QUANT_OP_NAME = "QuantizeLinear"
QUANT_INPUT_SUFFIX = "_QuantizeLinear_Input"
DEQUANT_OP_NAME = "DequantizeLinear"
DEQUANT_OUTPUT_SUFFIX = "_DequantizeLinear_Output"
TENSOR_NAME_QUANT_SUFFIX = "_quantized"
MODEL_SIZE_THRESHOLD = 2147483648  # 2 GiB: beyond it a model needs external data
FLOAT8_TYPES = (TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT8E4M3FNUZ, TensorProto.FLOAT8E5M2,
                TensorProto.FLOAT8E5M2FNUZ)
ONNX_TYPE_TO_NP_TYPE = {**{k: v for k, v in NP_TYPES.items()},
                        TensorProto.FLOAT8E4M3FN: np.dtype(ml_dtypes.float8_e4m3fn)}
ONNX_INT_TYPE_RANGE = {t: tuple(int(v) for v in get_qmin_qmax_for_qType(t))
                       for t in (TensorProto.UINT8, TensorProto.INT8, TensorProto.UINT16,
                                 TensorProto.INT16, TensorProto.UINT4, TensorProto.INT4)}


class QuantizedValueType(Enum):
    Input = 0
    Initializer = 1

    def __str__(self) -> str:
        return self.name


def get_qrange_for_qType(qtype, reduce_range: bool = False,  # noqa: N802 (onnxruntime's name)
                         symmetric: bool = False) -> int:
    qmin, qmax = get_qmin_qmax_for_qType(qtype, reduce_range, symmetric)
    return int(qmax) - int(qmin)


def normalize_axis(axis: int, rank: int) -> tuple[bool, int]:
    """(whether ``axis`` is valid for ``rank``, the axis made non-negative)."""
    if not -rank <= axis < rank:
        return False, axis
    return True, axis % rank if rank else axis


def pack_bytes_to_4bit(src_8bit: bytes) -> bytearray:
    """Two 4-bit values a byte, the first in the low nibble (ONNX's INT4/UINT4 layout)."""
    a = np.frombuffer(bytes(src_8bit), dtype=np.uint8) & 0x0F
    if a.size % 2:
        a = np.append(a, np.uint8(0))
    return bytearray((a[0::2] | (a[1::2] << 4)).astype(np.uint8).tobytes())


def tensor_proto_to_array(initializer: TensorProto) -> np.ndarray:
    if initializer.data_type not in (TensorProto.FLOAT, TensorProto.FLOAT16):
        raise ValueError(f"only float initializers can be quantized: {initializer.name} is "
                         f"{TensorProto.DataType.Name(initializer.data_type)}")
    return numpy_helper.to_array(initializer)


def quantize_onnx_initializer(weight: TensorProto, quant_type: int, zero_point: np.ndarray,
                              scale: np.ndarray, axis: int | None = None,
                              quant_weight_name: str | None = None, block_size: int = 0
                              ) -> TensorProto:
    """``weight`` quantized with the given parameters: per tensor, per channel along ``axis``,
    or per block of ``block_size`` along ``axis``."""
    data = tensor_proto_to_array(weight)
    qtype = qtype_of(quant_type)
    scale = np.asarray(scale)
    zero_point = np.asarray(zero_point)
    if axis is not None and block_size > 0:
        axis = axis % data.ndim
        reps = [block_size if i == axis else 1 for i in range(data.ndim)]
        s = np.repeat(scale, reps[axis], axis=axis).take(range(data.shape[axis]), axis=axis)
        z = np.repeat(zero_point, reps[axis], axis=axis).take(range(data.shape[axis]), axis=axis)
    elif axis is not None and scale.size > 1:
        axis = axis % data.ndim
        shape = [-1 if i == axis else 1 for i in range(data.ndim)]
        s, z = scale.reshape(shape), zero_point.reshape(shape)
    else:
        s, z = scale, zero_point
    if qtype == TensorProto.FLOAT8E4M3FN:
        q = (data.astype(np.float32) / s.astype(np.float32)).astype(ml_dtypes.float8_e4m3fn)
    else:
        q = quantize_nparray(qtype, data, s, z)
    name = quant_weight_name or f"{weight.name}{TENSOR_NAME_QUANT_SUFFIX}"
    return numpy_helper.from_array(np.asarray(q), name)


def find_by_name(item_name: str, item_list):
    """The first item of ``item_list`` named ``item_name`` (None when absent)."""
    return next((item for item in item_list if item.name == item_name), None)


def get_elem_index(elem_name: str, elem_list) -> int:
    return next((i for i, e in enumerate(elem_list) if e == elem_name), -1)


def attribute_to_kwarg(attribute: onnx.AttributeProto) -> dict:
    """``{name: value}`` of an attribute, for ``helper.make_node(**kwargs)``."""
    return {attribute.name: helper.get_attribute_value(attribute)}


def get_mul_node(inputs: list[str], output: str, name: str) -> onnx.NodeProto:
    return helper.make_node("Mul", inputs, [output], name)


def generate_identified_filename(filename: Path, identifier: str) -> Path:
    filename = Path(filename)
    return filename.parent.joinpath(filename.stem + identifier + filename.suffix)


def model_has_external_data(model_path: Path) -> bool:
    model = onnx.load(Path(model_path).as_posix(), load_external_data=False)
    return any(external_data_helper.uses_external_data(t) for t in model.graph.initializer)


def _set_prop(model: ModelProto, key: str) -> None:
    props = {p.key: p.value for p in model.metadata_props}
    props[key] = "onnxruntime.quant"
    helper.set_model_props(model, props)


def _has_prop(model: ModelProto, key: str) -> bool:
    return any(p.key == key and p.value == "onnxruntime.quant" for p in model.metadata_props)


def add_pre_process_metadata(model: ModelProto) -> None:
    _set_prop(model, "onnx.quant.pre_process")


def model_has_pre_process_metadata(model: ModelProto) -> bool:
    return _has_prop(model, "onnx.quant.pre_process")


def add_infer_metadata(model: ModelProto) -> None:
    _set_prop(model, "onnx.infer")


def model_has_infer_metadata(model: ModelProto) -> bool:
    return _has_prop(model, "onnx.infer")


def get_opset_version(model: ModelProto) -> int:
    found = [o for o in model.opset_import if o.domain in ("", "ai.onnx")]
    if len(found) != 1:
        raise ValueError("Failed to find proper ai.onnx domain")
    return found[0].version


def update_opset_version(model: ModelProto, weight_type, activation_type=None,
                         tensor_quant_overrides: dict | None = None, block_size: int = 0
                         ) -> ModelProto:
    """The model converted to the opset its quantization types need: 21 for 16-bit types or
    block-wise weights, 19 for float 8 weights, 11 for opsets below 10."""
    opset = get_opset_version(model)
    wt = qtype_of(weight_type)
    at = qtype_of(activation_type) if activation_type is not None else None
    sixteen = (TensorProto.UINT16, TensorProto.INT16)
    wide = wt in sixteen or at in sixteen
    for encodings in (tensor_quant_overrides or {}).values():
        for enc in encodings if isinstance(encodings, list) else ():
            types = [enc.get("quant_type"), (enc.get("convert") or {}).get("quant_type")]
            wide = wide or any(t in (QuantType.QInt16, QuantType.QUInt16) for t in types)
    if opset < 21 and block_size > 0:
        target = 21
    elif opset < 19 and wt == TensorProto.FLOAT8E4M3FN:
        target = 19
    elif opset < 21 and wide:
        target = 21
    elif opset < 10:
        target = 11
    else:
        return model
    return save_and_reload_model_with_shape_infer(ensure_opset(model, target, "quantization"))


def load_model_with_shape_infer(model_path: Path) -> ModelProto:
    """The model at ``model_path`` with inferred shapes, tagged as inferred (external data
    included: inference runs on the file)."""
    model_path = Path(model_path)
    inferred = generate_identified_filename(model_path, "-inferred")
    onnx.shape_inference.infer_shapes_path(str(model_path), str(inferred))
    try:
        model = onnx.load(inferred.as_posix())
    finally:
        inferred.unlink(missing_ok=True)
    add_infer_metadata(model)
    return model


def save_and_reload_model_with_shape_infer(model: ModelProto) -> ModelProto:
    with tempfile.TemporaryDirectory(prefix="onnxrun.quant.") as tmp:
        path = Path(tmp) / "model.onnx"
        onnx.save_model(copy.deepcopy(model), path.as_posix(), save_as_external_data=True)
        return load_model_with_shape_infer(path)


def add_quant_suffix(tensor_name: str) -> str:
    return tensor_name + "_QuantizeLinear"


def add_quant_input_suffix(tensor_name: str) -> str:
    return tensor_name + QUANT_INPUT_SUFFIX


def add_quant_output_suffix(tensor_name: str) -> str:
    return tensor_name + "_QuantizeLinear_Output"


def add_dequant_suffix(tensor_name: str) -> str:
    return tensor_name + "_DequantizeLinear"


def add_dequant_input_suffix(tensor_name: str) -> str:
    return tensor_name + "_DequantizeLinear_Input"


def add_dequant_output_suffix(tensor_name: str) -> str:
    return tensor_name + DEQUANT_OUTPUT_SUFFIX


def write_calibration_table(calibration_cache, dir: str = ".") -> None:  # noqa: A002
    """Write calibrated ranges as ``calibration.json`` and ``calibration.cache`` (one
    ``name value`` line each, the larger magnitude of the range) in ``dir``."""
    from .calibrate import TensorData

    out = Path(dir)
    table = {}
    for name, value in calibration_cache.items():
        if isinstance(value, TensorData):
            value = value.range_value
        table[name] = [float(np.asarray(v).reshape(-1)[0]) for v in value]
    import json

    (out / "calibration.json").write_text(json.dumps(table))
    with open(out / "calibration.cache", "w") as f:
        for name, (lo, hi) in table.items():
            f.write(f"{name} {max(abs(lo), abs(hi))}\n")


__all__ = [
    "DEQUANT_OP_NAME", "DEQUANT_OUTPUT_SUFFIX", "FLOAT8_TYPES", "MODEL_SIZE_THRESHOLD",
    "ONNX_INT_TYPE_RANGE", "ONNX_TYPE_TO_NP_TYPE", "QUANT_INPUT_SUFFIX", "QUANT_OP_NAME",
    "TENSOR_NAME_QUANT_SUFFIX", "QuantFormat", "QuantType", "QuantizationMode",
    "QuantizedValueType", "add_dequant_input_suffix", "add_dequant_output_suffix",
    "add_dequant_suffix", "add_infer_metadata", "add_pre_process_metadata",
    "add_quant_input_suffix", "add_quant_output_suffix", "add_quant_suffix",
    "attribute_to_kwarg", "compute_scale_zp", "compute_scale_zp_blocked", "find_by_name",
    "generate_identified_filename", "get_elem_index", "get_mul_node", "get_opset_version",
    "get_qmin_qmax_for_qType", "get_qrange_for_qType", "load_model_with_shape_infer",
    "model_has_external_data", "model_has_infer_metadata", "model_has_pre_process_metadata",
    "ms_domain", "normalize_axis", "opset_of", "pack_bytes_to_4bit", "quantize_data",
    "quantize_nparray", "quantize_onnx_initializer", "save_and_reload_model_with_shape_infer",
    "snap_zero_point_to_uint8", "tensor_proto_to_array", "update_opset_version",
    "write_calibration_table",
]
