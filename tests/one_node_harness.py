"""The one-node harness the kernel tests share: build a one-node model, run it on onnxrun and on
an oracle (onnxruntime, or onnx's reference evaluator where onnxruntime has no kernel for the
type), and compare dtype, shape and values."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import onnxrun
from onnxrun.errors import OnnxRunError


def _elem(a: np.ndarray) -> int:
    return TensorProto.STRING if a.dtype == object else helper.np_dtype_to_tensor_dtype(a.dtype)


def one_node(op, inputs, *, opset, n_out=1, const=(), domain="", out_types=None,
             attributes=None, **attrs):
    """A model with one node. ``inputs``: arrays (None = missing optional input); indices in
    ``const`` become initializers, the others graph inputs. Output types are ``out_types`` when
    given ("like input": the first input's type), else what onnx's shape inference finds.
    ``attributes``: more attributes, as a dict (names such as "opset" clash with the
    parameters). Returns (model bytes, feeds)."""
    attrs.update(attributes or {})
    if out_types == "like input":
        out_types = [_elem(inputs[0])] * n_out
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
    node = helper.make_node(op, names, outs, domain=domain or None, **attrs)
    if out_types is None:
        outputs = [onnx.ValueInfoProto(name=o) for o in outs]
    else:
        outputs = [helper.make_value_info(o, t) if isinstance(t, onnx.TypeProto)  # e.g. seq
                   else helper.make_tensor_value_info(o, t, None)
                   for o, t in zip(outs, out_types, strict=True)]
    graph = helper.make_graph([node], "g", graph_inputs, outputs, initializer=inits)
    opsets = [helper.make_opsetid("", opset)] + ([helper.make_opsetid(domain, 1)] if domain
                                                 else [])
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 8 if opset < 21 else 10
    if out_types is None:
        model = onnx.shape_inference.infer_shapes(model)
        for out in model.graph.output:  # what inference leaves untyped: float, any shape
            if not out.type.tensor_type.elem_type:
                out.type.CopyFrom(helper.make_tensor_type_proto(TensorProto.FLOAT, None))
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
        if isinstance(w, list):  # a sequence
            assert isinstance(g, list), type(g)
            compare(g, w, rtol, atol)
            continue
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


# What a kernel that stumbles over an empty tensor raises before onnxrun wraps it: an error
# whose cause is one of these is a crash in disguise, not a refusal.
_INTERNAL_ERRORS = ("IndexError", "ZeroDivisionError", "KeyError", "AttributeError",
                    "UnboundLocalError", "TypeError", "zero-size array", "division by zero",
                    "MemoryError", "RecursionError", "cannot reshape array of size 0",
                    "empty sequence")


def check_zero_size(op, inputs, *, opset, n_out=1, const=(), domain="", out_types=None,
                    oracle="onnxruntime", rtol=1e-5, atol=1e-6, attributes=None, **attrs):
    """The zero-size variant of ``check``: ``inputs`` hold a 0 dimension (an empty batch,
    sequence, channel or reduced axis). Where the oracle answers, onnxrun must give the same
    dtypes, shapes and values; where it refuses, onnxrun must refuse with one of its own errors
    (onnxrun.errors) whose cause is not a kernel tripping over the empty tensor. ``oracle`` is
    onnxruntime, or "reference" (onnx's evaluator) for the few cases onnxruntime cannot judge:
    it aborts the process (its RNNs on an empty batch) or refuses for a reason of its own (no
    kernel, a locale missing on the machine, a shape-inference error in its function body), or
    the expected outputs themselves where neither can (a com.microsoft operator onnxruntime
    has no CPU kernel for, or aborts on). onnxruntime without a kernel is no refusal.
    ``attributes``: the node's attributes as a dict (for names such as "opset" that clash with
    this function's own). Returns onnxrun's outputs, or None when both refused."""
    model, feeds = one_node(op, inputs, opset=opset, n_out=n_out, const=const, domain=domain,
                            out_types=out_types, attributes=attributes, **attrs)
    if not isinstance(oracle, str):
        got = onnxrun.InferenceSession(model).run(None, feeds)
        compare(got, oracle, rtol, atol)
        return got
    try:
        if oracle == "reference":
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                want = ReferenceEvaluator(onnx.load_from_string(model)).run(None, feeds)
        else:
            so = ort.SessionOptions()
            so.log_severity_level = 4
            want = ort.InferenceSession(model, so).run(None, feeds)
    except Exception as exc:  # noqa: BLE001 - the oracle refuses: so must onnxrun
        assert "NOT_IMPLEMENTED" not in str(exc), f"{op}: no oracle ({exc}): give the outputs"
        refused = exc
    else:
        refused = None
    try:
        with warnings.catch_warnings():  # numpy's "mean of empty slice" & co: a kernel that
            warnings.simplefilter("error", RuntimeWarning)  # did not expect the empty tensor
            got = onnxrun.InferenceSession(model).run(None, feeds)
    except OnnxRunError as exc:
        assert refused is not None, f"{op}: the oracle answers, onnxrun raised {exc}"
        internal = [name for name in _INTERNAL_ERRORS if name in str(exc)]
        assert not internal, f"{op}: not a clean refusal: {exc}"
        return None
    assert refused is None, f"{op}: the oracle refuses ({refused}), onnxrun answered"
    compare(got, want, rtol, atol)
    return got


def make_rand(rng: np.random.Generator):
    """A ``rand(*shape, dtype=, lo=, hi=)`` drawing from the test module's generator."""

    def rand(*shape, dtype=np.float32, lo=-3.0, hi=3.0):
        if np.dtype(dtype).kind in "iu":
            return rng.integers(int(lo), int(hi) + 1, size=shape).astype(dtype)
        if np.dtype(dtype) == np.bool_:
            return rng.random(shape) > 0.5
        return rng.uniform(lo, hi, size=shape).astype(dtype)

    return rand
