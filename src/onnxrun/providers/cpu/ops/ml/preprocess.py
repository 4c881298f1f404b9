"""Feature preprocessing operators of ai.onnx.ml: Scaler, Normalizer, Binarizer, Imputer,
OneHotEncoder, LabelEncoder (1, 2, 4), CategoryMapper, ArrayFeatureExtractor, DictVectorizer,
FeatureVectorizer and CastMap.

Key lookups (encoders, mappers) use sorted keys and ``np.searchsorted`` (see ``Lookup``); the
arithmetic follows onnxruntime's element types (most outputs are float32).
"""

from __future__ import annotations

import math

import numpy as np

from .....dtypes import np_dtype
from ...indices import as_intp
from ...kernels import KernelContext, op
from ._common import Lookup

# -- arithmetic ---------------------------------------------------------------------------------


def _per_feature(X: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Broadcast per-feature attribute values the way onnxruntime indexes them: element i of
    the flattened input uses ``values[i % stride]`` with stride = dims[1] (dims[0] for 1-D)."""
    if X.ndim <= 2 or values.size == 1:
        return values
    stride = X.shape[1]
    return values[np.arange(X.size) % stride].reshape(X.shape)


@op("Scaler", 1, domain="ai.onnx.ml")
class Scaler:
    def __init__(self, ctx: KernelContext, *, offset=None, scale=None):
        scale = list(scale or [])
        offset = list(offset or [])
        if not scale:
            raise ValueError("Empty scale in attributes")
        if len(scale) != len(offset):
            raise ValueError(f"Scale size: ({len(scale)}) != ({len(offset)})")
        self.scale = np.asarray(scale, dtype=np.float32)
        self.offset = np.asarray(offset, dtype=np.float32)

    def __call__(self, X):
        if X.ndim == 0:
            raise ValueError("Invalid argument: input has empty dimensions.")
        stride = X.shape[0] if X.ndim == 1 else X.shape[1]
        if len(self.scale) not in (1, stride):
            raise ValueError(
                f"Either both scale and offset can be of feature size ({stride}) or 1"
            )
        # (x - offset) * scale in the input's arithmetic: double stays double, the rest float
        dt = np.float64 if X.dtype == np.float64 else np.float32
        Xc = X.astype(dt, copy=False)
        off = _per_feature(Xc, self.offset.astype(dt))
        sc = _per_feature(Xc, self.scale.astype(dt))
        return ((Xc - off) * sc).astype(np.float32, copy=False)


@op("Normalizer", 1, domain="ai.onnx.ml")
def Normalizer(X, *, norm="MAX"):
    if norm not in ("MAX", "L1", "L2"):
        raise ValueError(f"Invalid normalize value of {norm}")
    if X.ndim > 2:
        raise ValueError(f"Rank of input to Normalizer must be at most 2. Got {X.ndim}")
    axis = 1 if X.ndim > 1 else 0
    Xf = X.astype(np.float32)
    if norm == "MAX":
        d = Xf.max(axis=axis, keepdims=True) if X.size else Xf
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(d != 0, Xf / d, Xf).astype(np.float32)
    if norm == "L1":
        d = np.abs(X).astype(np.float32).sum(axis=axis, keepdims=True)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(d != 0, Xf / d, Xf).astype(np.float32)
    sq = (X * X).astype(np.float32)
    d = sq.sum(axis=axis, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.sqrt(sq / d)
        return np.where(d != 0, np.where(X < 0, -r, r), Xf).astype(np.float32)


@op("Binarizer", 1, domain="ai.onnx.ml")
def Binarizer(X, *, threshold=0.0):
    if X.dtype.kind == "f" and np.isnan(X).any():
        i = int(np.flatnonzero(np.isnan(X.reshape(-1)))[0])
        raise ValueError(f"Input data with index: {i} is NaN")
    t = np.float32(threshold)
    return (X > (t if X.dtype.kind == "f" else np.float64(t))).astype(X.dtype)


@op("Imputer", 1, domain="ai.onnx.ml")
class Imputer:
    def __init__(self, ctx: KernelContext, *, imputed_value_floats=None,
                 imputed_value_int64s=None, replaced_value_float=0.0, replaced_value_int64=0):
        floats = list(imputed_value_floats or [])
        ints = list(imputed_value_int64s or [])
        if bool(floats) == bool(ints):
            raise ValueError(
                "Must provide imputed_values_float_ or imputed_values_int64_ but not both."
            )
        self.floats = np.asarray(floats, dtype=np.float32)
        self.ints = np.asarray(ints, dtype=np.int64)
        self.replaced_float = np.float32(replaced_value_float)
        self.replaced_int = np.int64(replaced_value_int64)

    def __call__(self, X):
        if X.ndim == 0:
            raise ValueError("Empty input dimensions.")
        if X.dtype.kind == "f":
            values, replaced = self.floats, self.replaced_float
        elif X.dtype.kind in "iu":
            values, replaced = self.ints, self.replaced_int
        else:
            raise TypeError(f"Invalid type {X.dtype}")
        if values.size == 0:
            raise ValueError("Empty value of imputed values.")
        stride = X.shape[0] if X.ndim == 1 else X.shape[1]
        fill = _per_feature(X, values.astype(X.dtype)) if values.size == stride else \
            values[0].astype(X.dtype)
        if X.dtype.kind == "f":
            rep = X.dtype.type(replaced)
            hit = np.isnan(X) if np.isnan(replaced) else X == rep
        else:
            hit = X == replaced
        return np.where(hit, fill, X).astype(X.dtype, copy=False)


# -- encoders -----------------------------------------------------------------------------------


@op("OneHotEncoder", 1, domain="ai.onnx.ml")
class OneHotEncoder:
    def __init__(self, ctx: KernelContext, *, cats_int64s=None, cats_strings=None, zeros=1):
        ints = list(cats_int64s or [])
        strings = list(cats_strings or [])
        if ints and strings:
            raise ValueError("One and only one of the 'cats_*' attributes must be defined")
        self.n = len(ints) or len(strings)
        if self.n == 0:
            raise ValueError("OneHotEncoder needs cats_int64s or cats_strings")
        self.zeros = bool(zeros)
        self.strings = bool(strings)
        # onnxruntime fills a map with map[cat] = index: the last duplicate wins
        keys = strings if strings else ints
        self.lookup = Lookup(keys, np.arange(self.n), first_wins=False,
                             key_dtype=str if strings else np.int64, value_dtype=np.int64)

    def __call__(self, X):
        if (X.dtype == object) != self.strings:
            idx = np.full(X.shape, -1, dtype=np.int64)  # the other kind of categories: no match
        elif X.dtype == object:
            idx = self.lookup(X, -1)
        else:
            with np.errstate(invalid="ignore"):
                idx = self.lookup(X.astype(np.int64), -1)
        found = idx >= 0
        if not self.zeros and not found.all():
            raise ValueError("Unknown Category and zeros = 0.")
        out = np.zeros((idx.size, self.n), dtype=np.float32)
        rows = np.flatnonzero(found.reshape(-1))
        out[rows, idx.reshape(-1)[rows]] = 1.0
        return out.reshape(X.shape + (self.n,))


def _is_string(X: np.ndarray) -> bool:
    return X.dtype == object or X.dtype.kind in "US"


@op("LabelEncoder", 1, domain="ai.onnx.ml")
class LabelEncoder1:
    def __init__(self, ctx: KernelContext, *, classes_strings=None, default_int64=-1,
                 default_string="_Unused"):
        classes = list(classes_strings or [])
        n = len(classes)
        self.to_int = Lookup(classes, np.arange(n), first_wins=False, key_dtype=str,
                             value_dtype=np.int64)
        self.to_str = Lookup(np.arange(n), classes, key_dtype=np.int64, value_dtype=object)
        self.default_int = default_int64
        self.default_str = default_string

    def __call__(self, X):
        if _is_string(X):
            return self.to_int(X, self.default_int)
        return self.to_str(X.astype(np.int64, copy=False), self.default_str)


_KINDS = {"floats": np.float32, "int64s": np.int64, "strings": object}


def _encoder_side(attrs: dict, prefix: str, tensor):
    """(values, dtype) of the keys or values side of a LabelEncoder, whichever attribute holds
    them (the *_floats / *_int64s / *_strings lists or the *_tensor of version 4)."""
    given = [(k, attrs[f"{prefix}_{k}"]) for k in _KINDS if attrs.get(f"{prefix}_{k}")]
    if tensor is not None:
        given.append(("tensor", tensor))
    if len(given) != 1:
        raise ValueError(f"LabelEncoder needs exactly one {prefix}_* attribute")
    kind, values = given[0]
    if kind == "tensor":
        arr = np.asarray(values).reshape(-1)
        dtype = object if arr.dtype == object else arr.dtype
        return list(arr), np.dtype(dtype)
    return list(values), np.dtype(_KINDS[kind])


class _LabelEncoder:
    def __init__(self, attrs: dict, keys_tensor=None, values_tensor=None, default_tensor=None,
                 nan_keys=False):
        keys, self.key_dtype = _encoder_side(attrs, "keys", keys_tensor)
        values, self.value_dtype = _encoder_side(attrs, "values", values_tensor)
        if len(keys) != len(values):
            raise ValueError("Keys and values must have the same length.")
        vd = self.value_dtype
        if default_tensor is not None and np.asarray(default_tensor).size:
            d = np.asarray(default_tensor).reshape(-1)
            if d.size != 1:
                raise ValueError("default_tensor must have exactly one element")
            default = d[0]
        elif vd.kind == "O":
            default = attrs["default_string"]
        elif vd.kind == "f":
            default = attrs["default_float"]
        else:
            default = attrs["default_int64"]
        self.default = default if vd.kind == "O" else vd.type(default)
        kd = str if self.key_dtype.kind == "O" else self.key_dtype
        self.lookup = Lookup(keys, values, first_wins=True, nan_keys=nan_keys, key_dtype=kd,
                             value_dtype=object if vd.kind == "O" else vd)

    def __call__(self, X):
        if (self.key_dtype.kind == "O") != _is_string(X):
            raise TypeError(
                f"LabelEncoder keys are {self.key_dtype} but the input is {X.dtype}"
            )
        return self.lookup(X, self.default)


@op("LabelEncoder", 2, domain="ai.onnx.ml")
class LabelEncoder2(_LabelEncoder):
    def __init__(self, ctx: KernelContext, *, default_float=-0.0, default_int64=-1,
                 default_string="_Unused", keys_floats=None, keys_int64s=None, keys_strings=None,
                 values_floats=None, values_int64s=None, values_strings=None):
        super().__init__(dict(locals()))


@op("LabelEncoder", 4, domain="ai.onnx.ml")
class LabelEncoder4(_LabelEncoder):
    def __init__(self, ctx: KernelContext, *, default_float=-0.0, default_int64=-1,
                 default_string="_Unused", default_tensor=None, keys_floats=None,
                 keys_int64s=None, keys_strings=None, keys_tensor=None, values_floats=None,
                 values_int64s=None, values_strings=None, values_tensor=None):
        super().__init__(dict(locals()), keys_tensor, values_tensor, default_tensor,
                         nan_keys=True)


@op("CategoryMapper", 1, domain="ai.onnx.ml")
class CategoryMapper:
    def __init__(self, ctx: KernelContext, *, cats_int64s=None, cats_strings=None,
                 default_int64=-1, default_string="_Unused"):
        ints = list(cats_int64s or [])
        strings = list(cats_strings or [])
        if len(ints) != len(strings):
            raise ValueError("cats_int64s and cats_strings must have the same length")
        # onnxruntime fills both maps with map[key] = value: the last duplicate wins
        self.to_int = Lookup(strings, ints, first_wins=False, key_dtype=str,
                             value_dtype=np.int64)
        self.to_str = Lookup(ints, strings, first_wins=False, key_dtype=np.int64,
                             value_dtype=object)
        self.default_int = default_int64
        self.default_str = default_string

    def __call__(self, X):
        if _is_string(X):
            return self.to_int(X, self.default_int)
        return self.to_str(X.astype(np.int64, copy=False), self.default_str)


# -- feature assembly ---------------------------------------------------------------------------


@op("ArrayFeatureExtractor", 1, domain="ai.onnx.ml")
def ArrayFeatureExtractor(X, Y):
    if X.ndim == 0:
        raise ValueError("Invalid argument: X input has empty dimensions.")
    idx = np.asarray(Y, dtype=np.int64).reshape(-1)
    if idx.size == 0:
        raise ValueError("Invalid Y argument: num_indices = 0")
    stride = X.shape[-1]
    bad = (idx >= stride) | (idx < 0)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise IndexError(f"Invalid Y argument: index is out of range: Y[{i}] ({idx[i]}) >={stride}")
    Z = np.take(X, as_intp(idx), axis=-1)
    return Z.reshape(1, -1) if X.ndim == 1 else Z


@op("FeatureVectorizer", 1, domain="ai.onnx.ml")
def FeatureVectorizer(*X, inputdimensions=()):
    dims = list(inputdimensions or [])
    if len(X) != len(dims):
        raise ValueError(
            f"Number of inputs ({len(X)}) does not match number of inputdimensions values "
            f"({len(dims)})."
        )
    N = 1 if X[0].ndim <= 1 else X[0].shape[0]
    out = np.zeros((N, sum(dims)), dtype=np.float32)
    offset = 0
    for x, size in zip(X, dims, strict=True):
        rows = x.reshape(1, -1) if x.ndim <= 1 else \
            x.reshape(x.shape[0], math.prod(x.shape[1:]))  # an empty batch too
        if rows.shape[0] != N:
            raise ValueError("all FeatureVectorizer inputs must have the same batch size")
        width = min(rows.shape[1], size)  # extra features are dropped, missing ones are 0
        out[:, offset:offset + width] = rows[:, :width]
        offset += size
    return out


def _map_value_dtype(ctx: KernelContext) -> np.dtype | None:
    tp = ctx.input_type(0)
    if tp is None or tp.WhichOneof("value") != "map_type":
        return None
    vt = tp.map_type.value_type
    if vt.WhichOneof("value") != "tensor_type" or not vt.tensor_type.elem_type:
        return None
    return np.dtype(np_dtype(vt.tensor_type.elem_type))


def _map_arrays(X, key_dtype) -> tuple[np.ndarray, list]:
    if not isinstance(X, dict):
        raise TypeError(f"expected a map (dict) input, got {type(X).__name__}")
    keys = list(X.keys())
    if key_dtype is str:
        k = np.array([str(x) for x in keys], dtype=str) if keys else np.zeros(0, dtype=str)
    else:
        k = np.asarray(keys, dtype=np.int64).reshape(-1)
    return k, list(X.values())


@op("DictVectorizer", 1, domain="ai.onnx.ml")
class DictVectorizer:
    def __init__(self, ctx: KernelContext, *, int64_vocabulary=None, string_vocabulary=None):
        ints = list(int64_vocabulary or [])
        strings = list(string_vocabulary or [])
        if bool(ints) == bool(strings):
            raise ValueError("exactly one of int64_vocabulary and string_vocabulary must be set")
        self.key_dtype = str if strings else np.int64
        self.vocabulary = np.array(strings, dtype=str) if strings else np.array(ints, np.int64)
        self.value_dtype = _map_value_dtype(ctx)

    def __call__(self, X):
        keys, values = _map_arrays(X, self.key_dtype)
        dt = self.value_dtype
        if dt is None:
            dt = np.asarray(values).dtype if values else np.dtype(np.float32)
            dt = np.dtype(object) if dt.kind in "UO" else dt
        vals = np.empty(len(values), dtype=dt)
        vals[:] = values
        # vocabulary entries missing from the map are 0 (the type's default value)
        zero = "" if dt.kind == "O" else dt.type(0)
        lookup = Lookup(keys, vals, key_dtype=self.key_dtype,
                        value_dtype=object if dt.kind == "O" else dt)
        return lookup(self.vocabulary, zero).reshape(1, -1)


_CAST_TO = {"TO_FLOAT": np.float32, "TO_INT64": np.int64, "TO_STRING": object}


@op("CastMap", 1, domain="ai.onnx.ml")
class CastMap:
    def __init__(self, ctx: KernelContext, *, cast_to="TO_FLOAT", map_form="DENSE", max_map=1):
        if cast_to not in _CAST_TO:
            raise ValueError(
                f"Invalid CAST_TO value of {cast_to} Expected TO_FLOAT, TO_STRING or TO_INT64"
            )
        if map_form not in ("DENSE", "SPARSE"):
            raise ValueError(f"Invalid PACK_MAP value of {map_form} Expected DENSE or SPARSE")
        self.cast_to = cast_to
        self.dense = map_form == "DENSE"
        self.max_map = int(max_map)

    def _cast(self, values: list) -> np.ndarray:
        strings = bool(values) and isinstance(values[0], str)
        if self.cast_to == "TO_STRING":
            out = np.empty(len(values), dtype=object)
            # std::to_string(float) prints six decimals
            out[:] = values if strings else [f"{float(np.float32(v)):f}" for v in values]
            return out
        if strings:
            as_float = np.array(values, dtype=str).astype(np.float64)
            if self.cast_to == "TO_FLOAT":
                return as_float.astype(np.float32)
            return np.array([int(float(v)) if "." in v or "e" in v.lower() else int(v)
                             for v in values], dtype=np.int64)
        f = np.asarray(values, dtype=np.float32)
        return f if self.cast_to == "TO_FLOAT" else np.trunc(f).astype(np.int64)

    def __call__(self, X):
        keys, values = _map_arrays(X, np.int64)
        order = np.argsort(keys, kind="stable")
        keys = keys[order]
        cast = self._cast([values[i] for i in order])
        pad = {"TO_FLOAT": np.float32(0), "TO_INT64": np.int64(0), "TO_STRING": "0.f"}
        if self.dense:
            return cast.reshape(1, -1)
        if keys.size and keys[0] < 0:
            raise ValueError(
                f"Negative index values are not permitted. First entry in map has index value of "
                f"{keys[0]}"
            )
        out = np.empty(self.max_map, dtype=_CAST_TO[self.cast_to])
        out[...] = pad[self.cast_to]
        keep = keys < self.max_map
        out[keys[keep]] = cast[keep]
        return out.reshape(1, -1)
