"""onnxruntime-genai's ``Tokenizer`` and ``TokenizerStream`` over the ``tokenizers`` library.

The folder's ``tokenizer.json`` is the tokenizer; ``tokenizer_config.json`` adds the special
tokens (pad, bos, eos) and the chat template. Decoding skips special tokens, as
onnxruntime-genai's does.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import errors
from .tensors import Tensor, as_array

if TYPE_CHECKING:
    from .model import Model


def _load_tokenizers():
    try:
        import tokenizers  # noqa: PLC0415 - optional dependency (the genai extra)
    except ImportError:
        raise errors.NotImplemented(
            "onnxrun.genai.Tokenizer needs the tokenizers package: pip install 'onnxrun[genai]'"
        ) from None
    return tokenizers


class Tokenizer:
    def __init__(self, model: Model) -> None:
        tokenizers = _load_tokenizers()
        folder = model.config.path
        file = os.path.join(folder, "tokenizer.json")
        if not os.path.isfile(file):
            raise errors.NoSuchFile(f"{file} not found: the model folder has no tokenizer.json")
        try:
            self._tok = tokenizers.Tokenizer.from_file(file)
        except Exception as exc:  # the library raises plain Exception on bad files
            raise errors.InvalidArgument(f"cannot load {file}: {exc}") from None
        self._tok.no_padding()
        self._tok.no_truncation()
        self._settings: dict[str, Any] = {}
        self._byte_alphabet: dict[str, int] | None | bool = False  # False: not looked at yet
        added = self._tok.get_added_tokens_decoder()
        self._special_ids = {i for i, t in added.items() if t.special}
        self._added_ids = set(added)
        cfg = os.path.join(folder, "tokenizer_config.json")
        if os.path.isfile(cfg):
            with open(cfg, encoding="utf-8") as f:
                self._settings = json.load(f)
        mcfg = model.config.model
        self.eos_token_ids = np.asarray(model.config.eos_token_ids(), dtype=np.int32)
        self.pad_token_id = int(mcfg.get("pad_token_id", self.eos_token_ids[0]
                                         if len(self.eos_token_ids) else 0))
        self.bos_token_id = int(mcfg.get("bos_token_id", -1))

    # -- onnxruntime-genai's methods -----------------------------------------------------------
    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self._tok.encode(str(text)).ids, dtype=np.int32)

    def decode(self, tokens: Any) -> str:
        ids = np.asarray(as_array(tokens)).reshape(-1)
        return self._tok.decode([int(t) for t in ids], skip_special_tokens=True)

    def encode_batch(self, texts: list[str]) -> Tensor:
        """The prompts' ids as one (batch, longest) array, padded on the right with the pad
        token (what ``Generator.append_tokens`` takes for a batch)."""
        rows = [self.encode(t) for t in texts]
        if not rows:
            raise errors.InvalidArgument("encode_batch: no strings given")
        out = np.full((len(rows), max(len(r) for r in rows)), self.pad_token_id, np.int32)
        for i, r in enumerate(rows):
            out[i, :len(r)] = r
        return Tensor(out)

    def decode_batch(self, tokens: Any) -> list[str]:
        ids = as_array(tokens)
        if ids.ndim != 2:
            raise errors.InvalidArgument(f"decode_batch expects a 2-D array, got shape {ids.shape}")
        return [self.decode(row) for row in ids]

    def create_stream(self) -> TokenizerStream:
        return TokenizerStream(self)

    def to_token_id(self, text: str) -> int:
        tid = self._tok.token_to_id(str(text))
        if tid is None:
            raise errors.InvalidArgument(f"{text!r} is not a token of this tokenizer")
        return int(tid)

    def apply_chat_template(self, messages: str, *, template_str: str | None = None,
                            tools: str | None = None, add_generation_prompt: bool = True) -> str:
        """The prompt for a chat (messages as a JSON list), through the folder's (or the given)
        Jinja chat template."""
        template = template_str or self._settings.get("chat_template")
        if not template:
            raise errors.InvalidArgument("this tokenizer has no chat template; pass template_str")
        try:
            import jinja2  # noqa: PLC0415 - optional: only chat templates need it
        except ImportError:
            raise errors.NotImplemented("apply_chat_template needs the jinja2 package") from None
        msgs = json.loads(messages) if isinstance(messages, str) else messages
        env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
        special = {k: self._settings.get(k) for k in ("bos_token", "eos_token", "pad_token")}
        return env.from_string(template).render(
            messages=msgs, tools=json.loads(tools) if tools else None,
            add_generation_prompt=add_generation_prompt, **special)

    def _decode_ids(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=True)

    def _byte_level(self) -> dict[str, int] | None:
        """The byte alphabet when tokens are byte-level BPE strings (GPT-2, Llama 3, Qwen, Phi
        4...), else None."""
        if self._byte_alphabet is False:
            spec = json.loads(self._tok.to_str()).get("decoder") or {}
            kinds = {spec.get("type")} | {d.get("type") for d in spec.get("decoders", []) or []}
            self._byte_alphabet = _byte_level_alphabet() if "ByteLevel" in kinds else None
        return self._byte_alphabet

    def _token_bytes(self, token: int, alphabet: dict[str, int]) -> bytes | None:
        if token in self._special_ids:
            return None
        text = self._tok.id_to_token(token)
        if text is None:
            raise errors.InvalidArgument(f"token id {token} is not in the vocabulary")
        if token in self._added_ids:
            return text.encode("utf-8")
        return bytes(alphabet[c] for c in text)


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level alphabet: the character that stands for each byte in a token."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


# bytes in the unit a lead byte starts, as genai's stream counts them (0xF8-0xFF as four too;
# checked against it on random token runs); a stray continuation byte is alone
_UNIT_LENGTH = [1] * 0xC0 + [2] * 32 + [3] * 16 + [4] * 16


def _utf8_units(buf: bytearray) -> tuple[str, int]:
    """The text of the whole UTF-8 units at the start of ``buf`` and how many bytes they take.
    A unit is as long as its lead byte says; one that does not decode is dropped whole, and a
    unit still missing bytes waits."""
    out, i = [], 0
    while i < len(buf):
        b = buf[i]
        n = _UNIT_LENGTH[b]
        if i + n > len(buf):
            break
        try:
            out.append(bytes(buf[i:i + n]).decode("utf-8"))
        except UnicodeDecodeError:
            pass
        i += n
    return "".join(out), i


class TokenizerStream:
    """Decodes one token at a time: the text of the characters this token completes; a
    multi-byte character split over tokens comes out once its last byte has arrived."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self._dec = tokenizer._decode_ids
        self._byte_level = tokenizer._byte_level()
        self._pending = bytearray()  # byte-level: bytes of an incomplete character
        self._ids: list[int] = []
        self._emitted = 0  # text mode: characters of decode(self._ids) already returned

    def decode(self, token: int) -> str:
        if self._byte_level is not None:
            out = self._decode_bytes(int(token))
        else:
            out = self._decode_text(int(token))
        return out.split("\x00", 1)[0]  # genai hands back a C string

    def _decode_bytes(self, token: int) -> str:
        piece = self._tokenizer._token_bytes(token, self._byte_level)
        if piece is None:  # a special token
            return ""
        self._pending += piece
        text, used = _utf8_units(self._pending)
        del self._pending[:used]
        return text

    def _decode_text(self, token: int) -> str:
        self._ids.append(token)
        text = self._dec(self._ids)
        stable = text.rstrip("\ufffd")  # trailing bytes of an incomplete character wait
        out = stable[self._emitted:].replace("\ufffd", "") if len(stable) > self._emitted else ""
        self._emitted = max(self._emitted, len(stable))
        if stable == text and len(self._ids) > 1:
            # complete: keep only the last token as context (a SentencePiece-style leading
            # space depends on what precedes it), so each step decodes a few tokens
            self._ids = self._ids[-1:]
            self._emitted = len(self._dec(self._ids))
        return out
