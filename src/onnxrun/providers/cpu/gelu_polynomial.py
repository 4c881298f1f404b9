"""The polynomial of onnxrun's float32 GELU, shared by the numpy path (``ops/elementwise.py``),
the compiled BiasGelu (``compiled/gelu.py``) and the compiled GEMM's GELU epilogue
(``compiled/float_gemm.py``): one home, so that all three compute the same function.

gelu(x) = x * Phi(x) = x / (1 + exp2(x * P(x^2))): x * P(x^2) approximates
-log2(e) * logit(Phi(x)), P of degree 6 fitted (weighted minimax, the weight being the error's
effect on gelu) on [0, 4.5]. 18 numpy passes where the erf rational function takes 26, and more
accurate: within 6.2e-7 of gelu (one float32 ulp at 4.3) everywhere. Past the fitted range P
keeps falling, so the sigmoid saturates to x or -0 as it should, inf included.
"""

from __future__ import annotations

import numpy as np

# highest degree first (Horner's order)
GELU_LOGIT = [np.float32(c) for c in (
    -5.067239521770909e-09, 3.816313904714506e-07, -1.1439834936046469e-05,
    1.595799463522798e-04, 9.404921154918454e-05, -0.10483512186376989, -2.302209296490995)]

# com.microsoft FastGelu, the tanh form 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), is
# x sigmoid(2 sqrt(2/pi) (x + 0.044715 x^3)) = x / (1 + 2^(x P(x^2))) exactly, with P of degree
# 1: a (1 + 0.044715 t), a = -2 sqrt(2/pi) log2(e). The same kernels compute it.
_A = -2.0 * (2.0 / np.pi) ** 0.5 / np.log(2.0)
FAST_GELU_LOGIT = [np.float32(_A * 0.044715), np.float32(_A)]

# the compiled GEMM's GELU epilogues (float_gemm: ``gelu_after``), by name
EPILOGUES = {"gelu": GELU_LOGIT, "fast_gelu": FAST_GELU_LOGIT}
