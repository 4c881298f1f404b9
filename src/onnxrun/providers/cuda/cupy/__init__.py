"""What only CuPy can do, each beside the generic kernel it speeds up: erf as a CUDA ufunc and
the GELU family fused into one kernel each (``elementwise``), im2col as one strided copy
(``conv``), convolutions through NVIDIA's cuDNN frontend where it is installed (``cudnn``),
attention with the softmax in place (``attention``), MatMulNBits' weight dequantized in one
kernel (``nbits``), CUDA graph capture into a private memory pool (``graphs``). GEMMs need no
module of their own: ``matmul`` of batched CuPy arrays is cuBLAS's strided-batched GEMM."""

from . import attention, conv, cudnn, elementwise, graphs, nbits

__all__ = ["attention", "conv", "cudnn", "elementwise", "graphs", "nbits"]
