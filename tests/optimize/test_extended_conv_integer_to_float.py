"""ConvIntegerToFloatFusion: a dynamically quantized CNN's ConvInteger -> Cast -> Mul -> Add
chains become ai.onnxrun ConvIntegerToFloat, with outputs equal to onnxruntime's run of the
unfused model, on the compiled kernels and on the numpy path."""

from __future__ import annotations

import collections

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxrun
from onnxrun.providers.cpu import compiled
from onnxrun.quantization import quantize_dynamic

LEVELS = [onnxrun.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
          onnxrun.GraphOptimizationLevel.ORT_ENABLE_ALL]


def _cnn(seed: int = 0) -> onnx.ModelProto:
    """conv 3x3/2 (3 -> 16) -> Clip -> depthwise 3x3 -> Clip -> 1x1 (16 -> 24) -> 1x1
    (24 -> 24) + residual -> GlobalAveragePool."""
    rng = np.random.default_rng(seed)

    def w(*shape):
        return (rng.standard_normal(shape) * 0.3).astype(np.float32)

    inits = {"w0": w(16, 3, 3, 3), "b0": w(16), "w1": w(16, 1, 3, 3), "b1": w(16),
             "w2": w(24, 16, 1, 1), "b2": w(24), "w3": w(24, 24, 1, 1), "b3": w(24),
             "lo": np.array(0, np.float32), "hi": np.array(6, np.float32)}
    nodes = [
        helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Clip", ["c0", "lo", "hi"], ["r0"]),
        helper.make_node("Conv", ["r0", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], group=16),
        helper.make_node("Clip", ["c1", "lo", "hi"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"]),
        helper.make_node("Conv", ["c2", "w3", "b3"], ["c3"]),
        helper.make_node("Add", ["c2", "c3"], ["s"]),
        helper.make_node("GlobalAveragePool", ["s"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 21, 19])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@pytest.fixture(scope="module")
def quantized(tmp_path_factory):
    folder = tmp_path_factory.mktemp("dyn")
    onnx.save(_cnn(), folder / "f32.onnx")
    out = {}
    for per_channel in (False, True):
        path = folder / f"int8_{per_channel}.onnx"
        quantize_dynamic(folder / "f32.onnx", path, per_channel=per_channel)
        out[per_channel] = path
    return out


def _feeds():
    return {"x": np.random.default_rng(1).standard_normal((1, 3, 21, 19)).astype(np.float32)}


def _session(path, level, **kw):
    so = onnxrun.SessionOptions()
    so.graph_optimization_level = level
    for k, v in kw.items():
        setattr(so, k, v)
    return onnxrun.InferenceSession(str(path), so)


@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("use_compiled", [True, False])
def test_fused_cnn_matches_onnxruntime(quantized, tmp_path, per_channel, level, use_compiled):
    path = quantized[per_channel]
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(
        None, _feeds())[0]
    saved = tmp_path / "opt.onnx"
    if use_compiled:
        sess = _session(path, level, optimized_model_filepath=str(saved))
    else:
        with compiled.disabled():
            sess = _session(path, level, optimized_model_filepath=str(saved))
    got = sess.run(None, _feeds())[0]
    # the same integer accumulators, scaled and biased with the same two roundings; the
    # residual Add and the pooling's float sums may round in another order (layout)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    counts = collections.Counter(n.op_type for n in onnx.load(saved).graph.node)
    assert counts["ConvIntegerToFloat"] == 4 and counts["ConvInteger"] == 0
    assert counts["Cast"] == 0
    assert counts["Clip"] == 0  # both ReLU6s clip in the fused convolutions' epilogues
    acts = [helper.get_attribute_value(a) for n in onnx.load(saved).graph.node
            for a in n.attribute if a.name == "activation"]
    assert acts == [b"Clip", b"Clip"]


@pytest.mark.parametrize("use_compiled", [True, False])
@pytest.mark.parametrize("kernel,group", [((1, 1), 1), ((3, 3), 1), ((3, 3), 8)])
def test_relu_is_fused_into_the_epilogue(tmp_path, kernel, group, use_compiled):
    """ConvIntegerToFloat -> Relu: one node whose epilogue clips at 0 (GEMM, im2col and
    depthwise kernels; and the numpy path), equal to onnxruntime on the unfused model."""
    rng = np.random.default_rng(3)
    W = (rng.standard_normal((8, 8 // group) + kernel) * 0.3).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], group=group,
                              pads=[k // 2 for k in kernel] * 2),
             helper.make_node("Relu", ["c"], ["y"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 9, 10])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(W, "w"),
         numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "b")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]),
              tmp_path / "f32.onnx")
    quantize_dynamic(tmp_path / "f32.onnx", tmp_path / "int8.onnx")
    x = {"x": rng.standard_normal((1, 8, 9, 10)).astype(np.float32)}
    want = ort.InferenceSession(str(tmp_path / "int8.onnx"),
                                providers=["CPUExecutionProvider"]).run(None, x)[0]
    saved = tmp_path / "opt.onnx"
    level = onnxrun.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    if use_compiled:
        sess = _session(tmp_path / "int8.onnx", level, optimized_model_filepath=str(saved))
    else:
        with compiled.disabled():
            sess = _session(tmp_path / "int8.onnx", level, optimized_model_filepath=str(saved))
    got = sess.run(None, x)[0]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    assert got.min() == 0
    counts = collections.Counter(n.op_type for n in onnx.load(saved).graph.node)
    assert counts["ConvIntegerToFloat"] == 1 and counts["Relu"] == 0


def test_fusion_off_at_basic_level(quantized):
    sess = _session(quantized[False], onnxrun.GraphOptimizationLevel.ORT_ENABLE_BASIC)
    assert "ConvIntegerToFloatFusion" not in sess.get_optimization_report().passes


def test_scale_not_per_channel_is_left_alone(tmp_path):
    """A scale varying along a spatial axis is not a per-channel multiplier: no fusion."""
    rng = np.random.default_rng(2)
    W = rng.integers(-128, 128, (4, 2, 3, 3)).astype(np.int8)
    scale = (rng.random((1, 1, 5, 1)) * 0.01).astype(np.float32)  # varies along H
    nodes = [helper.make_node("ConvInteger", ["x", "w"], ["acc"]),
             helper.make_node("Cast", ["acc"], ["f"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["f", "s"], ["y"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.UINT8, [1, 2, 7, 7])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(W, "w"), numpy_helper.from_array(scale, "s")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    x = rng.integers(0, 256, (1, 2, 7, 7)).astype(np.uint8)
    want = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    sess = _session_bytes(model, LEVELS[0])
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], want)
    assert "ConvIntegerToFloatFusion" not in {
        k for k, p in sess.get_optimization_report().passes.items() if p.changes}


def _session_bytes(model, level):
    so = onnxrun.SessionOptions()
    so.graph_optimization_level = level
    return onnxrun.InferenceSession(model.SerializeToString(), so)
