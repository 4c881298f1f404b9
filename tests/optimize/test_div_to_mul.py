"""DivToMul: x / c (c a float constant) -> x * (1 / c)."""

from __future__ import annotations

import numpy as np
import pytest
from basic_helpers import optimize_and_compare, parse, rand

PASS = "DivToMul"


def div_model(c: np.ndarray, elem: str = "float", reverse: bool = False):
    div = "Div(C, X)" if reverse else "Div(X, C)"
    return parse(f"""
    <ir_version: 8, opset_import: ["" : 17]>
    g ({elem}[2, 3] X) => ({elem}[2, 3] Y) {{
        D = {div}
        Y = Neg(D)
    }}""", C=c)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_float_division_becomes_multiplication(dtype) -> None:
    elem = {np.float32: "float", np.float64: "double", np.float16: "float16"}[dtype]
    c = np.array([[3.0, -7.0, 0.1]], dtype)
    res = optimize_and_compare(div_model(c, elem), {"X": rand(2, 3).astype(dtype)})
    if dtype == np.float16:  # 1 / 3 is not exact in half precision: one rounding too many
        assert not res.changes(PASS)
        c = np.array([[8.0, -0.5, 0.25]], dtype)
        res = optimize_and_compare(div_model(c, elem), {"X": rand(2, 3).astype(dtype)})
    assert res.changes(PASS) == {"Div": 1}
    assert res.ops == {"Mul": 1, "Neg": 1}


def test_division_by_zero_keeps_its_infinities() -> None:
    c = np.array([0.0, -0.0, 2.0], np.float32)
    x = np.array([[1.0, -1.0, 0.0], [-2.0, 3.0, 4.0]], np.float32)
    res = optimize_and_compare(div_model(c), {"X": x})
    assert res.changes(PASS) == {"Div": 1}


def test_integer_or_reversed_division_is_left() -> None:
    res = optimize_and_compare(div_model(np.array([2, 3, 4], np.int32), "int32"),
                               {"X": np.array([[7, -7, 9], [1, 2, 3]], np.int32)})
    assert not res.changes(PASS)
    res = optimize_and_compare(div_model(np.array([2.0, 3.0, 4.0], np.float32), reverse=True),
                               {"X": rand(2, 3)})
    assert not res.changes(PASS)


@pytest.mark.parametrize("value", [1e-39, 3e38])
def test_reciprocal_that_overflows_or_is_subnormal_is_left(value: float) -> None:
    res = optimize_and_compare(div_model(np.array([value, 1.0, 2.0], np.float32)),
                               {"X": rand(2, 3)})
    assert not res.changes(PASS)
