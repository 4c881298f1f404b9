"""GroupQueryAttention's bad inputs: where onnxruntime refuses a call (INVALID_ARGUMENT), onnxrun
raises InvalidArgument naming the node, the input and the shapes, on the compiled path (head
size 16: compiled/gqa.py's kernels, which read the cache unchecked), the numpy path (head size
12) and the shared-buffer decode step alike; never a crash, a numpy message, or numbers.
An empty batch is refused as well (onnxruntime 1.32 dies of SIGFPE on it)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper

import onnxrun

ort = pytest.importorskip("onnxruntime")
N, NKV = 4, 2


def _model(rotary: bool = False) -> bytes:
    ins = [helper.make_tensor_value_info(n, t, None) for n, t in (
        ("q", TP.FLOAT), ("pk", TP.FLOAT), ("pv", TP.FLOAT), ("sk", TP.INT32), ("tot", TP.INT32))]
    names = ["q", "", "", "pk", "pv", "sk", "tot"]
    if rotary:
        ins += [helper.make_tensor_value_info(n, TP.FLOAT, None) for n in ("cos", "sin")]
        names += ["cos", "sin"]
    node = helper.make_node("GroupQueryAttention", names, ["y", "pko", "pvo"], name="gqa",
                            domain="com.microsoft", num_heads=N, kv_num_heads=NKV,
                            do_rotary=int(rotary))
    g = helper.make_graph([node], "g", ins, [helper.make_tensor_value_info(n, TP.FLOAT, None)
                                             for n in ("y", "pko", "pvo")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                               helper.make_opsetid("com.microsoft", 1)]
                             ).SerializeToString()


def _feed(H, B=1, S=1, P=4, sk=None, tot=None, q=None, past=None, rotary=False):
    rng = np.random.default_rng(0)
    f = {"q": rng.standard_normal(q or (B, S, (N + 2 * NKV) * H)).astype(np.float32),
         "pk": rng.standard_normal(past or (B, NKV, P, H)).astype(np.float32),
         "pv": rng.standard_normal(past or (B, NKV, P, H)).astype(np.float32),
         "sk": np.array([P + S - 1] * B if sk is None else sk, np.int32),
         "tot": np.array(P + S if tot is None else tot, np.int32)}
    if rotary:
        f["cos"] = rng.standard_normal((64, H // 2)).astype(np.float32)
        f["sin"] = rng.standard_normal((64, H // 2)).astype(np.float32)
    return f


# (case, feed arguments, onnxrun's message, onnxruntime's)
CASES = [
    ("seqlens_k beyond the cache", dict(sk=[20]), r"'seqlens_k' \[20\] is out of range \[0, 5\)",
     "out of range"),
    ("seqlens_k negative", dict(sk=[-1]), r"'seqlens_k' \[-1\] is out of range", "out of range"),
    ("seqlens_k of a batch", dict(B=2, sk=[4, 9]), r"\[4, 9\] is out of range", "out of range"),
    ("seqlens_k negative, first prompt", dict(S=3, P=0, sk=[-2]), r"\[-2\] is out of range",
     "out of range"),
    ("seqlens_k short of the new rows", dict(S=3, sk=[1], tot=7),
     r"'seqlens_k' \[1\] is too small for 3 new rows", "too small"),
    ("seqlens_k per sequence", dict(sk=[4, 4]), r"'seqlens_k' must hold batch_size \(1\) values",
     "batch_size"),
    ("total_sequence_length under the cache", dict(tot=2), r"out of range \[0, 4\).*past length 4",
     "out of range"),
    ("total_sequence_length under seqlens_k", dict(P=8, sk=[8], tot=5), r"out of range \[0, 8\)",
     "out of range"),
    ("total_sequence_length zero", dict(tot=0), "'total_sequence_length' must be positive, got 0",
     "positive"),
    ("total_sequence_length negative", dict(tot=-3), "must be positive, got -3", "positive"),
    ("total_sequence_length of two", dict(tot=[5, 5]), "'total_sequence_length' must hold one",
     "one element"),
    ("query of rank 2", dict(q=(1, 8 * 16)), r"'query' must have 3 dimensions.*\[1, 128\]",
     "3 dimensions"),
    ("query of rank 4", dict(q=(1, 1, 1, 8 * 16)), "'query' must have 3 dimensions",
     "3 dimensions"),
    ("past of rank 3", dict(past=(1, 8, 16)), r"'past_key' must have shape \[1, 2, past_sequence,",
     "4 dimensions"),
    ("past with other heads", dict(past=(1, 3, 4, 16)),
     r"'past_key' must have shape.*\[1, 3, 4, 16\]", "kv_num_heads"),
]


def _refused(sess, feed, match):
    with pytest.raises(onnxrun.InvalidArgument, match=match) as info:
        sess.run(None, feed)
    assert "'gqa' (GroupQueryAttention)" in str(info.value)  # the node, then the shapes
    assert "int32[" in str(info.value)


@pytest.mark.parametrize("case,kw,ours,theirs", CASES, ids=[c[0] for c in CASES])
def test_refused_where_onnxruntime_refuses(case, kw, ours, theirs):
    data = _model()
    feed = _feed(16, **kw)
    with pytest.raises(Exception, match=theirs):  # onnxruntime's verdict first
        ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feed)
    _refused(onnxrun.InferenceSession(data), feed, ours)  # head size 16: the compiled path


@pytest.mark.parametrize("case,kw,ours,theirs", CASES, ids=[c[0] for c in CASES])
def test_numpy_path_refuses_the_same(case, kw, ours, theirs):
    """Head size 12: the numpy paths (onnxruntime wants a multiple of 8, onnxrun runs it)."""
    kw = {k: (tuple(12 if d == 16 else 96 if d == 128 else d for d in v)
              if k in ("q", "past") else v) for k, v in kw.items()}
    _refused(onnxrun.InferenceSession(_model()), _feed(12, **kw),
             ours.replace("16", "12").replace("128", "96"))


@pytest.mark.parametrize("S,P", [(1, 4), (3, 0)])
def test_empty_batch_is_refused(S, P):
    _refused(onnxrun.InferenceSession(_model()), _feed(16, B=0, S=S, P=P, sk=[]),
             r"'query' has an empty batch \(shape \[0, ")


@pytest.mark.parametrize("kw,match", [(dict(tot=0), "must be positive, got 0"),
                                      (dict(sk=[9], tot=8, P=8), r"out of range \[0, 8\)"),
                                      (dict(sk=[-1], tot=8, P=8), r"out of range \[0, 8\)"),
                                      (dict(q=(1, 1), P=8, sk=[4], tot=8),
                                       "'query' must have 3 dimensions")])
def test_shared_buffer_decode_step_refuses(kw, match):
    """onnxrun.genai's decode step (a max_length buffer written in place, rotary) takes its
    own fast path only for a valid call; a bad one gets the same error."""
    so = onnxrun.SessionOptions()
    so.add_session_config_entry("onnxrun.past_present_share_buffer", "1")
    sess = onnxrun.InferenceSession(_model(rotary=True), so)
    good = _feed(16, P=8, sk=[4], tot=8, rotary=True)
    sess.run(None, good)  # the fast path itself works
    _refused(sess, _feed(16, rotary=True, **kw), match)


def test_valid_calls_still_equal_onnxruntime():
    data = _model()
    sess = onnxrun.InferenceSession(data)
    ref = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    for kw in (dict(), dict(S=3, P=0), dict(S=3, P=4, sk=[6], tot=7), dict(B=2, sk=[2, 4])):
        feed = _feed(16, **kw)
        for got, want in zip(sess.run(None, feed), ref.run(None, feed), strict=True):
            np.testing.assert_array_equal(got, want)


def test_attributes_one_reading_for_both_providers():
    """The CPU and CUDA kernels read GroupQueryAttention's attributes through one function:
    the same fields, the per-head norm epsilons defaulting to qk_norm_epsilon, and
    num_heads not a multiple of kv_num_heads refused."""
    from onnxrun.providers.cpu.ops.contrib.transformer import GQAAttributes, gqa_attributes

    a = gqa_attributes(num_heads=8, kv_num_heads=2, local_window_size=16, do_rotary=1,
                       smooth_softmax=1, qk_norm_epsilon=1e-5, k_norm_epsilon=1e-3)
    assert a == GQAAttributes(8, 2, 0.0, 0.0, 16, True, False, True, True, 1e-5, 1e-3)
    with pytest.raises(ValueError, match="num_heads 6 is not a multiple of kv_num_heads 4"):
        gqa_attributes(num_heads=6, kv_num_heads=4)
