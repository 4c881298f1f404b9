"""ConvBNFusion: Conv / ConvTranspose / Gemm + inference BatchNormalization folded into W, B."""

from __future__ import annotations

import numpy as np
import pytest
from basic_helpers import optimize_and_compare, parse, rand

PASS = "ConvBNFusion"


def bn_params(c: int, seed: int = 1) -> dict[str, np.ndarray]:
    return {"scale": rand(c, seed=seed, low=0.5, high=1.5), "bias": rand(c, seed=seed + 1),
            "mean": rand(c, seed=seed + 2), "var": rand(c, seed=seed + 3, low=0.2, high=2.0)}


def conv_bn_model(opset: int = 13, with_bias: bool = True, bn_attrs: str = "",
                  bn_outputs: str = "Y", extra: str = "", outputs: str = "float[1, 4, 6, 6] Y"):
    bias = ", B" if with_bias else ""
    text = f"""
    <ir_version: 8, opset_import: ["" : {opset}]>
    g (float[1, 3, 8, 8] X) => ({outputs}) {{
        C = Conv<kernel_shape = [3, 3]>(X, W{bias})
        {bn_outputs} = BatchNormalization{bn_attrs}(C, scale, bias, mean, var)
        {extra}
    }}"""
    inits = {"W": rand(4, 3, 3, 3, seed=5), **bn_params(4)}
    if with_bias:
        inits["B"] = rand(4, seed=6)
    return parse(text, **inits)


@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("opset", [9, 15])
def test_conv_bn_folds(opset: int, with_bias: bool) -> None:
    model = conv_bn_model(opset, with_bias)
    res = optimize_and_compare(model, {"X": rand(1, 3, 8, 8)})
    assert res.changes(PASS)["Conv+BatchNormalization"] == 1
    assert res.ops == {"Conv": 1}
    assert [o.name for o in res.saved.graph.output] == ["Y"]


def test_conv_transpose_bn_folds_with_groups() -> None:
    model = parse("""
    <ir_version: 8, opset_import: ["" : 13]>
    g (float[1, 4, 5, 5] X) => (float[1, 6, 7, 7] Y) {
        C = ConvTranspose<kernel_shape = [3, 3], group = 2>(X, W)
        Y = BatchNormalization(C, scale, bias, mean, var)
    }""", W=rand(4, 3, 3, 3, seed=5), **bn_params(6))
    res = optimize_and_compare(model, {"X": rand(1, 4, 5, 5)})
    assert res.changes(PASS)["ConvTranspose+BatchNormalization"] == 1
    assert res.ops == {"ConvTranspose": 1}


@pytest.mark.parametrize("trans_b", [0, 1])
def test_gemm_bn_folds(trans_b: int) -> None:
    w = rand(5, 3, seed=4) if trans_b else rand(3, 5, seed=4)
    model = parse(f"""
    <ir_version: 8, opset_import: ["" : 13]>
    g (float[2, 3] X) => (float[2, 5] Y) {{
        G = Gemm<transB = {trans_b}, beta = 0.5>(X, W, C)
        Y = BatchNormalization(G, scale, bias, mean, var)
    }}""", W=w, C=rand(5, seed=3), **bn_params(5))
    res = optimize_and_compare(model, {"X": rand(2, 3)})
    assert res.changes(PASS)["Gemm+BatchNormalization"] == 1
    assert res.ops == {"Gemm": 1}


def test_training_mode_bn_is_not_folded() -> None:
    model = conv_bn_model(15, bn_attrs="<training_mode = 1>", bn_outputs="Y, M, V")
    res = optimize_and_compare(model, {"X": rand(1, 3, 8, 8)})
    assert not res.changes(PASS)
    assert res.ops["BatchNormalization"] == 1


def test_bn_with_statistics_outputs_is_not_folded() -> None:
    # Before opset 14, asking for the running statistics means training mode.
    model = conv_bn_model(9, bn_outputs="Y, M, V, SM, SV",
                          outputs="float[1, 4, 6, 6] Y, float[4] M")
    res = optimize_and_compare(model, {"X": rand(1, 3, 8, 8)})
    assert not res.changes(PASS)


def test_conv_output_read_elsewhere_is_not_folded() -> None:
    model = conv_bn_model(13, extra="Z = Relu(C)",
                          outputs="float[1, 4, 6, 6] Y, float[1, 4, 6, 6] Z")
    res = optimize_and_compare(model, {"X": rand(1, 3, 8, 8)})
    assert not res.changes(PASS)
    assert res.ops == {"Conv": 1, "BatchNormalization": 1, "Relu": 1}


def test_non_constant_parameters_are_not_folded() -> None:
    # The weight is an input; and the variance is an initializer a caller may override.
    model = parse("""
    <ir_version: 8, opset_import: ["" : 13]>
    g (float[1, 3, 8, 8] X, float[4, 3, 3, 3] W) => (float[1, 4, 6, 6] Y) {
        C = Conv<kernel_shape = [3, 3]>(X, W)
        Y = BatchNormalization(C, scale, bias, mean, var)
    }""", **bn_params(4))
    res = optimize_and_compare(model, {"X": rand(1, 3, 8, 8), "W": rand(4, 3, 3, 3)})
    assert not res.changes(PASS)

    model = conv_bn_model(13)
    model.graph.input.append(onnx_value_info("var", [4]))
    res = optimize_and_compare(model, {"X": rand(1, 3, 8, 8)})
    assert not res.changes(PASS)


def onnx_value_info(name: str, shape: list[int]):
    import onnx

    return onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, shape)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_scaled_weights_round_once_from_float64(dtype):
    """The folded weights are each float64 product rounded once to the weight's dtype (as
    before, bit for bit), made without float64 copies of the whole weight."""
    import ml_dtypes

    from onnxrun.optimize.basic.fuse_conv_bn import _scaled

    rng = np.random.default_rng(3)
    dt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    w = rng.standard_normal((16, 8, 3, 3)).astype(dt)
    s = (rng.standard_normal(16) * 3).reshape(-1, 1, 1, 1)
    got = _scaled(w, s)
    assert got.dtype == dt
    np.testing.assert_array_equal(got.view(np.uint16 if dt.itemsize == 2 else np.uint32),
                                  (w.astype(np.float64) * s).astype(dt).view(
                                      np.uint16 if dt.itemsize == 2 else np.uint32))


def test_each_fusion_computes_the_affine_once_and_keeps_no_graph(monkeypatch) -> None:
    """check's (a, b) go to rewrite: batchnorm_affine once per fusion; no match's nodes stay
    held by the (process-wide) rule afterwards."""
    from onnxrun.optimize.basic import fuse_conv_bn

    calls = []
    real = fuse_conv_bn.batchnorm_affine
    monkeypatch.setattr(fuse_conv_bn, "batchnorm_affine",
                        lambda *a: calls.append(a[1].name) or real(*a))
    res = optimize_and_compare(conv_bn_model(), {"X": rand(1, 3, 8, 8)})
    assert res.changes(PASS) == {"Conv+BatchNormalization": 1}
    assert len(calls) == 1
    from onnxrun.optimize.base import registered_passes

    rules = [r for p in registered_passes() if p.name == PASS
             for r in getattr(getattr(p, "_impl", None) or p, "_rules", ())]
    assert rules and all(r._last is None for r in rules)


@pytest.mark.parametrize("dims, axis", [("2, 7, 3", 2), ("2, 7, 3", -1), ("N, T, 3", 2),
                                        ("7, 3", 1)])
def test_matmul_flatten_bn_folds(dims: str, axis: int) -> None:
    # a Linear layer's BatchNorm1d as PyTorch exports it (LeViT): MatMul, Flatten to
    # (rows, channels), BatchNormalization, back to the product's shape; known and unknown
    # leading sizes; a 2-D product (its Flatten an Identity, removed first)
    rank = len(dims.split(","))
    back = "S = Shape(P)\n        Y = Reshape(Z, S)" if rank > 2 else "Y = Identity(Z)"
    model = parse(f"""
    <ir_version: 8, opset_import: ["" : 13]>
    g (float[{dims}] X) => (float[{dims.rsplit(",", 1)[0]}, 5] Y) {{
        P = MatMul(X, W)
        F = Flatten<axis = {axis}>(P)
        Z = BatchNormalization(F, scale, bias, mean, var)
        {back}
    }}""", W=rand(3, 5, seed=4), **bn_params(5))
    sizes = {"N": 2, "T": 7}
    shape = [int(d) if d.strip().isdigit() else sizes[d.strip()] for d in dims.split(",")]
    res = optimize_and_compare(model, {"X": rand(*shape)}, **sizes)
    fused = "MatMul+Flatten+BatchNormalization" if rank > 2 else "MatMul+BatchNormalization"
    assert res.changes(PASS)[fused] == 1
    assert "BatchNormalization" not in res.ops


def test_matmul_flatten_bn_of_other_channels_is_not_folded() -> None:
    # Flatten at axis 1 of a [2, 7, 5] product gives 35 channels, not the weight's 5 columns
    model = parse("""
    <ir_version: 8, opset_import: ["" : 13]>
    g (float[2, 7, 3] X) => (float[2, 35] Y) {
        P = MatMul(X, W)
        F = Flatten<axis = 1>(P)
        Y = BatchNormalization(F, scale, bias, mean, var)
    }""", W=rand(3, 5, seed=4), **bn_params(35))
    res = optimize_and_compare(model, {"X": rand(2, 7, 3)})
    assert res.changes(PASS)["MatMul+Flatten+BatchNormalization"] == 0
    assert res.ops["BatchNormalization"] == 1
