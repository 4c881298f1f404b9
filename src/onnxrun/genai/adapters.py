"""onnxruntime-genai's ``Adapters``: LoRA adapter files loaded by name for a model, made active
per generator (``Generator.set_active_adapter``).

An adapter is an onnxruntime ``LoraAdapter`` (onnxrun.api.adapters): while active, its
parameters are fed to the model inputs of the same names (the LoRA weights a folder's model
takes as overridable inputs). As in onnxruntime-genai, a generator holds a reference to each
adapter it activated until it is freed, and an adapter in use cannot be unloaded.
"""

from __future__ import annotations

import os

from .. import errors
from ..api.adapters import LoraAdapter
from .model import Model


class Adapters:
    def __init__(self, model: Model) -> None:
        if not isinstance(model, Model):
            raise TypeError(f"Adapters expects an onnxrun.genai Model, got {type(model).__name__}")
        self.model = model
        self._adapters: dict[str, LoraAdapter] = {}
        self._refs: dict[str, int] = {}

    def load(self, adapter_file_path: str | os.PathLike, adapter_name: str) -> None:
        name = str(adapter_name)
        if name in self._adapters:
            raise errors.RuntimeException(f"Adapter already loaded: {name}")
        adapter = LoraAdapter()
        adapter.Load(adapter_file_path)
        self._adapters[name] = adapter
        self._refs[name] = 0

    def unload(self, adapter_name: str) -> None:
        name = str(adapter_name)
        if name not in self._adapters:
            raise errors.RuntimeException(f"Adapter not found: {name}")
        if self._refs[name] > 0:
            raise errors.RuntimeException(f"Adapter still in use: {name}")
        del self._adapters[name], self._refs[name]

    # -- for Generator -------------------------------------------------------------------------
    def acquire(self, adapter_name: str) -> LoraAdapter:
        name = str(adapter_name)
        if name not in self._adapters:
            raise errors.RuntimeException(f"Adapter not found: {name}")
        self._refs[name] += 1
        return self._adapters[name]

    def release(self, adapter_name: str) -> None:
        if adapter_name in self._refs:
            self._refs[adapter_name] -= 1


def release_all(adapters: Adapters, names: list[str]) -> None:
    """A generator's references, dropped when it is freed (weakref.finalize: no cycle)."""
    for name in names:
        adapters.release(name)
