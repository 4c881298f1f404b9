"""Checks shared by the basic passes (no pass lives here)."""

from __future__ import annotations

import numpy as np

from ...dtypes import ml_dtypes, type_shape
from ...ir import Graph, Model, Node, Value
from ..graph_utils import constant_value, is_graph_output, single_consumer


def is_float_array(a: np.ndarray | None) -> bool:
    # bfloat16 (ml_dtypes) has kind "V"; its name says what it is.
    return a is not None and (a.dtype.kind == "f" or a.dtype.name == "bfloat16")


def rank(v: Value | None) -> int | None:
    shape = type_shape(v.type) if v is not None else None
    return None if shape is None else len(shape)


def static_shape(v: Value | None) -> list[int] | None:
    shape = type_shape(v.type) if v is not None else None
    if shape is None or not all(isinstance(d, int) for d in shape):
        return None
    return shape


def only_first_output_used(node: Node) -> bool:
    return all(not v.uses and not is_graph_output(v) for v in node.outputs[1:])


def per_channel(c: np.ndarray, out_rank: int, channels: int) -> np.ndarray | None:
    """``c`` as a length-``channels`` vector when broadcasting it against a [N, C, ...] tensor of
    rank ``out_rank`` neither grows that tensor nor varies along any axis but the channel axis."""
    if c.ndim > out_rank or out_rank < 2:
        return None
    full = c.reshape((1,) * (out_rank - c.ndim) + c.shape)
    if full.shape[1] not in (1, channels):
        return None
    if any(d != 1 for i, d in enumerate(full.shape) if i != 1):
        return None
    return np.broadcast_to(full.reshape(-1), (channels,))


def inference_batchnorm(model: Model, bn: Node) -> bool:
    """Whether ``bn`` is an ai.onnx BatchNormalization at inference with one (C,) parameter
    set per channel and Y its only output read: what the rewrites of one may replace."""
    if bn.domain != "" or bn.op_type != "BatchNormalization" or len(bn.inputs) != 5:
        return False
    opset = model.node_opset(bn)
    if opset is None or opset >= 14 and bn.attr("training_mode", 0) != 0:
        return False
    # Before opset 14 the kernel (as onnxruntime) trains when extra outputs are asked for.
    if any(v.name for v in bn.outputs[1:]) or not only_first_output_used(bn):
        return False
    return bn.attr("spatial", 1) == 1


def batchnorm_affine(model: Model, bn: Node, channels: int) -> tuple[np.ndarray, np.ndarray] | None:
    """(a, b) with BN(x) = a * x + b per channel (float64), for an inference-mode
    BatchNormalization whose parameters are constants and whose only read output is Y."""
    if not inference_batchnorm(model, bn):
        return None
    params = [constant_value(v) for v in bn.inputs[1:]]
    if any(p is None or p.ndim != 1 or p.shape[0] != channels for p in params):
        return None
    scale, bias, mean, var = (p.astype(np.float64) for p in params)
    a = scale / np.sqrt(var + float(bn.attr("epsilon", 1e-5)))
    b = bias - mean * a
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
        return None
    return a, b


def smallest_normal(dtype: np.dtype) -> float:
    if ml_dtypes is None:
        return float(np.finfo(dtype).tiny)
    return float(ml_dtypes.finfo(dtype).tiny)  # ml_dtypes' finfo knows bfloat16 too


def one_constant_operand(node: Node) -> tuple[int, np.ndarray] | None:
    """(index, value) of the single constant input of a binary node whose other input is not
    constant (two constants are constant folding's work)."""
    if len(node.inputs) != 2 or node.inputs[0] is None or node.inputs[1] is None:
        return None
    c0, c1 = constant_value(node.inputs[0]), constant_value(node.inputs[1])
    if (c0 is None) == (c1 is None):
        return None
    return (0, c0) if c0 is not None else (1, c1)


def sole_reader_producer(v: Value, graph: Graph) -> Node | None:
    """The producer of ``v`` (in ``graph``) when ``v`` has exactly one reader and is no graph
    output: folding its producer into that reader removes it."""
    if v.producer is None or v.producer.graph is not graph or single_consumer(v) is None:
        return None
    return v.producer
