"""AddChainFolding: chains of Add / Sub of constants become one node."""

from __future__ import annotations

import numpy as np
import pytest
from basic_helpers import chain, optimize_and_compare, parse, rand

PASS = "AddChainFolding"


CASES = [
    ("Add(X, c1)", "Add(c2, A)", "Add+Add", "Add"),
    ("Sub(X, c1)", "Add(A, c2)", "Sub+Add", "Add"),
    ("Add(X, c1)", "Sub(A, c2)", "Add+Sub", "Add"),
    ("Sub(X, c1)", "Sub(A, c2)", "Sub+Sub", "Add"),
    ("Sub(c1, X)", "Add(A, c2)", "Sub+Add", "Sub"),
    ("Add(c1, X)", "Sub(c2, A)", "Add+Sub", "Sub"),
    ("Sub(c1, X)", "Sub(c2, A)", "Sub+Sub", "Add"),
]


@pytest.mark.parametrize("elem", ["float", "int64", "uint8"])
@pytest.mark.parametrize(("first", "second", "key", "result"), CASES)
def test_chains_fold(first: str, second: str, key: str, result: str, elem: str) -> None:
    dtype = {"float": np.float32, "int64": np.int64, "uint8": np.uint8}[elem]
    model = parse(chain(first, second, elem), c1=np.array([2, 4, 250], dtype),
                  c2=np.array([[3], [9]], dtype))
    x = (rand(2, 3) * 100).astype(dtype)
    res = optimize_and_compare(model, {"X": x})
    assert res.changes(PASS) == {key: 1}
    assert res.ops == {result: 1}


def test_shared_intermediate_or_graph_output_is_left() -> None:
    model = parse(chain("Add(X, c1)", "Add(A, c2)", extra="Z = Neg(A)",
                        outputs=", float[2, 3] Z"), c1=np.float32(2), c2=np.float32(3))
    res = optimize_and_compare(model, {"X": rand(2, 3)})
    assert not res.changes(PASS)
    model = parse(chain("Add(X, c1)", "Sub(A, c2)", outputs=", float[2, 3] A"),
                  c1=np.float32(2), c2=np.float32(3))
    res = optimize_and_compare(model, {"X": rand(2, 3)})
    assert not res.changes(PASS)


def test_non_constant_operand_is_left() -> None:
    model = parse("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[2, 3] X, float[2, 3] W) => (float[2, 3] Y) {
        A = Add(X, W)
        Y = Add(A, c)
    }""", c=np.float32(1.5))
    res = optimize_and_compare(model, {"X": rand(2, 3), "W": rand(2, 3, seed=1)})
    assert not res.changes(PASS)
