"""The rewrite-rule matcher (optimize/pattern.py): commutative inputs, backtracking, and the
rule that a match's inner values are read only inside it."""

from __future__ import annotations

import onnx.parser

from onnxrun.ir import model_from_proto
from onnxrun.optimize.pattern import RewriteRule, apply_rule

TEXT = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[4] P, float[4] Q) => (float[4] Y) {
    rp = Relu(P)
    rq = Relu(Q)
    Y = Add(rp, rq)
}"""


class AddOfReluOf(RewriteRule):
    """Add(a, Relu(b)) -> Sub(a, b), accepted only when b is the input named ``wanted``."""

    def __init__(self, wanted: str) -> None:
        self.wanted = wanted
        super().__init__()

    def pattern(self, op, a, b):
        return op.Add(a, op.Relu(b, _name="relu"))

    def check(self, ctx, b, **_):
        return b.name == self.wanted

    def rewrite(self, op, a, b, **_):
        return op.Sub(a, b)


def _apply(wanted: str):
    model = model_from_proto(onnx.parser.parse_model(TEXT))
    count = apply_rule(AddOfReluOf(wanted), model, model.graph)
    return count, model.graph


def test_check_sees_the_second_input_order_when_the_first_is_refused():
    # In the written order Relu(b) binds to rq (b = Q); only the swapped order gives b = P.
    count, graph = _apply("P")
    assert count == 1
    sub = next(n for n in graph.nodes if n.op_type == "Sub")
    assert [v.name for v in sub.inputs] == ["rq", "P"]
    assert [n.op_type for n in graph.nodes].count("Relu") == 1  # Relu(P) went with the match


def test_first_order_still_preferred_and_a_refused_rule_changes_nothing():
    count, graph = _apply("Q")
    assert count == 1
    sub = next(n for n in graph.nodes if n.op_type == "Sub")
    assert [v.name for v in sub.inputs] == ["rp", "Q"]
    count, graph = _apply("neither")
    assert count == 0
    assert [n.op_type for n in graph.nodes] == ["Relu", "Relu", "Add"]


def test_every_match_is_listed():
    model = model_from_proto(onnx.parser.parse_model(TEXT))
    add = next(n for n in model.graph.nodes if n.op_type == "Add")
    found = [m.bindings["b"].name for m in AddOfReluOf("P").matches(add)]
    assert found == ["Q", "P"]
