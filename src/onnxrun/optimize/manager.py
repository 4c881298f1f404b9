"""The pass manager: runs the passes of the requested level to a fixed point, and reports."""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from ..ir import Model
from .base import GraphPass, operator_key, registered_passes
from .graph_utils import all_graphs

logger = logging.getLogger("onnxrun")

MAX_ROUNDS = 8  # fixed point in practice comes after 2-3 rounds


@dataclass
class PassReport:
    name: str
    changes: Counter = field(default_factory=Counter)
    runs: int = 0


@dataclass
class OptimizationReport:
    level: int
    nodes_before: int = 0
    nodes_after: int = 0
    rounds: int = 0
    passes: dict[str, PassReport] = field(default_factory=dict)
    # where the nodes run and the copies between devices (memcpy.Placement), set by a session
    placement: Any = None
    # The layout level (3+), decided when the session prepares its kernels: (convolutions
    # whose output is kept channels-last, convolutions); None before that or below level 3.
    layout: tuple[int, int] | None = None

    def format(self) -> str:
        lines = [f"optimization level {self.level}: {self.nodes_before} nodes -> "
                 f"{self.nodes_after} nodes in {self.rounds} round(s)"]
        for rep in self.passes.values():
            if rep.changes:
                detail = ", ".join(f"{k}: {v}" for k, v in rep.changes.most_common())
                lines.append(f"  {rep.name:<32} {detail}")
        if len(lines) == 1:
            lines.append("  (no pass changed the graph)")
        if self.placement is not None:
            lines.append(self.placement.format())
        if self.layout is not None:
            turned, convs = self.layout
            lines.append(f"  {'layout (channels-last)':<32} {turned} of {convs} convolution "
                         "outputs kept channels-last (NCHW at the graph's edges)")
        return "\n".join(lines)


def count_nodes(model: Model) -> int:
    return sum(len(g.nodes) for g in all_graphs(model.graph))


def operators_in(model: Model) -> set[str]:
    """The operators of every graph of the model, named as ``GraphPass.needs`` names them."""
    return {operator_key(n.domain, n.op_type) for g in all_graphs(model.graph) for n in g.nodes}


def can_act(p: GraphPass, operators: set[str]) -> bool:
    return not p.needs or any(group <= operators for group in p.needs)


def select_passes(level: int, disabled: set[str]) -> list[GraphPass]:
    return [p for p in registered_passes() if p.level <= level and p.name not in disabled]


def run_passes(model: Model, level: int, disabled: set[str] | None = None) -> OptimizationReport:
    report = OptimizationReport(level=level, nodes_before=count_nodes(model))
    passes = select_passes(level, disabled or set())
    for p in passes:
        report.passes[p.name] = PassReport(p.name)
    # A pass that changed nothing need not run again until another pass changes the graph:
    # passes are functions of the graph, so it would find nothing again. That skips most of
    # the last round, which only confirms the fixed point. ``changes`` counts the changes made.
    # Likewise a pass whose operators do not occur (``needs``) would find nothing: it is not run
    # (nor its module imported) until a change brings them in.
    changes = 0
    clean_at: dict[str, int] = {}  # pass name -> value of ``changes`` when it last found nothing
    operators: set[str] | None = None  # those of the graph as it is after ``changes`` changes
    for round_ in range(1, MAX_ROUNDS + 1):
        report.rounds = round_
        modified = False
        for p in passes:
            if clean_at.get(p.name) == changes:
                continue
            if p.needs:
                if operators is None:
                    operators = operators_in(model)
                if not can_act(p, operators):
                    clean_at[p.name] = changes
                    continue
            result = p.run(model)
            rep = report.passes[p.name]
            rep.runs += 1
            if result.modified:
                modified = True
                changes += 1
                operators = None
                clean_at.pop(p.name, None)
                rep.changes.update(result.changes)
            else:
                clean_at[p.name] = changes
        if not modified:
            break
    report.nodes_after = count_nodes(model)
    if logger.isEnabledFor(logging.DEBUG):
        logger.debug("%s", report.format())
    return report
