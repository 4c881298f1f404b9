"""Compiled kernels' IR on whatever CPU runs the tests: the dynamic quantizer
(compiled/quantize.py) and the float32 LSTM and GRU recurrences (compiled/lstm.py).

Their IR is made of LLVM's generic vector operations, compiled here for the host's target:
they must give their numpy twins' results (themselves checked against onnxruntime), NaN and
infinities included. tests/test_compiled_kernels.py checks every module the kernels use on
every target the host supports.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

import onnxrun
from onnxrun.providers.cpu import compiled
from onnxrun.providers.cpu.compiled import jit, lstm, quantize
from onnxrun.providers.cpu.ops.quantization import dynamic_quantize

pytest.importorskip("llvmlite")


@pytest.fixture(scope="module")
def quantize_u8():
    if not jit.enabled():
        pytest.skip("compiled kernels switched off")
    try:
        module = jit.compile_module("quantize_for_this_cpu", quantize.module_ir(),
                                    {"dynamic_quantize_u8": quantize._PROTO}, ())
    except jit.Unavailable as exc:  # e.g. a system refusing executable mappings
        pytest.skip(str(exc))
    return module.dynamic_quantize_u8


_SIZES = [0, 1, 5, 7, 8, 9, 31, 32, 33, 40, 63, 64, 65, 100, 129, 257, 1000]
_FILLS = {"nan": [np.nan], "inf": [np.inf], "-inf": [-np.inf], "zero": [0.0],
          "all": [np.nan, np.inf, -np.inf]}


@pytest.mark.parametrize("fill", list(_FILLS))
@pytest.mark.parametrize("n", _SIZES)
def test_compiled_quantizer_equals_the_numpy_twin(quantize_u8, n, fill):
    rng = np.random.default_rng(n * 7 + len(fill))
    for rate in (0.0, 0.02, 0.2, 0.7, 1.0):
        x = (rng.standard_normal(n) * 3).astype(np.float32)
        hit = rng.random(n) < rate
        x[hit] = rng.choice(_FILLS[fill], int(hit.sum()))
        codes, params = np.empty(n, np.uint8), np.empty(2, np.float32)
        quantize_u8(x.ctypes.data, n, codes.ctypes.data, params.ctypes.data, 1.0)
        y, scale, zp = dynamic_quantize(x)
        np.testing.assert_array_equal(params[0], scale)  # NaN equals NaN here
        assert int(params[1]) == zp
        np.testing.assert_array_equal(codes, (y + zp).astype(np.uint8))


@pytest.fixture
def lstm_for_this_cpu(monkeypatch):
    """compiled.lstm's functions compiled for the host, whatever its features; counts calls."""
    if not jit.enabled():
        pytest.skip("compiled kernels switched off")
    compiled_fns = {}

    def function(name):
        if not jit.enabled():  # compiled.disabled(): the numpy path, as lstm._function does
            raise jit.Unavailable("switched off")
        if name not in compiled_fns:
            try:
                module = jit.compile_module(f"{name}_for_this_cpu", lstm._MODULES[name],
                                            {name: lstm._PROTO}, ())
            except jit.Unavailable as exc:
                pytest.skip(str(exc))
            compiled_fns[name] = getattr(module, name)
        return compiled_fns[name]

    monkeypatch.setattr(lstm, "_function", function)
    return compiled_fns


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("clip", [None, 1.5])
@pytest.mark.parametrize("op", ["LSTM", "GRU"])
def test_float_recurrence_non_finite(lstm_for_this_cpu, bias, clip, op):
    """NaN / inf in X: a biased LSTM's or GRU's NaN gates become +clip in the compiled
    recurrence too (the GRU's with linear_before_reset, the one it compiles)."""
    rng = np.random.default_rng(4)
    T, batch, I, H = 4, 3, 5, 20
    G = 4 if op == "LSTM" else 3
    inits = [numpy_helper.from_array((rng.standard_normal((1, G * H, I)) * 0.3)
                                     .astype(np.float32), "W"),
             numpy_helper.from_array((rng.standard_normal((1, G * H, H)) * 0.3)
                                     .astype(np.float32), "R")]
    if bias:
        inits.append(numpy_helper.from_array((rng.standard_normal((1, 2 * G * H)) * 0.3)
                                             .astype(np.float32), "B"))
    attrs = {"hidden_size": H} if clip is None else {"hidden_size": H, "clip": clip}
    outputs = ["Y", "Y_h", "Y_c"] if op == "LSTM" else ["Y", "Y_h"]
    if op == "GRU":
        attrs["linear_before_reset"] = 1
    node = helper.make_node(op, ["X", "W", "R", "B" if bias else ""], outputs, **attrs)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("X", TP.FLOAT, [T, batch, I])],
        [helper.make_tensor_value_info(n, TP.FLOAT, None) for n in outputs], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    x = rng.standard_normal((T, batch, I)).astype(np.float32)
    x[1, 0], x[2, 1, 0], x[3, 2, 1] = np.nan, np.inf, -np.inf
    with compiled.disabled():
        want = onnxrun.InferenceSession(model.SerializeToString()).run(None, {"X": x})
    got = onnxrun.InferenceSession(model.SerializeToString()).run(None, {"X": x})
    assert f"{op.lower()}_f32" in lstm_for_this_cpu  # the session took the compiled recurrence
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=0, atol=1e-6)  # NaN where NaN
    assert np.isnan(got[0]).any() != bias
