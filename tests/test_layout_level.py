"""The layout level (channels-last convolution outputs, chosen when kernels are prepared)
belongs to ORT_ENABLE_LAYOUT (3) and above, as onnxruntime's NCHWc layout does; results do not
depend on it, and the optimization report counts it."""

from __future__ import annotations

import collections
from pathlib import Path

import numpy as np
import onnx.parser
import onnxruntime as ort
import pytest

import onnxrun

MODELS = Path(__file__).parent / "models"
LEVELS = onnxrun.GraphOptimizationLevel


def _session(level) -> onnxrun.InferenceSession:
    so = onnxrun.SessionOptions()
    so.graph_optimization_level = level
    return onnxrun.InferenceSession(str(MODELS / "mobilenet_tiny.onnx"), so)


def _channels_last_steps(sess) -> int:
    return sum(bool(getattr(step.kernel, "channels_last", False)) for step in sess._program.steps)


@pytest.mark.parametrize("level", [LEVELS.ORT_DISABLE_ALL, LEVELS.ORT_ENABLE_BASIC,
                                   LEVELS.ORT_ENABLE_EXTENDED])
def test_below_all_every_convolution_writes_nchw(level):
    assert _channels_last_steps(_session(level)) == 0


def test_at_all_depthwise_chains_go_channels_last_with_the_same_results():
    fast, plain = _session(LEVELS.ORT_ENABLE_ALL), _session(LEVELS.ORT_ENABLE_EXTENDED)
    assert _channels_last_steps(fast) > 0
    data = np.load(MODELS / "mobilenet_tiny.inputs.npz")
    feeds = {k.split("/", 1)[1]: v for k, v in data.items() if k.startswith("0/")}
    for got, want in zip(fast.run(None, feeds), plain.run(None, feeds), strict=True):
        assert got.flags.c_contiguous or got.ndim < 4  # graph outputs stay NCHW
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_the_layout_level_is_level_3_and_the_report_counts_it():
    layout = _session(LEVELS.ORT_ENABLE_LAYOUT)
    turned = _channels_last_steps(layout)
    assert turned > 0
    report = layout.get_optimization_report()
    convs = sum(hasattr(s.kernel, "channels_last") for s in layout._program.steps)
    assert report.layout == (turned, convs)
    assert f"{turned} of {convs} convolution outputs kept channels-last" in report.format()
    below = _session(LEVELS.ORT_ENABLE_EXTENDED).get_optimization_report()
    assert below.layout is None and "channels-last" not in below.format()


# A MobileNetV3-style block: the activations between the convolutions are HardSwish and SiLU
# (x * Sigmoid(x), which the optimizer fuses into QuickGelu); they keep the layout.
_V3_BLOCK = onnx.parser.parse_model("""
<ir_version: 8, opset_import: ["" : 17]>
g (float[1, 16, 12, 12] X) => (float[1, 16, 12, 12] Y) {
    a = Conv <kernel_shape = [1, 1]> (X, W1)
    b = HardSwish (a)
    c = Conv <kernel_shape = [3, 3], pads = [1, 1, 1, 1], group = 64> (b, W2)
    s = Sigmoid (c)
    d = Mul (c, s)
    Y = Conv <kernel_shape = [1, 1]> (d, W3)
}
""")


def _v3_session(level) -> onnxrun.InferenceSession:
    rng = np.random.default_rng(0)
    model = onnx.ModelProto()
    model.CopyFrom(_V3_BLOCK)
    for name, shape in (("W1", (64, 16, 1, 1)), ("W2", (64, 1, 3, 3)), ("W3", (16, 64, 1, 1))):
        model.graph.initializer.append(onnx.numpy_helper.from_array(
            rng.normal(0, 0.3, shape).astype(np.float32), name))
    so = onnxrun.SessionOptions()
    so.graph_optimization_level = level
    return onnxrun.InferenceSession(model.SerializeToString(), so)


def test_activations_between_convolutions_keep_the_layout_with_the_same_results():
    layout, plain = _v3_session(LEVELS.ORT_ENABLE_LAYOUT), _v3_session(LEVELS.ORT_ENABLE_EXTENDED)
    # the expansion (read by the depthwise one through HardSwish) and the depthwise convolution
    # (read by the projection through SiLU) both write channels-last
    assert _channels_last_steps(layout) == 2
    assert _channels_last_steps(plain) == 0
    x = np.random.default_rng(1).normal(size=(1, 16, 12, 12)).astype(np.float32)
    got, want = layout.run(None, {"X": x})[0], plain.run(None, {"X": x})[0]
    assert got.flags.c_contiguous  # the graph's output is NCHW
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


# -- beyond convolutions: Concat, Split, pools, Resize keep channels-last memory -------------

# A YOLO-style neck: convolutions with SiLU, a Split of the channels, a max pool, an upsampling
# Resize, Concats joining them. (A second model's graph output is a Concat: it stays NCHW.)
_NECK = onnx.parser.parse_model("""
<ir_version: 8, opset_import: ["" : 17]>
g (float[2, 24, 15, 17] X) => (float[2, 40, 30, 34] Y) {
    a = Conv <kernel_shape = [3, 3], pads = [1, 1, 1, 1]> (X, W1, B1)
    sa = Sigmoid (a)
    a2 = Mul (a, sa)
    p, q = Split <axis = 1> (a2, S)
    m = MaxPool <kernel_shape = [5, 5], pads = [2, 2, 2, 2]> (q)
    v = AveragePool <kernel_shape = [3, 3], pads = [1, 0, 1, 2], strides = [1, 1]> (m)
    c = Concat <axis = 1> (p, q, v)
    d = Conv <kernel_shape = [3, 3], pads = [1, 1, 1, 1]> (c, W2, B2)
    r = Relu (d)
    u = Resize <mode = "nearest"> (r, , SC)
    u2 = Conv <kernel_shape = [1, 1]> (u, W3)
    Y = Conv <kernel_shape = [3, 3], pads = [1, 1, 1, 1]> (u2, W4, B4)
}
""")


def _neck_model() -> bytes:
    rng = np.random.default_rng(3)
    model = onnx.ModelProto()
    model.CopyFrom(_NECK)
    for name, value in (("W1", rng.normal(0, 0.2, (32, 24, 3, 3))), ("B1", rng.normal(0, 1, 32)),
                        ("W2", rng.normal(0, 0.1, (40, 48, 3, 3))), ("B2", rng.normal(0, 1, 40)),
                        ("W3", rng.normal(0, 0.2, (40, 40, 1, 1))),
                        ("W4", rng.normal(0, 0.1, (40, 40, 3, 3))), ("B4", rng.normal(0, 1, 40)),
                        ("SC", np.array([1, 1, 2, 2])), ("S", np.array([16, 16]))):
        dtype = np.int64 if name == "S" else np.float32
        model.graph.initializer.append(onnx.numpy_helper.from_array(value.astype(dtype), name))
    return model.SerializeToString()


def _neck_session(level, blob):
    so = onnxrun.SessionOptions()
    so.graph_optimization_level = level
    so.intra_op_num_threads = 1
    return onnxrun.InferenceSession(blob, so)


def _both_levels(blob) -> tuple[onnxrun.InferenceSession, onnxrun.InferenceSession]:
    """Sessions at the layout level (3) and at level 2, 1 thread."""
    return _neck_session(LEVELS.ORT_ENABLE_LAYOUT, blob), _neck_session(
        LEVELS.ORT_ENABLE_EXTENDED, blob)


def _needs_compiled_gemm() -> None:
    from onnxrun.providers.cpu.ops import conv as conv_mod

    if not conv_mod._packable(np.float32):
        pytest.skip("the compiled float32 GEMM does not run here")


def _assert_matches(layout, plain, blob, feeds) -> list[np.ndarray]:
    """The layout level's outputs are NCHW and equal level 2's and onnxruntime's."""
    import onnxruntime as ort

    got = layout.run(None, feeds)
    want, theirs = plain.run(None, feeds), ort.InferenceSession(
        blob, providers=["CPUExecutionProvider"]).run(None, feeds)
    for g, w, t in zip(got, want, theirs, strict=True):
        assert g.flags.c_contiguous  # graph outputs are NCHW
        # (atol as against onnxruntime: a channels-last AveragePool sums each window in row
        # order, compiled/pool.py, the NCHW one by axis; values here reach 20)
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-4)
        np.testing.assert_allclose(g, t, rtol=1e-4, atol=1e-4)
    return got


def _spy_layouts(sess) -> dict[str, tuple[str, bool]]:
    """Wraps every kernel of ``sess``: after a run, output name -> (operator, whether that
    4-D output came channels-last)."""
    seen = {}
    for i, step in enumerate(sess._program.steps):
        def spy(*args, _k=step.kernel, _op=step.node.op_type, _name=step.node.outputs[0].name):
            out = _k(*args)
            first = out[0] if isinstance(out, tuple) else out
            seen[_name] = (_op, first.ndim == 4 and
                           first.transpose(0, 2, 3, 1).strides[-1] == first.itemsize)
            return out
        sess._program.steps[i] = step._replace(kernel=spy)
    program = sess._program
    program._plans.clear()
    program.full_plan = program.plan(tuple(program.output_slots))
    program.specializer = None
    return seen


def test_concat_split_pools_and_resize_keep_the_layout_with_onnxruntimes_results():
    _needs_compiled_gemm()

    blob = _neck_model()
    layout, plain = _both_levels(blob)
    # every convolution but the last (a graph output's) writes channels-last
    assert _channels_last_steps(layout) == 3 and _channels_last_steps(plain) == 0
    assert layout.get_optimization_report().layout == (3, 4)
    seen = _spy_layouts(layout)
    x = np.random.default_rng(4).normal(size=(2, 24, 15, 17)).astype(np.float32)
    _assert_matches(layout, plain, blob, {"X": x})
    for name in ("m", "v", "c", "u"):  # MaxPool, AveragePool, Concat, Resize: channels-last
        assert seen[name][1], (name, seen[name])


def test_a_concat_of_channels_last_operands_that_is_a_graph_output_stays_nchw():
    """Two channels-last convolution outputs (each also read by a convolution) joined by a
    Concat that is a graph output: the Concat writes NCHW, and its operands stay NCHW too."""
    model = onnx.parser.parse_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[1, 16, 20, 20] X) => (float[1, 64, 20, 20] Z, float[1, 32, 20, 20] Y) {
        a = Conv <kernel_shape = [3, 3], pads = [1, 1, 1, 1]> (X, W1)
        b = Conv <kernel_shape = [3, 3], pads = [1, 1, 1, 1]> (X, W2)
        Z = Concat <axis = 1> (a, b)
        c = Add (a, b)
        Y = Conv <kernel_shape = [3, 3], pads = [1, 1, 1, 1]> (c, W3)
    }
    """)
    rng = np.random.default_rng(6)
    for name, shape in (("W1", (32, 16, 3, 3)), ("W2", (32, 16, 3, 3)), ("W3", (32, 32, 3, 3))):
        model.graph.initializer.append(onnx.numpy_helper.from_array(
            rng.normal(0, 0.2, shape).astype(np.float32), name))
    blob = model.SerializeToString()
    layout, plain = _both_levels(blob)
    x = rng.normal(size=(1, 16, 20, 20)).astype(np.float32)
    for g, w in zip(layout.run(None, {"X": x}), plain.run(None, {"X": x}), strict=True):
        assert g.flags.c_contiguous
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def test_a_1x1_convolution_of_a_channels_last_input_with_an_nchw_output_runs_compiled():
    """A detection head's last 1x1 convolutions: the input comes channels-last, the output
    goes to a Concat and Reshape that need NCHW. The 1x1 runs on the compiled GEMM (its
    panels, the original weight dropped) and copies its product out to NCHW; with a Relu
    fused or a residual added after, into the executor's buffer or not, the results match
    level 2's and onnxruntime's."""
    _needs_compiled_gemm()
    model = onnx.parser.parse_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[1, 16, 20, 20] X) => (float[1, 80, 400] Y, float[1, 24, 20, 20] R) {
        a = Conv <kernel_shape = [3, 3], pads = [1, 1, 1, 1]> (X, W1)
        s = Sigmoid (a)
        t = Mul (a, s)
        b = Conv (t, W2, B2)
        c = Conv (t, W3)
        d = Relu (c)
        j = Concat <axis = 1> (b, d)
        Y = Reshape (j, shape)
        e = Conv (t, W4, B4)
        R = Add (e, X2)
    }
    """)
    rng = np.random.default_rng(7)
    for name, value in (("W1", rng.normal(0, 0.2, (32, 16, 3, 3))),
                        ("W2", rng.normal(0, 0.2, (48, 32, 1, 1))), ("B2", rng.normal(size=48)),
                        ("W3", rng.normal(0, 0.2, (32, 32, 1, 1))),
                        ("W4", rng.normal(0, 0.2, (24, 32, 1, 1))), ("B4", rng.normal(size=24)),
                        ("X2", rng.normal(size=(1, 24, 20, 20))),
                        ("shape", np.array([1, 80, 400]))):
        model.graph.initializer.append(onnx.numpy_helper.from_array(
            value.astype(np.int64 if name == "shape" else np.float32), name))
    blob = model.SerializeToString()
    layout, plain = _both_levels(blob)
    heads = [s.kernel for s in layout._program.steps
             if getattr(s.kernel, "W_shape", None) is not None and s.kernel.W_shape[2:] == (1, 1)]
    assert len(heads) == 3
    for k in heads:
        assert not k.channels_last and k.gemm_t_packed is not None and k.prepacked_inputs == (1,)
    x = rng.normal(size=(1, 16, 20, 20)).astype(np.float32)
    for _ in range(4):  # from the fourth run, the executor's buffers (memory.py)
        _assert_matches(layout, plain, blob, {"X": x})


def test_a_segmentation_head_upsamples_channels_last_into_the_executors_buffers():
    """A DBNet-style neck and head: nearest Resizes of channels-last maps (the last take into
    the executor's buffer, a first one into scratch), then two tiled ConvTransposes (2x2,
    stride 2): the first writes channels-last for its Relu and the second, which reads that
    layout in place; the graph's output stays NCHW. Over several runs (the executor's
    buffers from the fourth), the results match level 2's and onnxruntime's."""
    from onnxrun.providers.cpu.ops import conv as conv_mod

    model = onnx.parser.parse_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[1, 8, 12, 12] X) => (float[1, 1, 96, 96] Y) {
        a = Conv <kernel_shape = [3, 3], pads = [1, 1, 1, 1]> (X, W1)
        r = Relu (a)
        u = Resize <mode = "nearest"> (r, , scales)
        v = Resize <mode = "nearest"> (u, , scales)
        c = Conv <kernel_shape = [3, 3], pads = [1, 1, 1, 1]> (v, W2)
        d = Relu (c)
        t = ConvTranspose <kernel_shape = [2, 2], strides = [2, 2]> (d, W3, B3)
        e = Relu (t)
        f = ConvTranspose <kernel_shape = [2, 2], strides = [2, 2]> (e, W4, B4)
        Y = Sigmoid (f)
    }
    """)
    rng = np.random.default_rng(9)
    for name, value in (("W1", rng.normal(0, 0.3, (16, 8, 3, 3))),
                        ("W2", rng.normal(0, 0.2, (16, 16, 3, 3))),
                        ("W3", rng.normal(0, 0.3, (16, 16, 2, 2))), ("B3", rng.normal(size=16)),
                        ("W4", rng.normal(0, 0.3, (16, 1, 2, 2))), ("B4", rng.normal(size=1)),
                        ("scales", np.array([1, 1, 2, 2]))):
        model.graph.initializer.append(onnx.numpy_helper.from_array(
            value.astype(np.float32), name))
    blob = model.SerializeToString()
    layout, plain = _both_levels(blob)
    transposes = [s.kernel for s in layout._program.steps
                  if isinstance(s.kernel, conv_mod.ConvTranspose)]
    assert [k.tiles is not None for k in transposes] == [True, True]
    assert [k.channels_last for k in transposes] == [True, False]
    assert not any(k.channels_last for s in plain._program.steps
                   if isinstance(k := s.kernel, conv_mod.ConvTranspose))
    x = rng.normal(size=(1, 8, 12, 12)).astype(np.float32)
    for _ in range(5):
        _assert_matches(layout, plain, blob, {"X": x})


def test_nearest_resize_writes_into_a_channels_last_buffer_it_is_handed():
    """The Resize kernel's channels-last nearest path: into ``out`` where it is laid out
    channels-last (the executor's buffer after a channels-last result), a fresh array where
    it is laid out otherwise; the values are those of the NCHW path."""
    from onnxrun.providers.cpu.ops.resize import Resize

    model = onnx.parser.parse_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[1, 8, 6, 5] X) => (float[1, 8, 12, 10] Y) {
        Y = Resize <mode = "nearest"> (X, , scales)
    }
    """)
    model.graph.initializer.append(onnx.numpy_helper.from_array(
        np.array([1, 1, 2, 2], np.float32), "scales"))
    sess = _neck_session(LEVELS.ORT_ENABLE_LAYOUT, model.SerializeToString())
    kernel = next(s.kernel for s in sess._program.steps if isinstance(s.kernel, Resize))
    kernel.keep_layout = True  # as for a channels-last input inside a CNN
    rng = np.random.default_rng(4)
    x = rng.normal(size=(1, 8, 6, 5)).astype(np.float32)
    want = sess.run(None, {"X": x})[0]
    x_cl = np.ascontiguousarray(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    scales = np.array([1, 1, 2, 2], np.float32)
    buffer = np.empty((1, 12, 10, 8), np.float32).transpose(0, 3, 1, 2)
    got = kernel(x_cl, None, scales, out=buffer)
    assert np.shares_memory(got, buffer)
    np.testing.assert_array_equal(got, want)
    nchw = np.empty((1, 8, 12, 10), np.float32)
    got = kernel(x_cl, None, scales, out=nchw)
    assert not np.shares_memory(got, nchw)
    np.testing.assert_array_equal(got, want)


def test_layout_keeping_kernels_on_channels_last_inputs():
    """Each kernel alone: channels-last operands (dense, or a channel range of such) give a
    channels-last result equal to the NCHW one; mixed operands, another axis or a kernel not
    allowed to keep the layout give NCHW; a bad Concat still fails as np.concatenate does."""
    from onnxrun.providers.cpu.ops.pool import AveragePool, MaxPool
    from onnxrun.providers.cpu.ops.resize import Resize
    from onnxrun.providers.cpu.ops.tensor import Concat

    class Ctx:
        opset = 17
        session_options = None
        node = None

        def output_used(self, i):
            return i == 0

    def cl(a):
        return np.ascontiguousarray(a.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)

    def is_cl(a):
        return a.transpose(0, 2, 3, 1).flags.c_contiguous

    rng = np.random.default_rng(5)
    a, b = (rng.normal(size=(2, c, 7, 9)).astype(np.float32) for c in (3, 5))
    wide = cl(rng.normal(size=(2, 8, 7, 9)).astype(np.float32))
    for kernel, args, want in (
            (Concat(Ctx(), axis=1), (cl(a), cl(b), wide[:, 2:6]), np.concatenate(
                (a, b, wide[:, 2:6]), axis=1)),
            (MaxPool(Ctx(), kernel_shape=[3, 2], pads=[1, 0, 1, 1], strides=[2, 1]), (cl(b),),
             MaxPool(Ctx(), kernel_shape=[3, 2], pads=[1, 0, 1, 1], strides=[2, 1])(b)),
            (AveragePool(Ctx(), kernel_shape=[2, 3], strides=[1, 2]), (wide[:, 1:7],),
             AveragePool(Ctx(), kernel_shape=[2, 3], strides=[1, 2])(
                 np.ascontiguousarray(wide[:, 1:7]))),
            (Resize(Ctx(), mode="nearest"), (cl(b), None, np.array([1, 1, 2, 1.5], np.float32)),
             Resize(Ctx(), mode="nearest")(b, None, np.array([1, 1, 2, 1.5], np.float32)))):
        kernel.keep_layout = True
        got = kernel(*args)
        assert is_cl(got), type(kernel).__name__
        if isinstance(kernel, AveragePool):  # compiled: each window summed in row order
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
        else:
            np.testing.assert_array_equal(got, want)
        kernel.keep_layout = False
        assert kernel(*args).flags.c_contiguous
    concat = Concat(Ctx(), axis=1)
    concat.keep_layout = True
    mixed = concat(a, cl(b))  # an NCHW operand with a channels-last one: channels-last
    assert is_cl(mixed)
    np.testing.assert_array_equal(mixed, np.concatenate((a, b), axis=1))
    assert concat(a, b).flags.c_contiguous  # NCHW operands: NCHW
    with pytest.raises(ValueError):
        concat(cl(a), cl(b[:, :, :6]))


def test_a_dense_block_stays_channels_last_past_batch_norms_and_an_nchw_operand():
    """DenseNet-style: the stem (im2col on BLAS, its output copied channels-last since a
    MaxPool passes the layout on) -> MaxPool, joined by Concats with the layers' channels-last
    outputs; BatchNormalization and Relu between keep the layout; results equal onnxruntime's
    and level 2's."""
    _needs_compiled_gemm()
    model = onnx.parser.parse_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[1, 3, 40, 44] X) => (float[1, 64, 1, 1] Y) {
        s = Conv <kernel_shape = [7, 7], pads = [3, 3, 3, 3], strides = [2, 2]> (X, W0)
        m = MaxPool <kernel_shape = [3, 3], pads = [1, 1, 1, 1], strides = [2, 2]> (s)
        n1 = BatchNormalization (m, G0, B0, M0, V0)
        r1 = Relu (n1)
        a1 = Conv <kernel_shape = [1, 1]> (r1, W1)
        b1 = Relu (a1)
        c1 = Conv <kernel_shape = [3, 3], pads = [1, 1, 1, 1]> (b1, W2)
        k1 = Concat <axis = 1> (m, c1)
        n2 = BatchNormalization (k1, G1, B1, M1, V1)
        r2 = Relu (n2)
        a2 = Conv <kernel_shape = [1, 1]> (r2, W3)
        b2 = Relu (a2)
        c2 = Conv <kernel_shape = [3, 3], pads = [1, 1, 1, 1]> (b2, W4)
        k2 = Concat <axis = 1> (k1, c2)
        Y = GlobalAveragePool (k2)
    }
    """)
    rng = np.random.default_rng(7)
    params = {"W0": (32, 3, 7, 7), "W1": (32, 32, 1, 1), "W2": (16, 32, 3, 3),
              "W3": (32, 48, 1, 1), "W4": (16, 32, 3, 3)}
    for name, shape in params.items():
        model.graph.initializer.append(onnx.numpy_helper.from_array(
            rng.normal(0, 0.2, shape).astype(np.float32), name))
    for i, c in ((0, 32), (1, 48)):
        for name, value in ((f"G{i}", rng.uniform(0.5, 1.5, c)), (f"B{i}", rng.normal(0, 1, c)),
                            (f"M{i}", rng.normal(0, 1, c)), (f"V{i}", rng.uniform(0.5, 2, c))):
            model.graph.initializer.append(onnx.numpy_helper.from_array(
                value.astype(np.float32), name))
    blob = model.SerializeToString()
    layout, plain = _both_levels(blob)
    assert _channels_last_steps(layout) == 5  # the stem too
    _assert_matches(layout, plain, blob, {"X": rng.normal(size=(1, 3, 40, 44)).astype(np.float32)})


@pytest.mark.parametrize("c1,c2", [(16, 32), (128, 128)])
def test_residual_sums_stay_channels_last(c1, c2):
    """ResNet-style (the light zoo's joins are Sum): stem -> MaxPool -> bottleneck blocks whose
    Sum joins a channels-last shortcut; every convolution writes channels-last, results equal
    onnxruntime's and level 2's. At 128 channels the 3x3 layers run Winograd, whose output
    the 1x1 layer after it reads channels-last (on the compiled GEMM: ResNet-50 -4% against
    NCHW there, where BLAS ran the 1x1 layers)."""
    _needs_compiled_gemm()
    from onnxrun.providers.cpu.ops import conv as conv_mod

    model = onnx.parser.parse_model(f"""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[1, 3, 96, 88] X) => (float[1, {c2}, 1, 1] Y) {{
        s = Conv <kernel_shape = [7, 7], pads = [3, 3, 3, 3], strides = [2, 2]> (X, W0)
        m = MaxPool <kernel_shape = [3, 3], pads = [1, 1, 1, 1], strides = [2, 2]> (s)
        d = Conv <kernel_shape = [1, 1]> (m, W1)
        a = Conv <kernel_shape = [1, 1]> (m, W2)
        ar = Relu (a)
        b = Conv <kernel_shape = [3, 3], pads = [1, 1, 1, 1]> (ar, W3)
        br = Relu (b)
        c = Conv <kernel_shape = [1, 1]> (br, W4)
        r1 = Sum (c, d)
        o1 = Relu (r1)
        e = Conv <kernel_shape = [1, 1]> (o1, W5)
        er = Relu (e)
        f = Conv <kernel_shape = [3, 3], pads = [1, 1, 1, 1]> (er, W6)
        fr = Relu (f)
        h = Conv <kernel_shape = [1, 1]> (fr, W7)
        r2 = Sum (h, o1)
        o2 = Relu (r2)
        Y = GlobalAveragePool (o2)
    }}
    """)
    rng = np.random.default_rng(8)
    for name, shape in (("W0", (c1, 3, 7, 7)), ("W1", (c2, c1, 1, 1)), ("W2", (c1, c1, 1, 1)),
                        ("W3", (c1, c1, 3, 3)), ("W4", (c2, c1, 1, 1)), ("W5", (c1, c2, 1, 1)),
                        ("W6", (c1, c1, 3, 3)), ("W7", (c2, c1, 1, 1))):
        model.graph.initializer.append(onnx.numpy_helper.from_array(
            rng.normal(0, 0.3 * (16 / c1) ** 0.5, shape).astype(np.float32), name))
    blob = model.SerializeToString()
    layout, plain = _both_levels(blob)
    kinds = [conv_mod.conv_kind(step.node) for step in layout._program.steps
             if step.node.op_type in ("Conv", "FusedConv")]
    assert kinds.count("winograd") == (2 if c1 >= 128 else 0)
    assert _channels_last_steps(layout) == 8
    _assert_matches(layout, plain, blob, {"X": rng.normal(size=(1, 3, 96, 88)).astype(np.float32)})


_SHUFFLE = onnx.parser.parse_model("""
<ir_version: 8, opset_import: ["" : 17]>
g (float[1, 3, 62, 54] X) => (float[1, 48] Y) {
    s = Conv <kernel_shape = [3, 3], pads = [1, 1, 1, 1], strides = [2, 2]> (X, W0)
    m = MaxPool <kernel_shape = [3, 3], pads = [1, 1, 1, 1], strides = [2, 2]> (m0)
    m0 = Relu (s)
    a = Conv <kernel_shape = [1, 1], group = 4> (m, W1, B1)
    ar = Relu (a)
    r = Reshape (ar, S1)
    t = Transpose <perm = [0, 2, 1, 3, 4]> (r)
    sh = Reshape (t, S2)
    d = Conv <kernel_shape = [3, 3], pads = [1, 1, 1, 1], strides = [2, 2], group = 48> (sh, W2)
    e = Conv <kernel_shape = [1, 1], group = 4> (d, W3, B3)
    p = AveragePool <kernel_shape = [3, 3], pads = [1, 1, 1, 1], strides = [2, 2]> (m)
    c = Concat <axis = 1> (e, p)
    cr = Relu (c)
    f = Conv <kernel_shape = [1, 1], group = 4> (cr, W4)
    fr = Relu (f)
    r2 = Reshape (fr, S3)
    t2 = Transpose <perm = [0, 2, 1, 3, 4]> (r2)
    sh2 = Reshape (t2, S4)
    h = Conv <kernel_shape = [3, 3], pads = [1, 1, 1, 1], group = 48> (sh2, W5, B5)
    k = Conv <kernel_shape = [1, 1], group = 4> (h, W6)
    j = Sum (k, cr)
    o = Relu (j)
    q = AveragePool <kernel_shape = [8, 7]> (o)
    Y = Flatten (q)
}
""")


def _shuffle_model() -> bytes:
    rng = np.random.default_rng(11)
    model = onnx.ModelProto()
    model.CopyFrom(_SHUFFLE)
    for name, value in (("W0", rng.normal(0, 0.3, (24, 3, 3, 3))),
                        ("W1", rng.normal(0, 0.3, (48, 6, 1, 1))), ("B1", rng.normal(0, 1, 48)),
                        ("W2", rng.normal(0, 0.3, (48, 1, 3, 3))),
                        ("W3", rng.normal(0, 0.3, (24, 12, 1, 1))), ("B3", rng.normal(0, 1, 24)),
                        ("W4", rng.normal(0, 0.3, (48, 12, 1, 1))),
                        ("W5", rng.normal(0, 0.3, (48, 1, 3, 3))), ("B5", rng.normal(0, 1, 48)),
                        ("W6", rng.normal(0, 0.3, (48, 12, 1, 1))),
                        ("S1", np.array([1, 4, 12, 16, 14])), ("S2", np.array([1, -1, 16, 14])),
                        ("S3", np.array([1, 4, 12, 8, 7])), ("S4", np.array([0, 48, 8, 7]))):
        dtype = np.int64 if name.startswith("S") else np.float32
        model.graph.initializer.append(onnx.numpy_helper.from_array(value.astype(dtype), name))
    return model.SerializeToString()


def test_shufflenet_units_stay_channels_last_through_grouped_1x1_and_the_shuffle(monkeypatch):
    """ShuffleNet's units: grouped 1x1 convolutions on the compiled GEMM (a GEMM per group on
    channels-last rows), the channel shuffle (Reshape-Transpose-Reshape) passing the layout on
    with one copy (the compiled shuffle's), depthwise layers of stride 2 and 1, AveragePool +
    Concat and a residual Sum (with its Relu, the last grouped 1x1's Z); every convolution
    writes channels-last, results equal level 2's and onnxruntime's."""
    _needs_compiled_gemm()
    from onnxrun.providers.cpu.compiled import shuffle

    shuffles = []
    real = shuffle.shuffle
    monkeypatch.setattr(shuffle, "shuffle", lambda X, b, out=None: shuffles.append(X.shape) or
                        real(X, b, out))
    blob = _shuffle_model()
    layout, plain = _both_levels(blob)
    assert _channels_last_steps(layout) == 7 and _channels_last_steps(plain) == 0
    grouped = [s.kernel for s in layout._program.steps
               if s.node.op_type in ("Conv", "FusedConv") and s.node.attr("group", 1) == 4]
    assert len(grouped) == 4 and all(k.group_packed is not None for k in grouped)
    seen = _spy_layouts(layout)
    x = np.random.default_rng(12).normal(size=(1, 3, 62, 54)).astype(np.float32)
    _assert_matches(layout, plain, blob, {"X": x})
    # every 4-D value channels-last, the shuffles' ends (sh, sh2) included; k + cr -> Relu
    # is one FusedConv writing o, cr its Z (ConvAddActivationFusion)
    for name in ("m0", "m", "ar", "sh", "d", "e", "p", "c", "fr", "sh2", "h", "o"):
        assert seen[name][1], (name, seen[name])
    assert [len(s.node.inputs) for s in layout._program.steps
            if s.node.outputs[0].name == "o"] == [4]
    assert len(shuffles) >= 2  # both shuffles of each layout-level run compiled


def test_the_shuffle_and_grouped_1x1_write_into_the_executors_buffers(monkeypatch):
    """The shuffle's one copy (a Reshape that accepts ``out``) and the grouped 1x1
    convolutions go into the blocks memory.py hands them from the third run on (noted,
    recorded, then given), with the same numbers; the other Reshapes (views) get none."""
    _needs_compiled_gemm()
    from onnxrun import memory
    from onnxrun.execute import CompiledSteps
    from onnxrun.providers.cpu.ops import tensor
    from onnxrun.providers.cpu.ops.conv import Conv

    given, grouped = [], []
    real, real_grouped = tensor._shuffled_channels_last, Conv._grouped_1x1

    def spy(data, target, out=None):
        Y = real(data, target, out)
        given.append(out is not None and np.shares_memory(Y, out))
        return Y

    def spy_grouped(self, X, b, Z, act, out=None):
        Y = real_grouped(self, X, b, Z, act, out)
        grouped.append(out is not None and np.shares_memory(Y, out))
        return Y

    monkeypatch.setattr(tensor, "_shuffled_channels_last", spy)
    monkeypatch.setattr(Conv, "_grouped_1x1", spy_grouped)
    monkeypatch.setattr(memory, "MIN_BYTES", 1024)  # this model's values are small
    blob = _shuffle_model()
    layout, plain = _both_levels(blob)
    assert sum(bool(getattr(s.kernel, "accepts_out", False)) for s in layout._program.steps
               if s.node.op_type == "Reshape") == 2  # the shuffles' ends, not their starts
    x = np.random.default_rng(14).normal(size=(1, 3, 62, 54)).astype(np.float32)
    want = plain.run(None, {"X": x})[0]
    for _ in range(CompiledSteps.GENERATE_AFTER + 3):
        np.testing.assert_allclose(layout.run(None, {"X": x})[0], want, rtol=1e-4, atol=1e-4)
    # 2 shuffles and 4 grouped convolutions a run: none given a buffer in the first two
    # runs (noted, recorded), every one from the fourth on (the third probes)
    assert not any(given[:4]) and given[6:] and all(given[6:]), given
    assert not any(grouped[:8]) and grouped[12:] and all(grouped[12:]), grouped


def test_batch_norm_of_a_channels_last_input_stays_channels_last_bit_for_bit(monkeypatch):
    """BatchNormalization at inference (a DenseNet's after each Concat) on channels-last
    memory: rows of pixels in long blocks (conv.scale_shift_channels), the NCHW path's numbers
    bit for bit, the result channels-last; a channel range of such an array too."""
    from onnxrun.providers.cpu.ops import conv as conv_mod
    from onnxrun.providers.cpu.ops.normalization import BatchNormalization

    blocks = []
    real = conv_mod.scale_shift_channels  # (normalization.py takes it from conv.py per call)
    monkeypatch.setattr(conv_mod, "scale_shift_channels", lambda *a, **k: blocks.append(1) or
                        real(*a, **k))

    class Ctx:
        opset = 15
        node = None

        def constant(self, i):
            return None

    rng = np.random.default_rng(13)
    bn = BatchNormalization(Ctx())
    for shape in ((2, 24, 7, 9), (1, 5, 3, 700), (1, 300, 4, 4), (0, 3, 4, 4), (1, 3, 0, 4)):
        X = rng.normal(size=shape).astype(np.float32)
        params = [rng.uniform(0.5, 1.5, shape[1]).astype(np.float32),
                  rng.normal(size=shape[1]).astype(np.float32),
                  rng.normal(size=shape[1]).astype(np.float32),
                  rng.uniform(0.5, 2, shape[1]).astype(np.float32)]
        want = bn(X, *params)
        cl = np.ascontiguousarray(X.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
        if X.size == 0:  # numpy gives an empty array zero strides: channels-last ones
            N, C, H, W = shape
            cl = np.lib.stride_tricks.as_strided(
                np.empty(1, np.float32), shape, (4 * H * W * C, 4, 4 * W * C, 4 * C))
        got = bn(cl, *params)
        assert got.transpose(0, 2, 3, 1).flags.c_contiguous
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(bn(cl[:, 1:], *(p[1:] for p in params)), want[:, 1:])
    assert len(blocks) == 10  # the channels-last calls took the blocked path
    bn(X, *params)
    assert len(blocks) == 10  # NCHW: numpy's broadcast as before


def test_batch_norm_of_a_channels_last_input_splits_on_the_spinning_workers(monkeypatch):
    """At 2+ intra-op threads a large channels-last BatchNormalization's rows of pixels go to
    spin.py's workers (compiled/scale_shift.py: a multiply, then an add, each rounded): the
    NCHW numpy path's bits, NaN, infinities and signed zeros included; a small one, and any
    at 1 thread, is one compiled pass on the calling thread."""
    from onnxrun.providers.cpu.compiled import spin
    from onnxrun.providers.cpu.ops.normalization import BatchNormalization

    if spin.unavailable() is not None:
        pytest.skip(spin.unavailable())
    from onnxrun.providers.cpu.compiled import scale_shift

    forks, passes = [], []
    fork = spin.Pool.fork
    monkeypatch.setattr(spin.Pool, "fork", lambda self, job, argv, **kw: forks.append(
        len(argv)) or fork(self, job, argv, **kw))
    real = scale_shift.scale_shift
    monkeypatch.setattr(scale_shift, "scale_shift", lambda *a: passes.append(real(*a)) or
                        passes[-1])

    class Ctx:
        opset = 15
        node = None

        def __init__(self, threads):
            self.session_options = onnxrun.SessionOptions()
            self.session_options.intra_op_num_threads = threads

        def constant(self, i):
            return None

    rng = np.random.default_rng(17)
    for shape, split in (((1, 97, 40, 41), True), ((2, 24, 7, 9), False)):
        X = rng.normal(size=shape).astype(np.float32)
        X.reshape(-1)[:6] = [np.nan, np.inf, -np.inf, -0.0, 0.0, 1e-38]
        params = [rng.uniform(0.5, 1.5, shape[1]).astype(np.float32),
                  rng.normal(size=shape[1]).astype(np.float32),
                  rng.normal(size=shape[1]).astype(np.float32),
                  rng.uniform(0.5, 2, shape[1]).astype(np.float32)]
        params[0][:2] = [-1.0, 0.0]
        want = BatchNormalization(Ctx(1))(X, *params)  # NCHW: numpy's broadcast
        cl = np.ascontiguousarray(X.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
        for threads in (1, 2, 3):
            passes.clear()
            got = BatchNormalization(Ctx(threads))(cl, *params)
            assert got.transpose(0, 2, 3, 1).flags.c_contiguous
            assert got.transpose(0, 2, 3, 1).tobytes() == want.transpose(0, 2, 3, 1).tobytes()
            assert passes == [True]  # the compiled pass, at 1 thread too (one call there)
        assert bool(forks) == split
        forks.clear()
        # a range of a wider buffer's channels (a DenseNet's Concat output), read in place
        passes.clear()
        got = BatchNormalization(Ctx(1))(cl[:, 1:], *(p[1:] for p in params))
        assert passes == [True]
        np.testing.assert_array_equal(got.view(np.uint32), want[:, 1:].view(np.uint32))


def _pooled_model(lines: list[str], inits: dict, side: int, channels: int) -> bytes:
    """The model of ``lines`` (ONNX text) from X (1, 3, side, side) to Y (1, channels, 1, 1),
    with ``inits`` as float32 initializers."""
    model = onnx.parser.parse_model(f"""
<ir_version: 8, opset_import: ["" : 17]>
g (float[1, 3, {side}, {side}] X) => (float[1, {channels}, 1, 1] Y) {{
{chr(10).join(lines)}
}}
""")
    for name, value in inits.items():
        model.graph.initializer.append(onnx.numpy_helper.from_array(value.astype(np.float32),
                                                                    name))
    return model.SerializeToString()


def _convs_in(graph, order: str, seed: int) -> list:
    """The graph's Conv / FusedConv nodes in graph order, reversed, or shuffled by ``seed``."""
    convs = [n for n in graph.nodes if n.op_type in ("Conv", "FusedConv")]
    if order == "backward":
        return convs[::-1]
    if order == "shuffled":
        return [convs[i] for i in np.random.default_rng(seed).permutation(len(convs))]
    return convs


def _residual_chain(blocks: int, channels: int = 32) -> bytes:
    """ShuffleNet-like residual blocks without convolutions on the skip path, deeper than the
    layout walks' depth limit: a_{i+1} = Relu(a_i + Conv1x1(DepthwiseConv3x3(a_i)))."""
    lines, inits = ["    a0 = Conv <kernel_shape = [1, 1]> (X, Win)"], {}
    rng = np.random.default_rng(14)
    inits["Win"] = rng.normal(0, 0.3, (channels, 3, 1, 1))
    for i in range(blocks):
        lines += [f"    d{i} = Conv <kernel_shape = [3, 3], pads = [1, 1, 1, 1], "
                  f"group = {channels}> (a{i}, Wd{i})",
                  f"    e{i} = Conv <kernel_shape = [1, 1]> (d{i}, Wp{i})",
                  f"    s{i} = Add (a{i}, e{i})",
                  f"    a{i + 1} = Relu (s{i})"]
        inits[f"Wd{i}"] = rng.normal(0, 0.3, (channels, 1, 3, 3))
        inits[f"Wp{i}"] = rng.normal(0, 0.1, (channels, channels, 1, 1))
    lines.append(f"    Y = GlobalAveragePool (a{blocks})")
    return _pooled_model(lines, inits, 9, channels)


def test_fused_residual_chain_stays_channels_last():
    """The chain's Adds as FusedConv's Z (ConvAddActivationFusion): a Z read is a join with
    the convolution's own output, one walk on from it (two walks, one for the output's
    layout and one for its readers, doubled at every block: 30 blocks never finished);
    every convolution channels-last, onnxruntime's numbers (to float32 rounding: the Add
    graph's layouts differ where the depth limit cuts its walks, and with them the sums'
    order)."""
    from onnxrun.providers.cpu.ops import conv as conv_mod

    blob = _residual_chain(30)
    sess = onnxrun.InferenceSession(blob)
    graph = sess._model.graph
    convs = _convs_in(graph, "forward", 0)
    assert len(convs) == 61
    assert sum(len(n.inputs) > 3 and n.inputs[3] is not None for n in convs) == 30
    assert all(conv_mod.channels_last_output(n) for n in convs)
    x = np.random.default_rng(16).normal(size=(1, 3, 9, 9)).astype(np.float32)
    want = ort.InferenceSession(blob, providers=["CPUExecutionProvider"]).run(None, {"X": x})
    np.testing.assert_allclose(sess.run(None, {"X": x})[0], want[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("order", ["forward", "backward", "shuffled"])
def test_remembered_layout_walks_answer_as_fresh_walks(monkeypatch, order):
    """The layout walks' remembered answers (conv._WALKS) are the answers of fresh walks, in
    whatever order the convolutions ask, on a chain deeper than the walks' depth limit (where
    an answer found near the limit must not be reused further from it)."""
    from onnxrun.providers.cpu.ops import conv as conv_mod

    # the Adds kept (no FusedConv Z): walks through joins, cut by the depth limit mid-chain
    sess = onnxrun.InferenceSession(_residual_chain(30),
                                    disabled_optimizers=["ConvAddActivationFusion"])
    graph = sess._model.graph
    convs = _convs_in(graph, order, 15)
    assert len(convs) == 61
    conv_mod._WALKS.pop(graph, None)
    remembered = [conv_mod.channels_last_output(n) for n in convs]
    assert conv_mod._WALKS.get(graph)  # answers were kept
    monkeypatch.setattr(conv_mod, "_walk_memo", lambda value: None)
    fresh = [conv_mod.channels_last_output(n) for n in convs]
    assert remembered == fresh
    assert any(fresh) and not all(fresh)  # the chain has both answers


def _dense_block(layers: int, channels: int = 16, growth: int = 8) -> bytes:
    """DenseNet-style layers: x_{i+1} = Concat(x_i, Conv3x3(Relu(Conv1x1(Relu(x_i))))), each
    Concat read by the next one and by the next layer."""
    lines = ["    x0 = Conv <kernel_shape = [1, 1]> (X, Win)"]
    rng = np.random.default_rng(18)
    inits = {"Win": rng.normal(0, 0.3, (channels, 3, 1, 1))}
    c = channels
    for i in range(layers):
        lines += [f"    r{i} = Relu (x{i})",
                  f"    b{i} = Conv <kernel_shape = [1, 1]> (r{i}, Wb{i})",
                  f"    q{i} = Relu (b{i})",
                  f"    y{i} = Conv <kernel_shape = [3, 3], pads = [1, 1, 1, 1]> (q{i}, Wy{i})",
                  f"    x{i + 1} = Concat <axis = 1> (x{i}, y{i})"]
        inits[f"Wb{i}"] = rng.normal(0, 0.3, (4 * growth, c, 1, 1))
        inits[f"Wy{i}"] = rng.normal(0, 0.1, (growth, 4 * growth, 3, 3))
        c += growth
    lines.append(f"    Y = GlobalAveragePool (x{layers})")
    return _pooled_model(lines, inits, 8, c)


@pytest.mark.parametrize("order", ["forward", "backward", "shuffled"])
def test_layout_walks_around_concats_walk_each_value_once(monkeypatch, order):
    """Around a dense block's Concats the walks meet the same value with other Concats
    already being decided up the call chain (``joins``); where the walk from it asks about
    none of them it is answered from conv._WALKS (keyed by the whole set, the 12-layer block
    walked x0's readers 12 times, 196 walks for 75 values), and the answers are those of
    fresh walks."""
    from onnxrun.providers.cpu.ops import conv as conv_mod

    sess = onnxrun.InferenceSession(_dense_block(12), providers=["CPUExecutionProvider"])
    graph = sess._model.graph
    convs = _convs_in(graph, order, 16)
    assert len(convs) == 25
    walked = collections.Counter()

    def counted(walk):
        def step(value, *args):
            walked[walk.__name__, value.name] += 1
            return walk(value, *args)
        return step

    monkeypatch.setattr(conv_mod, "_readers_walk", counted(conv_mod._readers_walk))
    monkeypatch.setattr(conv_mod, "_writes_walk", counted(conv_mod._writes_walk))
    conv_mod._WALKS.pop(graph, None)
    remembered = [conv_mod.channels_last_output(n) for n in convs]
    assert walked and max(walked.values()) == 1, walked.most_common(3)
    monkeypatch.setattr(conv_mod, "_walk_memo", lambda value: None)
    fresh = [conv_mod.channels_last_output(n) for n in convs]
    assert remembered == fresh
    assert any(fresh) and not all(fresh)


def test_a_remembered_walk_is_not_reused_where_the_depth_limit_would_cut_it(monkeypatch):
    """conv._remembered keeps a walk's answer with how deep it went: asked again from deeper
    down, where a fresh walk would meet the depth limit, the walk is taken afresh."""
    from onnxrun.providers.cpu.ops import conv as conv_mod

    chain = "\n".join(f"    r{i + 1} = Relu (r{i})" for i in range(12))
    sess = onnxrun.InferenceSession(onnx.parser.parse_model(f"""
<ir_version: 8, opset_import: ["" : 17]>
g (float[2] r0) => (float[2] r12) {{
{chain}
}}
""").SerializeToString(), providers=["CPUExecutionProvider"])
    graph = sess._model.graph
    start = graph.nodes[0].outputs[0]  # r1
    steps = []

    def walk(value, threads, joins, depth):  # to the graph output: 11 steps down
        steps.append(depth)
        if depth > conv_mod._LAYOUT_DEPTH:
            return "cut"
        if not value.uses:
            return "end"
        return conv_mod._remembered(walk, value.uses[0][0].outputs[0], threads, joins,
                                    depth + 1)

    conv_mod._WALKS.pop(graph, None)
    assert conv_mod._remembered(walk, start, 1, frozenset(), 0) == "end"
    assert len(steps) == 12
    steps.clear()
    assert conv_mod._remembered(walk, start, 1, frozenset(), 30) == "end"  # remembered
    assert steps == []
    limit = conv_mod._LAYOUT_DEPTH
    assert conv_mod._remembered(walk, start, 1, frozenset(), limit - 5) == "cut"  # afresh
    assert steps[-1] == limit + 1
    steps.clear()
    assert conv_mod._remembered(walk, start, 1, frozenset(), limit - 5) == "cut"
    assert steps  # an answer that met the limit is not kept


def test_remembered_shapes_follow_a_replaced_type():
    """conv._shape remembers a value's shape per graph by its type object: a value given
    another type (as shape inference or a released initializer's type do) is read afresh."""
    from onnxrun.ir.serde import tensor_type
    from onnxrun.providers.cpu.ops import conv as conv_mod

    sess = onnxrun.InferenceSession(_residual_chain(1), providers=["CPUExecutionProvider"])
    value = sess._model.graph.nodes[0].outputs[0]
    assert conv_mod._dims(value) == (1, 32, 9, 9)
    value.type = tensor_type(np.zeros((2, 32, 5, 5), np.float32))
    assert conv_mod._dims(value) == (2, 32, 5, 5) and conv_mod._rank(value) == 4
    value.type = tensor_type(np.zeros((2, 32), np.float32))
    assert conv_mod._dims(value) == (2, 32) and conv_mod._rank(value) == 2


# A DenseNet layer whose BatchNormalization was exported as Mul and Add of per-channel
# constants (the light zoo's densenet121), and an SE block's gate: joins with one operand of
# one pixel, which numpy broadcasts over the image's channels-last memory
_PER_CHANNEL = onnx.parser.parse_model("""
<ir_version: 8, opset_import: ["" : 17]>
g (float[1, 16, 12, 12] X) => (float[1, 24, 12, 12] Y) {
    a = Conv <kernel_shape = [3, 3], pads = [1, 1, 1, 1]> (X, W1, B1)
    c = Concat <axis = 1> (X, a)
    m = Mul (c, S)
    s = Add (m, T)
    r = Relu (s)
    b = Conv <kernel_shape = [1, 1]> (r, W2, B2)
    g = GlobalAveragePool (b)
    e = Sigmoid (g)
    f = Mul (b, e)
    Y = Conv <kernel_shape = [1, 1]> (f, W3)
}
""")


def test_per_channel_operands_keep_the_layout_with_onnxruntimes_results():
    rng = np.random.default_rng(5)
    model = onnx.ModelProto()
    model.CopyFrom(_PER_CHANNEL)
    for name, value in (("W1", rng.normal(0, 0.2, (32, 16, 3, 3))), ("B1", rng.normal(0, 1, 32)),
                        ("S", rng.uniform(0.5, 1.5, (48, 1, 1))),
                        ("T", rng.normal(0, 1, (1, 48, 1, 1))),
                        ("W2", rng.normal(0, 0.2, (64, 48, 1, 1))), ("B2", rng.normal(0, 1, 64)),
                        ("W3", rng.normal(0, 0.2, (24, 64, 1, 1)))):
        model.graph.initializer.append(onnx.numpy_helper.from_array(value.astype(np.float32),
                                                                    name))
    data = model.SerializeToString()
    sessions = {}
    for level in (LEVELS.ORT_ENABLE_ALL, LEVELS.ORT_ENABLE_EXTENDED):
        so = onnxrun.SessionOptions()
        so.graph_optimization_level = level
        sessions[level] = onnxrun.InferenceSession(data, so)
    # the 3x3 convolution (its output joined with X by the Concat, scaled per channel) and
    # the 1x1 one (gated by the SE block's per-channel Mul) both write channels-last
    assert sessions[LEVELS.ORT_ENABLE_ALL].get_optimization_report().layout == (2, 3)
    x = rng.normal(size=(1, 16, 12, 12)).astype(np.float32)
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"X": x})[0]
    for sess in sessions.values():
        got = sess.run(None, {"X": x})[0]
        assert got.flags.c_contiguous
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


_PATCH_EMBEDDING = onnx.parser.parse_model("""
<ir_version: 8, opset_import: ["" : 17]>
g (float[1, 3, 32, 64] X, float[1, 512, 64] R) => (float[1, 512, 64] Y) {
    c1 = Conv <kernel_shape = [3, 3], pads = [1, 1, 1, 1], strides = [2, 2]> (X, W1, B1)
    d = Div (c1, sqrt2)
    e = Erf (d)
    e1 = Add (e, one)
    m = Mul (c1, e1)
    g1 = Mul (m, half)
    c2 = Conv <kernel_shape = [3, 3], pads = [1, 1, 1, 1], strides = [1, 1]> (g1, W2, B2)
    r = Reshape (c2, shape)
    t = Transpose <perm = [0, 2, 1]> (r)
    s = Add (t, R)
    Y = LayerNormalization <axis = -1> (s, gamma, beta)
}
""")


def test_patch_embedding_tokens_come_contiguous_with_onnxruntimes_results(monkeypatch):
    """A vision transformer's patch embedding, Conv -> Gelu (erf form, fused) -> Conv ->
    Reshape (N, C, H*W) -> Transpose (0, 2, 1): the convolution the tokens come from writes
    channels-last (through the fused Gelu too), so the tokens the residual sum and its
    LayerNormalization (fused: SkipLayerNormalization) read are contiguous memory, no copy;
    onnxruntime's values at every level."""
    rng = np.random.default_rng(9)
    model = onnx.ModelProto()
    model.CopyFrom(_PATCH_EMBEDDING)
    for name, value in (("W1", rng.normal(0, 0.3, (32, 3, 3, 3))), ("B1", rng.normal(0, 1, 32)),
                        ("W2", rng.normal(0, 0.1, (64, 32, 3, 3))), ("B2", rng.normal(0, 1, 64)),
                        ("sqrt2", np.sqrt(2.0)), ("one", 1.0), ("half", 0.5),
                        ("gamma", rng.uniform(0.5, 1.5, 64)), ("beta", rng.normal(0, 1, 64))):
        model.graph.initializer.append(onnx.numpy_helper.from_array(
            np.asarray(value, np.float32), name))
    model.graph.initializer.append(onnx.numpy_helper.from_array(np.array([1, 64, 512]),
                                                                "shape"))
    data = model.SerializeToString()
    feeds = {"X": rng.normal(size=(1, 3, 32, 64)).astype(np.float32),
             "R": rng.normal(size=(1, 512, 64)).astype(np.float32)}
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    from onnxrun.providers.cpu.ops.contrib import transformer

    seen = []
    real = transformer.SkipLayerNormalization.__call__
    monkeypatch.setattr(transformer.SkipLayerNormalization, "__call__",
                        lambda self, X, K, *a, **k: seen.append(
                            X.flags.c_contiguous and K.flags.c_contiguous) or
                        real(self, X, K, *a, **k))
    for level in (LEVELS.ORT_ENABLE_ALL, LEVELS.ORT_ENABLE_EXTENDED):
        so = onnxrun.SessionOptions()
        so.graph_optimization_level = level
        sess = onnxrun.InferenceSession(data, so)
        if level == LEVELS.ORT_ENABLE_ALL:
            convs = [s for s in sess._program.steps if s.node.op_type in ("Conv", "FusedConv")]
            assert convs[-1].kernel.channels_last  # the tokens' convolution
        for _ in range(3):  # the memory pattern's runs too
            np.testing.assert_allclose(sess.run(None, feeds)[0], want, rtol=1e-4, atol=1e-4)
    assert seen[:3] == [True] * 3 and seen[3:] == [False] * 3  # NCHW below the layout level


# An EfficientNet block as PyTorch exports it (transformers' EfficientNet): ZeroPad2d's pads
# computed by a constant subgraph (ONNX inference then sizes nothing after the Pad), 1x1
# convolutions with padding="same" (auto_pad SAME_UPPER: no padding for a one-tap window), a
# depthwise convolution with SiLU and an SE block's per-channel gate.
_EFFICIENTNET_BLOCK = onnx.parser.parse_model("""
<ir_version: 8, opset_import: ["" : 17]>
g (float[1, 8, 15, 15] X) => (float[1, 8, 7, 7] Y) {
    p0 = Constant <value = int64[4] {0, 0, 0, 0}> ()
    p1 = Constant <value = int64[4] {0, 0, 1, 1}> ()
    pads = Concat <axis = 0> (p0, p1)
    x = Pad (X, pads)
    e = Conv <auto_pad = "SAME_UPPER", kernel_shape = [1, 1]> (x, We, Be)
    es = Sigmoid (e)
    ea = Mul (e, es)
    d = Conv <kernel_shape = [3, 3], strides = [2, 2], group = 32> (ea, Wd, Bd)
    ds = Sigmoid (d)
    da = Mul (d, ds)
    g = GlobalAveragePool (da)
    r = Conv <auto_pad = "SAME_UPPER", kernel_shape = [1, 1]> (g, Wr, Br)
    rs = Sigmoid (r)
    ra = Mul (r, rs)
    x2 = Conv <auto_pad = "SAME_UPPER", kernel_shape = [1, 1]> (ra, Wx, Bx)
    gate = Sigmoid (x2)
    h = Mul (da, gate)
    Y = Conv <auto_pad = "SAME_UPPER", kernel_shape = [1, 1]> (h, Wp, Bp)
}
""")


def test_an_efficientnet_block_as_pytorch_exports_it_goes_channels_last():
    rng = np.random.default_rng(11)
    model = onnx.ModelProto()
    model.CopyFrom(_EFFICIENTNET_BLOCK)
    for name, value in (("We", rng.normal(0, 0.3, (32, 8, 1, 1))), ("Be", rng.normal(0, 1, 32)),
                        ("Wd", rng.normal(0, 0.3, (32, 1, 3, 3))), ("Bd", rng.normal(0, 1, 32)),
                        ("Wr", rng.normal(0, 0.3, (4, 32, 1, 1))), ("Br", rng.normal(0, 1, 4)),
                        ("Wx", rng.normal(0, 0.3, (32, 4, 1, 1))), ("Bx", rng.normal(0, 1, 32)),
                        ("Wp", rng.normal(0, 0.3, (8, 32, 1, 1))), ("Bp", rng.normal(0, 1, 8))):
        model.graph.initializer.append(onnx.numpy_helper.from_array(value.astype(np.float32),
                                                                    name))
    data = model.SerializeToString()
    so = onnxrun.SessionOptions()
    sess = onnxrun.InferenceSession(data, so)
    # the expansion and the depthwise convolution write channels-last, and the projection
    # reads its input so (its output is the graph's: NCHW; the SE block's own 1x1
    # convolutions run on one pixel, where either layout is the same memory)
    turned, convs = sess.get_optimization_report().layout
    assert convs == 5 and turned == 2
    kinds = {s.node.name or s.node.op_type: bool(s.kernel.channels_last)
             for s in sess._program.steps if hasattr(s.kernel, "channels_last")}
    assert sum(kinds.values()) == turned
    # the SE block's two 1x1 convolutions of one pixel run on the compiled GEMM (either
    # layout is the same memory), their SiLU / Sigmoid in its epilogue
    from onnxrun.providers.cpu.ops.conv import _packable

    if _packable(np.float32):
        se = [s.kernel for s in sess._program.steps if hasattr(s.kernel, "channels_last")
              and s.kernel.W_shape in ((4, 32, 1, 1), (32, 4, 1, 1))]
        assert len(se) == 2 and all(k.gemm_t_packed is not None for k in se)
    x = rng.normal(size=(1, 8, 15, 15)).astype(np.float32)
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"X": x})[0]
    np.testing.assert_allclose(sess.run(None, {"X": x})[0], want, rtol=1e-4, atol=1e-4)
