"""CommonSubexpressionElimination: identical nodes on identical inputs computed once."""

from __future__ import annotations

import numpy as np
from basic_helpers import optimize_and_compare, parse, rand, session

PASS = "CommonSubexpressionElimination"


def test_duplicate_nodes_merge() -> None:
    model = parse("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[2, 3] X) => (float[2, 3] Y, float[2, 3] Z) {
        A = Relu(X)
        B = Relu(X)
        S1 = LeakyRelu<alpha = 0.2>(A)
        S2 = LeakyRelu<alpha = 0.2>(B)
        Y = Add(S1, S2)
        Z = Mul(S2, S1)
    }""")
    res = optimize_and_compare(model, {"X": rand(2, 3)})
    assert res.changes(PASS) == {"Relu": 1, "LeakyRelu": 1}
    assert res.ops == {"Relu": 1, "LeakyRelu": 1, "Add": 1, "Mul": 1}


def test_shared_constants_let_convolutions_merge() -> None:
    # Two convolutions whose weights are equal but separate initializers: constant sharing
    # makes them one value, then the two Conv nodes are one.
    w = rand(2, 3, 1, 1)
    model = parse("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[1, 3, 4, 4] X) => (float[1, 2, 4, 4] Y) {
        A = Conv<kernel_shape = [1, 1]>(X, W1)
        B = Conv<kernel_shape = [1, 1]>(X, W2)
        Y = Sub(A, B)
    }""", W1=w, W2=w.copy())
    res = optimize_and_compare(model, {"X": rand(1, 3, 4, 4)})
    assert res.changes(PASS) == {"Conv": 1}
    assert res.changes("ConstantSharing") == {"initializers": 1}


def test_graph_output_name_is_kept() -> None:
    model = parse("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[2, 3] X) => (float[2, 3] Y, float[2, 3] Z) {
        A = Relu(X)
        Y = Neg(A)
        Z = Relu(X)
    }""")
    res = optimize_and_compare(model, {"X": rand(2, 3)})
    assert res.changes(PASS) == {"Relu": 1}
    assert [o.name for o in res.saved.graph.output] == ["Y", "Z"]
    assert sorted(o for n in res.saved.graph.node for o in n.output) == ["Y", "Z"]


def test_two_graph_outputs_stay_two_nodes() -> None:
    model = parse("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[2, 3] X) => (float[2, 3] Y, float[2, 3] Z) {
        Y = Relu(X)
        Z = Relu(X)
    }""")
    res = optimize_and_compare(model, {"X": rand(2, 3)})
    assert not res.changes(PASS)
    assert res.ops == {"Relu": 2}


def test_different_attributes_or_inputs_do_not_merge() -> None:
    model = parse("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[2, 3] X, float[2, 3] W) => (float[2, 3] Y) {
        A = LeakyRelu<alpha = 0.2>(X)
        B = LeakyRelu<alpha = 0.3>(X)
        C = Add(X, W)
        D = Add(W, X)
        E = Sum(A, B, C)
        Y = Sum(E, D)
    }""")
    res = optimize_and_compare(model, {"X": rand(2, 3), "W": rand(2, 3, seed=1)})
    assert not res.changes(PASS)


def test_random_and_subgraph_nodes_do_not_merge() -> None:
    model = parse("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[2, 3] X, bool c) => (float[2, 3] Y, float[2, 3] Z) {
        A = RandomUniformLike(X)
        B = RandomUniformLike(X)
        Y = Sub(A, B)
        I1 = If(c) <then_branch = t1 () => (float[2, 3] o) { o = Relu(X) },
                    else_branch = e1 () => (float[2, 3] o) { o = Neg(X) }>
        I2 = If(c) <then_branch = t2 () => (float[2, 3] o) { o = Relu(X) },
                    else_branch = e2 () => (float[2, 3] o) { o = Neg(X) }>
        Z = Add(I1, I2)
    }""")
    sess = session(model, 1)
    assert not sess.get_optimization_report().passes[PASS].changes
    y, z = sess.run(None, {"X": rand(2, 3), "c": np.array(True)})
    assert np.any(y != 0)  # two draws, not one draw subtracted from itself
