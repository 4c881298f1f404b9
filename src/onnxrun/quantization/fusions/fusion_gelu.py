"""Erf-based GELU subgraphs -> com.microsoft Gelu: ``x * 0.5 * (1 + erf(x / sqrt(2)))`` with the
division written as ``Div(x, sqrt 2)`` or ``Mul(x, 1 / sqrt 2)`` and the two products in any
grouping."""

from __future__ import annotations

import math

from onnx import NodeProto, helper

from ..onnx_model import ONNXModel
from .fusion import Fusion


class FusionGelu(Fusion):
    def __init__(self, model: ONNXModel) -> None:
        super().__init__(model, "Gelu", "Erf")

    def fuse(self, erf: NodeProto, readers, writers) -> None:
        scaled = writers.get(erf.input[0])
        if scaled is None or self.only_reader(erf.input[0], readers) is None:
            return
        if scaled.op_type == "Div" and self.is_constant(scaled.input[1], math.sqrt(2)):
            x = scaled.input[0]
        elif scaled.op_type == "Mul":
            x = next((scaled.input[1 - k] for k in range(2)
                      if self.is_constant(scaled.input[k], 1 / math.sqrt(2))), None)
        else:
            x = None
        if x is None:
            return
        add = self.only_reader(erf.output[0], readers)
        if add is None or add.op_type != "Add" or not self.is_constant(
                self.other_input(add, erf.output[0]) or "", 1.0):
            return
        m1 = self.only_reader(add.output[0], readers)
        if m1 is None or m1.op_type != "Mul":
            return
        other = self.other_input(m1, add.output[0])
        fused = [scaled, erf, add, m1]
        half = writers.get(other) if other else None
        if half is not None and half.op_type == "Mul" and x in half.input and self.is_constant(
                self.other_input(half, x) or "", 0.5) and self.only_reader(other, readers):
            last = m1  # (1 + erf) * (x * 0.5)
            fused.append(half)
        elif other == x or (other and self.is_constant(other, 0.5)):
            m2 = self.only_reader(m1.output[0], readers)
            want = (lambda n: self.is_constant(n, 0.5)) if other == x else (lambda n: n == x)
            if m2 is None or m2.op_type != "Mul" or not want(
                    self.other_input(m2, m1.output[0]) or ""):
                return
            last = m2
            fused.append(m2)
        else:
            return
        self.nodes_to_remove.extend(fused)
        self.nodes_to_add.append(helper.make_node("Gelu", [x], [last.output[0]],
                                                  self.create_unique_node_name(),
                                                  domain="com.microsoft"))
        if not any(o.domain == "com.microsoft" for o in self.model.opset_import()):
            self.model.set_opset_import("com.microsoft", 1)
