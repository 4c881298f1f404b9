"""Step 3 of a session: graph optimizations at onnxruntime's levels.

The session calls ``optimize(model, level, options)`` between validation and partitioning. The
passes themselves (constant folding, eliminations, fusions, layout) are issue #4's work; until
then every level returns the model unchanged, which is always correct.
"""

from __future__ import annotations

from typing import Any

from ..ir import Model


def optimize(model: Model, level: int, session_options: Any = None) -> Model:
    return model


__all__ = ["optimize"]
