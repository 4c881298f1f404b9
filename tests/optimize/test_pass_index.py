"""The built-in passes are listed in optimize/basic/__init__.py, optimize/extended/__init__.py
and optimize/layout/__init__.py (``PASSES``) so that the pass manager can order them, and skip
the ones whose operators do not occur, without importing them. The tables must say what the
modules define, and skipping must change nothing: a skipped pass is one that would have found
nothing."""

from __future__ import annotations

import importlib
import os
import pkgutil
from pathlib import Path

import onnx
import pytest

from onnxrun.load import load_model
from onnxrun.optimize import basic, extended, layout, manager, optimize
from onnxrun.optimize.base import _REGISTRY, BASIC, EXTENDED, LAYOUT, RulePass
from onnxrun.validate import validate

MODELS = Path(__file__).resolve().parent.parent / "models"
LIGHT_ZOO = Path(os.path.dirname(onnx.__file__)) / "backend/test/data/light"


@pytest.mark.parametrize("package, level", [(basic, BASIC), (extended, EXTENDED),
                                            (layout, LAYOUT)])
def test_table_matches_the_pass_modules(package, level):
    modules = {info.name for info in pkgutil.iter_modules(package.__path__)
               if not info.name.startswith("_")}
    assert set(package.PASSES) == modules
    for module, (name, order, needs) in package.PASSES.items():
        importlib.import_module(f"{package.__name__}.{module}")
        (p,) = [p for p in _REGISTRY if p.name == name]
        assert type(p).__module__ == f"{package.__name__}.{module}"
        assert (p.level, p.order) == (level, order), name
        if isinstance(p, RulePass):  # what the rules' patterns need, exactly
            assert {frozenset(g.split()) for g in needs} == set(p.needs), name


def _optimized(path: Path) -> tuple[list, dict]:
    proto, model = load_model(str(path))
    validate(proto, model)
    model, report = optimize(model, 99)
    graphs = [model.graph]
    nodes = []
    while graphs:
        g = graphs.pop()
        for n in g.nodes:
            nodes.append((n.domain, n.op_type, [v.name if v else "" for v in n.inputs],
                          [v.name for v in n.outputs], sorted(n.attributes)))
            graphs += n.subgraphs()
    return nodes, {name: dict(r.changes) for name, r in report.passes.items()}


CASES = [*sorted(MODELS.glob("*.onnx")), *sorted((MODELS / "quant").glob("*.onnx")),
         *(LIGHT_ZOO / f"light_{name}.onnx"
           for name in ("squeezenet", "shufflenet", "inception_v1", "densenet121"))]


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem)
def test_skipping_passes_changes_nothing(path, monkeypatch):
    skipped = _optimized(path)
    monkeypatch.setattr(manager, "can_act", lambda p, operators: True)
    assert skipped == _optimized(path)


def test_pass_module_missing_from_the_table_still_registers(monkeypatch):
    """A pass module the table lacks is imported when the passes are first listed (the folder
    scanned), so its pass runs like any other."""
    import sys

    from onnxrun.optimize import base

    module = f"{basic.__name__}.div_to_mul"
    table = {k: v for k, v in basic.PASSES.items() if k != "div_to_mul"}
    monkeypatch.setattr(basic, "PASSES", table)
    monkeypatch.setattr(base, "_BUILT_IN", None)
    monkeypatch.setattr(base, "_REGISTRY", [p for p in base._REGISTRY if p.name != "DivToMul"])
    monkeypatch.delitem(sys.modules, module, raising=False)
    names = [p.name for p in base.registered_passes()]
    assert names.count("DivToMul") == 1
    assert module in sys.modules
