"""``ONNXModel``: onnxruntime's quantization tool's editing wrapper around a ModelProto.

Scripts and graph fusions written for onnxruntime's tool use it to look nodes up by their inputs
and outputs, add and remove nodes and initializers, sort the graph and save it. It edits the
wrapped ModelProto (``.model``) in place.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import onnx
from onnx import ModelProto, NodeProto, TensorProto, helper, numpy_helper


class ONNXModel:
    """A ModelProto with the graph queries and edits of onnxruntime's ``ONNXModel``."""

    def __init__(self, model: ModelProto) -> None:
        self.model = model

    # -- parts ----------------------------------------------------------------------------------

    def nodes(self):
        return self.model.graph.node

    def initializer(self):
        return self.model.graph.initializer

    def graph(self):
        return self.model.graph

    def ir_version(self) -> int:
        return self.model.ir_version

    def opset_import(self):
        return self.model.opset_import

    def set_opset_import(self, domain: str, version: int) -> None:
        for o in self.model.opset_import:
            if o.domain == domain:
                o.version = version
                return
        self.model.opset_import.append(helper.make_opsetid(domain, version))

    # -- nodes ----------------------------------------------------------------------------------

    def remove_node(self, node: NodeProto) -> None:
        if node in self.model.graph.node:
            self.model.graph.node.remove(node)

    def remove_nodes(self, nodes_to_remove: Iterable[NodeProto]) -> None:
        for node in nodes_to_remove:
            self.remove_node(node)

    def add_node(self, node: NodeProto) -> None:
        self.model.graph.node.append(node)

    def add_nodes(self, nodes_to_add: Iterable[NodeProto]) -> None:
        self.model.graph.node.extend(nodes_to_add)

    def input_name_to_nodes(self) -> dict[str, list[NodeProto]]:
        out: dict[str, list[NodeProto]] = {}
        for node in self.model.graph.node:
            for name in node.input:
                if name:
                    out.setdefault(name, []).append(node)
        return out

    def output_name_to_node(self) -> dict[str, NodeProto]:
        return {o: node for node in self.model.graph.node for o in node.output if o}

    def get_children(self, node: NodeProto, input_name_to_nodes=None) -> list[NodeProto]:
        readers = self.input_name_to_nodes() if input_name_to_nodes is None \
            else input_name_to_nodes
        return [child for o in node.output for child in readers.get(o, [])]

    def get_parents(self, node: NodeProto, output_name_to_node=None) -> list[NodeProto]:
        writers = self.output_name_to_node() if output_name_to_node is None \
            else output_name_to_node
        return [writers[i] for i in node.input if i in writers]

    def get_parent(self, node: NodeProto, idx: int, output_name_to_node=None
                   ) -> NodeProto | None:
        writers = self.output_name_to_node() if output_name_to_node is None \
            else output_name_to_node
        if len(node.input) <= idx:
            return None
        return writers.get(node.input[idx])

    def find_node_by_name(self, node_name: str, new_nodes_list, graph) -> NodeProto | None:
        return next((n for n in [*new_nodes_list, *graph.node] if n.name == node_name), None)

    def get_largest_node_name_suffix(self, node_name_prefix: str) -> int:
        return _largest_suffix((n.name for n in self.model.graph.node), node_name_prefix)

    def get_largest_initializer_name_suffix(self, initializer_name_prefix: str) -> int:
        return _largest_suffix((t.name for t in self.model.graph.initializer),
                               initializer_name_prefix)

    @staticmethod
    def replace_node_input(node: NodeProto, old_input_name: str, new_input_name: str) -> None:
        for i, name in enumerate(node.input):
            if name == old_input_name:
                node.input[i] = new_input_name

    def replace_input_of_all_nodes(self, old_input_name: str, new_input_name: str) -> None:
        for node in self.model.graph.node:
            self.replace_node_input(node, old_input_name, new_input_name)

    def replace_input_of_nodes(self, old_input_name: str, new_input_name: str,
                               node_names_set: set[str]) -> None:
        for node in self.model.graph.node:
            if node.name in node_names_set:
                self.replace_node_input(node, old_input_name, new_input_name)

    @staticmethod
    def replace_node_output(node: NodeProto, old_output_name: str, new_output_name: str) -> None:
        for i, name in enumerate(node.output):
            if name == old_output_name:
                node.output[i] = new_output_name

    def replace_output_of_all_nodes(self, old_output_name: str, new_output_name: str) -> None:
        for node in self.model.graph.node:
            self.replace_node_output(node, old_output_name, new_output_name)

    def replace_output_of_nodes(self, old_output_name: str, new_output_name: str,
                                node_names_set: set[str]) -> None:
        for node in self.model.graph.node:
            if node.name in node_names_set:
                self.replace_node_output(node, old_output_name, new_output_name)

    # -- initializers and graph inputs / outputs ------------------------------------------------

    def add_initializer(self, tensor: TensorProto) -> None:
        if self.get_initializer(tensor.name) is None:
            self.model.graph.initializer.append(tensor)

    def initializer_extend(self, inits: Iterable[TensorProto]) -> None:
        self.model.graph.initializer.extend(inits)

    def get_initializer(self, name: str) -> TensorProto | None:
        return next((t for t in self.model.graph.initializer if t.name == name), None)

    def get_initializer_name_set(self) -> set[str]:
        return {t.name for t in self.model.graph.initializer}

    def remove_initializer(self, tensor: TensorProto) -> None:
        if tensor in self.model.graph.initializer:
            self.model.graph.initializer.remove(tensor)
            for i in list(self.model.graph.input):
                if i.name == tensor.name:
                    self.model.graph.input.remove(i)
                    break

    def remove_initializers(self, init_to_remove: Iterable[TensorProto]) -> None:
        for t in list(init_to_remove):
            self.remove_initializer(t)

    def get_non_initializer_inputs(self) -> set[str]:
        inits = self.get_initializer_name_set()
        return {i.name for i in self.model.graph.input if i.name not in inits}

    def find_graph_input(self, input_name: str):
        return next((i for i in self.model.graph.input if i.name == input_name), None)

    def find_graph_output(self, output_name: str):
        return next((o for o in self.model.graph.output if o.name == output_name), None)

    def is_graph_output(self, output_name: str) -> bool:
        return any(o.name == output_name for o in self.model.graph.output)

    def is_graph_input(self, tensor_name: str) -> bool:
        return any(i.name == tensor_name for i in self.model.graph.input)

    def get_tensor_type(self, tensor_name: str):
        """The TypeProto.Tensor of a tensor (value_info, graph input or output), or None."""
        g = self.model.graph
        for vi in [*g.value_info, *g.input, *g.output]:
            if vi.name == tensor_name and vi.type.HasField("tensor_type"):
                return vi.type.tensor_type
        return None

    def get_constant_value(self, output_name: str):
        """The value of an initializer or of a Constant node's output, as an array."""
        init = self.get_initializer(output_name)
        if init is not None:
            return numpy_helper.to_array(init)
        for node in self.model.graph.node:
            if node.op_type == "Constant" and output_name in node.output:
                for a in node.attribute:
                    if a.name == "value":
                        return numpy_helper.to_array(a.t)
        return None

    def find_nodes_by_initializer(self, graph, initializer: TensorProto) -> list[NodeProto]:
        return [n for n in graph.node if initializer.name in n.input]

    # -- whole-graph edits ----------------------------------------------------------------------

    def remove_unused_constant(self) -> None:
        """Constant nodes and initializers nothing reads any more."""
        readers = self.input_name_to_nodes()
        outputs = {o.name for o in self.model.graph.output}
        dead = [n for n in self.model.graph.node if n.op_type == "Constant"
                and not any(o in readers or o in outputs for o in n.output)]
        self.remove_nodes(dead)
        self.clean_initializers()

    def clean_initializers(self) -> list[TensorProto]:
        """Remove the initializers no node (subgraphs included) or graph output reads."""
        used = {o.name for o in self.model.graph.output}
        for node in self.model.graph.node:
            used.update(node.input)
            used.update(subgraph_references(node))
        unused = [t for t in self.model.graph.initializer if t.name not in used]
        self.remove_initializers(unused)
        return unused

    def topological_sort(self) -> None:
        """Sort the nodes as onnxruntime's tool does: nodes without inputs first, then those
        the graph inputs and initializers (by name) release, then breadth first."""
        nodes = list(self.model.graph.node)
        # a subgraph's reads of outer values count as inputs: an If / Loop waits for them
        deps = [[i for i in n.input if i] + sorted(subgraph_references(n) - set(n.input))
                for n in nodes]
        pending = [len(d) for d in deps]
        readers: dict[str, list[int]] = {}
        order = [k for k in range(len(nodes)) if pending[k] == 0]
        for k, d in enumerate(deps):
            for i in d:
                readers.setdefault(i, []).append(k)

        def release(name: str) -> None:
            for k in readers.get(name, ()):
                pending[k] -= 1
                if pending[k] == 0:
                    order.append(k)

        sources = {t.name for t in self.model.graph.initializer} \
            | {i.name for i in self.model.graph.input}
        for name in sorted(sources):
            release(name)
        pos = 0
        while pos < len(order):
            for o in nodes[order[pos]].output:
                release(o)
            pos += 1
        if len(order) != len(nodes):
            raise ValueError("Graph is not a DAG: the nodes cannot be sorted")
        del self.model.graph.node[:]
        self.model.graph.node.extend(nodes[k] for k in order)

    def replace_gemm_with_matmul(self) -> None:
        """Gemm nodes with alpha == beta == 1 and A not transposed become MatMul (+ Add); a
        transposed constant B is stored transposed."""
        new_nodes = []
        for node in self.model.graph.node:
            attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            b = self.get_initializer(node.input[1]) if node.op_type == "Gemm" else None
            if node.op_type != "Gemm" or attrs.get("alpha", 1.0) != 1.0 \
                    or attrs.get("beta", 1.0) != 1.0 or attrs.get("transA", 0) \
                    or (attrs.get("transB", 0) and b is None):
                new_nodes.append(node)
                continue
            b_name = node.input[1]
            if attrs.get("transB", 0):
                arr = numpy_helper.to_array(b).T.copy()
                b_name = f"{b.name}_Transposed"
                self.add_initializer(numpy_helper.from_array(arr, b_name))
            has_c = len(node.input) > 2 and node.input[2]
            mm_out = f"{node.output[0]}_MatMul" if has_c else node.output[0]
            new_nodes.append(helper.make_node("MatMul", [node.input[0], b_name], [mm_out],
                                              f"{node.name}_MatMul" if node.name else None))
            if has_c:
                new_nodes.append(helper.make_node("Add", [mm_out, node.input[2]],
                                                  [node.output[0]],
                                                  f"{node.name}_Add" if node.name else None))
        del self.model.graph.node[:]
        self.model.graph.node.extend(new_nodes)
        self.clean_initializers()

    def save_model_to_file(self, output_path: str | Path,
                           use_external_data_format: bool = False) -> None:
        """Sort the graph and save it (weights in one ``<name>.data`` file on request)."""
        self.topological_sort()
        output_path = Path(output_path)
        if use_external_data_format:
            onnx.external_data_helper.convert_model_to_external_data(
                self.model, all_tensors_to_one_file=True, location=output_path.name + ".data",
                convert_attribute=True)
        onnx.save_model(self.model, str(output_path))


def _largest_suffix(names: Iterable[str], prefix: str) -> int:
    best = -1
    for name in names:
        if name.startswith(prefix) and name[len(prefix):].isdigit():
            best = max(best, int(name[len(prefix):]))
    return best


def subgraph_references(node: NodeProto) -> set[str]:
    """Names a node's subgraphs (If/Loop/Scan bodies, nested too) read from outer scopes."""
    refs: set[str] = set()
    for a in node.attribute:
        graphs = [a.g] if a.HasField("g") else list(a.graphs)
        for g in graphs:
            defined = {i.name for i in g.input} | {t.name for t in g.initializer}
            for n in g.node:
                defined.update(n.output)
            for n in g.node:
                refs.update(i for i in n.input if i and i not in defined)
                refs.update(r for r in subgraph_references(n) if r not in defined)
            refs.update(o.name for o in g.output if o.name not in defined)
    return refs


__all__ = ["ONNXModel", "subgraph_references"]
