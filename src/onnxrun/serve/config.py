"""The subset of Triton's ``config.pbtxt`` (protobuf text format) that onnxrun serve reads.

Triton's ``ModelConfig`` proto is not a dependency, so the text is parsed generically into
nested dicts (a repeated field becomes a list) and the known fields are read from that."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from ..errors import InvalidArgument

_TOKEN = re.compile(r"""\s*(?:\#[^\n]*                      # a comment
                           |("(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')  # a string
                           |([{}\[\]:,;<>])                  # punctuation
                           |([^\s{}\[\]:,;<>"'\#]+))          # a name or a number""", re.X)


DEFAULT_MAX_QUEUE_SIZE = 1024


@dataclass
class ModelConfig:
    """What a model's ``config.pbtxt`` says (Triton's defaults where it is silent)."""

    max_batch_size: int = 0  # 0: the model's own shapes, no batching by the server
    dynamic_batching: bool = False
    preferred_batch_size: list[int] = field(default_factory=list)
    max_queue_delay_us: int = 0
    # requests waiting at most (dynamic_batching { default_queue_policy { max_queue_size } }):
    # more are refused at once (503), so an overload never grows memory without bound. Triton's
    # default, 0, is unbounded; onnxrun's is bounded.
    max_queue_size: int = DEFAULT_MAX_QUEUE_SIZE
    instance_count: int = 1
    version_policy: str = "latest"  # only "latest { num_versions: 1 }" is supported


def _tokens(text: str) -> list[str]:
    out, pos = [], 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            if text[pos:].strip() == "":
                break
            raise InvalidArgument(f"config.pbtxt: cannot parse near {text[pos:pos + 30]!r}")
        pos = m.end()
        tok = m.group(1) or m.group(2) or m.group(3)
        if tok:
            out.append(tok)
    return out


def parse_text_proto(text: str) -> dict[str, Any]:
    """Protobuf text format -> ``{field: value or [values]}``; messages are dicts."""
    toks = _tokens(text)
    pos = 0

    def value() -> Any:
        nonlocal pos
        tok = toks[pos]
        pos += 1
        if tok in ("{", "<"):
            return message("}" if tok == "{" else ">")
        if tok == "[":
            items = []
            while toks[pos] != "]":
                items.append(value())
                if toks[pos] == ",":
                    pos += 1
            pos += 1
            return items
        if tok[0] in "\"'":
            return tok[1:-1]
        try:
            return int(tok, 0)
        except ValueError:
            try:
                return float(tok)
            except ValueError:
                return tok  # an enum name, true/false

    def message(end: str | None) -> dict[str, Any]:
        nonlocal pos
        fields: dict[str, Any] = {}
        while pos < len(toks) and toks[pos] != end:
            name = toks[pos]
            pos += 1
            if pos < len(toks) and toks[pos] == ":":
                pos += 1
            v = value()
            values = v if isinstance(v, list) else [v]
            fields.setdefault(name, []).extend(values)
            if pos < len(toks) and toks[pos] in (",", ";"):
                pos += 1
        if end is not None:
            if pos >= len(toks):
                raise InvalidArgument(f"config.pbtxt: missing '{end}'")
            pos += 1
        return fields

    try:
        return message(None)
    except IndexError:
        raise InvalidArgument("config.pbtxt: unexpected end of text") from None


def _one(fields: dict[str, Any], name: str, default: Any) -> Any:
    values = fields.get(name)
    return values[-1] if values else default


def read_config(text: str) -> ModelConfig:
    """A ``ModelConfig`` from the text of a ``config.pbtxt``."""
    fields = parse_text_proto(text)
    cfg = ModelConfig(max_batch_size=int(_one(fields, "max_batch_size", 0)))
    if cfg.max_batch_size < 0:
        raise InvalidArgument(f"config.pbtxt: max_batch_size must be >= 0, not "
                              f"{cfg.max_batch_size}")
    batching = _one(fields, "dynamic_batching", None)
    if batching is not None:
        cfg.dynamic_batching = True
        cfg.preferred_batch_size = sorted(int(x) for x in batching.get("preferred_batch_size", []))
        cfg.max_queue_delay_us = int(_one(batching, "max_queue_delay_microseconds", 0))
        policy = _one(batching, "default_queue_policy", {})
        size = int(_one(policy, "max_queue_size", 0))
        if size < 0:
            raise InvalidArgument(f"config.pbtxt: max_queue_size must be >= 0, not {size}")
        cfg.max_queue_size = size or DEFAULT_MAX_QUEUE_SIZE
        if cfg.max_batch_size == 0:
            raise InvalidArgument("config.pbtxt: dynamic_batching needs max_batch_size > 0")
        for size in cfg.preferred_batch_size:
            if not 0 < size <= cfg.max_batch_size:
                raise InvalidArgument(f"config.pbtxt: preferred_batch_size {size} is not in "
                                      f"1..max_batch_size ({cfg.max_batch_size})")
    groups = fields.get("instance_group", [])
    if groups:
        cfg.instance_count = sum(int(_one(g, "count", 1)) for g in groups)
        if cfg.instance_count < 1:
            raise InvalidArgument("config.pbtxt: instance_group count must be >= 1")
    policy = _one(fields, "version_policy", None)
    if policy is not None:
        kinds = list(policy)
        latest = _one(policy, "latest", None)
        if kinds != ["latest"] or int(_one(latest, "num_versions", 1)) != 1:
            raise InvalidArgument(f"config.pbtxt: version_policy {kinds} is not supported yet "
                                  "(only latest { num_versions: 1 })")
    return cfg
