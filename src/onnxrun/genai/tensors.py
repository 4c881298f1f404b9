"""onnxruntime-genai's ``Tensor`` and ``NamedTensors``: numpy arrays under its names."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..dtypes import elem_type


class Tensor:
    """An array handed to or returned by the genai API (``Tokenizer.encode_batch`` returns one;
    ``Generator.append_tokens`` and ``set_model_input`` accept one)."""

    def __init__(self, array: Any) -> None:
        self._array = np.ascontiguousarray(array)

    def as_numpy(self) -> np.ndarray:
        return self._array

    def shape(self) -> list[int]:
        return list(self._array.shape)

    def type(self) -> int:
        return elem_type(self._array.dtype)

    def data(self) -> np.ndarray:
        return self._array

    def __array__(self, dtype=None, copy=None):  # noqa: ARG002 - numpy's protocol
        return self._array if dtype is None else self._array.astype(dtype)


class NamedTensors(dict):
    """Named inputs for ``Generator.set_inputs``."""

    def __setitem__(self, name: str, value: Any) -> None:
        super().__setitem__(name, value if isinstance(value, Tensor) else Tensor(value))


def as_array(value: Any) -> np.ndarray:
    return value.as_numpy() if isinstance(value, Tensor) else np.asarray(value)
