"""The compiled dynamic quantizer's IR (compiled/quantize.py) on whatever CPU runs the tests.

Its module requires AVX-512 to be used by the kernels, but its IR is made of LLVM's generic
vector operations, which LLVM lowers for any x86-64 CPU: compiled here for the host, it must
give the numpy twin's (``dynamic_quantize``, itself checked against onnxruntime) scale, zero
point and codes bit for bit, NaN and infinities included. On AVX-512 machines
tests/test_compiled_kernels.py checks the module the kernels really use the same way.
"""

from __future__ import annotations

import numpy as np
import pytest

from onnxrun.providers.cpu.compiled import jit, quantize
from onnxrun.providers.cpu.ops.quantization import dynamic_quantize

pytest.importorskip("llvmlite")


@pytest.fixture(scope="module")
def quantize_u8():
    if not jit.enabled():
        pytest.skip("compiled kernels switched off")
    try:
        module = jit.compile_module("quantize_for_this_cpu", quantize.module_ir(),
                                    {"dynamic_quantize_u8": quantize._PROTO}, ())
    except jit.Unavailable as exc:  # e.g. a system refusing executable mappings
        pytest.skip(str(exc))
    return module.dynamic_quantize_u8


_SIZES = [0, 1, 5, 7, 8, 9, 31, 32, 33, 40, 63, 64, 65, 100, 129, 257, 1000]
_FILLS = {"nan": [np.nan], "inf": [np.inf], "-inf": [-np.inf], "zero": [0.0],
          "all": [np.nan, np.inf, -np.inf]}


@pytest.mark.parametrize("fill", list(_FILLS))
@pytest.mark.parametrize("n", _SIZES)
def test_compiled_quantizer_equals_the_numpy_twin(quantize_u8, n, fill):
    rng = np.random.default_rng(n * 7 + len(fill))
    for rate in (0.0, 0.02, 0.2, 0.7, 1.0):
        x = (rng.standard_normal(n) * 3).astype(np.float32)
        hit = rng.random(n) < rate
        x[hit] = rng.choice(_FILLS[fill], int(hit.sum()))
        codes, params = np.empty(n, np.uint8), np.empty(2, np.float32)
        quantize_u8(x.ctypes.data, n, codes.ctypes.data, params.ctypes.data, 1.0)
        y, scale, zp = dynamic_quantize(x)
        np.testing.assert_array_equal(params[0], scale)  # NaN equals NaN here
        assert int(params[1]) == zp
        np.testing.assert_array_equal(codes, (y + zp).astype(np.uint8))
