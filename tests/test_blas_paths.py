"""Float products of the transformer kernels go through providers/cpu/blas.matmul: in Pyodide
numpy has no BLAS and blas.matmul hands float32/float64 products to SciPy's OpenBLAS (a
[128, 384] x [384, 1152] product: ~140 ms in numpy there, ~20 ms through SciPy). Here SciPy's
BLAS is forced on, counted, and each model's outputs are checked against numpy's products."""

from __future__ import annotations

import collections

import numpy as np
import pytest
from onnx import TensorProto, helper

import onnxrun
from onnxrun.providers.cpu import blas

MS = "com.microsoft"


@pytest.fixture
def scipy_gemms(monkeypatch):
    """SciPy's BLAS forced on, as in Pyodide; the returned counter counts its GEMM calls."""
    sb = pytest.importorskip("scipy.linalg.blas")
    calls = collections.Counter()

    def counted(name, gemm):
        def call(*a, **k):
            calls[name] += 1
            return gemm(*a, **k)
        return call

    gemms = {np.dtype(np.float32): counted("sgemm", sb.sgemm),
             np.dtype(np.float64): counted("dgemm", sb.dgemm)}
    monkeypatch.setattr(blas, "_gemms", lambda: gemms)
    return calls


def _model(nodes, inputs, outputs, inits=()):
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                               helper.make_opsetid(MS, 1)]).SerializeToString()


def _f(name, shape, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, shape)


def _check(model, feeds, calls, monkeypatch):
    opts = onnxrun.SessionOptions()
    opts.graph_optimization_level = onnxrun.GraphOptimizationLevel.ORT_DISABLE_ALL
    got = onnxrun.InferenceSession(model, opts).run(None, feeds)
    n = calls["sgemm"]
    monkeypatch.setattr(blas, "_gemms", lambda: {})  # numpy's own products: the reference
    want = onnxrun.InferenceSession(model, opts).run(None, feeds)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
    return n


RNG = np.random.default_rng(0)


def test_attention_products_through_blas(scipy_gemms, monkeypatch):
    B, S, H, N = 2, 16, 32, 4
    w = helper.make_tensor("w", TensorProto.FLOAT, [H, 3 * H],
                           (RNG.standard_normal((H, 3 * H)) * 0.2).astype(np.float32).ravel())
    b = helper.make_tensor("b", TensorProto.FLOAT, [3 * H],
                           RNG.standard_normal(3 * H).astype(np.float32))
    node = helper.make_node("Attention", ["x", "w", "b", "mask"], ["y"], domain=MS, num_heads=N)
    model = _model([node], [_f("x", [B, S, H]), _f("mask", [B, S], TensorProto.INT32)],
                   [_f("y", [B, S, H])], [w, b])
    mask = np.ones((B, S), np.int32)
    mask[1, 10:] = 0
    x = RNG.standard_normal((B, S, H)).astype(np.float32)
    # each head's two products, and the QKV projection where the compiled GEMM (which
    # takes a constant weight's projection) does not run, as in Pyodide
    from onnxrun.providers.cpu.compiled import float_gemm

    projection = 1 if float_gemm.unavailable() is not None else 0
    assert _check(model, {"x": x, "mask": mask}, scipy_gemms, monkeypatch) >= \
        projection + 2 * B * N


def test_multi_head_attention_products_through_blas(scipy_gemms, monkeypatch):
    B, S, H, N = 1, 8, 16, 2
    node = helper.make_node("MultiHeadAttention", ["q", "k", "v"], ["y"], domain=MS,
                            num_heads=N)
    model = _model([node], [_f(n, [B, S, H]) for n in "qkv"], [_f("y", [B, S, H])])
    feeds = {n: RNG.standard_normal((B, S, H)).astype(np.float32) for n in "qkv"}
    assert _check(model, feeds, scipy_gemms, monkeypatch) >= 2 * B * N


def test_fused_gemm_and_matmul_through_blas(scipy_gemms, monkeypatch):
    gemm = helper.make_node("FusedGemm", ["a", "b", "c"], ["g"], domain=MS, transB=1,
                            activation="Relu")
    mm = helper.make_node("FusedMatMul", ["x", "b"], ["m"], domain=MS, alpha=0.5, transB=1)
    model = _model([gemm, mm], [_f("a", [5, 6]), _f("b", [4, 6]), _f("c", [4]),
                                _f("x", [2, 3, 6])], [_f("g", [5, 4]), _f("m", [2, 3, 4])])
    feeds = {"a": RNG.standard_normal((5, 6)).astype(np.float32),
             "b": RNG.standard_normal((4, 6)).astype(np.float32),
             "c": RNG.standard_normal(4).astype(np.float32),
             "x": RNG.standard_normal((2, 3, 6)).astype(np.float32)}
    assert _check(model, feeds, scipy_gemms, monkeypatch) == 2
