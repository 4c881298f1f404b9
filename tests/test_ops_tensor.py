"""Tensor-manipulation kernels (shape ops, slicing, gather/scatter, padding, constants...),
each checked on a one-node model against onnxruntime (or the ONNX reference evaluator), with
steering inputs both as graph inputs and as constant initializers (read once at load)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from one_node_harness import check, make_rand, one_node
from onnx import TensorProto, helper, numpy_helper

import onnxrun

RNG = np.random.default_rng(1)
rand = make_rand(RNG)


# -- shape ops --------------------------------------------------------------------------------

I64 = np.int64


def ints(*v):
    return np.array(v, dtype=I64)


@pytest.mark.parametrize("opset", [1, 13, 15, 19])
def test_shape_size(opset):
    x = rand(2, 3, 4, 5)
    check("Shape", [x], opset=opset)
    check("Size", [x], opset=min(opset, 19))
    check("Shape", [np.zeros((), np.float32)], opset=opset)


@pytest.mark.parametrize("start,end", [(1, None), (0, -1), (-2, None), (-10, 10), (3, 1)])
def test_shape_start_end(start, end):
    attrs = {"start": start} if end is None else {"start": start, "end": end}
    check("Shape", [rand(2, 3, 4, 5)], opset=15, **attrs)


@pytest.mark.parametrize("shape", [(4, 30), (0, -1), (2, 0, 5, -1), (-1,), (1, 4, 3, 10),
                                   (0, 0, 0)])
@pytest.mark.parametrize("const", [False, True])
def test_reshape(shape, const):
    check("Reshape", [rand(4, 3, 10), ints(*shape)], opset=14, const=(1,) if const else ())


def test_reshape_allowzero():
    x = np.zeros((0, 3), np.float32)
    check("Reshape", [x, ints(3, 0)], opset=14, allowzero=1)
    check("Reshape", [x, ints(3, 0)], opset=14, allowzero=1, const=(1,))


def test_reshape_1_attribute():
    x = rand(2, 3, 4)
    model, feeds = one_node("Reshape", [x], opset=1, shape=[0, -1])
    m = onnx.load_from_string(model)
    m.graph.output[0].type.tensor_type.elem_type = TensorProto.FLOAT
    got = onnxrun.InferenceSession(m.SerializeToString()).run(None, feeds)[0]
    np.testing.assert_array_equal(got, x.reshape(2, 12))


@pytest.mark.parametrize("axis", [0, 1, 2, 3, -1, -3])
def test_flatten(axis):
    check("Flatten", [rand(2, 3, 4)] if axis <= 2 else [rand(2, 3, 4, 1)], opset=13, axis=axis)


@pytest.mark.parametrize("axes", [None, (0,), (2, 0), (-1,)])
@pytest.mark.parametrize("opset", [11, 13])
@pytest.mark.parametrize("const", [False, True])
def test_squeeze(axes, opset, const):
    x = rand(1, 3, 1)
    if opset == 11:
        if const:
            pytest.skip("attribute form")
        attrs = {} if axes is None else {"axes": list(axes)}
        check("Squeeze", [x], opset=11, **attrs)
    else:
        inputs = [x] if axes is None else [x, ints(*axes)]
        check("Squeeze", inputs, opset=13, const=(1,) if const else ())


@pytest.mark.parametrize("axes", [(0,), (1, 3), (-1,), (-1, 0), (4, 0, 2)])
@pytest.mark.parametrize("opset", [11, 13])
@pytest.mark.parametrize("const", [False, True])
def test_unsqueeze(axes, opset, const):
    x = rand(2, 3)
    if opset == 11:
        if const:
            pytest.skip("attribute form")
        check("Unsqueeze", [x], opset=11, axes=list(axes))
    else:
        check("Unsqueeze", [x, ints(*axes)], opset=13, const=(1,) if const else ())


def test_unsqueeze_scalar():
    check("Unsqueeze", [np.array(3.0, np.float32), ints(0)], opset=13, const=(1,))


@pytest.mark.parametrize("perm", [None, (0, 2, 1, 3), (3, 2, 1, 0), (1, 0, 2, 3)])
def test_transpose(perm):
    attrs = {} if perm is None else {"perm": list(perm)}
    check("Transpose", [rand(2, 3, 4, 5)], opset=13, **attrs)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_concat(axis):
    shapes = [[2, 3, 4] for _ in range(3)]
    for i, s in enumerate(shapes):
        s[axis] = i + 1
    check("Concat", [rand(*s) for s in shapes], opset=13, axis=axis)
    check("Concat", [rand(2, 3)], opset=13, axis=0)
    check("Concat", [rand(0, 3), rand(2, 3)], opset=13, axis=0)


_CONCATS = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[1, 48, 64, 64] x, float[1, 24, 64, 64] y, int64[1, 24, 64, 64] i) =>
  (float[1, 120, 64, 64] a, int64[1, 48, 64, 64] b, float[2, 48, 64, 64] c) {
  r = Relu(x)
  a = Concat<axis = 1>(y, r, x)
  b = Concat<axis = -3>(i, i)
  c = Concat<axis = 0>(x, r)
}
"""


def test_short_rows_are_copied_by_the_compiled_row_copy(monkeypatch):
    """At 1 thread a Concat's channels-last operand (many rows of a few dozen floats) goes
    into its range of the output by compiled/copy.py's row copy: numpy's bytes, in a Concat
    run after run and directly; long rows, few rows, overlapping or mismatched arrays and
    other layouts are left to numpy."""
    import onnxruntime as ort

    from onnxrun.providers.cpu.compiled import copy

    if copy.unavailable() is not None:
        pytest.skip("no compiled kernels here")
    rng = np.random.default_rng(5)
    calls = []
    rows = copy.copy_rows
    monkeypatch.setattr(copy, "copy_rows", lambda d, s: calls.append(d.shape) or rows(d, s))
    model = onnx.parser.parse_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[1, 8, 20, 20] X) => (float[1, 16, 20, 20] Y) {
        a = Conv <kernel_shape = [3, 3], pads = [1, 1, 1, 1]> (X, W1)
        b = Conv <kernel_shape = [3, 3], pads = [1, 1, 1, 1]> (X, W2)
        c = Concat <axis = 1> (a, b)
        Y = Conv <kernel_shape = [3, 3], pads = [1, 1, 1, 1]> (c, W3)
    }
    """)
    for name, shape in (("W1", (24, 8, 3, 3)), ("W2", (24, 8, 3, 3)), ("W3", (16, 48, 3, 3))):
        model.graph.initializer.append(onnx.numpy_helper.from_array(
            rng.normal(0, 0.2, shape).astype(np.float32), name))
    blob = model.SerializeToString()
    so = onnxrun.SessionOptions()
    so.intra_op_num_threads = 1
    sess = onnxrun.InferenceSession(blob, so)
    x = rng.normal(size=(1, 8, 20, 20)).astype(np.float32)
    want = ort.InferenceSession(blob, providers=["CPUExecutionProvider"]).run(None, {"X": x})[0]
    for _ in range(5):
        np.testing.assert_allclose(sess.run(None, {"X": x})[0], want, rtol=1e-4, atol=1e-4)
    assert (1, 20, 20, 24) in calls  # the operands, as rows of 24 floats, 48 apart
    out = np.zeros((30, 20, 56), np.float32)
    src = rng.normal(size=(30, 20, 24)).astype(np.float32)
    assert copy.copy_rows(out[..., 16:40], src)  # rows of 24 floats, 224 bytes apart
    assert out[..., 16:40].tobytes() == src.tobytes()
    assert not out[..., :16].any() and not out[..., 40:].any()
    assert not copy.copy_rows(np.zeros((30, 20, 200), np.float32), np.ones((30, 20, 200),
                                                                          np.float32))  # long
    assert not copy.copy_rows(out[:1, :2, :24], src[:1, :2])  # few rows
    assert not copy.copy_rows(out[..., 1:25], out[..., :24])  # overlapping
    assert not copy.copy_rows(out[..., :24], src[..., :23].copy())  # shapes differ
    assert not copy.copy_rows(out[..., ::2], out[..., 1::2].copy())  # no unit-stride rows


def test_large_concats_split_over_the_spinning_workers(monkeypatch):
    """At 2+ intra-op threads a Concat's large copies (an input not written in its place)
    are cut into ranges for spin.py's workers (compiled/copy.py): the same bytes as at 1
    thread and as numpy's concatenate, run after run (the executor's buffers too)."""
    from onnxrun.providers.cpu.compiled import copy, spin

    if spin.unavailable() is not None or copy.unavailable() is not None:
        pytest.skip("no spinning workers here")
    forks = []
    fork = spin.Pool.fork
    monkeypatch.setattr(spin.Pool, "fork", lambda self, job, argv, **kw: forks.append(
        len(argv)) or fork(self, job, argv, **kw))
    model = onnx.parser.parse_model(_CONCATS).SerializeToString()
    x = RNG.standard_normal((1, 48, 64, 64)).astype(np.float32)
    y = RNG.standard_normal((1, 24, 64, 64)).astype(np.float32)
    i = RNG.integers(-9, 9, (1, 24, 64, 64))
    want = [np.concatenate([y, np.maximum(x, 0), x], 1), np.concatenate([i, i], 1),
            np.concatenate([x, np.maximum(x, 0)], 0)]
    for threads in (1, 2, 3):
        so = onnxrun.SessionOptions()
        so.intra_op_num_threads = threads
        sess = onnxrun.InferenceSession(model, so)
        for _ in range(4):
            got = sess.run(None, {"x": x, "y": y, "i": i})
            for g, w in zip(got, want, strict=True):
                assert g.dtype == w.dtype and g.tobytes() == w.tobytes()
        assert bool(forks) == (threads > 1)
        forks.clear()
    a = np.zeros((3, 5, 7, 70), np.float32)  # a channels-last join: rows of a slice
    monkeypatch.setattr(copy, "MIN_BYTES_PER_RANGE", 256)
    assert copy.copy(a[..., 9:32], x.reshape(-1)[:3 * 5 * 7 * 23].reshape(3, 5, 7, 23), 2)
    assert a[..., 9:32].tobytes() == x.reshape(-1)[:3 * 5 * 7 * 23].tobytes()
    assert not a[..., :9].any() and not a[..., 32:].any()
    assert not copy.copy(a[..., ::2], a[..., 1::2], 2)  # no rows: numpy's


_SPLIT_SMALL_OPS = """
<ir_version: 8, opset_import: ["" : 17, "com.microsoft" : 1]>
g (float[1, 64, 48, 48] x, float[64, 64, 1, 1] we, float[64, 1, 3, 3] wd)
  => (float[1, 128, 48, 48] y) {
  e = Conv<group = 1>(x, we)
  d = Conv<group = 64, pads = [1, 1, 1, 1]>(e, wd)
  s = com.microsoft.QuickGelu<alpha = 1.0>(d)
  y = Concat<axis = 1>(s, x)
}
"""


def test_split_small_ops_from_concurrent_runs():
    """One session at 2 intra-op threads run from four Python threads at once: its depthwise
    rows, SiLU vectors and Concat copies, each cut over spin.py's workers (a worker another
    call holds is not used), give every thread one serial run's bits."""
    from concurrency import assert_threads_match_serial

    model = onnx.parser.parse_model(_SPLIT_SMALL_OPS)
    rng = np.random.default_rng(11)
    for v in list(model.graph.input)[1:]:  # the weights: constants
        dims = [d.dim_value for d in v.type.tensor_type.shape.dim]
        model.graph.initializer.append(numpy_helper.from_array(
            (rng.standard_normal(dims) * 0.2).astype(np.float32), v.name))
        model.graph.input.remove(v)
    data = model.SerializeToString()
    so = onnxrun.SessionOptions()
    so.intra_op_num_threads = 2
    sess = onnxrun.InferenceSession(data, so)
    x = rng.standard_normal((1, 64, 48, 48)).astype(np.float32)
    one = onnxrun.InferenceSession(data).run(None, {"x": x})[0]
    assert sess.run(None, {"x": x})[0].tobytes() == one.tobytes()
    assert_threads_match_serial(sess, [{"x": x * (1 + k)} for k in range(4)], 5)


# -- Split ------------------------------------------------------------------------------------


@pytest.mark.parametrize("opset", [2, 11, 13, 18])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_split_equal(opset, axis):
    x = rand(6, 6, 6)
    attrs = {"axis": axis}
    if opset == 18:
        attrs["num_outputs"] = 3
    check("Split", [x], opset=opset, n_out=3, **attrs)


@pytest.mark.parametrize("opset", [11, 13])
@pytest.mark.parametrize("const", [False, True])
def test_split_sizes(opset, const):
    x = rand(7, 4)
    if opset == 11:
        check("Split", [x], opset=11, n_out=3, axis=0, split=[2, 4, 1])
    else:
        check("Split", [x, ints(2, 4, 1)], opset=13, n_out=3, axis=0,
              const=(1,) if const else ())


def test_split_18_uneven():
    check("Split", [rand(7, 4)], opset=18, n_out=3, axis=0, num_outputs=3)
    check("Split", [rand(2, 10)], opset=18, n_out=4, axis=1, num_outputs=4)


# -- Slice ------------------------------------------------------------------------------------

SLICES = [
    ((0,), (2,), None, None),
    ((1, 0), (3, -1), (0, 2), None),
    ((-1,), (-1000,), (1,), (-1,)),
    ((-10,), (100,), (1,), (2,)),
    ((10,), (-10,), (0,), (-2,)),
    ((-100,), (-200,), (2,), (-1,)),  # negative step, start under range: clamps to 0
    ((2,), (2,), (-1,), None),
    ((0, 1, 0), (9223372036854775807, 3, 2), (-3, -2, -1), (1, 1, 1)),
    ((3,), (0,), (0,), (-1,)),
]


@pytest.mark.parametrize("starts,ends,axes,steps", SLICES)
@pytest.mark.parametrize("const", [False, True])
def test_slice(starts, ends, axes, steps, const):
    x = rand(5, 4, 6)
    inputs = [x, ints(*starts), ints(*ends)]
    inputs.append(None if axes is None else ints(*axes))
    inputs.append(None if steps is None else ints(*steps))
    while inputs[-1] is None:
        inputs.pop()
    check("Slice", inputs, opset=13, const=(1, 2, 3, 4) if const else ())


def test_slice_dynamic_shape_const_bounds():
    """Constant bounds, input shape unknown at load time."""
    model, feeds = one_node("Slice", [rand(5, 4), ints(-3), ints(1000), ints(0)], opset=13,
                            const=(1, 2, 3))
    m = onnx.load_from_string(model)
    m.graph.input[0].type.tensor_type.ClearField("shape")
    del m.graph.output[:]
    m.graph.output.append(helper.make_tensor_value_info("out0", TensorProto.FLOAT, None))
    sess = onnxrun.InferenceSession(m.SerializeToString())
    for shape in [(5, 4), (7, 2, 3), (2,)]:
        x = rand(*shape)
        np.testing.assert_array_equal(sess.run(None, {"in0": x})[0], x[-3:])


def test_slice_1_attributes():
    x = rand(5, 4, 6)
    check("Slice", [x], opset=1, starts=[1, 0], ends=[3, -1], axes=[0, 2])
    check("Slice", [x], opset=1, starts=[1], ends=[1000])


# -- gather / scatter -------------------------------------------------------------------------


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("idx_shape", [(), (3,), (2, 2)])
@pytest.mark.parametrize("idx_type", [np.int64, np.int32])
def test_gather(axis, idx_shape, idx_type):
    x = rand(4, 5, 6)
    n = x.shape[axis]
    idx = RNG.integers(-n, n, size=idx_shape).astype(idx_type)
    check("Gather", [x, idx], opset=13, axis=axis)
    check("Gather", [x, idx], opset=13, axis=axis, const=(1,))


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather_elements(axis):
    x = rand(4, 5, 6)
    shape = [4, 5, 6]
    shape[axis] = 3
    n = x.shape[axis]
    idx = RNG.integers(-n, n, size=shape).astype(I64)
    check("GatherElements", [x, idx], opset=13, axis=axis)
    small = RNG.integers(0, 2, size=(2, 2, 2)).astype(I64)  # smaller than data elsewhere
    check("GatherElements", [x, small], opset=13, axis=axis)


@pytest.mark.parametrize("batch_dims,data_shape,idx", [
    (0, (2, 2), [[0, 0], [1, 1]]),
    (0, (2, 2), [[1], [0]]),
    (0, (2, 2, 2), [[[0, 1]], [[1, 0]]]),
    (1, (2, 2, 2), [[1], [0]]),
    (1, (2, 3, 4), [[[1, 2], [0, 0]], [[2, 3], [-1, -1]]]),
    (2, (2, 3, 4, 5), np.zeros((2, 3, 1, 2), dtype=np.int64).tolist()),
])
def test_gather_nd(batch_dims, data_shape, idx):
    check("GatherND", [rand(*data_shape), np.array(idx, dtype=I64)], opset=13,
          batch_dims=batch_dims)


@pytest.mark.parametrize("reduction,opset", [("none", 13), ("add", 16), ("mul", 16),
                                             ("max", 18), ("min", 18)])
def test_scatter_nd(reduction, opset):
    data = rand(4, 4, 4)
    idx = np.array([[0], [2], [0]], dtype=I64) if reduction != "none" else ints(0, 2)[:, None]
    upd = rand(idx.shape[0], 4, 4)
    attrs = {} if reduction == "none" else {"reduction": reduction}
    check("ScatterND", [data, idx, upd], opset=opset, **attrs)
    idx2 = np.array([[1, 2], [3, -1]], dtype=I64)
    check("ScatterND", [data, idx2, rand(2, 4)], opset=opset, **attrs)


@pytest.mark.parametrize("reduction,opset", [("none", 13), ("add", 16), ("mul", 16),
                                             ("max", 18), ("min", 18)])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_scatter_elements(reduction, opset, axis):
    data = rand(3, 4)
    idx = RNG.integers(0, data.shape[axis], size=(2, 2)).astype(I64)
    if reduction == "none":  # unique targets: the result would depend on write order
        idx = np.array([[0, 1], [1, 0]], dtype=I64)
    attrs = {"axis": axis} if reduction == "none" else {"axis": axis, "reduction": reduction}
    check("ScatterElements", [data, idx, rand(2, 2)], opset=opset, **attrs)


def test_scatter_legacy():
    data = rand(3, 4)
    idx = np.array([[0, 1], [2, 0]], dtype=I64)
    check("Scatter", [data, idx, rand(2, 2)], opset=9, axis=1)


# -- Expand, Tile, constants ------------------------------------------------------------------


@pytest.mark.parametrize("in_shape,shape", [((3, 1), (2, 3, 4)), ((3, 4), (1, 1)),
                                            ((1,), (5,)), ((2, 1, 3), (2, 4, 1)), ((), (2, 2))])
def test_expand(in_shape, shape):
    got = check("Expand", [rand(*in_shape), ints(*shape)], opset=13)
    assert got[0].flags.writeable


def test_tile():
    check("Tile", [rand(2, 3), ints(2, 3)], opset=13)
    check("Tile", [rand(2, 3, 1), ints(1, 1, 4)], opset=13, const=(1,))


@pytest.mark.parametrize("value", [None, np.array([2.5], np.float32), np.array([7], I64),
                                   np.array([True])])
def test_constant_of_shape(value):
    attrs = {} if value is None else {"value": numpy_helper.from_array(value)}
    check("ConstantOfShape", [ints(2, 3)], opset=20, **attrs)
    check("ConstantOfShape", [np.zeros(0, I64)], opset=20, **attrs)


@pytest.mark.parametrize("attr,value", [
    ("value", numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(2, 3))),
    ("value_float", 1.5), ("value_floats", [1.0, 2.0]), ("value_int", 4),
    ("value_ints", [1, 2, 3]), ("value_string", "abc"), ("value_strings", ["a", "bc"]),
])
def test_constant(attr, value):
    check("Constant", [], opset=13, **{attr: value})


@pytest.mark.parametrize("args", [(0, 10, 3), (10, -7, -2), (3, 3, 1), (5, 1, 1),
                                  (0.1, 100.0, 0.3), (5.0, -3.3, -0.7), (1.0, 2.0, 0.001)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64])
def test_range(args, dtype):
    if np.dtype(dtype).kind == "i" and any(isinstance(a, float) for a in args):
        pytest.skip("integer Range with fractional arguments")
    check("Range", [np.array(a, dtype=dtype) for a in args], opset=11, rtol=0, atol=0)


@pytest.mark.parametrize("k", [None, 0, 1, -1, 5, -5])
@pytest.mark.parametrize("upper", [0, 1])
def test_trilu(k, upper):
    inputs = [rand(2, 4, 5)] + ([] if k is None else [np.array(k, dtype=I64)])
    check("Trilu", inputs, opset=14, upper=upper)


@pytest.mark.parametrize("k", [0, 1, -2])
@pytest.mark.parametrize("dtype", [None, TensorProto.INT32, TensorProto.DOUBLE])
def test_eye_like(k, dtype):
    attrs = {"k": k} if dtype is None else {"k": k, "dtype": dtype}
    check("EyeLike", [rand(3, 5)], opset=9, **attrs)


# -- Pad --------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
@pytest.mark.parametrize("pads", [(0, 1, 2, 0, 2, 1), (1, 0, 0, 1, 0, 0), (0, -1, 1, 0, 1, -2)])
@pytest.mark.parametrize("const", [False, True])
def test_pad(mode, pads, const):
    x = rand(3, 4, 5)
    opset = 19 if mode == "wrap" else 13
    inputs = [x, ints(*pads)]
    if mode == "constant":
        inputs.append(np.array(1.5, np.float32))
    check("Pad", inputs, opset=opset, const=(1, 2) if const else (), mode=mode)


def test_pad_axes_and_versions():
    x = rand(3, 4, 5)
    check("Pad", [x, ints(1, 2, 3, 4), None, ints(0, -1)], opset=18)
    check("Pad", [x, ints(1, 2, 3, 4), np.array(2.0, np.float32), ints(2, 1)], opset=18,
          const=(1, 2, 3))
    check("Pad", [x], opset=2, pads=[0, 1, 0, 0, 1, 0], value=3.0)
    check("Pad", [x], opset=2, pads=[0, 1, 0, 0, 1, 0], mode="edge")
    check("Pad", [np.arange(6, dtype=I64).reshape(2, 3), ints(1, 1, 1, 1)], opset=13)


@pytest.mark.parametrize("mode", ["reflect", "edge", "wrap"])
@pytest.mark.parametrize("axes", [None, (0, -1)])
def test_pad_gathers_planned_per_shape(mode, axes):
    """Constant pads in a gathering mode: each input shape's gathers are made once and kept
    by the kernel; every run of a shape gives onnxruntime's numbers."""
    from one_node_harness import compare, oracle

    pads = ints(1, 2, 3, 1) if axes else ints(0, 1, 2, 0, 2, 1)
    inits = [numpy_helper.from_array(pads, "pads")]
    names = ["x", "pads"]
    if axes:
        inits.append(numpy_helper.from_array(ints(*axes), "axes"))
        names += ["", "axes"]
    graph = helper.make_graph(
        [helper.make_node("Pad", names, ["y"], mode=mode)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["a", "b", "c"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 9
    model = model.SerializeToString()
    sess = onnxrun.InferenceSession(model)
    (kernel,) = [s.kernel for s in sess._program.steps]
    for shape in [(3, 4, 5), (3, 4, 5), (4, 6, 7), (3, 4, 5)]:
        feeds = {"x": rand(*shape)}
        compare(sess.run(None, feeds), oracle(model, feeds), 0, 0)
    assert sorted(kernel.gathers) == [(3, 4, 5), (4, 6, 7)]


# -- index ops and reorderings ----------------------------------------------------------------


@pytest.mark.parametrize("shape", [(3, 4), (5,), (2, 3, 4), ()])
def test_nonzero(shape):
    x = (rand(*shape) > 0).astype(np.float32) if shape else np.array(2.0, np.float32)
    check("NonZero", [x], opset=13)
    check("NonZero", [np.zeros(shape, np.int32)], opset=13)


@pytest.mark.parametrize("axis", [-1, 0, 1])
@pytest.mark.parametrize("depth_type", [np.int64, np.float32])
def test_one_hot(axis, depth_type):
    idx = np.array([[0, 3, -1], [2, 5, 1]], dtype=I64)
    check("OneHot", [idx, np.array(4, depth_type), np.array([0.5, 2.0], np.float32)],
          opset=11, axis=axis)


@pytest.mark.parametrize("axis", [None, 0, 1, -1])
def test_compress(axis):
    x = rand(3, 4)
    cond = np.array([True, False, True], dtype=bool)
    attrs = {} if axis is None else {"axis": axis}
    check("Compress", [x, cond], opset=11, **attrs)


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_depth_space(mode):
    check("DepthToSpace", [rand(2, 8, 3, 4)], opset=13, blocksize=2, mode=mode)
    check("SpaceToDepth", [rand(2, 3, 4, 6)], opset=13, blocksize=2)


@pytest.mark.parametrize("batch_axis,time_axis", [(1, 0), (0, 1)])
def test_reverse_sequence(batch_axis, time_axis):
    shape = [4, 3, 2] if batch_axis == 1 else [3, 4, 2]
    check("ReverseSequence", [rand(*shape), ints(4, 1, 3)], opset=10,
          batch_axis=batch_axis, time_axis=time_axis)


@pytest.mark.parametrize("axis", [None, 0, 1])
@pytest.mark.parametrize("sorted_", [0, 1])
def test_unique(axis, sorted_):
    x = np.array([[1, 3, 1], [2, 2, 2], [1, 3, 1], [0, 5, 0]], dtype=np.float32)
    attrs = {"sorted": sorted_}
    if axis is not None:
        attrs["axis"] = axis
    check("Unique", [x], opset=11, n_out=4, **attrs)


def test_identity():
    check("Identity", [rand(2, 3)], opset=13)
    check("Identity", [np.array(["a"], dtype=object)], opset=16)
