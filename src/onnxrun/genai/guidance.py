"""Constrained decoding (``GeneratorParams.set_guidance``) on the ``llguidance`` package, as
onnxruntime-genai's GuidanceLogitsProcessor does it on the same library: one matcher per batch
row over the folder's tokenizer.json (the model's vocabulary size, the first EOS id); before each
token is chosen the tokens the grammar does not allow get the lowest float32 logit (a stopped
matcher allows only EOS); the chosen token is then committed to the matcher. Fast-forward tokens
(``enable_ff_tokens``) are accepted and change nothing here: a forced token is the only one the
mask allows, so every search picks it anyway (onnxruntime-genai 0.18 gives the same tokens with
and without them).
"""

from __future__ import annotations

import os

import numpy as np

from .. import errors

TYPES = ("json_schema", "regex", "lark_grammar")


class Guidance:
    def __init__(self, folder: str, vocab: int, eos: int, kind: str, data: str,
                 rows: int) -> None:
        if kind not in TYPES:
            raise errors.RuntimeException(
                f"Unsupported guidance type: {kind} (only json_schema, regex, and lark_grammar "
                "are supported).")
        try:
            import llguidance
        except ImportError:
            raise errors.NotImplemented(
                "set_guidance needs the llguidance package (pip install 'onnxrun[genai-guidance]')"
            ) from None
        self._llg = llguidance
        path = os.path.join(folder, "tokenizer.json")
        if not os.path.isfile(path):
            raise errors.NoSuchFile(f"set_guidance needs {path}")
        self.tokenizer = llguidance.LLTokenizer(path, n_vocab=vocab, eos_token=eos)
        make = {"json_schema": llguidance.LLMatcher.grammar_from_json_schema,
                "regex": llguidance.LLMatcher.grammar_from_regex,
                "lark_grammar": llguidance.LLMatcher.grammar_from_lark}[kind]
        try:
            self.grammar = make(data)
        except Exception as exc:  # llguidance's parse errors (ValueError and its own)
            raise errors.RuntimeException(f"Error creating grammar: {exc}") from None
        self.vocab, self.eos, self.rows = vocab, eos, rows
        self.reset()

    def reset(self) -> None:
        self.matchers = [self._llg.LLMatcher(self.tokenizer, self.grammar)
                         for _ in range(self.rows)]
        err = self.matchers[0].get_error()
        if err:
            raise errors.RuntimeException(f"Error creating grammar: {err}")

    def mask(self, scores: np.ndarray, rows: np.ndarray) -> None:
        """Set the disallowed logits of the ``rows`` of ``scores`` (rows, vocab) in place."""
        from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask

        bits = allocate_token_bitmask(1, self.tokenizer.vocab_size)
        for r in rows:
            m = self.matchers[r]
            if m.is_stopped():
                allowed = np.zeros(scores.shape[1], bool)
                allowed[self.eos] = True
            else:
                fill_next_token_bitmask(m, bits, 0)
                if m.is_error():
                    raise errors.RuntimeException(f"Error computing mask: {m.get_error()}")
                allowed = np.unpackbits(bits[0].view(np.uint8), bitorder="little")
                allowed = allowed[:scores.shape[1]].astype(bool)
            scores[r, ~allowed] = np.finfo(np.float32).min

    def commit(self, tokens: np.ndarray, rows: np.ndarray) -> None:
        for r in rows:
            if not self.matchers[r].consume_token(int(tokens[r])):
                raise errors.RuntimeException(
                    f"Error committing tokens: {self.matchers[r].get_error()}")
