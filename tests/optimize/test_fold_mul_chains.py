"""MulChainFolding: chains of Mul / Div by constants become one node."""

from __future__ import annotations

import numpy as np
import pytest
from basic_helpers import chain, optimize_and_compare, parse, rand

PASS = "MulChainFolding"


CASES = [
    ("Mul(X, c1)", "Mul(c2, A)", "Mul+Mul", "Mul"),
    ("Div(X, c1)", "Mul(A, c2)", "Div+Mul", "Mul"),
    ("Mul(X, c1)", "Div(A, c2)", "Mul+Div", "Mul"),
    ("Div(X, c1)", "Div(A, c2)", "Div+Div", "Mul"),
    ("Div(c1, X)", "Mul(A, c2)", "Div+Mul", "Div"),
    ("Mul(c1, X)", "Div(c2, A)", "Mul+Div", "Div"),
    ("Div(c1, X)", "Div(c2, A)", "Div+Div", "Mul"),
]


@pytest.mark.parametrize(("first", "second", "key", "result"), CASES)
def test_float_chains_fold(first: str, second: str, key: str, result: str) -> None:
    model = parse(chain(first, second), c1=np.array([2.0, -4.0, 0.5], np.float32),
                  c2=np.array([[3.0], [0.25]], np.float32))
    x = rand(2, 3, low=0.5, high=2.0)
    res = optimize_and_compare(model, {"X": x}, disabled=("DivToMul",))
    assert res.changes(PASS) == {key: 1}
    assert res.ops == {result: 1}


def test_longer_chain_folds_with_div_to_mul() -> None:
    model = parse("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[2, 3] X) => (float[2, 3] Y) {
        A = Mul(X, c1)
        B = Div(A, c2)
        C = Mul(B, c3)
        Y = Relu(C)
    }""", c1=np.float32(2.0), c2=np.float32(5.0), c3=np.array([1.0, 2.0, 3.0], np.float32))
    res = optimize_and_compare(model, {"X": rand(2, 3)})
    assert res.ops == {"Mul": 1, "Relu": 1}


def test_integer_mul_chain_folds_with_wrapping() -> None:
    model = parse(chain("Mul(X, c1)", "Mul(A, c2)", "int32"),
                  c1=np.int32(100000), c2=np.array([100000, 3, -7], np.int32))
    x = np.array([[1, 2, 3], [40000, -5, 2 ** 30]], np.int32)
    res = optimize_and_compare(model, {"X": x})
    assert res.changes(PASS) == {"Mul+Mul": 1}


def test_integer_division_or_shared_intermediate_is_left() -> None:
    model = parse(chain("Div(X, c1)", "Mul(A, c2)", "int32"), c1=np.int32(3), c2=np.int32(3))
    res = optimize_and_compare(model, {"X": np.array([[7, -7, 8], [1, 2, 3]], np.int32)})
    assert not res.changes(PASS)
    model = parse(chain("Mul(X, c1)", "Mul(A, c2)", extra="Z = Neg(A)",
                        outputs=", float[2, 3] Z"), c1=np.float32(2), c2=np.float32(3))
    res = optimize_and_compare(model, {"X": rand(2, 3)})
    assert not res.changes(PASS)
    model = parse(chain("Mul(X, c1)", "Mul(A, c2)", outputs=", float[2, 3] A"),
                  c1=np.float32(2), c2=np.float32(3))
    res = optimize_and_compare(model, {"X": rand(2, 3)})
    assert not res.changes(PASS)


def test_zero_divisor_is_left() -> None:
    model = parse(chain("Div(c1, X)", "Div(c2, A)"), c1=np.array([0.0, 1.0, 2.0], np.float32),
                  c2=np.float32(3))
    res = optimize_and_compare(model, {"X": rand(2, 3, low=0.5, high=2.0)},
                               disabled=("DivToMul",))
    assert not res.changes(PASS)
