"""NotWhereFusion: Where(Not(c), a, b) -> Where(c, b, a)."""

from __future__ import annotations

import numpy as np
from basic_helpers import optimize_and_compare, parse, rand

PASS = "NotWhereFusion"


def test_not_feeding_wheres_goes() -> None:
    model = parse("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (bool[2, 3] C, float[2, 3] A, float[2, 3] B) => (float[2, 3] Y, float[2, 3] Z) {
        N = Not(C)
        Y = Where(N, A, B)
        Z = Where(N, B, k)
    }""", k=np.float32(-1e4))
    feeds = {"C": rand(2, 3) > 0, "A": rand(2, 3, seed=1), "B": rand(2, 3, seed=2)}
    res = optimize_and_compare(model, feeds)
    assert res.changes(PASS) == {"Not+Where": 2}
    assert res.ops == {"Where": 2}


def test_not_read_otherwise_stays() -> None:
    model = parse("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (bool[2, 3] C, float[2, 3] A, float[2, 3] B) => (float[2, 3] Y, bool[2, 3] M) {
        N = Not(C)
        Y = Where(N, A, B)
        M = And(N, C)
    }""")
    feeds = {"C": rand(2, 3) > 0, "A": rand(2, 3, seed=1), "B": rand(2, 3, seed=2)}
    res = optimize_and_compare(model, feeds)
    assert not res.changes(PASS)
