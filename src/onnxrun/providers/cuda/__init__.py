"""The CUDA execution provider: kernels on the array API (``ops/``), device concerns in
``device.py`` (CuPy on a GPU, array-api-strict's non-default device in CI), CuPy-only fast
paths in ``cupy/``, CUDA graphs in ``graphs.py``, the provider in ``provider.py``.

The provider and its kernel registry are imported on first use: every session asks
``device.available()``, and a CPU session needs nothing else of this package.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {"CUDAExecutionProvider": "provider", "cuda_kernels": "kernels"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


def available() -> bool:
    from . import device

    return device.available()


__all__ = ["CUDAExecutionProvider", "available", "cuda_kernels"]
