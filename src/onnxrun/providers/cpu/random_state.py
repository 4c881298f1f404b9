"""The generator random operators draw from; ``onnxrun.set_seed`` reseeds it."""

from __future__ import annotations

import numpy as np

# Created on first use: importing numpy.random costs every session ~7 ms otherwise.
_rng: np.random.Generator | None = None


def seed(value: int) -> None:
    global _rng
    _rng = np.random.default_rng(value)


def generator(seed_attr: float | None = None) -> np.random.Generator:
    """A node's ``seed`` attribute gives it its own stream; otherwise the shared one."""
    global _rng
    if seed_attr is not None:
        return np.random.default_rng(int(seed_attr))
    if _rng is None:
        _rng = np.random.default_rng()
    return _rng
