"""ShapeRefinement: shapes ONNX inference left unknown are propagated (no node changes), so the
fusions' shape checks work after a Reshape-13 to a computed target or a com.microsoft node."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx.parser
import onnx.reference
import pytest

import onnxrun
from onnxrun.dtypes import np_dtype, type_shape
from onnxrun.load import load_model
from onnxrun.optimize.extended.shape_refinement import ShapeRefinement
from onnxrun.validate import validate

MODELS = Path(__file__).resolve().parent.parent / "models"


def _actual(model: onnx.ModelProto, feeds: dict) -> dict[str, np.ndarray]:
    """Every node output's value in a plain run."""
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    known = {o.name for o in probe.graph.output}
    for node in probe.graph.node:
        probe.graph.output.extend(onnx.ValueInfoProto(name=n) for n in node.output
                                  if n and n not in known)
    opts = onnxrun.SessionOptions()
    opts.graph_optimization_level = onnxrun.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = onnxrun.InferenceSession(probe.SerializeToString(), opts)
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(None, feeds), strict=True))


@pytest.mark.parametrize("name", ["bert_tiny", "gpt_tiny", "mobilenet_tiny"])
def test_refined_shapes_agree_with_the_run(name):
    proto = onnx.load(str(MODELS / f"{name}.onnx"))
    data = np.load(MODELS / f"{name}.inputs.npz")
    feeds = {k.split("/", 1)[1]: data[k] for k in data.files if k.startswith("0/")}
    actual = _actual(proto, feeds)
    mp, model = load_model(str(MODELS / f"{name}.onnx"))
    validate(mp, model)
    outputs = {id(v) for v in model.graph.outputs}
    values = [v for n in model.graph.nodes for v in n.outputs if v.name and id(v) not in outputs]
    for v in values:  # forget what ONNX inferred
        v.type = None
    ShapeRefinement().run(model)
    refined = [v for v in values if v.type is not None]
    assert len(refined) > 0.9 * len(values)
    symbols: dict[str, int] = {}
    for v in refined:
        got, dims = actual[v.name], type_shape(v.type)
        assert np_dtype(v.type.tensor_type.elem_type) == got.dtype, v.name
        assert dims is not None and len(dims) == got.ndim, (v.name, dims, got.shape)
        for d, size in zip(dims, got.shape, strict=True):
            if isinstance(d, int):
                assert d == size, (v.name, dims, got.shape)
            elif isinstance(d, str):
                assert symbols.setdefault(d, size) == size, (v.name, d)


def test_fusion_after_reshape_to_a_computed_target(tmp_path):
    # Reshape-13's inference gives no rank for a computed target: Gelu's rank check needs ours
    model = onnx.parser.parse_model("""<ir_version: 8, opset_import: ["" : 13]>
g (float[batch, 6] x) => (float[batch, 2, 3] y) {
    shape = Shape(x)
    zero = Constant <value = int64[1] {0}> ()
    b = Gather(shape, zero)
    rest = Constant <value = int64[2] {2, 3}> ()
    target = Concat <axis = 0> (b, rest)
    h = Reshape(x, target)
    c = Constant <value = float {1.4142135}> ()
    one = Constant <value = float {1.0}> ()
    half = Constant <value = float {0.5}> ()
    a = Div(h, c)
    e = Erf(a)
    p = Add(e, one)
    e1 = Mul(h, p)
    y = Mul(e1, half)
}""")
    opts = onnxrun.SessionOptions()
    opts.graph_optimization_level = onnxrun.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    sess = onnxrun.InferenceSession(model.SerializeToString(), opts)
    assert sess.get_optimization_report().passes["GeluFusion"].changes == {"Gelu": 1}
    x = np.random.default_rng(0).standard_normal((4, 6)).astype(np.float32)
    opts.graph_optimization_level = onnxrun.GraphOptimizationLevel.ORT_DISABLE_ALL
    want = onnxrun.InferenceSession(model.SerializeToString(), opts).run(None, {"x": x})[0]
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], want, rtol=1e-4, atol=1e-5)


# Windows, padding and resampling whose sizes ONNX inference cannot know before constant
# folding (the pads and scales are computed by constant subgraphs, as PyTorch exports
# ZeroPad2d and interpolate), each after the constants are folded.
_SPATIAL = """<ir_version: 8, opset_import: ["" : 17]>
g (float[1, 4, 9, 11] x) => (float[1, 4, 3, 3] y) {
    p0 = Constant <value = int64[8] {0, 0, 1, 0, 0, 0, 2, 1}> ()
    zero = Constant <value = int64[8] {0, 0, 0, 0, 0, 0, 0, 0}> ()
    pads = Add(p0, zero)
    padded = Pad(x, pads)
    c1 = Conv <strides = [2, 2], pads = [1, 0, 1, 2]> (padded, w3)
    c2 = Conv <auto_pad = "SAME_UPPER", strides = [2, 3]> (c1, w3)
    c3 = Conv <auto_pad = "SAME_LOWER", dilations = [2, 2]> (padded, w3)
    c4 = Conv <auto_pad = "SAME_UPPER"> (c3, w1)
    m1 = MaxPool <kernel_shape = [3, 3], strides = [2, 2], ceil_mode = 1> (c4)
    m2 = AveragePool <kernel_shape = [2, 2], strides = [2, 2], pads = [0, 1, 0, 1]> (c4)
    t1 = ConvTranspose <strides = [2, 2], pads = [1, 1, 0, 0], output_padding = [1, 0]> (m1, w3)
    t2 = ConvTranspose <strides = [3, 2], auto_pad = "SAME_UPPER"> (m2, w3)
    s0 = Constant <value = float[4] {1.0, 1.0, 2.0, 1.5}> ()
    one = Constant <value = float[4] {1.0, 1.0, 1.0, 1.0}> ()
    scales = Mul(s0, one)
    roi = Constant <value = float[0] {}> ()
    r1 = Resize <mode = "nearest"> (t1, roi, scales)
    n0 = Constant <value = int64[4] {1, 4, 7, 5}> ()
    sizes = Add(n0, zero4)
    r2 = Resize <mode = "linear"> (t2, roi, , sizes)
    d2s = DepthToSpace <blocksize = 2> (r1)
    s2d = SpaceToDepth <blocksize = 2> (d2s)
    reps = Constant <value = int64[4] {1, 1, 2, 1}> ()
    tiled = Tile(r2, reps)
    a = ReduceMean <axes = [2, 3], keepdims = 1> (s2d)
    b = ReduceMean <axes = [2, 3], keepdims = 1> (tiled)
    y0 = Add(a, b)
    y = Expand(y0, out_shape)
}"""


def test_windows_pads_and_resizes_are_sized_after_folding():
    rng = np.random.default_rng(0)
    inits = {"w3": rng.standard_normal((4, 4, 3, 3)).astype(np.float32),
             "w1": rng.standard_normal((4, 4, 1, 1)).astype(np.float32),
             "zero4": np.zeros(4, np.int64), "out_shape": np.array([1, 4, 3, 3], np.int64)}
    proto = onnx.parser.parse_model(_SPATIAL)
    proto.graph.initializer.extend(onnx.numpy_helper.from_array(v, k) for k, v in inits.items())
    feeds = {"x": rng.standard_normal((1, 4, 9, 11)).astype(np.float32)}
    actual = _actual(proto, feeds)
    opts = onnxrun.SessionOptions()
    opts.graph_optimization_level = onnxrun.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    sess = onnxrun.InferenceSession(proto.SerializeToString(), opts)
    checked = set()
    for node in sess._model.graph.nodes:
        for v in node.outputs:
            if v.name in actual and node.op_type not in ("Constant",):
                dims = type_shape(v.type)
                assert dims == list(actual[v.name].shape), (node.op_type, v.name, dims)
                checked.add(node.op_type)
    assert {"Pad", "Conv", "MaxPool", "AveragePool", "ConvTranspose", "Resize",
            "DepthToSpace", "SpaceToDepth", "Tile"} <= checked


def _pad_model(pads_as_input: bool) -> onnx.ModelProto:
    header = "float[1, 2, 5, 5] x, int64[8] pads" if pads_as_input else "float[1, 2, 5, 5] x"
    proto = onnx.parser.parse_model(f"""<ir_version: 8, opset_import: ["" : 17]>
g ({header}) => (float[1, 2, 7, 7] y) {{
    q = Pad(x, pads)
    y = Relu(q)
}}""")
    if not pads_as_input:
        proto.graph.initializer.append(onnx.numpy_helper.from_array(
            np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64), "pads"))
    return proto


def _refined_pad(proto: onnx.ModelProto, declared=None):
    mp, model = load_model(proto.SerializeToString())
    validate(mp, model)
    q = model.graph.nodes[0].outputs[0]
    if declared is not None:
        q.type = onnx.helper.make_tensor_type_proto(onnx.TensorProto.FLOAT, declared)
    ShapeRefinement().run(model)
    return type_shape(q.type)


def test_a_size_replaces_a_symbol_but_never_a_different_size():
    # ONNX inference names what it cannot size ("unk__0"); a size found later replaces it,
    # and a size that disagrees with a declared one is not written
    unknown = _refined_pad(_pad_model(pads_as_input=True))  # pads a caller gives: unknown
    assert not all(isinstance(d, int) for d in unknown)
    assert _refined_pad(_pad_model(pads_as_input=False), [1, 2, "unk__0", "unk__1"]) == \
        [1, 2, 7, 7]
    assert _refined_pad(_pad_model(pads_as_input=False), [1, 2, 6, "h"]) == [1, 2, 6, "h"]


_TOKENS = """<ir_version: 8, opset_import: ["" : 17]>
g (float[1, 16, 6, 6] x) => (float[1, 36, 4] y) {
    c = Conv<group = 16, pads = [1, 1, 1, 1]>(x, wd)
    s = Shape(c)
    lead = Slice(s, zero1, two1)
    target = Concat<axis = 0>(lead, minus1)
    t = Reshape(c, target)
    u = Transpose<perm = [0, 2, 1]>(t)
    y = MatMul(u, w)
}"""


def test_a_window_turned_to_tokens_is_sized_and_written_channels_last(monkeypatch):
    # SegFormer's Mix-FFN: a depthwise convolution's image reshaped to a computed target
    # (Shape -> Slice -> Concat with -1) and transposed to tokens. ONNX inference names the
    # Reshape's sizes "unk__N"; sized after folding, the layout level sees the tokens and the
    # convolution writes channels-last, so the product's rows are contiguous (the transposing
    # copy of its input had cost 4 ms a call at 128 x 128 x 128)
    rng = np.random.default_rng(1)
    proto = onnx.parser.parse_model(_TOKENS)
    inits = {"wd": rng.standard_normal((16, 1, 3, 3)).astype(np.float32),
             "w": rng.standard_normal((16, 4)).astype(np.float32),
             "zero1": np.array([0], np.int64), "two1": np.array([2], np.int64),
             "minus1": np.array([-1], np.int64)}
    proto.graph.initializer.extend(onnx.numpy_helper.from_array(v, k) for k, v in inits.items())
    x = rng.standard_normal((1, 16, 6, 6)).astype(np.float32)
    from onnxrun.providers.cpu.ops import conv

    seen = []
    real = conv.Conv.__call__

    def spy(self, *args, **kwargs):
        Y = real(self, *args, **kwargs)
        seen.append(Y.strides)
        return Y

    monkeypatch.setattr(conv.Conv, "__call__", spy)
    sess = onnxrun.InferenceSession(proto.SerializeToString())
    got = sess.run(None, {"x": x})[0]
    t = next(n for n in sess._model.graph.nodes if n.op_type == "Reshape").outputs[0]
    assert type_shape(t.type) == [1, 16, 36]
    assert seen and seen[-1][1] == 4  # each pixel's 16 channels together: tokens' rows
    ref = onnx.reference.ReferenceEvaluator(proto).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


_GROUP_NORMS = """<ir_version: 8, opset_import: ["" : 17]>
g (float[1, 8, 6, 6] x) => (float[1, 8, 6, 6] y) {
    c1 = Conv(x, w1)
    g1 = Reshape(c1, groups)
    n1 = InstanceNormalization(g1, ones, zeros)
    s1 = Shape(c1)
    b1 = Reshape(n1, s1)
    r1 = Relu(b1)
    c2 = Conv(r1, w2)
    g2 = Reshape(c2, groups)
    n2 = InstanceNormalization(g2, ones, zeros)
    s2 = Shape(c2)
    b2 = Reshape(n2, s2)
    y = Relu(b2)
}"""


def test_static_inputs_size_every_value_and_fold_every_shape():
    # GroupNormalization as PyTorch exports it, block after block: each Reshape back reads
    # Shape(conv output). With the graph's inputs static, ShapeRefinement sizes everything in
    # one sweep (a whole Shape read as its dimensions) and asks for another round, in which
    # ConstantFolding takes every Shape: BiT kept 42 Shape nodes, the Reshapes computing their
    # targets at every run, and its convolutions unfused
    rng = np.random.default_rng(2)
    proto = onnx.parser.parse_model(_GROUP_NORMS)
    inits = {"w1": rng.standard_normal((8, 8, 1, 1)).astype(np.float32),
             "w2": rng.standard_normal((8, 8, 1, 1)).astype(np.float32),
             "groups": np.array([0, 2, -1], np.int64), "ones": np.ones(2, np.float32),
             "zeros": np.zeros(2, np.float32)}
    proto.graph.initializer.extend(onnx.numpy_helper.from_array(v, k) for k, v in inits.items())
    x = rng.standard_normal((1, 8, 6, 6)).astype(np.float32)
    sess = onnxrun.InferenceSession(proto.SerializeToString())
    nodes = list(sess._model.graph.nodes)
    assert not any(n.op_type == "Shape" for n in nodes)
    for n in nodes:
        for v in n.outputs:
            dims = type_shape(v.type)
            assert dims is not None and all(isinstance(d, int) for d in dims), (n.op_type, dims)
    ref = onnx.reference.ReferenceEvaluator(proto).run(None, {"x": x})[0]
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], ref, rtol=1e-4, atol=1e-4)
