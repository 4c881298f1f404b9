"""ai.onnx attention and transformer operators: Attention (23-25), RotaryEmbedding,
RMSNormalization, SwiGLU, TensorScatter, LinearAttention, CausalConvWithState and the
ai.onnx.preview FlexAttention.

The ONNX conformance cases of these operators must all pass; random cases are checked against
onnxruntime (which implements Attention, RotaryEmbedding and RMSNormalization) or the ONNX
reference evaluator.
"""

from __future__ import annotations

import warnings

import ml_dtypes
import numpy as np
import one_node_harness as harness
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import onnxrun

RNG = np.random.default_rng(23)
OPS = {"Attention", "RotaryEmbedding", "RMSNormalization", "SwiGLU", "TensorScatter",
       "LinearAttention", "CausalConvWithState", "FlexAttention"}


def _f32(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


# -- conformance --------------------------------------------------------------------------------


def _conformance_cases():
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = collect_testcases(None)
    return [c for c in cases if c.model.graph.node
            and any(n.op_type in OPS for n in c.model.graph.node)]


CASES = _conformance_cases()


def test_conformance_covers_every_op():
    seen = {n.op_type for c in CASES for n in c.model.graph.node} & OPS
    assert seen == OPS


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_conformance(case):
    # Kernel-level check: no graph rewrite (e.g. 16-bit models computed in float32) in between.
    sess = onnxrun.InferenceSession(case.model.SerializeToString(), _kernel_only())
    names = [i.name for i in case.model.graph.input]
    for inputs, outputs in case.data_sets:
        got = sess.run(None, dict(zip(names, inputs, strict=True)))
        for r, e in zip(got, outputs, strict=True):
            e = np.asarray(e)
            assert r.dtype == e.dtype and r.shape == e.shape
            np.testing.assert_allclose(r.astype(np.float64), e.astype(np.float64),
                                       rtol=case.rtol, atol=case.atol)


# -- one-node models ----------------------------------------------------------------------------


def one_node(op, inputs, *, out_types="like input", **kw):
    """harness.one_node with the outputs typed as the first input by default."""
    return harness.one_node(op, inputs, out_types=out_types, **kw)


def run_both(model, feeds, oracle="ort"):
    if oracle == "ort":
        so = ort.SessionOptions()
        so.log_severity_level = 3
        expected = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"]).run(
            None, feeds)
    else:
        expected = ReferenceEvaluator(onnx.load_from_string(model)).run(None, feeds)
    got = onnxrun.InferenceSession(model, _kernel_only()).run(None, feeds)
    return got, expected


def _kernel_only():
    opts = onnxrun.SessionOptions()
    opts.graph_optimization_level = onnxrun.GraphOptimizationLevel.ORT_DISABLE_ALL
    return opts


def assert_close(got, expected, rtol=1e-4, atol=1e-5):
    assert len(got) == len(expected)
    for r, e in zip(got, expected, strict=True):
        assert r.dtype == e.dtype and r.shape == e.shape, (r.dtype, e.dtype, r.shape, e.shape)
        np.testing.assert_allclose(r, e, rtol=rtol, atol=atol)


# -- Attention against onnxruntime --------------------------------------------------------------

B, S, T = 2, 3, 5


def _attention_cases():
    mask_bool = RNG.random((B, 1, S, T + S)) > 0.3
    yield "3d gqa causal past bool mask", [
        _f32(B, S, 32), _f32(B, S, 16), _f32(B, S, 16), mask_bool, _f32(B, 2, T, 8),
        _f32(B, 2, T, 8)], 3, {"q_num_heads": 4, "kv_num_heads": 2, "is_causal": 1}, 23
    yield "4d softcap qk after softcap", [
        _f32(B, 4, S, 8), _f32(B, 4, T, 8), _f32(B, 4, T, 8), _f32(S, T)], 4, {
        "softcap": 2.0, "qk_matmul_output_mode": 1}, 23
    yield "4d raw qk with softcap", [
        _f32(B, 4, S, 8), _f32(B, 4, T, 8), _f32(B, 4, T, 8)], 4, {"softcap": 2.0}, 23
    yield "4d probs, float mask, scale", [
        _f32(B, 4, S, 8), _f32(B, 2, T, 8), _f32(B, 2, T, 6), _f32(B, 1, S, T)], 4, {
        "qk_matmul_output_mode": 3, "scale": 0.3}, 23
    yield "external cache nonpad causal", [
        _f32(B, 4, S, 8), _f32(B, 4, T, 8), _f32(B, 4, T, 8), None, None, None,
        np.array([3, 5], np.int64)], 1, {"is_causal": 1}, 24


@pytest.mark.parametrize("inputs,n_out,attrs,opset",
                         [c[1:] for c in _attention_cases()],
                         ids=[c[0] for c in _attention_cases()])
def test_attention_vs_onnxruntime(inputs, n_out, attrs, opset):
    model, feeds = one_node("Attention", inputs, opset=opset, n_out=n_out, **attrs)
    assert_close(*run_both(model, feeds))


def test_attention_fully_masked_row_is_zero():
    mask = np.ones((S, T), bool)
    mask[1] = False
    model, feeds = one_node("Attention", [_f32(1, 2, S, 4), _f32(1, 2, T, 4), _f32(1, 2, T, 4),
                                          mask], opset=23)
    (y,) = onnxrun.InferenceSession(model).run(None, feeds)
    assert np.all(y[:, :, 1] == 0) and np.all(np.isfinite(y))


def test_attention_bfloat16_matches_reference():
    q, k, v = (RNG.random((1, 2, 4, 8)).astype(ml_dtypes.bfloat16) for _ in range(3))
    model, feeds = one_node("Attention", [q, k, v], opset=23, is_causal=1)
    got, expected = run_both(model, feeds, oracle="reference")
    assert got[0].dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(got[0].astype(np.float32), expected[0].astype(np.float32))


def test_rotary_and_rms_vs_onnxruntime():
    pos = np.array([[0, 1, 2], [3, 4, 5]], np.int64)
    for interleaved in (0, 1):
        model, feeds = one_node("RotaryEmbedding", [_f32(B, S, 32), _f32(10, 2), _f32(10, 2),
                                                    pos], opset=23, num_heads=4,
                                rotary_embedding_dim=4, interleaved=interleaved)
        assert_close(*run_both(model, feeds))
    model, feeds = one_node("RMSNormalization", [_f32(B, S, 4, 8), _f32(4, 8)], opset=23,
                            axis=-2, epsilon=1e-3)
    assert_close(*run_both(model, feeds))


# -- the newer operators against the reference evaluator ----------------------------------------


@pytest.mark.parametrize("rule", ["linear", "gated", "delta", "gated_delta"])
def test_linear_attention_vs_reference(rule):
    b, t, hq, hkv, dk, dv = 2, 7, 4, 2, 4, 3
    inputs = [_f32(b, t, hq * dk), _f32(b, t, hkv * dk) * 0.5, _f32(b, t, hkv * dv),
              _f32(b, hkv, dk, dv)]
    if rule in ("gated", "gated_delta"):
        inputs.append(-np.abs(_f32(b, t, hkv * dk)) * 0.2)
    else:
        inputs.append(None)
    if rule in ("delta", "gated_delta"):
        inputs.append(1 / (1 + np.exp(-_f32(b, t, hkv))))
    model, feeds = one_node("LinearAttention", inputs, opset=27, n_out=2, q_num_heads=hq,
                            kv_num_heads=hkv, update_rule=rule)
    assert_close(*run_both(model, feeds, oracle="reference"), rtol=1e-4, atol=1e-5)


def test_causal_conv_with_state_vs_reference():
    x, w, bias, past = _f32(2, 5, 9), _f32(5, 1, 4), _f32(5), _f32(2, 5, 3)
    for act in ("none", "silu"):
        model, feeds = one_node("CausalConvWithState", [x, w, bias, past], opset=27, n_out=2,
                                activation=act)
        assert_close(*run_both(model, feeds, oracle="reference"))


def test_tensor_scatter_vs_reference():
    past = _f32(3, 2, 6, 4)
    update = _f32(3, 2, 3, 4)
    idx = np.array([0, 3, 5], np.int64)
    model, feeds = one_node("TensorScatter", [past, update, idx], opset=24, mode="circular")
    assert_close(*run_both(model, feeds, oracle="reference"))
    past, update = _f32(2, 7, 3), _f32(2, 2, 3)
    model, feeds = one_node("TensorScatter", [past, update, np.array([1, 4], np.int64)],
                            opset=24, axis=1)
    assert_close(*run_both(model, feeds, oracle="reference"))


def test_swiglu_vs_reference():
    model, feeds = one_node("SwiGLU", [_f32(3, 8), _f32(3, 8)], opset=28, alpha=1.7)
    assert_close(*run_both(model, feeds, oracle="reference"))


def test_flex_attention_score_mod_reads_outer_scope():
    """score_mod adds an outer-scope bias; the subgraph gets its captured value."""
    q, k, v = _f32(1, 4, 3, 8), _f32(1, 2, 5, 8), _f32(1, 2, 5, 8)
    rel = _f32(3, 5)
    body = helper.make_graph(
        [helper.make_node("Add", ["s", "rel"], ["o"])], "score_mod",
        [helper.make_tensor_value_info("s", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("o", TensorProto.FLOAT, None)])
    node = helper.make_node("FlexAttention", ["q", "k", "v"], ["y"], domain="ai.onnx.preview",
                            score_mod=body)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, a.shape)
                      for n, a in (("q", q), ("k", k), ("v", v))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(rel, "rel")])
    model = helper.make_model(graph, ir_version=10, opset_imports=[
        helper.make_opsetid("", 26), helper.make_opsetid("ai.onnx.preview", 1)])
    (y,) = onnxrun.InferenceSession(model.SerializeToString()).run(None, {"q": q, "k": k,
                                                                          "v": v})
    kk, vv = np.repeat(k, 2, axis=1), np.repeat(v, 2, axis=1)
    s = q @ kk.transpose(0, 1, 3, 2) / np.sqrt(8) + rel
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    np.testing.assert_allclose(y, p @ vv, rtol=1e-4, atol=1e-5)
