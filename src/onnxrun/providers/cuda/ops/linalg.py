"""MatMul, Gemm and com.microsoft's FusedMatMul / FusedGemm. On CuPy, ``array.matmul`` is one
call of cuBLAS's strided-batched GEMM (``cupy/blas.py``, which CUDA graphs can capture)."""

from __future__ import annotations

from typing import Any

from ..array import matmul, namespace
from ..kernels import KernelContext, op, text_attribute
from .activation import make_activation
from .elementwise import _gelu

MS = "com.microsoft"
ONNXRUN = "ai.onnxrun"  # onnxrun's own operators (its layout level's)


@op("MatMul", 1, 9, 13)
def MatMul(A, B):
    return matmul(A, B)


def _t(xp: Any, x: Any) -> Any:
    return xp.matrix_transpose(x)


@op("Gemm", 7, 9, 11, 13)
def Gemm(A, B, C=None, *, alpha=1.0, beta=1.0, transA=0, transB=0):
    xp = namespace(A)
    a = _t(xp, A) if transA else A
    b = _t(xp, B) if transB else B
    y = matmul(a, b)
    if alpha != 1.0:
        y = y * alpha
    if C is not None and beta != 0.0:
        y = y + (C if beta == 1.0 else C * beta)
    return y


@op("FusedGemm", 1, domain=MS)
class FusedGemm:
    def __init__(self, ctx: KernelContext, *, activation="", activation_alpha=None,
                 activation_beta=None, activation_gamma=None, alpha=1.0, beta=1.0, transA=0,
                 transB=0) -> None:
        self.gemm = dict(alpha=alpha, beta=beta, transA=transA, transB=transB)
        self.act = make_activation(activation, activation_alpha, activation_beta,
                                   activation_gamma)

    def __call__(self, A, B, C=None):
        y = Gemm(A, B, C, **self.gemm)
        return y if self.act is None else self.act(y)


@op("MatMulBiasGelu", 1, domain=ONNXRUN)
def MatMulBiasGelu(A, B, bias=None, *, approximate="none"):
    """onnxrun's layout level's MatMul + BiasGelu / Gelu / FastGelu (made for the CPU's GEMM
    epilogue): the product, then the GELU kernel (one fused kernel on CuPy)."""
    return _gelu(matmul(A, B), bias, approximate=text_attribute(approximate) == "tanh")


@op("FusedMatMul", 1, domain=MS)
def FusedMatMul(A, B, *, alpha=1.0, transA=0, transB=0, transBatchA=0, transBatchB=0):
    xp = namespace(A)
    a = _batch_transposed(xp, A, transBatchA, transA)
    b = _batch_transposed(xp, B, transBatchB, transB)
    y = matmul(a, b)
    return y if alpha == 1.0 else y * alpha


def _batch_transposed(xp: Any, x: Any, trans_batch: int, trans: int) -> Any:
    """onnxruntime's FusedMatMul operand: transBatch moves the batch dims after the first
    matrix dim ([b..., m, k] -> [m, b..., k]) before the transpose of the last two."""
    if trans_batch and x.ndim > 2:
        n = x.ndim
        x = xp.permute_dims(x, (*range(1, n - 1), 0, n - 1))
    return xp.matrix_transpose(x) if trans and x.ndim >= 2 else x
