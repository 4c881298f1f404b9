"""ConvAddFusion: Conv / ConvTranspose + Add of a per-output-channel constant -> Conv bias."""

from __future__ import annotations

import numpy as np
import pytest
from basic_helpers import optimize_and_compare, parse, rand

PASS = "ConvAddFusion"


def conv_add(c: np.ndarray, with_bias: bool = True, op: str = "Conv", swap: bool = False,
             extra: str = "", outputs: str = "float[1, 4, 6, 6] Y"):
    bias = ", B" if with_bias else ""
    add = "Add(K, C)" if swap else "Add(C, K)"
    w = rand(4, 3, 3, 3, seed=5) if op == "Conv" else rand(3, 4, 3, 3, seed=5)
    pads = "" if op == "Conv" else ", pads = [1, 1, 1, 1]"
    text = f"""
    <ir_version: 8, opset_import: ["" : 13]>
    g (float[1, 3, 8, 8] X) => ({outputs}) {{
        C = {op}<kernel_shape = [3, 3]{pads}>(X, W{bias})
        Y = {add}
        {extra}
    }}"""
    inits = {"W": w, "K": c}
    if with_bias:
        inits["B"] = rand(4, seed=6)
    return parse(text, **inits)


@pytest.mark.parametrize("shape", [(1, 4, 1, 1), (4, 1, 1), (1,), ()])
@pytest.mark.parametrize("with_bias", [True, False])
def test_per_channel_add_folds(shape: tuple, with_bias: bool) -> None:
    res = optimize_and_compare(conv_add(rand(*shape, seed=2), with_bias, swap=shape == (1,)),
                               {"X": rand(1, 3, 8, 8)})
    assert res.changes(PASS)["Conv+Add"] == 1
    assert res.ops == {"Conv": 1}


def test_conv_transpose_add_folds() -> None:
    model = conv_add(rand(1, 4, 1, 1, seed=2), op="ConvTranspose")
    model.graph.output[0].type.tensor_type.shape.dim[2].dim_value = 8
    model.graph.output[0].type.tensor_type.shape.dim[3].dim_value = 8
    res = optimize_and_compare(model, {"X": rand(1, 3, 8, 8)})
    assert res.changes(PASS)["ConvTranspose+Add"] == 1


@pytest.mark.parametrize("shape", [(1, 4, 6, 6), (6,), (1, 1, 4, 1, 1), (2, 4, 1, 1)])
def test_not_per_channel_is_not_folded(shape: tuple) -> None:
    # varies along space; along the last axis; broadcasts to a higher rank; or over the batch.
    out_shape = np.broadcast_shapes((1, 4, 6, 6), shape)
    outputs = f"float[{', '.join(map(str, out_shape))}] Y"
    res = optimize_and_compare(conv_add(rand(*shape, seed=2), outputs=outputs),
                               {"X": rand(1, 3, 8, 8)})
    assert not res.changes(PASS)
    assert res.ops == {"Conv": 1, "Add": 1}


def test_conv_output_read_twice_is_not_folded() -> None:
    model = conv_add(rand(1, 4, 1, 1, seed=2), extra="Z = Relu(C)",
                     outputs="float[1, 4, 6, 6] Y, float[1, 4, 6, 6] Z")
    res = optimize_and_compare(model, {"X": rand(1, 3, 8, 8)})
    assert not res.changes(PASS)


def test_non_constant_addend_is_not_folded() -> None:
    model = parse("""
    <ir_version: 8, opset_import: ["" : 13]>
    g (float[1, 3, 8, 8] X, float[1, 4, 1, 1] K) => (float[1, 4, 6, 6] Y) {
        C = Conv<kernel_shape = [3, 3]>(X, W)
        Y = Add(C, K)
    }""", W=rand(4, 3, 3, 3))
    res = optimize_and_compare(model, {"X": rand(1, 3, 8, 8), "K": rand(1, 4, 1, 1)})
    assert not res.changes(PASS)
