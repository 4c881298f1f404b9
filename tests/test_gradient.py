"""Gradient (ai.onnx.preview.training): reverse-mode differentiation of the enclosing graph.

Gradients are checked against central finite differences in float64 (the seed is ones_like(y),
so the reference is d sum(y) / dx), and against the two onnx conformance models.
"""

from __future__ import annotations

import os

import numpy as np
import onnx
import onnx.backend.test
import onnx.numpy_helper
import onnx.parser
import pytest

import onnxrun

_HEADER = '<ir_version: 8, opset_import: ["" : {opset}, "ai.onnx.preview.training" : 1]>\n'


def _session(text: str, opset: int = 17) -> onnxrun.InferenceSession:
    model = onnx.parser.parse_model(_HEADER.format(opset=opset) + text)
    return onnxrun.InferenceSession(model.SerializeToString())


def _strings(names: list[str]) -> str:
    return "[" + ", ".join(f'"{n}"' for n in names) + "]"


def _gradient_line(xs: list[str], y: str, zs: list[str] = ()) -> str:
    outs = ", ".join(f"d_{x}" for x in xs)
    attrs = f"xs: strings = {_strings(xs)}, y: string = \"{y}\""
    if zs:
        attrs += f", zs: strings = {_strings(list(zs))}"
    return f"{outs} = ai.onnx.preview.training.Gradient<{attrs}>({', '.join([*xs, *zs])})"


def _check(decl: str, body: str, feeds: dict[str, np.ndarray], xs: list[str], y: str = "y",
           zs: list[str] = (), opset: int = 17, eps: float = 1e-6, tol: float = 1e-6) -> None:
    """Build ``decl { body; Gradient }`` (y must be the first graph output, the gradients
    follow) and compare every gradient with central differences of sum(y)."""
    text = f"{decl} {{\n{body}\n{_gradient_line(xs, y, zs)}\n}}"
    sess = _session(text, opset)
    results = sess.run(None, feeds)
    grads = results[1:1 + len(xs)]

    def total(f: dict[str, np.ndarray]) -> float:
        return float(np.sum(sess.run([y], f)[0]))

    for x, g in zip(xs, grads, strict=True):
        assert g.shape == feeds[x].shape and g.dtype == feeds[x].dtype, x
        numeric = np.zeros(feeds[x].shape)
        flat = numeric.reshape(-1)
        for i in range(flat.size):
            hi, lo = dict(feeds), dict(feeds)
            hi[x] = feeds[x].copy().reshape(-1)
            lo[x] = feeds[x].copy().reshape(-1)
            hi[x][i] += eps
            lo[x][i] -= eps
            hi[x] = hi[x].reshape(feeds[x].shape)
            lo[x] = lo[x].reshape(feeds[x].shape)
            flat[i] = (total(hi) - total(lo)) / (2 * eps)
        np.testing.assert_allclose(g, numeric, rtol=tol, atol=tol, err_msg=f"d{y}/d{x}")


def _rand(*shape: int, seed: int = 0, positive: bool = False) -> np.ndarray:
    r = np.random.default_rng(seed + 17 * len(shape) + sum(shape)).standard_normal(shape)
    return np.abs(r) + 0.5 if positive else r


# -- conformance ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["test_gradient_of_add", "test_gradient_of_add_and_mul"])
def test_conformance_models(name):
    root = os.path.join(os.path.dirname(onnx.backend.test.__file__), "data", "simple", name)
    model = onnx.load(os.path.join(root, "model.onnx"))
    data = os.path.join(root, "test_data_set_0")

    def load(kind: str) -> list[np.ndarray]:
        files = sorted(f for f in os.listdir(data) if f.startswith(kind))
        return [onnx.numpy_helper.to_array(onnx.load_tensor(os.path.join(data, f)))
                for f in files]

    sess = onnxrun.InferenceSession(model.SerializeToString())
    feeds = dict(zip([i.name for i in model.graph.input], load("input"), strict=True))
    for got, want in zip(sess.run(None, feeds), load("output"), strict=True):
        assert got.dtype == want.dtype
        np.testing.assert_allclose(got, want, rtol=1e-6)


# -- derivative rules against finite differences ----------------------------------------------


def test_mlp_matmul_gemm_activations():
    decl = ("g (double[3,4] X, double[4,5] W, double[5] b, double[2,5] V, double[2] c) => "
            "(double y, double[4,5] d_W, double[5] d_b, double[2,5] d_V, double[2] d_c)")
    body = """
      h = MatMul(X, W)
      a = Add(h, b)
      r = Relu(a)
      s = Sigmoid(r)
      t = Tanh(h)
      u = Sub(s, t)
      o = Gemm<transB=1, alpha=0.7, beta=1.3>(u, V, c)
      p = Softmax<axis=-1>(o)
      l = Log(p)
      y = ReduceMean<keepdims=0>(l)
    """
    feeds = {"X": _rand(3, 4), "W": _rand(4, 5), "b": _rand(5), "V": _rand(2, 5),
             "c": _rand(2)}
    _check(decl, body, feeds, ["W", "b", "V", "c"], zs=["X"])


def test_broadcasting_arithmetic():
    decl = ("g (double[2,3,4] A, double[3,1] B, double[4] C) => "
            "(double[2,3,4] y, double[2,3,4] d_A, double[3,1] d_B, double[4] d_C)")
    body = """
      two = Constant<value = double {2.0}>()
      m = Mul(A, B)
      s = Sub(m, C)
      bb = Mul(B, B)
      one = Constant<value = double {1.0}>()
      den = Add(bb, one)
      q = Div(s, den)
      p = Pow(q, two)
      na = Neg(A)
      e = Exp(na)
      k = Add(p, e)
      k1 = Add(k, one)
      r = Sqrt(k1)
      rc = Sub(r, C)
      n = Abs(rc)
      rd = Reciprocal(den)
      y = Mul(n, rd)
    """
    feeds = {"A": _rand(2, 3, 4), "B": _rand(3, 1), "C": _rand(4)}
    _check(decl, body, feeds, ["A", "B", "C"])


def test_pow_both_operands_and_log():
    decl = ("g (double[3,4] A, double[4] P) => (double[3,4] y, double[3,4] d_A, double[4] d_P)")
    body = """
      p = Pow(A, P)
      pa = Add(p, A)
      y = Log(pa)
    """
    feeds = {"A": _rand(3, 4, positive=True), "P": _rand(4)}
    _check(decl, body, feeds, ["A", "P"])


def test_shape_operators_and_reductions():
    decl = ("g (double[2,3,4] A, double[3] B) => (double[4,12] y, double[2,3,4] d_A, "
            "double[3] d_B)")
    body = """
      shape = Constant<value = int64[2] {6, 4}>()
      r = Reshape(A, shape)
      t = Transpose<perm = [1, 0]>(r)
      ax = Constant<value = int64[1] {0}>()
      ub = Unsqueeze(B, ax)
      sb = Squeeze(ub, ax)
      eshape = Constant<value = int64[2] {2, 3}>()
      eb = Expand(sb, eshape)
      fb = Flatten<axis=0>(eb)
      six = Constant<value = int64[1] {6}>()
      fr = Reshape(fb, six)
      w = Mul(t, fr)
      ident = Identity(w)
      c = Concat<axis=1>(ident, t)
      axes = Constant<value = int64[1] {1}>()
      s = ReduceSum<keepdims=0>(c, axes)
      m = ReduceMean<axes = [0], keepdims=1>(t)
      ms = Squeeze(m)
      us = Unsqueeze(s, axes)
      y0 = Mul(us, ms)
      yy = Concat<axis=0>(y0, y0)
      yshape = Constant<value = int64[2] {4, 12}>()
      y = Reshape(yy, yshape)
    """
    feeds = {"A": _rand(2, 3, 4), "B": _rand(3)}
    _check(decl, body, feeds, ["A", "B"])


@pytest.mark.parametrize("opset", [11, 13])
def test_softmax_versions(opset):
    # opset 11 coerces to 2-D at axis 1; opset 13 normalizes along axis 1 only.
    decl = ("g (double[2,3,4] A, double[2,3,4] W) => (double[2,3,4] y, double[2,3,4] d_A)")
    body = """
      s = Softmax<axis=1>(A)
      l = LogSoftmax<axis=1>(A)
      sl = Add(s, l)
      y = Mul(sl, W)
    """
    feeds = {"A": _rand(2, 3, 4), "W": _rand(2, 3, 4, seed=1)}
    _check(decl, body, feeds, ["A"], zs=["W"], opset=opset)


def test_batched_and_vector_matmul():
    decl = ("g (double[2,3,4] A, double[4,5] B, double[4] v, double[4,3] M) => "
            "(double[2,3] y, double[2,3,4] d_A, double[4,5] d_B, double[4] d_v, double[4,3] d_M)")
    body = """
      ab = MatMul(A, B)
      av = MatMul(A, v)
      vm = MatMul(v, M)
      two = Constant<value = int64[1] {2}>()
      s = ReduceSum<keepdims=0>(ab, two)
      sa = Add(s, av)
      y = Add(sa, vm)
    """
    feeds = {"A": _rand(2, 3, 4), "B": _rand(4, 5), "v": _rand(4), "M": _rand(4, 3)}
    _check(decl, body, feeds, ["A", "B", "v", "M"])


def test_where_clip_sum_mean_leaky_relu_cast():
    decl = ("g (double[3,4] A, double[4] B, bool[3,4] C) => "
            "(double[3,4] y, double[3,4] d_A, double[4] d_B)")
    body = """
      w = Where(C, A, B)
      lo = Constant<value = double {-0.5}>()
      hi = Constant<value = double {0.8}>()
      c = Clip(A, lo, hi)
      s = Sum(w, c, B)
      m = Mean(s, A)
      d = Cast<to = 11>(m)
      y = LeakyRelu<alpha = 0.2>(d)
    """
    feeds = {"A": _rand(3, 4), "B": _rand(4), "C": _rand(3, 4, seed=3) > 0}
    _check(decl, body, feeds, ["A", "B"], zs=["C"])


def test_initializers_are_constants_and_shape_paths_are_not_differentiated():
    # W is an initializer (a constant); the Reshape target depends on A through Shape.
    text = """
    g (double[2,6] A) => (double[2,6] y, double[2,6] d_A)
      <double[6] W = {1, 2, 3, 4, 5, 6}> {
      sh = Shape(A)
      aw = Mul(A, W)
      r = Reshape(aw, sh)
      y = Mul(r, A)
      d_A = ai.onnx.preview.training.Gradient<xs: strings = ["A"], y: string = "y">(A)
    }
    """
    a = _rand(2, 6)
    _, g = _session(text).run(None, {"A": a})
    w = np.arange(1, 7, dtype=np.float64)
    np.testing.assert_allclose(g, 2 * a * w)


# -- semantics --------------------------------------------------------------------------------


def test_float32_and_repeated_runs():
    text = """
    g (float[3] a, float[3] b) => (float[3] y, float[3] d_a, float[3] d_b) {
      ab = Add(a, b)
      y = Mul(ab, a)
      d_a, d_b = ai.onnx.preview.training.Gradient<xs: strings = ["a", "b"], y: string = "y">
        (a, b)
    }
    """
    sess = _session(text)
    for seed in range(3):
        a, b = _rand(3, seed=seed).astype(np.float32), _rand(3, seed=seed + 9).astype(np.float32)
        y, da, db = sess.run(None, {"a": a, "b": b})
        assert da.dtype == db.dtype == np.float32
        np.testing.assert_allclose(da, 2 * a + b, rtol=1e-6)
        np.testing.assert_allclose(db, a, rtol=1e-6)


def test_cast_between_float_types():
    text = """
    g (double[3] a) => (double[3] y, double[3] d) {
      f = Cast<to = 1>(a)
      ff = Mul(f, f)
      y = Cast<to = 11>(ff)
      d = ai.onnx.preview.training.Gradient<xs: strings = ["a"], y: string = "y">(a)
    }
    """
    a = _rand(3)
    _, d = _session(text).run(None, {"a": a})
    assert d.dtype == np.float64
    np.testing.assert_allclose(d, 2 * a.astype(np.float32), rtol=1e-7)


def test_intermediate_x_evaluated_at_the_given_value():
    # xs names an intermediate tensor h; the Gradient's input h1 sets the value it is taken at.
    text = """
    g (double[3] a, double[3] h1, double[3] c) => (double y, double[3] dh) {
      h = Exp(a)
      t = Tanh(h)
      tc = Mul(t, c)
      y = ReduceSum<keepdims=0>(tc)
      dh = ai.onnx.preview.training.Gradient<xs: strings = ["h"], zs: strings = ["c"],
                                             y: string = "y">(h1, c)
    }
    """
    a, h1, c = _rand(3), _rand(3, seed=4), _rand(3, seed=5)
    _, dh = _session(text).run(None, {"a": a, "h1": h1, "c": c})
    np.testing.assert_allclose(dh, (1 - np.tanh(h1) ** 2) * c)


def test_y_not_a_graph_output_and_unrelated_x():
    # y is read only by the Gradient (by name): the session must not drop the nodes making it.
    text = """
    g (double[2] a, double[2] b) => (double[2] d_a, double[2] d_b) {
      y = Mul(a, a)
      d_a, d_b = ai.onnx.preview.training.Gradient<xs: strings = ["a", "b"], y: string = "y">
        (a, b)
    }
    """
    a = _rand(2)
    da, db = _session(text).run(None, {"a": a, "b": _rand(2, seed=2)})
    np.testing.assert_allclose(da, 2 * a)
    np.testing.assert_array_equal(db, np.zeros(2))


def test_y_in_xs_gives_ones():
    text = """
    g (double[2] a) => (double[2] y, double[2] d) {
      y = Neg(a)
      d = ai.onnx.preview.training.Gradient<xs: strings = ["y"], y: string = "y">(y)
    }
    """
    _, d = _session(text).run(None, {"a": _rand(2)})
    np.testing.assert_array_equal(d, np.ones(2))


def test_unsupported_operator_is_refused_at_session_creation():
    text = """
    g (double[2] a) => (double[2] y, double[2] d) {
      y = Sin(a)
      d = ai.onnx.preview.training.Gradient<xs: strings = ["a"], y: string = "y">(a)
    }
    """
    with pytest.raises(onnxrun.InvalidGraph, match="no derivative rule for Sin"):
        _session(text)


def test_value_neither_in_xs_zs_nor_constant_is_refused():
    text = """
    g (double[2] a, double[2] b) => (double[2] y, double[2] d) {
      y = Mul(a, b)
      d = ai.onnx.preview.training.Gradient<xs: strings = ["a"], y: string = "y">(a)
    }
    """
    with pytest.raises(onnxrun.InvalidGraph, match="'b' is needed .*list it in zs"):
        _session(text)


def test_packed_float32_weight_stays_for_the_gradient():
    """A float32 MatMul weight the compiled GEMM packs (the session otherwise drops the
    initializer) is still the constant the Gradient node's own forward pass reads."""
    text = """
    g (float[4,3] X) => (float[4,2] y, float[4,3] d_X)
      <float[3,2] W = {1, 2, 3, 4, 5, 6}> {
      y = MatMul(X, W)
      d_X = ai.onnx.preview.training.Gradient<xs: strings = ["X"], y: string = "y">(X)
    }
    """
    x = _rand(4, 3).astype(np.float32)
    y, g = _session(text).run(None, {"X": x})
    w = np.arange(1, 7, dtype=np.float32).reshape(3, 2)
    np.testing.assert_allclose(y, x @ w, rtol=1e-6)
    np.testing.assert_allclose(g, np.ones((4, 2), np.float32) @ w.T, rtol=1e-6)
