"""The CUDA execution provider: kernels on the array API (``ops/``), device concerns in
``device.py`` (CuPy on a GPU, array-api-strict's non-default device in CI), CuPy-only fast
paths in ``cupy/``, CUDA graphs in ``graphs.py``, the provider in ``provider.py``.

The provider and its kernel registry are imported on first use: every session asks
``device.available()``, and a CPU session needs nothing else of this package.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import sys
from typing import Any

_LAZY = {"CUDAExecutionProvider": "provider", "cuda_kernels": "kernels"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


@functools.cache
def _cupy_installed() -> bool:
    return "cupy" in sys.modules or importlib.util.find_spec("cupy") is not None


def available() -> bool:
    """Whether the CUDA provider can run: CuPy finds a GPU, or the tests' stand-in device is
    on. Without CuPy, and with ``device.py`` never imported (so no stand-in), the answer is
    known without importing it (~1 ms of every process's first CPU session)."""
    device = sys.modules.get(f"{__name__}.device")
    if device is None:
        if not _cupy_installed():
            return False
        from . import device
    return device.available()


__all__ = ["CUDAExecutionProvider", "available", "cuda_kernels"]
