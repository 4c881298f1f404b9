"""Exceptions, named as onnxruntime names them (``onnxruntime.capi.onnxruntime_pybind11_state``).

Each also derives from the Python builtin a caller would naturally catch (ValueError for bad
arguments, FileNotFoundError for missing files, NotImplementedError for missing operators), so
code written for either style of handling works.
"""

from __future__ import annotations


class OnnxRunError(RuntimeError):
    """Base class of every error onnxrun raises on purpose."""


class Fail(OnnxRunError):
    """A generic failure (onnxruntime's ``Fail``): e.g. a model that cannot be loaded."""


class InvalidArgument(Fail, ValueError):
    """The caller passed something wrong: an unknown input name, a wrong dtype or shape."""


class NoSuchFile(Fail, FileNotFoundError):
    """A model or external-data file does not exist."""


class InvalidProtobuf(Fail):
    """The bytes given are not a parsable ONNX ModelProto."""


class InvalidGraph(Fail):
    """The model parsed but is not a valid graph (checker, type or structure errors)."""


class NotImplemented(Fail, NotImplementedError):  # noqa: A001 - onnxruntime's name
    """No execution provider has a kernel for an operator at the model's opset."""


class RuntimeException(OnnxRunError):
    """A kernel failed while running; the message names the node, operator and input shapes."""


class EPFail(Fail):
    """An execution provider failed."""


class ModelLoadError(InvalidGraph):
    """Kept for readability in onnxrun's own code: a model that could not be turned into a graph."""
