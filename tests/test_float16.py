"""float16 conversion (``onnxrun.transformers.float16``) and float16/bfloat16 models on onnxrun.

The converter is checked against onnxruntime's (``onnxruntime.transformers.float16``, the
oracle): the same nodes, initializers and value_info on the real models of tests/models, and
models converted by either run on onnxrun and on onnxruntime with matching outputs.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import onnxrun
from onnxrun.transformers import float16
from onnxrun.transformers.float16 import convert_float_to_float16, convert_np_to_float16

ort = pytest.importorskip("onnxruntime")
ort_float16 = pytest.importorskip("onnxruntime.transformers.float16")

MODELS_DIR = Path(__file__).parent / "models"
MODELS = ["bert_tiny", "gpt_tiny", "mobilenet_tiny"]
RTOL16, ATOL16 = 1e-2, 1e-2  # float16 keeps ~3 significant digits through a few layers


@functools.cache
def _model_bytes(name: str) -> bytes:
    path = MODELS_DIR / f"{name}.onnx"
    if not path.exists():
        pytest.skip(f"{path.name} is absent: run `python scripts/generate_models.py`")
    return path.read_bytes()


def load(name: str) -> onnx.ModelProto:
    return onnx.ModelProto.FromString(_model_bytes(name))


@functools.cache
def cases(name: str) -> tuple[dict[str, np.ndarray], ...]:
    out: dict[int, dict[str, np.ndarray]] = {}
    with np.load(MODELS_DIR / f"{name}.inputs.npz") as data:
        for key in data.files:
            case, _, input_name = key.partition("/")
            out.setdefault(int(case), {})[input_name] = data[key]
    return tuple(out[i] for i in sorted(out))


@functools.cache
def reference(name: str) -> tuple[list[np.ndarray], ...]:
    """The float32 model's outputs on onnxrun, per case."""
    sess = onnxrun.InferenceSession(_model_bytes(name))
    return tuple(sess.run(None, feeds) for feeds in cases(name))


@functools.cache
def converted(name: str, keep_io_types: bool = False) -> bytes:
    return convert_float_to_float16(load(name), keep_io_types=keep_io_types).SerializeToString()


@functools.cache
def ort_converted(name: str, keep_io_types: bool = False) -> bytes:
    model = ort_float16.convert_float_to_float16(load(name), keep_io_types=keep_io_types)
    return model.SerializeToString()


def half_feeds(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {k: v.astype(np.float16) if v.dtype == np.float32 else v for k, v in feeds.items()}


def run_onnxrun(model: bytes | onnx.ModelProto, feeds) -> list[np.ndarray]:
    if isinstance(model, onnx.ModelProto):
        model = model.SerializeToString()
    return onnxrun.InferenceSession(model).run(None, feeds)


def run_ort(model: bytes | onnx.ModelProto, feeds) -> list[np.ndarray]:
    if isinstance(model, onnx.ModelProto):
        model = model.SerializeToString()
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a = a.astype(np.float64).ravel()
    b = b.astype(np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def assert_close16(actual, expected, rtol=RTOL16, atol=ATOL16):
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected, strict=True):
        assert a.shape == e.shape
        np.testing.assert_allclose(a.astype(np.float32), e.astype(np.float32), rtol=rtol,
                                   atol=atol)


def graph_signature(g: onnx.GraphProto):
    """A graph as sets (node order aside): what two converters must agree on."""
    return (
        sorted(n.SerializeToString() for n in g.node),
        sorted(t.SerializeToString() for t in g.initializer),
        sorted(v.SerializeToString() for v in g.value_info),
        [v.SerializeToString() for v in (*g.input, *g.output)],
    )


def float_initializer_bytes(model: onnx.ModelProto, elem: int) -> int:
    return sum(numpy_helper.to_array(t).nbytes for t in model.graph.initializer
               if t.data_type == elem)


# -- convert_np_to_float16 -----------------------------------------------------------------------


def test_convert_np_to_float16_clamps_like_onnxruntime():
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(1000) * 10.0 ** rng.integers(-12, 8, 1000)).astype(np.float32)
    specials = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-9, -1e-9, 5.96e-08, 1e5, -1e5, 65504.0,
                65519.0, 6.1e-5]
    x = np.concatenate([x, np.array(specials, dtype=np.float32)])
    got = convert_np_to_float16(x)
    want = ort_float16.convert_np_to_float16(x)
    assert got.dtype == np.float16
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))
    # sign and finiteness are kept: tiny values do not flush to zero, big ones do not overflow
    s = got[-len(specials):]
    assert s[0] == 0 and not np.signbit(s[0]) and s[1] == 0 and np.signbit(s[1])
    assert s[2] == np.inf and s[3] == -np.inf and np.isnan(s[4])
    assert s[5] == s[7] == np.float16(2.0 ** -24) and s[6] == -s[5]
    assert s[8] == s[10] == s[11] == 65504 and s[9] == -65504


def test_convert_np_to_float16_custom_bounds():
    x = np.array([1e-6, -1e-6, 2000.0, -3000.0, 0.0, np.inf], dtype=np.float32)
    got = convert_np_to_float16(x, min_positive_val=1e-4, max_finite_val=1000.0)
    np.testing.assert_array_equal(got, np.array([1e-4, -1e-4, 1000, -1000, 0, np.inf],
                                                dtype=np.float16))


def test_invalid_bounds_are_rejected():
    with pytest.raises(ValueError, match="min_positive_val"):
        convert_float_to_float16(load("bert_tiny"), min_positive_val=1e-9)
    with pytest.raises(ValueError, match="max_finite_val"):
        convert_float_to_float16(load("bert_tiny"), max_finite_val=1e6)
    with pytest.raises(ValueError, match="ModelProto"):
        convert_float_to_float16(b"not a model")


# -- the real models -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", MODELS)
def test_conversion_halves_the_model(name):
    m32 = load(name)
    m16 = onnx.ModelProto.FromString(converted(name))
    f32_bytes = float_initializer_bytes(m32, TensorProto.FLOAT)
    assert float_initializer_bytes(m16, TensorProto.FLOAT) == 0
    assert float_initializer_bytes(m16, TensorProto.FLOAT16) * 2 == f32_bytes
    # the file: every weight at half size; the rest (int constants, the value_info added by
    # shape inference) unchanged
    size32 = len(onnx.shape_inference.infer_shapes(m32).SerializeToString())
    size16 = len(converted(name))
    expected = size32 - f32_bytes // 2
    assert abs(size16 - expected) < 0.02 * size32, (size16, expected)


@pytest.mark.parametrize("keep_io_types", [False, True])
@pytest.mark.parametrize("name", MODELS)
def test_same_graph_as_onnxruntime_converter(name, keep_io_types):
    mine = onnx.ModelProto.FromString(converted(name, keep_io_types))
    theirs = onnx.ModelProto.FromString(ort_converted(name, keep_io_types))
    assert graph_signature(mine.graph) == graph_signature(theirs.graph)
    # unlike onnxruntime's, the inserted Casts are in topological order
    onnx.checker.check_model(mine, full_check=True)


def test_input_model_is_not_modified():
    model = load("mobilenet_tiny")
    before = model.SerializeToString()
    convert_float_to_float16(model, disable_shape_infer=True, keep_io_types=True)
    convert_float_to_float16(model)
    assert model.SerializeToString() == before


def test_model_path_is_accepted(tmp_path):
    path = tmp_path / "m.onnx"
    path.write_bytes(_model_bytes("gpt_tiny"))
    from_path = convert_float_to_float16(str(path))
    assert graph_signature(from_path.graph) == graph_signature(
        onnx.ModelProto.FromString(converted("gpt_tiny")).graph)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]  # no temporary left


@pytest.mark.parametrize("name", MODELS)
def test_float16_model_runs_on_onnxrun_and_onnxruntime(name):
    model = converted(name)
    for feeds, ref in zip(cases(name), reference(name), strict=True):
        feeds16 = half_feeds(feeds)
        got = run_onnxrun(model, feeds16)
        assert all(o.dtype == np.float16 for o in got)
        for o, r in zip(got, ref, strict=True):
            assert cosine(o, r) >= 0.999
        assert_close16(got, ref)
        assert_close16(got, run_ort(model, feeds16))


@pytest.mark.parametrize("name", MODELS)
def test_keep_io_types(name):
    model = onnx.ModelProto.FromString(converted(name, keep_io_types=True))
    original = load(name)
    for new, old in zip((*model.graph.input, *model.graph.output),
                        (*original.graph.input, *original.graph.output), strict=True):
        assert new.type.tensor_type.elem_type == old.type.tensor_type.elem_type
    casts = [n for n in model.graph.node if n.name.startswith("graph_")]
    n_float_io = sum(v.type.tensor_type.elem_type == TensorProto.FLOAT
                     for v in (*original.graph.input, *original.graph.output))
    assert len(casts) == n_float_io
    half = converted(name)
    for feeds, ref in zip(cases(name), reference(name), strict=True):
        got = run_onnxrun(model, feeds)  # float32 feeds, float32 outputs
        assert all(o.dtype == np.float32 for o in got)
        assert_close16(got, ref)
        # the same computation as the all-float16 model, plus exact casts at the edges
        assert_close16(got, run_onnxrun(half, half_feeds(feeds)), rtol=1e-3, atol=1e-3)


def test_bert_tiny_cosine_similarity():
    got = [run_onnxrun(converted("bert_tiny", True), feeds) for feeds in cases("bert_tiny")]
    for outs, ref in zip(got, reference("bert_tiny"), strict=True):
        for o, r in zip(outs, ref, strict=True):
            assert cosine(o, r) >= 0.999


@pytest.mark.parametrize("name", MODELS)
def test_onnxruntime_converted_model_runs_on_onnxrun(name):
    model = ort_converted(name)  # its Casts come last: onnxrun sorts the graph
    for feeds in cases(name):
        feeds16 = half_feeds(feeds)
        assert_close16(run_onnxrun(model, feeds16), run_ort(model, feeds16))


def test_resize_scales_stay_float32():
    model = onnx.ModelProto.FromString(converted("mobilenet_tiny"))
    produced = {o: n for n in model.graph.node for o in n.output}
    resizes = [n for n in model.graph.node if n.op_type == "Resize"]
    assert resizes
    for n in resizes:
        cast = produced[n.input[2]]
        assert cast.op_type == "Cast" and cast.name == cast.output[0] + "_node"
        assert helper.get_attribute_value(cast.attribute[0]) == TensorProto.FLOAT


# -- block lists ---------------------------------------------------------------------------------


def _casts_around(model: onnx.ModelProto, op_type: str):
    produced = {o: n for n in model.graph.node for o in n.output}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for n in model.graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    for node in (n for n in model.graph.node if n.op_type == op_type):
        yield node, [produced.get(i) for i in node.input], [consumers[o] for o in node.output]


def test_op_block_list_inserts_casts():
    model = convert_float_to_float16(load("bert_tiny"), op_block_list=["Softmax", "Tanh"])
    onnx.checker.check_model(model, full_check=True)
    for op_type in ("Softmax", "Tanh"):
        found = list(_casts_around(model, op_type))
        assert found
        for node, producers, consumers in found:
            (producer,) = producers
            assert producer.op_type == "Cast" and producer.output[0].endswith("_cast_to_fp32")
            assert helper.get_attribute_value(producer.attribute[0]) == TensorProto.FLOAT
            (readers,) = consumers
            assert [r.op_type for r in readers] == ["Cast"]
            assert node.output[0].endswith("_cast_to_fp16")
            assert helper.get_attribute_value(readers[0].attribute[0]) == TensorProto.FLOAT16
    theirs = ort_float16.convert_float_to_float16(load("bert_tiny"),
                                                  op_block_list=["Softmax", "Tanh"])
    assert graph_signature(model.graph) == graph_signature(theirs.graph)
    for feeds, ref in zip(cases("bert_tiny"), reference("bert_tiny"), strict=True):
        got = run_onnxrun(model, feeds)
        assert_close16(got, ref)
        assert_close16(got, run_ort(model, feeds))


def test_default_block_list_keeps_range_float32():
    assert "Range" in float16.DEFAULT_OP_BLOCK_LIST and "TopK" in float16.DEFAULT_OP_BLOCK_LIST
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5])
    y = helper.make_tensor_value_info("values", TensorProto.FLOAT, None)
    k = numpy_helper.from_array(np.array([3], dtype=np.int64), "k")
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]),
         helper.make_node("TopK", ["r", "k"], ["values", "indices"], name="topk")],
        "g", [x], [y, helper.make_tensor_value_info("indices", TensorProto.INT64, None)], [k])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m16 = convert_float_to_float16(model)
    onnx.checker.check_model(m16, full_check=True)
    topk = next(n for n in m16.graph.node if n.op_type == "TopK")
    assert topk.input[0] == "r_cast_to_fp32" and topk.output[0] == "values_cast_to_fp16"
    feeds = {"x": np.array([[1, -2, 3, 0.5, 7], [4, 4, -1, 2, 0]], dtype=np.float16)}
    got = run_onnxrun(m16, feeds)
    assert got[0].dtype == np.float16
    np.testing.assert_array_equal(got[0], run_ort(m16, feeds)[0])
    np.testing.assert_array_equal(got[1], run_ort(m16, feeds)[1])


def test_node_block_list_keeps_weights_float32():
    model = load("gpt_tiny")
    blocked = next(n for n in model.graph.node if n.op_type == "MatMul"
                   and any(i == t.name for t in model.graph.initializer for i in n.input))
    weight = next(i for i in blocked.input if any(t.name == i for t in model.graph.initializer))
    m16 = convert_float_to_float16(model, node_block_list=[blocked.name])
    onnx.checker.check_model(m16, full_check=True)
    inits = {t.name: t for t in m16.graph.initializer}
    assert inits[weight].data_type == TensorProto.FLOAT  # read only by the blocked node
    node = next(n for n in m16.graph.node if n.name == blocked.name)
    assert weight in node.input
    assert any(i.endswith("_cast_to_fp32") for i in node.input)
    assert all(t.data_type != TensorProto.FLOAT for name, t in inits.items() if name != weight)
    theirs = ort_float16.convert_float_to_float16(load("gpt_tiny"),
                                                  node_block_list=[blocked.name])
    assert graph_signature(m16.graph) == graph_signature(theirs.graph)
    for feeds, ref in zip(cases("gpt_tiny"), reference("gpt_tiny"), strict=True):
        got = run_onnxrun(m16, feeds)
        assert_close16(got, ref)
        assert_close16(got, run_ort(m16, feeds))

    forced = convert_float_to_float16(load("gpt_tiny"), node_block_list=[blocked.name],
                                      force_fp16_initializers=True)
    assert {t.name: t for t in forced.graph.initializer}[weight].data_type == \
        TensorProto.FLOAT16
    assert_close16(run_onnxrun(forced, cases("gpt_tiny")[0]), reference("gpt_tiny")[0])


def test_blocked_nodes_in_bfloat16():
    model = convert_float_to_float16(load("bert_tiny"), op_block_list=["MatMul"],
                                     use_bfloat16_as_blocked_nodes_dtype=True)
    onnx.checker.check_model(model, full_check=True)
    matmuls = [n for n in model.graph.node if n.op_type == "MatMul"]
    types = {v.name: v.type.tensor_type.elem_type for v in model.graph.value_info}
    types.update({t.name: t.data_type for t in model.graph.initializer})
    for n in matmuls:  # weights read only by MatMuls are stored in bfloat16, not float32
        assert {types[i] for i in n.input} == {TensorProto.BFLOAT16}
    for feeds, ref in zip(cases("bert_tiny"), reference("bert_tiny"), strict=True):
        got = run_onnxrun(model, feeds)
        for o, r in zip(got, ref, strict=True):
            assert o.dtype == np.float16 and cosine(o, r) >= 0.999


# -- subgraphs and attributes --------------------------------------------------------------------


def _if_model() -> onnx.ModelProto:
    """If(sum(x) > 0) whose branches hold blocked ops (Max, Min) reading outer and local
    values; the else branch nests an If."""
    f = TensorProto.FLOAT
    w = numpy_helper.from_array(np.array([1.5, -2.0, 0.25, 3.0], dtype=np.float32), "w")
    then = helper.make_graph(
        [helper.make_node("Mul", ["x", "w"], ["t_mul"]),
         helper.make_node("Max", ["t_mul", "x"], ["t_max"], name="then_max"),
         helper.make_node("Add", ["t_max", "h"], ["then_out"])],
        "then", [], [helper.make_tensor_value_info("then_out", f, [None, 4])])
    inner_then = helper.make_graph(
        [helper.make_node("Min", ["x", "h"], ["it_min"], name="inner_min"),
         helper.make_node("Cast", ["it_min"], ["it_out"], to=f)],
        "inner_then", [], [helper.make_tensor_value_info("it_out", f, [None, 4])])
    inner_else = helper.make_graph(
        [helper.make_node("Constant", [], ["c"], value_float=0.5),
         helper.make_node("Mul", ["x", "c"], ["ie_out"])],
        "inner_else", [], [helper.make_tensor_value_info("ie_out", f, [None, 4])])
    els = helper.make_graph(
        [helper.make_node("ReduceMax", ["x"], ["mx"], keepdims=0),
         helper.make_node("Greater", ["mx", "zero"], ["pos"]),
         helper.make_node("If", ["pos"], ["else_out"], then_branch=inner_then,
                          else_branch=inner_else)],
        "else", [], [helper.make_tensor_value_info("else_out", f, [None, 4])])
    zero = numpy_helper.from_array(np.array(-1.0, dtype=np.float32), "zero")
    graph = helper.make_graph(
        [helper.make_node("Tanh", ["x"], ["h"]),
         helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
         helper.make_node("Greater", ["s", "zero"], ["cond"]),
         helper.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=els)],
        "main", [helper.make_tensor_value_info("x", f, [None, 4])],
        [helper.make_tensor_value_info("y", f, [None, 4])], [w, zero])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_subgraphs_are_converted_with_casts_in_scope():
    model = _if_model()
    m16 = convert_float_to_float16(model)
    onnx.checker.check_model(m16, full_check=True)
    def branches(graph):
        node = next(n for n in graph.node if n.op_type == "If")
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        return attrs["then_branch"], attrs["else_branch"]

    then, els = branches(m16.graph)
    inner_then, inner_else = branches(els)
    # a value is cast once, right after its definition: in the branch for a local value...
    casts = [n for n in then.node if n.op_type == "Cast"]
    assert [n.input[0] for n in casts] == ["t_mul", "t_max_cast_to_fp16"]
    assert then.node[1].input[0] == "t_mul"  # right after Mul
    # ... in the main graph for outer values, shared by both branches
    main_casts = [n for n in m16.graph.node if n.op_type == "Cast"]
    assert [n.input[0] for n in main_casts] == ["x", "h"]
    assert [n.op_type for n in m16.graph.node][:3] == ["Cast", "Tanh", "Cast"]
    inner_min = next(n for n in inner_then.node if n.op_type == "Min")
    assert list(inner_min.input) == ["x_cast_to_fp32", "h_cast_to_fp32"]
    assert inner_min.output[0] == "it_min_cast_to_fp16"
    # Cast(to=FLOAT) became Cast(to=FLOAT16); Constant(value_float) a float16 tensor
    cast_back = next(n for n in inner_then.node if n.output[0] == "it_out")
    assert helper.get_attribute_value(cast_back.attribute[0]) == TensorProto.FLOAT16
    const = helper.get_attribute_value(inner_else.node[0].attribute[0])
    assert const.data_type == TensorProto.FLOAT16
    sess32 = onnxrun.InferenceSession(model.SerializeToString())
    for x in ([[1, -2, 3, 0.5]], [[-1, -2, -3, -0.5], [0.1, 0.2, 0.3, -0.4]],
              [[-4, -3, -2, -1]], [[-4, -3, -2, 1]]):
        x32 = np.array(x, dtype=np.float32)
        got = run_onnxrun(m16, {"x": x32.astype(np.float16)})[0]
        assert got.dtype == np.float16
        np.testing.assert_allclose(got, sess32.run(None, {"x": x32})[0], rtol=2e-3, atol=2e-3)
        np.testing.assert_allclose(got, run_ort(m16, {"x": x32.astype(np.float16)})[0],
                                   rtol=1e-3, atol=1e-3)


def test_if_model_from_tests_models():
    model = load("if_model")
    m16 = convert_float_to_float16(model, keep_io_types=True)
    assert graph_signature(m16.graph) == graph_signature(
        ort_float16.convert_float_to_float16(load("if_model"), keep_io_types=True).graph)
    for feeds, ref in zip(cases("if_model"), reference("if_model"), strict=True):
        assert_close16(run_onnxrun(m16, feeds), ref, rtol=5e-3, atol=5e-3)


def test_generators_and_constants():
    f16 = TensorProto.FLOAT16
    shape = numpy_helper.from_array(np.array([2, 3], dtype=np.int64), "shape")
    graph = helper.make_graph(
        [helper.make_node("ConstantOfShape", ["shape"], ["zeros"]),
         helper.make_node("RandomNormal", [], ["noise"], shape=[2, 3], seed=1.0),
         helper.make_node("Constant", [], ["cs"], value_floats=[1.0, 2.0, 1e-9]),
         helper.make_node("Constant", [], ["big"], value=numpy_helper.from_array(
             np.array([1e6, -1e6, 0.5], dtype=np.float32))),
         helper.make_node("Add", ["zeros", "cs"], ["a"]),
         helper.make_node("Add", ["a", "big"], ["y"]),
         helper.make_node("Mul", ["noise", "zeros"], ["z"])],
        "g", [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3]),
                  helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, 3])], [shape])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m16 = convert_float_to_float16(model)
    onnx.checker.check_model(m16, full_check=True)
    attrs = {n.output[0]: {a.name: helper.get_attribute_value(a) for a in n.attribute}
             for n in m16.graph.node}
    assert attrs["zeros"]["value"].data_type == f16
    assert attrs["noise"]["dtype"] == f16
    assert attrs["cs"]["value"].data_type == f16
    y, z = run_onnxrun(m16, {})
    assert y.dtype == z.dtype == np.float16
    np.testing.assert_array_equal(y, np.array([[65504, -65504, 0.5]] * 2, dtype=np.float16)
                                  + np.array([1, 2, 6e-8], dtype=np.float16))
    np.testing.assert_array_equal(z, np.zeros((2, 3), np.float16))


def test_external_data_must_be_loaded(tmp_path):
    model = load("gpt_tiny")
    onnx.save(load("gpt_tiny"), tmp_path / "m.onnx", save_as_external_data=True,
              location="m.data", size_threshold=0)
    lazy = onnx.load(tmp_path / "m.onnx", load_external_data=False)
    with pytest.raises(ValueError, match="external"):
        convert_float_to_float16(lazy, disable_shape_infer=True)
    from_path = convert_float_to_float16(str(tmp_path / "m.onnx"))  # loads its data
    assert float_initializer_bytes(from_path, TensorProto.FLOAT16) * 2 == \
        float_initializer_bytes(model, TensorProto.FLOAT)


def test_initializer_shared_by_blocked_and_float16_nodes(caplog):
    f = TensorProto.FLOAT
    w = numpy_helper.from_array(np.array([[1.0, 2.0], [3.0, 1e-9]], dtype=np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
         helper.make_node("Add", ["m", "w"], ["y"], name="add")],
        "g", [helper.make_tensor_value_info("x", f, [2, 2])],
        [helper.make_tensor_value_info("y", f, [2, 2])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with caplog.at_level(logging.INFO, logger=float16.__name__):
        m16 = convert_float_to_float16(model, node_block_list=["mm"])
    assert "w" in caplog.text
    onnx.checker.check_model(m16, full_check=True)
    assert m16.graph.initializer[0].data_type == TensorProto.FLOAT16  # Add reads it too
    mm = next(n for n in m16.graph.node if n.name == "mm")
    assert list(mm.input) == ["x_cast_to_fp32", "w_cast_to_fp32"]
    assert [n.op_type for n in m16.graph.node] == ["Cast", "Cast", "MatMul", "Cast", "Add"]
    x = np.array([[1, 2], [3, 4]], dtype=np.float16)
    got = run_onnxrun(m16, {"x": x})[0]
    np.testing.assert_array_equal(got, run_ort(m16, {"x": x})[0])


# -- float16 / bfloat16 kernels ------------------------------------------------------------------


def _single_node_model(op_type, inputs, elem, attrs=None, initializers=(), opset=20):
    names = [f"in{i}" for i in range(len(inputs))]
    graph = helper.make_graph(
        [helper.make_node(op_type, names + [t.name for t in initializers], ["out"],
                          **(attrs or {}))],
        "g", [helper.make_tensor_value_info(n, elem, list(x.shape))
              for n, x in zip(names, inputs, strict=True)],
        [helper.make_tensor_value_info("out", elem, None)], list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


BF16 = np.dtype(ml_dtypes.bfloat16)


@pytest.mark.parametrize("dtype", [np.dtype(np.float16), BF16])
@pytest.mark.parametrize(
    ("op_type", "attrs", "n_inputs", "const_second"),
    [("MatMul", {}, 2, True), ("MatMul", {}, 2, False), ("Add", {}, 2, False),
     ("Mul", {}, 2, True), ("Sub", {}, 2, False), ("Div", {}, 2, False),
     ("Softmax", {"axis": -1}, 1, False), ("LogSoftmax", {}, 1, False),
     ("Tanh", {}, 1, False), ("Erf", {}, 1, False), ("Gelu", {}, 1, False),
     ("Gelu", {"approximate": "tanh"}, 1, False), ("Pow", {}, 2, True),
     ("LayerNormalization", {}, 3, True), ("Gemm", {"transB": 1}, 2, True),
     ("ReduceMean", {"keepdims": 1}, 1, False), ("Relu", {}, 1, False),
     ("Clip", {}, 3, True)],
)
def test_half_kernels_match_float32_rounded_once(dtype, op_type, attrs, n_inputs, const_second):
    """16-bit float kernels agree with the float32 result rounded once: bit for bit for the
    single-operation kernels, within one unit in the last place for the others."""
    rng = np.random.default_rng(1)
    a = rng.standard_normal((2, 3, 8, 8)).astype(np.float32)
    others = {
        "MatMul": [rng.standard_normal((8, 5))],
        "Gemm": [rng.standard_normal((6, 8))],
        "Pow": [np.array(2.0)],
        "LayerNormalization": [rng.standard_normal(8), rng.standard_normal(8)],
        "Clip": [np.array(-0.5), np.array(1.0)],
        "Div": [rng.uniform(0.5, 2.0, (8,))],
    }.get(op_type, [rng.standard_normal((1, 3, 1, 8))][: n_inputs - 1])
    if op_type == "Gemm":
        a = a.reshape(-1, 8)
    others = [np.asarray(o, dtype=np.float32) for o in others]
    elem = helper.np_dtype_to_tensor_dtype(dtype)
    # inputs rounded to the 16-bit type first, so both sides see the same values
    a16 = a.astype(dtype)
    o16 = [o.astype(dtype) for o in others]
    if const_second or op_type in ("LayerNormalization", "Clip"):
        inits = [numpy_helper.from_array(o, f"c{i}") for i, o in enumerate(o16)]
        model16 = _single_node_model(op_type, [a16], elem, attrs, inits)
        feeds16 = {"in0": a16}
        inits32 = [numpy_helper.from_array(o.astype(np.float32), f"c{i}")
                   for i, o in enumerate(o16)]
        model32 = _single_node_model(op_type, [a16], TensorProto.FLOAT, attrs, inits32)
        feeds32 = {"in0": a16.astype(np.float32)}
    else:
        model16 = _single_node_model(op_type, [a16, *o16], elem, attrs)
        feeds16 = {"in0": a16, **{f"in{i + 1}": o for i, o in enumerate(o16)}}
        model32 = _single_node_model(op_type, [a16, *o16], TensorProto.FLOAT, attrs)
        feeds32 = {k: v.astype(np.float32) for k, v in feeds16.items()}
    got = run_onnxrun(model16, feeds16)[0]
    want = run_onnxrun(model32, feeds32)[0]
    assert got.dtype == dtype
    # one rounding of the float32 result (exactly that for the single-operation kernels)
    expected = want.astype(dtype)
    if op_type in ("Add", "Mul", "Sub", "Div", "Relu", "Clip", "Pow"):
        np.testing.assert_array_equal(got.astype(np.float32), expected.astype(np.float32))
    else:
        eps = float(ml_dtypes.finfo(dtype).eps)
        np.testing.assert_allclose(got.astype(np.float32), expected.astype(np.float32),
                                   rtol=eps, atol=eps)


@pytest.mark.parametrize("to", [TensorProto.BFLOAT16, TensorProto.FLOAT, TensorProto.FLOAT16,
                                TensorProto.INT32])
@pytest.mark.parametrize("src", [np.float32, np.float16, BF16, np.int64])
def test_cast_bfloat16(src, to):
    x = np.array([[0.0, -1.5, 3.25, 1e3], [7.0, -2.0, 0.1, 65000.0]], dtype=np.float32)
    x = x.astype(src)
    graph = helper.make_graph(
        [helper.make_node("Cast", ["x"], ["y"], to=to)], "g",
        [helper.make_tensor_value_info("x", helper.np_dtype_to_tensor_dtype(np.dtype(src)),
                                       [2, 4])],
        [helper.make_tensor_value_info("y", to, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    got = run_onnxrun(model, {"x": x})[0]
    want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got.astype(np.float64), want.astype(np.float64))


def test_bfloat16_bert_tiny_matches_float32():
    """bert_tiny with every float16 tensor turned into bfloat16 runs close to float32."""
    model = onnx.ModelProto.FromString(converted("bert_tiny", keep_io_types=True))

    def to_bf16(g: onnx.GraphProto) -> None:
        for t in g.initializer:
            if t.data_type == TensorProto.FLOAT16:
                arr = numpy_helper.to_array(t).astype(np.float32).astype(BF16)
                t.CopyFrom(numpy_helper.from_array(arr, t.name))
        for v in (*g.input, *g.output, *g.value_info):
            if v.type.tensor_type.elem_type == TensorProto.FLOAT16:
                v.type.tensor_type.elem_type = TensorProto.BFLOAT16
        for n in g.node:
            for a in n.attribute:
                if a.name == "to" and a.i == TensorProto.FLOAT16:
                    a.i = TensorProto.BFLOAT16
                if a.HasField("t") and a.t.data_type == TensorProto.FLOAT16:
                    arr = numpy_helper.to_array(a.t).astype(np.float32).astype(BF16)
                    a.t.CopyFrom(numpy_helper.from_array(arr, a.t.name))

    to_bf16(model.graph)
    for feeds, ref in zip(cases("bert_tiny"), reference("bert_tiny"), strict=True):
        got = run_onnxrun(model, feeds)
        for o, r in zip(got, ref, strict=True):
            assert o.dtype == np.float32 and cosine(o, r) >= 0.999
            np.testing.assert_allclose(o, r, rtol=0.1, atol=0.1)
