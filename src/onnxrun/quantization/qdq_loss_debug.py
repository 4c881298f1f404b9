"""Where does a QDQ model lose accuracy? Compare its tensors with the float model's.

1. ``modify_model_output_intermediate_tensors`` makes every float tensor of a model a graph
   output (flattened, named ``<tensor>_ReshapedSavedOutput``);
2. ``collect_activations`` runs such a model over the inputs of a data reader;
3. ``create_activation_matching`` pairs each QDQ tensor before and after its
   QuantizeLinear / DequantizeLinear (and with the float model's, when given);
   ``create_weight_matching`` pairs each float weight with its dequantized value;
4. ``compute_activation_error`` / ``compute_weight_error`` turn the pairs into
   signal-to-quantization-noise ratios (dB).

onnxruntime's ``qdq_loss_debug`` names and outputs; the models run on onnxrun.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .calibrate import CalibraterBase, CalibrationDataReader
from .onnx_model import ONNXModel
from .quant_utils import (
    DEQUANT_OP_NAME,
    DEQUANT_OUTPUT_SUFFIX,
    QUANT_INPUT_SUFFIX,
    TENSOR_NAME_QUANT_SUFFIX,
    find_by_name,
    load_model_with_shape_infer,
)

logger = logging.getLogger("onnxrun.quantization")
_SAVED = "_ReshapedSavedOutput"
_POST_QDQ_1 = DEQUANT_OUTPUT_SUFFIX + "_1"  # the first of dedicated Q/DQ pairs


def modify_model_output_intermediate_tensors(input_model_path: str | Path,
                                             output_model_path: str | Path,
                                             op_types_for_saving: Sequence[str] | None = None,
                                             save_as_external_data: bool = False) -> None:
    """Save the model with its float tensors (of ``op_types_for_saving`` nodes, or of all) as
    extra, flattened graph outputs."""
    saver = CalibraterBase(input_model_path, op_types_to_calibrate=op_types_for_saving or None)
    model = saver.model
    tensors, value_infos = saver.select_tensors_to_calibrate(model)
    shape_name = _unique("LinearReshape_shape", model)
    model.graph.initializer.append(numpy_helper.from_array(np.array([-1], np.int64), shape_name))
    for name in sorted(tensors):
        out = name + _SAVED
        model.graph.node.append(helper.make_node("Reshape", [name, shape_name], [out], out))
        model.graph.output.append(helper.make_tensor_value_info(
            out, value_infos[name].type.tensor_type.elem_type, [None]))
    onnx.save(model, str(output_model_path), save_as_external_data=save_as_external_data)


def _unique(base: str, model: onnx.ModelProto) -> str:
    taken = {t.name for t in model.graph.initializer} | {
        o for n in model.graph.node for o in n.output}
    name, k = base, 0
    while name in taken:
        k += 1
        name = f"{base}_{k}"
    return name


def collect_activations(augmented_model: str | Path, input_reader: CalibrationDataReader,
                        session_options=None, execution_providers: Sequence[str] | None = None
                        ) -> dict[str, list[np.ndarray]]:
    """Run the augmented model over every input of ``input_reader``: tensor name -> one
    flattened value per batch."""
    from ..api.options import GraphOptimizationLevel, SessionOptions
    from ..api.session import InferenceSession

    if session_options is None:
        session_options = SessionOptions()
        session_options.graph_optimization_level = GraphOptimizationLevel.ORT_DISABLE_ALL
    session = InferenceSession(str(augmented_model), sess_options=session_options,
                               providers=list(execution_providers or ["CPUExecutionProvider"]))
    names = [o.name for o in session.get_outputs()]
    out: dict[str, list[np.ndarray]] = {}
    batches = 0
    for feeds in _feeds(input_reader):
        batches += 1
        for name, value in zip(names, session.run(None, feeds), strict=True):
            if name.endswith(_SAVED):
                out.setdefault(name[:-len(_SAVED)], []).append(value)
    if not batches:
        raise RuntimeError("No data is collected while running augmented model!")
    return out


def _feeds(reader) -> Iterable[dict]:
    if hasattr(reader, "get_next"):
        while (feeds := reader.get_next()) is not None:
            yield feeds
    else:
        yield from reader


def create_activation_matching(qdq_activations: dict[str, Sequence[np.ndarray]],
                               float_activations: dict[str, Sequence[np.ndarray]] | None = None
                               ) -> dict[str, dict[str, Sequence[np.ndarray]]]:
    """``{activation: {"pre_qdq": [...], "post_qdq": [...], "float": [...]}}`` for each tensor
    of the QDQ model that goes through a QuantizeLinear / DequantizeLinear pair (recognized by
    the names the quantizer gives: ``_QuantizeLinear_Input``, ``_DequantizeLinear_Output``)."""
    matched: dict[str, dict[str, Sequence[np.ndarray]]] = {}
    for name, values in qdq_activations.items():
        if name.endswith(QUANT_INPUT_SUFFIX):  # a graph output: its input renamed
            base = name[:-len(QUANT_INPUT_SUFFIX)]
            pre, post = values, qdq_activations.get(base)
        elif name.endswith(DEQUANT_OUTPUT_SUFFIX):
            base = name[:-len(DEQUANT_OUTPUT_SUFFIX)]
            pre, post = qdq_activations.get(base), values
        elif name.endswith(_POST_QDQ_1):
            base = name[:-len(_POST_QDQ_1)]
            pre, post = qdq_activations.get(base), values
        else:
            continue
        if pre is not None and post is not None:
            matched[base] = {"pre_qdq": pre, "post_qdq": post}
    for base, entry in matched.items():
        if float_activations and float_activations.get(base) is not None:
            entry["float"] = float_activations[base]
    return matched


def _dequantize(q: np.ndarray, scale: np.ndarray, zp: np.ndarray, axis: int) -> np.ndarray:
    q = q.astype(np.float32)
    if zp.size == 1:
        return (q - zp.astype(np.float32)) * scale.astype(np.float32)
    shape = [1] * q.ndim
    shape[axis] = -1
    return (q - zp.astype(np.float32).reshape(shape)) * scale.astype(np.float32).reshape(shape)


def create_weight_matching(float_model_path: str, qdq_model_path: str
                           ) -> dict[str, dict[str, np.ndarray]]:
    """``{weight: {"float": ..., "dequantized": ...}}`` for every constant the QDQ model
    dequantizes (``<weight>_quantized`` initializers read by a DequantizeLinear)."""
    float_model = ONNXModel(load_model_with_shape_infer(Path(float_model_path)))
    qdq_model = ONNXModel(load_model_with_shape_infer(Path(qdq_model_path)))
    inits = qdq_model.initializer()
    matched: dict[str, dict[str, np.ndarray]] = {}
    for node in qdq_model.nodes():
        if node.op_type != DEQUANT_OP_NAME:
            continue
        q_init = find_by_name(node.input[0], inits)
        if q_init is None:
            continue
        if not node.input[0].endswith(TENSOR_NAME_QUANT_SUFFIX):
            logger.error("%s: dequantized tensor name %r not recognized", qdq_model_path,
                         node.input[0])
            continue
        axis = next((a.i for a in node.attribute if a.name == "axis"), -1)
        q = numpy_helper.to_array(q_init)
        scale = numpy_helper.to_array(find_by_name(node.input[1], inits))
        zp_init = find_by_name(node.input[2], inits) if len(node.input) > 2 and node.input[2] \
            else None
        zp = numpy_helper.to_array(zp_init) if zp_init is not None \
            else np.zeros(scale.shape, np.int32)
        if scale.shape != zp.shape and not (scale.size == zp.size == 1):
            raise RuntimeError(f"scale and zero_point must have the same shape but "
                               f"{scale.shape} != {zp.shape}")
        name = node.input[0][:-len(TENSOR_NAME_QUANT_SUFFIX)]
        f_init = find_by_name(name, float_model.initializer())
        if f_init is None:
            logger.error("%s: weight tensor %r not found", float_model_path, name)
            continue
        matched[name] = {"float": numpy_helper.to_array(f_init),
                         "dequantized": _dequantize(q, scale, zp, axis % max(q.ndim, 1))}
    return matched


def compute_signal_to_quantization_noice_ratio(x: Sequence[np.ndarray] | np.ndarray,
                                               y: Sequence[np.ndarray] | np.ndarray) -> float:
    """20 log10(|x| / |x - y|) over all the tensors (dB; norms floored at float eps)."""
    xs = [x] if isinstance(x, np.ndarray) else list(x)
    ys = [y] if isinstance(y, np.ndarray) else list(y)
    if len(xs) != len(ys):
        raise RuntimeError("Unequal number of tensors to compare!")
    a = np.concatenate([np.ravel(v) for v in xs]).astype(np.float64)
    b = np.concatenate([np.ravel(v) for v in ys]).astype(np.float64)
    eps = np.finfo(float).eps
    return 20 * math.log10(max(np.linalg.norm(a), eps) / max(np.linalg.norm(a - b), eps))


def compute_weight_error(weights_match: dict[str, dict[str, np.ndarray]],
                         err_func: Callable[[np.ndarray, np.ndarray], float] =
                         compute_signal_to_quantization_noice_ratio) -> dict[str, float]:
    return {name: err_func(m["float"], m["dequantized"]) for name, m in weights_match.items()}


def compute_activation_error(activations_match: dict[str, dict[str, Sequence[np.ndarray]]],
                             err_func: Callable[[Sequence[np.ndarray], Sequence[np.ndarray]],
                                                float] =
                             compute_signal_to_quantization_noice_ratio
                             ) -> dict[str, dict[str, float]]:
    """``{activation: {"qdq_err": ..., "xmodel_err": ...}}`` (the second with float values)."""
    result: dict[str, dict[str, float]] = {}
    for name, m in activations_match.items():
        errs = {"qdq_err": err_func(m["pre_qdq"], m["post_qdq"])}
        if m.get("float"):
            errs["xmodel_err"] = err_func(m["float"], m["post_qdq"])
        result[name] = errs
    return result


__all__ = ["QUANT_INPUT_SUFFIX", "collect_activations", "compute_activation_error",
           "compute_signal_to_quantization_noice_ratio", "compute_weight_error",
           "create_activation_matching", "create_weight_matching",
           "modify_model_output_intermediate_tensors"]
