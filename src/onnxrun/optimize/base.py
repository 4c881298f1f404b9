"""The pass contract: ``run(model) -> PassResult``; passes register themselves by level.

The built-in passes are listed in their package's ``PASSES`` table (``basic/``, ``extended/``):
a pass's module is imported only when the pass first has something to look at, so a session
imports the passes its model can use (importing all of them costs more than optimizing a small
model).
"""

from __future__ import annotations

import importlib
import os
from collections import Counter
from dataclasses import dataclass, field

from ..ir import Model
from . import graph_utils
from .pattern import PatternOutput, RewriteRule, apply_rule

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
    # The operators the pass acts on: it can change a graph only if, for one of these groups,
    # every operator occurs in the model ("Op" for ai.onnx, else "domain:Op"). Empty: any graph.
    needs: tuple[frozenset[str], ...] = ()

    def run(self, model: Model) -> PassResult:
        raise NotImplementedError


class RulePass(GraphPass):
    """A pass made of pattern rewrite rules, applied to every graph until none matches."""

    rules: tuple[type[RewriteRule], ...] = ()

    def __init__(self) -> None:
        self._rules = [r() for r in self.rules]
        # A rule matches only where every operator of its pattern occurs.
        self.needs = tuple(dict.fromkeys(_pattern_operators(r) for r in self._rules))

    def run(self, model: Model) -> PassResult:
        changes: Counter = Counter()
        for graph in list(graph_utils.all_graphs(model.graph)):
            for rule in self._rules:
                n = apply_rule(rule, model, graph)
                if n:
                    changes[rule.name] += n
        return PassResult(bool(changes), changes)


def operator_key(domain: str, op_type: str) -> str:
    """How ``needs`` names an operator."""
    return f"{domain}:{op_type}" if domain else op_type


def _pattern_operators(rule: RewriteRule) -> frozenset[str]:
    found, stack = set(), [rule._root]
    while stack:
        node = stack.pop()
        found.add(operator_key(node.domain, node.op_type))
        stack += [i.node for i in node.inputs if isinstance(i, PatternOutput)]
    return frozenset(found)


def register_pass(cls: type[GraphPass]) -> type[GraphPass]:
    """Class decorator: add a pass to the registry the pass manager reads."""
    _REGISTRY.append(cls())
    return cls


class DeferredPass(GraphPass):
    """A built-in pass as its package's ``PASSES`` table lists it; its module is imported the
    first time it runs."""

    def __init__(self, module: str, name: str, level: int, order: int,
                 needs: tuple[str, ...]) -> None:
        self.module, self.name, self.level, self.order = module, name, level, order
        self.needs = tuple(frozenset(group.split()) for group in needs)
        self._impl: GraphPass | None = None

    def run(self, model: Model) -> PassResult:
        if self._impl is None:
            importlib.import_module(self.module)
            self._impl = next(p for p in _REGISTRY if p.name == self.name)
        return self._impl.run(model)


_BUILT_IN: list[DeferredPass] | None = None


def _built_in_passes() -> list[DeferredPass]:
    from importlib.machinery import all_suffixes

    from . import basic, extended, layout

    suffixes = tuple(all_suffixes())

    passes = []
    for package, level in ((basic, BASIC), (extended, EXTENDED), (layout, LAYOUT)):
        for module, (name, order, needs) in package.PASSES.items():
            passes.append(DeferredPass(f"{package.__name__}.{module}", name, level, order, needs))
        # A pass module missing from the table (tests/optimize/test_pass_index.py says so) still
        # runs: imported now, its pass registers as any other.
        # (the folder listed, not pkgutil.iter_modules: its import and per-file checks were
        # ~2 ms of a first session)
        for folder in package.__path__:
            for file in os.listdir(folder):
                name = file.split(".", 1)[0]
                if file.endswith(suffixes) and name.isidentifier() and \
                        not name.startswith("_") and name not in package.PASSES:
                    importlib.import_module(f"{package.__name__}.{name}")
    return passes


def registered_passes() -> list[GraphPass]:
    """Every pass: the built-in ones (deferred) and any registered from elsewhere."""
    global _BUILT_IN
    if _BUILT_IN is None:
        _BUILT_IN = _built_in_passes()
    listed = {p.name for p in _BUILT_IN}
    passes = [*_BUILT_IN, *(p for p in _REGISTRY if p.name not in listed)]
    return sorted(passes, key=lambda p: (p.level, p.order, p.name))
