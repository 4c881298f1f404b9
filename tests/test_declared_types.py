"""Declared types (value_info, graph outputs) that disagree with type/shape inference.

onnxruntime warns and merges a conflicting *shape* leniently, ignores a Constant's declared type
(Constants become initializers), and refuses another *element type* on a node's output.
onnxruntime-genai's model builder writes such value_info ("Inferred shape and existing shape
differ in rank: (1) vs (0)" on a Constant): onnxrun must load what onnxruntime loads, run it to
the same numbers, and report the same output shapes. onnxruntime is the oracle throughout."""

from __future__ import annotations

import logging

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper

import onnxrun

ort = pytest.importorskip("onnxruntime")
CPU = ["CPUExecutionProvider"]
X = np.arange(6, dtype=np.float32).reshape(2, 3) - 2


def _model(value_info=(), output=None, tail="Relu", opset=17) -> onnx.ModelProto:
    """X * c (c a scalar Constant) -> m -> tail -> Y."""
    nodes = [
        helper.make_node("Constant", [], ["c"],
                         value=helper.make_tensor("c", TP.FLOAT, [], [2.0])),
        helper.make_node("Mul", ["X", "c"], ["m"]),
        helper.make_node(tail, ["m"], ["Y"]),
    ]
    out = output or helper.make_tensor_value_info(
        "Y", TP.INT64 if tail == "Shape" else TP.FLOAT, [2] if tail == "Shape" else [2, 3])
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("X", TP.FLOAT, [2, 3])],
                          [out], value_info=list(value_info))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _vi(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


LOADS = {
    # the builder's case: a scalar Constant declared with shape [1]
    "constant_rank": _model([_vi("c", TP.FLOAT, [1])]),
    "constant_elem_type": _model([_vi("c", TP.INT64, [])]),
    "intermediate_rank": _model([_vi("m", TP.FLOAT, [2, 3, 1])]),
    "intermediate_dim": _model([_vi("m", TP.FLOAT, [2, 5])]),
    "intermediate_symbolic_rank": _model([_vi("m", TP.FLOAT, ["a"])]),
    "latest_opset": _model([_vi("m", TP.FLOAT, [2, 5])], opset=21),
    # a wrong declaration must not reach a value computed from shapes
    "shape_of_misdeclared": _model([_vi("m", TP.FLOAT, [2, 5])], tail="Shape"),
    "output_rank": _model(output=_vi("Y", TP.FLOAT, [6])),
    "output_dim": _model(output=_vi("Y", TP.FLOAT, [2, 4])),
    "output_symbolic_rank": _model(output=_vi("Y", TP.FLOAT, ["a", "b", "c"])),
}


@pytest.mark.parametrize("name", sorted(LOADS))
def test_conflicting_shape_loads_like_onnxruntime(name, caplog):
    data = LOADS[name].SerializeToString()
    ref = ort.InferenceSession(data, providers=CPU)
    with caplog.at_level(logging.WARNING, logger="onnxrun"):
        sess = onnxrun.InferenceSession(data)
    if name != "constant_elem_type":
        assert "disagree with type/shape inference" in caplog.text
    np.testing.assert_array_equal(sess.run(None, {"X": X})[0], ref.run(None, {"X": X})[0])
    assert [(o.name, o.type, o.shape) for o in sess.get_outputs()] == [
        (o.name, o.type, o.shape) for o in ref.get_outputs()]


@pytest.mark.parametrize("where", ["value_info", "output"])
def test_conflicting_element_type_is_refused_like_onnxruntime(where):
    if where == "value_info":
        m = _model([_vi("m", TP.INT64, [2, 3])])
    else:
        m = _model(output=_vi("Y", TP.INT64, [2, 3]))
    data = m.SerializeToString()
    name = "m" if where == "value_info" else "Y"
    message = rf"Type Error: Type \(tensor\(int64\)\) of output arg \({name}\)"
    with pytest.raises(Exception, match=message):
        ort.InferenceSession(data, providers=CPU)
    with pytest.raises(onnxrun.InvalidGraph, match=message):
        onnxrun.InferenceSession(data)


def test_conflicts_on_a_path_to_an_output():
    """onnxruntime's lenient merge leaves m's rank unknown, so it never sees Y's declaration
    conflict and reports Y as declared ([7, 3]); onnxrun replaces m's type by the inferred
    one, so it sees the conflict and reports the union of Y's two shapes. Same numbers."""
    data = _model([_vi("c", TP.FLOAT, [1]), _vi("m", TP.FLOAT, [3])],
                  output=_vi("Y", TP.FLOAT, [7, 3])).SerializeToString()
    ref = ort.InferenceSession(data, providers=CPU)
    sess = onnxrun.InferenceSession(data)
    np.testing.assert_array_equal(sess.run(None, {"X": X})[0], ref.run(None, {"X": X})[0])
    assert sess.get_outputs()[0].shape == [None, 3]


def test_conflicting_value_info_inside_a_subgraph():
    then = helper.make_graph(
        [helper.make_node("Relu", ["X"], ["t"]), helper.make_node("Neg", ["t"], ["tb"])], "then",
        [], [_vi("tb", TP.FLOAT, [2, 3])], value_info=[_vi("t", TP.FLOAT, [4])])
    other = helper.make_graph([helper.make_node("Abs", ["X"], ["eb"])], "else", [],
                              [_vi("eb", TP.FLOAT, [2, 3])])
    g = helper.make_graph(
        [helper.make_node("If", ["cond"], ["Y"], then_branch=then, else_branch=other)], "g",
        [_vi("X", TP.FLOAT, [2, 3]), _vi("cond", TP.BOOL, [])], [_vi("Y", TP.FLOAT, [2, 3])])
    data = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    ref = ort.InferenceSession(data, providers=CPU)
    sess = onnxrun.InferenceSession(data)
    for cond in (True, False):
        feed = {"X": X, "cond": np.array(cond)}
        np.testing.assert_array_equal(sess.run(None, feed)[0], ref.run(None, feed)[0])


def test_a_real_inference_error_is_still_refused():
    # Add of [2, 3] and [4]: no declaration to blame, so the model itself is wrong
    g = helper.make_graph([helper.make_node("Add", ["X", "B"], ["Y"])], "g",
                          [_vi("X", TP.FLOAT, [2, 3]), _vi("B", TP.FLOAT, [4])],
                          [_vi("Y", TP.FLOAT, [2, 3])], value_info=[_vi("Y2", TP.FLOAT, [1])])
    data = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    with pytest.raises(onnxrun.InvalidGraph, match="inference failed"):
        onnxrun.InferenceSession(data)
