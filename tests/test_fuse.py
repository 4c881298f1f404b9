"""Runs of small float32 element-wise steps become one step (fuse.py) that runs them as one
compiled program: onnxruntime's and the unfused plan's bits, intermediates read later kept,
operands of another layout through the ufuncs, errors naming the node that failed."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import onnxrun
from onnxrun import fuse
from onnxrun.providers.cpu.compiled import float_chain

pytestmark = pytest.mark.skipif(float_chain.unavailable() is not None,
                                reason=f"compiled kernels: {float_chain.unavailable()}")

# a, d: read after the run (Relu, an output), so made; b, c, e: only inside it
_ROW = ", ".join(str(v) for v in np.linspace(-2, 3, 37, dtype=np.float32))
MODEL = f"""
<ir_version: 8, opset_import: ["" : 18]>
g (float[3, 37] x, float[3, 37] z) => (float[3, 37] y, float[3, 37] d, float[3, 37] r) {{
  half = Constant<value = float {{0.5}}>()
  row = Constant<value = float[37] {{{_ROW}}}>()
  a = Mul(x, half)
  b = Add(a, x)
  c = Sub(row, b)
  d = Div(c, z)
  e = Mul(d, d)
  y = Sqrt(e)
  r = Relu(a)
}}
"""


def _session(model: bytes, fused: bool, monkeypatch) -> onnxrun.InferenceSession:
    """A session whose plans fuse runs from two steps (MIN_STEPS is a cost choice: the
    model's run has six), or none."""
    with monkeypatch.context() as m:
        m.setattr(fuse, "MIN_STEPS", 2 if fused else 10 ** 9)
        return onnxrun.InferenceSession(model)


def _fused_steps(sess: onnxrun.InferenceSession) -> list[fuse.FusedElementwise]:
    return [st.kernel for st in sess._program.full_plan.steps
            if isinstance(st.kernel, fuse.FusedElementwise)]


def _feeds(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((3, 37), dtype=np.float32)
    z = rng.standard_normal((3, 37), dtype=np.float32)
    z[0, :3] = (0.0, -0.0, np.nan)  # inf, -inf and nan through the division
    return {"x": x, "z": z}


def test_a_run_of_element_wise_nodes_is_one_step_with_the_same_bits(monkeypatch):
    model = onnx.parser.parse_model(MODEL).SerializeToString()
    sess = _session(model, True, monkeypatch)
    (kernel,) = _fused_steps(sess)
    assert [st.node.op_type for st in kernel.steps] == ["Mul", "Add", "Sub", "Div", "Mul",
                                                        "Sqrt"]
    # a (read by Relu) and d and y (outputs) are made; b, c, e live in its temporaries
    assert len(kernel.outputs) == 3
    plain = _session(model, False, monkeypatch)
    assert not _fused_steps(plain)
    oracle = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    for seed in range(12):  # the generated function's runs too
        feeds = _feeds(seed)
        got = sess.run(None, feeds)
        for want in (plain.run(None, feeds), oracle.run(None, feeds)):
            for g, w in zip(got, want, strict=True):
                assert g.dtype == w.dtype and g.shape == w.shape
                np.testing.assert_array_equal(g, w)  # bit for bit, nan where nan


def test_operands_of_another_layout_take_the_ufuncs(monkeypatch):
    model = onnx.parser.parse_model(MODEL).SerializeToString()
    (kernel,) = _fused_steps(_session(model, True, monkeypatch))
    feeds = _feeds(1)
    wide = np.empty((3, 74), np.float32)
    wide[:, ::2] = feeds["x"]
    strided = wide[:, ::2]  # not contiguous: the compiled program does not take it
    with np.errstate(all="ignore"):
        fast = kernel(feeds["x"], feeds["z"])
        slow = kernel(strided, feeds["z"])
    for f, s in zip(fast, slow, strict=True):
        np.testing.assert_array_equal(f, s)


def test_a_failure_names_the_node_that_failed(monkeypatch):
    """As the run loop names a failing node, with its inputs (the feed checks stand in front
    of the plan: its run is called directly here)."""
    model = onnx.parser.parse_model(MODEL).SerializeToString()
    program = _session(model, True, monkeypatch)._program
    x_slot, z_slot = program.input_slots
    z = np.ones((3, 5), np.float32)  # does not broadcast against (3, 37) at the Div
    with pytest.raises(onnxrun.RuntimeException) as info, np.errstate(all="ignore"):
        program.run(program.full_plan, [(x_slot, _feeds()["x"]), (z_slot, z)])
    text = str(info.value)
    assert text.startswith("while running node 'd' (Div) with inputs float[3,37], float[3,5]:"), \
        text


def test_short_runs_keep_their_ufuncs():
    """A fused call's fixed cost (addresses, the call) is that of several tiny ufuncs."""
    model = onnx.parser.parse_model(MODEL).SerializeToString()
    assert fuse.MIN_STEPS > 6 and not _fused_steps(onnxrun.InferenceSession(model))


@pytest.mark.parametrize("change", ["large", "double", "symbolic"])
def test_what_is_not_fused(change, monkeypatch):
    """Above MAX_ELEMENTS (memory.py's buffers matter more there), other types, and shapes
    not known when the session is made keep their ufuncs."""
    shape = {"large": "64, 512", "double": "3, 37", "symbolic": "N, 37"}[change]
    ty = "double" if change == "double" else "float"
    text = f"""
    <ir_version: 8, opset_import: ["" : 18]>
    g ({ty}[{shape}] x) => ({ty}[{shape}] y) {{
      a = Add(x, x)
      y = Mul(a, x)
    }}
    """
    sess = _session(onnx.parser.parse_model(text).SerializeToString(), True, monkeypatch)
    assert not _fused_steps(sess)
