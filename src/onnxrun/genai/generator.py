"""onnxruntime-genai's ``GeneratorParams`` and ``Generator``: the generation loop.

``Generator`` only sequences the parts: ``DecoderState`` runs the model and keeps the cache,
``Search`` keeps the sequences and chooses the next tokens.
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np

from .. import errors
from ..api.ortvalue import OrtValue
from .adapters import Adapters, release_all
from .config import search_option
from .guidance import Guidance
from .model import Model
from .search import BeamSearch, GreedySearch
from .state import DecoderState
from .tensors import NamedTensors, as_array

_TERMINATED = "Session in Terminated state, exiting!"


class GeneratorParams:
    def __init__(self, model: Model) -> None:
        self.model = model
        self.search = model.config.search_defaults()
        self.extra_inputs: dict[str, np.ndarray] = {}
        self.guidance: tuple[str, str, bool] | None = None

    def set_search_options(self, **options: Any) -> None:
        for name, value in options.items():
            self.search[name] = search_option(name, value)

    def get_search_options(self) -> dict[str, Any]:
        return {k: (v if isinstance(v, bool) else float(v)) for k, v in self.search.items()}

    def set_model_input(self, name: str, value: Any) -> None:
        self.extra_inputs[str(name)] = as_array(value)

    def set_guidance(self, type: str, data: str, enable_ff_tokens: bool = False) -> None:  # noqa: A002
        """Constrain the generated tokens to a JSON schema, a regex or a Lark grammar
        (onnxrun.genai.guidance; checked when the Generator is made, as onnxruntime-genai)."""
        self.guidance = (str(type), str(data), bool(enable_ff_tokens))


class Generator:
    def __init__(self, model: Model, params: GeneratorParams) -> None:
        p = dict(params.search)
        if p["max_length"] <= 0:
            p["max_length"] = model.context_length
        if p["max_length"] <= 0:
            raise errors.InvalidArgument("max_length must be set (search option or "
                                         "model.context_length in genai_config.json)")
        if model.context_length and p["max_length"] > model.context_length:
            p["max_length"] = model.context_length  # as genai: capped at the context length
        for key in ("batch_size", "num_beams", "num_return_sequences"):
            if p[key] < 1:
                raise errors.InvalidArgument(f"{key} must be at least 1, got {p[key]}")
        if p["num_return_sequences"] > p["num_beams"]:
            raise errors.InvalidArgument(
                f"num_return_sequences ({p['num_return_sequences']}) must be at most "
                f"num_beams ({p['num_beams']})")
        self.model = model
        self.params = p
        eos = model.config.eos_token_ids()
        pad = int(model.config.model.get("pad_token_id", eos[0] if eos else 0))
        vocab = model.vocab_size
        search_cls = BeamSearch if p["num_beams"] > 1 else GreedySearch
        self.search = search_cls(p, eos, pad, vocab)
        self.state = DecoderState(model, p, dict(params.extra_inputs))
        self.guidance = None
        kind, data, _ff = params.guidance or ("", "", False)
        if bool(kind) != bool(data):
            raise errors.RuntimeException("Guidance type and data must be provided together.")
        if kind:  # both empty: no guidance, as genai
            self.guidance = Guidance(model.config.path, vocab, eos[0] if eos else 0, kind,
                                     data, p["batch_size"])
        self.computed_logits = False
        self.rewound = False
        self.terminated = False
        self._adapters: Adapters | None = None
        self._adapter_names: list[str] = []

    # -- onnxruntime-genai's methods -----------------------------------------------------------
    def append_tokens(self, tokens: Any) -> None:
        self._check_terminated()
        ids = np.asarray(as_array(tokens))
        if ids.size == 0:
            raise errors.InvalidArgument("input_ids is empty")
        batch = self.params["batch_size"]
        if ids.ndim > 2 or ids.size % batch:
            raise errors.InvalidArgument(
                f"append_tokens: {ids.size} tokens (shape {ids.shape}) do not divide into "
                f"batch_size {batch} rows")
        if not np.issubdtype(ids.dtype, np.integer):
            raise errors.InvalidArgument(f"append_tokens: token ids must be integers, "
                                         f"got {ids.dtype}")
        ids = ids.reshape(batch, -1).astype(np.int32)
        length, max_length = self.search.length, self.params["max_length"]
        if ids.shape[1] + length > max_length:
            raise errors.InvalidArgument(
                f"input_ids size ({ids.size}) + current sequence length ({length}) exceeds max "
                f"length ({max_length})")
        if length and batch > 1:
            raise errors.InvalidArgument(
                "AppendTokens can only be called once for batch_size > 1. To call AppendTokens "
                "again, use RewindToLength(0)")
        vocab = self.model.vocab_size
        if vocab and (ids.min() < 0 or ids.max() >= vocab):
            raise errors.InvalidArgument(f"append_tokens: token id out of range [0, {vocab})")
        self.search.append_tokens(ids)
        self.computed_logits = False
        self._compute_logits(ids)

    def generate_next_token(self) -> None:
        self._check_terminated()
        search = self.search
        if search.length == 0 and not self.computed_logits:
            raise errors.InvalidArgument(
                "GenerateNextToken called with no prior state. Please call AppendTokens, "
                "SetLogits, or SetInputs before calling GenerateNextToken.")
        if not self.computed_logits:
            tokens = search.next_tokens
            if self.rewound:
                search.append_tokens(tokens.reshape(-1, 1)[:self.params["batch_size"]])
            self._compute_logits(tokens)
        self.computed_logits = False
        self.rewound = False
        live = None
        if self.guidance is not None:
            # one matcher per prompt, as genai: under a beam search it guides the first
            # batch_size rows; in a greedy search the rows that ended take pads, not grammar tokens
            live = (np.arange(self.params["batch_size"]) if self.params["num_beams"] > 1
                    else np.flatnonzero(~search.eos_seen))
            self.guidance.mask(search.scores, live)
        search.apply_min_length()
        search.apply_repetition_penalty()
        self._choose_next()
        if live is not None:
            self.guidance.commit(search.next_tokens, live)

    def _choose_next(self) -> None:
        search, p = self.search, self.params
        if not p["do_sample"] or p["top_k"] == 1 or p["temperature"] == 0:
            search.select_top()
            return
        if p["num_beams"] != 1:
            raise errors.InvalidArgument("TopK and TopP cannot be used with a beam search")
        if not 0.0 <= p["top_p"] <= 1.0:
            raise errors.InvalidArgument("top_p must be between 0.0 and 1.0")
        if p["top_k"] < 0:
            raise errors.InvalidArgument("top_k must be 0 or greater")
        if 0.0 < p["top_p"] < 1.0 and p["top_k"] > 1:
            search.sample_top_k_top_p(min(p["top_k"], search.scores.shape[1]), p["top_p"],
                                      p["temperature"])
        elif p["top_k"] > 1:
            search.sample_top_k(min(p["top_k"], search.scores.shape[1]), p["temperature"])
        else:
            search.sample_top_p(p["top_p"], p["temperature"])

    def is_done(self) -> bool:
        self._check_terminated()
        if self.computed_logits:
            return False
        return self.search.is_done()

    def get_next_tokens(self) -> np.ndarray:
        return self.search.next_tokens.copy()

    def get_sequence(self, index: int) -> np.ndarray:
        return self.search.get_sequence(int(index))

    def token_count(self) -> int:
        return self.search.length

    def get_logits(self) -> np.ndarray:
        if not self.computed_logits:
            self._compute_logits(self.search.next_tokens)
        return self.search.scores.reshape(self.search.rows, 1, -1).copy()

    def set_logits(self, logits: Any) -> None:
        arr = np.asarray(as_array(logits), dtype=np.float32)
        if arr.size != self.search.rows * self.model.vocab_size:
            raise errors.InvalidArgument(
                f"set_logits: expected {self.search.rows} x {self.model.vocab_size} values, "
                f"got shape {arr.shape}")
        self.search.set_logits(arr)
        self.computed_logits = True

    def get_output(self, name: str) -> np.ndarray:
        if name not in self.state.outputs:
            raise errors.InvalidArgument(f"Output not found: {name}")
        value = self.state.outputs[name]
        return value.numpy() if isinstance(value, OrtValue) else value.copy()

    def get_input(self, name: str) -> np.ndarray:
        if name not in self.state.inputs:
            raise errors.InvalidArgument(f"Input not found: {name}")
        return np.asarray(self.state.inputs[name]).copy()

    def set_model_input(self, name: str, value: Any) -> None:
        self.state.extra[str(name)] = as_array(value)

    def set_inputs(self, named_tensors: NamedTensors) -> None:
        ids = None
        for name, value in named_tensors.items():
            if name == "input_ids":
                ids = as_array(value)
            else:
                self.set_model_input(name, value)
        if ids is not None:
            self.append_tokens(ids)

    def rewind_to(self, length: int) -> None:
        length = int(length)
        if length > self.search.length:
            raise errors.InvalidArgument(
                "Cannot rewind to a length greater than the current sequence length")
        if length == self.search.length:
            return
        if self.params["batch_size"] > 1 and length != 0:
            raise errors.InvalidArgument(
                "RewindToLength must be called with new_length=0 when batch_size > 1")
        if self.guidance is not None:  # as genai: the grammar starts over
            self.guidance.reset()
        self.search.rewind_to(length)
        self.state.rewind_to(length)
        self.computed_logits = False
        self.rewound = True

    def set_runtime_option(self, key: str, value: str) -> None:
        if key != "terminate_session":
            raise errors.InvalidArgument(f"Unknown runtime option: {key}")
        on = str(value) == "1"
        if str(value) not in ("0", "1"):
            raise errors.InvalidArgument(f"terminate_session must be '0' or '1', got {value!r}")
        self.terminated = on
        self.state.run_options.terminate = on

    def set_active_adapter(self, adapters: Adapters, name: str) -> None:
        """Run every later step with the adapter's parameters (added to those activated before;
        the generator keeps it loaded until it is freed)."""
        if not isinstance(adapters, Adapters):
            raise TypeError(f"set_active_adapter expects onnxrun.genai Adapters, got "
                            f"{type(adapters).__name__}")
        if self._adapters is None:
            self._adapters = adapters
            weakref.finalize(self, release_all, adapters, self._adapter_names)
        elif self._adapters is not adapters:
            raise errors.RuntimeException(
                "Generator state can only register a single Adapters container.")
        self.state.run_options.add_active_adapter(adapters.acquire(name))
        self._adapter_names.append(str(name))

    # -- internals -----------------------------------------------------------------------------
    def _compute_logits(self, tokens: np.ndarray) -> None:
        if self.computed_logits:
            raise errors.Fail("ComputeLogits called again without calling AppendTokens or "
                              "GenerateNextToken first")
        try:
            logits = self.state.run(tokens, self.search.next_indices())
        except errors.OnnxRunError as exc:
            if self.terminated:
                raise errors.RuntimeException(_TERMINATED) from exc
            raise
        self.search.set_logits(logits)
        self.computed_logits = True

    def _check_terminated(self) -> None:
        if self.terminated:
            raise errors.RuntimeException(_TERMINATED)
