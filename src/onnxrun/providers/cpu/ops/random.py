"""Random generators: RandomNormal, RandomUniform, their *Like variants, Bernoulli, Multinomial.

A node with a ``seed`` attribute owns a generator created once per session, so successive runs
continue one reproducible stream (as onnxruntime's seeded kernels do); without a seed, the
shared generator of ``random_state`` is used (reseeded by ``onnxrun.set_seed``). numpy
Generators serialize concurrent draws internally, so sharing one across threads is safe.
"""

from __future__ import annotations

import numpy as np

from ....dtypes import np_dtype
from .. import random_state
from ..kernels import KernelContext, op


class _Seeded:
    def __init__(self, seed):
        self._rng = None if seed is None else random_state.generator(seed)

    def rng(self) -> np.random.Generator:
        return self._rng if self._rng is not None else random_state.generator(None)


def _out_dtype(dtype_attr, like: np.ndarray | None = None) -> np.dtype:
    if dtype_attr is not None:
        return np_dtype(int(dtype_attr))
    if like is None:
        return np.dtype(np.float32)
    return like.dtype


def _check_float(dt: np.dtype, name: str) -> None:
    if dt.kind != "f" and "float" not in dt.name:
        raise ValueError(f"{name}: output type must be a floating point type, got {dt}")


@op("RandomNormal", 1, 22)
class RandomNormal(_Seeded):
    def __init__(self, ctx: KernelContext, *, shape, dtype=1, mean=0.0, scale=1.0, seed=None):
        super().__init__(seed)
        self.shape = tuple(int(s) for s in shape)
        self.dtype = _out_dtype(dtype)
        _check_float(self.dtype, "RandomNormal")
        self.mean, self.scale = float(mean), float(scale)

    def __call__(self):
        return self.rng().normal(self.mean, self.scale, self.shape).astype(self.dtype)


@op("RandomUniform", 1, 22)
class RandomUniform(_Seeded):
    def __init__(self, ctx: KernelContext, *, shape, dtype=1, high=1.0, low=0.0, seed=None):
        super().__init__(seed)
        self.shape = tuple(int(s) for s in shape)
        self.dtype = _out_dtype(dtype)
        _check_float(self.dtype, "RandomUniform")
        self.low, self.high = float(low), float(high)

    def __call__(self):
        return self.rng().uniform(self.low, self.high, self.shape).astype(self.dtype)


@op("RandomNormalLike", 1, 22)
class RandomNormalLike(_Seeded):
    def __init__(self, ctx: KernelContext, *, dtype=None, mean=0.0, scale=1.0, seed=None):
        super().__init__(seed)
        self.dtype_attr = dtype
        self.mean, self.scale = float(mean), float(scale)

    def __call__(self, input):
        dt = _out_dtype(self.dtype_attr, input)
        _check_float(dt, "RandomNormalLike")
        return self.rng().normal(self.mean, self.scale, input.shape).astype(dt)


@op("RandomUniformLike", 1, 22)
class RandomUniformLike(_Seeded):
    def __init__(self, ctx: KernelContext, *, dtype=None, high=1.0, low=0.0, seed=None):
        super().__init__(seed)
        self.dtype_attr = dtype
        self.low, self.high = float(low), float(high)

    def __call__(self, input):
        dt = _out_dtype(self.dtype_attr, input)
        _check_float(dt, "RandomUniformLike")
        return self.rng().uniform(self.low, self.high, input.shape).astype(dt)


@op("Bernoulli", 15, 22)
class Bernoulli(_Seeded):
    def __init__(self, ctx: KernelContext, *, dtype=None, seed=None):
        super().__init__(seed)
        self.dtype_attr = dtype

    def __call__(self, input):
        dt = _out_dtype(self.dtype_attr, input)
        draw = self.rng().random(input.shape)
        return (draw < input.astype(np.float64)).astype(dt)


@op("Multinomial", 7, 22)
class Multinomial(_Seeded):
    """input: [batch, classes] unnormalized log-probabilities -> [batch, sample_size] ids."""

    def __init__(self, ctx: KernelContext, *, dtype=6, sample_size=1, seed=None):
        super().__init__(seed)
        self.dtype = np_dtype(int(dtype))
        if self.dtype not in (np.int32, np.int64):
            raise ValueError(f"Multinomial: dtype must be int32 or int64, got {self.dtype}")
        self.sample_size = int(sample_size)

    def __call__(self, input):
        if input.ndim != 2:
            raise ValueError(f"Multinomial: input must be [batch, classes], got {input.shape}")
        if input.shape[0] < 1:  # as onnxruntime
            raise ValueError(f"Multinomial: batch_size is < 1 (input {list(input.shape)})")
        logits = input.astype(np.float64)
        logits = logits - logits.max(axis=1, keepdims=True)
        cdf = np.cumsum(np.exp(logits), axis=1)
        cdf /= cdf[:, -1:]
        u = self.rng().random((input.shape[0], self.sample_size))
        # inverse-CDF sampling: one vectorized search per batch row
        idx = (u[:, :, None] >= cdf[:, None, :]).sum(axis=2)
        return np.minimum(idx, input.shape[1] - 1).astype(self.dtype)
