"""com.microsoft operators (and onnxruntime's own ai.onnx LayerNormalization-1 and
SimplifiedLayerNormalization-1): one-node models with random inputs checked against
onnxruntime's CPU provider, numpy for the variants it does not run on CPU, and models that
onnxruntime itself writes (its optimizer's saved graphs and the transformers optimizer's
fused BERT / GPT-2 models) checked end to end.
"""

from __future__ import annotations

import collections
import math
from pathlib import Path

import numpy as np
import one_node_harness as harness
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto

import onnxrun

MS = "com.microsoft"
RNG = np.random.default_rng(7)
MODELS = Path(__file__).parent / "models"


def f32(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def i32(*values):
    return np.array(values, np.int32)


def one_node(op, inputs, *, domain=MS, opset=17, out_types="like input", **kw):
    """harness.one_node, by default of the com.microsoft domain at opset 17, its outputs typed
    as its first input."""
    return harness.one_node(op, inputs, opset=opset, domain=domain, out_types=out_types, **kw)


def ort_run(model, feeds):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"]).run(None, feeds)


def ours(model, feeds):
    return onnxrun.InferenceSession(model).run(None, feeds)


def assert_close(got, expected, rtol=1e-4, atol=1e-5):
    assert len(got) == len(expected)
    for r, e in zip(got, expected, strict=True):
        assert r.dtype == e.dtype and r.shape == e.shape, (r.dtype, e.dtype, r.shape, e.shape)
        np.testing.assert_allclose(r, e, rtol=rtol, atol=atol)


# -- cases checked against onnxruntime ----------------------------------------------------------

CASES: list[tuple] = []  # (id, op, inputs, n_out, attrs, extra one_node keywords)


def case(name, op, inputs, n_out=1, attrs=None, **kw):
    CASES.append(pytest.param(op, inputs, n_out, attrs or {}, kw, id=f"{op}-{name}"))


# fused convolution / gemm / matmul
X, W, BC = f32(2, 3, 6, 6), f32(4, 3, 3, 3), f32(4)
for act, params in [("Relu", None), ("Tanh", None), ("Sigmoid", None), ("LeakyRelu", [0.2]),
                    ("Clip", [-0.5, 0.5]), ("HardSigmoid", [0.3, 0.4]), ("", None)]:
    a = {"activation": act} if act else {}
    if params:
        a["activation_params"] = params
    case(act or "none", "FusedConv", [X, W, BC], attrs=a)
case("sum Z", "FusedConv", [X, W, BC, f32(2, 4, 4, 4)], attrs={"activation": "Relu"})
case("const W", "FusedConv", [X, W, BC], attrs={"activation": "Relu"}, const=(1, 2))
case("group pads strides", "FusedConv", [f32(2, 2, 7, 7), f32(4, 1, 3, 3), BC],
     attrs={"activation": "Relu", "pads": [1, 1, 1, 1], "group": 2, "strides": [2, 2]})
case("1d", "FusedConv", [f32(2, 3, 10), f32(4, 3, 3)],
     attrs={"activation": "LeakyRelu", "activation_params": [0.1], "dilations": [2]})
A, BM, C = f32(4, 5), f32(5, 6), f32(6)
for act, alpha, beta in [("Relu", None, None), ("LeakyRelu", 0.1, None), ("Tanh", None, None),
                         ("Sigmoid", None, None), ("HardSigmoid", 0.3, 0.6)]:
    a = {"activation": act, "alpha": 0.5, "beta": 2.0}
    if alpha is not None:
        a["activation_alpha"] = alpha
    if beta is not None:
        a["activation_beta"] = beta
    case(act, "FusedGemm", [A, BM, C], attrs=a)
case("trans const", "FusedGemm", [A.T.copy(), BM.T.copy(), f32(4, 6)],
     attrs={"transA": 1, "transB": 1, "activation": "Relu", "alpha": 0.7}, const=(1,))
for a in [{}, {"alpha": 0.5}, {"transA": 1}, {"transB": 1}, {"transA": 1, "transB": 1}]:
    lhs = f32(2, 3, 5, 4) if a.get("transA") else f32(2, 3, 4, 5)
    rhs = f32(2, 3, 6, 5) if a.get("transB") else f32(2, 3, 5, 6)
    case("-".join(a) or "plain", "FusedMatMul", [lhs, rhs], attrs=a)
case("broadcast", "FusedMatMul", [f32(2, 3, 4, 5), f32(5, 6)], attrs={"alpha": 0.3})
case("vector", "FusedMatMul", [f32(5), f32(5, 6)])
case("transBatchA", "FusedMatMul", [f32(4, 2, 5), f32(2, 5, 6)], attrs={"transBatchA": 1})
case("transBatchB", "FusedMatMul", [f32(2, 4, 5), f32(5, 2, 6)], attrs={"transBatchB": 1})
case("transBatchA transA", "FusedMatMul", [f32(5, 2, 3, 4), f32(2, 3, 5, 6)],
     attrs={"transBatchA": 1, "transA": 1})
case("transBatchB transB", "FusedMatMul", [f32(2, 3, 4, 5), f32(6, 2, 3, 5)],
     attrs={"transBatchB": 1, "transB": 1})
case("transBatch both", "FusedMatMul", [f32(4, 2, 5), f32(5, 2, 6)],
     attrs={"transBatchA": 1, "transBatchB": 1, "alpha": 1.5})

# the gelu family, NhwcMaxPool
XG, BG = f32(3, 4, 8) * 3, f32(8)
case("", "Gelu", [XG])
case("", "BiasGelu", [XG, BG])
case("", "FastGelu", [XG])
case("bias", "FastGelu", [XG, BG])
case("default alpha", "QuickGelu", [XG])
case("alpha", "QuickGelu", [XG], attrs={"alpha": 1.0})
case("float16", "FastGelu", [XG.astype(np.float16), BG.astype(np.float16)], rtol=2e-3,
     atol=2e-3)
XU = RNG.integers(0, 255, (2, 5, 5, 3)).astype(np.uint8)
case("uint8", "NhwcMaxPool", [XU], attrs={"kernel_shape": [2, 2]})
case("int8 pads strides", "NhwcMaxPool", [XU.astype(np.int8)],
     attrs={"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [2, 2]})
case("ceil", "NhwcMaxPool", [XU], attrs={"kernel_shape": [2, 2], "strides": [2, 2],
                                          "ceil_mode": 1})

# layer normalizations
XL, SK, G, BT, BI = f32(2, 3, 8), f32(2, 3, 8), f32(8), f32(8), f32(8)
F = TensorProto.FLOAT
case("all inputs", "SkipLayerNormalization", [XL, SK, G, BT, BI], 4)
case("2-D skip", "SkipLayerNormalization", [XL, SK[0], G], 4, attrs={"epsilon": 1e-5})
case("bias", "SkipSimplifiedLayerNormalization", [XL, SK, G, BI], 4)
case("2-D", "SkipSimplifiedLayerNormalization", [XL.reshape(6, 8), SK.reshape(6, 8), G], 4)
case("float16", "SkipLayerNormalization", [a.astype(np.float16) for a in (XL, SK, G, BT)], 4,
     out_types=[TensorProto.FLOAT16, F, F, TensorProto.FLOAT16], rtol=2e-3, atol=2e-3)

# Attention (packed QKV weights)
N = 2
XA, WA, BA = f32(2, 4, 16), f32(16, 48) * 0.3, f32(48)
case("plain", "Attention", [XA, WA, BA], 2, {"num_heads": N})
case("const weights", "Attention", [XA, WA, BA], 2, {"num_heads": N}, const=(1, 2))
case("unidirectional", "Attention", [XA, WA, BA], 2, {"num_heads": N, "unidirectional": 1})
case("key lengths", "Attention", [XA, WA, None, i32(3, 2)], 1, {"num_heads": N})
case("end and start", "Attention", [XA, WA, BA, i32(3, 4, 0, 1)], 1, {"num_heads": N})
case("raw 2-D mask", "Attention", [XA, WA, BA, RNG.integers(0, 2, (2, 4)).astype(np.int32)], 1,
     {"num_heads": N})
case("3-D mask causal", "Attention", [XA, WA, BA, RNG.integers(0, 2, (2, 4, 4)).astype(np.int32)],
     1, {"num_heads": N, "unidirectional": 1})
PAST = f32(2, 2, N, 3, 8)
case("past", "Attention", [XA, WA, BA, None, PAST], 2, {"num_heads": N})
case("past mask causal", "Attention",
     [XA, WA, BA, RNG.integers(0, 2, (2, 7)).astype(np.int32), PAST], 2,
     {"num_heads": N, "unidirectional": 1})
case("attention bias scale", "Attention", [XA, WA, BA, None, None, f32(1, N, 4, 4)], 1,
     {"num_heads": N, "scale": 0.3})
case("qkv hidden sizes", "Attention", [XA, f32(16, 28), f32(28)], 1,
     {"num_heads": N, "qkv_hidden_sizes": [8, 8, 12]})

# MultiHeadAttention
Q, K, V, BQKV = f32(2, 3, 8), f32(2, 5, 8), f32(2, 5, 8), f32(24)
Q2, K2, V2, PK, PV = f32(2, 3, 8), f32(2, 3, 8), f32(2, 3, 8), f32(2, N, 4, 4), f32(2, N, 4, 4)
case("cross", "MultiHeadAttention", [Q, K, V], 1, {"num_heads": N})
case("bias", "MultiHeadAttention", [Q, K, V, BQKV], 1, {"num_heads": N})
case("key lengths", "MultiHeadAttention", [Q, K, V, BQKV, i32(3, 5)], 1, {"num_heads": N})
case("2-D mask", "MultiHeadAttention",
     [Q, K, V, BQKV, RNG.integers(0, 2, (2, 5)).astype(np.int32)], 1, {"num_heads": N})
case("3-D mask", "MultiHeadAttention",
     [Q, K, V, BQKV, RNG.integers(0, 2, (2, 3, 5)).astype(np.int32)], 1, {"num_heads": N})
case("attention bias", "MultiHeadAttention", [Q, K, V, BQKV, None, f32(2, N, 3, 5)], 1,
     {"num_heads": N, "scale": 0.2})
case("broadcast bias", "MultiHeadAttention", [Q, K, V, BQKV, None, f32(1, 1, 3, 5)], 1,
     {"num_heads": N})
case("past", "MultiHeadAttention", [Q2, K2, V2, BQKV, None, None, PK, PV], 3, {"num_heads": N})
case("past causal mask", "MultiHeadAttention",
     [Q2, K2, V2, BQKV, RNG.integers(0, 2, (2, 7)).astype(np.int32), None, PK, PV], 3,
     {"num_heads": N, "unidirectional": 1})
case("qk causal", "MultiHeadAttention", [Q2, K2, V2, None, None, None, PK, PV], 4,
     {"num_heads": N, "unidirectional": 1})
case("qk bias", "MultiHeadAttention", [Q2, K2, V2, None, None, f32(2, N, 3, 7), PK, PV], 4,
     {"num_heads": N})
case("projected BNSH key", "MultiHeadAttention", [Q, f32(2, N, 5, 4), f32(2, N, 5, 4), BQKV], 1,
     {"num_heads": N})
case("value hidden size", "MultiHeadAttention", [Q, K, f32(2, 5, 12), f32(28)], 1,
     {"num_heads": N})
case("key lengths past", "MultiHeadAttention",
     [Q2, K2, V2, None, i32(5, 7), None, PK, PV], 3, {"num_heads": N})

# GroupQueryAttention
GB, GS, GN, GKV, GH, GP = 2, 4, 4, 2, 16, 5
GA = {"num_heads": GN, "kv_num_heads": GKV}
GQ, GK, GV = f32(GB, GS, GN * GH), f32(GB, GS, GKV * GH), f32(GB, GS, GKV * GH)
GPK, GPV = f32(GB, GKV, GP, GH), f32(GB, GKV, GP, GH)
GPKM, GPVM = f32(GB, GKV, 10, GH), f32(GB, GKV, 10, GH)
COS = np.cos(RNG.random((16, GH // 2))).astype(np.float32)
SIN = np.sin(RNG.random((16, GH // 2))).astype(np.float32)
PROMPT = [GQ, GK, GV, None, None, i32(GS - 1, GS - 1), i32(GS)]
DECODE = [GQ[:, :1], GK[:, :1], GV[:, :1], GPK, GPV, i32(GP, GP), i32(GP + 1)]
RAGGED = [GQ[:, :1], GK[:, :1], GV[:, :1], GPK, GPV, i32(3, GP), i32(GP + 1)]
case("prompt", "GroupQueryAttention", PROMPT, 3, GA)
case("padded prompt", "GroupQueryAttention", PROMPT[:5] + [i32(GS - 1, 1), i32(GS)], 3, GA)
case("decode", "GroupQueryAttention", DECODE, 3, GA)
case("ragged decode", "GroupQueryAttention", RAGGED, 3, GA)
case("decode into buffer", "GroupQueryAttention", RAGGED[:3] + [GPKM, GPVM] + RAGGED[5:], 3, GA)
case("subsequent prompt", "GroupQueryAttention",
     [GQ[:1], GK[:1], GV[:1], GPK[:1], GPV[:1], i32(GP + GS - 1), i32(GP + GS)], 3, GA)
case("packed qkv", "GroupQueryAttention",
     [np.concatenate([GQ, GK, GV], -1), None, None, None, None, i32(GS - 1, GS - 1), i32(GS)],
     3, GA)
case("rotary prompt", "GroupQueryAttention", PROMPT + [COS, SIN], 3, {**GA, "do_rotary": 1})
case("rotary interleaved decode", "GroupQueryAttention", RAGGED + [COS, SIN], 3,
     {**GA, "do_rotary": 1, "rotary_interleaved": 1})
case("rotary position ids", "GroupQueryAttention",
     RAGGED + [COS, SIN, np.array([[7], [2]], np.int64)], 3, {**GA, "do_rotary": 1})
case("rotary prompt position ids", "GroupQueryAttention",
     PROMPT + [COS, SIN, np.array([[3, 1, 2, 3], [2, 3, 4, 5]], np.int64)], 3,
     {**GA, "do_rotary": 1})
case("local window", "GroupQueryAttention", PROMPT, 3, {**GA, "local_window_size": 2})
case("local window decode", "GroupQueryAttention", RAGGED, 3, {**GA, "local_window_size": 3})
case("softcap", "GroupQueryAttention", PROMPT, 3, {**GA, "softcap": 1.5})
case("scale", "GroupQueryAttention", PROMPT, 3, {**GA, "scale": 0.7})
case("smooth softmax", "GroupQueryAttention", PROMPT, 3, {**GA, "smooth_softmax": 1})
case("head sink", "GroupQueryAttention", PROMPT + [None, None, None, None, f32(GN)], 3, GA)
case("attention bias", "GroupQueryAttention", PROMPT + [None, None, None, f32(GB, GN, GS, GS)],
     3, GA)
case("attention bias decode", "GroupQueryAttention",
     DECODE + [None, None, None, f32(1, 1, 1, GP + 1)], 3, GA)
case("qk before softmax", "GroupQueryAttention", PROMPT, 4, {**GA, "qk_output": 1})
case("qk after softmax", "GroupQueryAttention", PROMPT, 4, {**GA, "qk_output": 2})
case("qk decode softcap", "GroupQueryAttention", RAGGED, 4,
     {**GA, "qk_output": 1, "softcap": 1.0})
case("not causal", "GroupQueryAttention", PROMPT, 3, {**GA, "causal": 0})
# one token of one sequence, packed QKV: GroupQueryAttention's decode step (_decode_one)
ONE = [np.concatenate([GQ[:1, :1], GK[:1, :1], GV[:1, :1]], -1), None, None, GPKM[:1],
       GPVM[:1], i32(GP), i32(GP + 1)]
case("one token", "GroupQueryAttention", ONE, 3, GA)
case("one token rotary", "GroupQueryAttention", ONE + [COS, SIN], 3, {**GA, "do_rotary": 1})
case("one token rotary interleaved position ids", "GroupQueryAttention",
     ONE + [COS, SIN, np.array([[9]], np.int64)], 3,
     {**GA, "do_rotary": 1, "rotary_interleaved": 1})
case("one token past as long as the sequence", "GroupQueryAttention",
     ONE[:3] + [GPK[:1], GPV[:1]] + ONE[5:] + [COS, SIN], 3, {**GA, "do_rotary": 1})
case("float16", "GroupQueryAttention", [None if a is None else
                                        a.astype(np.float16) if a.dtype == np.float32 else a
                                        for a in DECODE], 3, GA, rtol=2e-3, atol=2e-3)

# RotaryEmbedding, EmbedLayerNormalization
RC = np.cos(RNG.random((10, 4))).astype(np.float32)
RS = np.sin(RNG.random((10, 4))).astype(np.float32)
PID = np.array([[0, 1, 2], [4, 5, 6]], np.int64)
case("3-D", "RotaryEmbedding", [f32(2, 3, 16), PID, RC, RS])
case("3-D interleaved", "RotaryEmbedding", [f32(2, 3, 16), PID, RC, RS],
     attrs={"interleaved": 1})
case("4-D", "RotaryEmbedding", [f32(2, 2, 3, 8), PID, RC, RS])
case("offset", "RotaryEmbedding", [f32(2, 3, 16), np.array([2], np.int64), RC, RS])
case("partial", "RotaryEmbedding", [f32(2, 3, 16), PID, RC[:, :2], RS[:, :2]],
     attrs={"rotary_embedding_dim": 4, "num_heads": 2})
case("partial interleaved 4-D", "RotaryEmbedding", [f32(2, 2, 3, 8), PID, RC[:, :2], RS[:, :2]],
     attrs={"rotary_embedding_dim": 4, "num_heads": 2, "interleaved": 1})
IDS = RNG.integers(0, 20, (2, 3)).astype(np.int32)
SEG = RNG.integers(0, 2, (2, 3)).astype(np.int32)
EMB = [f32(20, 8), f32(16, 8), f32(2, 8), f32(8), f32(8)]
I = TensorProto.INT32
case("mask", "EmbedLayerNormalization", [IDS, SEG, *EMB, i32([1, 1, 0], [1, 1, 1])], 2,
     out_types=[F, I])
case("no mask", "EmbedLayerNormalization", [IDS, SEG, *EMB], 2, out_types=[F, I])
case("no segment, sum", "EmbedLayerNormalization",
     [IDS, None, EMB[0], EMB[1], None, EMB[3], EMB[4], i32([1, 1, 0], [1, 1, 1])], 3,
     {"epsilon": 1e-5}, out_types=[F, I, F])
case("position ids", "EmbedLayerNormalization",
     [IDS, SEG, *EMB, i32([1, 0, 1], [0, 0, 0]), i32([2, 3, 4], [0, 5, 1])], 3,
     out_types=[F, I, F])
case("shared position ids", "EmbedLayerNormalization",
     [IDS, SEG, *EMB, i32([1, 1, 0], [1, 1, 1]), i32([2, 3, 4])], 3, out_types=[F, I, F])


@pytest.mark.parametrize("op,inputs,n_out,attrs,kw", CASES)
def test_vs_onnxruntime(op, inputs, n_out, attrs, kw):
    kw = dict(kw)
    tol = {k: kw.pop(k) for k in ("rtol", "atol") if k in kw}
    model, feeds = one_node(op, inputs, n_out=n_out, **kw, **attrs)
    assert_close(ours(model, feeds), ort_run(model, feeds), **tol)


def test_layer_normalization_v1_of_onnxruntime():
    """onnxruntime's ai.onnx LayerNormalization-1 / SimplifiedLayerNormalization-1, as its
    optimizer writes them into models of opset < 17 (here run under com.microsoft, which
    onnxrun also registers, against onnxruntime on the ai.onnx form)."""
    x, g, b = f32(2, 3, 8), f32(8), f32(8)
    for op, inputs, n_out in (("LayerNormalization", [x, g, b], 3),
                              ("SimplifiedLayerNormalization", [x, g], 2)):
        expected = ort_run(*one_node(op, inputs, n_out=n_out, domain="", opset=13, epsilon=1e-3))
        got = ours(*one_node(op, inputs, n_out=n_out, domain=MS, opset=13, epsilon=1e-3))
        assert_close(got, expected)


# -- variants onnxruntime's CPU provider does not run: numpy / equivalent-model oracles --------


def _softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _gelu(x):
    return 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))


@pytest.mark.parametrize("inner", [0, 1])
def test_bias_softmax(inner):
    x = f32(2, 3, 4, 5)
    bias = f32(2, 1, 4, 5) if inner else f32(1, 3, 4, 5)
    model, feeds = one_node("BiasSoftmax", [x, bias], axis=2, is_inner_broadcast=inner)
    (y,) = ours(model, feeds)
    np.testing.assert_allclose(y, _softmax((x + bias).reshape(2, 3, 20)).reshape(x.shape),
                               rtol=1e-5, atol=1e-6)


def test_bias_add_and_bias_split_gelu():
    x, bias, skip = f32(2, 3, 8), f32(8), f32(2, 3, 8)
    (y,) = ours(*one_node("BiasAdd", [x, bias, skip]))
    np.testing.assert_allclose(y, x + bias + skip, rtol=1e-6)
    (y,) = ours(*one_node("BiasSplitGelu", [x, bias]))
    s = x + bias
    np.testing.assert_allclose(y, s[..., :4] * _gelu(s[..., 4:]), rtol=1e-5, atol=1e-6)


def test_multihead_attention_packed_equals_unpacked():
    q, k, v = f32(2, 3, 2, 4), f32(2, 3, 2, 4), f32(2, 3, 2, 4)  # (B, S, N, H)
    bias = f32(24)
    flat = [a.reshape(2, 3, 8) for a in (q, k, v)]
    expected = ort_run(*one_node("MultiHeadAttention", [*flat, bias], num_heads=2))
    (qkv,) = ours(*one_node("MultiHeadAttention", [np.stack([q, k, v], 3), None, None, bias],
                            num_heads=2))
    (kv,) = ours(*one_node("MultiHeadAttention", [flat[0], np.stack([k, v], 3), None, bias],
                           num_heads=2))
    assert_close([qkv], expected)
    assert_close([kv], expected)


def test_attention_shared_past_buffer():
    """past_present_share_buffer: the new key/value land at past_sequence_length in a buffer
    that keeps its length; attention reads the first P + S rows."""
    x, w, b = f32(2, 1, 16), f32(16, 48), f32(48)
    past = f32(2, 2, 2, 6, 8)
    P = 3
    model, feeds = one_node("Attention", [x, w, b, None, past, None, i32(P)], n_out=2,
                            num_heads=2, past_present_share_buffer=1)
    y, present = ours(model, feeds)
    ref_y, ref_present = ours(*one_node("Attention", [x, w, b, None, past[:, :, :, :P]],
                                        n_out=2, num_heads=2))
    np.testing.assert_allclose(y, ref_y, rtol=1e-5, atol=1e-6)
    assert present.shape == past.shape
    np.testing.assert_allclose(present[:, :, :, :P + 1], ref_present, rtol=1e-6)
    np.testing.assert_array_equal(present[:, :, :, P + 1:], past[:, :, :, P + 1:])


@pytest.mark.parametrize("step", ["prompt", "one token", "ragged"])
def test_group_query_attention_shares_past_present_when_asked(step):
    """With the session config entry onnxrun.past_present_share_buffer = "1" (onnxrun.genai
    sets it), a past buffer that holds the whole sequence is written in place and returned as
    present, with the numbers of the copying path; without it, the past fed is never changed."""
    from onnxrun.providers.cpu.ops.contrib.transformer import SHARE_PAST_PRESENT

    if step == "prompt":
        inputs = [GQ[:1], GK[:1], GV[:1], GPKM[:1], GPVM[:1], i32(GS - 1), i32(GS), COS, SIN]
    elif step == "one token":
        inputs = ONE + [COS, SIN]
    else:
        inputs = RAGGED[:3] + [GPKM, GPVM] + RAGGED[5:] + [COS, SIN]
    model, feeds = one_node("GroupQueryAttention", inputs, n_out=3, **GA, do_rotary=1)
    feeds = {k: v.copy() for k, v in feeds.items()}  # the module's arrays stay as they are
    pk, pv = feeds["in3"], feeds["in4"]
    kept = pk.copy(), pv.copy()
    plain = onnxrun.InferenceSession(model).run(None, feeds)
    np.testing.assert_array_equal(pk, kept[0])  # the default never writes into its inputs
    np.testing.assert_array_equal(pv, kept[1])
    so = onnxrun.SessionOptions()
    so.add_session_config_entry(SHARE_PAST_PRESENT, "1")
    sess = onnxrun.InferenceSession(model, so)
    y = sess.run(["out0"], feeds)[0]  # present not fetched: the past buffers are the cache
    np.testing.assert_array_equal(y, plain[0])
    total = int(feeds["in5"].max()) + 1
    for buf, present, old in ((pk, plain[1], kept[0]), (pv, plain[2], kept[1])):
        lengths = feeds["in5"].reshape(-1) + 1
        for b, n in enumerate(lengths):
            np.testing.assert_array_equal(buf[b, :, :n], present[b, :, :n])
        assert total < buf.shape[2]
        np.testing.assert_array_equal(buf[:, :, total:], old[:, :, total:])  # left as it was


def test_attention_megatron_4d_mask():
    x, w = f32(2, 3, 16), f32(16, 48)
    mask = RNG.integers(0, 2, (2, 1, 6, 6)).astype(np.int32)
    mask[:, :, :, 0] = 1
    (y,) = ours(*one_node("Attention", [x, w, None, mask], num_heads=2))
    q, k, v = (np.matmul(x, w[:, i * 16:(i + 1) * 16]).reshape(2, 3, 2, 8).transpose(0, 2, 1, 3)
               for i in range(3))
    s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(8) + (1 - mask[:, :, :3, :3]) * -10000.0
    ref = (_softmax(s) @ v).transpose(0, 2, 1, 3).reshape(2, 3, 16)
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-5)


def test_group_query_attention_query_seqlens():
    """Right-padded chunks: the valid rows match onnxruntime (padding rows are unspecified)."""
    inputs = [GQ, GK, GV, GPKM, GPVM, i32(GP + 2, GP + 3), i32(10)] + [None] * 9 + [i32(3, 4)]
    model, feeds = one_node("GroupQueryAttention", inputs, n_out=3, **GA)
    got, expected = ours(model, feeds), ort_run(model, feeds)
    np.testing.assert_allclose(got[0][0, :3], expected[0][0, :3], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got[0][1], expected[0][1], rtol=1e-4, atol=1e-5)
    assert_close(got[1:], expected[1:])


# -- models onnxruntime writes ------------------------------------------------------------------


def _cases(name):
    data = np.load(MODELS / f"{name}.inputs.npz")
    cases: dict[str, dict[str, np.ndarray]] = collections.defaultdict(dict)
    for key, value in data.items():
        c, input_name = key.split("/")
        cases[c][input_name] = value
    return list(cases.values())


def _ort_optimized(src: Path, dst: Path, level) -> Path:
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.graph_optimization_level = level
    so.optimized_model_filepath = str(dst)
    ort.InferenceSession(str(src), so, providers=["CPUExecutionProvider"])
    return dst


def _transformers_optimized(src: Path, dst: Path, model_type: str) -> Path:
    optimizer = pytest.importorskip("onnxruntime.transformers.optimizer")
    opt = optimizer.optimize_model(str(src), model_type=model_type, num_heads=4, hidden_size=64,
                                   opt_level=0)
    opt.save_model_to_file(str(dst))
    return dst


@pytest.mark.parametrize("name,how,expect", [
    ("bert_tiny", "extended", {"FusedMatMul", "BiasGelu", "FusedGemm"}),
    ("gpt_tiny", "extended", {"FusedMatMul"}),
    ("bert_tiny", "bert", {"Attention", "EmbedLayerNormalization", "SkipLayerNormalization",
                           "BiasGelu"}),
    ("gpt_tiny", "gpt2", {"SkipLayerNormalization", "FastGelu"}),
])
def test_model_written_by_onnxruntime(tmp_path, name, how, expect):
    src = MODELS / f"{name}.onnx"
    if not src.exists():
        pytest.skip(f"{src.name} not generated")
    dst = tmp_path / f"{name}_{how}.onnx"
    if how == "extended":
        _ort_optimized(src, dst, ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED)
    else:
        _transformers_optimized(src, dst, how)
    ops = {n.op_type for n in onnx.load(str(dst)).graph.node if n.domain == MS}
    assert expect <= ops, ops
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    reference = ort.InferenceSession(str(dst), so, providers=["CPUExecutionProvider"])
    sess = onnxrun.InferenceSession(str(dst))
    types = {i.name: i.type for i in reference.get_inputs()}
    for feeds in _cases(name):
        feeds = {k: v.astype(np.int32 if types[k] == "tensor(int32)" else v.dtype)
                 for k, v in feeds.items() if k in types}
        assert_close(sess.run(None, feeds), reference.run(None, feeds), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("op", ["FusedGemm", "FusedConv"])
def test_fused_sigmoid_is_the_standalone_sigmoid(op):
    """A fused Sigmoid is onnxruntime's MlasComputeLogistic (the compiled logistic), to the
    bit what the product followed by a Sigmoid node gives (numpy's exp steps differed by an
    ulp here and there)."""
    from onnx import helper

    rng = np.random.default_rng(3)
    if op == "FusedGemm":
        x = (rng.standard_normal((3, 64)) * 4).astype(np.float32)
        w = rng.standard_normal((64, 37)).astype(np.float32)
        plain, attrs, xshape = "Gemm", {}, [3, 64]
    else:
        x = (rng.standard_normal((1, 8, 12, 12)) * 4).astype(np.float32)
        w = rng.standard_normal((16, 8, 3, 3)).astype(np.float32)
        plain, attrs, xshape = "Conv", {"pads": [1, 1, 1, 1]}, [1, 8, 12, 12]

    def model(nodes):
        g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(
            "x", TensorProto.FLOAT, xshape)], [helper.make_tensor_value_info(
                "y", TensorProto.FLOAT, None)], [onnx.numpy_helper.from_array(w, "w")])
        return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid(MS, 1)]).SerializeToString()

    fused = model([helper.make_node(op, ["x", "w"], ["y"], domain=MS, activation="Sigmoid",
                                    **attrs)])
    unfused = model([helper.make_node(plain, ["x", "w"], ["p"], **attrs),
                     helper.make_node("Sigmoid", ["p"], ["y"])])
    so = onnxrun.SessionOptions()
    so.graph_optimization_level = onnxrun.GraphOptimizationLevel.ORT_DISABLE_ALL
    got = onnxrun.InferenceSession(fused, so).run(None, {"x": x})[0]
    want = onnxrun.InferenceSession(unfused, so).run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, want)
