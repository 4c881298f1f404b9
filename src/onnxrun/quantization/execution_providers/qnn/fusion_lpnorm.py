"""ReduceL2-based L2 normalization -> LpNormalization (p = 2) for QNN:
``x / Expand(Clip(ReduceL2(x, axis=-1, keepdims=1), min=eps), Shape(x))``."""

from __future__ import annotations

from onnx import NodeProto, helper

from ...fusions.fusion import Fusion
from ...onnx_model import ONNXModel


class FusionLpNormalization(Fusion):
    def __init__(self, model: ONNXModel, epsilon: float = 1e-12) -> None:
        super().__init__(model, "LpNormalization", "ReduceL2")
        self.epsilon = epsilon

    def fuse(self, rl2: NodeProto, readers, writers) -> None:
        x = rl2.input[0]
        attrs = {a.name: helper.get_attribute_value(a) for a in rl2.attribute}
        axes = list(attrs["axes"]) if "axes" in attrs else None
        if axes is None and len(rl2.input) > 1 and rl2.input[1]:
            v = self.constant(rl2.input[1])
            axes = None if v is None else [int(i) for i in v.reshape(-1)]
        if axes != [-1] or attrs.get("keepdims", 1) != 1:
            return
        clip = self.only_reader(rl2.output[0], readers)
        if clip is None or clip.op_type != "Clip":
            return
        expand = self.only_reader(clip.output[0], readers)
        if expand is None or expand.op_type != "Expand":
            return
        shape_node = writers.get(expand.input[1])
        div = self.only_reader(expand.output[0], readers)
        if div is None or div.op_type != "Div" or list(div.input) != [x, expand.output[0]]:
            return
        fused = [rl2, clip, expand, div]
        if shape_node is not None and shape_node.op_type == "Shape" \
                and shape_node.input[0] == x and self.only_reader(expand.input[1], readers):
            fused.append(shape_node)
        self.nodes_to_remove.extend(fused)
        self.nodes_to_add.append(helper.make_node("LpNormalization", [x], [div.output[0]],
                                                  self.create_unique_node_name(), axis=-1, p=2))
