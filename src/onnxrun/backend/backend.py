"""onnxrun's ONNX backend (``onnx.backend.base.Backend``): prepare a model, run it, run a node."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx.backend.base import Backend

from ..api.options import SessionOptions
from ..api.session import InferenceSession
from .backend_rep import OnnxrunBackendRep, apply_options

# SessionOptions attributes a caller may set through ``prepare(**kwargs)``, onnxruntime's list:
# not optimized_model_filepath, profile_file_prefix or enable_profiling, which write files
# wherever the caller names (a backend's keywords often come from untrusted configuration).
ALLOWED_SESSION_OPTIONS = frozenset({
    "enable_cpu_mem_arena", "enable_mem_pattern", "enable_mem_reuse", "execution_mode",
    "execution_order", "graph_optimization_level", "inter_op_num_threads",
    "intra_op_num_threads", "log_severity_level", "log_verbosity_level", "logid",
    "use_deterministic_compute", "use_per_session_threads",
})


class OnnxrunBackend(Backend):
    @classmethod
    def is_compatible(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> bool:
        return cls.supports_device(device)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return str(device).upper().split(":")[0] == "CPU"

    @classmethod
    def prepare(cls, model: onnx.ModelProto | bytes | str | os.PathLike | InferenceSession
                | OnnxrunBackendRep, device: str | None = None, **kwargs: Any
                ) -> OnnxrunBackendRep:
        """A model (ModelProto, bytes, or a path), a session or a prepared model, ready to run.
        ``kwargs``: session options (see ALLOWED_SESSION_OPTIONS); ignored for a session."""
        if device is not None and not cls.supports_device(device):
            raise RuntimeError(f"Incompatible device expected '{device}', got 'CPU'")
        if isinstance(model, OnnxrunBackendRep):
            return model
        if isinstance(model, InferenceSession):
            return OnnxrunBackendRep(model)
        options = SessionOptions()
        apply_options(options, kwargs, ALLOWED_SESSION_OPTIONS)
        source = model.SerializeToString() if isinstance(model, onnx.ModelProto) else model
        return OnnxrunBackendRep(InferenceSession(source, options))

    @classmethod
    def run_model(cls, model: Any, inputs: Any, device: str | None = None, **kwargs: Any
                  ) -> tuple[Any, ...]:
        """Prepare and run: ``kwargs`` go to ``prepare`` (session options) and to ``run`` (run
        options), each checked against its own list."""
        rep = cls.prepare(model, device, **kwargs)
        return rep.run(inputs, **kwargs)

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


# onnxruntime's name for the class.
OnnxRuntimeBackend = OnnxrunBackend

prepare = OnnxrunBackend.prepare
run_model = OnnxrunBackend.run_model
run = run_model  # onnxruntime.backend.run
run_node = OnnxrunBackend.run_node
supports_device = OnnxrunBackend.supports_device
is_compatible = OnnxrunBackend.is_compatible
