"""SqueezeUnsqueezeElimination: Squeeze(Unsqueeze(x)) and Unsqueeze(Squeeze(x)) on the same
axes are x."""

from __future__ import annotations

import numpy as np
import pytest
from basic_helpers import optimize_and_compare, parse, rand

PASS = "SqueezeUnsqueezeElimination"


@pytest.mark.parametrize("opset", [11, 13])
def test_pairs_cancel(opset: int) -> None:
    if opset >= 13:
        unsq, sq = "Unsqueeze(X, ax1)", "Squeeze(A, ax2)"
        unsq2, sq2 = "Unsqueeze(C, ax3)", "Squeeze(P, ax3)"
    else:
        unsq, sq = "Unsqueeze<axes = [0, -1]>(X)", "Squeeze<axes = [-4, 3]>(A)"
        unsq2, sq2 = "Unsqueeze<axes = [1]>(C)", "Squeeze<axes = [1]>(P)"
    model = parse(f"""
    <ir_version: 8, opset_import: ["" : {opset}]>
    g (float[2, 3] X, float[2, 1, 3] P) => (float[2, 3] Y, float[2, 1, 3] Z) {{
        A = {unsq}
        B = {sq}
        Y = Relu(B)
        C = {sq2}
        D = {unsq2}
        Z = Neg(D)
    }}""", ax1=np.array([0, -1]), ax2=np.array([-4, 3]), ax3=np.array([1]))
    res = optimize_and_compare(model, {"X": rand(2, 3), "P": rand(2, 1, 3)})
    assert res.changes(PASS) == {"Unsqueeze+Squeeze": 1, "Squeeze+Unsqueeze": 1}
    assert res.ops == {"Relu": 1, "Neg": 1}


def test_other_axes_or_no_axes_are_left() -> None:
    model = parse("""
    <ir_version: 8, opset_import: ["" : 13]>
    g (float[2, 3] X, float[2, 1, 3] P) => (float[2, 3, 1] Y, float[2, 1, 3] Z) {
        A = Unsqueeze(X, ax0)
        Y = Squeeze(A, ax0b)
        C = Squeeze(P)
        Z = Unsqueeze(C, ax1)
    }""", ax0=np.array([0, 3]), ax0b=np.array([0]), ax1=np.array([1]))
    res = optimize_and_compare(model, {"X": rand(2, 3), "P": rand(2, 1, 3)})
    assert not res.changes(PASS)
