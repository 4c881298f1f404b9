"""Matrix products: MatMul, Gemm, Einsum."""

from __future__ import annotations

import numpy as np

from ..kernels import KernelContext, op
from .conv import compute_dtype


def matmul(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """numpy matmul, with a stack of rows times one matrix done as a single GEMM (a strided
    stack is gathered first: one copy costs less than a GEMM call per matrix of the stack)."""
    if B.ndim == 2 and A.ndim > 2 and A.size:
        Y = np.dot(A.reshape(-1, A.shape[-1]), B)
        return Y.reshape(A.shape[:-1] + (B.shape[1],))
    return np.matmul(A, B)


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

    def __call__(self, A, B):
        cdt = compute_dtype(A.dtype)
        if cdt != A.dtype:
            Bc = self.B if self.B is not None else B.astype(cdt)
            return matmul(A.astype(cdt), Bc).astype(A.dtype)
        return matmul(A, B)


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
        self.B = None  # prepared B (alpha folded in), when B is a constant that needs it
        B = ctx.constant(1)
        if B is not None and _floating(B):
            cdt = compute_dtype(B.dtype)
            if self.alpha != 1.0:
                self.B = B.astype(cdt) * cdt.type(self.alpha)
            elif cdt != B.dtype:
                self.B = B.astype(cdt)
        self.C = None
        C = ctx.constant(2)
        if C is not None and _floating(C):
            cdt = compute_dtype(C.dtype)
            self.C = (C.astype(cdt) * cdt.type(self.beta)) if self.beta != 1.0 else C.astype(cdt)

    def __call__(self, A, B, C=None):
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
        Y = np.dot(Am, B.T if self.transB else B)
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
