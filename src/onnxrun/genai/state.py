"""The decoder's state between steps: the KV cache, the attention mask, the position ids.

With ``past_present_share_buffer`` (and a GroupQueryAttention model) the cache is one buffer
per layer of ``max_length`` positions, allocated once: GroupQueryAttention writes the new keys
and values at each row's own length, so nothing grows or is concatenated. Otherwise (plain
attention, Optimum's exports) the cache starts empty and each step's ``present`` is the next
step's ``past``. A batch of prompts is padded on the right, as onnxruntime-genai pads it: the
mask marks the pads, GroupQueryAttention packs each row's cache (seqlens_k), and the first
logits of each row are those of its last real token.

On the CUDA provider the shared cache is device memory (OrtValues fed to each run, written in
place by GroupQueryAttention): only the step's ids, mask, positions and logits cross.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import errors
from ..api.options import RunOptions
from ..api.ortvalue import OrtValue
from .model import Model


class DecoderState:
    def __init__(self, model: Model, params: dict, extra_inputs: dict[str, np.ndarray]) -> None:
        self.m = model
        self.rows = params["batch_size"] * params["num_beams"]
        self.batch = params["batch_size"]
        self.beams = params["num_beams"]
        self.max_length = params["max_length"]
        self.pad = int(model.config.model.get("pad_token_id", 0))
        self.shared = bool(params["past_present_share_buffer"]) and model.gqa \
            and params["num_beams"] == 1
        self.extra = extra_inputs
        self.run_options = RunOptions()
        # the attention mask of every position up to max_length, in the decoder's dtype; a
        # step feeds a view of its first `length` columns (no concatenation per step)
        self._mask_buf = np.zeros((self.rows, self.max_length),
                                  model.input_dtypes.get(model.attention_mask, np.int64))
        self.length = 0  # positions so far (pads included)
        self.kv: list[np.ndarray] = []  # past keys then past values, per layer
        self.outputs: dict[str, np.ndarray] = {}
        self.inputs: dict[str, np.ndarray] = {}
        # what a step feeds and fetches by name, the same every step
        m = model
        self._past_names = m.past_keys + m.past_values
        self._cache_names = [*m.present_keys, *m.present_values]
        extra_out = [n for n in m.output_names if n != m.logits and n not in self._cache_names]
        # with the shared buffer GroupQueryAttention writes each step's rows into self.kv
        self._fetch = [m.logits, *extra_out] if self.shared else \
            [m.logits, *self._cache_names, *extra_out]
        self._runner: Any = False  # model.step_runner's, taken at the first decode step
        self._alloc_cache()

    def _alloc_cache(self) -> None:
        m = self.m
        length = self.max_length if self.shared else 0
        shape = (self.rows, m.kv_heads, length, m.head_size)
        if not m.kv_heads or not m.head_size:
            raise errors.InvalidArgument(
                "genai_config.json: decoder.num_key_value_heads and head_size are needed")
        self.kv = [np.zeros(shape, m.input_dtypes[n]) for n in m.past_keys + m.past_values]
        if self.shared and m.device != "cpu":  # the cache lives on the device, written there
            self.kv = [OrtValue.ortvalue_from_numpy(c, m.device, 0) for c in self.kv]

    def run(self, tokens: np.ndarray, beam_indices: np.ndarray | None) -> np.ndarray:
        """One step on ``tokens`` ((batch, n) for a prompt, (rows,) for a decode step): the
        logits of each row's last real token, (rows, vocab) float32."""
        m = self.m
        first = self.length == 0
        if first:
            ids = np.repeat(tokens, self.beams, axis=0) if self.beams > 1 else tokens
            new_mask = ids != self.pad if self.batch > 1 else True
        else:
            ids = tokens.reshape(self.rows, -1)
            if beam_indices is not None:
                self.kv = [c[beam_indices] for c in self.kv]
                self._mask_buf[:, :self.length] = self._mask_buf[beam_indices, :self.length]
            new_mask = True
        S = ids.shape[1]
        self._mask_buf[:, self.length:self.length + S] = new_mask
        self.length += S
        self.mask = self._mask_buf[:, :self.length]
        feed: dict[str, Any] = {m.input_ids: ids.astype(m.input_dtypes[m.input_ids], copy=False)}
        if m.attention_mask:
            feed[m.attention_mask] = self.mask
        if m.position_ids:
            if first:
                pos = np.maximum(np.cumsum(self.mask, axis=1) - 1, 0)
            else:
                pos = self.mask.sum(axis=1, keepdims=True) - 1 + np.arange(S) - (S - 1)
            feed[m.position_ids] = pos.astype(m.input_dtypes[m.position_ids], copy=False)
        feed.update(zip(self._past_names, self.kv, strict=True))
        feed.update(self.extra)
        self.inputs = feed
        names = self._fetch
        step = None
        if not first and not self.run_options._active_adapters:
            if self._runner is False:  # the feeds' names are the same every step
                self._runner = m.step_runner(names, list(feed))
            step = self._runner
        if step is None:  # the first step's feeds checked, as the caller's values are in it
            out = m.session.run(names, feed, self.run_options)
        else:  # later steps: the engine's own feeds, the mask arithmetic computed (mask.py)
            run, computed = step
            out = run([*feed.values(), *[f(self.mask) for f in computed]], self.run_options)
        self.outputs = dict(zip(names, out, strict=True))
        if self.shared:  # GroupQueryAttention wrote this step's rows into self.kv itself
            self.outputs.update(zip(self._cache_names, self.kv, strict=True))
        else:
            self.kv = list(out[1:1 + 2 * m.layers])
        logits = out[0]
        if logits.ndim == 2:  # (rows, vocab): the model keeps only the last position
            logits = logits[:, None]
        if logits.shape[1] == 1:  # a decode step: no copy (the search copies the scores)
            logits = logits[:, 0]
        else:
            if first and self.batch > 1:
                last = new_mask.sum(axis=1) - 1  # right padding: each row's last real token
            else:
                last = np.full(self.rows, logits.shape[1] - 1)
            logits = logits[np.arange(self.rows), last]
        self.outputs[m.logits] = logits[:, None]  # as genai's get_output: (rows, 1, vocab)
        return logits.astype(np.float32, copy=False)

    def rewind_to(self, length: int) -> None:
        self.length = length
        if length == 0:
            self._alloc_cache()
            return
        if not self.shared:
            self.kv = [c[:, :, :length] for c in self.kv]
