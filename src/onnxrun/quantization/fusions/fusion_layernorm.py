"""ReduceMean-based layer normalization -> LayerNormalization (opset 17):
``(x - mean(x)) / sqrt(mean((x - mean(x)) ** 2) + eps) * scale + bias`` over the last axis."""

from __future__ import annotations

import numpy as np
from onnx import NodeProto, helper

from ..onnx_model import ONNXModel
from .fusion import Fusion


class FusionLayerNormalization(Fusion):
    def __init__(self, model: ONNXModel) -> None:
        super().__init__(model, "LayerNormalization", "ReduceMean")

    def _axes(self, node: NodeProto):
        for a in node.attribute:
            if a.name == "axes":
                return list(a.ints)
        if len(node.input) > 1 and node.input[1]:
            v = self.constant(node.input[1])
            return None if v is None else [int(i) for i in np.reshape(v, -1)]
        return None

    def fuse(self, rm0: NodeProto, readers, writers) -> None:
        x = rm0.input[0]
        axes = self._axes(rm0)
        if axes != [-1]:
            shape = self.model.get_tensor_type(x)
            rank = len(shape.shape.dim) if shape is not None and shape.HasField("shape") else None
            if axes is None or rank is None or axes != [rank - 1]:
                return
        sub = self.only_reader(rm0.output[0], readers)
        if sub is None or sub.op_type != "Sub" or list(sub.input) != [x, rm0.output[0]]:
            return
        sub_readers = list({id(n): n for n in readers.get(sub.output[0], [])}.values())
        # the square: Pow(d, 2) or Mul(d, d)
        pow_ = next((n for n in sub_readers if (n.op_type == "Pow" and self.is_constant(
            n.input[1], 2.0)) or (n.op_type == "Mul" and list(n.input) == [sub.output[0]] * 2)),
            None)
        div = next((n for n in sub_readers if n.op_type == "Div"), None)
        if len(sub_readers) != 2 or pow_ is None or div is None:
            return
        rm1 = self.only_reader(pow_.output[0], readers)
        if rm1 is None or rm1.op_type != "ReduceMean" or self._axes(rm1) != axes:
            return
        add0 = self.only_reader(rm1.output[0], readers)
        eps = self.other_input(add0, rm1.output[0]) if add0 is not None else None
        eps_v = self.constant(eps) if eps else None
        if add0 is None or add0.op_type != "Add" or eps_v is None or eps_v.size != 1:
            return
        sqrt = self.only_reader(add0.output[0], readers)
        if sqrt is None or sqrt.op_type != "Sqrt" or self.only_reader(sqrt.output[0], readers) \
                is not div or list(div.input) != [sub.output[0], sqrt.output[0]]:
            return
        mul = self.only_reader(div.output[0], readers)
        scale = self.other_input(mul, div.output[0]) if mul is not None else None
        if mul is None or mul.op_type != "Mul" or scale is None or self.constant(scale) is None:
            return
        add1 = self.only_reader(mul.output[0], readers)
        bias = self.other_input(add1, mul.output[0]) if add1 is not None else None
        if add1 is None or add1.op_type != "Add" or bias is None or self.constant(bias) is None:
            return
        self.nodes_to_remove.extend([rm0, sub, pow_, rm1, add0, sqrt, div, mul, add1])
        self.nodes_to_add.append(helper.make_node(
            "LayerNormalization", [x, scale, bias], [add1.output[0]],
            self.create_unique_node_name(), axis=-1, epsilon=float(eps_v.reshape(-1)[0])))
        for o in self.model.opset_import():
            if o.domain in ("", "ai.onnx") and o.version < 17:
                o.version = 17  # LayerNormalization
