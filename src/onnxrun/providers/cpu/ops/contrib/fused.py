"""com.microsoft fused elementwise / linear-algebra operators that onnxruntime's graph
optimizer writes: FusedGemm, FusedMatMul, the Gelu family (Gelu, FastGelu, BiasGelu,
QuickGelu, BiasSplitGelu), BiasSoftmax and BiasAdd; SparseToDenseMatMul; onnxrun's own
MatMulBiasGelu (ai.onnxrun: the layout level's MatMul + BiasGelu); and the fused
activations (``make_activation``) FusedConv (``fused_conv.py``) shares. NhwcMaxPool is with
the pools (``ops/pool.py``). Neither convolutions nor pools are imported here: a FusedGemm
model does not load their modules.
"""

from __future__ import annotations

import math

import numpy as np

from .....dtypes import compute_dtype
from ... import blas
from ...compiled.layout import dense_order, flat, flat_out, shaped_like
from ...gelu_polynomial import FAST_GELU_LOGIT, GELU_LOGIT
from ...kernels import KernelContext, op, text_attribute
from ...parallel import threads_for
from ..activation import sigmoid, sigmoid_in_place
from ..elementwise import erf, gelu_float32, gelu_kernel
from ..linalg import gemm_packed, matmul, packed_gemm, packed_weights, run_packed

MS = "com.microsoft"
ONNXRUN = "ai.onnxrun"  # onnxrun's own fused operators (the layout level's)
_F32 = np.dtype(np.float32)


# -- fused activations ---------------------------------------------------------------------------


def _logistic_in_place():
    """onnxruntime's fused Sigmoid (MlasActivation: MlasComputeLogistic) on ``y`` itself:
    the compiled logistic, bit for bit the standalone Sigmoid's, taken once here (asking for
    it per call cost more than numpy's errstate and four ufuncs on a streaming model's
    one-row FusedGemm); numpy's steps where it does not run."""
    from ...compiled import logistic

    if logistic.unavailable() is not None:
        return sigmoid_in_place
    fn = logistic.function()
    from ...compiled.jit import address

    def act(y):
        if y.dtype is _F32 and y.flags.c_contiguous and y.size:
            a = address(y)
            fn(a, a, y.size, 1.0, 0)
        else:
            sigmoid_in_place(y)

    act.logistic = (1.0, False)  # the compiled GEMM's epilogue: the same bits (float_gemm)
    return act


def _quick_gelu_in_place(alpha: float):
    """y * logistic(alpha y) on ``y`` itself, as the standalone QuickGelu computes it (MLAS's
    logistic where it runs: compiled/logistic.py, any memory order; numpy's steps
    elsewhere). FusedConv's activation "QuickGelu" (params [alpha]): a convolution's SiLU,
    which the layout level fuses (optimize/layout/conv_quick_gelu.py) and the compiled
    GEMM's epilogue applies (``logistic``)."""
    from ...compiled import logistic

    alpha32 = np.float32(alpha)

    def numpy_steps(y):
        s = sigmoid(y * y.dtype.type(alpha))
        s *= y
        y[...] = s

    if logistic.unavailable() is not None:
        return numpy_steps
    fn = logistic.function()

    def act(y):
        order = dense_order(y) if y.dtype is _F32 and y.size else None
        if order is None:
            numpy_steps(y)
            return
        v = flat(y, order)
        logistic.quick_gelu(v, float(alpha32), out=v, fn=fn)

    act.logistic = (float(alpha32), True)
    return act


def _gelu_in_place(fast: bool):
    """gelu(y) (FastGelu's where ``fast``) on ``y`` itself, as the standalone com.microsoft
    operator computes it: FusedGemm's activation "Gelu" / "FastGelu" (the layout level's Gemm
    + Gelu), which the compiled GEMM's epilogue applies (``gelu``: its name there; the same
    bits)."""
    coeffs = FAST_GELU_LOGIT if fast else GELU_LOGIT
    kernel = gelu_kernel(coeffs)

    def act(y):
        if y.dtype is _F32 and y.flags.c_contiguous:
            gelu_float32(y, out=y, kernel=kernel, coeffs=coeffs)
        else:
            y[...] = (fast_gelu_ if fast else gelu_)(y.astype(compute_dtype(y.dtype)))

    act.gelu = "fast_gelu" if fast else "gelu"
    return act


def activation_arguments(activation_params) -> list[float | None]:
    """FusedConv's ``activation_params`` as make_activation's (alpha, beta, gamma): the ones
    given, then None (the standalone operator's default). The CUDA kernel shares it."""
    params = [float(p) for p in activation_params] if activation_params is not None else []
    return (params + [None] * 3)[:3]


def make_activation(name: str, alpha: float | None = None, beta: float | None = None,
               gamma: float | None = None):
    """The in-place activation named by FusedConv / FusedGemm (None: identity). The
    parameters default as in the standalone ONNX operators."""
    name = text_attribute(name) if name else ""
    if name in ("", "Identity"):
        return None
    if name == "Relu":
        return _clipper(0.0, np.inf)
    if name == "Tanh":
        return lambda y: np.tanh(y, out=y)
    if name in ("Sigmoid", "Logistic"):
        return _logistic_in_place()
    if name == "QuickGelu":  # onnxrun's layout level (a convolution's SiLU); alpha as QuickGelu's
        return _quick_gelu_in_place(1.702 if alpha is None else alpha)
    if name in ("Gelu", "FastGelu"):  # onnxrun's layout level (a Gemm's: layout/matmul_gelu.py)
        return _gelu_in_place(name == "FastGelu")
    if name == "LeakyRelu":
        a = 0.01 if alpha is None else alpha

        def leaky(y):
            np.multiply(y, y.dtype.type(a), out=y, where=y < 0)

        return leaky
    if name == "Clip":
        return _clipper(-np.inf if alpha is None else alpha, np.inf if beta is None else beta)
    if name == "HardSigmoid":
        a = 0.2 if alpha is None else alpha
        b = 0.5 if beta is None else beta

        def hard_sigmoid(y):
            y *= y.dtype.type(a)
            y += y.dtype.type(b)
            np.clip(y, 0, 1, out=y)

        return hard_sigmoid
    if name == "Elu":
        a = 1.0 if alpha is None else alpha

        def elu(y):
            neg = y < 0
            np.copyto(y, np.expm1(np.minimum(y, 0)) * y.dtype.type(a), where=neg)

        return elu
    if name == "Selu":
        a = 1.67326319217681884765625 if alpha is None else alpha
        g = 1.05070102214813232421875 if gamma is None else gamma

        def selu(y):
            np.copyto(y, np.expm1(np.minimum(y, 0)) * y.dtype.type(a), where=y < 0)
            y *= y.dtype.type(g)

        return selu
    if name == "Softplus":
        return lambda y: np.logaddexp(y, 0, out=y)
    if name == "Softsign":
        return lambda y: np.divide(y, 1 + np.abs(y), out=y)
    if name == "ThresholdedRelu":
        a = 1.0 if alpha is None else alpha
        return lambda y: np.copyto(y, 0, where=y <= a)
    raise ValueError(f"unsupported fused activation {name!r}")


def _clipper(lo: float, hi: float):
    """y -> clip(y, lo, hi) in place; ``bounds`` lets a kernel clip while copying instead.
    (numpy's clip with two bounds is vectorized; maximum with a scalar is much slower.)"""

    lo32, hi32 = np.float32(lo), np.float32(hi)

    def clip(y):
        if y.dtype is _F32:  # the usual case, its bounds made once
            blas.clip(y, lo32, hi32, out=y)
            return
        t = y.dtype.type
        blas.clip(y, t(lo), t(hi), out=y)

    clip.bounds = (lo, hi)
    return clip


@op("FusedGemm", 1, domain=MS)
class FusedGemm:
    def __init__(self, ctx: KernelContext, *, activation="", activation_alpha=None,
                 activation_beta=None, activation_gamma=None, alpha=1.0, beta=1.0,
                 transA=0, transB=0) -> None:
        self.alpha, self.beta = float(alpha), float(beta)
        self.transA, self.transB = bool(transA), bool(transB)
        self.act = make_activation(
            activation, *(None if v is None else float(v)
                          for v in (activation_alpha, activation_beta, activation_gamma)))
        self.threads = threads_for(ctx)
        # the compiled GEMM: a Relu / Clip in its epilogue, other activations after it; its
        # panels (alpha folded in) and bias (beta * C) replace B and C
        self.packed, self.packed_bias = packed_gemm(ctx, alpha, beta, transB)
        self.prepacked_inputs = (1, 2) if self.packed is not None else ()
        self.prepared = None  # the panels' product for one shape of A (gemm_packed)
        self.bounds = getattr(self.act, "bounds", None)
        # a Gelu (the layout level's) in the compiled GEMM's epilogue, after the bias
        self.gelu = getattr(self.act, "gelu", None) if self.packed is not None else None
        B = ctx.constant(1)
        self.B = None
        if B is not None and self.packed is None:  # alpha folded into a constant B
            # B.T stays a view: BLAS takes the transpose as a flag. Copying (and transposing)
            # a large weight here cost seconds at session creation and doubled its memory.
            cdt = compute_dtype(B.dtype)
            Bm = B.T if self.transB else B
            if self.alpha != 1.0:
                Bm = Bm.astype(cdt)
                Bm *= cdt.type(self.alpha)
            elif cdt != Bm.dtype:
                Bm = Bm.astype(cdt)
            self.B = Bm
        self.accepts_out = self.packed is not None  # the panels' product writes into out

    @property
    def uses_compiled_gemm(self) -> bool:  # read by the session: BLAS held to one thread
        return self.packed is not None

    def __call__(self, A, B, C=None, *, out=None):
        if self.packed is not None and (A.ndim == 2 or B is None):
            Y = gemm_packed(self, A, B, self.bounds, out, self.gelu)
            if Y is not None:
                if self.act is not None and self.bounds is None and self.gelu is None:
                    self.act(Y)
                return Y
        cdt = compute_dtype(A.dtype)
        Am = (A.T if self.transA else A).astype(cdt, copy=False)
        if self.B is not None:
            Y = blas.matmul(Am, self.B, threads=self.threads)
        else:
            Y = blas.matmul(Am, (B.T if self.transB else B).astype(cdt, copy=False),
                            threads=self.threads)
            if self.alpha != 1.0:
                Y *= cdt.type(self.alpha)
        if C is not None and self.beta != 0.0:
            c = C.astype(cdt, copy=False)
            Y += c * cdt.type(self.beta) if self.beta != 1.0 else c
        if self.act is not None:
            self.act(Y)
        return Y.astype(A.dtype, copy=False)


def _batch_first_last(x: np.ndarray) -> np.ndarray:
    """transBatch: [d0, b..., dn] is read as [b..., d0, dn]."""
    return np.moveaxis(x, 0, -2)


@op("FusedMatMul", 1, domain=MS)
class FusedMatMul:
    def __init__(self, ctx: KernelContext, *, alpha=1.0, transA=0, transB=0, transBatchA=0,
                 transBatchB=0) -> None:
        self.alpha = float(alpha)
        self.transA, self.transB = bool(transA), bool(transB)
        self.batchA, self.batchB = bool(transBatchA), bool(transBatchB)
        self.threads = threads_for(ctx)
        B = ctx.constant(1)
        self.packed = None  # the compiled GEMM's panels of alpha * op(B), a 2-D constant
        if B is not None and B.ndim == 2 and B.dtype == np.float32 and not self.batchB:
            Bm = B.T if self.transB else B
            self.packed = packed_weights(np.asarray(Bm * np.float32(self.alpha)
                                                    if self.alpha != 1.0 else Bm, np.float32))
        # the panels replace B, unless a batch-transposed A may need the numpy path
        self.prepacked_inputs = (1,) if self.packed is not None and not self.batchA else ()
        # the product is written into the executor's buffer (memory.py), alpha applied there
        # in place (attention scores: no second array per call); a 16-bit float product
        # returns its own array, which the memory pattern's probe sees and leaves out
        self.accepts_out = True

    @property
    def uses_compiled_gemm(self) -> bool:
        return self.packed is not None

    def __call__(self, A, B, *, out=None):
        if self.packed is not None and not self.batchA:
            Y = run_packed(self.packed, np.swapaxes(A, -1, -2) if self.transA and A.ndim >= 2
                           else A, self.threads, released=B is None, out=out)
            if Y is not None:
                return Y
        if (self.batchA or self.batchB) and not (A.ndim == B.ndim and A.ndim > 2):
            raise ValueError("transBatchA/transBatchB need inputs of one rank >= 3")
        if self.batchA:
            A = _batch_first_last(A)
        if self.batchB:
            B = _batch_first_last(B)
        if self.transA and A.ndim >= 2:
            A = np.swapaxes(A, -1, -2)
        if self.transB and B.ndim >= 2:
            B = np.swapaxes(B, -1, -2)
        cdt = compute_dtype(A.dtype)
        a, b = A.astype(cdt, copy=False), B.astype(cdt, copy=False)
        # one GEMM over all rows where B is a matrix, a stack of products in one call
        # (linalg.matmul); alpha times each sum, as onnxruntime's GEMM applies it
        Y = np.asarray(matmul(a, b, self.threads, out if cdt == A.dtype else None,
                              self.alpha))
        return Y.astype(A.dtype, copy=False)


@op("SparseToDenseMatMul", 1, domain=MS)
class SparseToDenseMatMul:
    """Y = alpha * op(A) @ op(B), A a sparse 2-D matrix (given dense: a session densifies
    sparse inputs as they are fed), B dense."""

    def __init__(self, ctx: KernelContext, *, alpha=1.0, transA=0, transB=0) -> None:
        self.alpha, self.transA, self.transB = float(alpha), bool(transA), bool(transB)

    def __call__(self, A, B):
        if A.ndim != 2 or B.ndim != 2:
            raise ValueError(f"A and B must be 2-D, got {list(A.shape)} and {list(B.shape)}")
        a = A.T if self.transA else A
        b = B.T if self.transB else B
        if a.shape[1] != b.shape[0]:
            raise ValueError(f"inner dimensions differ: op(A) {list(a.shape)}, op(B) "
                             f"{list(b.shape)}")
        Y = np.matmul(a, b)
        if self.alpha != 1.0:
            Y = Y * Y.dtype.type(self.alpha)
        return Y.astype(A.dtype, copy=False)


# -- Gelu family -----------------------------------------------------------------------------


def gelu_(x: np.ndarray) -> np.ndarray:
    """0.5 * x * (1 + erf(x / sqrt(2))), overwriting ``x`` (which must be owned)."""
    if x.dtype == np.float32 and x.flags.c_contiguous:
        return gelu_float32(x, out=x)
    t = erf(x * x.dtype.type(1.0 / math.sqrt(2.0)))
    t += 1
    x *= t
    x *= x.dtype.type(0.5)
    return x


def fast_gelu_(x: np.ndarray) -> np.ndarray:
    """The tanh approximation 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))."""
    t = x * x
    t *= x.dtype.type(0.044715 * math.sqrt(2.0 / math.pi))
    t += x.dtype.type(math.sqrt(2.0 / math.pi))
    t *= x
    np.tanh(t, out=t)
    t += 1
    x *= t
    x *= x.dtype.type(0.5)
    return x


def _owned(X: np.ndarray, bias: np.ndarray | None = None) -> tuple[np.ndarray, np.dtype]:
    """X (+ bias) as a fresh array in the compute dtype."""
    cdt = compute_dtype(X.dtype)
    if bias is not None:
        return np.add(X.astype(cdt, copy=False), bias.astype(cdt, copy=False)), cdt
    return X.astype(cdt, copy=True), cdt


def _dense_out(out: np.ndarray | None, X: np.ndarray) -> np.ndarray | None:
    """The executor's buffer ``out`` where it is a C-contiguous float32 array of X's shape."""
    if out is not None and out.shape == X.shape and out.dtype == np.float32 and \
            out.flags.c_contiguous:
        return out
    return None


@op("Gelu", 1, domain=MS)
class Gelu:
    def __init__(self, ctx: KernelContext) -> None:
        self.threads = threads_for(ctx)  # float32: compiled rows on the intra-op threads
        self.kernel = gelu_kernel()  # taken once: its lookups cost a third of a call

    # the executor's buffer (memory.py), which may be X's own bytes: gelu_float32 writes
    # each block after reading it
    accepts_out = in_place = True

    def __call__(self, X, *, out=None):
        if X.dtype == np.float32:
            order = dense_order(X) if X.ndim > 1 else None
            if order is not None and order != tuple(range(X.ndim)):
                # element-wise: on X's memory as it lies, the result laid out as X (a
                # channels-last convolution's Gelu stays so, as the layout level decided:
                # conv._PASS_THROUGH), its innermost axis as the rows' width
                rows = flat(X, order).reshape(-1, X.shape[order[-1]])
                dst = flat_out(out, X, order)
                y = gelu_float32(rows, out=None if dst is None else dst.reshape(rows.shape),
                                 threads=self.threads, kernel=self.kernel)
                return shaped_like(y.reshape(-1), X, order)
            return gelu_float32(np.ascontiguousarray(X), out=_dense_out(out, X),
                                threads=self.threads, kernel=self.kernel)
        x, _ = _owned(X)
        return gelu_(x).astype(X.dtype, copy=False)


@op("BiasGelu", 1, domain=MS)
class BiasGelu:
    def __init__(self, ctx: KernelContext) -> None:
        self.threads = threads_for(ctx)
        self.kernel = gelu_kernel()  # as Gelu's

    accepts_out = in_place = True  # as Gelu's

    def __call__(self, A, B, *, out=None):
        if A.dtype == np.float32 and B.dtype == np.float32 and B.shape == A.shape[-1:]:
            # the bias is added block by block, inside the gelu passes
            return gelu_float32(np.ascontiguousarray(A), B, out=_dense_out(out, A),
                                threads=self.threads, kernel=self.kernel)
        x, _ = _owned(A, B)
        return gelu_(x).astype(A.dtype, copy=False)


@op("MatMulBiasGelu", 1, domain=ONNXRUN)
class MatMulBiasGelu:
    """gelu(A @ B + bias), bias optional; ``approximate`` "tanh": FastGelu's (as ai.onnx
    Gelu's attribute). onnxrun's layout level makes it of a MatMul with a constant float32
    weight followed by BiasGelu, Gelu or FastGelu (optimize/layout/matmul_gelu.py; a
    transformer layer's up projection). On the compiled GEMM's panels the bias and the gelu
    are its epilogue, on each tile just stored, still in L1 (the standalone kernel's bits:
    the same product, the same body): BERT's BiasGelu was a pass over a 256 x 1536 product
    per layer. Elsewhere the MatMul's product, then the standalone kernel on it."""

    def __init__(self, ctx: KernelContext, *, approximate="none") -> None:
        approximate = text_attribute(approximate)
        if approximate not in ("none", "tanh"):
            raise ValueError(f"MatMulBiasGelu: approximate must be 'none' or 'tanh', got "
                             f"{approximate!r}")
        self.epilogue = "fast_gelu" if approximate == "tanh" else "gelu"
        self.coeffs = FAST_GELU_LOGIT if approximate == "tanh" else GELU_LOGIT
        bias = ctx.constant(2) if ctx.has_input(2) else None
        self.packed = packed_weights(ctx.constant(1))
        if ctx.has_input(2) and (bias is None or bias.dtype != _F32 or bias.ndim != 1 or
                                 self.packed is None or bias.size != self.packed.N):
            self.packed = None  # a bias the epilogue cannot take: the two kernels' way
        self.bias = None if self.packed is None or bias is None else \
            np.ascontiguousarray(bias, np.float32)
        self.prepacked_inputs = (1,) if self.packed is not None else ()
        self.threads = threads_for(ctx)
        self.kernel = gelu_kernel(self.coeffs)
        self.accepts_out = True  # the panels' product (or BLAS's) writes into out

    @property
    def uses_compiled_gemm(self) -> bool:  # read by the session: BLAS held to one thread
        return self.packed is not None

    def __call__(self, A, B, bias=None, *, out=None):
        if self.packed is not None:
            Y = run_packed(self.packed, A, self.threads, bias=self.bias, released=B is None,
                           out=out, gelu_after=self.epilogue)
            if Y is not None:
                return Y
        Y = matmul(A, B, self.threads, out)
        if Y.dtype == np.float32 and Y.flags.c_contiguous and (
                bias is None or (bias.dtype == np.float32 and bias.shape == Y.shape[-1:])):
            return gelu_float32(Y, bias, out=Y, threads=self.threads, kernel=self.kernel,
                                coeffs=self.coeffs)
        x, _ = _owned(Y, bias)
        act = fast_gelu_ if self.epilogue == "fast_gelu" else gelu_
        return act(x).astype(Y.dtype, copy=False)


@op("FastGelu", 1, domain=MS)
class FastGelu:
    """The tanh approximation, float32 in one compiled pass as x / (1 + 2^(x P(x^2))) (its
    exact equal: gelu_polynomial.FAST_GELU_LOGIT; BiasGelu's kernel with that polynomial,
    which a MatMul's epilogue also computes), within float32 rounding of the tanh form."""

    def __init__(self, ctx: KernelContext) -> None:
        self.threads = threads_for(ctx)
        self.kernel = gelu_kernel(FAST_GELU_LOGIT)

    accepts_out = in_place = True  # as Gelu's

    def __call__(self, X, bias=None, *, out=None):
        if X.dtype == np.float32 and (bias is None or (bias.dtype == np.float32 and
                                                       bias.shape == X.shape[-1:])):
            return gelu_float32(np.ascontiguousarray(X), bias, out=_dense_out(out, X),
                                threads=self.threads, kernel=self.kernel,
                                coeffs=FAST_GELU_LOGIT)
        x, _ = _owned(X, bias)
        return fast_gelu_(x).astype(X.dtype, copy=False)


_SILU_COMPILED_MIN = 256  # elements: below, the ctypes call costs more than numpy's passes


@op("QuickGelu", 1, domain=MS)
class QuickGelu:
    """x * sigmoid(alpha x); SiLU (alpha 1) as the optimizer fuses x * Sigmoid(x). float32 in
    one compiled pass where it runs, the result in X's memory order (a channels-last input
    stays channels-last): MLAS's logistic bit for bit (compiled/logistic.py: an LLM's SiLU
    feeds an int8-quantized product, where a last-bit difference grows), else
    compiled/gelu.quick_gelu."""

    def __init__(self, ctx: KernelContext, *, alpha=1.702) -> None:
        self.alpha = float(alpha)
        self.threads = threads_for(ctx)  # float32: ranges on spin.py's workers, from a size
        from ...compiled import gelu, logistic

        self.exact = logistic if logistic.unavailable() is None else None
        # the compiled functions taken now: a module lookup per call costs microseconds
        self.logistic = None if self.exact is None else logistic.function()
        self.compiled = gelu if gelu.silu_unavailable(self.alpha) is None else None
        self.silu = None if self.compiled is None else gelu.silu_function(self.alpha)
        self._orders: dict[tuple, tuple | None] = {}  # (shape, strides) -> dense_order

    accepts_out = True  # the executor's buffer for the output (memory.py)
    streams_out = True  # written once, in order: into a Concat's slice too
    # out may be X's own bytes (memory.py: the convolution output a SiLU alone reads), as
    # the compiled passes allow (each vector stored after it is read); numpy's path writes
    # a fresh array
    in_place = True
    calls_blas = False  # element-wise on every path

    def __call__(self, X, *, out=None):
        if self.exact is not None and X.dtype == np.float32 and X.size:
            if X.flags.c_contiguous and out is None:  # a decode step's: no layout questions
                return self.exact.quick_gelu(X, self.alpha, threads=self.threads,
                                             fn=self.logistic)
            if out is not None and out.strides == X.strides and out.shape == X.shape and \
                    out.dtype == np.float32:
                # the executor's buffer in X's layout (a channels-last convolution's SiLU,
                # often X's own bytes): both flat in the order remembered for that layout,
                # out returned as it is (the generic path's layout work below cost ~15-20 us
                # a call, YOLOv8n-style's 57 SiLUs a run)
                order = self._order(X)
                if order is not None:
                    self.exact.quick_gelu(flat(X, order), self.alpha, flat(out, order),
                                          threads=self.threads, fn=self.logistic)
                    return out
            order = self._order(X)
            if order is not None:
                y = self.exact.quick_gelu(flat(X, order), self.alpha, flat_out(out, X, order),
                                          threads=self.threads, fn=self.logistic)
                return shaped_like(y, X, order)
        if self.compiled is not None and X.dtype == np.float32 and X.size >= _SILU_COMPILED_MIN:
            order = self._order(X)
            if order is not None:
                y = self.compiled.quick_gelu(flat(X, order), self.alpha,
                                             flat_out(out, X, order), threads=self.threads,
                                             fn=self.silu)
                return shaped_like(y, X, order)
        x, cdt = _owned(X)
        s = sigmoid(x * cdt.type(self.alpha))
        s *= x
        return s.astype(X.dtype, copy=False)

    def _order(self, X: np.ndarray) -> tuple | None:
        """dense_order(X), remembered per shape and strides (a run's layouts repeat)."""
        key = (X.shape, X.strides)
        order = self._orders.get(key, False)
        if order is False:
            if len(self._orders) >= 64:
                self._orders.clear()
            order = self._orders[key] = dense_order(X)
        return order


@op("BiasSplitGelu", 1, domain=MS)
def BiasSplitGelu(X, bias):
    x, _ = _owned(X, bias)
    half = x.shape[-1] // 2
    right = gelu_(x[..., half:].copy())
    right *= x[..., :half]
    return right.astype(X.dtype, copy=False)


@op("BiasAdd", 1, domain=MS)
def BiasAdd(X, bias, skip):
    Y = np.add(X, bias)
    Y += skip
    return Y.astype(X.dtype, copy=False)


# -- BiasSoftmax -----------------------------------------------------------------------------


@op("BiasSoftmax", 1, domain=MS)
def BiasSoftmax(data, bias, *, axis=1, is_inner_broadcast):
    """softmax(data + bias) over the dimensions from ``axis`` on. The bias holds whole rows:
    with ``is_inner_broadcast`` they repeat over the inner batch dimensions (bias row
    i // repeat), otherwise over the outer ones (bias row i % rows)."""
    axis = axis + data.ndim if axis < 0 else axis
    rows, width = math.prod(data.shape[:axis]), math.prod(data.shape[axis:])
    cdt = compute_dtype(data.dtype)
    nb = max(bias.size // max(width, 1), 1)
    b = bias.astype(cdt, copy=False).reshape(nb, width)
    x = data.astype(cdt, copy=False)
    if is_inner_broadcast:
        s = x.reshape(nb, rows // nb, width) + b[:, None, :]
    else:
        s = x.reshape(rows // nb, nb, width) + b[None]
    s = s.reshape(rows, width)
    s -= s.max(axis=1, keepdims=True)
    np.exp(s, out=s)
    s /= s.sum(axis=1, keepdims=True)
    return s.reshape(data.shape).astype(data.dtype, copy=False)
