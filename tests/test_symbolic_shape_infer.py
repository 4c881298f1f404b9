"""onnxrun.tools.symbolic_shape_infer: symbolic shapes as onnxruntime's tool writes them
(onnxruntime's tool is the oracle where it is installed)."""

from __future__ import annotations

import subprocess
import sys

import onnx
import onnx.parser
import pytest

pytest.importorskip("sympy")

from onnxrun.tools import symbolic_shape_infer as ssi  # noqa: E402
from onnxrun.tools.symbolic_shape_infer import SymbolicShapeInference  # noqa: E402

# Shape arithmetic done in the graph: Shape -> Slice -> Concat -> Reshape, a Concat of symbolic
# dims, Unsqueeze/Gather of a shape vector, Expand, ConstantOfShape.
SHAPE_MATH = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[batch, seq, 4, 8] x, float[batch, 3, 32] y) => (float[a, b, c] out, float[d, e] ones)
<int64[1] k32 = {32}, int64[1] zero = {0}, int64[1] two = {2}, int64[1] one = {1},
 int64[1] ax0 = {0}, int64 i1 = {1}>
{
    s = Shape(x)
    head = Slice(s, zero, two)
    target = Concat<axis=0>(head, k32)
    r = Reshape(x, target)
    out = Concat<axis=1>(r, y)
    seq = Gather<axis=0>(s, i1)
    seq1 = Unsqueeze(seq, ax0)
    n = Mul(seq1, two)
    dims = Concat<axis=0>(n, k32)
    ones = ConstantOfShape(dims)
}
"""


def shapes(model: onnx.ModelProto) -> dict[str, tuple]:
    """name -> (elem_type, dims) of value_info and graph outputs."""
    def dims(vi: onnx.ValueInfoProto) -> tuple:
        t = vi.type.tensor_type
        return (t.elem_type, tuple(d.dim_param or d.dim_value for d in t.shape.dim)
                if t.HasField("shape") else None)
    got = {vi.name: dims(vi) for vi in model.graph.value_info}
    got.update({f"output:{vi.name}": dims(vi) for vi in model.graph.output})
    return got


def ort_tool() -> type:
    pytest.importorskip("onnxruntime")
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference as theirs
    return theirs


def test_shape_arithmetic_gives_symbolic_dims() -> None:
    out = SymbolicShapeInference.infer_shapes(onnx.parser.parse_model(SHAPE_MATH))
    got = shapes(out)
    assert got["r"] == (onnx.TensorProto.FLOAT, ("batch", "seq", 32))
    assert got["output:out"] == (onnx.TensorProto.FLOAT, ("batch", "seq + 3", 32))
    assert got["output:ones"] == (onnx.TensorProto.FLOAT, ("2*seq", 32))
    assert got["s"] == (onnx.TensorProto.INT64, (4,))


def test_shape_arithmetic_matches_onnxruntime(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # onnxruntime's tool writes a scratch model in the cwd
    model = onnx.parser.parse_model(SHAPE_MATH)
    theirs = ort_tool().infer_shapes(model, auto_merge=True)
    ours = SymbolicShapeInference.infer_shapes(model, auto_merge=True)
    assert shapes(ours) == shapes(theirs)


def test_nodes_out_of_order_are_inferred() -> None:
    model = onnx.parser.parse_model(SHAPE_MATH)
    nodes = list(model.graph.node)
    del model.graph.node[:]
    model.graph.node.extend(reversed(nodes))
    got = shapes(SymbolicShapeInference.infer_shapes(model))
    assert got["output:out"] == (onnx.TensorProto.FLOAT, ("batch", "seq + 3", 32))


def test_slice_of_symbolic_dim_and_broadcast() -> None:
    model = onnx.parser.parse_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N, 6] x, float[M] z) => (float[p, q] out, float[r, t] sq)
    <int64[2] st = {1, -5}, int64[2] en = {-1, 9223372036854775807}, int64[2] ax = {0, 1},
     int64[2] step = {1, 2}>
    {
        out = Slice(x, st, en, ax, step)
        zz = Unsqueeze(z, ax0)
        sq = Add(out, zz)
    }
    """.replace("ax0)", "axz)").replace("int64[2] step = {1, 2}>",
                                           "int64[2] step = {1, 2}, int64[1] axz = {1}>"))
    got = shapes(SymbolicShapeInference.infer_shapes(model, auto_merge=True))
    assert got["output:out"] == (onnx.TensorProto.FLOAT, ("N - 2", 3))
    assert got["zz"] == (onnx.TensorProto.FLOAT, ("M", 1))
    assert got["output:sq"] == (onnx.TensorProto.FLOAT, ("M", 3))


def test_if_with_branches_of_different_types_names_the_node() -> None:
    model = onnx.parser.parse_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (bool c) => (float out) {
        out = If<then_branch = t () => (float a) { a = Constant<value = float {1.0}>() },
                 else_branch = e () => (double b) { b = Constant<value = double {1.0}>() }>(c)
    }
    """)
    model.graph.node[0].name = "pick"
    with pytest.raises(ValueError, match=r"pick.*FLOAT.*DOUBLE"):
        SymbolicShapeInference.infer_shapes(model)


def test_old_opset_returns_none() -> None:
    model = onnx.parser.parse_model("""
    <ir_version: 3, opset_import: ["" : 6]>
    g (float[N] x) => (float[N] y) { y = Relu(x) }
    """)
    assert SymbolicShapeInference.infer_shapes(model) is None


def test_not_a_model_is_refused() -> None:
    with pytest.raises(TypeError, match="ModelProto"):
        SymbolicShapeInference.infer_shapes(b"not a model")


def test_missing_sympy_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "sympy", None)
    with pytest.raises(ImportError, match="pip install sympy"):
        SymbolicShapeInference.infer_shapes(onnx.parser.parse_model(SHAPE_MATH))


def test_command_line_writes_the_model(tmp_path) -> None:
    src, dst = tmp_path / "m.onnx", tmp_path / "out.onnx"
    onnx.save(onnx.parser.parse_model(SHAPE_MATH), src)
    proc = subprocess.run([sys.executable, "-m", "onnxrun.tools.symbolic_shape_infer",
                           "--input", str(src), "--output", str(dst), "--auto_merge"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert shapes(onnx.load(dst))["output:out"] == (onnx.TensorProto.FLOAT,
                                                   ("batch", "seq + 3", 32))
    assert ssi.main(["--input", str(src)]) == 0


def test_compat_alias_resolves_to_onnxrun() -> None:
    import onnxrun.compat

    onnxrun.compat.install()
    try:
        from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference as aliased
    finally:
        onnxrun.compat.uninstall()
    assert aliased is SymbolicShapeInference


# onnxruntime's operators onnx cannot infer: LayerNormalization before opset 17 (defined by
# onnxruntime in the onnx domain), com.microsoft FusedMatMul / Attention / FastGelu; a MatMul
# whose contracted dims are two names (auto_merge makes them one); an input dim with no name.
CONTRIB = """
<ir_version: 8, opset_import: ["" : 13, "com.microsoft" : 1]>
g (float[batch, seq, 16] x, float[k, 24] w, float[24] b, float[16] g, float[16] beta,
   float[batch, seq, hidden] h, float[16, 16] u)
   => (float[a, b2, c] att, float[a1, b1, c1] ln, float[p, q, r] mm)
{
    ln = LayerNormalization<axis = -1>(x, g, beta)
    att = com.microsoft.Attention<num_heads = 2>(x, w, b)
    gel = com.microsoft.FastGelu(att)
    mm = MatMul(h, u)
}
"""


def test_contrib_operators_match_onnxruntime(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    model = onnx.parser.parse_model(CONTRIB)
    ours = shapes(SymbolicShapeInference.infer_shapes(model, auto_merge=True))
    assert ours["output:att"] == (onnx.TensorProto.FLOAT, ("batch", "seq", 8))
    assert ours["output:ln"] == (onnx.TensorProto.FLOAT, ("batch", "seq", 16))
    assert ours["output:mm"] == (onnx.TensorProto.FLOAT, ("batch", "seq", 16))
    assert ours == shapes(ort_tool().infer_shapes(model, auto_merge=True))


def test_fused_matmul_transposes() -> None:
    model = onnx.parser.parse_model("""
    <ir_version: 8, opset_import: ["" : 17, "com.microsoft" : 1]>
    g (float[m, 16] u, float[n, 8] v) => (float[e, f] fm) {
        fm = com.microsoft.FusedMatMul<transA = 1>(u, v)
    }
    """)
    got = shapes(SymbolicShapeInference.infer_shapes(model, auto_merge=True))
    assert got["output:fm"] == (onnx.TensorProto.FLOAT, (16, 8))


def test_loop_scan_output_stacks_the_iterations(tmp_path, monkeypatch: pytest.MonkeyPatch
                                                ) -> None:
    monkeypatch.chdir(tmp_path)
    model = onnx.parser.parse_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (int64 trip, bool cond, float[N, 3] x) => (float[a] total, float[p, q, r] stacked) {
        total, stacked = Loop(trip, cond, s0) <body = b (int64 i, bool c, float[1] acc)
            => (bool c_out, float[1] acc_out, float[N, 3] y) {
            c_out = Identity(c)
            acc_out = Identity(acc)
            y = Relu(x)
        }>
    }
    """.replace("(trip, cond, s0)", "(trip, cond, x0)").replace(
        "float[N, 3] x) =>", "float[N, 3] x, float[1] x0) =>"))
    ours = shapes(SymbolicShapeInference.infer_shapes(model, auto_merge=True))
    assert ours["output:stacked"] == (onnx.TensorProto.FLOAT, ("Loop_0_o0__d0", "N", 3))
    assert ours["output:total"] == (onnx.TensorProto.FLOAT, (1,))
    assert ours == shapes(ort_tool().infer_shapes(model, auto_merge=True))
