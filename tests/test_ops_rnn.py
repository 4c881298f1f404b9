"""LSTM, GRU and RNN against onnxruntime (layout 0) and the onnx reference evaluator (layout 1)."""

from __future__ import annotations

import zlib

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper
from onnx.reference import ReferenceEvaluator

import onnxrun

T, B, I, H = 5, 3, 4, 6
N_GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
OUTPUTS = {"LSTM": ["Y", "Y_h", "Y_c"], "GRU": ["Y", "Y_h"], "RNN": ["Y", "Y_h"]}
INPUT_NAMES = ["X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P"]


def _model(op, inputs, attrs, *, outputs=None, opset=14, constant=()):
    """One-node model; ``inputs`` maps schema input names to arrays (missing ones are absent),
    those named in ``constant`` become initializers."""
    names = INPUT_NAMES[: max(INPUT_NAMES.index(n) for n in inputs) + 1]
    graph_inputs, inits = [], []
    for n in names:
        if n not in inputs:
            continue
        v = inputs[n]
        if n in constant:
            inits.append(helper.make_tensor(n, helper.np_dtype_to_tensor_dtype(v.dtype),
                                            v.shape, v.ravel().tolist()))
        else:
            graph_inputs.append(helper.make_tensor_value_info(
                n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape))
    outputs = outputs or OUTPUTS[op]
    elem = helper.np_dtype_to_tensor_dtype(inputs["X"].dtype)
    node = helper.make_node(op, [n if n in inputs else "" for n in names], outputs, **attrs)
    graph_outputs = [helper.make_tensor_value_info(o, elem, [None] * (4 if o == "Y" else 3))
                     for o in outputs if o]
    graph = helper.make_graph([node], "g", graph_inputs, graph_outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    feeds = {n: v for n, v in inputs.items() if n not in constant}
    return model, feeds


def _inputs(op, rng, direction, *, seq_lens=False, init=False, peepholes=False, bias=True,
            dtype=np.float32, layout=0):
    D = 2 if direction == "bidirectional" else 1
    G = N_GATES[op]
    x_shape = (B, T, I) if layout else (T, B, I)
    s_shape = (B, D, H) if layout else (D, B, H)
    inputs = {
        "X": rng.standard_normal(x_shape).astype(dtype),
        "W": (rng.standard_normal((D, G * H, I)) * 0.5).astype(dtype),
        "R": (rng.standard_normal((D, G * H, H)) * 0.5).astype(dtype),
    }
    if bias:
        inputs["B"] = rng.standard_normal((D, 2 * G * H)).astype(dtype)
    if seq_lens:
        inputs["sequence_lens"] = np.array([T, 2, 4], np.int32)
    if init:
        inputs["initial_h"] = rng.standard_normal(s_shape).astype(dtype)
        if op == "LSTM":
            inputs["initial_c"] = rng.standard_normal(s_shape).astype(dtype)
    if peepholes:
        inputs["P"] = rng.standard_normal((D, 3 * H)).astype(dtype)
    return inputs


def _compare(model, feeds, rtol=1e-4, atol=1e-5):
    data = model.SerializeToString()
    expected = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)
    got = onnxrun.InferenceSession(data).run(None, feeds)
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        assert g.dtype == e.dtype
        assert g.shape == e.shape
        np.testing.assert_allclose(g, e, rtol=rtol, atol=atol)
    return got


DIRECTIONS = ["forward", "reverse", "bidirectional"]


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("seq_lens", [False, True])
@pytest.mark.parametrize("init", [False, True])
def test_against_onnxruntime(op, direction, seq_lens, init):
    rng = np.random.default_rng(zlib.crc32(f"{op}{direction}{seq_lens}{init}".encode()))
    inputs = _inputs(op, rng, direction, seq_lens=seq_lens, init=init, bias=init)
    model, feeds = _model(op, inputs, {"hidden_size": H, "direction": direction})
    _compare(model, feeds)


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("direction", DIRECTIONS)
def test_constant_weights(op, direction):
    rng = np.random.default_rng(7)
    inputs = _inputs(op, rng, direction, seq_lens=True, init=True,
                     peepholes=op == "LSTM")
    model, feeds = _model(op, inputs, {"hidden_size": H, "direction": direction},
                          constant=("W", "R", "B", "P"))
    _compare(model, feeds)


@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("clip", [None, 0.7])
@pytest.mark.parametrize("input_forget", [0, 1])
def test_lstm_peepholes_clip_input_forget(direction, clip, input_forget):
    rng = np.random.default_rng(11)
    inputs = _inputs("LSTM", rng, direction, seq_lens=True, init=True, peepholes=True)
    attrs = {"hidden_size": H, "direction": direction, "input_forget": input_forget}
    if clip is not None:
        attrs["clip"] = clip
    model, feeds = _model("LSTM", inputs, attrs)
    _compare(model, feeds)


def _non_finite_x(x: np.ndarray) -> np.ndarray:
    """X with a NaN time step of one sequence, an inf and a -inf element."""
    x = x.copy()
    x[1, 0] = np.nan
    x[2, 1, 0] = np.inf
    x[3, 2, 1] = -np.inf
    return x


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("clip", [None, 0.7])
@pytest.mark.parametrize("op,variant", [("LSTM", "plain"), ("LSTM", "peepholes"),
                                        ("GRU", "plain"), ("GRU", "linear_before_reset")])
@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
def test_non_finite_inputs(bias, clip, op, variant, direction):
    """onnxruntime clips a biased LSTM's or GRU's gates with std::min/max, which turn a NaN
    into +clip (FLT_MAX without one): a NaN input gives finite outputs there, NaN without B."""
    rng = np.random.default_rng(17)
    inputs = _inputs(op, rng, direction, peepholes=variant == "peepholes", bias=bias)
    inputs["X"] = _non_finite_x(inputs["X"])
    attrs = {"hidden_size": H, "direction": direction}
    if clip is not None:
        attrs["clip"] = clip
    if variant == "linear_before_reset":
        attrs["linear_before_reset"] = 1
    model, feeds = _model(op, inputs, attrs, constant=("W", "R", "B", "P"))
    got = _compare(model, feeds)  # NaN where onnxruntime has NaN, values elsewhere
    assert np.isnan(got[0]).any() != bias


@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("linear_before_reset", [0, 1])
@pytest.mark.parametrize("clip", [None, 0.5])
def test_gru_linear_before_reset(direction, linear_before_reset, clip):
    rng = np.random.default_rng(13)
    inputs = _inputs("GRU", rng, direction, seq_lens=True, init=True)
    attrs = {"hidden_size": H, "direction": direction, "linear_before_reset": linear_before_reset}
    if clip is not None:
        attrs["clip"] = clip
    model, feeds = _model("GRU", inputs, attrs)
    _compare(model, feeds)


@pytest.mark.parametrize(
    "op,acts,alpha,beta",
    [
        ("RNN", ["Relu", "Sigmoid"], None, None),
        ("RNN", ["HardSigmoid", "LeakyRelu"], [0.3, 0.05], [0.4]),
        ("RNN", ["Affine", "ScaledTanh"], [0.5, 1.5], [0.1, 0.7]),
        ("RNN", ["Elu", "Softsign"], [0.8], None),
        ("RNN", ["Softplus", "ThresholdedRelu"], [0.2], None),
        ("GRU", ["HardSigmoid", "Tanh", "Sigmoid", "LeakyRelu"], [0.25, 0.02], [0.5]),
        ("LSTM", ["Sigmoid", "Tanh", "Relu", "HardSigmoid", "Softsign", "Tanh"],
         [0.1], [0.6]),
    ],
)
def test_activations(op, acts, alpha, beta):
    rng = np.random.default_rng(17)
    inputs = _inputs(op, rng, "bidirectional", init=True)
    attrs = {"hidden_size": H, "direction": "bidirectional", "activations": acts}
    if alpha is not None:
        attrs["activation_alpha"] = alpha
    if beta is not None:
        attrs["activation_beta"] = beta
    model, feeds = _model(op, inputs, attrs)
    _compare(model, feeds)


@pytest.mark.parametrize("op,opset", [("LSTM", 7), ("GRU", 7), ("RNN", 7),
                                      ("LSTM", 22), ("GRU", 22), ("RNN", 22)])
def test_other_opsets(op, opset):
    rng = np.random.default_rng(19)
    inputs = _inputs(op, rng, "bidirectional", seq_lens=True, init=True)
    model, feeds = _model(op, inputs, {"hidden_size": H, "direction": "bidirectional"},
                          opset=opset)
    _compare(model, feeds)


@pytest.mark.parametrize("op,opset", [("LSTM", 1), ("GRU", 1), ("GRU", 3), ("RNN", 1)])
def test_opsets_before_7(op, opset):
    """onnxruntime has no kernels below opset 7: the semantics equal opset 7's."""
    rng = np.random.default_rng(53)
    inputs = _inputs(op, rng, "bidirectional", seq_lens=True, init=True)
    attrs = {"hidden_size": H, "direction": "bidirectional"}
    old, feeds = _model(op, inputs, {**attrs, "output_sequence": 1}, opset=opset)
    new, _ = _model(op, inputs, attrs, opset=7)
    got = onnxrun.InferenceSession(old.SerializeToString()).run(None, feeds)
    want = ort.InferenceSession(new.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, feeds)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("direction", DIRECTIONS)
def test_float64(op, direction):
    """onnxruntime refuses double at run time: check against the reference evaluator."""
    rng = np.random.default_rng(23)
    inputs = _inputs(op, rng, direction, init=True, dtype=np.float64)
    model, feeds = _model(op, inputs, {"hidden_size": H, "direction": direction})
    got = onnxrun.InferenceSession(model.SerializeToString()).run(None, feeds)
    want = ReferenceEvaluator(model).run(None, feeds)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == np.float64
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12)


def test_zero_length_sequence():
    rng = np.random.default_rng(29)
    inputs = _inputs("LSTM", rng, "bidirectional", init=True)
    inputs["sequence_lens"] = np.array([0, 2, T], np.int32)
    model, feeds = _model("LSTM", inputs, {"hidden_size": H, "direction": "bidirectional"})
    _compare(model, feeds)


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
def test_only_final_state(op):
    rng = np.random.default_rng(31)
    inputs = _inputs(op, rng, "reverse", seq_lens=True, init=True)
    outputs = ["", "Y_h"] + (["Y_c"] if op == "LSTM" else [])
    model, feeds = _model(op, inputs, {"hidden_size": H, "direction": "reverse"},
                          outputs=outputs)
    _compare(model, feeds)


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("direction", DIRECTIONS)
def test_layout_1(op, direction):
    """onnxruntime's CPU kernels refuse layout 1: check against layout 0 on transposed data,
    and against the reference evaluator."""
    rng = np.random.default_rng(37)
    inputs = _inputs(op, rng, direction, seq_lens=True, init=True, layout=1)
    attrs = {"hidden_size": H, "direction": direction}
    model1, feeds1 = _model(op, inputs, {**attrs, "layout": 1})
    got1 = onnxrun.InferenceSession(model1.SerializeToString()).run(None, feeds1)

    inputs0 = dict(inputs)
    inputs0["X"] = np.ascontiguousarray(inputs["X"].transpose(1, 0, 2))
    for n in ("initial_h", "initial_c"):
        if n in inputs:
            inputs0[n] = np.ascontiguousarray(inputs[n].transpose(1, 0, 2))
    model0, feeds0 = _model(op, inputs0, attrs)
    got0 = _compare(model0, feeds0)
    np.testing.assert_allclose(got1[0], got0[0].transpose(2, 0, 1, 3), rtol=1e-6, atol=1e-6)
    for g1, g0 in zip(got1[1:], got0[1:], strict=True):
        np.testing.assert_allclose(g1, g0.transpose(1, 0, 2), rtol=1e-6, atol=1e-6)

    # The reference evaluator ignores sequence_lens: compare full-length sequences.
    del inputs["sequence_lens"]
    model1, feeds1 = _model(op, inputs, {**attrs, "layout": 1})
    got1 = onnxrun.InferenceSession(model1.SerializeToString()).run(None, feeds1)
    ref = ReferenceEvaluator(model1).run(None, feeds1)
    for g, e in zip(got1, ref, strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-5)


def test_float16():
    rng = np.random.default_rng(41)
    inputs = _inputs("GRU", rng, "forward", init=True, dtype=np.float16)
    model, feeds = _model("GRU", inputs, {"hidden_size": H})
    got = onnxrun.InferenceSession(model.SerializeToString()).run(None, feeds)
    f32 = {k: v.astype(np.float32) if v.dtype == np.float16 else v for k, v in inputs.items()}
    model32, feeds32 = _model("GRU", f32, {"hidden_size": H})
    want = onnxrun.InferenceSession(model32.SerializeToString()).run(None, feeds32)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == np.float16
        np.testing.assert_allclose(g.astype(np.float32), w, rtol=1e-2, atol=1e-2)


def test_session_reuse_and_weight_prep_are_stateless():
    rng = np.random.default_rng(43)
    inputs = _inputs("LSTM", rng, "bidirectional", init=True, peepholes=True)
    model, feeds = _model("LSTM", inputs, {"hidden_size": H, "direction": "bidirectional"},
                          constant=("W", "R", "B", "P"))
    sess = onnxrun.InferenceSession(model.SerializeToString())
    first = sess.run(None, feeds)
    feeds2 = {**feeds, "X": rng.standard_normal((T, B, I)).astype(np.float32)}
    sess.run(None, feeds2)
    again = sess.run(None, feeds)
    for a, b in zip(first, again, strict=True):
        np.testing.assert_array_equal(a, b)


def test_hidden_size_mismatch_is_an_error():
    rng = np.random.default_rng(47)
    inputs = _inputs("RNN", rng, "forward")
    model, feeds = _model("RNN", inputs, {"hidden_size": H})
    model.graph.node[0].attribute[0].i = H + 1
    with pytest.raises(Exception, match="hidden"):
        sess = onnxrun.InferenceSession(model.SerializeToString())
        sess.run(None, feeds)


def test_input_weights_transposed_in_blocks_keep_the_bits():
    # W^T of a weight above rnn._WT_BLOCKED_BYTES is copied 16 rows at a time (1000 rows: a
    # short last block), below it in one copy: both the plain transpose, C-contiguous
    from onnxrun.providers.cpu.ops import rnn

    rng = np.random.default_rng(3)
    for shape in [(1, 1000, 700), (2, 8, 5)]:
        W = rng.standard_normal(shape).astype(np.float32)
        for dt in (np.float32, np.float64):
            got = rnn._wt(W, np.dtype(dt))
            want = np.ascontiguousarray(W.astype(dt).reshape(-1, shape[2]).T)
            assert got.flags.c_contiguous and got.dtype == want.dtype
            assert got.tobytes() == want.tobytes()
