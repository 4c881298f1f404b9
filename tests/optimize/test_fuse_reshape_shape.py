"""ReshapeFusion: a Reshape target computed from the shape of its own input becomes constant."""

from __future__ import annotations

import numpy as np
from basic_helpers import optimize_and_compare, parse, rand

PASS = "ReshapeFusion"

# The exporters' "split the last dimension into heads": [batch, seq, 8] -> [batch, seq, 2, 4].
SPLIT_HEADS = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[B, S, 8] X, float[B, S, 8] W) => (float[B, S, 2, 4] Y{extra_out}) {{
    A = Relu(X)
    shape = Shape({src})
    b = Gather(shape, i0)
    s = Gather(shape, i1)
    ub = Unsqueeze(b, ax0)
    us = Unsqueeze(s, ax0)
    target = Concat<axis = 0>({parts})
    Y = Reshape(A, target)
    {extra}
}}"""
INITS = {"i0": np.array(0), "i1": np.array(1), "ax0": np.array([0]), "heads": np.array([2, 4])}


def split_heads(src: str = "A", parts: str = "ub, us, heads", extra: str = "",
                extra_out: str = "") -> str:
    return SPLIT_HEADS.format(src=src, parts=parts, extra=extra, extra_out=extra_out)


def feeds(b: int = 3, s: int = 5) -> dict[str, np.ndarray]:
    return {"X": rand(b, s, 8), "W": rand(b, s, 8, seed=1)}


def test_target_from_own_shape_becomes_constant() -> None:
    res = optimize_and_compare(parse(split_heads(), **INITS), feeds())
    assert res.changes(PASS) == {"Reshape": 1}
    assert res.ops == {"Relu": 1, "Reshape": 1}
    target = next(t for t in res.saved.graph.initializer
                  if t.name == res.saved.graph.node[1].input[1])
    np.testing.assert_array_equal(np.frombuffer(target.raw_data, np.int64), [0, 0, 2, 4])


def test_gathered_dims_in_other_positions_or_tensors_are_left() -> None:
    # Dimension 1 at position 0 (swapped), and the shape of another tensor of the same type.
    for model in (parse(split_heads(parts="us, ub, heads"), **INITS),
                  parse(split_heads(src="W"), **INITS)):
        res = optimize_and_compare(model, feeds(4, 4))
        assert not res.changes(PASS)


def test_static_dimension_of_another_tensor_becomes_its_number() -> None:
    # W's dimension 0 is known to be 3; its dimension 1 is not (and is not needed: -1).
    text = split_heads(src="W", parts="ub, minus1, heads").replace(
        "float[B, S, 8] W", "float[3, T, 8] W")
    res = optimize_and_compare(parse(text, minus1=np.array([-1]), **INITS), feeds())
    assert res.changes(PASS) == {"Reshape": 1}
    assert res.ops == {"Relu": 1, "Reshape": 1}


def test_shape_read_elsewhere_stays() -> None:
    model = parse(split_heads(extra="n = Mul(b, s)", extra_out=", int64 n"), **INITS)
    res = optimize_and_compare(model, feeds())
    assert res.changes(PASS) == {"Reshape": 1}
    assert res.ops["Shape"] == 1 and res.ops["Concat"] == 0
