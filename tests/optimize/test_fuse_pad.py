"""PadFusion: a Pad of zeros on the spatial axes -> the reading Conv / AveragePool's pads."""

from __future__ import annotations

import numpy as np
import pytest
from basic_helpers import optimize_and_compare, parse, rand

PASS = "PadFusion"
X = {"X": rand(1, 3, 9, 10)}


def pad_then(reader: str, pads: str = "0, 0, 1, 2, 0, 0, 2, 1", extra_inputs: str = "",
             pad_attrs: str = "", opset: int = 17, out: str = "float[1, 4, ?, ?] Y",
             inits: dict | None = None, pad_args: str | None = None):
    args = pad_args if pad_args is not None else f"X, pads{extra_inputs}"
    text = f"""
    <ir_version: 8, opset_import: ["" : {opset}]>
    g (float[1, 3, 9, 10] X) => ({out}) {{
        pads = Constant <value = int64[{len(pads.split(','))}] {{{pads}}}> ()
        P = Pad{pad_attrs}({args})
        Y = {reader}
    }}"""
    return parse(text, W=rand(4, 3, 3, 3, seed=1), B=rand(4, seed=2), **(inits or {}))


@pytest.mark.parametrize("conv", [
    "Conv <kernel_shape = [3, 3], auto_pad = \"VALID\", strides = [2, 2]> (P, W, B)",
    "Conv <kernel_shape = [3, 3], pads = [1, 0, 0, 1]> (P, W)",
    "Conv (P, W, B)",
])
def test_zero_pad_moves_into_the_convolution(conv):
    res = optimize_and_compare(pad_then(conv), X)
    assert res.changes(PASS)["Pad+Conv"] == 1
    assert res.ops == {"Conv": 1}


def test_opset_10_pad_attribute_and_axes_input():
    old = """
    <ir_version: 5, opset_import: ["" : 10]>
    g (float[1, 3, 9, 10] X) => (float[1, 4, ?, ?] Y) {
        P = Pad <pads = [0, 0, 1, 1, 0, 0, 1, 1], value = 0.0> (X)
        Y = Conv <kernel_shape = [3, 3]> (P, W)
    }"""
    res = optimize_and_compare(parse(old, W=rand(4, 3, 3, 3, seed=1)), X)
    assert res.changes(PASS)["Pad+Conv"] == 1
    axes = pad_then("Conv (P, W)", pads="1, 2, 0, 1",
                    pad_args="X, pads, zero, axes", opset=18,
                    inits={"axes": np.array([2, 3]), "zero": np.zeros((), np.float32)})
    res = optimize_and_compare(axes, X)
    assert res.changes(PASS)["Pad+Conv"] == 1


def test_average_pool_counting_padding_takes_it():
    res = optimize_and_compare(pad_then(
        "AveragePool <kernel_shape = [3, 3], count_include_pad = 1> (P)",
        out="float[1, 3, ?, ?] Y"), X)
    assert res.changes(PASS)["Pad+AveragePool"] == 1
    assert res.ops == {"AveragePool": 1}


@pytest.mark.parametrize("case", [
    dict(reader="MaxPool <kernel_shape = [3, 3]> (P)"),  # its padding is never taken
    dict(reader="AveragePool <kernel_shape = [3, 3]> (P)"),  # pads not counted
    dict(reader="Conv <kernel_shape = [3, 3], auto_pad = \"SAME_UPPER\"> (P, W)"),
    dict(reader="Conv (P, W)", pads="0, 1, 1, 1, 0, 0, 1, 1"),  # pads a channel
    dict(reader="Conv (P, W)", pads="0, 0, -1, 1, 0, 0, 1, 1"),  # crops
    dict(reader="Conv (P, W)", pad_attrs=" <mode = \"reflect\">"),
    dict(reader="Conv (P, W)", extra_inputs=", one", inits={"one": np.ones((), np.float32)}),
])
def test_what_is_not_the_same_computation_stays(case):
    if "Pool" in case["reader"]:
        case.setdefault("out", "float[1, 3, ?, ?] Y")
    if ", 1, 1, 1, 0," in case.get("pads", ""):
        case["reader"] = "Conv (P, V)"
        case.setdefault("inits", {})["V"] = rand(4, 4, 3, 3, seed=4)
    res = optimize_and_compare(pad_then(**case), X)
    assert not res.changes(PASS)
    assert "Pad" in res.ops
