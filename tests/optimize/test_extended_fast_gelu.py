"""FastGeluFusion: the tanh approximation of Gelu -> com.microsoft FastGelu."""

from __future__ import annotations

import numpy as np
import pytest
from extended_helpers import build, ops, optimized

rng = np.random.default_rng(0)


HEAD = '<ir_version: 8, opset_import: ["" : 17]>\n'
FORMS = {
    "x_half": "e1 = Mul(x, p)\n y = Mul(e1, half)",
    "half_x": "e1 = Mul(x, half)\n y = Mul(e1, p)",
    "inner_half": "e1 = Mul(p, half)\n y = Mul(x, e1)",
}
CUBES = {
    "pow": "three = Constant <value = float {3.0}> ()\n x3 = Pow(x, three)",
    "mul": "x2 = Mul(x, x)\n x3 = Mul(x, x2)",
}


def fast_gelu_model(form="x_half", cube="mul", c2=0.044715, extra_out=""):
    outs = "float[2, 3, 8] y" + (f", float[2, 3, 8] {extra_out}" if extra_out else "")
    return build(f"""{HEAD}
g (float[2, 3, 8] x) => ({outs}) {{
    c1 = Constant <value = float {{0.7978846}}> ()
    c2 = Constant <value = float {{{c2}}}> ()
    one = Constant <value = float {{1.0}}> ()
    half = Constant <value = float {{0.5}}> ()
    {CUBES[cube]}
    m2 = Mul(c2, x3)
    s = Add(x, m2)
    m3 = Mul(c1, s)
    t = Tanh(m3)
    p = Add(one, t)
    {FORMS[form]}
}}""")


FEEDS = {"x": rng.standard_normal((2, 3, 8)).astype(np.float32)}


@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("cube", list(CUBES))
def test_fast_gelu_fires(form, cube, tmp_path):
    changes, model = optimized(fast_gelu_model(form, cube), FEEDS, tmp_path)
    assert changes["FastGeluFusion"] == {"FastGelu": 1}
    assert ops(model) == ["FastGelu"]
    assert model.graph.node[0].domain == "com.microsoft"


def test_fast_gelu_wrong_coefficient_does_not_fire(tmp_path):
    changes, model = optimized(fast_gelu_model(c2=0.05), FEEDS, tmp_path)
    assert "FastGeluFusion" not in changes
    assert "Tanh" in ops(model)


def test_fast_gelu_intermediate_read_elsewhere_does_not_fire(tmp_path):
    changes, model = optimized(fast_gelu_model(extra_out="t"), FEEDS, tmp_path)
    assert "FastGeluFusion" not in changes
    assert "Tanh" in ops(model)
