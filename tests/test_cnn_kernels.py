"""The CPU convolution and pooling kernels' fast paths (depthwise planar / channels-last,
Winograd F(2x2, 3x3), per-tap GEMMs, channels-last memory between convolutions, pooling
without padding copies), each forced on small shapes and checked against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxrun
from onnxrun.providers.cpu.ops import conv as conv_mod
from onnxrun.providers.cpu.ops import pool as pool_mod

ort = pytest.importorskip("onnxruntime")

RNG = np.random.default_rng(11)


def rand(*shape, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def conv_model(x_shape, w, b=None, act=None, const=True, **attrs) -> tuple[bytes, dict]:
    """Conv (+ Relu / Clip(0, 6), which the optimizer fuses into FusedConv)."""
    inits, feeds = [], {"X": rand(*x_shape)}
    inputs = [helper.make_tensor_value_info("X", TensorProto.FLOAT, list(x_shape))]
    if const:
        inits.append(numpy_helper.from_array(w, "W"))
    else:
        inputs.append(helper.make_tensor_value_info("W", TensorProto.FLOAT, list(w.shape)))
        feeds["W"] = w
    names = ["X", "W"]
    if b is not None:
        inits.append(numpy_helper.from_array(b, "B"))
        names.append("B")
    nodes = [helper.make_node("Conv", names, ["C" if act else "Y"], **attrs)]
    if act == "Relu":
        nodes.append(helper.make_node("Relu", ["C"], ["Y"]))
    elif act == "Clip":
        inits += [numpy_helper.from_array(np.array(0, np.float32), "lo"),
                  numpy_helper.from_array(np.array(6, np.float32), "hi")]
        nodes.append(helper.make_node("Clip", ["C", "lo", "hi"], ["Y"]))
    graph = helper.make_graph(nodes, "g", inputs,
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString(), feeds


def session(model: bytes, threads: int = 0) -> onnxrun.InferenceSession:
    opts = onnxrun.SessionOptions()
    opts.intra_op_num_threads = threads
    return onnxrun.InferenceSession(model, opts)


def check(model: bytes, feeds: dict, rtol=1e-4, atol=1e-4, threads=0):
    expected = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)
    got = session(model, threads).run(None, feeds)
    for g, e in zip(got, expected, strict=True):
        assert g.shape == e.shape and g.dtype == e.dtype
        assert g.flags.c_contiguous  # graph outputs never come back strided
        np.testing.assert_allclose(g, e, rtol=rtol, atol=atol)


# -- depthwise -----------------------------------------------------------------------------------

DW_ATTRS = [
    {"pads": [1, 1, 1, 1]},
    {"pads": [1, 1, 1, 1], "strides": [2, 2]},
    {"pads": [0, 2, 1, 0], "strides": [3, 2]},
    {"auto_pad": "SAME_UPPER", "strides": [2, 2]},
    {"pads": [2, 2, 2, 2], "dilations": [2, 2]},
    {"pads": [2, 1, 2, 1], "dilations": [1, 2], "strides": [2, 1]},
]


@pytest.mark.parametrize("layout", ["planar", "nhwc"])
@pytest.mark.parametrize("attrs", DW_ATTRS, ids=lambda a: "-".join(
    f"{k}={v}" for k, v in a.items()))
def test_depthwise(monkeypatch, layout, attrs):
    # planar: never channels-last; nhwc: always
    monkeypatch.setattr(conv_mod, "_NHWC_CHANNELS", 10 ** 6 if layout == "planar" else 1)
    C = 6
    for ks, act, bias in [(3, "Clip", True), (5, None, False), (3, "Relu", False)]:
        w, b = rand(C, 1, ks, ks), rand(C) if bias else None
        check(*conv_model((2, C, 11, 13), w, b, act, group=C, **attrs))
    check(*conv_model((1, C, 9, 10), rand(C, 1, 3, 3), rand(C), const=False, group=C, **attrs))


def test_depthwise_padding_larger_than_kernel():
    C = 4
    check(*conv_model((1, C, 5, 6), rand(C, 1, 3, 3), rand(C), group=C, pads=[4, 3, 4, 5]))


# -- dense convolutions -----------------------------------------------------------------------


@pytest.mark.parametrize("attrs", [
    {"pads": [1, 1, 1, 1]}, {}, {"pads": [2, 0, 1, 1]}, {"auto_pad": "SAME_LOWER"},
], ids=["pad1", "valid", "asym", "same_lower"])
@pytest.mark.parametrize("size", [(16, 16), (15, 18)])  # 64 and 72 2x2 tiles
def test_winograd(attrs, size):
    C = M = 64  # the smallest Winograd-sized layer (with one BLAS thread)
    x = (2, C) + size
    check(*conv_model(x, rand(M, C, 3, 3, scale=0.1), rand(M), "Relu", **attrs), threads=1)
    check(*conv_model(x, rand(M, C, 3, 3, scale=0.1), None, **attrs), threads=1)
    check(*conv_model(x, rand(M, C, 3, 3, scale=0.1), rand(M), const=False, **attrs),
          threads=1)


def test_winograd_choice():
    method = conv_mod._dense_method
    assert method(64, 64, (3, 3), (1, 1), (1, 1), 1, (16, 16), 1) == "winograd"
    assert method(64, 64, (3, 3), (1, 1), (1, 1), 1, (14, 14), 1) == "gemm"  # 49 tiles
    assert method(512, 512, (3, 3), (1, 1), (1, 1), 1, (14, 14), 1) == "winograd"
    # several BLAS threads: only GEMMs large enough to share
    assert method(64, 64, (3, 3), (1, 1), (1, 1), 1, (16, 16), 0) == "gemm"
    assert method(512, 512, (3, 3), (1, 1), (1, 1), 1, (28, 28), 2) == "winograd"
    assert method(128, 32, (3, 3), (1, 1), (1, 1), 1, (28, 28), 1) == "shifted"


def test_winograd_matches_direct_convolution():
    X, W, b = rand(2, 5, 7, 6), rand(4, 5, 3, 3), rand(4, 1, 1)
    U = conv_mod._winograd_weights(W, np.dtype(np.float32))
    got = conv_mod._winograd_3x3(X, U, b, (1, 1), (7, 6))[:, :7, :6].transpose(0, 3, 1, 2)
    P = np.pad(X, ((0, 0), (0, 0), (1, 1), (1, 1)))
    want = sum(np.einsum("mc,nchw->nmhw", W[:, :, i, j], P[:, :, i:i + 7, j:j + 6])
               for i in range(3) for j in range(3)) + b
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_winograd_weights_blocks_keep_the_bits(monkeypatch):
    # 300 channels of 256 filters: blocks of 28 channels and a short last one, against the
    # whole layer as one block
    W = rand(256, 300, 3, 3)
    blocked = conv_mod._winograd_weights(W, np.dtype(np.float32))
    monkeypatch.setattr(conv_mod, "_WINOGRAD_PREP_ELEMENTS", W.size)
    whole = conv_mod._winograd_weights(W, np.dtype(np.float32))
    assert blocked.tobytes() == whole.tobytes()


@pytest.mark.parametrize("kernel,attrs", [
    ((3, 3), {"pads": [1, 1, 1, 1]}),
    ((5, 5), {"pads": [2, 2, 2, 2]}),
    ((1, 3), {"pads": [0, 1, 0, 1]}),
    ((3, 3), {"pads": [2, 1, 0, 3], "dilations": [2, 1]}),
    ((2, 4), {"auto_pad": "SAME_UPPER"}),
])
def test_per_tap_gemm(kernel, attrs):
    C, M = 24, 8  # fewer output than input channels
    check(*conv_model((2, C, 10, 11), rand(M, C, *kernel, scale=0.2), rand(M), "Clip",
                      **attrs))


@pytest.mark.parametrize("method", ["gemm", "shifted", "winograd", "nhwc"])
def test_forced_methods_agree(monkeypatch, method):
    monkeypatch.setattr(conv_mod, "_dense_method", lambda *args: method)
    C, M = 8, 8
    check(*conv_model((2, C, 9, 12), rand(M, C, 3, 3), rand(M), "Relu", pads=[1, 0, 2, 1]))


# -- channels-last im2col on the compiled GEMM ---------------------------------------------


def _needs_packed_gemm():
    if not conv_mod._packable(np.float32):
        pytest.skip("the compiled float32 GEMM does not run here")


def _nhwc_steps(sess) -> int:
    return sum(getattr(s.kernel, "nhwc_packed", None) is not None
               for s in sess._program.full_plan.steps)


@pytest.mark.parametrize("kernel,attrs", [
    ((3, 3), {"pads": [1, 1, 1, 1]}),
    ((3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
    ((3, 3), {}),
    ((3, 3), {"pads": [2, 0, 1, 3], "strides": [2, 1]}),
    ((3, 3), {"auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    ((3, 3), {"auto_pad": "SAME_LOWER"}),
    ((3, 3), {"pads": [2, 2, 2, 2], "dilations": [2, 2]}),
    ((5, 5), {"pads": [2, 2, 2, 2], "strides": [3, 2]}),
    ((1, 3), {"pads": [0, 1, 0, 1]}),
    ((1, 1), {"strides": [2, 2]}),
    ((2, 4), {"auto_pad": "SAME_UPPER"}),
], ids=lambda v: "x".join(map(str, v)) if isinstance(v, tuple) else "-".join(
    f"{k}={w}" for k, w in v.items()) or "valid")
def test_channels_last_im2col(kernel, attrs):
    """Odd sizes, asymmetric pads, strides, dilations, a batch of 2; bias / none; Relu / Clip
    fused into the GEMM or not; the method is the one chosen."""
    _needs_packed_gemm()
    C, M = 56, 20  # sizes past the small-convolution gather path's
    for act, bias in [("Relu", True), (None, False), ("Clip", True)]:
        model, feeds = conv_model((2, C, 36, 38), rand(M, C, *kernel, scale=0.2),
                                  rand(M) if bias else None, act, **attrs)
        assert _nhwc_steps(session(model, threads=1)) == 1
        check(model, feeds, threads=1)
    check(*conv_model((1, C, 37, 35), rand(M, C, *kernel, scale=0.2), rand(M), "Relu",
                      **attrs), threads=2)  # the GEMM split over the threads


def test_channels_last_im2col_choice():
    method = conv_mod._dense_method
    packed = dict(threads=1, packed=True)
    # stride 1: the implicit GEMM from 8 channels on, bar Winograd's layers of 128+ channels
    assert method(64, 64, (3, 3), (1, 1), (1, 1), 1, (20, 20), **packed) == "nhwc"
    assert method(64, 64, (3, 3), (1, 1), (1, 1), 1, (56, 56), **packed) == "nhwc"
    assert method(128, 128, (3, 3), (1, 1), (1, 1), 1, (28, 28), **packed) == "winograd"
    assert method(256, 256, (3, 3), (1, 1), (1, 1), 1, (14, 14), **packed) == "nhwc"
    assert method(16, 16, (3, 3), (1, 1), (1, 1), 1, (80, 80), **packed) == "nhwc"
    assert method(4, 16, (3, 3), (1, 1), (1, 1), 1, (80, 80), **packed) == "hcw"
    # strided and undilated: the implicit GEMM, on an (H, C, W) buffer below 8 channels
    assert method(32, 64, (3, 3), (2, 2), (1, 1), 1, (40, 40), **packed) == "nhwc"
    assert method(16, 32, (3, 3), (2, 2), (1, 1), 1, (40, 40), **packed) == "nhwc"
    assert method(32, 32, (3, 3), (2, 2), (1, 1), 1, (80, 80), **packed) == "nhwc"
    assert method(128, 128, (3, 3), (2, 2), (1, 1), 1, (28, 28), **packed) == "nhwc"
    assert method(16, 32, (3, 1), (2, 2), (1, 1), 1, (80, 80), **packed) == "nhwc"
    assert method(16, 32, (3, 3), (2, 1), (1, 1), 1, (80, 80), **packed) == "nhwc"
    assert method(256, 512, (1, 1), (2, 2), (1, 1), 1, (28, 28), **packed) == "nhwc"
    # a small one too (a residual stage's shortcut: the stage's blocks keep the layout)
    assert method(320, 768, (1, 1), (2, 2), (1, 1), 1, (7, 7), **packed) == "nhwc"
    assert method(3, 16, (3, 3), (2, 2), (1, 1), 1, (160, 160), **packed) == "hcw"
    assert method(3, 64, (7, 7), (2, 2), (1, 1), 1, (112, 112), **packed) == "hcw"  # a stem
    # dilated: explicit im2col with 32+ channels up to 40 x 40 outputs, else BLAS
    assert method(32, 64, (3, 3), (1, 1), (2, 2), 1, (40, 40), **packed) == "nhwc"
    assert method(16, 32, (3, 3), (2, 2), (2, 2), 1, (80, 80), **packed) == "gemm"
    assert method(16, 32, (3, 3), (2, 2), (1, 1), 1, (40, 40)) == "gemm"  # not packed
    # no compiled GEMM, a 1x1, groups
    assert method(128, 32, (3, 3), (1, 1), (1, 1), 1, (28, 28), 1) == "shifted"
    assert method(64, 64, (1, 1), (1, 1), (1, 1), 1, (20, 20), **packed) == "gemm"
    # groups of 16+ channels: an implicit GEMM per group; narrower ones, dilated ones and
    # without the compiled GEMM, BLAS's per-group products
    assert method(64, 64, (3, 3), (1, 1), (1, 1), 2, (20, 20), **packed) == "grouped"
    assert method(64, 64, (3, 3), (2, 2), (1, 1), 4, None, **packed) == "grouped"
    assert method(64, 64, (3, 3), (1, 1), (1, 1), 8, (20, 20), **packed) == "gemm"
    assert method(64, 64, (3, 3), (1, 1), (2, 2), 2, (20, 20), **packed) == "gemm"
    assert method(64, 64, (3, 3), (1, 1), (1, 1), 2, (20, 20)) == "gemm"
    # sizes not known when prepared: as any size; dilated and strided, the BLAS methods
    assert method(64, 64, (3, 3), (1, 1), (1, 1), 1, None, **packed) == "nhwc"
    assert method(128, 128, (3, 3), (1, 1), (1, 1), 1, None, **packed) == "winograd"
    assert method(64, 64, (3, 3), (2, 2), (1, 1), 1, None, **packed) == "nhwc"
    assert method(64, 64, (3, 3), (3, 3), (1, 1), 1, None, **packed) == "nhwc"
    assert method(64, 64, (3, 3), (2, 2), (2, 2), 1, None, **packed) == "gemm"


def _implicit_steps(sess) -> int:
    return sum(getattr(s.kernel, "nhwc_packed", None) is not None or
               getattr(s.kernel, "hcw_packed", None) is not None
               for s in sess._program.full_plan.steps)


@pytest.mark.parametrize("C,kernel,attrs", [
    (3, (3, 3), {"pads": [1, 1, 1, 1]}),
    (16, (3, 3), {"pads": [1, 1, 1, 1]}),
    (5, (3, 3), {"pads": [0, 1, 1, 0]}),
    (16, (3, 3), {"auto_pad": "SAME_UPPER"}),
    (16, (3, 3), {"auto_pad": "SAME_LOWER"}),
    (16, (3, 3), {}),
    (4, (5, 5), {"pads": [2, 2, 2, 2]}),
    (3, (7, 7), {"pads": [3, 3, 3, 3]}),
    (8, (2, 2), {}),
    (6, (2, 3), {"pads": [1, 0, 0, 2]}),
], ids=lambda v: "x".join(map(str, v)) if isinstance(v, tuple) else "-".join(
    f"{k}={w}" for k, w in v.items()) if isinstance(v, dict) else str(v))
def test_strided_implicit_gemm(C, kernel, attrs):
    """Strided undilated convolutions on the implicit GEMM, its rows of A wrapping at each
    output row (Conv._conv_implicit; on an (H, C, W) buffer below 8 channels, channels-last
    from 8 on): odd sizes, asymmetric and SAME pads, kernels of 2 to 7, strides 2 and 3, a
    batch of 2; bias / none; Relu / Clip fused into the GEMM or not; split over 2 threads;
    onnxruntime's numbers."""
    _needs_packed_gemm()
    M = 24
    for act, bias, s in [("Relu", True, 2), (None, False, 2), ("Clip", True, 3)]:
        model, feeds = conv_model((2, C, 91, 88), rand(M, C, *kernel, scale=0.2),
                                  rand(M) if bias else None, act, strides=[s, s], **attrs)
        assert _implicit_steps(session(model, threads=1)) == 1
        check(model, feeds, threads=1)
    check(*conv_model((1, C, 63, 57), rand(M, C, *kernel, scale=0.2), rand(M), "Relu",
                      strides=[2, 2], **attrs), threads=2)
    check(*conv_model((1, C, 30, 33), rand(M, C, *kernel, scale=0.2), rand(M), None,
                      **attrs), threads=1)  # stride 1, each output row wrapping too


def _grouped_steps(sess) -> int:
    return sum(getattr(s.kernel, "grouped_packed", None) is not None
               for s in sess._program.full_plan.steps)


@pytest.mark.parametrize("C,M,group,kernel,attrs", [
    (128, 128, 2, (3, 3), {"pads": [1, 1, 1, 1]}),
    (128, 128, 8, (3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}),  # RegNet's 16 wide
    (96, 192, 3, (3, 3), {"pads": [0, 1, 1, 0], "strides": [2, 1]}),  # 32 in, 64 out
    (64, 80, 4, (5, 5), {"auto_pad": "SAME_UPPER"}),  # 20 out: a partial panel
    (64, 64, 2, (3, 3), {}),
], ids=lambda v: "x".join(map(str, v)) if isinstance(v, tuple) else "-".join(
    f"{k}={w}" for k, w in v.items()) if isinstance(v, dict) else str(v))
def test_grouped_implicit_gemm(C, M, group, kernel, attrs):
    """Grouped convolutions (ResNeXt / RegNet) of 16+ channels per group as one implicit
    GEMM per group on a group-major padded copy: strides, asymmetric and SAME pads, a
    partial panel of output channels, a batch of 2; the bias, a Relu / Clip fused; 1 and 2
    threads give the same bits; onnxruntime's numbers."""
    _needs_packed_gemm()
    w = rand(M, C // group, *kernel, scale=0.2)
    for act, bias in [("Relu", True), (None, False), ("Clip", True)]:
        model, feeds = conv_model((2, C, 19, 23), w, rand(M) if bias else None, act,
                                  group=group, **attrs)
        one = session(model, threads=1)
        assert _grouped_steps(one) == 1
        check(model, feeds, threads=1)
        two = session(model, threads=2).run(None, feeds)[0]
        assert two.tobytes() == one.run(None, feeds)[0].tobytes()


def test_grouped_convolutions_keep_the_layout_and_their_weight():
    """A ResNeXt-style block (1x1, grouped 3x3, 1x1, residual) stays channels-last through
    the grouped layer; its weight, released once packed, is rebuilt exactly for an input
    whose size only the run tells; narrow groups (8 channels) keep BLAS's products."""
    _needs_packed_gemm()
    C, G = 64, 4
    inits = [numpy_helper.from_array(rand(C, C, 1, 1, scale=0.2), "w0"),
             numpy_helper.from_array(rand(C, C // G, 3, 3, scale=0.2), "w1"),
             numpy_helper.from_array(rand(C, C, 1, 1, scale=0.2), "w2"),
             numpy_helper.from_array(rand(C, 8, 3, 3, scale=0.2), "w3")]
    nodes = [helper.make_node("Conv", ["X", "w0"], ["a"]),
             helper.make_node("Relu", ["a"], ["ar"]),
             helper.make_node("Conv", ["ar", "w1"], ["b"], group=G, pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["b"], ["br"]),
             helper.make_node("Conv", ["br", "w2"], ["c"]),
             helper.make_node("Add", ["c", "X"], ["r"]),
             helper.make_node("Conv", ["r", "w3"], ["Y"], group=8, pads=[1, 1, 1, 1])]
    graph = helper.make_graph(
        nodes, "resnext", [helper.make_tensor_value_info("X", TensorProto.FLOAT,
                                                         [1, C, "h", "w"])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    blob = model.SerializeToString()
    sess = session(blob, threads=1)
    grouped = [s.kernel for s in sess._program.full_plan.steps
               if getattr(s.kernel, "grouped_packed", None) is not None]
    assert len(grouped) == 1 and grouped[0].prepacked_inputs == (1,)
    convs = [s.kernel for s in sess._program.full_plan.steps if hasattr(s.kernel, "W_shape")]
    assert [bool(k.channels_last) for k in convs[:2]] == [True, True]
    np.testing.assert_array_equal(grouped[0]._weight(None), numpy_helper.to_array(inits[1]))
    theirs = ort.InferenceSession(blob, providers=["CPUExecutionProvider"])
    for h, wd in [(12, 12), (9, 14)]:
        feeds = {"X": rand(1, C, h, wd)}
        np.testing.assert_allclose(sess.run(None, feeds)[0], theirs.run(None, feeds)[0],
                                   rtol=1e-4, atol=1e-4)


def test_implicit_gemm_keeps_its_padded_buffer_and_blocks_per_shape():
    """A small channels-last convolution pads into a buffer of its own whose zero borders
    are written once, and keeps its product's argument blocks per input shape: inputs of
    changing sizes (and values), in turn and from two threads at once, give onnxruntime's
    numbers each time."""
    import threading

    _needs_packed_gemm()
    C, M = 16, 24
    w, b = rand(M, C, 3, 3, scale=0.2), rand(M)
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, C, "h", "w"])
    graph = helper.make_graph(
        [helper.make_node("Conv", ["X", "W", "B"], ["Y"], pads=[1, 1, 1, 1])], "g", [x],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "B")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    data = model.SerializeToString()
    theirs = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    ours = session(data, threads=1)
    sizes = [(12, 12), (9, 14), (12, 12), (5, 3), (9, 14)]
    for h, wd in sizes:
        feeds = {"X": rand(1, C, h, wd)}
        np.testing.assert_allclose(ours.run(None, feeds)[0], theirs.run(None, feeds)[0],
                                   rtol=1e-4, atol=1e-4)
    (conv,) = [s.kernel for s in ours._program.full_plan.steps
               if getattr(s.kernel, "nhwc_packed", None) is not None]
    assert len(conv.launches) == 2 and conv.__dict__.get("_pads") is not None  # (5 x 3: small)
    errors = []

    def worker(h, wd):
        try:
            for _ in range(20):
                feeds = {"X": rand(1, C, h, wd)}
                np.testing.assert_allclose(ours.run(None, feeds)[0],
                                           theirs.run(None, feeds)[0], rtol=1e-4, atol=1e-4)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=size) for size in sizes[:2]]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


@pytest.mark.parametrize("C", [3, 64], ids=["hcw", "nhwc"])
def test_implicit_gemm_padded_copy_splits_at_two_threads(monkeypatch, C):
    """The implicit GEMM's zero-padded copy of a large input goes to the intra-op threads in
    ranges of rows of at least conv._PAD_BYTES (VGG-19's 64 channels at 224 x 224: 12.8 MB on
    one thread); the same bits at 1 and 2 threads, onnxruntime's numbers."""
    _needs_packed_gemm()
    from onnxrun.providers.cpu import parallel
    from onnxrun.providers.cpu.ops import conv

    pads = []

    def counted(fn, n, threads, bytes_per_item=1 << 20, least=None):
        ranges = parallel.ranges_for(n, threads, bytes_per_item, least)
        if getattr(fn, "__name__", "") == "pad_rows":
            pads.append(len(ranges))
        return parallel.run_ranges(fn, ranges)

    monkeypatch.setattr(parallel, "MIN_BYTES_PER_RANGE", None)
    monkeypatch.setattr(conv, "parallel_for", counted)
    side = 100 if C == 64 else 440  # padded input 2.3-2.6 MB (read and written: 2 ranges)
    model, feeds = conv_model((1, C, side, side), rand(16, C, 3, 3, scale=0.2), rand(16),
                              "Relu", pads=[1, 1, 1, 1])
    outs = []
    for threads in (1, 2):
        sess = session(model, threads)
        assert _implicit_steps(sess) == 1
        outs.append(sess.run(None, feeds)[0])
        assert pads[-1] == threads
    np.testing.assert_array_equal(outs[0], outs[1])
    check(model, feeds, threads=2)


@pytest.mark.parametrize("heads, size", [((1, 1), (40, 40)), ((2, 0), (30, 41)),
                                         ((0, 3), (45, 44))])
def test_channels_last_padded_copy_on_the_spinning_workers(monkeypatch, heads, size):
    """Channels-last pixels in and out: the borders zeroed, each image's rows copied by
    compiled.copy in ranges on spin.py's workers (at 2 threads), the input cut where it does
    not fit; the bytes of _pad_into."""
    from onnxrun.providers.cpu.compiled import copy, spin
    from onnxrun.providers.cpu.ops import conv

    if copy.unavailable() is not None or spin.usable() is None:
        pytest.skip("no compiled copy or spinning workers here")
    small = rand(1, 10, 10, 24).transpose(0, 3, 1, 2)  # under two ranges: numpy's copy
    assert not conv._pad_on_workers(
        np.empty((1, 12, 12, 24), np.float32).transpose(0, 3, 1, 2), small, heads, 2)
    monkeypatch.setattr(copy, "MIN_BYTES_PER_RANGE", 1024)
    forks = []
    run_blocks = spin.run_blocks
    monkeypatch.setattr(spin, "run_blocks", lambda job, b, t: forks.append(t) or
                        run_blocks(job, b, t))
    X = rand(2, 42, 43, 24).transpose(0, 3, 1, 2)  # (N, C, H, W) of channels-last pixels
    P = np.full((2, size[0], size[1], 24), np.nan, np.float32).transpose(0, 3, 1, 2)
    want = conv._pad_into(np.empty_like(P), X, heads)
    conv._pad_into_rows(P, X, heads, 2)
    assert forks and set(forks) == {2}
    np.testing.assert_array_equal(P, want)
    assert not conv._pad_on_workers(P, np.ascontiguousarray(X), heads, 2)  # NCHW: no


def test_channels_last_im2col_without_a_constant_weight_or_shapes():
    """A weight fed at run time takes the BLAS methods; a symbolic image size packs the
    weight of a dilated convolution (whose method depends on the size) at the first run, an
    undilated one's when the session is created."""
    _needs_packed_gemm()
    C, M = 40, 24
    model, feeds = conv_model((1, C, 12, 12), rand(M, C, 3, 3, scale=0.2), rand(M),
                              const=False, pads=[1, 1, 1, 1])
    sess = session(model, threads=1)
    check(model, feeds, threads=1)
    assert _nhwc_steps(sess) == 0
    w = rand(M, C, 3, 3, scale=0.2)
    inits = [numpy_helper.from_array(w, "W"), numpy_helper.from_array(rand(M), "B")]
    for attrs, known in [(dict(pads=[2, 2, 2, 2], dilations=[2, 2]), 0),
                         (dict(pads=[1, 1, 1, 1], strides=[2, 2]), 1)]:
        graph = helper.make_graph(
            [helper.make_node("Conv", ["X", "W", "B"], ["Y"], **attrs)],
            "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, C, "h", "w"])],
            [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)], inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8
        blob = model.SerializeToString()
        sess = session(blob, threads=1)
        assert _nhwc_steps(sess) == known
        for size in [(29, 21), (40, 42)]:
            check(blob, {"X": rand(1, C, *size)}, threads=1)
        sess.run(None, {"X": rand(1, C, 29, 21)})
        assert _nhwc_steps(sess) == 1


def test_channels_last_im2col_chain_with_a_residual():
    """conv -> conv (its input arrives channels-last) -> Add of the first output -> Relu
    (FusedConv's Z), -> conv: outputs equal onnxruntime's and the layout level 2's."""
    _needs_packed_gemm()
    C = 32
    inits = [numpy_helper.from_array(rand(C, C, 3, 3, scale=0.1), f"w{i}") for i in range(3)]
    inits += [numpy_helper.from_array(rand(C), f"b{i}") for i in range(3)]
    nodes = [
        helper.make_node("Conv", ["X", "w0", "b0"], ["a"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["a"], ["ar"]),
        helper.make_node("Conv", ["ar", "w1", "b1"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c", "ar"], ["r"]),
        helper.make_node("Relu", ["r"], ["rr"]),
        helper.make_node("Conv", ["rr", "w2", "b2"], ["Y"], pads=[1, 1, 1, 1], strides=[2, 2]),
    ]
    graph = helper.make_graph(
        nodes, "chain", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, C, 15, 17])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    blob, feeds = model.SerializeToString(), {"X": rand(2, C, 15, 17)}
    sess = session(blob, threads=1)
    assert _nhwc_steps(sess) == 3
    assert sum(getattr(s.kernel, "channels_last", False)
               for s in sess._program.full_plan.steps) >= 1
    check(blob, feeds, threads=1)
    opts = onnxrun.SessionOptions()
    opts.graph_optimization_level = onnxrun.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    plain = onnxrun.InferenceSession(blob, opts).run(None, feeds)[0]
    np.testing.assert_allclose(sess.run(None, feeds)[0], plain, rtol=1e-5, atol=1e-5)


# -- channels-last memory between convolutions ----------------------------------------------


def block_model(C=64, E=128, size=16, extra_output=False) -> tuple[bytes, dict]:
    """MobileNetV2-like: 1x1 expand + ReLU6, depthwise 3x3 + ReLU6, 1x1 project, residual
    Add, Winograd 3x3 + Relu, global average pool; optionally the depthwise output is also
    a graph output."""
    inits = []

    def const(name, value):
        inits.append(numpy_helper.from_array(value, name))
        return name

    lo, hi = const("lo", np.array(0, np.float32)), const("hi", np.array(6, np.float32))
    nodes = [
        helper.make_node("Conv", ["X", const("w1", rand(E, C, 1, 1, scale=0.2)),
                                  const("b1", rand(E))], ["e"]),
        helper.make_node("Clip", ["e", lo, hi], ["e6"]),
        helper.make_node("Conv", ["e6", const("w2", rand(E, 1, 3, 3)), const("b2", rand(E))],
                         ["d"], group=E, pads=[1, 1, 1, 1]),
        helper.make_node("Clip", ["d", lo, hi], ["d6"]),
        helper.make_node("Conv", ["d6", const("w3", rand(C, E, 1, 1, scale=0.1)),
                                  const("b3", rand(C))], ["p"]),
        helper.make_node("Add", ["p", "X"], ["r"]),
        helper.make_node("Conv", ["r", const("w4", rand(C, C, 3, 3, scale=0.05)),
                                  const("b4", rand(C))], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["cr"]),
        helper.make_node("GlobalAveragePool", ["cr"], ["Y"]),
    ]
    outputs = [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)]
    if extra_output:
        outputs.append(helper.make_tensor_value_info("d6", TensorProto.FLOAT, None))
    graph = helper.make_graph(
        nodes, "block", [helper.make_tensor_value_info("X", TensorProto.FLOAT,
                                                       ["n", C, size, size])], outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString(), {"X": rand(2, C, size, size)}


@pytest.mark.parametrize("extra_output", [False, True])
def test_channels_last_chain(extra_output):
    model, feeds = block_model(C=128, extra_output=extra_output)  # Winograd-sized
    sess = session(model, threads=1)
    kernels = [s.kernel for s in sess._program.full_plan.steps if hasattr(s.kernel, "prepared")]
    assert "winograd" in kernels[3].prepared or kernels[3].winograd_packed is not None
    # expand -> depthwise -> project: channels-last unless the depthwise output is also a
    # graph output; the project output meets the NCHW graph input in the Add; Winograd's
    # output goes to the pool
    assert [k.channels_last for k in kernels] == [True, not extra_output, False, True]
    check(model, feeds, rtol=1e-3, atol=1e-4, threads=1)


def test_channels_last_detection():
    X = np.zeros((2, 3, 4, 5), np.float32)
    assert not conv_mod._is_channels_last(X)
    assert conv_mod._is_channels_last(np.zeros((2, 4, 5, 3), np.float32).transpose(0, 3, 1, 2))
    Y = np.zeros((2, 4, 5, 3), np.float32).transpose(0, 3, 1, 2)
    conv_mod.add_channel_bias(Y, np.arange(3, dtype=np.float32).reshape(3, 1, 1))
    np.testing.assert_array_equal(Y[:, 2], 2)


def test_scratch_reuse():
    a = conv_mod.scratch("test_slot", (4, 5), np.float32)
    b = conv_mod.scratch("test_slot", (2, 3), np.float64)
    assert a.shape == (4, 5) and b.shape == (2, 3) and b.dtype == np.float64
    assert np.shares_memory(a, b)  # one buffer per slot and thread


# -- pooling ----------------------------------------------------------------------------------


def pool_model(op, x_shape, **attrs) -> tuple[bytes, dict]:
    node = helper.make_node(op, ["X"], ["Y"], **attrs)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, list(x_shape))],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 9
    return model.SerializeToString(), {"X": rand(*x_shape)}


POOL_CASES = [
    ((3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ((3, 3), {"strides": [1, 1], "pads": [1, 1, 1, 1]}),
    ((3, 3), {"strides": [2, 2], "pads": [0, 0, 1, 1]}),
    ((3, 3), {"strides": [2, 2], "ceil_mode": 1}),
    ((2, 2), {"strides": [2, 2]}),
    ((3, 2), {"strides": [1, 2], "pads": [2, 0, 1, 1], "dilations": [2, 1]}),
]


@pytest.mark.parametrize("channels", [8, 64], ids=["planar", "channels_last"])
@pytest.mark.parametrize("kernel,attrs", POOL_CASES)
def test_max_and_average_pool(channels, kernel, attrs):
    x = (2, channels, 9, 10)
    check(*pool_model("MaxPool", x, kernel_shape=list(kernel), **attrs))
    if "dilations" in attrs:
        return  # onnxruntime's AveragePool has no dilations before opset 19 kernels
    for include_pad in (0, 1):
        check(*pool_model("AveragePool", x, kernel_shape=list(kernel),
                          count_include_pad=include_pad, **attrs))


@pytest.mark.parametrize("shape", [(2, 16, 7, 7), (1, 3, 5, 6)])
def test_global_windows(shape):
    check(*pool_model("AveragePool", shape, kernel_shape=list(shape[2:])))
    check(*pool_model("GlobalAveragePool", shape))
    check(*pool_model("LpPool", shape, kernel_shape=list(shape[2:])), rtol=1e-3)


def test_pool_axis_reduction_without_padding():
    X = rand(1, 2, 7, 5)
    got = pool_mod._reduce_axis(X, 2, 4, 3, 2, 1, 1, -np.inf, np.maximum)
    padded = np.pad(X, ((0, 0), (0, 0), (1, 1), (0, 0)), constant_values=-np.inf)
    want = np.stack([padded[:, :, 2 * i:2 * i + 3].max(axis=2) for i in range(4)], axis=2)
    np.testing.assert_array_equal(got, want)



# -- small convolutions: one gather of the columns, one GEMM --------------------------------------

SMALL = [
    ((1, 129, 4), (128, 129, 3), {"pads": [1, 1]}),  # a streaming model's 1-D layer
    ((1, 64, 4), (64, 64, 3), {"pads": [1, 1], "strides": [2]}),
    ((1, 1, 640), (258, 1, 256), {"strides": [128]}),  # an STFT as a convolution
    ((1, 8, 9), (16, 8, 3), {"pads": [2, 0], "dilations": [2]}),
    ((1, 16, 5, 6), (24, 16, 3, 3), {"pads": [1, 1, 1, 1]}),
    ((1, 16, 7, 5), (24, 16, 3, 2), {"pads": [0, 2, 1, 0], "strides": [2, 1]}),
    ((1, 8, 6, 6), (8, 8, 3, 3), {"auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    ((1, 8, 9, 9), (8, 8, 3, 3), {"pads": [2, 2, 2, 2], "dilations": [2, 2]}),
]


@pytest.mark.parametrize("act", [None, "Relu"])
@pytest.mark.parametrize("x_shape, w_shape, attrs", SMALL)
def test_small_convolutions_take_the_gather_path_with_onnxruntimes_results(x_shape, w_shape,
                                                                           attrs, act):
    before = conv_mod._small_conv_columns.cache_info()
    model, feeds = conv_model(x_shape, rand(*w_shape, scale=0.3), rand(w_shape[0]), act,
                              **attrs)
    check(model, feeds, threads=1)
    after = conv_mod._small_conv_columns.cache_info()
    assert after.hits + after.misses > before.hits + before.misses  # the path was taken


@pytest.mark.parametrize("act", [None, "Relu"])
@pytest.mark.parametrize("x_shape, w_shape, attrs", SMALL)
def test_small_convolutions_plan_once_per_shape_with_the_first_runs_results(x_shape, w_shape,
                                                                            attrs, act):
    """The second run of a shape reuses the first's plan (no geometry, method choice or column
    indices again) and gives bit for bit what a first run of the same input gives."""
    model, feeds = conv_model(x_shape, rand(*w_shape, scale=0.3), rand(w_shape[0]), act,
                              **attrs)
    sess = session(model, threads=1)
    sess.run(None, feeds)
    later = {"X": rand(*x_shape)}
    calls = conv_mod._small_conv_columns.cache_info()
    got = sess.run(None, later)[0]
    again = conv_mod._small_conv_columns.cache_info()
    assert again.hits + again.misses == calls.hits + calls.misses  # planned: not recomputed
    np.testing.assert_array_equal(got, session(model, threads=1).run(None, later)[0])
    expected = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, later)
    np.testing.assert_allclose(got, expected[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("x_shape, w_shape, attrs, padded", [(*SMALL[0], True),
                                                             (*SMALL[2], False)])
def test_small_convolution_plan_keeps_its_zero_padded_input(x_shape, w_shape, attrs, padded):
    """A planned small convolution that reads padding copies its input into a buffer with the
    zero column appended, kept with the plan and reused by the next run; one that reads no
    padding gathers from the input itself. Later runs give a first run's numbers."""
    model, feeds = conv_model(x_shape, rand(*w_shape, scale=0.3), rand(w_shape[0]), "Relu",
                              **attrs)
    sess = session(model, threads=1)
    sess.run(None, feeds)
    (kernel,) = [s.kernel for s in sess._program.steps if getattr(s.kernel, "small_plans", 0)]
    pool = kernel.small_plans[x_shape][8]
    assert (pool is not None) == padded
    buffers = None if pool is None else [id(b) for b in pool]
    for _ in range(3):
        later = {"X": rand(*x_shape)}
        got = sess.run(None, later)[0]
        np.testing.assert_array_equal(got, session(model, threads=1).run(None, later)[0])
    if padded:
        assert [id(b) for b in pool] == buffers and len(pool) == 1
        assert not pool[0][:, -1].any()  # the appended column stays zero


def fused_conv_model(x_shape, w, b, activation, z=False, **attrs) -> tuple[bytes, dict]:
    """One com.microsoft FusedConv (the optimizer's form of Conv + activation), with Z
    summed in before the activation when ``z``."""
    out_shape = [x_shape[0], w.shape[0]]
    inits = [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "B")]
    inputs = [helper.make_tensor_value_info("X", TensorProto.FLOAT, list(x_shape))]
    feeds = {"X": rand(*x_shape)}
    names = ["X", "W", "B"]
    if z:
        probe = onnxrun.InferenceSession(conv_model(x_shape, w, b, **attrs)[0])
        zshape = list(probe.run(None, {"X": feeds["X"]})[0].shape)
        inputs.append(helper.make_tensor_value_info("Z", TensorProto.FLOAT, zshape))
        feeds["Z"] = rand(*zshape)
        names.append("Z")
    extra = {"activation": activation} if activation else {}
    node = helper.make_node("FusedConv", names, ["Y"], domain="com.microsoft", **extra, **attrs)
    graph = helper.make_graph([node], "g", inputs,
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 8
    del out_shape
    return model.SerializeToString(), feeds


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("activation,z", [("", False), ("Relu", False), ("Sigmoid", False),
                                          ("Relu", True), ("", True)])
@pytest.mark.parametrize("x_shape, w_shape, attrs", SMALL[:6])
def test_small_convolutions_on_the_compiled_gemm_match_blas(x_shape, w_shape, attrs,
                                                            activation, z, threads,
                                                            monkeypatch):
    """A planned small float32 convolution runs its transposed product on the compiled GEMM
    (bias and Relu in its epilogue; an STFT's one channel read in place as overlapping
    rows): within float32 rounding of the BLAS path it replaces, run after run, at 1 and 2
    threads (the AVX2 code here)."""
    if conv_mod._packable(np.float32) is False:
        pytest.skip("no compiled kernels here")
    model, feeds = fused_conv_model(x_shape, rand(*w_shape, scale=0.3), rand(w_shape[0]),
                                    activation, z, **attrs)
    sess = session(model, threads)
    got = [sess.run(None, feeds)[0] for _ in range(3)]
    (kernel,) = [s.kernel for s in sess._program.steps if getattr(s.kernel, "small_plans", 0)]
    assert kernel.small_plans[x_shape][10] is not None  # the compiled product was planned
    monkeypatch.setattr(conv_mod, "_packable", lambda dtype: False)
    blas_sess = session(model, threads)
    want = blas_sess.run(None, feeds)[0]
    (kernel,) = [s.kernel for s in blas_sess._program.steps
                 if getattr(s.kernel, "small_plans", 0)]
    assert kernel.small_plans[x_shape][10] is None
    K = w_shape[1] * int(np.prod(w_shape[2:]))
    for g in got:
        assert g.shape == want.shape
        np.testing.assert_allclose(g, want, rtol=1e-5, atol=1e-6 * K ** 0.5 * 8)
    np.testing.assert_array_equal(got[1], got[2])


@pytest.mark.parametrize("threads", [1, 2])
def test_small_convolution_chain_hands_on_its_transposed_product(threads, monkeypatch):
    """A streaming model's 1-D layers: a small convolution read only by the next one hands
    it its (frames, channels) product as a strided view (no copy); the graph's output comes
    C-contiguous, and the numbers are the BLAS path's within float32 rounding."""
    if conv_mod._packable(np.float32) is False:
        pytest.skip("no compiled kernels here")
    shapes = [(129, 128, 1), (128, 64, 2), (64, 64, 2), (64, 128, 1)]
    inits, nodes, x = [], [], "X"
    for i, (c, m, s) in enumerate(shapes):
        inits += [numpy_helper.from_array(rand(m, c, 3, scale=0.1), f"W{i}"),
                  numpy_helper.from_array(rand(m), f"B{i}")]
        nodes.append(helper.make_node("Conv", [x, f"W{i}", f"B{i}"], [f"C{i}"], pads=[1, 1],
                                      strides=[s]))
        nodes.append(helper.make_node("Relu", [f"C{i}"], [f"R{i}"]))
        x = f"R{i}"
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 129, 4])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    model = model.SerializeToString()
    feeds = {"X": rand(1, 129, 4)}
    sess = session(model, threads)
    got = [sess.run(None, feeds)[0] for _ in range(3)]
    kernels = [s.kernel for s in sess._program.steps if getattr(s.kernel, "small_plans", 0)]
    assert [k.strided_out for k in kernels] == [True, True, True, False]
    assert all(g.flags.c_contiguous for g in got)
    expected = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)
    np.testing.assert_allclose(got[0], expected[0], rtol=1e-4, atol=1e-5)
    monkeypatch.setattr(conv_mod, "_packable", lambda dtype: False)
    want = session(model, threads).run(None, feeds)[0]
    for g in got:
        np.testing.assert_allclose(g, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(got[1], got[2])
