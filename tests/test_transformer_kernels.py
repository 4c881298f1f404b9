"""The fast paths of the transformer and recurrent kernels against onnxruntime, at one and two
intra-op threads: com.microsoft Attention (exp2 softmax without a max pass, skipped padding keys,
0/1 masks, the stable recomputation of blocks that overflow or are fully masked), the gelu
family (a sigmoid of a fitted polynomial, blocked), and the LSTM cell that takes one tanh over its
four gates."""

from __future__ import annotations

import math

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxrun
from onnxrun.api import session as session_module
from onnxrun.providers.cpu.ops import attention
from onnxrun.providers.cpu.ops.attention import softmax_
from onnxrun.providers.cpu.ops.elementwise import gelu_float32

MS = "com.microsoft"
RNG = np.random.default_rng(11)


def f32(*shape, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def model(op, inputs, consts=None, *, n_out=1, domain=MS, opset=17, **attrs):
    """One node; ``inputs`` maps names to arrays fed at run time (None: absent), ``consts``
    names to initializers; the node reads them in the order given (inputs first)."""
    consts = consts or {}
    names = [n if a is not None else "" for n, a in inputs.items()] + list(consts)
    graph_inputs = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype),
                                                  a.shape)
                    for n, a in inputs.items() if a is not None]
    outs = [f"out{i}" for i in range(n_out)]
    node = helper.make_node(op, names, outs, domain=domain, **attrs)
    graph = helper.make_graph(
        [node], "g", graph_inputs,
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outs],
        initializer=[numpy_helper.from_array(a, n) for n, a in consts.items()])
    opsets = [helper.make_opsetid("", opset), helper.make_opsetid(MS, 1)]
    feeds = {n: a for n, a in inputs.items() if a is not None}
    return helper.make_model(graph, opset_imports=opsets, ir_version=9).SerializeToString(), feeds


@pytest.fixture(autouse=True)
def blas_threads_left_alone(monkeypatch):
    """onnxrun hands intra_op_num_threads to BLAS for each run, and OpenBLAS's Haswell sgemm (its
    kernel on AVX2 CPUs) rounds differently at 1 and 2 threads for some shapes: 72x16 @ 16x512,
    the bidirectional LSTM's input projection, moves by 3e-6 (on the AVX-512 CI machines it did
    not). The exact comparison below is of onnxrun's own threads (an LSTM's directions, blocks of
    attention), so BLAS keeps one thread count throughout."""
    monkeypatch.setattr(session_module, "_blas_libraries", list)


def check(data, feeds, rtol=1e-4, atol=1e-5):
    """onnxrun at 1 and 2 intra-op threads against onnxruntime; the two agree exactly."""
    so = ort.SessionOptions()
    so.log_severity_level = 3
    expected = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"]).run(None, feeds)
    runs = []
    for threads in (1, 2):
        opts = onnxrun.SessionOptions()
        opts.intra_op_num_threads = threads
        runs.append(onnxrun.InferenceSession(data, opts).run(None, feeds))
    for one, two, e in zip(*runs, expected, strict=True):
        assert one.shape == e.shape and one.dtype == e.dtype
        np.testing.assert_allclose(one, e, rtol=rtol, atol=atol)
        np.testing.assert_array_equal(one, two)


# -- com.microsoft Attention ----------------------------------------------------------------------

B, S, HID, HEADS = 2, 96, 128, 8
X = f32(B, S, HID)
W, BIAS = f32(HID, 3 * HID, scale=0.1), f32(3 * HID, scale=0.1)
LOWEST = float(np.finfo(np.float32).min)


def prefix_mask(*valid):
    mask = np.zeros((B, S), np.int32)
    for b, n in enumerate(valid):
        mask[b, :n] = 1
    return mask


ATTENTION = {
    "no mask": ({}, {}),
    "padding keys skipped": ({"mask": prefix_mask(S, S - 7)}, {"mask_filter_value": LOWEST}),
    "padding keys, default filter": ({"mask": prefix_mask(S - 20, S - 3)}, {}),
    "key lengths": ({"mask": np.array([S - 5, S], np.int32)}, {}),
    "start and end": ({"mask": np.array([S - 1, S, 4, 0], np.int32)}, {}),
    "mask with holes": ({"mask": RNG.integers(0, 2, (B, S)).astype(np.int32)}, {}),
    "mild filter": ({"mask": prefix_mask(S - 9, S)}, {"mask_filter_value": -1.0}),
    "3-D mask": ({"mask": RNG.integers(0, 2, (B, S, S)).astype(np.int32)}, {}),
    "fully masked batch": ({"mask": prefix_mask(0, S - 2)}, {"mask_filter_value": LOWEST}),
    "causal": ({}, {"unidirectional": 1}),
    "causal padding": ({"mask": prefix_mask(S, S - 11)}, {"unidirectional": 1}),
}


def attention_model(mask, attrs, *, const=True, x=X):
    """Attention(X, W, b[, mask]) with W and b initializers or graph inputs."""
    weights = {"W": W, "b": BIAS}
    fed = {"X": x, **({} if const else weights), **mask}
    graph_inputs = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype),
                                                  a.shape) for n, a in fed.items()]
    node = helper.make_node("Attention", ["X", "W", "b", *mask], ["out0"], domain=MS,
                            num_heads=HEADS, **attrs)
    graph = helper.make_graph(
        [node], "g", graph_inputs,
        [helper.make_tensor_value_info("out0", TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(a, n) for n, a in weights.items()] if const else [])
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=9).SerializeToString(), fed


@pytest.mark.parametrize("mask, attrs", ATTENTION.values(), ids=ATTENTION.keys())
@pytest.mark.parametrize("const", [True, False], ids=["const weights", "weights fed"])
def test_attention(mask, attrs, const):
    check(*attention_model(mask, attrs, const=const))


@pytest.mark.parametrize("attrs", [{"mask_filter_value": LOWEST}, {}, {"unidirectional": 1}])
def test_attention_masking_remembered_for_the_same_mask_only(attrs):
    """A session keeps the last mask's masking (its key ranges, keep or bias) for a mask of
    the same bytes: masks that change between runs (same shape, other padding, holes, a key
    length given instead) give what a fresh session gives for each."""
    data, _ = attention_model({"mask": prefix_mask(S, S - 7)}, attrs)
    sess = onnxrun.InferenceSession(data)
    masks = [prefix_mask(S, S - 7), prefix_mask(S - 30, S), prefix_mask(S, S - 7),
             RNG.integers(0, 2, (B, S)).astype(np.int32), prefix_mask(S, S - 7),
             prefix_mask(S, S).astype(np.int32)]
    for mask in masks:
        feeds = {"X": X, "mask": mask}
        fresh = onnxrun.InferenceSession(data).run(None, feeds)[0]
        np.testing.assert_array_equal(sess.run(None, feeds)[0], fresh)


def test_attention_constant_weights_held_once():
    """The kernel's scaled copies of constant W and b replace the initializers: the session
    drops its own (called with None for them), with onnxruntime's results."""
    data, feeds = attention_model({}, {})
    sess = onnxrun.InferenceSession(data)
    values = sess._model.graph.initializers
    assert values["W"].const_value is None and values["b"].const_value is None
    assert all(sess._program.template[sess._program.slot_of(values[n])] is None
               for n in ("W", "b"))
    expected = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)
    np.testing.assert_allclose(sess.run(None, feeds)[0], expected[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mask, attrs, x", [
    ({"mask": prefix_mask(S, S - 4)}, {}, X * 8),  # scores of hundreds: exp2 overflows
    ({"mask": prefix_mask(0, S - 2)}, {"mask_filter_value": LOWEST}, X),  # no key to attend
], ids=["overflow", "fully masked"])
def test_attention_blocks_recomputed_the_stable_way(monkeypatch, mask, attrs, x):
    calls = []

    def counted(scores, *args):
        calls.append(scores.shape)
        return softmax_(scores, *args)

    monkeypatch.setattr(attention, "softmax_", counted)
    check(*attention_model(mask, attrs, x=x), rtol=1e-3, atol=1e-3)  # outputs up to ~20
    assert calls


SPLIT_CASES = ["no mask", "padding keys skipped", "mask with holes", "mild filter", "causal"]


@pytest.mark.parametrize("case", SPLIT_CASES)
def test_attention_split_over_threads(monkeypatch, case):
    """At 2 threads the projection's ranges go to spin.py's workers, and so do the heads
    where compiled.attention_heads takes them (no mask, or padding keys skipped), else the
    blocks of heads go to parallel.py's (every split forced here): the bits of 1 thread,
    onnxruntime's values."""
    from onnxrun.providers.cpu import blas, parallel
    from onnxrun.providers.cpu.compiled import attention_heads, float_gemm, spin

    monkeypatch.setattr(parallel, "MIN_MACS_PER_RANGE", 1)
    monkeypatch.setattr(attention_heads, "SPLIT_MACS", 1)
    blocks, products = [], []
    run_ranges, run_blocks = parallel.run_ranges, spin.run_blocks

    def counted_ranges(fn, ranges):
        blocks.append(len(ranges))
        return run_ranges(fn, ranges)

    def counted_blocks(job, params, threads):
        products.append((len(params), threads))
        return run_blocks(job, params, threads)

    monkeypatch.setattr(parallel, "run_ranges", counted_ranges)
    monkeypatch.setattr(spin, "run_blocks", counted_blocks)
    check(*attention_model(*ATTENTION[case]))
    if case in ("no mask", "padding keys skipped") and blas.cblas_sgemm() is not None and \
            attention_heads.unavailable() is None:
        assert (B * HEADS, 2) in products  # every head a job on the workers
    else:
        assert blocks and max(blocks) >= 4  # B x heads cut into at least _MIN_BLOCKS blocks
    if float_gemm.unavailable() is None:
        assert any(n > 1 and threads == 2 for n, threads in products)


def test_attention_head_blocks():
    """Blocks of heads by the shapes alone: the cache bound, at least _MIN_BLOCKS blocks of
    at least parallel.MIN_MACS_PER_RANGE multiply-adds each where the work allows."""
    one_head = 128 * 128 * 64  # BERT-base's head at 128 tokens: 1M multiply-adds
    assert attention._head_blocks(2, 12, 128 * 128 * 4, one_head) == 6  # 4 blocks
    assert attention._head_blocks(1, 12, 128 * 128 * 4, one_head) == 4  # 3 of 4M each
    assert attention._head_blocks(1, 4, 32 * 4, 32 * 64) == 4  # a decode step: one block
    assert attention._head_blocks(8, 12, 128 * 128 * 4, one_head) == 12  # enough already
    assert attention._head_blocks(1, 64, 2048 * 2048 * 4, 2048 * 2048 * 128) == 1  # cache


def test_attention_past_and_key_lengths():
    past = f32(2, B, HEADS, 5, HID // HEADS)
    data, feeds = model("Attention", {"X": X, "W": W, "b": BIAS,
                                      "mask": np.array([S + 5, S], np.int32), "past": past},
                        n_out=2, num_heads=HEADS)
    check(data, feeds)


def test_attention_bias():
    data, feeds = model("Attention", {"X": X, "W": W, "b": BIAS, "mask": prefix_mask(S, S - 6),
                                      "past": None, "attention_bias": f32(1, HEADS, S, S)},
                        num_heads=HEADS)
    check(data, feeds)


# -- gelu family ----------------------------------------------------------------------------------


def test_gelu_float32_accuracy_and_limits():
    x = np.concatenate([np.linspace(-20, 20, 400001), [0.0, -0.0, 1e-30, -1e-30, 1e6, -1e6,
                                                       3e38, -3e38, np.inf, -np.inf, np.nan]])
    x = x.astype(np.float32)
    exact = np.array([v * 0.5 * math.erfc(-v / math.sqrt(2)) if math.isfinite(v) else np.nan
                      for v in x.astype(np.float64)])
    got = gelu_float32(x)
    finite = np.isfinite(exact)
    np.testing.assert_allclose(got[finite], exact[finite], rtol=2e-7, atol=7e-7)
    # -inf * Phi(-inf) = -inf * 0: NaN, as in onnxruntime
    assert got[x == np.inf] == np.inf and np.isnan(got[x == -np.inf]) and np.isnan(got[-1])
    y = x.copy()
    assert gelu_float32(y, out=y) is y
    np.testing.assert_array_equal(y, got)


@pytest.mark.parametrize("op, bias", [("BiasGelu", True), ("Gelu", False)])
def test_gelu_blocks(op, bias):
    x = f32(512, 1536, scale=3.0)  # 12 blocks
    data, feeds = model(op, {"X": x}, {"B": f32(1536)} if bias else None)
    check(data, feeds, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op, domain, opset", [("BiasGelu", MS, 17), ("Gelu", MS, 17),
                                               ("Gelu", "", 20)])
def test_gelu_rows_on_spin_workers(monkeypatch, op, domain, opset):
    """At 2 threads a large Gelu's rows go to spin.py's workers, with the bits of 1 thread."""
    from onnxrun.providers.cpu.compiled import gelu, spin

    if gelu.unavailable(attention_gelu_logit()) is not None:
        pytest.skip("compiled kernels unavailable")
    calls = []
    run_blocks = spin.run_blocks

    def counted(job, params, threads):
        calls.append((len(params), threads))
        return run_blocks(job, params, threads)

    monkeypatch.setattr(spin, "run_blocks", counted)
    consts = {"B": f32(1536)} if op == "BiasGelu" else None
    check(*model(op, {"X": f32(256, 1536, scale=3.0)}, consts, domain=domain, opset=opset),
          rtol=1e-5, atol=1e-6)
    assert calls and all(n > 1 and threads == 2 for n, threads in calls)


def attention_gelu_logit():
    from onnxrun.providers.cpu.ops.elementwise import _GELU_LOGIT

    return _GELU_LOGIT


def test_onnx_gelu_blocks():
    data, feeds = model("Gelu", {"X": f32(512, 1536, scale=3.0)}, domain="", opset=20)
    check(data, feeds, rtol=1e-5, atol=1e-6)


# -- LSTM -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("direction", ["bidirectional", "forward", "reverse"])
@pytest.mark.parametrize("variant", ["plain", "sequence lengths", "clip", "peepholes"])
def test_lstm(direction, variant):
    T, Bt, I, H = 24, 3, 16, 64
    D = 2 if direction == "bidirectional" else 1
    inputs = {"X": f32(T, Bt, I), "W": f32(D, 4 * H, I, scale=0.3),
              "R": f32(D, 4 * H, H, scale=0.3), "B": f32(D, 8 * H),
              "sequence_lens": np.array([T, 7, 15], np.int32) if variant == "sequence lengths"
              else None,
              "initial_h": f32(D, Bt, H), "initial_c": f32(D, Bt, H),
              "P": f32(D, 3 * H) if variant == "peepholes" else None}
    attrs = {"clip": 0.8} if variant == "clip" else {}
    data, feeds = model("LSTM", inputs, n_out=3, domain="", opset=14, hidden_size=H,
                        direction=direction, **attrs)
    check(data, feeds)


@pytest.mark.parametrize("peepholes", [False, True])
def test_lstm_constant_weights_held_once(peepholes):
    """W, R, B (and P) as initializers: the kernel's prepared weights replace them (the
    session drops its own), with onnxruntime's results."""
    T, Bt, I, H, D = 9, 2, 16, 32, 2
    consts = {"W": f32(D, 4 * H, I, scale=0.3), "R": f32(D, 4 * H, H, scale=0.3),
              "B": f32(D, 8 * H)}
    if peepholes:
        consts["P"] = f32(D, 3 * H)
    feeds = {"X": f32(T, Bt, I), "h0": f32(D, Bt, H), "c0": f32(D, Bt, H)}
    node = helper.make_node("LSTM", ["X", "W", "R", "B", "", "h0", "c0",
                                     "P" if peepholes else ""], ["Y", "Yh", "Yc"],
                            hidden_size=H, direction="bidirectional")
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, a.shape)
                      for n, a in feeds.items()],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in ("Y", "Yh", "Yc")],
        initializer=[numpy_helper.from_array(a, n) for n, a in consts.items()])
    data = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)],
                             ir_version=9).SerializeToString()
    sess = onnxrun.InferenceSession(data)
    values = sess._model.graph.initializers
    assert all(values[n].const_value is None for n in consts)
    check(data, feeds)


def test_qattention_weight_without_zero_point_is_kept():
    """QAttention dequantizes a constant weight once only with its scale and zero point
    constant; without a zero point it dequantizes per run, so the session keeps the int8
    weight (the float Attention's release must not apply to it)."""
    rng = np.random.default_rng(5)
    Wq = rng.integers(-20, 20, (HID, 3 * HID)).astype(np.int8)
    consts = {"W": Wq, "b": BIAS, "ws": np.array(0.01, np.float32)}
    x = rng.integers(0, 255, (B, S, HID)).astype(np.uint8)
    feeds = {"X": x, "xs": np.array(0.02, np.float32)}
    node = helper.make_node("QAttention", ["X", "W", "b", "xs", "ws"], ["out0"], domain=MS,
                            num_heads=HEADS)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("X", TensorProto.UINT8, x.shape),
                      helper.make_tensor_value_info("xs", TensorProto.FLOAT, [])],
        [helper.make_tensor_value_info("out0", TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(a, n) for n, a in consts.items()])
    data = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid(MS, 1)],
                             ir_version=9).SerializeToString()
    expected = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)
    got = onnxrun.InferenceSession(data).run(None, feeds)
    np.testing.assert_allclose(got[0], expected[0], rtol=1e-4, atol=1e-4)
