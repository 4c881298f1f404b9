"""8-bit weights stay 8-bit in a session: the integer kernels (MatMulInteger, QLinearMatMul,
ConvInteger, QLinearConv, QGemm, DynamicQuantizeMatMul, MatMulIntegerToFloat) hold the weight
initializer itself, and a DequantizeLinear of a weight read by MatMul / Gemm is neither
folded into a float32 initializer nor cached. Each test checks the outputs against onnxruntime
and that no float array the size of a weight is held once the session is created."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import ort_int8
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

import onnxrun

MS = "com.microsoft"
RNG = np.random.default_rng(7)


def _model(nodes, inputs, outputs, inits, opset=21) -> bytes:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset),
                                                    helper.make_opsetid(MS, 1)])
    model.ir_version = 9
    return model.SerializeToString()


def _float_bytes_held(obj, seen=None) -> int:
    """Bytes of the float arrays reachable from a kernel object (attributes, slots, lists)."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return 0
    seen.add(id(obj))
    if isinstance(obj, np.ndarray):
        return obj.nbytes if obj.dtype.kind == "f" else 0
    if isinstance(obj, dict):
        return sum(_float_bytes_held(v, seen) for v in obj.values())
    if isinstance(obj, list | tuple):
        return sum(_float_bytes_held(v, seen) for v in obj)
    if type(obj).__module__.startswith("onnxrun.providers"):
        names = list(getattr(obj, "__dict__", {}))
        for cls in type(obj).__mro__:
            names += list(getattr(cls, "__slots__", ()))
        return sum(_float_bytes_held(getattr(obj, n, None), seen) for n in names)
    return 0


def _session(model: bytes, threads: int = 1) -> onnxrun.InferenceSession:
    so = onnxrun.SessionOptions()
    so.intra_op_num_threads = threads
    return onnxrun.InferenceSession(model, so)


def _check(model: bytes, feeds: dict, weight: np.ndarray, exact: bool = True,
           ort_fusions: bool = True) -> None:
    so = ort.SessionOptions()
    if not ort_fusions:  # the graph as written, not onnxruntime's integer rewrite of it
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    expected = ort_int8.session(model, so).run(None, feeds)  # exact on every CPU
    for threads in (1, 2):
        sess = _session(model, threads)
        got = sess.run(None, feeds)
        for g, e in zip(got, expected, strict=True):
            if exact:
                np.testing.assert_array_equal(g, e)
            else:
                np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5)
        program = sess._program
        held = sum(_float_bytes_held(step[0]) for step in program.steps)
        float_inits = _float_initializer_bytes(sess)
        # a float32 copy of the weight would be 4 bytes per element
        assert held < weight.size, f"kernels hold {held} bytes of floats"
        assert float_inits < weight.size, f"{float_inits} bytes of float initializers"


def _float_initializer_bytes(sess) -> int:
    graph = sess._program.graph
    return sum(v.const_value.nbytes for v in graph.initializers.values()
               if v.const_value is not None and v.const_value.dtype.kind == "f")


K, N, M = 96, 80, 24


def _weight(dtype=np.int8, shape=(K, N)) -> np.ndarray:
    lo, hi = (-128, 128) if dtype == np.int8 else (0, 256)
    return RNG.integers(lo, hi, shape).astype(dtype)


def test_matmul_integer_holds_int8():
    B = _weight()
    A = RNG.integers(0, 256, (M, K)).astype(np.uint8)
    model = _model(
        [helper.make_node("MatMulInteger", ["A", "B", "azp", "bzp"], ["Y"])],
        [helper.make_tensor_value_info("A", TP.UINT8, [M, K])],
        [helper.make_tensor_value_info("Y", TP.INT32, [M, N])],
        [numpy_helper.from_array(B, "B"), numpy_helper.from_array(np.uint8(131), "azp"),
         numpy_helper.from_array(np.int8(-3), "bzp")], opset=13)
    _check(model, {"A": A}, B)


def test_matmul_integer_exact_with_long_reductions():
    """Reductions whose float32 partial sums could pass 2**24: split over K, still exact."""
    k = 4096
    B = np.full((k, 8), -128, np.int8)
    B[::3] = 127
    A = RNG.integers(0, 256, (4, k)).astype(np.uint8)
    A[0] = 255
    model = _model(
        [helper.make_node("MatMulInteger", ["A", "B", "azp"], ["Y"])],
        [helper.make_tensor_value_info("A", TP.UINT8, [4, k])],
        [helper.make_tensor_value_info("Y", TP.INT32, [4, 8])],
        [numpy_helper.from_array(B, "B"), numpy_helper.from_array(np.uint8(0), "azp")],
        opset=13)
    got = _session(model).run(None, {"A": A})[0]
    np.testing.assert_array_equal(got, A.astype(np.int64) @ B.astype(np.int64))


def test_qlinear_matmul_holds_int8():
    B = _weight(np.uint8)
    A = RNG.integers(0, 256, (M, K)).astype(np.uint8)
    inits = [numpy_helper.from_array(B, "B"),
             numpy_helper.from_array(np.float32(0.02), "as"),
             numpy_helper.from_array(np.uint8(120), "az"),
             numpy_helper.from_array(RNG.uniform(0.001, 0.01, N).astype(np.float32), "bs"),
             numpy_helper.from_array(np.full(N, 128, np.uint8), "bz"),
             numpy_helper.from_array(np.float32(0.5), "ys"),
             numpy_helper.from_array(np.uint8(100), "yz")]
    model = _model(
        [helper.make_node("QLinearMatMul", ["A", "as", "az", "B", "bs", "bz", "ys", "yz"],
                          ["Y"])],
        [helper.make_tensor_value_info("A", TP.UINT8, [M, K])],
        [helper.make_tensor_value_info("Y", TP.UINT8, [M, N])], inits)
    _check(model, {"A": A}, B)


def test_dynamic_quantize_matmul_and_integer_to_float_hold_int8():
    B = _weight()
    A = RNG.normal(size=(2, M, K)).astype(np.float32)
    bias = RNG.normal(size=N).astype(np.float32)
    inits = [numpy_helper.from_array(B, "B"),
             numpy_helper.from_array(RNG.uniform(0.001, 0.01, N).astype(np.float32), "bs"),
             numpy_helper.from_array(RNG.integers(-5, 5, N).astype(np.int8), "bz"),
             numpy_helper.from_array(bias, "bias")]
    model = _model(
        [helper.make_node("DynamicQuantizeMatMul", ["A", "B", "bs", "bz", "bias"], ["Y"],
                          domain=MS)],
        [helper.make_tensor_value_info("A", TP.FLOAT, [2, M, K])],
        [helper.make_tensor_value_info("Y", TP.FLOAT, [2, M, N])], inits)
    _check(model, {"A": A}, B, exact=False)
    Aq = RNG.integers(0, 256, (M, K)).astype(np.uint8)
    inits += [numpy_helper.from_array(np.float32(0.03), "as"),
              numpy_helper.from_array(np.uint8(128), "az")]
    model = _model(
        [helper.make_node("MatMulIntegerToFloat", ["A", "B", "as", "bs", "az", "bz", "bias"],
                          ["Y"], domain=MS)],
        [helper.make_tensor_value_info("A", TP.UINT8, [M, K])],
        [helper.make_tensor_value_info("Y", TP.FLOAT, [M, N])], inits)
    _check(model, {"A": Aq}, B, exact=False)


def test_qgemm_transposed_holds_int8():
    B = _weight(shape=(N, K))
    A = RNG.integers(0, 256, (M, K)).astype(np.uint8)
    inits = [numpy_helper.from_array(B, "B"),
             numpy_helper.from_array(np.float32(0.02), "as"),
             numpy_helper.from_array(np.uint8(128), "az"),
             numpy_helper.from_array(np.float32(0.004), "bs"),
             numpy_helper.from_array(np.int8(0), "bz"),
             numpy_helper.from_array(RNG.integers(-1000, 1000, N).astype(np.int32), "C")]
    model = _model(
        [helper.make_node("QGemm", ["A", "as", "az", "B", "bs", "bz", "C"], ["Y"], domain=MS,
                          transB=1)],
        [helper.make_tensor_value_info("A", TP.UINT8, [M, K])],
        [helper.make_tensor_value_info("Y", TP.FLOAT, [M, N])], inits)
    _check(model, {"A": A}, B, exact=False)


@pytest.mark.parametrize("group", [1, 16])
def test_conv_integer_and_qlinear_conv_hold_int8(group):
    C, Mo = 16, 32
    W = _weight(shape=(Mo, C // group, 3, 3))
    X = RNG.integers(0, 256, (1, C, 20, 20)).astype(np.uint8)
    model = _model(
        [helper.make_node("ConvInteger", ["X", "W", "xz"], ["Y"], group=group,
                          pads=[1, 1, 1, 1])],
        [helper.make_tensor_value_info("X", TP.UINT8, [1, C, 20, 20])],
        [helper.make_tensor_value_info("Y", TP.INT32, None)],
        [numpy_helper.from_array(W, "W"), numpy_helper.from_array(np.uint8(100), "xz")],
        opset=13)
    _check(model, {"X": X}, W)
    inits = [numpy_helper.from_array(W, "W"),
             numpy_helper.from_array(np.float32(0.02), "xs"),
             numpy_helper.from_array(np.uint8(100), "xz"),
             numpy_helper.from_array(RNG.uniform(0.001, 0.01, Mo).astype(np.float32), "ws"),
             numpy_helper.from_array(np.zeros(Mo, np.int8), "wz"),
             numpy_helper.from_array(np.float32(0.3), "ys"),
             numpy_helper.from_array(np.uint8(128), "yz"),
             numpy_helper.from_array(RNG.integers(-500, 500, Mo).astype(np.int32), "B")]
    model = _model(
        [helper.make_node("QLinearConv", ["X", "xs", "xz", "W", "ws", "wz", "ys", "yz", "B"],
                          ["Y"], group=group, pads=[1, 1, 1, 1])],
        [helper.make_tensor_value_info("X", TP.UINT8, [1, C, 20, 20])],
        [helper.make_tensor_value_info("Y", TP.UINT8, None)], inits)
    _check(model, {"X": X}, W)


@pytest.mark.parametrize("consumer", ["MatMul", "Gemm"])
def test_qdq_weight_is_not_folded_to_float(consumer):
    """DequantizeLinear(int8 weight) -> MatMul / Gemm: the session keeps the int8 initializer
    and dequantizes at each run (no folded float32 copy, no cached one). A convolution's weight
    is folded: its kernel lays the weight out in float once (see _WEIGHT_READERS)."""
    if consumer == "Conv":
        W = _weight(shape=(32, 16, 3, 3))
        x_shape, axis = [1, 16, 12, 12], 0
        node = helper.make_node("Conv", ["X", "Wf"], ["Y"], pads=[1, 1, 1, 1])
        scale = RNG.uniform(0.001, 0.01, 32).astype(np.float32)
    else:
        W = _weight()
        x_shape, axis = [M, K], 1
        node = helper.make_node(consumer, ["X", "Wf"], ["Y"])
        scale = RNG.uniform(0.001, 0.01, N).astype(np.float32)
    model = _model(
        [helper.make_node("DequantizeLinear", ["W", "ws", "wz"], ["Wf"], axis=axis), node],
        [helper.make_tensor_value_info("X", TP.FLOAT, x_shape)],
        [helper.make_tensor_value_info("Y", TP.FLOAT, None)],
        [numpy_helper.from_array(W, "W"), numpy_helper.from_array(scale, "ws"),
         numpy_helper.from_array(np.zeros(scale.shape, np.int8), "wz")])
    X = RNG.normal(size=x_shape).astype(np.float32)
    _check(model, {"X": X}, W, exact=False, ort_fusions=False)
