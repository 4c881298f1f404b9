"""GeluFusion: the erf form of Gelu -> com.microsoft Gelu."""

from __future__ import annotations

import numpy as np
import pytest
from extended_helpers import EXTENDED, build, ops, optimized

import onnxrun

rng = np.random.default_rng(0)


HEAD = '<ir_version: 8, opset_import: ["" : 17]>\n'
CONSTS = """
    c = Constant <value = float {%s}> ()
    one = Constant <value = float {1.0}> ()
    half = Constant <value = float {0.5}> ()
"""
FORMS = {
    "x_half": "e1 = Mul(x, p)\n y = Mul(e1, half)",
    "half_x": "e1 = Mul(x, half)\n y = Mul(e1, p)",
    "inner_half": "e1 = Mul(p, half)\n y = Mul(x, e1)",
}


def gelu_model(form: str, scale: str = "div", c: float = 1.4142135, extra_out: str = ""):
    arg = f"a = {'Div' if scale == 'div' else 'Mul'}(x, c)"
    outs = "float[2, 3, 8] y" + (f", float[2, 3, 8] {extra_out}" if extra_out else "")
    return build(f"""{HEAD}
g (float[2, 3, 8] x) => ({outs}) {{
    {CONSTS % c}
    {arg}
    e = Erf(a)
    p = Add(e, one)
    {FORMS[form]}
}}""")


FEEDS = {"x": rng.standard_normal((2, 3, 8)).astype(np.float32)}


@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("scale", ["div", "mul"])
def test_gelu_fires(form, scale, tmp_path):
    c = 1.4142135 if scale == "div" else 0.70710677
    changes, model = optimized(gelu_model(form, scale, c), FEEDS, tmp_path)
    assert changes["GeluFusion"] == {"Gelu": 1}
    assert ops(model) == ["Gelu"]
    assert model.graph.node[0].domain == "com.microsoft"
    assert model.graph.output[0].name == "y"


def test_gelu_on_graph_output_keeps_name(tmp_path):
    model = gelu_model("x_half")
    changes, opt = optimized(model, FEEDS, tmp_path)
    assert [o.name for o in opt.graph.output] == ["y"]
    assert opt.graph.node[0].output[0] == "y"


def test_gelu_wrong_constant_does_not_fire(tmp_path):
    changes, model = optimized(gelu_model("x_half", "div", 1.7320508), FEEDS, tmp_path)
    assert "GeluFusion" not in changes
    assert "Erf" in ops(model)


def test_gelu_intermediate_read_elsewhere_does_not_fire(tmp_path):
    # the Erf result is a graph output too: the nodes computing it must stay
    changes, model = optimized(gelu_model("x_half", extra_out="e"), FEEDS, tmp_path)
    assert "GeluFusion" not in changes
    assert "Erf" in ops(model)


def test_gelu_disabled_by_name(tmp_path):
    opts = onnxrun.SessionOptions()
    opts.graph_optimization_level = EXTENDED
    opts.add_session_config_entry("optimization.disable_specified_optimizers", "GeluFusion")
    sess = onnxrun.InferenceSession(gelu_model("x_half").SerializeToString(), opts)
    assert not sess.get_optimization_report().passes.get("GeluFusion")
