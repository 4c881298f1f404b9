"""BatchNormMulAddFusion: BatchNormalization * / + per-channel constant -> one
BatchNormalization with a new scale and bias (Caffe2's exports: a BatchNormalization, then
its scale layer as a Mul and an Add)."""

from __future__ import annotations

import numpy as np
import pytest
from basic_helpers import optimize_and_compare, parse, rand

PASS = "BatchNormMulAddFusion"


def bn_scale_layer(m: np.ndarray, c: np.ndarray, extra: str = "",
                   outputs: str = "float[2, 4, 5, 6] Y", mul_first: bool = True,
                   opset: int = 15):
    mul = "S = Mul(K, N)" if mul_first else "S = Mul(N, K)"
    text = f"""
    <ir_version: 8, opset_import: ["" : {opset}]>
    g (float[2, 4, 5, 6] X) => ({outputs}) {{
        N = BatchNormalization(X, scale, B, mean, var)
        {mul}
        A = Add(S, C)
        Y = Relu(A)
        {extra}
    }}"""
    return parse(text, scale=rand(4, seed=1) + 1.5, B=rand(4, seed=2),
                 mean=rand(4, seed=3), var=np.abs(rand(4, seed=4)) + 0.5, K=m, C=c)


@pytest.mark.parametrize("shape", [(1, 4, 1, 1), (4, 1, 1), ()])
@pytest.mark.parametrize("mul_first", [True, False])
def test_per_channel_scale_and_shift_fold(shape, mul_first) -> None:
    res = optimize_and_compare(bn_scale_layer(rand(*shape, seed=5), rand(*shape, seed=6),
                                              mul_first=mul_first),
                               {"X": rand(2, 4, 5, 6, seed=7)})
    assert dict(res.changes(PASS)) == {"BatchNormalization*Mul": 1,
                                      "BatchNormalization+Add": 1}
    assert res.ops == {"BatchNormalization": 1, "Relu": 1}


@pytest.mark.parametrize("shape", [(1, 4, 5, 1), (1, 1, 1, 6), (6,)])
def test_a_constant_that_varies_elsewhere_is_not_folded(shape) -> None:
    res = optimize_and_compare(bn_scale_layer(rand(*shape, seed=5), rand(4, 1, 1, seed=6)),
                               {"X": rand(2, 4, 5, 6, seed=7)})
    assert not res.changes(PASS)  # the Add then follows the Mul, not the normalization
    assert res.ops["Mul"] == 1


def test_a_normalization_read_elsewhere_is_not_folded() -> None:
    res = optimize_and_compare(
        bn_scale_layer(rand(4, 1, 1, seed=5), rand(4, 1, 1, seed=6),
                       outputs="float[2, 4, 5, 6] Y, float[2, 4, 5, 6] N"),
        {"X": rand(2, 4, 5, 6, seed=7)})
    assert not res.changes(PASS)["BatchNormalization*Mul"]
    assert res.ops["BatchNormalization"] == 1 and res.ops["Mul"] == 1


def test_non_finite_factor_is_not_folded() -> None:
    m = np.array([1.0, np.inf, 2.0, 3.0], np.float32).reshape(4, 1, 1)
    res = optimize_and_compare(bn_scale_layer(m, rand(4, 1, 1, seed=6)),
                               {"X": rand(2, 4, 5, 6, seed=7)})
    assert not res.changes(PASS)["BatchNormalization*Mul"]
