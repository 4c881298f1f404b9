"""ConvAddActivationFusion: Conv + Add (or a Sum of two) of a same-shaped value [+ Relu] ->
com.microsoft FusedConv with that value as Z."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from extended_helpers import build, ops, optimized

import onnxrun

rng = np.random.default_rng(0)

W = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
B = rng.standard_normal(4).astype(np.float32)
FEEDS = {"x": rng.standard_normal((1, 3, 6, 6)).astype(np.float32),
         "z": rng.standard_normal((1, 4, 6, 6)).astype(np.float32)}


def model(body: str, z: str = "float[1, 4, 6, 6] z", outs: str = "float[1, 4, 6, 6] y"):
    return build(f"""<ir_version: 8, opset_import: ["" : 17]>
g (float[1, 3, 6, 6] x, {z}) => ({outs}) {{
    c = Conv <pads = [1, 1, 1, 1]> (x, w, b)
    {body}
}}""", w=W, b=B)


CASES = {
    "Conv+Add+Relu": ("s = Add(z, c)\n y = Relu(s)", "Relu"),
    "Conv+Sum+Relu": ("s = Sum(c, z)\n y = Relu(s)", "Relu"),
    "ConvSumRelu (z first)": ("s = Sum(z, c)\n y = Relu(s)", "Relu"),
    "Conv+Add": ("y = Add(c, z)", None),
    "Conv+Sum": ("y = Sum(z, c)", None),
}


@pytest.mark.parametrize("case", list(CASES))
def test_fires(case, tmp_path):
    body, act = CASES[case]
    changes, opt = optimized(model(body), FEEDS, tmp_path)
    assert sum(changes["ConvAddActivationFusion"].values()) == 1
    assert ops(opt) == ["FusedConv"]
    node = opt.graph.node[0]
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    assert node.domain == "com.microsoft" and list(node.input) == ["x", "w", "b", "z"]
    assert attrs.get("activation") == (act.encode() if act else None)
    assert attrs["pads"] == [1, 1, 1, 1]


def test_bits_equal_the_unfused_graph():
    """The same additions in the same order: bit for bit the Add and Relu's numbers."""
    m = model("s = Add(c, z)\n y = Relu(s)").SerializeToString()
    got, want = (onnxrun.InferenceSession(m, disabled_optimizers=d).run(None, FEEDS)[0]
                 for d in ([], ["ConvAddActivationFusion"]))
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("body,z,outs", [
    ("y = Add(c, z)", "float[1, 4, 1, 1] z", "float[1, 4, 6, 6] y"),  # z broadcast
    ("y = Add(c, z)", "float[2, 4, 6, 6] z", "float[2, 4, 6, 6] y"),  # the output broadcast
    ("y = Sum(c, z, z)", "float[1, 4, 6, 6] z", "float[1, 4, 6, 6] y"),  # three operands
    ("y = Add(c, z)", "float[1, 4, 6, 6] z", "float[1, 4, 6, 6] y, float[1, 4, 6, 6] c"),
])
def test_does_not_fire(body, z, outs, tmp_path):
    shape = [int(d) for d in z[z.index("[") + 1:z.index("]")].split(",")]
    feeds = {"x": FEEDS["x"], "z": rng.standard_normal(shape).astype(np.float32)}
    changes, opt = optimized(model(body, z, outs), feeds, tmp_path)
    assert "ConvAddActivationFusion" not in changes
    assert "FusedConv" not in ops(opt)
