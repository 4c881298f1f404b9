"""onnxruntime as an exact oracle for 8-bit products on every x86 CPU.

onnxruntime's MLAS multiplies uint8 by int8 (u8s8) with ``vpmaddubsw`` on AVX2 and on AVX-512
without VNNI: each pair of adjacent products is added into an int16 that saturates, so a pair
beyond 32767 (255 * 127 * 2 = 64770 is possible) is clamped before the int32 sum. On AVX-512 VNNI
(``vpdpbusd``) the sums are exact, as onnxrun's are on every CPU. u8u8 and s8s8 products are exact
everywhere, but onnxruntime's x86 build turns int8 QDQ activations into uint8, so int8 QDQ models
meet the u8s8 kernels as well. An int8 model's outputs on onnxruntime therefore depend on the CPU
(up to whole-percent differences on the models of tests/models/quant).

onnxruntime's own remedy is the session option ``session.x64quantprecision = 1``: at the extended
level its Avx2WeightS8ToU8Transformer stores constant int8 weights of the 8-bit product operators
as uint8 (x ^ 0x80, zero point + 128), the same products on the exact u8u8 kernels; a CPU with
VNNI needs nothing. ``session`` sets it, and below the extended level (where onnxruntime runs the
graph as written) makes the same change to the model first (``weights_to_uint8``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

# operator -> [(weight input, weight zero point input)], as in onnxruntime's transformer
WEIGHTS = {
    "MatMulInteger": [(1, 3)], "QLinearMatMul": [(3, 5)], "QLinearConv": [(3, 5)],
    "MatMulIntegerToFloat": [(1, 5)], "DynamicQuantizeMatMul": [(1, 3)], "QGemm": [(3, 5)],
    "QAttention": [(1, 7)], "DynamicQuantizeLSTM": [(1, 9), (2, 11)],
}


def weights_to_uint8(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with the constant int8 weights (and zero points) of its 8-bit products stored as
    uint8 + 128: the same integer products, which onnxruntime computes exactly on every CPU."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    done: dict[str, str] = {}

    def as_uint8(name: str) -> str:
        if name not in done:
            value = numpy_helper.to_array(inits[name])
            shifted = (value.astype(np.int16) + 128).astype(np.uint8)
            graph.initializer.append(numpy_helper.from_array(shifted, f"{name}_as_uint8"))
            done[name] = f"{name}_as_uint8"
        return done[name]

    for node in graph.node:
        for w, zp in WEIGHTS.get(node.op_type, []):
            inputs = node.input
            if len(inputs) <= w or inputs[w] not in inits or \
                    inits[inputs[w]].data_type != onnx.TensorProto.INT8:
                continue
            has_zp = len(inputs) > zp and inputs[zp]
            if has_zp and (inputs[zp] not in inits or
                           inits[inputs[zp]].data_type != onnx.TensorProto.INT8):
                continue  # a runtime zero point: left as it is (onnxruntime does the same)
            inputs[w] = as_uint8(inputs[w])
            if has_zp:
                inputs[zp] = as_uint8(inputs[zp])
            else:
                zero = f"{inputs[w]}_zero_point"
                if zero not in inits:
                    inits[zero] = numpy_helper.from_array(np.array(128, np.uint8), zero)
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
    options = options or ort.SessionOptions()
    options.add_session_config_entry("session.x64quantprecision", "1")
    extended = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    if int(options.graph_optimization_level) < int(extended):
        if not isinstance(model, onnx.ModelProto):
            model = onnx.load_from_string(model) if isinstance(model, bytes) else \
                onnx.load(str(model))
        model = weights_to_uint8(model)
    if isinstance(model, onnx.ModelProto):
        model = model.SerializeToString()
    elif isinstance(model, Path):
        model = str(model)
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
