"""Reductions (Reduce* in their attribute and input forms), ArgMax/ArgMin, CumSum and TopK,
each checked on a one-node model against onnxruntime (or the ONNX reference evaluator)."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import onnxrun

RNG = np.random.default_rng(2)


# -- harness ----------------------------------------------------------------------------------


def _elem(a: np.ndarray) -> int:
    return TensorProto.STRING if a.dtype == object else helper.np_dtype_to_tensor_dtype(a.dtype)


def one_node(op, inputs, *, opset, n_out=1, const=(), **attrs):
    """A model with one node. ``inputs``: arrays (None = missing optional input); indices in
    ``const`` become initializers, the others graph inputs. Returns (model bytes, feeds)."""
    names, graph_inputs, inits, feeds = [], [], [], {}
    for i, a in enumerate(inputs):
        if a is None:
            names.append("")
            continue
        name = f"in{i}"
        names.append(name)
        if i in const:
            inits.append(numpy_helper.from_array(a, name))
        else:
            graph_inputs.append(helper.make_tensor_value_info(name, _elem(a), a.shape))
            feeds[name] = a
    outs = [f"out{i}" for i in range(n_out)]
    node = helper.make_node(op, names, outs, **attrs)
    graph = helper.make_graph([node], "g", graph_inputs, [onnx.ValueInfoProto(name=o)
                                                          for o in outs], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8 if opset < 21 else 10
    model = onnx.shape_inference.infer_shapes(model)
    return model.SerializeToString(), feeds


def oracle(model: bytes, feeds):
    try:
        so = ort.SessionOptions()
        so.log_severity_level = 3
        return ort.InferenceSession(model, so).run(None, feeds)
    except Exception:  # no onnxruntime kernel (or numpy binding) for this type
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return ReferenceEvaluator(onnx.load_from_string(model)).run(None, feeds)


def compare(got, want, rtol=1e-5, atol=1e-6):
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        w = np.asarray(w)
        assert isinstance(g, np.ndarray), type(g)
        assert g.dtype == w.dtype, (g.dtype, w.dtype)
        assert g.shape == w.shape, (g.shape, w.shape)
        if w.dtype == object:
            assert g.tolist() == w.tolist()
        elif w.dtype.kind in "fV" or w.dtype.itemsize == 1 and w.dtype.kind not in "iub":
            np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64),
                                       rtol=rtol, atol=atol, equal_nan=True)
        else:
            np.testing.assert_array_equal(g, w)


def check(op, inputs, *, opset, n_out=1, const=(), rtol=1e-5, atol=1e-6, **attrs):
    model, feeds = one_node(op, inputs, opset=opset, n_out=n_out, const=const, **attrs)
    got = onnxrun.InferenceSession(model).run(None, feeds)
    compare(got, oracle(model, feeds), rtol, atol)
    return got


def rand(*shape, dtype=np.float32, lo=-3.0, hi=3.0):
    if np.dtype(dtype).kind in "iu":
        return RNG.integers(int(lo), int(hi) + 1, size=shape).astype(dtype)
    if np.dtype(dtype) == np.bool_:
        return RNG.random(shape) > 0.5
    return RNG.uniform(lo, hi, size=shape).astype(dtype)


# -- Reduce* ----------------------------------------------------------------------------------

I64 = np.int64
# op -> (last opset with the axes attribute, first opset with the axes input)
REDUCE = {
    "ReduceSum": (11, 13), "ReduceMean": (13, 18), "ReduceMax": (13, 18), "ReduceMin": (13, 18),
    "ReduceProd": (13, 18), "ReduceL1": (13, 18), "ReduceL2": (13, 18),
    "ReduceLogSum": (13, 18), "ReduceLogSumExp": (13, 18), "ReduceSumSquare": (13, 18),
}
AXES = [None, (0,), (1,), (-1,), (0, 2), (1, 2), (-2, -1), ()]


def _data(op, dtype, shape=(3, 4, 5)):
    lo, hi = (0.5, 2.0) if op in ("ReduceLogSum", "ReduceProd") else (-3.0, 3.0)
    if np.dtype(dtype).kind in "iu":
        lo, hi = (1, 3) if op == "ReduceProd" else (-9, 9)
    return rand(*shape, dtype=dtype, lo=lo, hi=hi)


@pytest.mark.parametrize("op", sorted(REDUCE))
@pytest.mark.parametrize("axes", AXES)
@pytest.mark.parametrize("keepdims", [0, 1])
def test_reduce_attribute_form(op, axes, keepdims):
    attrs = {"keepdims": keepdims}
    if axes:
        attrs["axes"] = list(axes)
    check(op, [_data(op, np.float32)], opset=REDUCE[op][0], rtol=1e-5, atol=1e-5, **attrs)


@pytest.mark.parametrize("op", sorted(REDUCE))
@pytest.mark.parametrize("axes", AXES)
@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("const", [False, True])
def test_reduce_input_form(op, axes, keepdims, const):
    x = _data(op, np.float32)
    inputs = [x] if axes is None else [x, np.array(axes, dtype=I64)]
    check(op, inputs, opset=REDUCE[op][1], const=(1,) if const else (), rtol=1e-5, atol=1e-5,
          keepdims=keepdims)


@pytest.mark.parametrize("op", sorted(REDUCE))
@pytest.mark.parametrize("const", [False, True])
def test_reduce_noop_with_empty_axes(op, const):
    x = _data(op, np.float32)
    check(op, [x, np.zeros(0, I64)], opset=REDUCE[op][1], const=(1,) if const else (),
          noop_with_empty_axes=1)
    check(op, [x], opset=REDUCE[op][1], noop_with_empty_axes=1)


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin",
                                "ReduceProd", "ReduceL1", "ReduceSumSquare", "ReduceL2"])
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.float64, np.float16])
def test_reduce_dtypes(op, dtype):
    x = _data(op, dtype)
    tol = 3e-3 if dtype == np.float16 else 1e-6
    for axes in ((1,), (0, 2), (2,)):
        if op == "ReduceSum":
            got = check(op, [x, np.array(axes, I64)], opset=13, rtol=tol, atol=tol)
        else:
            got = check(op, [x], opset=13, axes=list(axes), rtol=tol, atol=tol)
        assert got[0].dtype == dtype


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceL2"])
def test_reduce_noncontiguous_and_large(op):
    """The fast trailing-axes paths (gemv / argmax) against the oracle on bigger rows."""
    x = rand(4, 8, 300, lo=-2, hi=2)
    for axes in ((2,), (1, 2), (0,)):
        check(op, [x, np.array(axes, I64)], opset=18, const=(1,), rtol=1e-5, atol=1e-5)


def test_reduce_max_nan_and_empty():
    x = rand(4, 3)
    x[1, 2] = x[2, 0] = x[3, :] = np.nan
    for op in ("ReduceMax", "ReduceMin"):
        for axes in ([1], [0], [0, 1]):
            check(op, [x, np.array(axes, I64)], opset=18)
    e = np.zeros((2, 0, 3), np.float32)
    for op in ("ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceLogSumExp"):
        check(op, [e, np.array([1], I64)], opset=18)


def test_reduce_log_sum_exp_stability():
    x = np.array([[1000.0, 1000.0, -1000.0], [-np.inf, -np.inf, -np.inf]], np.float32)
    check("ReduceLogSumExp", [x, np.array([1], I64)], opset=18)


def test_reduce_bool_max_min():
    x = rand(3, 4, dtype=np.bool_)
    check("ReduceMax", [x, np.array([1], I64)], opset=20)
    check("ReduceMin", [x, np.array([0], I64)], opset=20)


# -- ArgMax / ArgMin --------------------------------------------------------------------------


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("last", [0, 1])
def test_arg(op, axis, keepdims, last):
    x = rand(3, 4, 5, dtype=np.int32, lo=0, hi=3).astype(np.float32)  # many ties
    got = check(op, [x], opset=13, axis=axis, keepdims=keepdims, select_last_index=last)
    assert got[0].dtype == np.int64


@pytest.mark.parametrize("opset", [1, 11])
def test_arg_old_opsets(opset):
    x = rand(3, 4, dtype=np.int64, lo=-5, hi=5)
    check("ArgMax", [x], opset=opset, axis=1)
    check("ArgMin", [x], opset=opset, axis=0, keepdims=0)


# -- CumSum -----------------------------------------------------------------------------------


@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.int64, np.float64])
def test_cumsum(exclusive, reverse, axis, dtype):
    x = rand(3, 4, dtype=dtype, lo=-5, hi=5)
    check("CumSum", [x, np.array(axis, dtype=np.int32)], opset=14, exclusive=exclusive,
          reverse=reverse)


# -- TopK -------------------------------------------------------------------------------------


@pytest.mark.parametrize("largest", [0, 1])
@pytest.mark.parametrize("axis", [0, -1])
@pytest.mark.parametrize("k", [1, 3, 5])
@pytest.mark.parametrize("ties", [False, True])
def test_topk(largest, axis, k, ties):
    x = rand(5, 6, lo=-3, hi=3)
    if ties:
        x = np.round(x)
    check("TopK", [x, np.array([k], I64)], opset=11, n_out=2, axis=axis, largest=largest)


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8, np.float64])
def test_topk_dtypes(dtype):
    x = rand(4, 50, dtype=dtype, lo=0, hi=20)
    for largest in (0, 1):
        check("TopK", [x, np.array([4], I64)], opset=11, n_out=2, largest=largest)


def test_topk_long_axis_partial_selection():
    """k much smaller than the axis takes the argpartition path; ties still go to low indices."""
    x = rand(3, 400, lo=-3, hi=3)
    check("TopK", [x, np.array([5], I64)], opset=11, n_out=2)
    check("TopK", [np.round(x), np.array([5], I64)], opset=11, n_out=2)
    check("TopK", [np.round(x), np.array([5], I64)], opset=11, n_out=2, largest=0)


def test_topk_old_versions():
    x = rand(4, 6)
    check("TopK", [x], opset=1, n_out=2, k=2)
    check("TopK", [x, np.array([2], I64)], opset=10, n_out=2, axis=0)


def test_reduce_max_min_nan_large():
    x = rand(16, 512)
    x[3, 7] = x[5, 0] = np.nan
    x[9, :] = np.nan
    for op in ("ReduceMax", "ReduceMin"):
        check(op, [x, np.array([1], I64)], opset=18)
        check(op, [x, np.array([1], I64)], opset=18, keepdims=0)
