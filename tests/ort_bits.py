"""Comparisons with onnxruntime's MLAS kernels to the bit, on the hosts where that is defined.

onnxrun's exact kernels (MatMulNBits at accuracy_level 4, GroupQueryAttention, Sigmoid /
QuickGelu) follow the operation order of MLAS's AVX2 / FMA3 kernels. On a host with AVX-512,
MLAS dispatches its AVX-512 kernels instead (16 lanes: other summation orders), whose last bits
those kernels do not reproduce: there the comparison is to a tolerance, and says so."""

from __future__ import annotations

import numpy as np

from onnxrun.providers.cpu.compiled.targets import host_features

MLAS_TAKES_AVX2 = "avx512f" not in host_features()


def assert_ort_bits(got, want, *, rtol: float = 1e-4, err: str = "") -> None:
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype, (err, got.shape, want.shape)
    if MLAS_TAKES_AVX2:
        ours, theirs = got.tobytes(), want.tobytes()
        if ours != theirs:
            differ = np.count_nonzero(np.frombuffer(ours, np.uint8)
                                      != np.frombuffer(theirs, np.uint8))
            raise AssertionError(f"{err}: {differ} bytes differ from onnxruntime's "
                                 f"(max {np.abs(got - want).max():.3g})")
    else:
        scale = float(np.nanmax(np.abs(want))) if want.size else 0.0
        np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * scale, equal_nan=True,
                                   err_msg=f"{err} (AVX-512 host: MLAS's other kernels)")
