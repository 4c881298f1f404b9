"""The subset of Triton's ``ModelConfig`` that onnxrun serve reads: a model's
``config.pbtxt`` (protobuf text format), or the JSON form of the message that a repository load
request may carry instead (its ``config`` parameter).

Triton's ``ModelConfig`` proto is not a dependency, so both are parsed generically into
nested dicts (a repeated field becomes a list) and the known fields are read from that."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from ..errors import InvalidArgument

_TOKEN = re.compile(r"""\s*(?:\#[^\n]*                      # a comment
                           |("(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')  # a string
                           |([{}\[\]:,;<>])                  # punctuation
                           |([^\s{}\[\]:,;<>"'\#]+))          # a name or a number""", re.X)


DEFAULT_MAX_QUEUE_SIZE = 1024
# config.pbtxt's data types (Triton's ModelConfig DataType) -> the protocol's
CONFIG_TYPES = {"TYPE_BOOL": "BOOL", "TYPE_UINT8": "UINT8", "TYPE_UINT16": "UINT16",
                "TYPE_UINT32": "UINT32", "TYPE_UINT64": "UINT64", "TYPE_INT8": "INT8",
                "TYPE_INT16": "INT16", "TYPE_INT32": "INT32", "TYPE_INT64": "INT64",
                "TYPE_FP16": "FP16", "TYPE_FP32": "FP32", "TYPE_FP64": "FP64",
                "TYPE_STRING": "BYTES", "TYPE_BF16": "BF16"}


@dataclass(frozen=True)
class TensorConfig:
    """An ``input`` / ``output`` entry of config.pbtxt; the protocol's data type; dims without
    the batch dimension when the model batches, -1 for any size."""

    name: str
    datatype: str | None  # None: not said
    dims: list[int] | None  # None: not said
    label_filename: str = ""


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
    # the versions served: ("latest", n), ("all",) or ("specific", [versions])
    version_policy: tuple = ("latest", 1)
    inputs: list[TensorConfig] = field(default_factory=list)  # [] when not said
    outputs: list[TensorConfig] = field(default_factory=list)
    source: str = "config.pbtxt"  # where it came from, for errors ("config": a load request's)


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
    return _config(parse_text_proto(text))


def read_json_config(text: str, model: str) -> ModelConfig:
    """A ``ModelConfig`` from the JSON form of Triton's ModelConfig message (a load request's
    ``config`` parameter): field names as in the proto or in lowerCamelCase, 64-bit integers
    as numbers or strings (protobuf's JSON mapping). A ``name`` must be ``model``'s."""
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise InvalidArgument(f"config: the JSON is malformed: {e}") from None
    if not isinstance(obj, dict):
        raise InvalidArgument("config: the JSON must be an object (a ModelConfig)")
    fields = _json_fields(obj)
    name = _one(fields, "name", model)
    if name != model:
        raise InvalidArgument(f"config: its name '{name}' is not the model's, '{model}'")
    return _config(fields, "config")


def _snake(name: str) -> str:
    return re.sub(r"([A-Z])", lambda m: "_" + m.group(1).lower(), name)


def _json_fields(obj: dict) -> dict[str, list]:
    """JSON of a message -> what parse_text_proto makes of its text form (integers written
    as strings, "100", are read as numbers where a number is expected)."""
    return {_snake(k): [_json_fields(x) if isinstance(x, dict) else x
                        for x in (v if isinstance(v, list) else [v])]
            for k, v in obj.items()}


def _config(fields: dict[str, Any], where: str = "config.pbtxt") -> ModelConfig:
    """A ``ModelConfig`` from a parsed message (``where`` names it in errors)."""
    try:
        cfg = _read_fields(fields)
        cfg.source = where
        return cfg
    except InvalidArgument as e:
        if where == "config.pbtxt":
            raise
        raise InvalidArgument(str(e).replace("config.pbtxt:", f"{where}:", 1)) from None
    except (TypeError, ValueError, AttributeError) as e:  # a field of the wrong JSON type
        raise InvalidArgument(f"{where}: a field has the wrong type ({e})") from None


def _read_fields(fields: dict[str, Any]) -> ModelConfig:
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
        cfg.version_policy = _version_policy(policy)
    cfg.inputs = [_tensor(t, "input") for t in fields.get("input", [])]
    cfg.outputs = [_tensor(t, "output") for t in fields.get("output", [])]
    return cfg


def _version_policy(policy: Any) -> tuple:
    kinds = list(policy) if isinstance(policy, dict) else []
    if len(kinds) != 1 or kinds[0] not in ("latest", "all", "specific"):
        raise InvalidArgument(f"config.pbtxt: version_policy must be one of latest, all, "
                              f"specific, not {kinds}")
    kind, body = kinds[0], _one(policy, kinds[0], {})
    if kind == "latest":
        n = int(_one(body, "num_versions", 1))
        if n < 1:
            raise InvalidArgument(f"config.pbtxt: version_policy latest num_versions must be "
                                  f">= 1, not {n}")
        return ("latest", n)
    if kind == "all":
        return ("all",)
    versions = sorted({int(v) for v in body.get("versions", [])})
    if not versions:
        raise InvalidArgument("config.pbtxt: version_policy specific names no versions")
    return ("specific", versions)


def _tensor(entry: Any, kind: str) -> TensorConfig:
    if not isinstance(entry, dict) or not isinstance(_one(entry, "name", None), str):
        raise InvalidArgument(f"config.pbtxt: each {kind} needs a name")
    name = _one(entry, "name", None)
    data_type = _one(entry, "data_type", None)
    if data_type is not None and data_type not in CONFIG_TYPES:
        raise InvalidArgument(f"config.pbtxt: {kind} '{name}': unknown data_type {data_type}")
    if "reshape" in entry:
        raise InvalidArgument(f"config.pbtxt: {kind} '{name}': reshape is not supported")
    dims = entry.get("dims")
    if dims is not None:  # protobuf's JSON writes int64 as strings
        dims = [int(d) if isinstance(d, str) and re.fullmatch(r"-?\d+", d) else d for d in dims]
    if dims is not None and not all(isinstance(d, int) and not isinstance(d, bool) and d >= -1
                                    for d in dims):
        raise InvalidArgument(f"config.pbtxt: {kind} '{name}': dims must be integers >= -1, "
                              f"not {dims}")
    return TensorConfig(name, CONFIG_TYPES.get(data_type), dims,
                        str(_one(entry, "label_filename", "")))
