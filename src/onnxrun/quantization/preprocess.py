"""``quant_pre_process``: get a model ready for quantization.

onnxrun's basic graph optimizations (constant folding, redundant nodes removed, Conv+BatchNorm
and MatMul+Add fusions...) make the graph the quantizer sees smaller and the calibrated ranges
those of the tensors that will really exist; onnx's shape inference then types every tensor,
which the quantizer needs to know what is float. Symbolic shape inference is not needed: onnx's
inference keeps symbolic dimensions.
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import ModelProto

logger = logging.getLogger("onnxrun.quantization")

PRE_PROCESS_KEY = "onnx.quant.pre_process"  # the mark onnxruntime's tool looks for


def optimize_model(model: ModelProto | str | Path) -> ModelProto:
    """The model after onnxrun's basic optimizations (as a session at ORT_ENABLE_BASIC)."""
    from ..api.options import GraphOptimizationLevel, SessionOptions
    from ..api.session import InferenceSession

    with tempfile.TemporaryDirectory(prefix="onnxrun.quant.") as tmp:
        out = os.path.join(tmp, "optimized.onnx")
        options = SessionOptions()
        options.graph_optimization_level = GraphOptimizationLevel.ORT_ENABLE_BASIC
        options.optimized_model_filepath = out
        InferenceSession(model if isinstance(model, ModelProto) else str(model), options)
        return onnx.load(out)


def quant_pre_process(input_model_path: str | Path | ModelProto | None = None,
                      output_model_path: str | Path | None = None,
                      skip_optimization: bool = False, skip_onnx_shape: bool = False,
                      skip_symbolic_shape: bool = False, auto_merge: bool = False,
                      int_max: int = 2**31 - 1, guess_output_rank: bool = False,
                      verbose: int = 0, save_as_external_data: bool = False,
                      all_tensors_to_one_file: bool = False,
                      external_data_location: str | None = None,
                      external_data_size_threshold: int = 1024, **deprecated_kwargs
                      ) -> ModelProto:
    """Optimize (basic level) and shape-infer a model; saves it to ``output_model_path`` when
    given and returns it. Same arguments as onnxruntime's; the symbolic-shape ones are
    accepted and ignored."""
    if input_model_path is None:
        input_model_path = deprecated_kwargs.pop("input_model", None)
    if output_model_path is None:
        output_model_path = deprecated_kwargs.pop("output_model_path", None)
    if input_model_path is None:
        raise ValueError("input_model_path is required")
    model = input_model_path if isinstance(input_model_path, ModelProto) \
        else onnx.load(str(input_model_path))
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 11)
    if opset < 11:  # as onnxruntime: the quantizer's operators (Resize, Clip's inputs) need 11
        from onnx import version_converter

        model = _upsample_as_resize(version_converter.convert_version(model, 11))
    if not skip_optimization:
        model = optimize_model(model)
    if not skip_onnx_shape:
        model = onnx.shape_inference.infer_shapes(model)
    if verbose:
        logger.info("pre-processed model: %d nodes", len(model.graph.node))
    props = {p.key: p for p in model.metadata_props}
    if PRE_PROCESS_KEY in props:
        props[PRE_PROCESS_KEY].value = "onnxruntime.quant"
    else:
        onnx.helper.set_model_props(model, {**{p.key: p.value for p in model.metadata_props},
                                            PRE_PROCESS_KEY: "onnxruntime.quant"})
    if output_model_path is not None:
        path = Path(output_model_path)
        if save_as_external_data:
            onnx.save(model, str(path), save_as_external_data=True,
                      all_tensors_to_one_file=all_tensors_to_one_file,
                      location=external_data_location or path.name + ".data",
                      size_threshold=external_data_size_threshold)
        else:
            onnx.save(model, str(path))
    return model


def _upsample_as_resize(model: ModelProto) -> ModelProto:
    """Upsample (deprecated, no opset-11 form) as the Resize that computes the same:
    asymmetric coordinates, nearest rounding down."""
    g = model.graph
    taken = {t.name for t in g.initializer} | {o for n in g.node for o in n.output}
    for node in g.node:
        if node.op_type != "Upsample" or node.domain not in ("", "ai.onnx"):
            continue
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        mode = attrs.get("mode", b"nearest")
        mode = mode.decode() if isinstance(mode, bytes) else mode
        roi = f"{node.name or node.output[0]}_roi"
        while roi in taken:
            roi += "_"
        taken.add(roi)
        g.initializer.append(onnx.numpy_helper.from_array(np.zeros(0, np.float32), roi))
        resize = onnx.helper.make_node(
            "Resize", [node.input[0], roi, node.input[1]], list(node.output), node.name or None,
            mode=mode, coordinate_transformation_mode="asymmetric",
            **({"nearest_mode": "floor"} if mode == "nearest" else {}))
        node.CopyFrom(resize)
    return model


__all__ = ["optimize_model", "quant_pre_process"]
