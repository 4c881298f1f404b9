"""QuickGeluFusion: x * Sigmoid(alpha * x) -> com.microsoft QuickGelu."""

from __future__ import annotations

import numpy as np
import pytest
from extended_helpers import build, ops, optimized

rng = np.random.default_rng(0)


HEAD = '<ir_version: 8, opset_import: ["" : 17]>\n'
FEEDS = {"x": rng.standard_normal((2, 3, 8)).astype(np.float32),
         "z": rng.standard_normal((2, 3, 8)).astype(np.float32)}


def model_of(body: str):
    return build(f"""{HEAD}
g (float[2, 3, 8] x, float[2, 3, 8] z) => (float[2, 3, 8] y) {{
    alpha = Constant <value = float {{1.702}}> ()
    {body}
}}""")


def test_quick_gelu_fires(tmp_path):
    model = model_of("ax = Mul(alpha, x)\n s = Sigmoid(ax)\n y = Mul(x, s)")
    changes, opt = optimized(model, FEEDS, tmp_path)
    assert changes["QuickGeluFusion"] == {"QuickGelu": 1}
    assert ops(opt) == ["QuickGelu"]
    assert opt.graph.node[0].attribute[0].f == pytest.approx(1.702)


def test_silu_fires_with_alpha_one(tmp_path):
    changes, opt = optimized(model_of("s = Sigmoid(x)\n y = Mul(s, x)"), FEEDS, tmp_path)
    assert ops(opt) == ["QuickGelu"]
    assert opt.graph.node[0].attribute[0].f == 1.0


def test_sigmoid_of_another_value_does_not_fire(tmp_path):
    changes, opt = optimized(model_of("s = Sigmoid(z)\n y = Mul(x, s)"), FEEDS, tmp_path)
    assert "QuickGeluFusion" not in changes
    assert sorted(ops(opt)) == ["Mul", "Sigmoid"]


def test_non_constant_alpha_does_not_fire(tmp_path):
    model = model_of("ax = Mul(z, x)\n s = Sigmoid(ax)\n y = Mul(x, s)")
    changes, opt = optimized(model, FEEDS, tmp_path)
    assert "QuickGeluFusion" not in changes
    assert "Sigmoid" in ops(opt)
