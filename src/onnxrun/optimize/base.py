"""The pass contract: ``run(model) -> PassResult``; passes register themselves by level."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from ..ir import Model
from . import graph_utils
from .pattern import RewriteRule, apply_rule

BASIC, EXTENDED, LAYOUT = 1, 2, 3

_REGISTRY: list[GraphPass] = []


@dataclass
class PassResult:
    modified: bool
    changes: Counter = field(default_factory=Counter)  # what changed, e.g. {"Conv+Relu": 16}


class GraphPass:
    """One optimization. ``name`` is what reports show and what the session config entry
    ``optimization.disable_specified_optimizers`` (comma-separated) names to turn it off."""

    name = ""
    level = BASIC
    order = 50  # passes run in increasing order within a round

    def run(self, model: Model) -> PassResult:
        raise NotImplementedError


class RulePass(GraphPass):
    """A pass made of pattern rewrite rules, applied to every graph until none matches."""

    rules: tuple[type[RewriteRule], ...] = ()

    def __init__(self) -> None:
        self._rules = [r() for r in self.rules]

    def run(self, model: Model) -> PassResult:
        changes: Counter = Counter()
        for graph in list(graph_utils.all_graphs(model.graph)):
            for rule in self._rules:
                n = apply_rule(rule, model, graph)
                if n:
                    changes[rule.name] += n
        return PassResult(bool(changes), changes)


def register_pass(cls: type[GraphPass]) -> type[GraphPass]:
    """Class decorator: add a pass to the registry the pass manager reads."""
    _REGISTRY.append(cls())
    return cls


def registered_passes() -> list[GraphPass]:
    _load_pass_modules()
    return sorted(_REGISTRY, key=lambda p: (p.level, p.order, p.name))


_loaded = False


def _load_pass_modules() -> None:
    global _loaded
    if _loaded:
        return
    import importlib
    import pkgutil

    from . import basic, extended

    for pkg in (basic, extended):
        for info in pkgutil.walk_packages(pkg.__path__, prefix=f"{pkg.__name__}."):
            importlib.import_module(info.name)
    _loaded = True
