"""What the CUDA provider's kernels share: the array namespace of a value, ONNX attribute
helpers. Kernels get the namespace from their inputs, so one kernel serves CuPy and the
array-api-strict stand-in alike."""

from __future__ import annotations

from typing import Any

import array_api_compat

_namespaces: dict[type, Any] = {}


def namespace(x: Any) -> Any:
    """The array-API namespace of ``x`` (cached per array type: one dict lookup per call)."""
    xp = _namespaces.get(type(x))
    if xp is None:
        xp = _namespaces[type(x)] = array_api_compat.array_namespace(x)
    return xp


_matmuls: dict[type, Any] = {}


def register_matmul(array_type: type, fn: Any) -> None:
    """A faster ``matmul`` for one array type (CuPy's: cupy/blas.py, which CUDA graphs can
    capture); kernels call ``matmul`` below instead of the namespace's."""
    _matmuls[array_type] = fn


def matmul(a: Any, b: Any) -> Any:
    fn = _matmuls.get(type(a))
    return fn(a, b) if fn is not None else namespace(a).matmul(a, b)


def normalize_axis(axis: int, ndim: int) -> int:
    return axis + ndim if axis < 0 else axis


def is_float(xp: Any, x: Any) -> bool:
    return xp.isdtype(x.dtype, "real floating")
