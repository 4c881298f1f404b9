"""Graph walks (ir.core.holding_graphs, optimize.graph_utils.all_graphs) find every subgraph
that Node.subgraphs() names, whatever the attribute kinds around them, without asking each
node."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from onnxrun.ir import Graph, Node, Value
from onnxrun.ir.core import Attribute, holding_graphs
from onnxrun.ir.serde import model_from_proto
from onnxrun.optimize.graph_utils import all_graphs

A = onnx.AttributeProto


def _reference(graph: Graph) -> list[Graph]:
    found = [graph]
    for node in graph.nodes:
        for sub in node.subgraphs():
            found += _reference(sub)
    return found


def _node(*attrs: Attribute) -> Node:
    return Node("Op", [], [Value("y")], {a.name: a for a in attrs})


def test_holding_graphs_sees_every_kind_of_attribute():
    g1, g2, g3 = Graph("a"), Graph("b"), Graph("c")
    plain = [_node(), _node(Attribute("i", A.INT, 1), Attribute("f", A.FLOAT, 0.5)),
             _node(Attribute("ints", A.INTS, [1, 2]), Attribute("e", A.INTS, [])),
             _node(Attribute("t", A.TENSOR, np.zeros(2)), Attribute("s", A.STRING, "x")),
             _node(Attribute("tp", A.TYPE_PROTO, onnx.TypeProto()))]
    holding = [_node(Attribute("i", A.INT, 1), Attribute("g", A.GRAPH, g1)),
               _node(Attribute("ints", A.INTS, [3]), Attribute("gs", A.GRAPHS, [g2, g3])),
               _node(Attribute("tp", A.TYPE_PROTOS, [onnx.TypeProto()]),
                     Attribute("g", A.GRAPH, g1))]
    nodes = [plain[0], holding[0], *plain[1:3], holding[1], plain[3], holding[2], plain[4]]
    assert list(holding_graphs(nodes)) == holding


def _if_model() -> onnx.ModelProto:
    def branch(name: str, value: float) -> onnx.GraphProto:
        c = helper.make_tensor("c", TensorProto.FLOAT, [1], [value])
        inner = helper.make_graph(
            [helper.make_node("Constant", [], ["k"], value=c),
             helper.make_node("Add", ["x", "k"], ["out"])], name + "_body", [],
            [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1])])
        return helper.make_graph(
            [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("If", ["cond"], ["out"], then_branch=inner, else_branch=inner)],
            name, [], [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1])])

    graph = helper.make_graph(
        [helper.make_node("Transpose", ["x"], ["t"], perm=[0]),
         helper.make_node("If", ["cond"], ["y"], then_branch=branch("then", 1.0),
                          else_branch=branch("else", 2.0))],
        "main", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1]),
                 helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_all_graphs_is_the_walk_over_subgraphs():
    model = model_from_proto(_if_model())
    found = list(all_graphs(model.graph))
    assert [g.name for g in found] == [g.name for g in _reference(model.graph)]
    # (onnx.helper lists attributes by name: else_branch first)
    assert [g.name for g in found] == ["main", "else", "else_body", "else_body", "then",
                                       "then_body", "then_body"]
