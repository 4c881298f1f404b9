"""What only CuPy can do, each beside the generic kernel it speeds up: erf as a CUDA ufunc and
the GELU family fused into one kernel each (``elementwise``), im2col as one strided copy
(``conv``), convolutions through NVIDIA's cuDNN frontend where it is installed (``cudnn``),
attention with the softmax in place (``attention``), MatMulNBits' weight dequantized in one
kernel (``nbits``), CUDA graph capture into a private memory pool (``graphs``), float GEMMs as
cuBLAS strided-batched calls on a handle of our own that a capture may hold (``blas``)."""

from . import attention, blas, conv, cudnn, elementwise, graphs, nbits

__all__ = ["attention", "blas", "conv", "cudnn", "elementwise", "graphs", "nbits"]
