"""The CUDA provider's kernels by operator family, written on the array-API namespace of their
inputs (CuPy, or array-api-strict in CI); what only CuPy can do lives in ``../cupy/``."""
