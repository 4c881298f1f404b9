"""ConvMulFusion: Conv * per-output-channel constant -> scaled weights and bias."""

from __future__ import annotations

import numpy as np
import pytest
from basic_helpers import optimize_and_compare, parse, rand

PASS = "ConvMulFusion"


def conv_mul(c: np.ndarray, with_bias: bool = True, extra: str = "",
             outputs: str = "float[1, 4, 6, 6] Y", group: int = 1):
    bias = ", B" if with_bias else ""
    text = f"""
    <ir_version: 8, opset_import: ["" : 13]>
    g (float[1, 4, 8, 8] X) => ({outputs}) {{
        C = Conv<kernel_shape = [3, 3], group = {group}>(X, W{bias})
        Y = Mul(K, C)
        {extra}
    }}"""
    inits = {"W": rand(4, 4 // group, 3, 3, seed=5), "K": c}
    if with_bias:
        inits["B"] = rand(4, seed=6)
    return parse(text, **inits)


@pytest.mark.parametrize("shape", [(1, 4, 1, 1), (4, 1, 1), ()])
@pytest.mark.parametrize("with_bias", [True, False])
def test_per_channel_scale_folds(shape: tuple, with_bias: bool) -> None:
    res = optimize_and_compare(conv_mul(rand(*shape, seed=2), with_bias),
                               {"X": rand(1, 4, 8, 8)})
    assert res.changes(PASS)["Conv*Mul"] == 1
    assert res.ops == {"Conv": 1}


def test_grouped_conv_scale_folds() -> None:
    res = optimize_and_compare(conv_mul(rand(4, 1, 1, seed=2), group=2), {"X": rand(1, 4, 8, 8)})
    assert res.changes(PASS)["Conv*Mul"] == 1


@pytest.mark.parametrize("shape", [(1, 4, 6, 6), (1, 1, 1, 6), (1, 1, 4, 1, 1)])
def test_not_per_channel_is_not_folded(shape: tuple) -> None:
    out_shape = np.broadcast_shapes((1, 4, 6, 6), shape)
    outputs = f"float[{', '.join(map(str, out_shape))}] Y"
    res = optimize_and_compare(conv_mul(rand(*shape, seed=2), outputs=outputs),
                               {"X": rand(1, 4, 8, 8)})
    assert not res.changes(PASS)
    assert res.ops == {"Conv": 1, "Mul": 1}


def test_conv_output_graph_output_is_not_folded() -> None:
    res = optimize_and_compare(conv_mul(rand(4, 1, 1, seed=2),
                                        outputs="float[1, 4, 6, 6] Y, float[1, 4, 6, 6] C"),
                               {"X": rand(1, 4, 8, 8)})
    assert not res.changes(PASS)


def test_infinite_scale_is_not_folded() -> None:
    scale = np.array([1.0, np.inf, 2.0, 3.0], np.float32).reshape(4, 1, 1)
    res = optimize_and_compare(conv_mul(scale), {"X": rand(1, 4, 8, 8)})
    assert not res.changes(PASS)
