"""CUDA elementwise kernels: what the array API lacks (erf), and the GELU family fused into one
kernel each (the array-API form is five to eight kernels and as many temporaries). float16
is computed in float32 registers."""

from __future__ import annotations

import functools
from typing import Any


def erf(x: Any) -> Any:
    import cupyx.scipy.special

    return cupyx.scipy.special.erf(x)


@functools.cache
def _kernel(name: str, body: str, with_bias: bool) -> Any:
    import cupy

    params = "T x, T b" if with_bias else "T x"
    load = "float v = (float)x + (float)b;" if with_bias else "float v = (float)x;"
    return cupy.ElementwiseKernel(params, "T y", f"{load} y = (T)({body});", name)


_GELU_ERF = "0.5f * v * (1.0f + erff(v * 0.70710678118654752f))"
_GELU_TANH = "0.5f * v * (1.0f + tanhf(0.79788456080286536f * (v + 0.044715f * v * v * v)))"


def fused(x: Any) -> bool:
    """Whether the fused kernels take this array (float32 / float16)."""
    return x.dtype.kind == "f" and x.dtype.itemsize in (2, 4)


def gelu(x: Any, bias: Any = None, approximate: bool = False) -> Any:
    body = _GELU_TANH if approximate else _GELU_ERF
    name = f"onnxrun_{'fast_' if approximate else ''}gelu{'_bias' if bias is not None else ''}"
    kernel = _kernel(name, body, bias is not None)
    return kernel(x) if bias is None else kernel(x, bias.astype(x.dtype, copy=False))
