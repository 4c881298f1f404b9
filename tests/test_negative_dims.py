"""A negative ``dim_value`` in a declared shape means "any size": Paddle2ONNX writes -1 for its
dynamic dimensions, and onnxruntime accepts any size there. Feeds, reported shapes, shape
inference, the optimizer's saved model and the quantization tools must all read it so."""

from __future__ import annotations

import collections
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxrun
from onnxrun import InferenceSession
from onnxrun.quantization import CalibrationDataReader, quantize_dynamic, quantize_static

ort = pytest.importorskip("onnxruntime")
CPU = ["CPUExecutionProvider"]


def paddle_like(neg: int = -1, fixed_batch: bool = False) -> onnx.ModelProto:
    """Conv -> Relu -> Reshape -> MatMul, plus the input's Shape as a second output, every
    dynamic size declared as ``neg`` (inputs, outputs and value_info), as Paddle2ONNX does.
    ``fixed_batch``: the input's batch is 2, so inference knows what the declarations leave open."""
    rng = np.random.default_rng(0)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2 if fixed_batch else neg, 3, 8, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [neg, 16])
    s = helper.make_tensor_value_info("s", TensorProto.INT64, [neg])
    weights = [
        numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "W"),
        numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "B"),
        numpy_helper.from_array(rng.standard_normal((256, 16)).astype(np.float32), "M"),
        numpy_helper.from_array(np.array([-1, 256], np.int64), "target"),
    ]
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Reshape", ["r", "target"], ["f"]),
             helper.make_node("MatMul", ["f", "M"], ["y"]),
             helper.make_node("Shape", ["r"], ["s"])]
    value_info = [helper.make_tensor_value_info("r", TensorProto.FLOAT, [neg, 4, neg, neg]),
                  helper.make_tensor_value_info("f", TensorProto.FLOAT, [neg, neg])]
    graph = helper.make_graph(nodes, "paddle", [x], [y, s], weights, value_info=value_info)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 7
    onnx.checker.check_model(m)  # valid ONNX as written
    return m


def feed(n: int = 3, seed: int = 1) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(seed).standard_normal((n, 3, 8, 8)).astype(np.float32)}


def node_args(args) -> list[tuple]:
    return [(a.name, a.type, a.shape) for a in args]


def dims_of(vi: onnx.ValueInfoProto) -> list:
    return [d.dim_value if d.HasField("dim_value") else d.dim_param or None
            for d in vi.type.tensor_type.shape.dim]


@pytest.mark.parametrize("neg", [-1, -2])
def test_any_size_is_accepted_and_reported_as_onnxruntime_does(neg):
    data = paddle_like(neg).SerializeToString()
    theirs = ort.InferenceSession(data, providers=CPU)
    ours = InferenceSession(data)
    assert node_args(ours.get_inputs()) == node_args(theirs.get_inputs())
    assert node_args(ours.get_outputs()) == node_args(theirs.get_outputs())
    assert ours.get_inputs()[0].shape == [None, 3, 8, 8]
    for n in (1, 3, 5):  # every batch size, as in onnxruntime (and the Shape is not folded)
        got, want = ours.run(None, feed(n)), theirs.run(None, feed(n))
        np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-4)
        assert got[1].tolist() == want[1].tolist() == [n, 4, 8, 8]
    # a fixed size is still checked
    with pytest.raises(onnxrun.InvalidArgument, match="index: 1 Got: 2 Expected: 3"):
        ours.run(None, {"x": np.zeros((1, 2, 8, 8), np.float32)})


def test_declared_any_size_does_not_conflict_with_what_inference_knows():
    # The batch is fixed to 2 while the value_info and the outputs say -1: onnx's strict shape
    # inference would refuse "2 vs -1"; onnxruntime takes the declared -1 as "any" and reports
    # the inferred sizes for the outputs.
    data = paddle_like(fixed_batch=True).SerializeToString()
    theirs = ort.InferenceSession(data, providers=CPU)
    ours = InferenceSession(data)
    assert node_args(ours.get_outputs()) == node_args(theirs.get_outputs())
    assert ours.get_outputs()[1].shape == [4]
    got, want = ours.run(None, feed(2)), theirs.run(None, feed(2))
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-4)
    assert got[1].tolist() == want[1].tolist()


@pytest.mark.parametrize("level", [onnxrun.GraphOptimizationLevel.ORT_ENABLE_BASIC,
                                   onnxrun.GraphOptimizationLevel.ORT_ENABLE_ALL])
def test_optimized_model_saved_is_valid_onnx_with_unknown_dims(tmp_path: Path, level):
    so = onnxrun.SessionOptions()
    so.graph_optimization_level = level
    so.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    InferenceSession(paddle_like().SerializeToString(), so)
    saved = onnx.load(so.optimized_model_filepath)
    onnx.checker.check_model(saved, full_check=True)
    assert dims_of(saved.graph.input[0]) == [None, 3, 8, 8]
    for g in (saved.graph,):
        for vi in [*g.input, *g.output, *g.value_info]:
            assert all(d is None or isinstance(d, str) or d >= 0 for d in dims_of(vi)), vi
    want = ort.InferenceSession(paddle_like().SerializeToString(), providers=CPU).run(None, feed())
    for engine in (ort.InferenceSession(so.optimized_model_filepath, providers=CPU),
                   InferenceSession(so.optimized_model_filepath)):
        got = engine.run(None, feed())
        np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-4)
        assert got[1].tolist() == want[1].tolist()


class Reader(CalibrationDataReader):
    def __init__(self, sizes: tuple[int, ...]) -> None:
        self.batches = iter([feed(n, seed=i) for i, n in enumerate(sizes)])

    def get_next(self):
        return next(self.batches, None)


def quantized_ops(path: Path) -> collections.Counter:
    return collections.Counter(n.op_type for n in onnx.load(str(path)).graph.node)


@pytest.mark.parametrize("fixed_batch", [False, True])
@pytest.mark.parametrize("tool", ["dynamic", "static"])
def test_quantization_tools_read_any_size_as_a_symbolic_dimension(tmp_path: Path, tool,
                                                                  fixed_batch):
    model = paddle_like(fixed_batch=fixed_batch)
    # The same model with the -1s written as a named dimension: the tools must do the same.
    named = onnx.ModelProto()
    named.CopyFrom(model)
    for vi in [*named.graph.input, *named.graph.output, *named.graph.value_info]:
        for d in vi.type.tensor_type.shape.dim:
            if d.HasField("dim_value") and d.dim_value < 0:
                d.dim_param = "dyn"
    out = {}
    for name, m in (("negative", model), ("named", named)):
        out[name] = tmp_path / f"{name}.onnx"
        if tool == "dynamic":
            quantize_dynamic(m, out[name])
        else:
            sizes = (2, 2) if fixed_batch else (1, 4, 2)
            quantize_static(m, out[name], Reader(sizes),
                            extra_options={"CalibShowProgress": False})
    assert quantized_ops(out["negative"]) == quantized_ops(out["named"])
    assert {"MatMulInteger", "ConvInteger"} <= set(quantized_ops(out["negative"])) \
        if tool == "dynamic" else quantized_ops(out["negative"])["QuantizeLinear"] >= 3
    onnx.checker.check_model(onnx.load(str(out["negative"])), full_check=True)
    n = 2 if fixed_batch else 3
    for engine in (InferenceSession, lambda p: ort.InferenceSession(str(p), providers=CPU)):
        got = engine(out["negative"]).run(None, feed(n))
        want = engine(out["named"]).run(None, feed(n))
        np.testing.assert_array_equal(got[0], want[0])
        assert got[1].tolist() == [n, 4, 8, 8]
