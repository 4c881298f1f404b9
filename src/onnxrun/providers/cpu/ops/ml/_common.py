"""Helpers shared by the ai.onnx.ml kernels: onnxruntime's score post-transforms and vectorized
key -> value lookups (LabelEncoder, CategoryMapper, OneHotEncoder).

The post-transforms reproduce onnxruntime's ``ml_common.h`` formulas, including its PROBIT, which
is an approximation of the inverse error function (not the exact quantile function).
"""

from __future__ import annotations

import math

import numpy as np

POST_TRANSFORMS = ("NONE", "SOFTMAX", "LOGISTIC", "SOFTMAX_ZERO", "PROBIT")


def check_post_transform(name: str) -> str:
    # onnxruntime maps any unknown name to PROBIT; an explicit error is kinder
    if name not in POST_TRANSFORMS:
        raise ValueError(f"unknown post_transform '{name}'")
    return name


def as_float_input(X: np.ndarray) -> np.ndarray:
    """The float32 view onnxruntime computes with (it casts int and double inputs to float)."""
    if X.dtype == np.float32:
        return X
    if X.dtype.kind not in "fiub":
        raise TypeError(f"unsupported input element type {X.dtype}")
    return X.astype(np.float32)


def rows_2d(X: np.ndarray) -> np.ndarray:
    """[N, F] view of a 1-D (one row) or 2-D input, as the classic ML kernels read it."""
    if X.ndim == 0:
        raise ValueError("Input shape needs to be at least a single dimension.")
    if X.ndim == 1:
        return X.reshape(1, -1)
    if X.ndim > 2:
        return X.reshape(X.shape[0], -1)
    return X


def logistic(x: np.ndarray) -> np.ndarray:
    v = 1.0 / (1.0 + np.exp(-np.abs(x)))
    return np.where(x < 0, 1.0 - v, v)


def _erfinv(x: np.ndarray) -> np.ndarray:
    # onnxruntime's single-precision approximation (Winitzki, a = 0.147)
    x = x.astype(np.float32, copy=False)
    one = np.float32(1)
    sgn = np.where(x < 0, np.float32(-1), one)
    x = (one - x) * (one + x)
    with np.errstate(divide="ignore", invalid="ignore"):
        lg = np.log(x)
        v = np.float32(2 / (np.float32(math.pi) * np.float32(0.147))) + np.float32(0.5) * lg
        v2 = np.float32(1 / np.float32(0.147)) * lg
        v3 = -v + np.sqrt(v * v - v2)
        return sgn * np.sqrt(v3)


def probit(x: np.ndarray) -> np.ndarray:
    x32 = np.asarray(x, dtype=np.float32)
    return np.float32(math.sqrt(2)) * _erfinv(np.float32(2) * x32 - np.float32(1))


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def softmax_zero(x: np.ndarray) -> np.ndarray:
    """Softmax that leaves (near-)zero scores out of the sum, as onnxruntime's SOFTMAX_ZERO."""
    vmax = x.max(axis=1, keepdims=True)
    nz = np.abs(x) > 1e-7
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        e = np.where(nz, np.exp(x - vmax), x * np.exp(-vmax))
        return e / np.where(nz, e, 0).sum(axis=1, keepdims=True)


def transform_scores(S: np.ndarray, post_transform: str) -> np.ndarray:
    """Apply a post-transform row-wise to [N, K] scores with K >= 2 (onnxruntime write_scores)."""
    if post_transform == "NONE" or S.shape[1] == 0:
        return S
    if post_transform == "LOGISTIC":
        return logistic(S)
    if post_transform == "SOFTMAX":
        return softmax(S)
    if post_transform == "SOFTMAX_ZERO":
        return softmax_zero(S)
    return probit(S).astype(S.dtype)


def binary_scores(s: np.ndarray, post_transform: str, mode: np.ndarray | int) -> np.ndarray:
    """Expand one score per row to two columns as onnxruntime does for binary outputs.

    ``mode`` (per row or scalar) is onnxruntime's ``add_second_class``: with LOGISTIC any mode
    >= 0 gives ``[logistic(-s), logistic(s)]``; otherwise 0/1 give ``[1-s, s]`` and 2/3 give
    ``[-s, s]``; -1 writes ``s`` alone (column 1 = 0). PROBIT writes ``probit(s)`` alone.
    """
    n = s.shape[0]
    out = np.zeros((n, 2), dtype=np.float64)
    if post_transform == "PROBIT":
        out[:, 0] = probit(s)
        return out
    mode = np.broadcast_to(np.asarray(mode), (n,))
    single = mode < 0
    if post_transform == "LOGISTIC":
        first, second = logistic(-s), logistic(s)
    else:
        lin = (mode == 0) | (mode == 1)
        first, second = np.where(lin, 1.0 - s, -s), s
    out[:, 0] = np.where(single, s, first)
    out[:, 1] = np.where(single, 0.0, second)
    return out


# -- lookups ----------------------------------------------------------------------------------


def _same(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    eq = a == b
    if a.dtype.kind == "f":
        eq |= np.isnan(a) & np.isnan(b)
    return eq


class Lookup:
    """A vectorized map from keys to values: sorted keys, ``np.searchsorted`` per call.

    ``first_wins`` picks which duplicate key is kept (std::map::emplace keeps the first,
    ``map[key] = value`` the last). ``nan_keys``: a NaN key matches NaN inputs.
    """

    def __init__(self, keys, values, *, first_wins: bool = True, nan_keys: bool = False,
                 key_dtype=None, value_dtype=None) -> None:
        # numpy's str arrays drop trailing NULs, which onnxruntime's std::string keys keep:
        # string keys are matched on those arrays, then checked exactly (see __call__)
        exact = _object_array([str(k) for k in keys]) if key_dtype in (object, str) else None
        keys = _key_array(keys, key_dtype)
        values = np.asarray(values, dtype=value_dtype) if value_dtype is not object else \
            _object_array(values)
        if len(keys) != len(values):
            raise ValueError(
                f"keys and values must have the same length ({len(keys)} != {len(values)})"
            )
        if not first_wins:
            keys, values = keys[::-1], values[::-1]
            exact = exact[::-1] if exact is not None else None
        order = np.argsort(keys, kind="stable")
        keys, values = keys[order], values[order]
        exact = exact[order] if exact is not None else None
        if len(keys) > 1:
            dup = np.zeros(len(keys), dtype=bool)
            dup[1:] = _same(keys[1:], keys[:-1]) if nan_keys or keys.dtype.kind != "f" else \
                keys[1:] == keys[:-1]
            keys, values = keys[~dup], values[~dup]
            exact = exact[~dup] if exact is not None else None
        self.keys = keys
        self.exact = exact
        self.values = values
        self.nan_keys = nan_keys and keys.dtype.kind == "f"

    def __call__(self, X: np.ndarray, default) -> np.ndarray:
        """Values for each element of ``X`` (same shape); ``default`` where no key matches."""
        keys, values = self.keys, self.values
        if keys.dtype.kind == "U":
            Xk = np.asarray(X).astype(str) if X.dtype.kind != "U" else X
        elif keys.dtype.kind == "f":
            Xk = X.astype(keys.dtype, copy=False)
        else:
            Xk = X
        if len(keys) == 0:
            found = np.zeros(X.shape, dtype=bool)
            pos = np.zeros(X.shape, dtype=np.intp)
        else:
            pos = np.minimum(np.searchsorted(keys, Xk), len(keys) - 1)
            found = _same(keys[pos], Xk) if self.nan_keys else keys[pos] == Xk
            if self.exact is not None and X.dtype == object and found.any():
                found[found] = self.exact[pos[found]] == X[found]
        if values.dtype == object:
            out = np.empty(X.shape, dtype=object)
            out[...] = default
            out[found] = values[pos[found]]
            return out
        return np.where(found, values[pos] if len(values) else default, default).astype(
            values.dtype, copy=False)


def _key_array(keys, dtype) -> np.ndarray:
    if dtype is object or dtype is str:
        return np.array([str(k) for k in keys], dtype=str) if len(keys) else np.array([], str)
    return np.asarray(keys, dtype=dtype)


def _object_array(values) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    out[:] = list(values)
    return out


__all__ = [
    "Lookup",
    "as_float_input",
    "binary_scores",
    "check_post_transform",
    "logistic",
    "probit",
    "rows_2d",
    "softmax",
    "softmax_zero",
    "transform_scores",
]
