"""ReshapeChainFusion: Reshape(Reshape(x)) (or of Flatten / Squeeze / Unsqueeze) -> one."""

from __future__ import annotations

import numpy as np
from basic_helpers import optimize_and_compare, parse, rand

PASS = "ReshapeChainFusion"


def shape(*dims: int) -> np.ndarray:
    return np.array(dims, np.int64)


def test_reshape_chain_becomes_one() -> None:
    model = parse("""
    <ir_version: 8, opset_import: ["" : 14]>
    g (float[N, 12] X) => (float[N, 3, 4] Y) {
        A = Reshape(X, s1)
        B = Reshape(A, s2)
        Y = Reshape(B, s3)
    }""", s1=shape(-1, 2, 6), s2=shape(-1, 6), s3=shape(-1, 3, 4))
    res = optimize_and_compare(model, {"X": rand(5, 12)})
    assert res.changes(PASS)["Reshape+Reshape"] == 2
    assert res.ops == {"Reshape": 1}


def test_flatten_then_reshape() -> None:
    model = parse("""
    <ir_version: 8, opset_import: ["" : 14]>
    g (float[2, 3, 4] X) => (float[4, 6] Y) {
        A = Flatten<axis = 2>(X)
        Y = Reshape(A, s)
    }""", s=shape(4, 6))
    res = optimize_and_compare(model, {"X": rand(2, 3, 4)})
    assert res.changes(PASS) == {"Flatten+Reshape": 1}
    assert res.ops == {"Reshape": 1}


def test_copied_dimension_is_resolved_when_known() -> None:
    # 0 copies the intermediate's dimension 0 (6 here, not X's 2).
    model = parse("""
    <ir_version: 8, opset_import: ["" : 14]>
    g (float[2, 3, 4] X) => (float[6, 2, 2] Y) {
        A = Reshape(X, s1)
        Y = Reshape(A, s2)
    }""", s1=shape(6, 4), s2=shape(0, 2, 2))
    res = optimize_and_compare(model, {"X": rand(2, 3, 4)})
    assert res.changes(PASS) == {"Reshape+Reshape": 1}


def test_copied_unknown_dimension_or_dynamic_shape_is_left() -> None:
    model = parse("""
    <ir_version: 8, opset_import: ["" : 14]>
    g (float[N, 12] X, int64[2] S) => (float[N, 2, 6] Y, float[?, ?] Z) {
        A = Reshape(X, s1)
        Y = Reshape(A, s2)
        B = Reshape(X, s1)
        Z = Reshape(B, S)
    }""", s1=shape(0, 2, 6), s2=shape(0, 2, 6))
    res = optimize_and_compare(model, {"X": rand(5, 12), "S": shape(10, 6)},
                               disabled=("CommonSubexpressionElimination",))
    assert not res.changes(PASS)
