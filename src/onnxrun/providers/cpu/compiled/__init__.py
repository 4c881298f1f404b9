"""Compiled kernels for the CPU provider: LLVM IR generated here and compiled for the host CPU
by llvmlite, an optional dependency (``pip install onnxrun[fast]``).

They serve where numpy has no fast path at all (8-bit integer GEMM); every kernel that uses one
keeps its numpy path, taken when llvmlite is missing, the CPU lacks the instructions, or
ONNXRUN_COMPILED_KERNELS=0 is set, and the tests run both paths against the same oracles.
"""

from .jit import Unavailable, disabled, enabled, why_unavailable

__all__ = ["Unavailable", "disabled", "enabled", "why_unavailable"]
