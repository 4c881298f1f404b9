"""Writes the example models of onnxrun.datasets next to this file."""

from __future__ import annotations

import os

import onnx
from onnx import TensorProto, helper

# Logistic regression on two iris features, three classes (weights of the model onnxruntime
# ships under the same name, so documentation examples give the same numbers).
_IRIS_COEFFICIENTS = [0.385741144, 1.38054061, -2.13145, -0.992804825, 0.642774522, -1.7489388,
                      0.515096605, -1.40534759, -1.72411919, -1.15951371, 2.24788475, 2.42839146]
_IRIS_INTERCEPTS = [0.2496292, 0.582027793, -0.941616654]


def logreg_iris() -> onnx.ModelProto:
    classes = [0, 1, 2]
    nodes = [
        helper.make_node("LinearClassifier", ["float_input"], ["label", "probability_tensor"],
                         name="LinearClassifier", domain="ai.onnx.ml",
                         classlabels_ints=classes, coefficients=_IRIS_COEFFICIENTS,
                         intercepts=_IRIS_INTERCEPTS, multi_class=0, post_transform="LOGISTIC"),
        helper.make_node("Normalizer", ["probability_tensor"], ["probability_tensor_normalized"],
                         name="Normalizer", domain="ai.onnx.ml", norm="L1"),
        helper.make_node("ZipMap", ["probability_tensor_normalized"], ["probabilities"],
                         name="ZipMap", domain="ai.onnx.ml", classlabels_int64s=classes),
    ]
    probabilities = helper.make_tensor_sequence_value_info("probabilities", TensorProto.UNDEFINED,
                                                           None)
    probabilities.type.sequence_type.elem_type.CopyFrom(
        helper.make_map_type_proto(TensorProto.INT64, helper.make_tensor_type_proto(
            TensorProto.FLOAT, None)))
    graph = helper.make_graph(
        nodes, "logreg_iris",
        [helper.make_tensor_value_info("float_input", TensorProto.FLOAT, [3, 2])],
        [helper.make_tensor_value_info("label", TensorProto.INT64, [3]), probabilities])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("ai.onnx.ml", 1)],
                             ir_version=7, producer_name="onnxrun")


def mul_1() -> onnx.ModelProto:
    w = helper.make_tensor("W", TensorProto.FLOAT, [3, 2], [1, 2, 3, 4, 5, 6])
    graph = helper.make_graph(
        [helper.make_node("Mul", ["X", "W"], ["Y"], name="mul_1")], "mul test",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [3, 2])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [3, 2])], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 7)], ir_version=7,
                             producer_name="onnxrun")


def sigmoid() -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("Sigmoid", ["x"], ["y"])], "test_sigmoid",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4, 5])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 9)], ir_version=7,
                             producer_name="onnxrun")


EXAMPLES = {"logreg_iris.onnx": logreg_iris, "mul_1.onnx": mul_1, "sigmoid.onnx": sigmoid}


def main() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    for name, build in EXAMPLES.items():
        model = build()
        onnx.checker.check_model(model)
        onnx.save(model, os.path.join(here, name))


if __name__ == "__main__":
    main()
