"""onnxrun's graph IR and its conversion to and from onnx protobuf."""

from .core import Attribute, Graph, Model, Node, Value
from .serde import model_from_proto, model_to_proto, tensor_to_array

__all__ = [
    "Attribute",
    "Graph",
    "Model",
    "Node",
    "Value",
    "model_from_proto",
    "model_to_proto",
    "tensor_to_array",
]
