"""The LLM operators of onnxruntime-genai's builder folders on the CUDA provider (MatMulNBits,
GroupQueryAttention with rotary and the shared past/present buffer, RotaryEmbedding) against
the CPU provider, on the stand-in device (and on CuPy, marked gpu)."""

from __future__ import annotations

import numpy as np
import pytest
from cuda_helpers import CUDA, compare
from onnx import TensorProto, helper, numpy_helper

import onnxrun

rng = np.random.default_rng(3)
MS = "com.microsoft"


def _model(nodes, inputs, outputs, initializers=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid(MS, 1)], ir_version=8)


def _vi(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def _quantized(K, N, block, bits, rng):
    kb = -(-K // block)
    per = 8 // bits
    B = rng.integers(0, 256, (N, kb, block // per), dtype=np.uint8)
    scales = (rng.random((N * kb,), dtype=np.float32) * 0.1 + 0.01).astype(np.float32)
    zp = rng.integers(0, 256, (N, -(-kb * bits // 8)), dtype=np.uint8)
    return B, scales, zp


@pytest.mark.parametrize("bits,K,block,zp,bias,level", [
    (4, 64, 32, True, False, 4),    # the builder's int4 (accuracy_level 4 on the CPU)
    (4, 80, 32, False, True, 0),    # K not a multiple of the block, no zero points, a bias
    (4, 128, 64, True, True, 0),
    (8, 64, 32, True, False, 0),
    (2, 64, 32, False, False, 0),
])
def test_matmul_nbits(on_device, bits, K, block, zp, bias, level):
    N = 24
    B, scales, zps = _quantized(K, N, block, bits, rng)
    inits = [numpy_helper.from_array(B, "B"), numpy_helper.from_array(scales, "s")]
    ins = ["A", "B", "s"]
    if zp:
        inits.append(numpy_helper.from_array(zps, "zp"))
        ins.append("zp")
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(N).astype(np.float32), "bias"))
        ins += [""] * (5 - len(ins)) + ["bias"]
    node = helper.make_node("MatMulNBits", ins, ["Y"], domain=MS, K=K, N=N, block_size=block,
                            bits=bits, accuracy_level=level)
    m = _model([node], [_vi("A", TensorProto.FLOAT, [2, 3, K])],
               [_vi("Y", TensorProto.FLOAT, [2, 3, N])], inits)
    A = rng.standard_normal((2, 3, K)).astype(np.float32)
    # level 4 quantizes A to int8 on the CPU; the device computes in float32 (onnxruntime CUDA)
    tol = dict(rtol=2e-2, atol=5e-2) if level == 4 else dict(rtol=1e-4, atol=1e-4)
    compare(m, {"A": A}, **tol)


def _rotary_caches(max_pos, rot_half):
    inv = 1.0 / (10000 ** (np.arange(rot_half) / rot_half))
    ang = np.arange(max_pos)[:, None] * inv[None]
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


def _gqa_model(N, Nkv, H, P, *, rotary=True, interleaved=0, window=-1, softcap=0.0,
               smooth=0, packed=True):
    cos, sin = _rotary_caches(64, H // 2)
    D = (N + 2 * Nkv) * H
    inputs = [_vi("query", TensorProto.FLOAT, ["B", "S", D if packed else N * H])]
    names = ["query", "", ""]
    if not packed:
        inputs += [_vi("key", TensorProto.FLOAT, ["B", "S", Nkv * H]),
                   _vi("value", TensorProto.FLOAT, ["B", "S", Nkv * H])]
        names = ["query", "key", "value"]
    inputs += [_vi("past_key", TensorProto.FLOAT, ["B", Nkv, P, H]),
               _vi("past_value", TensorProto.FLOAT, ["B", Nkv, P, H]),
               _vi("seqlens_k", TensorProto.INT32, ["B"]),
               _vi("total", TensorProto.INT32, [])]
    names += ["past_key", "past_value", "seqlens_k", "total"]
    inits = []
    if rotary:
        inits = [numpy_helper.from_array(cos, "cos"), numpy_helper.from_array(sin, "sin")]
        names += ["cos", "sin"]
    node = helper.make_node("GroupQueryAttention", names, ["out", "present_key", "present_value"],
                            domain=MS, num_heads=N, kv_num_heads=Nkv, do_rotary=int(rotary),
                            rotary_interleaved=interleaved, local_window_size=window,
                            softcap=softcap, smooth_softmax=smooth)
    outputs = [_vi("out", TensorProto.FLOAT, ["B", "S", N * H]),
               _vi("present_key", TensorProto.FLOAT, ["B", Nkv, "T", H]),
               _vi("present_value", TensorProto.FLOAT, ["B", Nkv, "T", H])]
    return _model([node], inputs, outputs, inits)


def _gqa_feeds(B, S, N, Nkv, H, P, lengths, *, packed=True):
    """A step of S new tokens after ``lengths`` past ones per row (0: a first prompt)."""
    D = (N + 2 * Nkv) * H
    feeds = {"query": rng.standard_normal((B, S, D if packed else N * H)).astype(np.float32)}
    if not packed:
        feeds["key"] = rng.standard_normal((B, S, Nkv * H)).astype(np.float32)
        feeds["value"] = rng.standard_normal((B, S, Nkv * H)).astype(np.float32)
    past = rng.standard_normal((2, B, Nkv, P, H)).astype(np.float32)
    lengths = np.asarray(lengths)
    feeds.update(past_key=past[0], past_value=past[1],
                 seqlens_k=(lengths + S - 1).astype(np.int32),
                 total=np.array(int(lengths.max()) + S, np.int32))
    return feeds


@pytest.mark.parametrize("case", ["prompt", "decode", "decode-batch", "separate", "window",
                                  "softcap-smooth", "interleaved", "no-rotary"])
def test_group_query_attention(on_device, case):
    N, Nkv, H = 4, 2, 16
    kw, B, S, P, lengths = {}, 1, 1, 12, [7]
    if case == "prompt":
        S, P, lengths = 5, 0, [0]
    elif case == "decode-batch":
        B, lengths = 3, [7, 3, 11]
    elif case == "separate":
        kw, S, lengths = dict(packed=False), 2, [4]
    elif case == "window":
        kw = dict(window=4)
    elif case == "softcap-smooth":
        kw = dict(softcap=5.0, smooth=1)
    elif case == "interleaved":
        kw = dict(interleaved=1)
    elif case == "no-rotary":
        kw = dict(rotary=False)
    m = _gqa_model(N, Nkv, H, P, **kw)
    feeds = _gqa_feeds(B, S, N, Nkv, H, P, lengths, packed=kw.get("packed", True))
    compare(m, feeds, rtol=1e-4, atol=1e-5)


def test_group_query_attention_shared_buffer_writes_the_device_past(on_device):
    """onnxrun.genai's shared past/present buffer: the step's keys and values land in the
    device buffers fed as past (no copy of the cache comes back), equal to the CPU's."""
    N, Nkv, H, P = 4, 2, 16, 16
    m = _gqa_model(N, Nkv, H, P).SerializeToString()
    feeds = _gqa_feeds(1, 1, N, Nkv, H, P, [6])
    so = onnxrun.SessionOptions()
    so.add_session_config_entry("onnxrun.past_present_share_buffer", "1")
    cpu_feeds = {k: v.copy() for k, v in feeds.items()}
    want = onnxrun.InferenceSession(m, so, providers=["CPUExecutionProvider"]).run(
        ["out"], cpu_feeds)[0]
    sess = onnxrun.InferenceSession(m, so, providers=CUDA)
    dev = {k: onnxrun.OrtValue.ortvalue_from_numpy(feeds[k], "cuda", 0)
           for k in ("past_key", "past_value")}
    got = sess.run(["out"], {**feeds, **dev})[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(dev["past_key"].numpy(), cpu_feeds["past_key"], rtol=1e-5,
                               atol=1e-6)
    np.testing.assert_allclose(dev["past_value"].numpy(), cpu_feeds["past_value"])
    assert not np.array_equal(dev["past_key"].numpy(), feeds["past_key"])  # written there


def test_group_query_attention_position_past_the_cache_is_refused(on_device):
    m = _gqa_model(4, 2, 16, 80)
    feeds = _gqa_feeds(1, 1, 4, 2, 16, 80, [70])  # cos/sin caches hold 64 positions
    sess = onnxrun.InferenceSession(m.SerializeToString(), providers=CUDA)
    with pytest.raises(Exception, match="outside the cos/sin cache of 64"):
        sess.run(None, feeds)


@pytest.mark.parametrize("ndim,interleaved,offset", [(3, 0, True), (3, 1, False),
                                                     (4, 0, False)])
def test_rotary_embedding(on_device, ndim, interleaved, offset):
    B, S, N, H = 2, 5, 3, 8
    cos, sin = _rotary_caches(32, H // 2)
    shape = [B, S, N * H] if ndim == 3 else [B, N, S, H]
    pos_shape = [1] if offset else [B, S]
    node = helper.make_node("RotaryEmbedding", ["x", "pos", "cos", "sin"], ["y"], domain=MS,
                            interleaved=interleaved, num_heads=N if ndim == 3 else 0)
    m = _model([node], [_vi("x", TensorProto.FLOAT, shape), _vi("pos", TensorProto.INT64,
                                                                  pos_shape)],
               [_vi("y", TensorProto.FLOAT, shape)],
               [numpy_helper.from_array(cos, "cos"), numpy_helper.from_array(sin, "sin")])
    pos = np.array([3]) if offset else rng.integers(0, 32, (B, S))
    compare(m, {"x": rng.standard_normal(shape).astype(np.float32), "pos": pos},
            rtol=1e-5, atol=1e-6)


def _mha_model(N, H, *, past, mask_rank, causal, bias, attn_bias, kv4=False):
    D = N * H
    names = ["q", "k", "v", "bias" if bias else "", "mask" if mask_rank else "",
             "ab" if attn_bias else "", "past_k" if past else "", "past_v" if past else ""]
    while names and not names[-1]:
        names.pop()
    kv = [_vi("k", TensorProto.FLOAT, ["B", N, "L", H] if kv4 else ["B", "L", D]),
          _vi("v", TensorProto.FLOAT, ["B", N, "L", H] if kv4 else ["B", "L", D])]
    inputs = [_vi("q", TensorProto.FLOAT, ["B", "S", D]), *kv]
    if bias:
        inputs.append(_vi("bias", TensorProto.FLOAT, [3 * D]))
    if mask_rank:
        inputs.append(_vi("mask", TensorProto.INT32, ["M"] if mask_rank == 1 else ["B", "T"]))
    if attn_bias:
        inputs.append(_vi("ab", TensorProto.FLOAT, [1, N, "S", "T"]))
    if past:
        inputs += [_vi("past_k", TensorProto.FLOAT, ["B", N, "P", H]),
                   _vi("past_v", TensorProto.FLOAT, ["B", N, "P", H])]
    node = helper.make_node("MultiHeadAttention", names, ["out", "present_k", "present_v"],
                            domain=MS, num_heads=N, unidirectional=int(causal))
    outputs = [_vi("out", TensorProto.FLOAT, ["B", "S", D]),
               _vi("present_k", TensorProto.FLOAT, ["B", N, "T", H]),
               _vi("present_v", TensorProto.FLOAT, ["B", N, "T", H])]
    return _model([node], inputs, outputs)


@pytest.mark.parametrize("case", ["prompt-causal-mask2", "decode-past-lengths", "bias-attn-bias",
                                  "kv-heads", "start-end-mask"])
def test_multi_head_attention(on_device, case):
    N, H, B = 4, 8, 2
    S, L, P = (5, 5, 0) if case in ("prompt-causal-mask2", "bias-attn-bias") else (1, 1, 6)
    kw = dict(past=P > 0, mask_rank=0, causal=case != "kv-heads", bias=False, attn_bias=False)
    if case == "prompt-causal-mask2":
        kw["mask_rank"] = 2
    elif case in ("decode-past-lengths", "start-end-mask"):
        kw["mask_rank"] = 1
    elif case == "bias-attn-bias":
        kw.update(bias=True, attn_bias=True)
    elif case == "kv-heads":
        kw.update(kv4=True, past=False)
        L, P = 7, 0
    T = P + L
    f = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    feeds = {"q": f(B, S, N * H)}
    feeds.update(k=f(B, N, L, H), v=f(B, N, L, H)) if kw.get("kv4") else feeds.update(
        k=f(B, L, N * H), v=f(B, L, N * H))
    if kw["bias"]:
        feeds["bias"] = f(3 * N * H)
    if kw["mask_rank"] == 2:
        feeds["mask"] = np.array([[1] * T, [1] * (T - 2) + [0] * 2], np.int32)
    elif case == "decode-past-lengths":
        feeds["mask"] = np.array([T, T - 3], np.int32)
    elif case == "start-end-mask":
        feeds["mask"] = np.array([T, T - 1, 0, 2], np.int32)
    if kw["attn_bias"]:
        feeds["ab"] = f(1, N, S, T)
    if kw["past"]:
        feeds.update(past_k=f(B, N, P, H), past_v=f(B, N, P, H))
    compare(_mha_model(N, H, **kw), feeds, rtol=1e-4, atol=1e-5)
