"""genai_config.json: what onnxruntime-genai's model folder says about its model and search.

``Config`` is onnxruntime-genai's class of that name: a folder's configuration that the caller
may edit (providers, provider options, a JSON overlay) before building a ``Model`` from it.
"""

from __future__ import annotations

import copy
import json
import os
from typing import Any

from .. import errors

# onnxruntime-genai's search defaults (config.h), for keys a genai_config.json leaves out
SEARCH_DEFAULTS: dict[str, Any] = {
    "batch_size": 1, "chunk_size": 0, "diversity_penalty": 0.0, "do_sample": False,
    "early_stopping": True, "length_penalty": 1.0, "max_length": 0, "min_length": 0,
    "no_repeat_ngram_size": 0, "num_beams": 1, "num_return_sequences": 1,
    "past_present_share_buffer": False, "random_seed": -1, "repetition_penalty": 1.0,
    "temperature": 1.0, "top_k": 50, "top_p": 1.0,
}
_BOOL_OPTIONS = {"do_sample", "early_stopping", "past_present_share_buffer"}
_INT_OPTIONS = {"batch_size", "chunk_size", "max_length", "min_length", "no_repeat_ngram_size",
                "num_beams", "num_return_sequences", "random_seed", "top_k"}

# decoder input/output names when genai_config.json does not give them (onnxruntime-genai's)
INPUT_DEFAULTS = {
    "input_ids": "input_ids", "attention_mask": "attention_mask", "position_ids": "position_ids",
    "past_key_names": "past_key_values.%d.key", "past_value_names": "past_key_values.%d.value",
}
OUTPUT_DEFAULTS = {
    "logits": "logits", "present_key_names": "present.%d.key",
    "present_value_names": "present.%d.value",
}


def search_option(name: str, value: Any) -> Any:
    """One search option converted to its type; an unknown name is refused as
    onnxruntime-genai refuses it."""
    if name not in SEARCH_DEFAULTS:
        raise errors.InvalidArgument(f' Unknown value "{name}"')
    if name in _BOOL_OPTIONS:
        return bool(value)
    if name in _INT_OPTIONS:
        if isinstance(value, float) and not value.is_integer():
            raise errors.InvalidArgument(f"search option {name} must be an integer, got {value}")
        return int(value)
    return float(value)


class Config:
    """A model folder's genai_config.json, editable before ``Model(config)``."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = os.fspath(path)
        file = os.path.join(self.path, "genai_config.json")
        try:
            with open(file, encoding="utf-8") as f:
                self._json = json.load(f)
        except FileNotFoundError:
            self._json = derive(self.path)
            if self._json is None:
                raise errors.NoSuchFile(
                    f"Error opening {file}: not an onnxruntime-genai model folder (nor an "
                    "Optimum-style export: model.onnx with Hugging Face's config.json)") from None
        except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise errors.InvalidArgument(f"Error reading {file}: {exc}") from None
        if not isinstance(self._json, dict) or not isinstance(self._json.get("model"), dict):
            raise errors.InvalidArgument(f"{file}: no \"model\" section")
        self._providers: list[str] | None = None  # None: as the file says
        self._provider_options: dict[str, dict[str, str]] = {}

    # -- onnxruntime-genai's Config methods ----------------------------------------------------
    def clear_providers(self) -> None:
        self._providers = []

    def append_provider(self, provider: str) -> None:
        if self._providers is None:
            self._providers = []
        self._providers.append(str(provider))

    def set_provider_option(self, provider: str, key: str, value: str) -> None:
        self._provider_options.setdefault(str(provider), {})[str(key)] = str(value)

    def overlay(self, json_text: str) -> None:
        """Merge a JSON document into the configuration (objects merge key by key)."""
        try:
            patch = json.loads(json_text)
        except json.JSONDecodeError as exc:
            raise errors.InvalidArgument(f"Config.overlay: invalid JSON: {exc}") from None
        if not isinstance(patch, dict):
            raise errors.InvalidArgument("Config.overlay: the JSON must be an object")
        _merge(self._json, patch)

    # -- what the runtime reads ----------------------------------------------------------------
    @property
    def model(self) -> dict[str, Any]:
        return self._json["model"]

    @property
    def decoder(self) -> dict[str, Any]:
        dec = self.model.get("decoder")
        if not isinstance(dec, dict) or "filename" not in dec:
            raise errors.InvalidArgument(
                f"{self.path}/genai_config.json: model.decoder.filename is missing")
        return dec

    def providers(self) -> list[str]:
        """Providers in order: those appended, else those the file names."""
        if self._providers is not None:
            names = list(self._providers)
        else:
            names = []
            for entry in self.decoder.get("session_options", {}).get("provider_options", []):
                names.extend(entry.keys())
        return names

    def search_defaults(self) -> dict[str, Any]:
        search = dict(SEARCH_DEFAULTS)
        search["max_length"] = int(self.model.get("context_length", 0))
        for key, value in self._json.get("search", {}).items():
            if key in SEARCH_DEFAULTS:
                search[key] = search_option(key, value)
        return search

    def eos_token_ids(self) -> list[int]:
        eos = self.model.get("eos_token_id", [])
        return [int(e) for e in (eos if isinstance(eos, list) else [eos])]

    def to_dict(self) -> dict[str, Any]:
        return copy.deepcopy(self._json)


def _read_json(path: str) -> dict | None:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return None
    return data if isinstance(data, dict) else None


def derive(folder: str) -> dict[str, Any] | None:
    """The genai_config.json of an Optimum-style export folder (``model.onnx`` with
    ``past_key_values.%d.key`` / ``present.%d.key``, Hugging Face's ``config.json`` and
    ``generation_config.json``), or None when the folder is not one."""
    hf = _read_json(os.path.join(folder, "config.json"))
    model_file = os.path.join(folder, "model.onnx")
    if hf is None or not os.path.isfile(model_file):
        return None
    try:
        import onnx  # noqa: PLC0415 - only a folder without genai_config.json needs it

        graph = onnx.load(model_file, load_external_data=False).graph
    except Exception:  # noqa: BLE001 - not a model: the caller reports the missing config
        return None
    inputs = {i.name for i in graph.input}
    if "past_key_values.0.key" not in inputs:
        return None
    gen = _read_json(os.path.join(folder, "generation_config.json")) or {}
    heads = int(hf.get("num_attention_heads", 0))
    hidden = int(hf.get("hidden_size", 0))
    eos = gen.get("eos_token_id", hf.get("eos_token_id"))
    eos = [int(e) for e in (eos if isinstance(eos, list) else [eos] if eos is not None else [])]
    pad = gen.get("pad_token_id", hf.get("pad_token_id"))
    names = {"input_ids": "input_ids", "past_key_names": "past_key_values.%d.key",
             "past_value_names": "past_key_values.%d.value"}
    for key in ("attention_mask", "position_ids"):
        if key in inputs:
            names[key] = key
    context = int(hf.get("max_position_embeddings", 0))
    return {
        "model": {
            "type": str(hf.get("model_type", "")), "context_length": context,
            "vocab_size": int(hf.get("vocab_size", 0)), "eos_token_id": eos,
            "pad_token_id": int(pad if pad is not None else (eos[0] if eos else 0)),
            "bos_token_id": int(gen.get("bos_token_id", hf.get("bos_token_id")) or 0),
            "decoder": {
                "filename": "model.onnx", "num_attention_heads": heads,
                "num_key_value_heads": int(hf.get("num_key_value_heads", heads)),
                "num_hidden_layers": int(hf.get("num_hidden_layers", 0)),
                "head_size": int(hf.get("head_dim") or (hidden // heads if heads else 0)),
                "hidden_size": hidden, "inputs": names,
                "outputs": {"logits": "logits", "present_key_names": "present.%d.key",
                            "present_value_names": "present.%d.value"},
            },
        },
        "search": {"max_length": context, "past_present_share_buffer": False},
    }


def _merge(base: dict, patch: dict) -> None:
    for key, value in patch.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = value
