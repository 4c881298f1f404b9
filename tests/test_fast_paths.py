"""The speed-ups of session creation and of the run loop compute what the plain paths computed.

- the loader reads large raw_data weights from the file's bytes (load.py's wire scanner): same
  arrays, aligned, and the same errors as parsing the whole model;
- the pass manager skips a pass that found nothing until another pass changes the graph;
- elementwise nodes of a known type run their ufunc directly; the run loop reports errors with
  the node's context;
- blocked float32 erf / Gelu / BiasGelu, FusedGemm with a constant B (no copy), the layer
  normalization of SkipLayerNormalization.
"""

from __future__ import annotations

import math
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxrun
from onnxrun import load
from onnxrun.optimize import manager
from onnxrun.optimize.base import GraphPass, PassResult

RNG = np.random.default_rng(5)


def _model_with_weights(*, functions: bool = False) -> onnx.ModelProto:
    """Y = ((X @ W) + b) * s, with weights of several types: float32 large and small, float16,
    bfloat16, int8 and int4 (packed) initializers, a string initializer, a segment-free tensor
    with typed float_data."""
    W = RNG.standard_normal((64, 48)).astype(np.float32)
    b = RNG.standard_normal(48).astype(np.float32)
    inits = [
        numpy_helper.from_array(W, "W"),
        numpy_helper.from_array(b, "b"),
        helper.make_tensor("s", TensorProto.FLOAT, [], [0.5]),  # float_data, not raw
        numpy_helper.from_array(RNG.standard_normal((40, 30)).astype(np.float16), "h"),
        numpy_helper.from_array(RNG.integers(-100, 100, (50, 40)).astype(np.int8), "i8"),
        helper.make_tensor("bf", TensorProto.BFLOAT16, [600],
                           RNG.standard_normal(600).astype(ml_dtypes.bfloat16).view(np.uint16)
                           .tobytes(), raw=True),
        helper.make_tensor("i4", TensorProto.INT4, [3000],
                           RNG.integers(-8, 8, 3000).astype(np.int8).tolist()),
        helper.make_tensor("str", TensorProto.STRING, [2], [b"a", b"bc"]),
    ]
    nodes = [
        helper.make_node("MatMul", ["X", "W"], ["XW"]),
        helper.make_node("Add", ["XW", "b"], ["XWb"]),
        helper.make_node("Mul", ["XWb", "s"], ["Y"]),
        helper.make_node("Cast", ["h"], ["H32"], to=TensorProto.FLOAT),
        helper.make_node("Identity", ["i8"], ["I8"]),
        helper.make_node("Cast", ["bf"], ["BF"], to=TensorProto.FLOAT),
        helper.make_node("Cast", ["i4"], ["I4"], to=TensorProto.INT8),
        helper.make_node("Identity", ["str"], ["S"]),
    ]
    outputs = [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, 48]),
               helper.make_tensor_value_info("H32", TensorProto.FLOAT, [40, 30]),
               helper.make_tensor_value_info("I8", TensorProto.INT8, [50, 40]),
               helper.make_tensor_value_info("BF", TensorProto.FLOAT, [600]),
               helper.make_tensor_value_info("I4", TensorProto.INT8, [3000]),
               helper.make_tensor_value_info("S", TensorProto.STRING, [2])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("X", 1, [2, 64])],
                              outputs, inits)
    opsets = [helper.make_opsetid("", 21)]
    model_functions = []
    if functions:
        opsets.append(helper.make_opsetid("local", 1))
        model_functions.append(helper.make_function(
            "local", "Twice", ["A"], ["B"], [helper.make_node("Add", ["A", "A"], ["B"])],
            [helper.make_opsetid("", 21)]))
        graph.node.append(helper.make_node("Twice", ["Y"], ["Y2"], domain="local"))
        graph.output.append(helper.make_tensor_value_info("Y2", TensorProto.FLOAT, [2, 48]))
    return helper.make_model(graph, opset_imports=opsets, ir_version=10,
                             functions=model_functions)


def _expected_initializers(mp: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in mp.graph.initializer}


@pytest.mark.parametrize("functions", [False, True])
@pytest.mark.parametrize("how", ["path", "bytes"])
def test_weights_read_from_the_file_match_the_proto(tmp_path: Path, how: str, functions: bool):
    mp = _model_with_weights(functions=functions)
    data = mp.SerializeToString()
    split = load._strip_weights(data)
    if functions:
        assert split is None  # functions are inlined on the proto: read as a whole
    else:
        stripped, raw = split
        assert len(stripped) < len(data) and sum(r is not None for r in raw) >= 3
    path = tmp_path / "m.onnx"
    path.write_bytes(data)
    _, model = load.load_model(str(path) if how == "path" else data)
    for name, want in _expected_initializers(mp).items():
        got = model.graph.initializers[name].const_value
        assert got.dtype == want.dtype and got.shape == want.shape, name
        assert got.flags.aligned and not got.flags.writeable, name
        if want.dtype.kind == "O":
            assert [str(x) for x in got.ravel()] == [str(x) for x in want.ravel()]
        else:
            assert got.tobytes() == want.tobytes(), name
    X = RNG.standard_normal((2, 64)).astype(np.float32)
    got = onnxrun.InferenceSession(str(path) if how == "path" else data).run(None, {"X": X})
    W, b = (numpy_helper.to_array(t) for t in mp.graph.initializer[:2])
    np.testing.assert_allclose(got[0], (X @ W + b) * 0.5, rtol=1e-5, atol=1e-5)


def _outcome(data: bytes) -> str:
    try:
        _, model = load.load_model(data)
    except onnxrun.InvalidProtobuf as e:  # the message names no offset: compare it whole
        return f"InvalidProtobuf: {e}"
    except Exception as e:  # noqa: BLE001 - any other refusal, compared by type and message
        return f"{type(e).__name__}: {e}"
    def fingerprint(a: np.ndarray) -> str:
        data = repr(a.tolist()).encode() if a.dtype.kind == "O" else a.tobytes()
        return f"{a.dtype}{a.shape}{hash(data)}"

    return "ok: " + ",".join(
        f"{n}={fingerprint(v.const_value)}" for n, v in model.graph.initializers.items())


def test_damaged_models_fail_as_when_parsed_whole(monkeypatch):
    """Cut or corrupted files: the scanner either reads them as protobuf would or steps aside,
    so that the outcome (the arrays, or the error) is that of parsing the whole model."""
    data = _model_with_weights().SerializeToString()
    cuts = sorted({1, 2, 5, 17, len(data) // 3, len(data) // 2, len(data) - 1,
                   *RNG.integers(1, len(data), 25).tolist()})
    variants = [data[:c] for c in cuts]
    for pos in RNG.integers(0, len(data), 25).tolist():
        damaged = bytearray(data)
        damaged[pos] ^= 0xFF
        variants.append(bytes(damaged))
    fast = [_outcome(v) for v in variants]
    monkeypatch.setattr(load, "_strip_weights", lambda data: None)
    slow = [_outcome(v) for v in variants]
    assert fast == slow


def test_graph_field_twice_is_left_to_protobuf():
    """Protobuf merges a message field that appears twice; the scanner does not try."""
    data = _model_with_weights().SerializeToString()
    extra = onnx.ModelProto(graph=onnx.GraphProto(name="more")).SerializeToString()
    assert load._strip_weights(data + extra) is None
    assert _outcome(data + extra).startswith("ok")


# -- pass manager ------------------------------------------------------------------------------


class _Counting(GraphPass):
    def __init__(self, name: str, changes: int) -> None:
        self.name, self.left, self.runs = name, changes, 0

    def run(self, model):
        self.runs += 1
        if self.left:
            self.left -= 1
            return PassResult(True)
        return PassResult(False)


def test_a_clean_pass_waits_for_another_change(monkeypatch):
    a, b, c = _Counting("a", 0), _Counting("b", 2), _Counting("c", 0)
    monkeypatch.setattr(manager, "select_passes", lambda level, disabled: [a, b, c])
    model = onnxrun.ir.model_from_proto(_model_with_weights())
    report = manager.run_passes(model, 99)
    # round 1: a clean, b changes, c clean; round 2: a and c rerun (b changed), b changes;
    # round 3: a reruns, b finds nothing, c is skipped (it ran after b's last change).
    assert (a.runs, b.runs, c.runs) == (3, 3, 2)
    assert report.rounds == 3 and report.passes["c"].runs == 2


# -- run loop and elementwise kernels ----------------------------------------------------------


def _binary_model(op: str, dtype: int) -> bytes:
    out = TensorProto.BOOL if op in ("Equal", "Less") else dtype
    graph = helper.make_graph(
        [helper.make_node(op, ["A", "B"], ["C"])], "g",
        [helper.make_tensor_value_info("A", dtype, [3, 4]),
         helper.make_tensor_value_info("B", dtype, [4])],
        [helper.make_tensor_value_info("C", out, [3, 4])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                             ir_version=8).SerializeToString()


@pytest.mark.parametrize("op, ufunc", [("Add", np.add), ("Sub", np.subtract),
                                       ("Mul", np.multiply), ("Div", np.true_divide),
                                       ("Equal", np.equal), ("Less", np.less)])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int64])
def test_elementwise_kernels_of_a_known_type(op: str, ufunc, dtype):
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    sess = onnxrun.InferenceSession(_binary_model(op, elem))
    kernel = sess._program.steps[0].kernel
    bare = dtype == np.float32 or (dtype == np.int64 and op not in ("Div",))
    assert (kernel is ufunc) == bare
    A = (RNG.standard_normal((3, 4)) * 4).astype(dtype)
    B = (RNG.standard_normal(4) * 4 + 9).astype(dtype)
    got = sess.run(None, {"A": A, "B": B})[0]
    if op == "Div" and dtype == np.int64:
        want = np.trunc(A / B).astype(np.int64)
    elif dtype == np.float16 and op in ("Add", "Sub", "Mul", "Div"):
        want = ufunc(A.astype(np.float32), B.astype(np.float32)).astype(np.float16)
    else:
        want = ufunc(A, B)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


def test_run_errors_name_the_node():
    graph = helper.make_graph(
        [helper.make_node("Relu", ["X"], ["R"], name="first"),
         helper.make_node("Reshape", ["R", "S"], ["Z"], name="the_reshape")], "g",
        [helper.make_tensor_value_info("X", 1, [2, 3]),
         helper.make_tensor_value_info("S", TensorProto.INT64, [2])],
        [helper.make_tensor_value_info("Z", 1, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    sess = onnxrun.InferenceSession(model.SerializeToString())
    X = np.ones((2, 3), np.float32)
    assert sess.run(None, {"X": X, "S": np.array([3, 2])})[0].shape == (3, 2)
    with pytest.raises(onnxrun.RuntimeException, match=r"'the_reshape' \(Reshape\).*float\[2,3\]"):
        sess.run(None, {"X": X, "S": np.array([4, 5])})


# -- kernels -----------------------------------------------------------------------------------


def _erf64(x: np.ndarray) -> np.ndarray:
    return np.vectorize(math.erf, otypes=[np.float64])(x.astype(np.float64))


@pytest.mark.parametrize("shape", [(0,), (1,), (7, 3), (2, 128, 300), (32768 + 5,)])
def test_blocked_erf_and_gelu(shape):
    from onnxrun.providers.cpu.ops.contrib.fused import gelu_
    from onnxrun.providers.cpu.ops.elementwise import erf

    x = (RNG.standard_normal(shape) * 3).astype(np.float32)
    x.reshape(-1)[:3] = [0.0, 40.0, -40.0][: x.size]
    got = erf(x)
    assert got.dtype == np.float32 and got.shape == x.shape
    np.testing.assert_allclose(got, _erf64(x), atol=1e-6)
    y = gelu_(x.copy())
    want = x.astype(np.float64) * 0.5 * (1 + _erf64(x / math.sqrt(2)))
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=5e-6)  # 5e-6: gelu(-40)
    strided = x.T if x.ndim > 1 else x[::2]
    np.testing.assert_allclose(erf(strided), _erf64(strided), atol=1e-6)


def _one_node(op: str, inputs: dict[str, np.ndarray], inits: dict[str, np.ndarray] | None = None,
              n_out: int = 1, domain: str = "com.microsoft", **attrs) -> list[np.ndarray]:
    inits = inits or {}
    names = list(inputs) + list(inits)
    node = helper.make_node(op, names, [f"y{i}" for i in range(n_out)], domain=domain, **attrs)
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
         for k, v in inputs.items()],
        [helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, None) for i in range(n_out)],
        [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)],
                              ir_version=8)
    so = onnxrun.SessionOptions()
    so.graph_optimization_level = onnxrun.GraphOptimizationLevel.ORT_DISABLE_ALL
    return onnxrun.InferenceSession(model.SerializeToString(), so).run(None, inputs)


def test_bias_gelu_and_gelu20():
    A = RNG.standard_normal((2, 9, 1536)).astype(np.float32)
    b = RNG.standard_normal(1536).astype(np.float32)
    x = A.astype(np.float64) + b
    want = x * 0.5 * (1 + _erf64(x / math.sqrt(2)))
    got = _one_node("BiasGelu", {"A": A, "B": b})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-6)
    graph = helper.make_graph([helper.make_node("Gelu", ["X"], ["Y"])], "g",
                              [helper.make_tensor_value_info("X", 1, A.shape)],
                              [helper.make_tensor_value_info("Y", 1, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=9)
    X = np.asfortranarray(A)  # not C-contiguous: the kernel computes on a copy of its own
    got = onnxrun.InferenceSession(model.SerializeToString()).run(None, {"X": X})[0]
    xd = X.astype(np.float64)
    np.testing.assert_allclose(got, xd * 0.5 * (1 + _erf64(xd / math.sqrt(2))), rtol=1e-5,
                               atol=2e-6)


@pytest.mark.parametrize("transB", [0, 1])
@pytest.mark.parametrize("alpha", [1.0, 0.5])
def test_fused_gemm_with_constant_b(transB: int, alpha: float):
    A = RNG.standard_normal((3, 20)).astype(np.float32)
    B = RNG.standard_normal((30, 20) if transB else (20, 30)).astype(np.float32)
    C = RNG.standard_normal(30).astype(np.float32)
    got = _one_node("FusedGemm", {"A": A}, {"B": B, "C": C}, alpha=alpha, transB=transB,
                    activation="Relu")[0]
    want = np.maximum(alpha * (A @ (B.T if transB else B)) + C, 0)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("want_sum", [False, True])
def test_skip_layer_normalization(want_sum: bool):
    x = RNG.standard_normal((2, 5, 384)).astype(np.float32)
    skip = RNG.standard_normal((2, 5, 384)).astype(np.float32)
    gamma, beta, bias = (RNG.standard_normal(384).astype(np.float32) for _ in range(3))
    n_out = 4 if want_sum else 1
    got = _one_node("SkipLayerNormalization", {"x": x, "skip": skip},
                    {"gamma": gamma, "beta": beta, "bias": bias}, n_out=n_out, epsilon=1e-5)
    s = x.astype(np.float64) + skip + bias
    mean = s.mean(-1, keepdims=True)
    y = (s - mean) / np.sqrt(s.var(-1, keepdims=True) + 1e-5) * gamma + beta
    np.testing.assert_allclose(got[0], y, rtol=1e-4, atol=1e-4)
    if want_sum:
        np.testing.assert_allclose(got[3], s, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(got[1], mean, rtol=1e-5, atol=1e-5)
