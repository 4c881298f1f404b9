"""compiled/softmax.py: float32 softmax over the last axis in one kernel call, against the
numpy path (ops.activation._softmax) and onnxruntime: within float32 rounding, the same NaN
rows, the same bits at any thread count, in place and into the executor's buffer."""

from __future__ import annotations

import contextlib

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import onnxrun
from onnxrun.providers.cpu import compiled
from onnxrun.providers.cpu.compiled import jit, softmax
from onnxrun.providers.cpu.ops.activation import _softmax

pytest.importorskip("llvmlite")
pytestmark = pytest.mark.skipif(jit.why_unavailable() is not None,
                                reason=f"compiled kernels: {jit.why_unavailable()}")


@pytest.fixture(params=["host", "avx2"])
def target(request):
    with contextlib.nullcontext() if request.param == "host" else \
            compiled.forced_target("avx2"):
        if softmax.unavailable() is not None:
            pytest.skip(softmax.unavailable())
        yield request.param


@pytest.mark.parametrize("shape", [(4, 128, 128), (3, 7), (5, 1), (2, 17), (1, 33), (32, 6625),
                                   (2, 16), (3, 31)])
@pytest.mark.parametrize("scale", [1.0, 30.0])
def test_equals_the_numpy_path_to_float32_rounding(target, shape, scale):
    x = (np.random.default_rng(sum(shape)).standard_normal(shape) * scale).astype(np.float32)
    want = _softmax(x.copy(), -1)
    got = softmax.softmax_last(x)
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-9)
    np.testing.assert_allclose(got.sum(axis=-1), 1.0, rtol=1e-5)
    # each row whole on one thread, in the same order: the same bits at any count
    np.testing.assert_array_equal(softmax.softmax_last(x, threads=2), got)
    np.testing.assert_array_equal(softmax.softmax_last(x, threads=3), got)
    y = x.copy()
    assert softmax.softmax_last(y, out=y) is y  # in place
    np.testing.assert_array_equal(y, got)


def test_special_values_as_the_numpy_path(target):
    x = np.array([[1, np.nan, 2], [np.inf, 1, 2], [-np.inf] * 3, [-1e30, 0, 1],
                  [-200, 0, -300], [-np.inf, 0, 5], [3.0e38, -3.0e38, 0]], np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        want = _softmax(x.copy(), -1)
    got = softmax.softmax_last(x)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-9)


@pytest.mark.parametrize("n", [7, 256, 6625])
def test_no_subnormal_lane_and_the_numpy_path_where_scores_spread_wide(target, n):
    """Scores whose exponentials fall in float32's subnormal band (each operation on one is a
    microcode assist): those are 0, as is any share that would be subnormal; the rest is the
    numpy path's to float32 rounding."""
    rng = np.random.default_rng(n)
    x = -np.abs(rng.standard_normal((64, n)) * 40).astype(np.float32)
    x[:, :3] = [0, -90, -95]  # the maximum; exp(-90) and exp(-95) are subnormal
    exact = np.exp(x.astype(np.float64))  # (the maximum is 0)
    assert np.any((exact > 0) & (exact < np.finfo(np.float32).tiny))  # the band is exercised
    want = _softmax(x.copy(), -1)
    got = softmax.softmax_last(x)
    assert not np.any((got > 0) & (got < np.finfo(np.float32).tiny))
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-30)
    np.testing.assert_allclose(got.sum(axis=-1), 1.0, rtol=1e-5)
    big = want >= 1e-30  # what is kept: every share that float32 rounding of the row shows
    assert np.all(got[big] > 0)


def test_rejects_what_it_does_not_take():
    with pytest.raises(ValueError, match="C-contiguous float32"):
        softmax.softmax_last(np.zeros((3, 4), np.float64))
    with pytest.raises(ValueError, match="C-contiguous float32"):
        softmax.softmax_last(np.zeros((4, 3), np.float32).T)
    with pytest.raises(ValueError, match="out must be"):
        softmax.softmax_last(np.zeros((3, 4), np.float32), out=np.zeros((4, 3), np.float32))


@pytest.mark.parametrize("threads", [1, 2])
def test_the_operator_in_a_model_with_onnxruntimes_results(threads):
    """Softmax-13 over the last axis of attention-sized scores (the compiled call into the
    executor's buffer) and over another axis (numpy's passes): onnxruntime's numbers."""
    model = onnx.parser.parse_model("""
<ir_version: 8, opset_import: ["" : 17]>
g (float[2, 4, 64, 96] x) => (float[2, 4, 64, 96] y, float[2, 4, 64, 96] z) {
    s = Mul (x, x)
    y = Softmax <axis = -1> (s)
    z = Softmax <axis = 2> (x)
}
""")
    data = model.SerializeToString()
    so = onnxrun.SessionOptions()
    so.intra_op_num_threads = threads
    sess = onnxrun.InferenceSession(data, so)
    ref = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    for seed in range(4):  # the memory pattern's runs too
        feeds = {"x": np.random.default_rng(seed).standard_normal((2, 4, 64, 96))
                 .astype(np.float32) * 2}
        for got, want in zip(sess.run(None, feeds), ref.run(None, feeds), strict=True):
            np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-7)
