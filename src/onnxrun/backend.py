"""onnxrun as an ``onnx.backend``: the ecosystem's standard way to plug an engine into ONNX's
test suite (``onnx.backend.test.BackendTest(onnxrun.backend)``) and into tools that take a
backend module.

    import onnxrun.backend as backend
    rep = backend.prepare(model_proto, "CPU")
    outputs = rep.run([x])            # a list (or a dict keyed by input name)
    outputs = backend.run_node(node_proto, [a, b])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx.backend.base import Backend, BackendRep, namedtupledict

from .api.options import GraphOptimizationLevel, SessionOptions
from .api.session import InferenceSession


class OnnxrunBackendRep(BackendRep):
    def __init__(self, session: InferenceSession) -> None:
        self.session = session
        self._input_names = [i.name for i in session.get_inputs()]
        self._output_names = [o.name for o in session.get_outputs()]

    def run(self, inputs: Any, **kwargs: Any) -> tuple[Any, ...]:
        if isinstance(inputs, dict):
            feed = dict(inputs)
        elif isinstance(inputs, np.ndarray | list | tuple) and not (
            isinstance(inputs, np.ndarray) and len(self._input_names) != 1
        ):
            values = [inputs] if isinstance(inputs, np.ndarray) else list(inputs)
            if len(values) > len(self._input_names):
                raise ValueError(
                    f"{len(values)} inputs given, the model takes {len(self._input_names)}: "
                    f"{self._input_names}"
                )
            feed = dict(zip(self._input_names, values, strict=False))
        else:
            raise TypeError(f"unexpected inputs of type {type(inputs).__name__}")
        outputs = self.session.run(None, feed)
        return namedtupledict("Outputs", self._output_names)(*outputs)


class OnnxrunBackend(Backend):
    @classmethod
    def is_compatible(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> bool:
        return cls.supports_device(device)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return str(device).upper().split(":")[0] == "CPU"

    @classmethod
    def prepare(cls, model: onnx.ModelProto | bytes | str, device: str = "CPU", **kwargs: Any
                ) -> OnnxrunBackendRep:
        if not cls.supports_device(device):
            raise RuntimeError(f"onnxrun backend does not support device '{device}'")
        options = SessionOptions()
        for key, value in kwargs.items():
            if hasattr(options, key):
                setattr(options, key, value)
        if "graph_optimization_level" not in kwargs:
            options.graph_optimization_level = GraphOptimizationLevel.ORT_ENABLE_ALL
        source = model.SerializeToString() if isinstance(model, onnx.ModelProto) else model
        return OnnxrunBackendRep(InferenceSession(source, options))

    @classmethod
    def run_model(cls, model: onnx.ModelProto, inputs: Any, device: str = "CPU", **kwargs: Any
                  ) -> tuple[Any, ...]:
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node: onnx.NodeProto, inputs: Any, device: str = "CPU",
                 outputs_info: Sequence[tuple[np.dtype, tuple[int, ...]]] | None = None,
                 **kwargs: Any) -> tuple[Any, ...]:
        """Run one node: a model is built around it from the inputs' dtypes and shapes."""
        opset = kwargs.pop("opset_version", onnx.defs.onnx_opset_version())
        values = list(inputs.values()) if isinstance(inputs, dict) else list(inputs)
        names = [n for n in node.input if n]
        graph_inputs = [
            onnx.helper.make_tensor_value_info(
                name, onnx.helper.np_dtype_to_tensor_dtype(np.asarray(v).dtype), np.shape(v)
            )
            for name, v in zip(names, values, strict=False)
        ]
        graph_outputs = [onnx.helper.make_empty_tensor_value_info(o) for o in node.output if o]
        graph = onnx.helper.make_graph([node], "run_node", graph_inputs, graph_outputs)
        imports = [onnx.helper.make_opsetid("", opset)]
        if node.domain not in ("", "ai.onnx"):
            imports.append(onnx.helper.make_opsetid(node.domain, 1))
        model = onnx.helper.make_model(graph, opset_imports=imports)
        return cls.prepare(model, device).run(dict(zip(names, values, strict=False)))


prepare = OnnxrunBackend.prepare
run_model = OnnxrunBackend.run_model
run_node = OnnxrunBackend.run_node
supports_device = OnnxrunBackend.supports_device
is_compatible = OnnxrunBackend.is_compatible
