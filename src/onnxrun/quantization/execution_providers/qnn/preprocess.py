"""``qnn_preprocess_model``: the graph rewrites a model needs before QDQ quantization for QNN:
Erf GELU -> Gelu, ReduceL2 normalization -> LpNormalization, optionally ReduceMean layer norm ->
LayerNormalization, and inputs / outputs made channel-last on request."""

from __future__ import annotations

from pathlib import Path

import onnx
from onnx import ModelProto, helper

from ...fusions import FusionGelu, FusionLayerNormalization
from ...onnx_model import ONNXModel
from .fusion_lpnorm import FusionLpNormalization


def qnn_preprocess_model(model_input: str | Path | ModelProto, model_output: str | Path,
                         exclude_initializer_from_input: bool = False,
                         fuse_layernorm: bool = False, save_as_external_data: bool = False,
                         all_tensors_to_one_file: bool = False,
                         external_data_location: str | None = None,
                         external_data_size_threshold: int = 1024,
                         external_data_convert_attribute: bool = False,
                         inputs_to_make_channel_last: list[str] | None = None,
                         outputs_to_make_channel_last: list[str] | None = None,
                         dynamic_input_shapes: list[tuple[str, str]] | None = None) -> bool:
    """Apply the rewrites; the result is saved to ``model_output`` only when something changed
    (returns whether it did)."""
    model = model_input if isinstance(model_input, ModelProto) else onnx.load(str(model_input))
    onnx_model = ONNXModel(model)
    changed = FusionGelu(onnx_model).apply()
    changed |= FusionLpNormalization(onnx_model).apply()
    if fuse_layernorm:
        changed |= FusionLayerNormalization(onnx_model).apply()
    if exclude_initializer_from_input:
        inits = onnx_model.get_initializer_name_set()
        kept = [i for i in model.graph.input if i.name not in inits]
        if len(kept) != len(model.graph.input):
            del model.graph.input[:]
            model.graph.input.extend(kept)
            changed = True
    for name in inputs_to_make_channel_last or ():
        _input_channel_last(onnx_model, name)
        changed = True
    for name in outputs_to_make_channel_last or ():
        _output_channel_last(onnx_model, name)
        changed = True
    if dynamic_input_shapes:
        for name, shape in dynamic_input_shapes:
            vi = onnx_model.find_graph_input(name)
            if vi is None:
                raise ValueError(f"dynamic_input_shapes names {name!r}, not a graph input")
            dims = [d.strip() for d in str(shape).strip("[]()").split(",") if d.strip()]
            for d, v in zip(vi.type.tensor_type.shape.dim, dims, strict=False):
                if v.lstrip("-").isdigit() and int(v) > 0:
                    d.dim_value = int(v)
                else:
                    d.dim_param = v
        changed = True
    if changed:
        onnx_model.topological_sort()
        if save_as_external_data:
            onnx.save_model(model, str(model_output), save_as_external_data=True,
                            all_tensors_to_one_file=all_tensors_to_one_file,
                            location=external_data_location,
                            size_threshold=external_data_size_threshold,
                            convert_attribute=external_data_convert_attribute)
        else:
            onnx.save_model(model, str(model_output))
    return changed


def _rank_checked(vi, what: str, name: str) -> int:
    if vi is None:
        raise ValueError(f"{what} {name!r} is not in the model")
    t = vi.type.tensor_type
    rank = len(t.shape.dim) if t.HasField("shape") else 0
    if rank < 3:
        raise ValueError(f"Expected {what} {name!r} to be of rank >= 3 to make it channel-last, "
                         f"got rank {rank}")
    return rank


def _make_channel_last(vi, rank: int) -> list[int]:
    """Rewrites value_info ``vi``'s [N, C, ...] shape as [N, ..., C]; returns that permutation."""
    dims = list(vi.type.tensor_type.shape.dim)
    order = [0, *range(2, rank), 1]
    del vi.type.tensor_type.shape.dim[:]
    vi.type.tensor_type.shape.dim.extend(dims[i] for i in order)
    return order


def _input_channel_last(model: ONNXModel, name: str) -> None:
    """Input ``name`` fed as [N, ..., C]; a Transpose gives the graph its [N, C, ...] tensor."""
    vi = model.find_graph_input(name)
    rank = _rank_checked(vi, "input", name)
    inner = f"{name}_channel_first"
    model.replace_input_of_all_nodes(name, inner)
    _make_channel_last(vi, rank)
    model.add_node(helper.make_node("Transpose", [name], [inner], f"{name}_transpose",
                                    perm=[0, rank - 1, *range(1, rank - 1)]))


def _output_channel_last(model: ONNXModel, name: str) -> None:
    """Output ``name`` returned as [N, ..., C] (a Transpose of the graph's [N, C, ...] tensor)."""
    vi = model.find_graph_output(name)
    rank = _rank_checked(vi, "output", name)
    inner = f"{name}_channel_first"
    model.replace_output_of_all_nodes(name, inner)
    model.replace_input_of_all_nodes(name, inner)
    order = _make_channel_last(vi, rank)
    model.add_node(helper.make_node("Transpose", [inner], [name], f"{name}_transpose",
                                    perm=order))


__all__ = ["qnn_preprocess_model"]
