"""MatmulTransposeFusion: Transpose (last two axes) + MatMul -> FusedMatMul transA/transB."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.numpy_helper
import onnx.parser
from extended_helpers import build, ops, optimized

rng = np.random.default_rng(0)


FEEDS = {"a": rng.standard_normal((2, 5, 4)).astype(np.float32),
         "b": rng.standard_normal((2, 6, 5)).astype(np.float32)}


def model_of(body: str, outs: str = "float[2, 4, 6] y"):
    return build(f"""<ir_version: 8, opset_import: ["" : 17]>
g (float[2, 5, 4] a, float[2, 6, 5] b) => ({outs}) {{
    {body}
}}""")


def attrs(node) -> dict:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def test_transposed_a_fires(tmp_path):
    model = model_of("at = Transpose <perm = [0, 2, 1]> (a)\n bt = Transpose <perm = [0, 2, 1]>"
                     " (b)\n y = MatMul(at, bt)")
    changes, opt = optimized(model, FEEDS, tmp_path)
    assert changes["MatmulTransposeFusion"] == {"Transpose+MatMul": 2}
    assert ops(opt) == ["FusedMatMul"]
    assert attrs(opt.graph.node[0])["transA"] == 1 and attrs(opt.graph.node[0])["transB"] == 1


def test_transposed_b_2d_fires(tmp_path):
    w = rng.standard_normal((6, 4)).astype(np.float32)
    model = build("""<ir_version: 8, opset_import: ["" : 17]>
g (float[3, 4] x, float[6, 4] w) => (float[3, 6] y) {
    wt = Transpose <perm = [1, 0]> (w)
    y = MatMul(x, wt)
}""")
    feeds = {"x": rng.standard_normal((3, 4)).astype(np.float32), "w": w}
    changes, opt = optimized(model, feeds, tmp_path)
    assert ops(opt) == ["FusedMatMul"]
    assert attrs(opt.graph.node[0])["transB"] == 1


def test_other_permutation_does_not_fire(tmp_path):
    model = build("""<ir_version: 8, opset_import: ["" : 17]>
g (float[5, 2, 4] a, float[2, 4, 6] b) => (float[2, 5, 6] y) {
    at = Transpose <perm = [1, 0, 2]> (a)
    y = MatMul(at, b)
}""")
    feeds = {"a": rng.standard_normal((5, 2, 4)).astype(np.float32),
             "b": rng.standard_normal((2, 4, 6)).astype(np.float32)}
    changes, opt = optimized(model, feeds, tmp_path)
    assert "MatmulTransposeFusion" not in changes
    assert ops(opt) == ["Transpose", "MatMul"]


def test_transpose_read_twice_does_not_fire(tmp_path):
    model = model_of("at = Transpose <perm = [0, 2, 1]> (a)\n bt = Transpose <perm = [0, 2, 1]>"
                     " (b)\n y = MatMul(at, bt)", outs="float[2, 4, 6] y, float[2, 4, 5] at")
    changes, opt = optimized(model, FEEDS, tmp_path)
    assert changes["MatmulTransposeFusion"] == {"Transpose+MatMul": 1}  # b's only
    assert sorted(ops(opt)) == ["FusedMatMul", "Transpose"]
