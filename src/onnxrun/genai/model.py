"""onnxruntime-genai's ``Model``: a model folder's configuration and its decoder session."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .. import errors
from ..api.options import SessionOptions
from ..api.session import InferenceSession
from ..providers.cpu.ops.contrib.transformer import SHARE_PAST_PRESENT
from .config import INPUT_DEFAULTS, OUTPUT_DEFAULTS, Config
from .mask import mask_values

# providers onnxruntime-genai knows; onnxrun.genai runs "cpu" (CPUExecutionProvider) and "cuda"
# (CUDAExecutionProvider, its options from set_provider_option("cuda", ...) or the file)
_KNOWN_PROVIDERS = {"cpu", "cuda", "dml", "webgpu", "openvino", "qnn", "nvtensorrtrtx",
                    "rocm", "migraphx", "vitisai", "ryzenai"}
# genai_config.json session_options that map onto SessionOptions attributes
_SESSION_ATTRS = ("intra_op_num_threads", "inter_op_num_threads", "enable_cpu_mem_arena",
                  "enable_mem_pattern", "log_severity_level", "log_id")


class Model:
    """A model folder (or a ``Config``) ready to generate: the decoder session, its input and
    output names, the KV-cache geometry."""

    def __init__(self, config: str | os.PathLike | Config) -> None:
        self.config = config if isinstance(config, Config) else Config(config)
        self.device = "cpu"
        for name in self.config.providers():
            low = name.lower()
            if low not in _KNOWN_PROVIDERS:
                raise errors.InvalidArgument(f"Unknown provider name \"{name}\"")
            if low == "cuda":
                self.device = "cuda"
            elif low != "cpu":
                raise errors.EPFail(
                    f"{name} execution provider is not available: onnxrun.genai runs on the CPU "
                    "and CUDA (call config.clear_providers() to use the CPU)")
        dec = self.config.decoder
        path = os.path.join(self.config.path, dec["filename"])
        if not os.path.isfile(path):
            raise errors.NoSuchFile(f"model file {path} (genai_config.json decoder.filename) "
                                    "not found")
        self.session = InferenceSession(path, sess_options=self._session_options(dec),
                                        providers=self._providers())
        ins = {i.name: i for i in self.session.get_inputs()}
        outs = {o.name for o in self.session.get_outputs()}
        names = {**INPUT_DEFAULTS, **dec.get("inputs", {})}
        onames = {**OUTPUT_DEFAULTS, **dec.get("outputs", {})}
        self.layers = int(dec.get("num_hidden_layers", 0))
        if not self.layers:
            raise errors.InvalidArgument("genai_config.json: decoder.num_hidden_layers is missing")
        self.input_ids = names["input_ids"]
        if self.input_ids not in ins:
            raise errors.InvalidArgument(
                f"the decoder has no input {self.input_ids!r} (genai_config.json inputs.input_ids);"
                f" its inputs are {sorted(ins)}")
        self.attention_mask = names["attention_mask"] if names["attention_mask"] in ins else None
        self.position_ids = names["position_ids"] if names["position_ids"] in ins else None
        self.logits = onames["logits"]
        if self.logits not in outs:
            raise errors.InvalidArgument(f"the decoder has no output {self.logits!r}")
        self.past_keys = [names["past_key_names"] % i for i in range(self.layers)]
        self.past_values = [names["past_value_names"] % i for i in range(self.layers)]
        self.present_keys = [onames["present_key_names"] % i for i in range(self.layers)]
        self.present_values = [onames["present_value_names"] % i for i in range(self.layers)]
        for n in self.past_keys + self.past_values:
            if n not in ins:
                raise errors.InvalidArgument(f"the decoder has no KV-cache input {n!r}")
        for n in self.present_keys + self.present_values:
            if n not in outs:
                raise errors.InvalidArgument(f"the decoder has no KV-cache output {n!r}")
        self.input_dtypes = {n: _dtype_of(ins[n].type) for n in ins}
        self.input_names = set(ins)
        self.output_names = [o.name for o in self.session.get_outputs()]
        kv_shape = ins[self.past_keys[0]].shape
        self.kv_heads = int(dec.get("num_key_value_heads", dec.get("num_attention_heads", 0)))
        self.head_size = int(dec.get("head_size", 0))
        if not self.kv_heads and isinstance(kv_shape[1], int):
            self.kv_heads = kv_shape[1]
        if not self.head_size and isinstance(kv_shape[3], int):
            self.head_size = kv_shape[3]
        self.vocab_size = int(self.config.model.get("vocab_size", 0))
        self.context_length = int(self.config.model.get("context_length", 0))
        # the shared past/present buffer needs an attention that writes the cache in place
        # (GroupQueryAttention); plain attention concatenates, so it exchanges past and present
        self.gqa = any(n.op_type == "GroupQueryAttention" for n in self.session._model.graph.nodes)
        self._step_runs: dict[tuple, Any] = {}

    def step_runner(self, fetch: Sequence[str], feed_names: Sequence[str]
                    ) -> tuple[Callable[..., list[Any]], list[Callable[[np.ndarray], Any]]] | None:
        """(run, functions of the mask) for the steps after a first checked run, whose feeds
        the engine builds (``feed_names``, then the values the functions compute from the
        attention mask, mask.py): ``InferenceSession._runner``'s run; None where the session
        has none (a device provider, the profiler)."""
        key = (tuple(fetch), tuple(feed_names))
        got = self._step_runs.get(key, False)
        if got is False:
            computed = mask_values(self.session._program, self.attention_mask,
                                   self.input_dtypes[self.attention_mask]) \
                if self.attention_mask else None
            computed = computed or []
            run = self.session._runner(fetch, feed_names, [s for s, _ in computed])
            got = self._step_runs[key] = None if run is None else \
                (run, [f for _, f in computed])
        return got

    @property
    def type(self) -> str:
        return str(self.config.model.get("type", ""))

    @property
    def device_type(self) -> str:
        return "CUDA" if self.device == "cuda" else "CPU"

    def _providers(self) -> list[Any]:
        """The session's providers for genai's names: "cuda" is CUDAExecutionProvider (with
        the CPU provider for what it leaves, shape arithmetic), its options those of the
        file's provider_options entry overridden by set_provider_option. As onnxruntime-genai,
        a "cuda" that cannot run is an error, not a silent fall back to the CPU."""
        if self.device != "cuda":
            return ["CPUExecutionProvider"]
        from .. import get_available_providers

        if "CUDAExecutionProvider" not in get_available_providers():
            raise errors.EPFail("provider \"cuda\": CUDAExecutionProvider is not available, "
                                "CuPy finds no GPU (pip install onnxrun[cuda12] or [cuda13] on "
                                "a machine with one)")
        options: dict[str, str] = {}
        for entry in self.config.decoder.get("session_options", {}).get("provider_options", []):
            for name, opts in entry.items():
                if name.lower() == "cuda" and isinstance(opts, dict):
                    options.update({str(k): str(v) for k, v in opts.items()})
        for name, opts in self.config._provider_options.items():
            if name.lower() == "cuda":
                options.update(opts)
        return [("CUDAExecutionProvider", options), "CPUExecutionProvider"]

    def _session_options(self, dec: dict[str, Any]) -> SessionOptions:
        so = SessionOptions()
        opts = dec.get("session_options", {})
        for key in _SESSION_ATTRS:
            if key in opts:
                setattr(so, key, opts[key])
        for key, value in opts.get("config_entries", {}).items():
            so.add_session_config_entry(str(key), str(value))
        for key, value in self.config._provider_options.get("cpu", {}).items():
            so.add_session_config_entry(str(key), str(value))
        # GroupQueryAttention writes into a max_length past buffer in place (state.py's
        # shared cache); a past shorter than the sequence still gets a new present
        so.add_session_config_entry(SHARE_PAST_PRESENT, "1")
        return so


def _dtype_of(type_string: str) -> np.dtype:
    """numpy dtype of an onnxruntime type string such as 'tensor(float16)'."""
    name = type_string[len("tensor("):-1]
    table = {"float": np.float32, "float16": np.float16, "double": np.float64,
             "int64": np.int64, "int32": np.int32, "bool": np.bool_}
    return np.dtype(table.get(name, np.float32))
