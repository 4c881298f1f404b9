"""The base of the fusions: walk the nodes of one type, let ``fuse`` match around each, then
remove what was fused and add what replaces it."""

from __future__ import annotations

import numpy as np
from onnx import NodeProto

from ..onnx_model import ONNXModel


class Fusion:
    """Fuses the subgraphs around every ``search_op_type`` node into ``fused_op_type``."""

    def __init__(self, model: ONNXModel, fused_op_type: str, search_op_type: str) -> None:
        self.model = model
        self.fused_op_type = fused_op_type
        self.search_op_type = search_op_type
        self.nodes_to_remove: list[NodeProto] = []
        self.nodes_to_add: list[NodeProto] = []
        self._names = {n.name for n in model.nodes() if n.name}

    def fuse(self, node: NodeProto, input_name_to_nodes: dict[str, list[NodeProto]],
             output_name_to_node: dict[str, NodeProto]) -> None:
        raise NotImplementedError

    def apply(self) -> bool:
        readers = self.model.input_name_to_nodes()
        writers = self.model.output_name_to_node()
        for node in list(self.model.nodes()):
            if node.op_type == self.search_op_type and node not in self.nodes_to_remove:
                self.fuse(node, readers, writers)
        changed = bool(self.nodes_to_add or self.nodes_to_remove)
        self.model.remove_nodes(self.nodes_to_remove)
        self.model.add_nodes(self.nodes_to_add)
        if changed:
            self.model.remove_unused_constant()
            self.model.topological_sort()
        self.nodes_to_remove, self.nodes_to_add = [], []
        return changed

    # -- helpers for the matchers ---------------------------------------------------------------

    def create_unique_node_name(self) -> str:
        k = 0
        while f"{self.fused_op_type}_fused_{k}" in self._names:
            k += 1
        name = f"{self.fused_op_type}_fused_{k}"
        self._names.add(name)
        return name

    def constant(self, name: str) -> np.ndarray | None:
        """The value of an initializer or Constant output, else None."""
        return self.model.get_constant_value(name)

    def is_constant(self, name: str, value: float, rtol: float = 1e-3) -> bool:
        v = self.constant(name)
        return v is not None and v.size == 1 and bool(np.isclose(float(v.reshape(-1)[0]), value,
                                                                 rtol=rtol, atol=0))

    def only_reader(self, name: str, readers: dict[str, list[NodeProto]]) -> NodeProto | None:
        """The single consumer of an intermediate tensor (None if shared or a graph output)."""
        r = readers.get(name, [])
        if len(r) != 1 or self.model.is_graph_output(name):
            return None
        return r[0]

    @staticmethod
    def other_input(node: NodeProto, name: str) -> str | None:
        ins = list(node.input)
        if len(ins) != 2 or name not in ins:
            return None
        return ins[1] if ins[0] == name else ins[0]

