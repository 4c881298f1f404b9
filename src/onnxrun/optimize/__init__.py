"""Step 3 of a session: graph optimizations at onnxruntime's levels.

``optimize(model, level, options)`` runs every registered pass whose level is at most ``level``
(0 disable all, 1 basic, 2 extended, 3 layout, 99 all) to a fixed point and returns the model and
a report of what each pass changed. One pass per module, under ``basic/`` and ``extended/``;
rewrite rules read as the subgraph they match (``pattern.py``).

Passes are turned off by name with the session config entry
``optimization.disable_specified_optimizers`` (comma-separated), or the session's
``disabled_optimizers`` argument, as in onnxruntime.
"""

from __future__ import annotations

from typing import Any

from ..ir import Model
from .base import BASIC, EXTENDED, LAYOUT, GraphPass, PassResult, RulePass, register_pass
from .manager import OptimizationReport, run_passes
from .pattern import RewriteRule

DISABLE_KEY = "optimization.disable_specified_optimizers"


def disabled_passes(session_options: Any, extra: Any = None) -> set[str]:
    names: set[str] = set()
    config = getattr(session_options, "_config", {}) or {}
    if config.get(DISABLE_KEY):
        names.update(n.strip() for n in config[DISABLE_KEY].split(",") if n.strip())
    if extra:
        names.update(extra)
    return names


def optimize(model: Model, level: int, session_options: Any = None, disabled: Any = None
             ) -> tuple[Model, OptimizationReport]:
    if _has_gradient(model):
        # Gradient names the tensors it differentiates (attributes xs, y) and differentiates
        # the nodes between them: rewrites could remove, fuse or rename those, so run as written.
        level = 0
    report = run_passes(model, int(level), disabled_passes(session_options, disabled))
    return model, report


def _has_gradient(model: Model) -> bool:
    return any(n.op_type == "Gradient" and n.domain == "ai.onnx.preview.training"
               for n in model.graph.all_nodes())


__all__ = ["BASIC", "EXTENDED", "LAYOUT", "GraphPass", "OptimizationReport", "PassResult",
           "RewriteRule", "RulePass", "optimize", "register_pass"]
