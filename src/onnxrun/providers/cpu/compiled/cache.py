"""The compiled objects' entries in onnxrun's cache folder (``disk_cache.py``: where it is,
``ONNXRUN_KERNEL_CACHE``, and why an entry is trusted): one entry per compiler request, keyed
by the IR and the target it was compiled for, so a later process loads the objects without a
compiler. An entry that verifies but does not parse is deleted and compiled afresh.
"""

from __future__ import annotations

import json

from .... import disk_cache
from ....disk_cache import blake2b, folder
from .targets import Target

_VERSION = 4  # 2: entries carry an HMAC tag; 3: objects compiled for a named target;
# 4: keys and tags by (keyed) BLAKE2b
_MAGIC = b"onnxrun-kernels 4\n"
_MAX_ENTRY = 64 << 20


def key(modules: dict[str, str], target: Target) -> str | None:
    """The entry name of a compiler request (name -> IR text, compiled for ``target``); None
    where nothing is cached. The objects depend on the IR and the target only (the compiler
    is given the target's CPU level and features, never the host's)."""
    if folder() is None:
        return None
    digest = blake2b(f"v{_VERSION}|{target.identity}".encode(), digest_size=32)
    for name in sorted(modules):
        digest.update(f"|{name}|{len(modules[name])}|".encode())
        digest.update(modules[name].encode())
    return digest.hexdigest()


def entry_name(entry_key: str) -> str:
    return f"{entry_key}.kernels"


def read(entry_key: str | None) -> dict | None:
    """The compiler's answer stored for ``entry_key`` if its tag verifies, else None (missing,
    refused, or damaged: then deleted)."""
    if entry_key is None:
        return None
    payload = disk_cache.read(entry_name(entry_key), _MAGIC, entry_key, _MAX_ENTRY)
    if payload is None:
        return None
    try:
        answer = json.loads(payload)
        if answer["key"] == entry_key:
            return {"error": None, "objects": dict(answer["objects"]),
                    "errors": dict(answer["errors"])}
    except (ValueError, TypeError, KeyError):
        pass
    discard(entry_key)
    return None


def write(entry_key: str | None, answer: dict) -> None:
    """Store the compiler's ``answer`` (tagged) for ``entry_key``; failures only cost the
    cache."""
    if entry_key is None:
        return
    payload = json.dumps({"key": entry_key, "objects": answer["objects"],
                          "errors": answer["errors"]}).encode()
    disk_cache.write(entry_name(entry_key), _MAGIC, entry_key, payload)


def discard(entry_key: str | None) -> None:
    """Delete the entry (its objects did not load): the next process stores a good one."""
    if entry_key is not None:
        disk_cache.discard(entry_name(entry_key))


__all__ = ["discard", "entry_name", "folder", "key", "read", "write"]
