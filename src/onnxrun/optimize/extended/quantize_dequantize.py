"""QDQ activation fusion: DequantizeLinear(QuantizeLinear(x, s, zp), s, zp) -> onnxrun's
QuantizeDequantize(x, s, zp), for a float32 x and one scale and zero point.

A statically quantized (QDQ) model wraps every activation in a Q -> DQ pair. Run as written,
that is eight passes over the tensor and a narrow copy; the fused kernel rounds and clamps in
place in four, with the same values bit for bit. All the DQs reading one Q (one per consumer,
as some quantizers write them) are served by one fused node. Weights (DQ of a constant) are
not touched: they stay narrow in memory (see DequantizeLinear).
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from ...ir import Model, Node
from ...proto import onnx
from ...providers.cpu.ops.quantization import ONNXRUN_DOMAIN
from ..base import EXTENDED, GraphPass, PassResult, register_pass
from ..graph_utils import is_graph_output, live_nodes
from ._helpers import const_value, is_float32, make_node, take_over

_NARROW = {np.dtype(t) for t in (np.uint8, np.int8, np.uint16, np.int16)}


def _params(node: Node) -> tuple[float, int, np.dtype] | None:
    """(scale, zero point, zero point type) of a per-tensor Q or DQ with constant parameters."""
    if node.domain != "" or node.attr("block_size", 0) or node.attr("precision", 0):
        return None
    if node.op_type == "DequantizeLinear" and node.attr("output_dtype", 0) not in (
            0, onnx.TensorProto.FLOAT):
        return None
    scale = const_value(node.inputs[1]) if len(node.inputs) > 1 else None
    if scale is None or scale.size != 1 or scale.dtype != np.float32:
        return None
    zp_value = node.inputs[2] if len(node.inputs) > 2 else None
    if zp_value is None:
        out = node.attr("output_dtype", 0) if node.op_type == "QuantizeLinear" else 0
        if out not in (0, onnx.TensorProto.UINT8):
            return None
        return float(scale.reshape(())), 0, np.dtype(np.uint8)
    zp = const_value(zp_value)
    if zp is None or zp.size != 1 or zp.dtype not in _NARROW:
        return None
    return float(scale.reshape(())), int(zp.reshape(-1)[0]), zp.dtype


@register_pass
class QuantizeDequantizeFusion(GraphPass):
    name = "QuantizeDequantizeFusion"
    level = EXTENDED
    order = 5

    def run(self, model: Model) -> PassResult:
        changes: Counter = Counter()
        for _, q in live_nodes(model):
            if q.op_type == "QuantizeLinear" and self._fuse(model, q):
                changes["QuantizeLinear+DequantizeLinear"] += 1
        return PassResult(bool(changes), changes)

    @staticmethod
    def _fuse(model: Model, q: Node) -> bool:
        params = _params(q)
        qv = q.outputs[0]
        if params is None or not is_float32(q.inputs[0]) or is_graph_output(qv) or not qv.uses:
            return False
        readers = [n for n, _ in qv.uses]
        if any(n.op_type != "DequantizeLinear" or n.inputs[0] is not qv or _params(n) != params
               for n in readers):
            return False
        outputs = [n for n in dict.fromkeys(readers) if is_graph_output(n.outputs[0])]
        if len(outputs) > 1:
            return False  # two graph outputs would become one value
        graph = q.graph
        fused = make_node(graph, model, "QuantizeDequantize", list(q.inputs[:3]),
                          domain=ONNXRUN_DOMAIN, name=f"{q.label}_qdq")
        # the fused node takes over a graph output's name if a DQ writes one
        first, *others = outputs + [n for n in dict.fromkeys(readers) if n not in outputs]
        take_over(fused, 0, first.outputs[0])
        for dq in others:
            dq.outputs[0].replace_all_uses_with(fused.outputs[0])
        graph.nodes.insert(graph.nodes.index(q), fused)
        fused.graph = graph
        for dq in [first, *others]:
            graph.remove(dq)
        graph.remove(q)
        return True
