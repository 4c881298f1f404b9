"""Matrix products: MatMul, Gemm, Einsum."""

from __future__ import annotations

import numpy as np

from ....dtypes import compute_dtype
from .. import blas
from ..kernels import KernelContext, op
from ..parallel import threads_for

# Products with fewer rows than this stay on BLAS: one row is a GEMV, which BLAS runs bound by
# memory while the compiled 1-row tile waits on its two accumulators (1.2-9x slower); from 2
# rows up the compiled kernel was faster than OpenBLAS (which packs B at every call) on
# K x N = 384x384, 768x768, 768x3072, up to 32 rows and even beyond (docs/PERFORMANCE.md,
# "Compiled float32 GEMM"). Measured on the AVX2 EPYC.
COMPILED_MIN_ROWS = 2


def packed_weights(B: np.ndarray | None):
    """``compiled.float_gemm.pack`` (imported on first use: the compiled machinery stays
    unloaded in sessions without constant float32 weights)."""
    from ..compiled.float_gemm import pack

    return pack(B)


def run_packed(packed, A: np.ndarray, threads: int, bias=None, bounds=None,
               released: bool = False, out: np.ndarray | None = None,
               gelu_after: str | None = None) -> np.ndarray | None:
    """A @ B (+ bias, clipped; then the GELU ``gelu_after`` names: "gelu", "fast_gelu")
    through ``packed`` for a float32 A (..., K): the result, or None where BLAS should take it
    (too few rows, another dtype or width). ``released``: the session no longer holds B
    (``prepacked_inputs``), so every product goes through the panels, a single row too, and
    an A that does not fit them is an error here. ``out``: the executor's buffer (memory.py),
    written when it is a float32 (..., N) of rows."""
    if A.dtype != np.float32 or A.ndim < 1 or A.shape[-1] != packed.K:
        if released:
            raise ValueError(f"A of {A.dtype} {list(A.shape)} does not fit the float32 "
                             f"weight [{packed.K}, {packed.N}] (last dimension {packed.K})")
        return None
    rows = A.size // packed.K if packed.K else 0
    if rows < COMPILED_MIN_ROWS and not released:
        return None
    shape = A.shape[:-1] + (packed.N,)
    given = _rows(out, shape, rows)
    Y = packed.run(A.reshape(rows, packed.K), bias=bias, bounds=bounds, threads=threads,
                   out=given, gelu_after=gelu_after)
    return Y.reshape(shape) if given is None else out


def _rows(out: np.ndarray | None, shape: tuple[int, ...], rows: int) -> np.ndarray | None:
    """``out`` seen as the (rows, N) float32 matrix of rows a GEMM writes, or None where it
    is not one (another shape or dtype, or rows only a copy could make)."""
    if out is None or out.shape != shape or out.dtype != np.float32 or out.ndim < 1:
        return None
    view = out.view()
    try:
        view.shape = (rows, shape[-1])  # raises where only a copy has that shape
    except AttributeError:
        return None
    if shape[-1] > 1 and view.strides[1] != 4 or rows > 1 and (
            view.strides[0] % 4 or view.strides[0] < 4 * shape[-1]):
        return None
    return view


def gemm_packed(gemm, A: np.ndarray, B, bounds=None, out: np.ndarray | None = None,
                gelu_after: str | None = None) -> np.ndarray | None:
    """A Gemm's / FusedGemm's product on its panels (``gemm.packed``; run_packed's answer;
    then the GELU ``gelu_after`` names), through ``gemm.prepared`` (PackedMatrix.prepared: the
    argument block built once) when A has the shape of the last product that ran there: a
    streaming model calls its small Gemm with one shape every time, where run_packed's checks
    cost more than the product."""
    prepared = gemm.prepared
    if prepared is not None and A.shape == prepared.shape and A.dtype == np.float32 and \
            A.flags.c_contiguous:  # made only without transA
        return prepared(A) if out is None else prepared(A, out)
    Y = run_packed(gemm.packed, gemm_operand(A, gemm.transA, B), gemm.threads,
                   gemm.packed_bias, bounds, released=B is None, out=out, gelu_after=gelu_after)
    if Y is not None and not gemm.transA and A.flags.c_contiguous:
        gemm.prepared = gemm.packed.prepared(A.shape[0], gemm.packed_bias, bounds,
                                             gemm.threads, gelu_after=gelu_after)
    return Y


def matmul(A: np.ndarray, B: np.ndarray, threads: int = 1,
           out: np.ndarray | None = None, alpha: float = 1.0) -> np.ndarray:
    """alpha * (A @ B) as numpy's matmul (alpha applied to each sum), with a stack of rows
    times one matrix done as a single GEMM (a strided stack is gathered first: one copy costs
    less than a GEMM call per matrix of the stack) and a float32 stack of matrices on
    compiled.batched_gemm. ``out``: the executor's buffer (memory.py), written where it has
    the product's shape and dtype (and, for the single GEMM, rows a view can make); else a
    fresh array."""
    if out is not None and (A.ndim < 2 or B.ndim < 2 or out.dtype != np.result_type(A, B) or
                            out.shape[-2:] != (A.shape[-2], B.shape[-1]) or
                            out.shape[:-2] != np.broadcast_shapes(A.shape[:-2], B.shape[:-2])):
        out = None
    if threads > 1 and B.ndim > 2 and blas.one_thread and A.dtype == np.float32 and \
            B.dtype == np.float32 and blas.matmul_function(np.float32) is np.matmul:
        # a stack of products (attention's q k^T, p v) split over the intra-op threads, where
        # worth two of the kernel's ranges: on one thread numpy's loop of BLAS calls is as
        # fast (~15 us less a call to set up). (Not Pyodide's products.)
        from ..compiled import batched_gemm

        if A.size * B.shape[-1] >= 2 * batched_gemm.SPLIT_MACS:
            Y = batched_gemm.matmul(A, B, out, alpha, threads)
            if Y is not None:
                return Y
    if B.ndim == 2 and A.ndim > 2 and A.size:
        rows = A.size // A.shape[-1]
        given = None if out is None else _rows(out, out.shape, rows)
        Y = blas.matmul(A.reshape(-1, A.shape[-1]), B, out=given, threads=threads)
        Y = Y.reshape(A.shape[:-1] + (B.shape[1],)) if given is None else out
    else:
        Y = blas.matmul(A, B, out=out, threads=threads)
    if alpha != 1.0:
        Y = np.asarray(Y)
        np.multiply(Y, Y.dtype.type(alpha), out=Y)
    return Y


def _floating(x: np.ndarray) -> bool:
    return x.dtype.kind == "f" or compute_dtype(x.dtype) != x.dtype


@op("MatMul", 1, 9, 13)
class MatMul:
    """No BLAS for 16-bit floats: float32 product, cast back; a constant B is widened once."""

    def __init__(self, ctx: KernelContext) -> None:
        B = ctx.constant(1)
        self.B = None
        if B is not None and compute_dtype(B.dtype) != B.dtype:
            self.B = B.astype(compute_dtype(B.dtype))
        self.packed = packed_weights(B)  # the compiled GEMM's panels of a float32 constant B
        # the panels replace B: the session drops its own copy (plan.py; B arrives as None)
        self.prepacked_inputs = (1,) if self.packed is not None else ()
        self.threads = threads_for(ctx)
        # the executor's buffer for the product (memory.py): the panels' or BLAS's; a 16-bit
        # float product (computed in float32) returns its own array, which the memory
        # pattern's probe sees and leaves out
        self.accepts_out = True

    @property
    def uses_compiled_gemm(self) -> bool:  # read by profiles and tests
        return self.packed is not None

    def __call__(self, A, B, *, out=None):
        if self.packed is not None:
            Y = run_packed(self.packed, A, self.threads, released=B is None, out=out)
            if Y is not None:
                return Y
        cdt = compute_dtype(A.dtype)
        if cdt != A.dtype:
            Bc = self.B if self.B is not None else B.astype(cdt)
            return matmul(A.astype(cdt), Bc, self.threads).astype(A.dtype)
        return matmul(A, B, self.threads, out)


def packed_gemm(ctx: KernelContext, alpha: float, beta: float, transB: bool):
    """(panels, bias) of a Gemm / FusedGemm whose B is a constant float32 matrix and whose C
    is absent or a constant row (N,) / (1, N) / scalar, folded into the compiled GEMM's
    bias; (None, None) otherwise (or where that kernel does not run)."""
    B, C = ctx.constant(1), ctx.constant(2)
    if B is None or B.ndim != 2 or B.dtype != np.float32 or \
            (ctx.has_input(2) and (C is None or C.dtype != np.float32)):
        return None, None
    N = B.shape[0] if transB else B.shape[1]
    bias = None
    if C is not None and beta != 0.0:
        if C.size not in (1, N) or C.ndim > 2 or (C.ndim == 2 and C.shape[0] != 1):
            return None, None
        bias = np.ascontiguousarray(np.broadcast_to(C.reshape(-1), (N,)) * np.float32(beta),
                                    np.float32)
    Bm = B.T if transB else B
    if alpha != 1.0:
        Bm = Bm * np.float32(alpha)
    packed = packed_weights(np.asarray(Bm, np.float32))
    return (packed, bias) if packed is not None else (None, None)


def gemm_operand(A: np.ndarray, transA: bool, B) -> np.ndarray:
    """op(A) of a Gemm on packed weights; without B (released) A must be a matrix."""
    if A.ndim != 2:
        raise ValueError(f"Gemm: A must be 2-D, got shape {list(A.shape)}")
    return A.T if transA else A


@op("Gemm", 1, 6, 7, 9, 11, 13)
class Gemm:
    """Y = alpha * A' @ B' + beta * C. Transposes are BLAS flags, never copies; a constant B
    is scaled by alpha (or widened from 16-bit floats) once, and a constant C by beta."""

    def __init__(self, ctx: KernelContext, *, alpha=1.0, beta=1.0, transA=0, transB=0,
                 broadcast=0) -> None:
        self.alpha = float(alpha)
        self.beta = float(beta)
        self.transA = bool(transA)
        self.transB = bool(transB)
        self.threads = threads_for(ctx)
        # the compiled GEMM: alpha and op(B) in its panels, a constant row C its bias
        self.packed, self.packed_bias = packed_gemm(ctx, self.alpha, self.beta, self.transB)
        # the panels (alpha folded in) and their bias (beta * C) replace B and C
        self.prepacked_inputs = (1, 2) if self.packed is not None else ()
        self.prepared = None  # the panels' product for one shape of A (gemm_packed)
        self.B = None  # prepared B (alpha folded in), when B is a constant that needs it
        B = ctx.constant(1)
        if B is not None and _floating(B) and self.packed is None:
            cdt = compute_dtype(B.dtype)
            if self.alpha != 1.0:
                self.B = B.astype(cdt) * cdt.type(self.alpha)
            elif cdt != B.dtype:
                self.B = B.astype(cdt)
        self.C = None
        C = ctx.constant(2)
        if C is not None and _floating(C) and self.packed is None:
            cdt = compute_dtype(C.dtype)
            self.C = (C.astype(cdt) * cdt.type(self.beta)) if self.beta != 1.0 else C.astype(cdt)
        self.accepts_out = self.packed is not None  # the panels' product writes into out

    @property
    def uses_compiled_gemm(self) -> bool:
        return self.packed is not None

    def __call__(self, A, B, C=None, *, out=None):
        if self.packed is not None and (A.ndim == 2 or B is None):
            Y = gemm_packed(self, A, B, out=out)
            if Y is not None:
                return Y
        out_dtype = A.dtype
        cdt = compute_dtype(A.dtype)
        Am = A.T if self.transA else A
        if cdt != A.dtype:
            Am = Am.astype(cdt)
        scaled = self.alpha == 1.0
        if self.B is not None:
            B, scaled = self.B, True
        elif cdt != B.dtype:
            B = B.astype(cdt)
        Bm = B.T if self.transB else B
        Y = blas.matmul(Am, Bm, threads=self.threads) if Am.ndim == 2 and Bm.ndim == 2 \
            else np.dot(Am, Bm)
        integral = Y.dtype.kind in "iu"
        if not scaled:
            if integral:
                Y = (Y * self.alpha).astype(Y.dtype)
            else:
                Y *= cdt.type(self.alpha)
        if C is not None and self.beta != 0.0:
            if self.C is not None:
                Cm = self.C
            elif integral:
                Cm = (C * self.beta).astype(Y.dtype) if self.beta != 1.0 else C
            else:
                Cm = C.astype(cdt, copy=False)
                if self.beta != 1.0:
                    Cm = Cm * cdt.type(self.beta)
            if np.broadcast_shapes(Cm.shape, Y.shape) == Y.shape:
                Y += Cm
            else:
                Y = Y + Cm
        return Y if Y.dtype == out_dtype else Y.astype(out_dtype)


@op("Einsum", 12)
def Einsum(*Inputs, equation):
    eq = (equation.decode() if isinstance(equation, bytes) else str(equation)).replace(" ", "")
    dtype = Inputs[0].dtype if Inputs else None
    cdt = compute_dtype(dtype)
    if cdt != dtype:
        Inputs = tuple(x.astype(cdt) for x in Inputs)
    Y = np.einsum(eq, *Inputs, optimize=True)
    Y = np.asarray(Y)
    return Y if Y.dtype == dtype else Y.astype(dtype)
