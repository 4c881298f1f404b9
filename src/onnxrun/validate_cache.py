"""Validation results kept across processes (validate.py's step, skipped for a model already
accepted): onnx's checker and shape inference first build onnx's schema registry, 15-25 ms
and ~7 MiB in every process's first session, for a result that depends only on the model's
weight-free skeleton, the onnx that checked it and onnxrun's validation code.

An entry (in ``disk_cache``'s folder, tagged like the compiled kernels: only this user's
onnxrun could have written it) is keyed by a BLAKE2b digest of the skeleton's bytes (nodes,
attributes, declared types, opsets, the small integer constants shape inference reads; never
the weights, which the skeleton leaves out), the onnx build (its C++ extension's path, size
and modification time: ``proto.onnx_build``, which imports nothing), the source of validate.py
and this module, and whether shapes were inferred. It holds the inferred value types and the
operators validation hid from the checker because a provider runs them (re-checked on use:
another set of providers may not). Only acceptances are stored, never refusals: an entry
that is missing, damaged, planted or unreadable means the full validation, never a model
accepted that the full validation would refuse.
"""

from __future__ import annotations

import base64
import json
import os

from . import disk_cache
from .proto import onnx, onnx_build

_MAGIC = b"onnxrun-validation 1\n"
_MAX_ENTRY = 16 << 20
_SOURCES = ("validate.py", "validate_cache.py")
_identity: list[bytes | None] = []  # once per process: onnx's version and our sources


def _code_identity() -> bytes | None:
    if not _identity:
        here = os.path.dirname(os.path.abspath(__file__))
        try:
            parts = [open(os.path.join(here, n), "rb").read() for n in _SOURCES]  # noqa: SIM115
        except OSError:  # sources not readable (a zip): no cache
            _identity.append(None)
        else:
            digest = disk_cache.blake2b(onnx_build().encode(), digest_size=32)
            for data in parts:
                digest.update(b"|%d|" % len(data))
                digest.update(data)
            _identity.append(digest.digest())
    return _identity[0]


def key(skeleton: bytes, infer_shapes: bool) -> str | None:
    """The entry key of a validation of these skeleton bytes; None where nothing is cached."""
    if disk_cache.folder() is None:
        return None
    code = _code_identity()
    if code is None:
        return None
    digest = disk_cache.blake2b(_MAGIC + code + (b"1" if infer_shapes else b"0"),
                                digest_size=32)
    digest.update(skeleton)
    return digest.hexdigest()


def _name(entry_key: str) -> str:
    return f"{entry_key}.validation"


def read(entry_key: str | None) -> tuple[list[str], dict[str, onnx.TypeProto] | None] | None:
    """(hidden operator types, inferred value types or None) of an accepted skeleton, if a
    verified entry holds them."""
    if entry_key is None:
        return None
    payload = disk_cache.read(_name(entry_key), _MAGIC, entry_key, _MAX_ENTRY)
    if payload is None:
        return None
    try:
        entry = json.loads(payload)
        if entry["key"] != entry_key:
            raise ValueError("another key")
        hidden = [str(op) for op in entry["hidden"]]
        types = None
        if entry["types"] is not None:
            graph = onnx.GraphProto.FromString(base64.b64decode(entry["types"], validate=True))
            types = {vi.name: vi.type for vi in graph.value_info}
        return hidden, types
    except Exception:  # verified yet unreadable (another onnxrun's format): validate afresh
        disk_cache.discard(_name(entry_key))
        return None


def write(entry_key: str | None, hidden: set[str],
          types: dict[str, onnx.TypeProto] | None) -> None:
    """Store an acceptance; failures only cost the cache."""
    if entry_key is None:
        return
    encoded = None
    if types is not None:
        graph = onnx.GraphProto()
        for name, tp in types.items():
            vi = graph.value_info.add()
            vi.name = name
            vi.type.CopyFrom(tp)
        encoded = base64.b64encode(graph.SerializeToString()).decode()
    payload = json.dumps({"key": entry_key, "hidden": sorted(hidden), "types": encoded})
    disk_cache.write(_name(entry_key), _MAGIC, entry_key, payload.encode())


__all__ = ["key", "read", "write"]
