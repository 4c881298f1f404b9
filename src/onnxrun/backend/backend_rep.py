"""The prepared model of onnxrun's ONNX backend: runs it on inputs given as ONNX's backend API
gives them."""

from __future__ import annotations

from typing import Any

import numpy as np
from onnx.backend.base import BackendRep, namedtupledict

from ..api.options import RunOptions
from ..api.session import InferenceSession

# RunOptions attributes a caller may set through ``rep.run(**kwargs)``: not ``terminate``,
# which would cancel the very run it is passed to (onnxruntime's list).
ALLOWED_RUN_OPTIONS = frozenset(
    {"log_severity_level", "log_verbosity_level", "logid", "only_execute_path_to_fetches"})


def apply_options(options: Any, kwargs: dict[str, Any], allowed: frozenset[str]) -> None:
    """Set ``kwargs`` on ``options``: allowed attributes are set, other attributes of
    ``options`` raise RuntimeError, keywords that are no attribute are ignored."""
    for key, value in kwargs.items():
        if key in allowed:
            setattr(options, key, value)
        elif hasattr(options, key):
            raise RuntimeError(
                f"{type(options).__name__} attribute '{key}' is not permitted via the backend "
                f"API. Allowed attributes: {', '.join(sorted(allowed))}"
            )


class OnnxrunBackendRep(BackendRep):
    def __init__(self, session: InferenceSession) -> None:
        self.session = session
        self._input_names = [i.name for i in session.get_inputs()]
        self._output_names = [o.name for o in session.get_outputs()]

    def run(self, inputs: Any, **kwargs: Any) -> tuple[Any, ...]:
        """``inputs``: a list (or tuple) with one value per model input, a dict keyed by input
        name, or the value of a model's single input (an array, or a map for a map input)."""
        options = RunOptions()
        apply_options(options, kwargs, ALLOWED_RUN_OPTIONS)
        if isinstance(inputs, list | tuple):
            if len(inputs) > len(self._input_names):
                raise ValueError(
                    f"{len(inputs)} inputs given, the model takes {len(self._input_names)}: "
                    f"{self._input_names}"
                )
            feed = dict(zip(self._input_names, inputs, strict=False))
        elif isinstance(inputs, dict) and inputs and all(
                isinstance(k, str) and k in self._input_names for k in inputs):
            feed = dict(inputs)
        elif len(self._input_names) == 1:
            feed = {self._input_names[0]: inputs}
        else:
            raise RuntimeError(
                f"the model takes {len(self._input_names)} inputs {self._input_names}: give a "
                f"list or a dict, not a single {type(inputs).__name__}"
            )
        feed = {k: np.asarray(v) if isinstance(v, np.generic) else v for k, v in feed.items()}
        outputs = self.session.run(None, feed, options)
        return namedtupledict("Outputs", self._output_names)(*outputs)


# onnxruntime's name for the class.
OnnxRuntimeBackendRep = OnnxrunBackendRep
