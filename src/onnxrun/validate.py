"""Step 2 of a session: check the model's structure and types, and infer shapes.

onnx's checker and shape inference run on a *skeleton* of the model: the same graph with the
top-level initializers turned into typed graph inputs. That keeps validation's cost independent of
the weights' size (the checker would otherwise serialize every weight), while the weights' own
consistency is checked when the loader reads them.
"""

from __future__ import annotations

import logging

import onnx
from onnx import helper

from .errors import InvalidGraph
from .ir import Model

logger = logging.getLogger("onnxrun")

# onnx's checker refuses IR versions newer than it knows; shape inference works regardless.
_MAX_IR = onnx.IR_VERSION


def skeleton(mp: onnx.ModelProto) -> onnx.ModelProto:
    skel = onnx.ModelProto()
    for fd, value in mp.ListFields():
        if fd.name != "graph":
            if getattr(fd, "is_repeated", None) or getattr(fd, "label", 0) == 3:
                getattr(skel, fd.name).extend(value)
            elif fd.message_type is not None:
                getattr(skel, fd.name).CopyFrom(value)
            else:
                setattr(skel, fd.name, value)
    src, dst = mp.graph, skel.graph
    dst.name, dst.doc_string = src.name, src.doc_string
    dst.node.extend(src.node)
    dst.input.extend(src.input)
    dst.output.extend(src.output)
    dst.value_info.extend(src.value_info)
    declared = {vi.name for vi in src.input}
    for t in src.initializer:
        if t.name not in declared:
            dst.input.append(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    for sp in src.sparse_initializer:
        if sp.values.name not in declared:
            dst.input.append(
                helper.make_tensor_value_info(sp.values.name, sp.values.data_type, list(sp.dims))
            )
    if skel.ir_version > _MAX_IR:
        skel.ir_version = _MAX_IR
    if skel.ir_version < 4 and len(src.initializer):
        # IR < 4 requires every initializer to be an input: true here by construction.
        pass
    return skel


def validate(mp: onnx.ModelProto, model: Model, *, infer_shapes: bool = True) -> None:
    """Raise InvalidGraph if the model is malformed; fill in inferred value types on the IR."""
    skel = skeleton(mp)
    try:
        onnx.checker.check_model(skel, full_check=False)
    except onnx.checker.ValidationError as e:
        raise InvalidGraph(f"model failed validation: {_first_line(e)}") from None
    if not infer_shapes:
        return
    try:
        inferred = onnx.shape_inference.infer_shapes(skel, check_type=True, strict_mode=True)
    except onnx.shape_inference.InferenceError as e:
        raise InvalidGraph(f"type/shape inference failed: {_first_line(e)}") from None
    except Exception as e:  # shape inference itself can fail on exotic graphs: not fatal
        logger.debug("shape inference skipped: %s", e)
        return
    _apply_value_info(model, inferred)


def _apply_value_info(model: Model, inferred: onnx.ModelProto) -> None:
    types = {vi.name: vi.type for vi in inferred.graph.value_info}
    types.update({vi.name: vi.type for vi in inferred.graph.output})
    g = model.graph
    for node in g.nodes:
        for v in node.outputs:
            t = types.get(v.name)
            if t is not None and (v.type is None or v.type.WhichOneof("value") is None):
                v.type = t


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return " ".join(lines[:3]) if lines else type(e).__name__
