"""onnxrun as an ``onnx.backend``: the ecosystem's standard way to plug an engine into ONNX's
test suite (``onnx.backend.test.BackendTest(onnxrun.backend)``) and into tools that take a
backend module. The layout is onnxruntime's (``onnxruntime.backend.backend.OnnxRuntimeBackend``,
``onnxruntime.backend.backend_rep.OnnxRuntimeBackendRep``)::

    import onnxrun.backend as backend
    rep = backend.prepare(model_proto, "CPU")
    outputs = rep.run([x])            # a list (or a dict keyed by input name)
    outputs = backend.run(model_proto, [x])
    outputs = backend.run_node(node_proto, [a, b])

Keyword arguments set session options (``prepare``) and run options (``rep.run``), limited to
the attributes that cannot write files or stop a run, as in onnxruntime: a known attribute
outside that list raises ``RuntimeError`` ("not permitted"), an unknown keyword is ignored.
"""

from __future__ import annotations

from .backend import (
    OnnxrunBackend,
    OnnxRuntimeBackend,
    is_compatible,
    prepare,
    run,
    run_model,
    run_node,
    supports_device,
)
from .backend_rep import OnnxrunBackendRep, OnnxRuntimeBackendRep

__all__ = [
    "OnnxRuntimeBackend", "OnnxRuntimeBackendRep", "OnnxrunBackend", "OnnxrunBackendRep",
    "is_compatible", "prepare", "run", "run_model", "run_node", "supports_device",
]
