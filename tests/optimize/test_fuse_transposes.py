"""TransposeChainFusion: Transpose(Transpose(x)) composes into one, or into none."""

from __future__ import annotations

from basic_helpers import optimize_and_compare, parse, rand

PASS = "TransposeChainFusion"


def test_chain_composes_into_one() -> None:
    model = parse("""
    <ir_version: 8, opset_import: ["" : 13]>
    g (float[2, 3, 4, 5] X) => (float[5, 2, 3, 4] Y) {
        A = Transpose<perm = [0, 2, 3, 1]>(X)
        B = Transpose<perm = [2, 0, 1, 3]>(A)
        Y = Transpose<perm = [0, 1, 3, 2]>(B)
    }""")
    res = optimize_and_compare(model, {"X": rand(2, 3, 4, 5)})
    assert res.changes(PASS)["composed"] == 2
    assert res.ops == {"Transpose": 1}


def test_pair_that_cancels_goes() -> None:
    model = parse("""
    <ir_version: 8, opset_import: ["" : 13]>
    g (float[2, 3, 4] X) => (float[2, 3, 4] Y) {
        A = Transpose<perm = [2, 0, 1]>(X)
        B = Transpose<perm = [1, 2, 0]>(A)
        Y = Relu(B)
    }""")
    res = optimize_and_compare(model, {"X": rand(2, 3, 4)})
    assert res.changes(PASS) == {"cancelled pair": 1}
    assert res.ops == {"Relu": 1}


def test_default_perms_cancel() -> None:
    model = parse("""
    <ir_version: 8, opset_import: ["" : 13]>
    g (float[2, 3, 4] X) => (float[2, 3, 4] Y) {
        A = Transpose(X)
        B = Transpose(A)
        Y = Neg(B)
    }""")
    res = optimize_and_compare(model, {"X": rand(2, 3, 4)})
    assert res.ops == {"Neg": 1}


def test_inner_read_elsewhere_stays() -> None:
    # The outer one still reads x directly; the inner one stays for its other reader.
    model = parse("""
    <ir_version: 8, opset_import: ["" : 13]>
    g (float[2, 3, 4] X) => (float[3, 4, 2] Y, float[4, 2, 3] Z) {
        A = Transpose<perm = [2, 0, 1]>(X)
        Y = Transpose<perm = [2, 0, 1]>(A)
        Z = Neg(A)
    }""")
    res = optimize_and_compare(model, {"X": rand(2, 3, 4)})
    assert res.ops == {"Transpose": 2, "Neg": 1}
    reads = {n.output[0]: n.input[0] for n in res.saved.graph.node}
    assert reads["Y"] == "X"


def test_unknown_rank_or_no_chain_is_left() -> None:
    model = parse("""
    <ir_version: 8, opset_import: ["" : 13]>
    g (float[2, 3] X) => (float[3, 2] Y) {
        A = Relu(X)
        Y = Transpose(A)
    }""")
    res = optimize_and_compare(model, {"X": rand(2, 3)})
    assert not res.changes(PASS)
