"""OrtValueVector: onnxruntime's native list of OrtValues (what ``run_with_ort_values`` and an
IOBinding's ``get_outputs`` return at the C level), with its DLPack hand-offs."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from .ortvalue import DLPackCapsule, OrtValue


class OrtValueVector:
    """A list of OrtValue: ``len``, indexing, iteration, ``push_back``."""

    __slots__ = ("_values",)

    def __init__(self, values: Any = ()) -> None:
        self._values: list[OrtValue] = []
        for v in values:
            self.push_back(v)

    def push_back(self, value: Any) -> None:
        """Append an OrtValue, or a tensor given through DLPack (an object with
        ``__dlpack__``, or a DLPack capsule)."""
        if isinstance(value, OrtValue):
            self._values.append(value)
        elif hasattr(value, "__dlpack__"):
            self._values.append(OrtValue(np.from_dlpack(value)))
        elif type(value).__name__ == "PyCapsule":
            self._values.append(OrtValue(np.from_dlpack(DLPackCapsule(value))))
        else:
            raise TypeError(f"OrtValueVector.push_back(): expected an OrtValue or a DLPack "
                            f"tensor, got {type(value).__name__}")

    def reserve(self, n: int) -> None:
        """Capacity hint; a Python list grows as needed."""
        if int(n) < 0:
            raise ValueError(f"OrtValueVector.reserve(): negative size {n}")

    def shrink_to_fit(self) -> None:
        """Capacity hint; a Python list holds no spare capacity to give back."""

    def element_type_at(self, idx: int) -> int:
        """The ONNX element type (TensorProto.FLOAT...) of the tensor at ``idx``."""
        return self[idx].element_type()

    def dlpack_at(self, idx: int) -> Any:
        """A DLPack capsule sharing the memory of the tensor at ``idx``."""
        return _tensor(self[idx]).__dlpack__()

    def to_dlpacks(self, to_tensor: Callable[[Any], Any] | None) -> list[Any]:
        """Every tensor as a DLPack capsule, or as ``to_tensor(capsule)`` when given."""
        capsules = [_tensor(v).__dlpack__() for v in self._values]
        return capsules if to_tensor is None else [to_tensor(c) for c in capsules]

    def __len__(self) -> int:
        return len(self._values)

    def __getitem__(self, idx: int) -> OrtValue:
        if not isinstance(idx, int):
            raise TypeError(f"OrtValueVector indices must be integers, got {type(idx).__name__}")
        n = len(self._values)
        if not -n <= idx < n:
            raise IndexError(f"OrtValueVector index {idx} out of range (size {n})")
        return self._values[idx]

    def __iter__(self) -> Iterator[OrtValue]:
        return iter(list(self._values))

    def __repr__(self) -> str:
        return f"OrtValueVector({self._values!r})"


def _tensor(value: OrtValue) -> np.ndarray:
    arr = value.numpy()
    if not isinstance(arr, np.ndarray) or arr.dtype == object:
        raise RuntimeError(f"DLPack holds numeric tensors only, not {value.data_type()}")
    return arr
