"""onnxruntime as an exact oracle for 8-bit products on every x86 CPU.

onnxruntime's MLAS multiplies uint8 by int8 (u8s8) with ``vpmaddubsw`` on AVX2 and on AVX-512
without VNNI: each pair of adjacent products is added into an int16 that saturates, so a pair
beyond 32767 (255 * 127 * 2 = 64770 is possible) is clamped before the int32 sum. On AVX-512 VNNI
(``vpdpbusd``) the sums are exact, as onnxrun's are on every CPU. u8u8 and s8s8 products are exact
everywhere, but onnxruntime's x86 build turns int8 QDQ activations into uint8, so int8 QDQ models
meet the u8s8 kernels as well. An int8 model's outputs on onnxruntime therefore depend on the CPU
(up to whole-percent differences on the models of tests/models/quant).

onnxruntime's own remedy, the session option ``session.x64quantprecision = 1``, stores constant
int8 weights as uint8 (x ^ 0x80, zero point + 128) at the extended level, but not for every
operator version (opset 21's QLinearMatMul keeps saturating), and it gives a QLinearConv with
int8 activations uint8 weights that no kernel takes. ``session`` makes the same change to the
model itself, where it is right, at every level: the weights of the products whose other
operand is uint8, and the int8 initializers that DequantizeLinear reads (QDQ weights, which
onnxruntime fuses into integer operators). The products stay the same integers, now exact.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, numpy_helper

# operator -> (activation input and its zero point, or None: quantized to uint8 inside;
#              [(weight input, its scale, its zero point)])
WEIGHTS = {
    "MatMulInteger": ((0, 2), [(1, None, 3)]), "QLinearMatMul": ((0, 2), [(3, 4, 5)]),
    "QLinearConv": ((0, 2), [(3, 4, 5)]), "MatMulIntegerToFloat": ((0, 4), [(1, 3, 5)]),
    "QGemm": ((0, 2), [(3, 4, 5)]), "QAttention": ((0, 6), [(1, 4, 7)]),
    "DequantizeLinear": (None, [(0, 1, 2)]), "DynamicQuantizeMatMul": (None, [(1, 2, 3)]),
    "DynamicQuantizeLSTM": (None, [(1, 8, 9), (2, 10, 11)]),
}


def _elem_types(model: onnx.ModelProto) -> dict[str, int]:
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 - contrib operators onnx cannot infer: what is declared
        inferred = model
    g = inferred.graph
    types = {v.name: v.type.tensor_type.elem_type
             for v in [*g.input, *g.value_info, *g.output]}
    types.update({t.name: t.data_type for t in g.initializer})
    for node in g.node:  # what onnx's inference may not know: these write uint8
        if node.op_type in ("DynamicQuantizeLinear",):
            types[node.output[0]] = TensorProto.UINT8
    return types


def weights_to_uint8(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with the constant int8 weights (and zero points) of its uint8 x int8 products
    stored as uint8 + 128: the same integer products, which onnxruntime computes exactly."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    types = _elem_types(model)
    done: dict[str, str] = {}

    def as_uint8(name: str) -> str:
        if name not in done:
            value = numpy_helper.to_array(inits[name])
            shifted = (value.astype(np.int16) + 128).astype(np.uint8)
            graph.initializer.append(numpy_helper.from_array(shifted, f"{name}_as_uint8"))
            done[name] = f"{name}_as_uint8"
        return done[name]

    def int8_constant(name: str) -> bool:
        return name in inits and inits[name].data_type == TensorProto.INT8

    for node in graph.node:
        activation, weights = WEIGHTS.get(node.op_type, (None, []))
        inputs = node.input
        if activation is not None:
            known = [types.get(inputs[i]) for i in activation if i < len(inputs) and inputs[i]]
            if TensorProto.UINT8 not in known:
                continue  # int8 x int8 (or unknown): exact already, no kernel takes int8 x uint8
        for w, scale, zp in weights:
            if len(inputs) <= w or not int8_constant(inputs[w]):
                continue
            has_zp = len(inputs) > zp and inputs[zp]
            if has_zp and not int8_constant(inputs[zp]):
                continue  # a runtime zero point: left as it is (onnxruntime does the same)
            inputs[w] = as_uint8(inputs[w])
            if has_zp:
                inputs[zp] = as_uint8(inputs[zp])
            else:  # zero points of 128, shaped as the scales (per tensor or per channel)
                shape = list(inits[inputs[scale]].dims) if scale is not None and \
                    len(inputs) > scale and inputs[scale] in inits else []
                zero = f"{inputs[w]}_zero_point"
                if zero not in inits:
                    inits[zero] = numpy_helper.from_array(np.full(shape, 128, np.uint8), zero)
                    graph.initializer.append(inits[zero])
                while len(inputs) < zp:
                    inputs.append("")
                inputs.append(zero)
    used = {name for node in _nodes(graph) for name in node.input} | \
        {o.name for o in graph.output}
    kept = [t for t in graph.initializer if t.name not in done or t.name in used]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    return model


def _nodes(graph: onnx.GraphProto):
    for node in graph.node:
        yield node
        for attr in node.attribute:
            for sub in [attr.g] if attr.HasField("g") else list(attr.graphs):
                yield from _nodes(sub)


def session(model: str | Path | bytes | onnx.ModelProto,
            options: ort.SessionOptions | None = None) -> ort.InferenceSession:
    """An onnxruntime CPU session on ``model`` whose 8-bit products are exact on every CPU."""
    if not isinstance(model, onnx.ModelProto):
        model = onnx.load_from_string(model) if isinstance(model, bytes) else \
            onnx.load(str(model))
    return ort.InferenceSession(weights_to_uint8(model).SerializeToString(),
                                options or ort.SessionOptions(), providers=["CPUExecutionProvider"])
