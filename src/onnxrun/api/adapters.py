"""LoRA adapters as onnxruntime exposes them: ``AdapterFormat`` writes and reads adapter files
(``.onnx_adapter``, see onnxrun.adapter_format), ``LoraAdapter`` loads one for
``RunOptions.add_active_adapter``: a run with active adapters feeds their parameters to the model
inputs of the same names (typically initializers the model lets callers override)."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from .. import adapter_format
from ..dtypes import np_dtype
from ..errors import InvalidArgument, NoSuchFile
from .ortvalue import OrtValue


def _read_file(path: str | os.PathLike) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        raise NoSuchFile(f"adapter file '{os.fspath(path)}' not found") from None


def _values(adapter: adapter_format.Adapter) -> dict[str, OrtValue]:
    """The parameters as read-only arrays over the file's bytes (which they keep alive)."""
    values = {}
    for p in adapter.parameters:
        try:
            dtype = np_dtype(p.data_type)
        except TypeError:
            raise InvalidArgument(
                f"adapter parameter '{p.name}' has an unknown element type {p.data_type}"
            ) from None
        count = int(np.prod(p.dims, dtype=np.int64))
        if (dtype.kind == "O" or min(p.dims, default=0) < 0
                or count * dtype.itemsize != len(p.raw_data)):
            raise InvalidArgument(
                f"adapter parameter '{p.name}': {len(p.raw_data)} bytes do not hold "
                f"{p.dims} elements of type {p.data_type}")
        arr = np.frombuffer(p.raw_data, dtype=dtype.newbyteorder("<"), count=count)
        values[p.name] = OrtValue(arr.astype(dtype, copy=False).reshape(p.dims))
    return values


class AdapterFormat:
    """Builds and reads adapter files from Python: versions and named parameters."""

    def __init__(self) -> None:
        self._format_version = adapter_format.FORMAT_VERSION
        self._adapter_version = 0
        self._model_version = 0
        self._parameters: dict[str, OrtValue] = {}

    def get_format_version(self) -> int:
        return self._format_version

    def get_adapter_version(self) -> int:
        return self._adapter_version

    def set_adapter_version(self, version: int) -> None:
        self._adapter_version = int(version)

    def get_model_version(self) -> int:
        return self._model_version

    def set_model_version(self, version: int) -> None:
        self._model_version = int(version)

    def get_parameters(self) -> dict[str, OrtValue]:
        return dict(self._parameters)

    def set_parameters(self, params: dict[str, Any]) -> None:
        """Replace the parameters: name -> OrtValue (or numpy array)."""
        values = {}
        for name, value in params.items():
            if not isinstance(value, OrtValue):
                value = OrtValue.ortvalue_from_numpy(value)
            if not value.is_tensor():
                raise InvalidArgument(f"adapter parameter '{name}' must be a tensor")
            values[str(name)] = value
        self._parameters = values

    def export_adapter(self, file_path: str | os.PathLike) -> None:
        """Write the adapter file (numeric tensors only: a string parameter is refused before
        anything is written)."""
        params = [adapter_format.parameter_from_array(name, v.numpy(), v.element_type())
                  for name, v in self._parameters.items()]
        data = adapter_format.write(adapter_format.Adapter(
            self._format_version, self._adapter_version, self._model_version, params))
        with open(file_path, "wb") as f:
            f.write(data)

    @staticmethod
    def read_adapter(file_path: str | os.PathLike) -> AdapterFormat:
        adapter = adapter_format.read(_read_file(file_path), f"'{os.fspath(file_path)}'")
        out = AdapterFormat()
        out._format_version = adapter.format_version
        out._adapter_version = adapter.adapter_version
        out._model_version = adapter.model_version
        out._parameters = _values(adapter)
        return out


class LoraAdapter:
    """An adapter file loaded for runs: ``RunOptions.add_active_adapter(adapter)``."""

    def __init__(self) -> None:
        self._parameters: dict[str, OrtValue] = {}

    def Load(self, adapter_file_path: str | os.PathLike) -> None:  # noqa: N802 - onnxruntime's
        """Read the adapter file (its parameters replace any loaded before)."""
        adapter = adapter_format.read(_read_file(adapter_file_path),
                                      f"'{os.fspath(adapter_file_path)}'")
        self._parameters = _values(adapter)

    def parameters(self) -> dict[str, OrtValue]:
        """The loaded parameters by name (onnxrun extension)."""
        return dict(self._parameters)


__all__ = ["AdapterFormat", "LoraAdapter"]
