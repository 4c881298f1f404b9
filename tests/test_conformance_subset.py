"""ONNX node conformance cases (onnx.backend.test) for the elementwise, activation, tensor and
reduction kernels: every case whose nodes all use those operators runs through onnxrun and
must match the expected outputs stored with the case."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import numpy_helper
from onnx.backend.test.case.node import collect_testcases

import onnxrun
from onnxrun.providers.cpu import _load_kernels, cpu_kernels

FAMILIES = ("elementwise", "activation", "tensor", "reduction")


def _family_ops() -> set[str]:
    _load_kernels()
    ops = set()
    for domain, op_type, version in cpu_kernels.operators():
        kdef = cpu_kernels.lookup(domain, op_type, version)
        if domain == "" and kdef.impl.__module__.rsplit(".", 1)[-1] in FAMILIES:
            ops.add(op_type)
    return ops


def _cases():
    ops = _family_ops()
    out = []
    for case in collect_testcases(None):
        used = {n.op_type for n in case.model.graph.node}
        if used and used <= ops:
            out.append(pytest.param(case, id=case.name))
    return out


def _array(v):
    return numpy_helper.to_array(v) if isinstance(v, onnx.TensorProto) else np.asarray(v)


def _assert_close(got: np.ndarray, want: np.ndarray, rtol: float, atol: float) -> None:
    assert got.shape == want.shape, (got.shape, want.shape)
    if want.dtype == object:
        assert got.tolist() == want.tolist()
        return
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    if want.dtype.kind in "iub":
        np.testing.assert_array_equal(got, want)
    else:  # floats, including the ml_dtypes ones: compare as float64
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64),
                                   rtol=rtol, atol=atol, equal_nan=True)


@pytest.mark.parametrize("case", _cases())
def test_node_case(case):
    rtol = case.rtol if case.rtol is not None else 1e-3
    atol = case.atol if case.atol is not None else 1e-7
    sess = onnxrun.InferenceSession(case.model.SerializeToString())
    names = [i.name for i in sess.get_inputs()]
    for inputs, outputs in case.data_sets:
        feeds = dict(zip(names, (_array(v) for v in inputs), strict=False))
        got = sess.run(None, feeds)
        assert len(got) == len(outputs)
        for g, w in zip(got, outputs, strict=True):
            _assert_close(np.asarray(g), _array(w), rtol, max(atol, 1e-6))
