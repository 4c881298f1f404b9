"""MatMulScaleFusion: scalar Mul / Div around a MatMul -> FusedMatMul alpha."""

from __future__ import annotations

import numpy as np
import pytest
from extended_helpers import build, ops, optimized

rng = np.random.default_rng(0)


FEEDS = {"a": rng.standard_normal((2, 4, 5)).astype(np.float32),
         "b": rng.standard_normal((2, 5, 6)).astype(np.float32),
         "z": np.array(3.0, np.float32)}


def model_of(body: str, c: str = "float {0.125}", outs: str = "float[2, 4, 6] y"):
    return build(f"""<ir_version: 8, opset_import: ["" : 17]>
g (float[2, 4, 5] a, float[2, 5, 6] b, float z) => ({outs}) {{
    c = Constant <value = {c}> ()
    {body}
}}""")


def alpha(model) -> float:
    node = model.graph.node[0]
    return next(x.f for x in node.attribute if x.name == "alpha")


@pytest.mark.parametrize("body, expected", [
    ("m = MatMul(a, b)\n y = Mul(m, c)", 0.125),
    ("m = MatMul(a, b)\n y = Mul(c, m)", 0.125),
    ("m = MatMul(a, b)\n y = Div(m, c)", 8.0),
    ("s = Mul(c, a)\n y = MatMul(s, b)", 0.125),
    ("s = Div(b, c)\n y = MatMul(a, s)", 8.0),
    ("s = Mul(a, c)\n m = MatMul(s, b)\n y = Mul(m, c)", 0.125 ** 2),
])
def test_scale_fires(body, expected, tmp_path):
    changes, opt = optimized(model_of(body), FEEDS, tmp_path)
    assert "MatMulScaleFusion" in changes
    assert ops(opt) == ["FusedMatMul"]
    assert alpha(opt) == pytest.approx(expected)


def test_scale_and_transpose_end_in_one_node(tmp_path):
    feeds = FEEDS | {"b": rng.standard_normal((2, 6, 5)).astype(np.float32)}
    model = build("""<ir_version: 8, opset_import: ["" : 17]>
g (float[2, 4, 5] a, float[2, 6, 5] b) => (float[2, 4, 6] y) {
    c = Constant <value = float {0.25}> ()
    bt = Transpose <perm = [0, 2, 1]> (b)
    m = MatMul(a, bt)
    y = Mul(m, c)
}""")
    feeds.pop("z")
    changes, opt = optimized(model, feeds, tmp_path)
    assert ops(opt) == ["FusedMatMul"]
    assert alpha(opt) == 0.25


def test_vector_scale_does_not_fire(tmp_path):
    body = "m = MatMul(a, b)\n y = Mul(m, c)"
    changes, opt = optimized(model_of(body, c="float[6] {1, 2, 3, 4, 5, 6}"), FEEDS, tmp_path)
    assert "MatMulScaleFusion" not in changes
    assert ops(opt) == ["MatMul", "Mul"]


def test_scale_that_raises_the_rank_does_not_fire(tmp_path):
    body = "m = MatMul(a, b)\n y = Mul(m, c)"
    model = model_of(body, c="float[1, 1, 1, 1] {2}", outs="float[1, 2, 4, 6] y")
    changes, opt = optimized(model, FEEDS, tmp_path)
    assert "MatMulScaleFusion" not in changes


def test_runtime_scale_does_not_fire(tmp_path):
    changes, opt = optimized(model_of("m = MatMul(a, b)\n y = Mul(m, z)"), FEEDS, tmp_path)
    assert "MatMulScaleFusion" not in changes
    assert ops(opt) == ["MatMul", "Mul"]


def test_product_read_twice_does_not_fire(tmp_path):
    model = model_of("m = MatMul(a, b)\n y = Mul(m, c)", outs="float[2, 4, 6] y, float[2, 4, 6] m")
    changes, opt = optimized(model, FEEDS, tmp_path)
    assert "MatMulScaleFusion" not in changes
