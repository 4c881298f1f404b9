"""GemmTransposeFusion: Transposes around Gemm become its transA / transB flags."""

from __future__ import annotations

import pytest
from basic_helpers import optimize_and_compare, parse, rand

PASS = "GemmTransposeFusion"


@pytest.mark.parametrize("flags", ["", "transA = 1, ", "transB = 1, ", "transA = 1, transB = 1, "])
def test_transposed_inputs_fold(flags: str) -> None:
    # A is read as [3, 2] then transposed: Gemm sees [2, 3] (or its transpose with transA).
    a_shape = "[2, 3]" if "transA" in flags else "[3, 2]"
    b_shape = "[3, 4]" if "transB" in flags else "[4, 3]"
    model = parse(f"""
    <ir_version: 8, opset_import: ["" : 13]>
    g (float{a_shape} A, float{b_shape} B) => (float[2, 4] Y) {{
        TA = Transpose<perm = [1, 0]>(A)
        TB = Transpose(B)
        Y = Gemm<{flags}alpha = 0.5>(TA, TB, C)
    }}""", C=rand(4, seed=3))
    a = rand(*eval(a_shape))
    b = rand(*eval(b_shape), seed=1)
    res = optimize_and_compare(model, {"A": a, "B": b})
    assert res.changes(PASS) == {"Transpose(A)+Gemm": 1, "Transpose(B)+Gemm": 1}
    assert res.ops == {"Gemm": 1}


def test_transposed_result_folds() -> None:
    model = parse("""
    <ir_version: 8, opset_import: ["" : 13]>
    g (float[2, 3] A) => (float[4, 2] Y) {
        G = Gemm<transB = 1>(A, W)
        Y = Transpose<perm = [1, 0]>(G)
    }""", W=rand(4, 3, seed=2))
    res = optimize_and_compare(model, {"A": rand(2, 3)})
    assert res.changes(PASS) == {"Gemm+Transpose": 1}
    assert res.ops == {"Gemm": 1}


def test_shared_transpose_or_biased_result_is_not_folded() -> None:
    # The transposed A is read by another node too; the transposed Gemm has a bias.
    model = parse("""
    <ir_version: 8, opset_import: ["" : 13]>
    g (float[3, 2] A) => (float[2, 4] Y, float[2, 3] Z, float[4, 2] V) {
        TA = Transpose<perm = [1, 0]>(A)
        Y = Gemm(TA, W, C)
        Z = Relu(TA)
        G = Gemm(TA, W, C)
        V = Transpose<perm = [1, 0]>(G)
    }""", W=rand(3, 4, seed=2), C=rand(4, seed=3))
    res = optimize_and_compare(model, {"A": rand(3, 2)},
                               disabled=("CommonSubexpressionElimination",))
    assert not res.changes(PASS)
