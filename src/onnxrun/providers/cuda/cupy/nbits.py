"""MatMulNBits' weight dequantized in one CUDA kernel (the array-API form in
``ops/quantization.py`` is a dozen kernels and as many temporaries per call): one thread per
element of the (N, K) weight reads its packed field, its block's scale and zero point."""

from __future__ import annotations

import functools
from typing import Any

# zmode: 0 no zero points (2**(bits - 1)), 1 packed uint8 like B, 2 one float per block
_BODY = """
const long long n = i / K, k = i % K;
const long long blk = k / bs, j = k % bs;
const int per = 8 / bits, mask = (1 << bits) - 1;
const unsigned char byte = B[(n * kb + blk) * (bs / per) + j / per];
const float q = (float)((byte >> ((j % per) * bits)) & mask);
float z;
if (zmode == 0) {
    z = (float)(1 << (bits - 1));
} else if (zmode == 1) {
    const unsigned char zb = ZP[n * zrow + blk / per];
    z = (float)((zb >> ((blk % per) * bits)) & mask);
} else {
    z = (float)ZF[n * kb + blk];
}
W = (T)((q - z) * (float)S[n * kb + blk]);
"""


@functools.cache
def _kernel() -> Any:
    import cupy

    return cupy.ElementwiseKernel(
        "raw uint8 B, raw T S, raw uint8 ZP, raw T ZF, int64 K, int64 kb, int64 bs, "
        "int32 bits, int64 zrow, int32 zmode", "T W", _BODY, "onnxrun_nbits_dequantize")


def dequantize(B: Any, scales: Any, zero_points: Any, N: int, K: int, block_size: int,
               bits: int, dtype: Any) -> Any:
    """The (N, K) weight in ``dtype`` (float16 / float32): (q - zp) * scale per block."""
    import cupy

    kb = -(-K // block_size)
    S = cupy.ascontiguousarray(scales, dtype=dtype)
    none_u8 = cupy.zeros(1, cupy.uint8)
    zp, zf, zrow, zmode = none_u8, S, 0, 0
    if zero_points is not None and zero_points.dtype == cupy.uint8:
        zp, zrow, zmode = cupy.ascontiguousarray(zero_points), zero_points.size // N, 1
    elif zero_points is not None:
        zf, zmode = cupy.ascontiguousarray(zero_points, dtype=dtype), 2
    W = cupy.empty((N, K), dtype=dtype)
    _kernel()(cupy.ascontiguousarray(B), S, zp, zf, K, kb, block_size, bits, zrow, zmode, W)
    return W
