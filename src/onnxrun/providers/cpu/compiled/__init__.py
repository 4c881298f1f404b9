"""Compiled kernels for the CPU provider: LLVM IR generated here for a named target CPU level and
compiled by llvmlite, an optional dependency (``pip install onnxrun[fast]``), in a child
process; the object is linked into executable memory by our own loader (x86-64 Linux only).

They serve where numpy has no fast path at all (8-bit integer GEMM); every kernel that uses one
keeps its numpy path, taken when llvmlite is missing, the host is not x86-64 Linux, the
selected target lacks the instructions, or ONNXRUN_COMPILED_KERNELS=0 is set, and the tests
run both paths against the same oracles.

Targets (``targets.TARGETS``, best first): ``avx512vnni`` and ``avx512`` (x86-64-v4: AVX-512
F/BW/CD/DQ/VL, 16 float lanes), ``avxvnni`` and ``avx2`` (x86-64-v3: AVX2, FMA, 8 lanes). The
host gets the best it supports; ``ONNXRUN_COMPILED_TARGET=avx2`` or ``with
compiled.forced_target("avx2"):`` selects another (tests and benchmarks: a host runs the code
of every target below its own).

Writing a kernel module (see int8_gemm.py, depthwise.py)::

    def module_ir(target: jit.Target) -> str:          # LLVM assembly for that target:
        ...                                              # target.lanes, target.has("avxvnni")

    def _module() -> jit.Module:                        # once per process and target
        return jit.compile_module("my_kernel", module_ir, {"fn": PROTO}, REQUIRES)

    # at preparation: the reason it cannot run here, or None
    reason = jit.why_unavailable(REQUIRES) or jit.why_not_loaded("my_kernel", _module)
    fn = _module().fn          # a ctypes function; _module().target: what it was built for

    BUNDLE = {"my_kernel": (module_ir, REQUIRES)}       # and list the file in jit._BUNDLE

``REQUIRES`` lists the features (LLVM's names, e.g. ``("avx512f",)``) the IR needs of the
target; ``()`` where it is written for every target. Whatever the wrapper lays out for the
code (packed panels, vector-width padding) must follow ``module.target`` of the module it
calls, captured at preparation: the target can differ between sessions of one process.
"""

from __future__ import annotations

import importlib
from typing import Any

# jit's names, imported on first use: jit brings the cache, the ELF loader and
# subprocess, which a session whose kernels only need ``layout``'s numpy
# helpers never uses.
_JIT_NAMES = frozenset({"jit", "Target", "Unavailable", "disabled", "enabled", "forced_target",
                        "target", "why_unavailable"})


def _jit() -> Any:
    # by name: ``from . import jit`` would ask this module's __getattr__ for "jit" first
    return importlib.import_module(f"{__name__}.jit")


def __getattr__(name: str) -> Any:
    if name in _JIT_NAMES:
        jit = _jit()
        return jit if name == "jit" else getattr(jit, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def loaded() -> list[str]:
    """The compiled modules this process has loaded, as ``name/target`` (e.g. 'lstm/avx2'):
    which compiled kernels the sessions created so far took (the benchmarks report it)."""
    jit = _jit()
    with jit._lock:
        return sorted(f"{name}/{target}" for name, target in jit._modules)


__all__ = ["Target", "Unavailable", "disabled", "enabled", "forced_target", "loaded", "target",
           "why_unavailable"]
