"""The generator random operators draw from; ``onnxrun.set_seed`` reseeds it."""

from __future__ import annotations

import numpy as np

_rng = np.random.default_rng()


def seed(value: int) -> None:
    global _rng
    _rng = np.random.default_rng(value)


def generator(seed_attr: float | None = None) -> np.random.Generator:
    """A node's ``seed`` attribute gives it its own stream; otherwise the shared one."""
    if seed_attr is not None:
        return np.random.default_rng(int(seed_attr))
    return _rng
