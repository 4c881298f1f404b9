"""The compiled float32 GEMM (compiled/float_gemm.py) against numpy, each tile shape chosen
explicitly: the AVX2 6x16 tile, and the AVX-512 6x64 tile's IR compiled for AVX2+FMA (generic
vector IR: LLVM splits its 16-lane vectors in halves), so both are checked on an AVX2 host;
then the operators that use it (MatMul, Gemm, FusedGemm, FusedMatMul) against onnxruntime,
compiled path and numpy path."""

from __future__ import annotations

import contextlib

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP
from onnx import helper

import onnxrun
from onnxrun.providers.cpu import compiled
from onnxrun.providers.cpu.compiled import float_gemm, jit

pytest.importorskip("llvmlite")

_REASON = jit.why_unavailable()
pytestmark = pytest.mark.skipif(_REASON is not None, reason=f"compiled kernels: {_REASON}")


@pytest.fixture(params=["avx2", "avx512"])
def variant(request):
    """The tile shape of each target, compiled for the avx2 target (which every host that
    has compiled kernels runs): the IR is generic, so both shapes' code is checked here."""
    with compiled.forced_target("avx2"):
        yield float_gemm.AVX2_TILE if request.param == "avx2" else float_gemm.AVX512_TILE


def _packed(B, tile):
    try:
        return float_gemm.PackedMatrix(B, tile)
    except jit.Unavailable as exc:  # e.g. a system refusing executable mappings
        pytest.skip(str(exc))


def _reference(A, B, bias=None, residual=None, bounds=None):
    Y = A.astype(np.float64) @ B.astype(np.float64)
    if bias is not None:
        Y += bias
    if residual is not None:
        Y += residual
    if bounds is not None:
        Y = np.clip(Y, *bounds)
    return Y


def _close(Y, ref, K):
    # float32 sums of K products of unit normals, in another order than float64's
    np.testing.assert_allclose(Y, ref, rtol=1e-5, atol=2e-6 * max(1, K) ** 0.5 * 4)


_SHAPES = [(1, 1, 1), (1, 7, 5), (5, 3, 17), (6, 16, 16), (7, 33, 31), (13, 257, 33),
           (14, 64, 32), (15, 300, 65), (29, 513, 47), (64, 128, 96), (3, 1000, 130)]


@pytest.mark.parametrize("M,K,N", _SHAPES)
def test_product_equals_numpy(variant, M, K, N):
    rng = np.random.default_rng(M * 1000 + K + N)
    A = rng.standard_normal((M, K), np.float32)
    B = rng.standard_normal((K, N), np.float32)
    _close(_packed(B, variant).run(A), _reference(A, B), K)


@pytest.mark.parametrize("last", [1, 2, 4, 7, 9, 17, 33, 47, 63])
def test_narrow_last_panel_gives_the_full_tiles_numbers(variant, last):
    """A last panel of ``last`` < NR columns runs the tile of as many vectors of B per k as
    they need (the panel's rows NR floats apart): bit for bit the columns a full tile
    computes for it."""
    NR = variant.NR
    if last >= NR:
        pytest.skip(f"the {NR}-column panels of this tile")
    N = 2 * NR + last
    rng = np.random.default_rng(last)
    A = rng.standard_normal((2 * variant.MR + 1, 70), np.float32)
    B = rng.standard_normal((70, N), np.float32)
    bias = rng.standard_normal(N).astype(np.float32)
    pad = NR - last  # columns that fill the last panel: the full tile
    wide = np.concatenate([B, rng.standard_normal((70, pad), np.float32)], axis=1)
    got = _packed(B, variant).run(A, bias, bounds=(-2.0, 2.0))
    want = _packed(wide, variant).run(A, np.concatenate([bias, np.zeros(pad, np.float32)]),
                                      bounds=(-2.0, 2.0))[:, :N]
    np.testing.assert_array_equal(got, want)
    _close(got, _reference(A, B, bias, None, (-2.0, 2.0)), 70)


@pytest.mark.parametrize("epilogue", ["bias", "residual", "relu", "clip", "all"])
@pytest.mark.parametrize("M,K,N", [(7, 33, 31), (20, 300, 40), (1, 5, 3)])
def test_epilogues(variant, epilogue, M, K, N):
    rng = np.random.default_rng(K + N)
    A = rng.standard_normal((M, K), np.float32)
    B = rng.standard_normal((K, N), np.float32)
    kw = {}
    if epilogue in ("bias", "all"):
        kw["bias"] = rng.standard_normal(N).astype(np.float32)
    if epilogue in ("residual", "all"):
        kw["residual"] = rng.standard_normal((M, N)).astype(np.float32)
    if epilogue == "relu":
        kw["bounds"] = (0.0, np.inf)
    if epilogue in ("clip", "all"):
        kw["bounds"] = (-0.5, 6.0)
    _close(_packed(B, variant).run(A, **kw), _reference(A, B, **kw), K)


def test_clip_keeps_nan_and_rows_may_be_strided(variant):
    rng = np.random.default_rng(3)
    big = rng.standard_normal((9, 50), np.float32)
    A = big[:, 3:43]  # rows 50 floats apart
    A[2, 5] = np.nan
    B = rng.standard_normal((40, 20), np.float32)
    Y = _packed(B, variant).run(A, bounds=(0.0, 6.0))
    assert np.isnan(Y[2]).all() and not np.isnan(np.delete(Y, 2, axis=0)).any()
    _close(np.delete(Y, 2, 0), _reference(np.delete(A, 2, 0), B, bounds=(0.0, 6.0)), 40)


@pytest.mark.parametrize("M,K,N", [(0, 5, 7), (4, 0, 7), (4, 5, 0), (0, 0, 0)])
def test_zero_sizes(variant, M, K, N):
    rng = np.random.default_rng(0)
    B = rng.standard_normal((K, N), np.float32)
    bias = np.arange(N, dtype=np.float32)
    residual = np.ones((M, N), np.float32)
    Y = _packed(B, variant).run(np.ones((M, K), np.float32), bias, residual, (-1.0, 3.0))
    assert Y.shape == (M, N)
    np.testing.assert_array_equal(Y, np.clip(np.zeros((M, N)) + bias + residual, -1, 3))


@pytest.mark.parametrize("M,N", [(5, 300), (200, 20), (97, 129)])
def test_threads_give_the_same_bits(variant, M, N):
    """The sum over K runs in one order whatever the split (panels or row strips)."""
    rng = np.random.default_rng(M + N)
    A = rng.standard_normal((M, 600), np.float32)  # K over several blocks
    B = rng.standard_normal((600, N), np.float32)
    bias = rng.standard_normal(N).astype(np.float32)
    P = _packed(B, variant)
    one = P.run(A, bias)
    for threads in (2, 3, 4):
        np.testing.assert_array_equal(P.run(A, bias, threads=threads), one)


def test_writes_into_out_and_rejects_bad_inputs(variant):
    rng = np.random.default_rng(1)
    A = rng.standard_normal((6, 8), np.float32)
    B = rng.standard_normal((8, 4), np.float32)
    P = _packed(B, variant)
    out = np.empty((6, 4), np.float32)
    assert P.run(A, out=out) is out
    _close(out, _reference(A, B), 8)
    with pytest.raises(ValueError, match=r"\[M, 8\]"):
        P.run(np.ones((6, 7), np.float32))
    with pytest.raises(TypeError, match="float32"):
        P.run(np.ones((6, 8), np.float64))
    with pytest.raises(ValueError, match="bias"):
        P.run(A, bias=np.ones(3, np.float32))
    with pytest.raises(ValueError, match="residual"):
        P.run(A, residual=np.ones((6, 5), np.float32))
    with pytest.raises(ValueError, match="out"):
        P.run(A, out=np.empty((4, 6), np.float32))
    with pytest.raises(ValueError, match="out"):  # columns not contiguous
        P.run(A, out=np.empty((6, 8), np.float32)[:, ::2])
    with pytest.raises(ValueError, match="2-D"):
        float_gemm.PackedMatrix(np.ones(3, np.float32), variant)


@pytest.mark.parametrize("threads", [1, 3])
def test_groups_into_column_ranges_of_a_wider_output(variant, threads):
    """A grouped 1x1 convolution's product (Conv._grouped_1x1): A a range of the columns of
    channels-last rows, the result written into its range of a wider output's columns (the
    row stride is the whole width), bias and clip fused; the other columns stay untouched."""
    rng = np.random.default_rng(6)
    g, P_, Cg, Mg = 4, 37, 9, 21  # a partial panel in every group
    X = rng.standard_normal((P_, g * Cg), np.float32)
    Ws = rng.standard_normal((g, Cg, Mg), np.float32)
    bias = rng.standard_normal(g * Mg).astype(np.float32)
    Y = np.full((P_, g * Mg + 3), 7.0, np.float32)
    for i in range(g):
        P = _packed(Ws[i], variant)
        got = P.run(X[:, i * Cg:(i + 1) * Cg], bias[i * Mg:(i + 1) * Mg], bounds=(0.0, 2.0),
                    out=Y[:, i * Mg:(i + 1) * Mg], threads=threads)
        assert got.base is Y or got.base is Y.base
        _close(Y[:, i * Mg:(i + 1) * Mg], _reference(X[:, i * Cg:(i + 1) * Cg], Ws[i],
                                                      bias[i * Mg:(i + 1) * Mg], None,
                                                      (0.0, 2.0)), Cg)
    assert (Y[:, g * Mg:] == 7.0).all()


@pytest.mark.parametrize("shape", [(4, 37, 9, 21), (3, 1, 5, 16), (2, 50, 300, 3),
                                   (8, 13, 16, 40)])
def test_grouped_products_in_one_call(variant, shape):
    """PackedGroups: g products in one call of the kernel, group i reading A's columns
    [i*K, (i+1)*K) and writing the output's [i*N, (i+1)*N), bias and clip fused; the same
    numbers at any thread count, and the same as one PackedMatrix per group."""
    g, M, K, N = shape
    rng = np.random.default_rng(9)
    A = rng.standard_normal((M, g * K), np.float32)
    Bs = rng.standard_normal((g, K, N), np.float32)
    bias = rng.standard_normal(g * N).astype(np.float32)
    try:
        P = float_gemm.PackedGroups(Bs, variant)
    except jit.Unavailable as exc:
        pytest.skip(str(exc))
    one = P.run(A, bias, bounds=(-1.0, 1.5))
    for i in range(g):
        _close(one[:, i * N:(i + 1) * N], _reference(A[:, i * K:(i + 1) * K], Bs[i],
                                                      bias[i * N:(i + 1) * N], None,
                                                      (-1.0, 1.5)), K)
        np.testing.assert_array_equal(one[:, i * N:(i + 1) * N], _packed(Bs[i], variant).run(
            A[:, i * K:(i + 1) * K], bias[i * N:(i + 1) * N], bounds=(-1.0, 1.5)))
    for threads in (2, 3):
        np.testing.assert_array_equal(P.run(A, bias, bounds=(-1.0, 1.5), threads=threads), one)
    np.testing.assert_array_equal(P.run(np.asfortranarray(A)), P.run(A))  # copied to rows
    into = np.empty_like(one)
    assert P.run(A, bias, bounds=(-1.0, 1.5), out=into) is into
    np.testing.assert_array_equal(into, one)
    wide = np.full((M, g * N + 5), np.nan, np.float32)  # a range of a Concat's channels
    P.run(A, bias, bounds=(-1.0, 1.5), out=wide[:, 2:2 + g * N])
    np.testing.assert_array_equal(wide[:, 2:2 + g * N], one)
    assert np.isnan(wide[:, :2]).all() and np.isnan(wide[:, 2 + g * N:]).all()
    with pytest.raises(ValueError, match="out must be"):
        P.run(A, out=np.empty((M, g * N + 1), np.float32))


@pytest.mark.parametrize("target", ["host", "avx2"])
@pytest.mark.parametrize("g,M,K,N", [(4, 37, 34, 34), (3, 13, 28, 28), (1, 7, 9, 17),
                                     (2, 20, 70, 68)])
def test_partial_panels_write_only_their_columns(target, g, M, K, N):
    """A partial panel's stores (masked vector stores on AVX-512, scalar ones on AVX2) write
    its columns only: the next group's columns and the bytes past the output's end (a guard
    after the buffer) are left as they were; bias, residual and clip applied."""
    rng = np.random.default_rng(N)
    A = rng.standard_normal((M, g * K), np.float32)
    Bs = rng.standard_normal((g, K, N), np.float32)
    bias = rng.standard_normal(g * N).astype(np.float32)
    residual = rng.standard_normal((M, g * N)).astype(np.float32)
    try:
        with contextlib.nullcontext() if target == "host" else compiled.forced_target(target):
            P = float_gemm.PackedGroups(Bs)
    except jit.Unavailable as exc:
        pytest.skip(str(exc))
    buffer = np.full(M * g * N + 64, 7.0, np.float32)
    out = buffer[:M * g * N].reshape(M, g * N)
    P.run(A, bias, bounds=(-1.0, 1.5), out=out, residual=residual)
    assert (buffer[M * g * N:] == 7.0).all()
    for i in range(g):
        cols = slice(i * N, (i + 1) * N)
        _close(out[:, cols], _reference(A[:, i * K:(i + 1) * K], Bs[i], bias[cols],
                                        residual[:, cols], (-1.0, 1.5)), K)


@pytest.mark.parametrize("logistic", [(1.0, True), (1.702, True), (1.0, False)])
@pytest.mark.parametrize("M,K,N", [(1, 5, 3), (7, 33, 17), (37, 64, 100), (13, 200, 130)])
def test_logistic_epilogue_equals_the_standalone_kernel_bit_for_bit(variant, logistic, M, K,
                                                                     N):
    """The epilogue's logistic (a convolution's fused Sigmoid, or SiLU / QuickGelu: y *
    logistic(alpha y)) after bias, residual and clip gives compiled/logistic.py's bits on the
    product without it, NaN and infinities included; every path into the kernel (rows,
    shifted rows, groups, threads) takes it."""
    from onnxrun.providers.cpu.compiled import logistic as mlas

    rng = np.random.default_rng(M * K + N)
    A = (rng.standard_normal((M, K)) * 3).astype(np.float32)
    A[0, :3] = [np.inf, np.nan, -np.inf] if K > 3 else A[0, :3]
    B = rng.standard_normal((K, N)).astype(np.float32)
    bias = rng.standard_normal(N).astype(np.float32)
    residual = rng.standard_normal((M, N)).astype(np.float32)
    alpha, times_x = logistic

    def after(Y):
        return mlas.quick_gelu(Y, alpha) if times_x else mlas.sigmoid(Y)

    P = _packed(B, variant)
    for bounds in (None, (-1.0, 2.0)):
        want = after(P.run(A, bias, residual, bounds))
        got = P.run(A, bias, residual, bounds, logistic=logistic)
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
        for threads in (2, 3):
            np.testing.assert_array_equal(
                P.run(A, bias, residual, bounds, logistic=logistic, threads=threads), got)
    # shifted rows (the implicit-GEMM convolution's): A's rows read in place, K in blocks
    base = np.ascontiguousarray(A).reshape(-1)
    shifted = P.run_shifted(base, M, K, K, 0, bias, logistic=logistic)
    np.testing.assert_array_equal(shifted, after(P.run(A, bias)))
    # groups: each group's columns as its own product's
    Bs = np.stack([B, B[::-1].copy()])
    G = float_gemm.PackedGroups(Bs, variant)
    A2 = np.concatenate([A, A[:, ::-1]], axis=1)
    bias2 = np.concatenate([bias, -bias])
    got = G.run(A2, bias2, logistic=logistic)
    np.testing.assert_array_equal(got, after(G.run(A2, bias2)))
    # an empty product's epilogue: the logistic of the bias
    Z = float_gemm.PackedMatrix(np.zeros((0, N), np.float32), variant)
    np.testing.assert_array_equal(Z.run(np.zeros((M, 0), np.float32), bias, logistic=logistic),
                                  after(np.broadcast_to(bias, (M, N)).copy()))


@pytest.mark.parametrize("kind", ["gelu", "fast_gelu"])
@pytest.mark.parametrize("M,K,N", [(1, 5, 3), (7, 33, 17), (37, 64, 100), (13, 700, 130),
                                   (256, 384, 1536)])
def test_gelu_epilogue_equals_the_standalone_kernel_bit_for_bit(variant, kind, M, K, N):
    """The epilogue's GELU (ai.onnxrun MatMulBiasGelu: a transformer's up projection; Gelu's
    or FastGelu's polynomial) after the bias gives compiled/gelu.py's BiasGelu / FastGelu
    bits on the product without it, NaN, infinities and saturated values included, whole
    vectors and a row's last columns, at any thread count and K split into blocks; an empty
    product's epilogue is the GELU of the bias; it does not combine with a logistic."""
    from onnxrun.providers.cpu.compiled import gelu
    from onnxrun.providers.cpu.gelu_polynomial import EPILOGUES

    coeffs = EPILOGUES[kind]
    rng = np.random.default_rng(M * K + N)
    A = (rng.standard_normal((M, K)) * 2).astype(np.float32)
    if K > 3:
        A[0, :3] = [np.inf, np.nan, -np.inf]
    B = (rng.standard_normal((K, N)) / max(1, K) ** 0.5 * 8).astype(np.float32)
    bias = rng.standard_normal(N).astype(np.float32)
    P = _packed(B, variant)
    want = gelu.bias_gelu(coeffs, P.run(A), bias)
    got = P.run(A, bias, gelu_after=kind)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    for threads in (2, 3):
        np.testing.assert_array_equal(P.run(A, bias, gelu_after=kind, threads=threads), got)
    np.testing.assert_array_equal(P.run(A, gelu_after=kind).view(np.uint32),
                                  gelu.bias_gelu(coeffs, P.run(A)).view(np.uint32))
    prepared = P.prepared(M, bias, gelu_after=kind)
    if prepared is not None:
        np.testing.assert_array_equal(prepared(np.ascontiguousarray(A)), got)
    Z = float_gemm.PackedMatrix(np.zeros((0, N), np.float32), variant)
    np.testing.assert_array_equal(Z.run(np.zeros((M, 0), np.float32), bias, gelu_after=kind),
                                  gelu.bias_gelu(coeffs, np.zeros((M, N), np.float32), bias))
    with pytest.raises(ValueError, match="at once"):
        P.run(A, bias, logistic=(1.0, True), gelu_after=kind)
    with pytest.raises(ValueError, match="unknown gelu"):
        P.run(A, bias, gelu_after="swish")


def test_transposed_weights_pack_in_the_kernel_to_numpys_panels(variant):
    """A weight whose columns are rows in memory (a Gemm's transB, a convolution's (M, C,
    kh, kw) seen as (kh * kw * C, M), a stack of such) is packed by the kernel's
    @pack_panels: numpy's panels exactly, the partial last panel included, at K and N that
    do not fill its blocks of 512 rows and 8 columns."""
    rng = np.random.default_rng(21)
    module = float_gemm._module(variant)
    NR = variant.NR
    views = [rng.standard_normal((2 * NR + 5, 1030)).astype(np.float32).T,
             rng.standard_normal((NR, 700)).astype(np.float32).T,
             rng.standard_normal((NR + 3, 7, 3, 3)).astype(np.float32).transpose(2, 3, 1, 0),
             rng.standard_normal((3 * NR, 40)).astype(np.float32)[::2, 3:].T]
    for B in views:
        want = float_gemm._panels(B[None], NR)
        np.testing.assert_array_equal(float_gemm._panels(B[None], NR, module), want)
        np.testing.assert_array_equal(_packed(B, variant).matrix(), B.reshape(-1, B.shape[-1]))
    stack = rng.standard_normal((3, NR + 9, 33)).astype(np.float32).transpose(0, 2, 1)
    np.testing.assert_array_equal(float_gemm._panels(stack, NR, module),
                                  float_gemm._panels(stack, NR))


@pytest.mark.parametrize("shape", [(4, 37, 9, 21), (2, 50, 300, 3)])
def test_grouped_products_add_a_residual(variant, shape):
    """PackedGroups' epilogue adds a (M, g*N) residual after the bias, before the clip (a
    FusedConv's Z): the bits of the product, then += residual, then the clip; rows of the
    residual any stride apart."""
    g, M, K, N = shape
    rng = np.random.default_rng(10)
    A = rng.standard_normal((M, g * K), np.float32)
    Bs = rng.standard_normal((g, K, N), np.float32)
    bias = rng.standard_normal(g * N).astype(np.float32)
    wide = rng.standard_normal((M, g * N + 5), np.float32)
    R = wide[:, 2:2 + g * N]  # rows g*N + 5 floats apart
    try:
        P = float_gemm.PackedGroups(Bs, variant)
    except jit.Unavailable as exc:
        pytest.skip(str(exc))
    want = P.run(A, bias)
    want += R
    np.clip(want, -1.0, 1.5, out=want)
    np.testing.assert_array_equal(P.run(A, bias, bounds=(-1.0, 1.5), residual=R), want)
    np.testing.assert_array_equal(P.run(A, bias, residual=R, threads=2),
                                  P.run(A, bias) + R)
    with pytest.raises(ValueError, match="residual must be"):
        P.run(A, residual=R[:, 1:])
    with pytest.raises(ValueError, match="bias"):
        P.run(A, np.ones(3, np.float32))
    with pytest.raises(ValueError, match=r"\[M, "):
        P.run(A[:, 1:])


# -- the operators ------------------------------------------------------------------------------


def _model(node, inputs, outputs, initializers, opset=17):
    graph = helper.make_graph([node], "g", inputs, outputs, initializers)
    ops = [helper.make_opsetid("", opset), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=ops).SerializeToString()


def _run_both(model, feeds, compiled_on: bool):
    so = onnxrun.SessionOptions()
    so.intra_op_num_threads = 2
    if compiled_on:
        sess = onnxrun.InferenceSession(model, so)
    else:
        with jit.disabled():
            sess = onnxrun.InferenceSession(model, so)
    ours = sess.run(None, feeds)[0]
    theirs = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    return ours, theirs


@pytest.mark.parametrize("compiled_on", [True, False])
@pytest.mark.parametrize("a_shape", [(2, 17, 40), (33, 40), (9, 40), (3, 40), (1, 40), (40,)])
def test_matmul(a_shape, compiled_on):
    rng = np.random.default_rng(len(a_shape))
    W = rng.standard_normal((40, 23)).astype(np.float32)
    node = helper.make_node("MatMul", ["A", "W"], ["Y"])
    model = _model(node, [helper.make_tensor_value_info("A", TP.FLOAT, list(a_shape))],
                   [helper.make_tensor_value_info("Y", TP.FLOAT, None)],
                   [onnx.numpy_helper.from_array(W, "W")])
    A = rng.standard_normal(a_shape).astype(np.float32)
    ours, theirs = _run_both(model, {"A": A}, compiled_on)
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("compiled_on", [True, False])
@pytest.mark.parametrize("transA,transB,alpha,beta,c_shape", [
    (0, 0, 1.0, 1.0, (23,)), (1, 0, 0.5, 2.0, (1, 23)), (0, 1, 1.0, 0.0, (23,)),
    (1, 1, 2.0, -1.0, ()), (0, 0, 1.0, 1.0, None), (0, 1, 1.5, 1.0, (30, 23))])
def test_gemm(transA, transB, alpha, beta, c_shape, compiled_on):
    rng = np.random.default_rng(7)
    A = rng.standard_normal((40, 30) if transA else (30, 40)).astype(np.float32)
    B = rng.standard_normal((23, 40) if transB else (40, 23)).astype(np.float32)
    inits = [onnx.numpy_helper.from_array(B, "B")]
    names = ["A", "B"]
    if c_shape is not None:
        inits.append(onnx.numpy_helper.from_array(
            rng.standard_normal(c_shape).astype(np.float32), "C"))
        names.append("C")
    node = helper.make_node("Gemm", names, ["Y"], transA=transA, transB=transB, alpha=alpha,
                            beta=beta)
    model = _model(node, [helper.make_tensor_value_info("A", TP.FLOAT, list(A.shape))],
                   [helper.make_tensor_value_info("Y", TP.FLOAT, None)], inits)
    ours, theirs = _run_both(model, {"A": A}, compiled_on)
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize("compiled_on", [True, False])
@pytest.mark.parametrize("activation,params", [("Relu", []), ("HardSigmoid", [0.3, 0.4]),
                                                 ("Sigmoid", []), ("LeakyRelu", [0.1])])
def test_fused_gemm(activation, params, compiled_on):
    rng = np.random.default_rng(11)
    A = rng.standard_normal((20, 40)).astype(np.float32)
    B = rng.standard_normal((40, 23)).astype(np.float32)
    C = rng.standard_normal(23).astype(np.float32)
    attrs = {}
    if params:
        attrs["activation_alpha"] = params[0]
    if len(params) > 1:
        attrs["activation_beta"] = params[1]
    node = helper.make_node("FusedGemm", ["A", "B", "C"], ["Y"], domain="com.microsoft",
                            activation=activation, **attrs)
    model = _model(node, [helper.make_tensor_value_info("A", TP.FLOAT, [20, 40])],
                   [helper.make_tensor_value_info("Y", TP.FLOAT, None)],
                   [onnx.numpy_helper.from_array(B, "B"), onnx.numpy_helper.from_array(C, "C")])
    ours, theirs = _run_both(model, {"A": A}, compiled_on)
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize("compiled_on", [True, False])
@pytest.mark.parametrize("transA,transB,alpha", [(0, 0, 1.0), (1, 0, 0.25), (0, 1, 2.0),
                                                 (1, 1, 1.0)])
def test_fused_matmul(transA, transB, alpha, compiled_on):
    rng = np.random.default_rng(13)
    A = rng.standard_normal((2, 40, 24) if transA else (2, 24, 40)).astype(np.float32)
    B = rng.standard_normal((23, 40) if transB else (40, 23)).astype(np.float32)
    node = helper.make_node("FusedMatMul", ["A", "B"], ["Y"], domain="com.microsoft",
                            transA=transA, transB=transB, alpha=alpha)
    model = _model(node, [helper.make_tensor_value_info("A", TP.FLOAT, list(A.shape))],
                   [helper.make_tensor_value_info("Y", TP.FLOAT, None)],
                   [onnx.numpy_helper.from_array(B, "B")])
    ours, theirs = _run_both(model, {"A": A}, compiled_on)
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=2e-5)


def test_the_operators_take_the_compiled_path():
    """A constant float32 weight gets panels (so the tests above run the compiled kernel);
    with compiled kernels switched off it does not."""
    from onnxrun.providers.cpu.ops.linalg import packed_weights

    B = np.ones((8, 5), np.float32)
    assert packed_weights(B) is not None
    assert packed_weights(B.astype(np.float64)) is None
    with jit.disabled():
        assert packed_weights(B) is None


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("C,M,size", [(5, 4, (7, 6)), (64, 70, (16, 15)), (33, 17, (9, 11))])
def test_winograd_products_compiled_equal_blas(C, M, size, threads):
    """Winograd F(2x2, 3x3)'s 16 products through the compiled GEMM (split over threads) give
    the numpy path's result."""
    from onnxrun.providers.cpu.ops import conv as conv_mod

    rng = np.random.default_rng(C + M)
    X = rng.standard_normal((2, C) + size).astype(np.float32)
    W = (rng.standard_normal((M, C, 3, 3)) * 0.1).astype(np.float32)
    b = rng.standard_normal((M, 1, 1)).astype(np.float32)
    U = conv_mod._winograd_weights(W, np.dtype(np.float32))
    packed = [float_gemm.pack(u) for u in U]
    assert all(p is not None for p in packed)
    want = conv_mod._winograd_3x3(X, U, b, (1, 1), size).copy()
    got = conv_mod._winograd_3x3(X, U, b, (1, 1), size, threads, packed)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("N", [32, 37])
def test_pack_stack_equals_packing_each_matrix(N):
    """Winograd's 16 operands packed by one copy into one buffer: the panels of each equal
    its own pack(), and products through them equal A @ B."""
    rng = np.random.default_rng(N)
    Bs = rng.standard_normal((16, 21, N)).astype(np.float32)
    stacked = float_gemm.pack_stack(Bs)
    assert stacked is not None and len(stacked) == 16
    A = rng.standard_normal((9, 21)).astype(np.float32)
    for B, p in zip(Bs, stacked, strict=True):
        np.testing.assert_array_equal(p.panels, float_gemm.pack(B).panels)
        np.testing.assert_allclose(p.run(A), A @ B, rtol=1e-5, atol=1e-5)
    assert float_gemm.pack_stack(Bs.astype(np.float64)) is None


@pytest.mark.parametrize("compiled_on", [True, False])
def test_blas_held_to_one_thread_during_runs(compiled_on):
    """Two pools never spin against each other: whether the products run on compiled GEMMs
    or on BLAS (both split over onnxrun's threads), a run holds BLAS to one thread."""
    W = np.ones((40, 23), np.float32)
    node = helper.make_node("MatMul", ["A", "W"], ["Y"])
    model = _model(node, [helper.make_tensor_value_info("A", TP.FLOAT, [16, 40])],
                   [helper.make_tensor_value_info("Y", TP.FLOAT, None)],
                   [onnx.numpy_helper.from_array(W, "W")])
    so = onnxrun.SessionOptions()
    so.intra_op_num_threads = 2
    if compiled_on:
        sess = onnxrun.InferenceSession(model, so)
    else:
        with jit.disabled():
            sess = onnxrun.InferenceSession(model, so)
    from threadpoolctl import threadpool_info

    with sess._blas_threads:  # what a run enters
        seen = {lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"}
    assert seen <= {1}
    np.testing.assert_array_equal(sess.run(None, {"A": np.ones((16, 40), np.float32)})[0],
                                  np.full((16, 23), 40, np.float32))


def test_channels_last_1x1_convolutions_on_the_compiled_gemm():
    """MobileNet-style blocks: the 1x1 convolutions that read a channels-last input run on
    the compiled GEMM (bias and Relu6 fused) and agree with onnxruntime and the numpy path."""
    from pathlib import Path

    folder = Path(__file__).parent / "models"
    data = np.load(folder / "mobilenet_tiny.inputs.npz")
    feeds = {k.split("/")[-1]: data[k] for k in data.files if k.startswith("0/")}
    path = str(folder / "mobilenet_tiny.onnx")
    sess = onnxrun.InferenceSession(path)
    assert any(getattr(step.kernel, "gemm_t_packed", None) is not None
               for step in sess._program.steps)
    with jit.disabled():
        numpy_path = onnxrun.InferenceSession(path).run(None, feeds)[0]
    ours = sess.run(None, feeds)[0]
    theirs = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ours, numpy_path, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("compiled_on", [True, False])
def test_two_threads_choose_winograd_on_the_compiled_gemm(compiled_on):
    """At 2 intra-op threads a 128-channel 3x3 layer on 16 x 16 is left to im2col + BLAS
    (Winograd's 16 small GEMMs lost to BLAS's thread hand-offs); on the compiled GEMM, which
    splits the 16 products itself, the one-thread choice holds: Winograd (with 128 channels
    and more: below, the channels-last implicit GEMM on the compiled GEMM)."""
    rng = np.random.default_rng(5)
    W = (rng.standard_normal((128, 128, 3, 3)) * 0.05).astype(np.float32)
    node = helper.make_node("Conv", ["X", "W"], ["Y"], pads=[1, 1, 1, 1])
    model = _model(node, [helper.make_tensor_value_info("X", TP.FLOAT, [1, 128, 16, 16])],
                   [helper.make_tensor_value_info("Y", TP.FLOAT, None)],
                   [onnx.numpy_helper.from_array(W, "W")])
    so = onnxrun.SessionOptions()
    so.intra_op_num_threads = 2
    if compiled_on:
        sess = onnxrun.InferenceSession(model, so)
    else:
        with jit.disabled():
            sess = onnxrun.InferenceSession(model, so)
    (conv,) = [step.kernel for step in sess._program.steps]
    assert (conv.winograd_packed is not None) == compiled_on
    # compiled: the 16 transformed filters held once, in the panels; else im2col's operand
    assert "winograd" not in conv.prepared
    assert ("gemm" in conv.prepared) != compiled_on
    X = rng.standard_normal((1, 128, 16, 16)).astype(np.float32)
    theirs = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(
        None, {"X": X})[0]
    np.testing.assert_allclose(sess.run(None, {"X": X})[0], theirs, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("rows,lda,block,blocks,jump", [
    (1, 3, 3, 1, 0), (7, 5, 10, 3, 31), (40, 16, 48, 3, 100), (13, 33, 99, 2, 1),
    (9, 20, 100, 6, 7), (5, 40, 300, 2, 3), (20, 16, 48, 9, 5),
    # K over 3 KC (the K blocking's one pass): K blocks of whole blocks, or one block each
    (9, 24, 100, 18, 7), (6, 40, 400, 5, 9), (5, 40, 300, 6, 3),
])
def test_shifted_a_reads_each_k_block_further_on(variant, rows, lda, block, blocks, jump):
    """A's element (m, k) is base[m * lda + k + (k // block) * jump]: overlapping rows (lda
    below K, an implicit-GEMM convolution's taps), each block of K further on (several blocks
    in one pass of the kernel's K blocking, in registers; K blocks of several such blocks;
    blocks wider than the K blocking); both tiles, a bias and a clip, split over threads; A
    reaching past ``base`` is refused."""
    rng = np.random.default_rng(rows)
    K, N = block * blocks, 37
    size = (rows - 1) * lda + K + (blocks - 1) * jump
    base = rng.standard_normal(size).astype(np.float32)
    m, k = np.arange(rows)[:, None], np.arange(K)[None, :]
    A = base[m * lda + k + (k // block) * jump]
    B = rng.standard_normal((K, N)).astype(np.float32)
    bias = rng.standard_normal(N).astype(np.float32)
    pk = _packed(B, variant)
    want = A.astype(np.float64) @ B + bias
    got = pk.run_shifted(base, rows, lda, block, jump, bias)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    clipped = pk.run_shifted(base, rows, lda, block, jump, bias, bounds=(-1, 2), threads=3)
    np.testing.assert_allclose(clipped, np.clip(want, -1, 2), rtol=1e-4, atol=1e-4)
    buf = np.full((rows, N), np.nan, np.float32)  # a caller's buffer (a convolution's scratch)
    assert pk.run_shifted(base, rows, lda, block, jump, bias, out=buf) is buf
    np.testing.assert_array_equal(buf, got)
    wide = np.full((rows, N + 7), np.nan, np.float32)  # a range of a Concat's channels
    pk.run_shifted(base, rows, lda, block, jump, bias, out=wide[:, 3:3 + N], threads=3)
    np.testing.assert_array_equal(wide[:, 3:3 + N], got)
    assert np.isnan(wide[:, :3]).all() and np.isnan(wide[:, 3 + N:]).all()
    with pytest.raises(ValueError, match="out"):
        pk.run_shifted(base, rows, lda, block, jump, out=np.empty((rows, N + 1), np.float32))
    with pytest.raises(ValueError, match="past"):
        pk.run_shifted(base[:-1].copy(), rows, lda, block, jump)
    with pytest.raises(ValueError, match="bad shifted"):
        pk.run_shifted(base, rows, lda, block + 1, jump)


@pytest.mark.parametrize("rows,wrap,lda,wstep,block,blocks,jump", [
    (12, 4, 6, 50, 9, 3, 41), (7, 1, 3, 20, 6, 2, 14), (25, 5, 2, 30, 3, 9, 27),
    (40, 7, 16, 300, 48, 3, 100), (6, 6, 4, 24, 12, 1, 0), (13, 2, 8, 40, 16, 2, 9),
])
def test_shifted_a_rows_wrap(variant, rows, wrap, lda, wstep, block, blocks, jump):
    """With ``wrap``, row m of A starts at (m // wrap) * wstep + (m % wrap) * lda (a strided
    convolution's output pixels, ``wrap`` of them a row): rows that wrap inside a tile (wrap
    below and above the tile's rows, 1), both tiles, split over threads; the exact end of
    the last row read checked."""
    rng = np.random.default_rng(rows * wrap)
    K, N = block * blocks, 21
    m, k = np.arange(rows)[:, None], np.arange(K)[None, :]
    idx = m // wrap * wstep + m % wrap * lda + k + (k // block) * jump
    base = rng.standard_normal(int(idx.max()) + 1).astype(np.float32)
    B = rng.standard_normal((K, N)).astype(np.float32)
    bias = rng.standard_normal(N).astype(np.float32)
    pk = _packed(B, variant)
    want = base[idx].astype(np.float64) @ B + bias
    got = pk.run_shifted(base, rows, lda, block, jump, bias, wrap=wrap, wstep=wstep)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    split = pk.run_shifted(base, rows, lda, block, jump, bias, threads=3, wrap=wrap,
                           wstep=wstep)
    np.testing.assert_array_equal(split, got)
    with pytest.raises(ValueError, match="past"):
        pk.run_shifted(base[:-1].copy(), rows, lda, block, jump, wrap=wrap, wstep=wstep)
    with pytest.raises(ValueError, match="bad shifted"):
        pk.run_shifted(base, rows, lda, block, jump, wrap=0, wstep=wstep)


@pytest.mark.parametrize("G,N", [(1, 21), (3, 16), (5, 37)])
def test_grouped_shifted_products_write_their_column_ranges(variant, G, N):
    """grouped_shifted: group g reads its A from g * group_stride floats on (a group-major
    padded input) and writes columns [g * N, (g + 1) * N) of one (rows, G * N) output, rows
    wrapping as a strided convolution's; every group equals its own run_shifted, the same
    bits on 1 and 3 threads (the groups' ranges in one hand-out, or one call on this
    thread); A reaching past the last group's slab is refused."""
    rng = np.random.default_rng(G * N)
    rows, wrap, lda, wstep, block, blocks, jump = 25, 5, 2, 30, 3, 9, 27
    K = block * blocks
    m, k = np.arange(rows)[:, None], np.arange(K)[None, :]
    idx = m // wrap * wstep + m % wrap * lda + k + (k // block) * jump
    slab = int(idx.max()) + 1 + 3  # each group's floats, a little more than it reads
    base = rng.standard_normal(G * slab).astype(np.float32)
    packs = [_packed(rng.standard_normal((K, N)).astype(np.float32), variant) for _ in range(G)]
    bias = rng.standard_normal(G * N).astype(np.float32)
    launch = float_gemm.grouped_shifted(packs, rows, lda, block, jump, slab, bias,
                                        bounds=(-2, 3), wrap=wrap, wstep=wstep)
    got = launch(base, np.full((rows, G * N), np.nan, np.float32))
    for g, pk in enumerate(packs):
        one = pk.run_shifted(base[g * slab:(g + 1) * slab].copy(), rows, lda, block, jump,
                             bias[g * N:(g + 1) * N], bounds=(-2, 3), wrap=wrap, wstep=wstep)
        np.testing.assert_array_equal(got[:, g * N:(g + 1) * N], one)
    split = float_gemm.grouped_shifted(packs, rows, lda, block, jump, slab, bias,
                                       bounds=(-2, 3), threads=3, wrap=wrap, wstep=wstep)
    np.testing.assert_array_equal(split(base, np.empty((rows, G * N), np.float32)), got)
    wide = np.full((rows, G * N + 9), np.nan, np.float32)  # a range of a Concat's channels
    split(base, wide[:, 4:4 + G * N])
    np.testing.assert_array_equal(wide[:, 4:4 + G * N], got)
    assert np.isnan(wide[:, :4]).all() and np.isnan(wide[:, 4 + G * N:]).all()
    with pytest.raises(ValueError, match="past"):
        launch(base[:-4].copy(), np.empty((rows, G * N), np.float32))
    with pytest.raises(ValueError, match="out"):
        launch(base, np.empty((rows, G * N + 1), np.float32))


# -- the session holds a packed weight once (issue #18) -------------------------------------------


def _weight_model(op="MatMul", K=64, N=48, a_shape=("n", 64), share=False, **attrs):
    rng = np.random.default_rng(K + N)
    W = rng.standard_normal((N, K) if attrs.get("transB") else (K, N)).astype(np.float32)
    inits = [onnx.numpy_helper.from_array(W, "W")]
    ins = ["A", "W"]
    if op in ("Gemm", "FusedGemm"):
        inits.append(onnx.numpy_helper.from_array(
            rng.standard_normal(N).astype(np.float32), "C"))
        ins.append("C")
    domain = "com.microsoft" if op.startswith("Fused") else ""
    nodes = [helper.make_node(op, ins, ["Y"], domain=domain, **attrs)]
    outputs = [helper.make_tensor_value_info("Y", TP.FLOAT, None)]
    inputs = [helper.make_tensor_value_info("A", TP.FLOAT, list(a_shape))]
    if share:  # W also read by a node that has no packed copy of it
        nodes.append(helper.make_node("Mul", ["W", "D"], ["S"]))
        inputs.append(helper.make_tensor_value_info("D", TP.FLOAT, [K, N]))
        outputs.append(helper.make_tensor_value_info("S", TP.FLOAT, None))
    graph = helper.make_graph(nodes, "g", inputs, outputs, inits)
    ops = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=ops).SerializeToString()


def _released(sess) -> bool:
    v = sess._model.graph.initializers["W"]
    return v.const_value is None and sess._program.template[sess._program.slot_of(v)] is None


@pytest.mark.parametrize("op,attrs,a_shape", [
    ("MatMul", {}, ("n", 64)), ("MatMul", {}, (2, "n", 64)), ("MatMul", {}, (64,)),
    ("Gemm", {"alpha": 0.5, "beta": 2.0, "transB": 1}, ("n", 64)),
    ("Gemm", {"transA": 1}, (64, "n")),
    ("FusedGemm", {"activation": "Relu", "alpha": 1.5}, ("n", 64)),
    ("FusedMatMul", {"alpha": 2.0}, (3, "n", 64)),
])
def test_packed_weight_replaces_the_initializer(op, attrs, a_shape):
    """A constant weight packed into the compiled GEMM's panels is no longer held by the
    session (slots, IR): the panels serve every product, a single row too (BLAS's GEMV on
    the original before), with onnxruntime's results."""
    model = _weight_model(op, a_shape=a_shape, **attrs)
    sess = onnxrun.InferenceSession(model)
    assert _released(sess)
    ref = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    for n in (1, 2, 7, 0):
        shape = [n if d == "n" else d for d in a_shape]
        A = rng.standard_normal(shape).astype(np.float32)
        np.testing.assert_allclose(sess.run(None, {"A": A})[0], ref.run(None, {"A": A})[0],
                                   rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("M,K,N", [(1, 128, 1), (1, 7, 5), (3, 33, 31), (7, 300, 65)])
def test_prepared_product_equals_run(variant, M, K, N):
    """PackedMatrix.prepared: the argument block of one shape built once, then each call
    fills in A's and out's addresses: run's numbers bit for bit, bias and bounds included,
    into a new array each call."""
    rng = np.random.default_rng(M * K + N)
    packed = _packed(rng.standard_normal((K, N)).astype(np.float32), variant)
    bias = rng.standard_normal(N).astype(np.float32)
    for b, bounds in ((None, None), (bias, None), (bias, (0.0, np.inf)), (None, (-0.5, 0.5))):
        call = packed.prepared(M, b, bounds)
        assert call.shape == (M, K)
        for _ in range(2):
            A = rng.standard_normal((M, K)).astype(np.float32)
            got = call(A)
            assert got.shape == (M, N) and got is not call(A)
            np.testing.assert_array_equal(got, packed.run(A, bias=b, bounds=bounds))
    # a logistic epilogue (an SE block's Sigmoid / SiLU), and rows of a wider output
    for logistic in ((1.0, False), (1.0, True)):
        call = packed.prepared(M, bias, logistic=logistic)
        A = rng.standard_normal((M, K)).astype(np.float32)
        wide = np.full((M, N + 3), np.nan, np.float32)
        assert call(A, wide[:, 1:1 + N]).base is wide
        np.testing.assert_array_equal(wide[:, 1:1 + N],
                                      packed.run(A, bias=bias, logistic=logistic))
        assert np.isnan(wide[:, 0]).all() and np.isnan(wide[:, 1 + N:]).all()
    with pytest.raises(ValueError, match="at once"):
        packed.prepared(M, logistic=(1.0, False), gelu_after="gelu")
    assert packed.prepared(0) is None
    # a product run() would split over threads is not prepared (its block is per range);
    # one too small to split is, at 2 threads as at 1 (a streaming model's small Gemm)
    from onnxrun.providers.cpu.compiled.float_gemm import SPIN_MACS_PER_RANGE

    npan = -(-N // packed.NR)
    assert (packed.prepared(64, threads=2) is None) == (len(packed._ranges(64, npan, 2)) > 1)
    if 64 * K * npan * packed.NR < SPIN_MACS_PER_RANGE:
        assert packed.prepared(64, threads=2) is not None
    assert packed.prepared(1 << 18, threads=2) is None


def test_threads_take_their_share_of_the_bigger_operand(variant):
    """At 2 threads each range reads its share of the bigger operand: a tall product (a
    convolution's pixels) is cut by strips of rows, each range every panel (cut by panels,
    every thread read all of A); a wide one (a decoder's few rows) by panels, each range all
    rows, unless its panels do not divide evenly over the threads and its rows make strips
    enough (a 14 x 14 1x1 convolution's 5 panels of AVX-512: 3 against 2). One thread's
    bits either way."""
    rng = np.random.default_rng(12)
    for M, K, N, by_rows in ((3136, 24, 160, True), (16, 256, 1024, False),
                             (196, 320, 5 * 64 if variant.NR == 64 else 5 * 16, True)):
        P = _packed(rng.standard_normal((K, N)).astype(np.float32), variant)
        npan = -(-N // P.NR)
        ranges = P._ranges(M, npan, 2)
        assert len(ranges) > 1
        if by_rows:
            assert all((p0, p1) == (0, npan) for _, _, p0, p1 in ranges)
            assert [r[:2] for r in ranges] == sorted(r[:2] for r in ranges)
            assert ranges[0][0] == 0 and ranges[-1][1] == M
        else:
            assert all((m0, m1) == (0, M) for m0, m1, _, _ in ranges)
        A = rng.standard_normal((M, K)).astype(np.float32)
        assert P.run(A, threads=2).tobytes() == P.run(A).tobytes()


@pytest.mark.parametrize("M,K,N,lda", [(4, 256, 258, 128), (3, 17, 5, 4), (7, 40, 33, 1)])
def test_prepared_product_reads_overlapping_rows(variant, M, K, N, lda):
    """prepared(lda=): A's rows lda floats apart in one buffer (a 1-D convolution's windows
    read in place, rows overlapping): run's numbers on the same rows copied out, bit for bit."""
    rng = np.random.default_rng(K + N)
    packed = _packed(rng.standard_normal((K, N)).astype(np.float32), variant)
    bias = rng.standard_normal(N).astype(np.float32)
    base = rng.standard_normal((M - 1) * lda + K).astype(np.float32)
    rows = np.stack([base[m * lda:m * lda + K] for m in range(M)])
    got = packed.prepared(M, bias, (0.0, np.inf), lda=lda)(base)
    np.testing.assert_array_equal(got, packed.run(rows, bias=bias, bounds=(0.0, np.inf)))
    with pytest.raises(ValueError):
        packed.prepared(M, lda=0)


@pytest.mark.parametrize("op,attrs", [("Gemm", {"alpha": 0.5, "beta": 2.0, "transB": 1}),
                                      ("FusedGemm", {"activation": "Sigmoid"}),
                                      ("FusedGemm", {"activation": "Relu"}),
                                      ("Gemm", {"transA": 1})])
def test_gemm_repeats_its_shape_through_a_prepared_product(op, attrs, monkeypatch):
    """A Gemm / FusedGemm on released panels keeps the product of the last shape of A
    prepared (a streaming model's one row a call): later calls of that shape take it, with
    the numbers of the first call's path, and a new shape prepares again; transA never
    does (its operand is a transposed view)."""
    calls = []
    original = float_gemm.PreparedProduct.__call__
    monkeypatch.setattr(float_gemm.PreparedProduct, "__call__",
                        lambda self, A: calls.append(A.shape) or original(self, A))
    a_shape = (64, "n") if attrs.get("transA") else ("n", 64)
    model = _weight_model(op, a_shape=a_shape, **attrs)
    so = onnxrun.SessionOptions()
    so.intra_op_num_threads = 1  # 2 threads would split the 3-row product: not prepared
    sess = onnxrun.InferenceSession(model, so)
    assert _released(sess)
    ref = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(3)
    for n in (1, 1, 1, 3, 3, 1):
        A = rng.standard_normal([n if d == "n" else d for d in a_shape]).astype(np.float32)
        first = sess.run(None, {"A": A})[0]
        again = sess.run(None, {"A": A})[0]
        np.testing.assert_array_equal(again, first)
        np.testing.assert_allclose(first, ref.run(None, {"A": A})[0], rtol=1e-5, atol=1e-5)
    # every call but each new shape's first (n = 1, 3, 1 again)
    assert calls == ([] if attrs.get("transA") else [(1, 64)] * 5 + [(3, 64)] * 3 +
                     [(1, 64)])


def test_packed_weight_is_freed():
    """The original float32 weight's memory is given back once packed: the session holds
    ~1x the weight (2x before: the initializer and its panels)."""
    import gc
    import tracemalloc

    model = _weight_model(K=512, N=1024, a_shape=("n", 512))  # a 2 MiB weight
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        sess = onnxrun.InferenceSession(model)
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert sess._program.steps[0].kernel.packed is not None
    assert held < 1.5 * 512 * 1024 * 4, held


def test_shared_or_kept_weight_stays():
    """A weight another node reads, or every weight under onnxruntime's
    session.disable_prepacking = 1, is kept, and BLAS takes the one-row product again."""
    model = _weight_model(share=True)
    sess = onnxrun.InferenceSession(model)
    assert not _released(sess)
    A = np.ones((1, 64), np.float32)
    feeds = {"A": A, "D": np.full((64, 48), 2, np.float32)}
    ref = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)
    for got, want in zip(sess.run(None, feeds), ref, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
    so = onnxrun.SessionOptions()
    so.add_session_config_entry("session.disable_prepacking", "1")
    kept = onnxrun.InferenceSession(_weight_model(), so)
    assert not _released(kept)
    np.testing.assert_allclose(kept.run(None, {"A": A})[0], ref[0], rtol=1e-5, atol=1e-5)


def test_released_weight_reports_a_mismatched_input():
    """Without the original weight a product that does not fit the panels is a clear error
    naming the node and the shapes, as BLAS's was."""
    sess = onnxrun.InferenceSession(_weight_model(a_shape=("n", "k")))
    assert _released(sess)
    with pytest.raises(RuntimeError, match=r"MatMul.*\[3, 5\].*\[64, 48\]"):
        sess.run(None, {"A": np.ones((3, 5), np.float32)})


def _conv_chain(layers, x_shape):
    """Convolutions in a chain (each (name, out channels, kernel, group)), weights random."""
    rng = np.random.default_rng(len(layers))
    nodes, inits, c, x = [], [], x_shape[1], "X"
    for i, (out, k, group) in enumerate(layers):
        W = (rng.standard_normal((out, c // group, k, k)) * 0.2).astype(np.float32)
        B = rng.standard_normal(out).astype(np.float32)
        inits += [onnx.numpy_helper.from_array(W, f"W{i}"),
                  onnx.numpy_helper.from_array(B, f"B{i}")]
        nodes += [helper.make_node("Conv", [x, f"W{i}", f"B{i}"], [f"C{i}"], group=group,
                                   pads=[k // 2] * 4, name=f"conv{i}"),
                  helper.make_node("Relu", [f"C{i}"], [f"R{i}"])]
        c, x = out, f"R{i}"
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("X", TP.FLOAT, x_shape)],
                              [helper.make_tensor_value_info(x, TP.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _conv_sessions(model):
    """The session as it runs, and one that keeps every weight (session.disable_prepacking)."""
    so = onnxrun.SessionOptions()
    so.add_session_config_entry("session.disable_prepacking", "1")
    data = model.SerializeToString()
    return onnxrun.InferenceSession(data), onnxrun.InferenceSession(data, so)


def _conv_kernels(sess):
    return [s.kernel for s in sess._program.steps if s.node.op_type in ("Conv", "FusedConv")]


def test_conv_weight_in_panels_replaces_the_initializer():
    """A convolution whose weight lives only in the compiled GEMM's panels (channels-last
    implicit GEMM) releases the original: the session holds it once. A size that takes
    another method (a small input: the inline gather path) rebuilds W exactly from the
    panels; every result is bit for bit the session's that keeps W."""
    model = _conv_chain([(24, 3, 1), (24, 3, 1)], [1, 16, "h", "w"])
    sess, kept = _conv_sessions(model)
    convs = _conv_kernels(sess)
    assert all(k.nhwc_packed is not None and k.prepacked_inputs == (1,) for k in convs)
    graph = sess._model.graph
    assert all(graph.initializers[f"W{i}"].const_value is None for i in range(2))
    assert all(kept._model.graph.initializers[f"W{i}"].const_value is not None
               for i in range(2))
    want = onnx.numpy_helper.to_array(model.graph.initializer[0])
    np.testing.assert_array_equal(convs[0]._weight(None), want)
    rng = np.random.default_rng(3)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for hw in ((20, 20), (4, 5), (20, 20)):
        X = rng.standard_normal((1, 16) + hw).astype(np.float32)
        got = sess.run(None, {"X": X})[0]
        np.testing.assert_array_equal(got, kept.run(None, {"X": X})[0])
        np.testing.assert_allclose(got, ref.run(None, {"X": X})[0], rtol=1e-4, atol=1e-4)


def test_conv_1x1_weight_released_between_channels_last_layers():
    """A 1x1 convolution that reads channels-last (after an implicit-GEMM one, whose W was
    released before: its kind still known) and runs on the panels releases W and its NCHW
    views; the layout choices are the session's that keeps W."""
    model = _conv_chain([(32, 3, 1), (32, 1, 1), (32, 3, 32), (48, 1, 1)], [1, 32, 12, 12])
    sess, kept = _conv_sessions(model)
    convs = _conv_kernels(sess)
    assert convs[1].gemm_t_packed is not None and convs[1].prepacked_inputs == (1,)
    assert not convs[1].prepared
    assert sess._model.graph.initializers["W1"].const_value is None
    assert [k.channels_last for k in convs] == [k.channels_last for k in _conv_kernels(kept)]
    want = onnx.numpy_helper.to_array(model.graph.initializer[2])
    np.testing.assert_array_equal(convs[1]._weight(None), want)
    X = np.random.default_rng(4).standard_normal((1, 32, 12, 12)).astype(np.float32)
    np.testing.assert_array_equal(sess.run(None, {"X": X})[0], kept.run(None, {"X": X})[0])
    # an input that arrives in NCHW after all: W rebuilt once, the same numbers
    X2 = np.random.default_rng(5).standard_normal((1, 32, 12, 12)).astype(np.float32)
    ours = convs[1](X2, None, sess._model.graph.initializers["B1"].const_value)
    theirs = _conv_kernels(kept)[1](X2, kept._model.graph.initializers["W1"].const_value,
                                    kept._model.graph.initializers["B1"].const_value)
    np.testing.assert_array_equal(ours, theirs)


def test_conv_weights_are_freed():
    """The convolution weights' memory is given back once packed: ~1x the weights held (2x
    before: the initializers and their panels)."""
    import gc
    import tracemalloc

    model = _conv_chain([(128, 3, 1), (128, 3, 1)], [1, 64, 8, 8]).SerializeToString()
    weights = (128 * 64 + 128 * 128) * 9 * 4
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        sess = onnxrun.InferenceSession(model)
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert all(k.nhwc_packed is not None for k in _conv_kernels(sess))
    assert held < 1.5 * weights, (held, weights)


@pytest.mark.parametrize("G,K,N", [(1, 1, 1), (2, 3, 16), (16, 64, 100), (1, 7, 15), (3, 0, 20),
                                   (1, 5, 0), (16, 128, 256), (1, 33, 47)])
@pytest.mark.parametrize("NR", [16, 32])
def test_panels_layout(G, K, N, NR, monkeypatch):
    """_panels: (G, K, N) -> (G, N/NR panels, K, NR), the last panel's missing columns zero,
    64-byte aligned (the full panels are moved as opaque rows of NR floats). Its buffer is
    not zeroed first (every element is written): here it starts as NaN, so a missed one shows."""
    real = float_gemm.aligned_empty

    def poisoned(shape, dtype, align=64):
        out = real(shape, dtype, align)
        out[...] = np.nan
        return out

    monkeypatch.setattr(float_gemm, "aligned_empty", poisoned)
    Bs = np.random.default_rng(K * N + G).standard_normal((G, K, N)).astype(np.float32)
    npan = -(-N // NR)
    want = np.zeros((G, K, npan * NR), np.float32)
    want[:, :, :N] = Bs
    got = float_gemm._panels(Bs, NR)
    np.testing.assert_array_equal(got, want.reshape(G, K, npan, NR).transpose(0, 2, 1, 3))
    assert got.size == 0 or got.ctypes.data % 64 == 0


@pytest.mark.parametrize("shape", [(20, 3, 3, 3), (40, 7, 1, 1), (33, 16, 3, 3)])
def test_packed_rows_of_a_weight_view(shape):
    """pack_rows of a convolution weight's (kh, kw, C, M) view and pack of a transposed
    (non-contiguous) matrix: the panels of the contiguous (K, N) copy, bit for bit."""
    W = np.random.default_rng(shape[0]).standard_normal(shape).astype(np.float32)
    V = W.transpose(2, 3, 1, 0)
    B = np.ascontiguousarray(V).reshape(-1, shape[0])
    want = float_gemm.pack(B)
    for got in (float_gemm.pack_rows(V), float_gemm.pack(np.asfortranarray(B))):
        assert (got.K, got.N) == (want.K, want.N)
        np.testing.assert_array_equal(got.panels, want.panels)
        np.testing.assert_array_equal(got.matrix(), B)


def test_convolution_kinds_remembered_per_graph_not_kept_alive():
    """The kinds the layout choices remember belong to one graph: a session built under
    compiled.disabled() from the same model decides afresh (no compiled layouts), and a
    dropped session's graph is not kept alive by them."""
    import gc
    import weakref

    from onnxrun.providers.cpu.ops import conv

    model = _conv_chain([(32, 3, 1), (32, 1, 1), (32, 3, 32), (48, 1, 1)],
                        [1, 32, 12, 12]).SerializeToString()
    sess = onnxrun.InferenceSession(model)
    with jit.disabled():
        plain = onnxrun.InferenceSession(model)
    assert _conv_kernels(sess)[0].nhwc_packed is not None
    assert all(k.nhwc_packed is None and k.gemm_t_packed is None for k in _conv_kernels(plain))
    graph = weakref.ref(sess._model.graph)
    assert graph() in conv._KINDS
    del sess
    gc.collect()
    assert graph() is None
