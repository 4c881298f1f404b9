"""The compiled objects' entries in onnxrun's cache folder (``disk_cache.py``: where it is,
``ONNXRUN_KERNEL_CACHE``, and why an entry is trusted): one entry per compiler request, keyed
by the IR and the target it was compiled for, so a later process loads the objects without a
compiler. An entry that verifies but does not parse is deleted and compiled afresh.

An entry's payload: an 8-byte little-endian length, a JSON header of that length (the key, the
compiler's errors, each object's name and size, in order), then the objects' bytes one after
another. (Objects as base64 in one JSON document cost a process's first compiled kernel
~0.5 ms of JSON parsing and a decoding per module.)
"""

from __future__ import annotations

import base64
import json

from .... import disk_cache
from ....disk_cache import blake2b, folder
from .targets import Target

_VERSION = 5  # 2: entries carry an HMAC tag; 3: objects compiled for a named target;
# 4: keys and tags by (keyed) BLAKE2b; 5: the objects as bytes after a JSON header
_MAGIC = b"onnxrun-kernels 5\n"
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
    refused, or damaged: then deleted). Its objects are bytes."""
    if entry_key is None:
        return None
    payload = disk_cache.read(entry_name(entry_key), _MAGIC, entry_key, _MAX_ENTRY)
    if payload is None:
        return None
    answer = _parse(payload, entry_key)
    if answer is None:
        discard(entry_key)
    return answer


def _parse(payload: bytes, entry_key: str) -> dict | None:
    try:
        size = int.from_bytes(payload[:8], "little")
        header = json.loads(payload[8:8 + size])
        at, objects = 8 + size, {}
        for name, length in header["objects"]:
            if type(name) is not str or type(length) is not int or length < 0:
                return None
            objects[name] = payload[at:at + length]
            at += length
        if header["key"] != entry_key or at != len(payload) or len(payload) < 8 + size:
            return None
        return {"error": None, "objects": objects, "errors": dict(header["errors"])}
    except (ValueError, TypeError, KeyError):
        return None


def write(entry_key: str | None, answer: dict) -> None:
    """Store the compiler's ``answer`` (tagged) for ``entry_key``: its objects as bytes, or as
    base64 text (the compiler process's answer); failures only cost the cache."""
    if entry_key is None:
        return
    disk_cache.write(entry_name(entry_key), _MAGIC, entry_key, payload(entry_key, answer))


def payload(entry_key: str, answer: dict) -> bytes:
    """The bytes an entry holds (before its tag) for the compiler's ``answer``."""
    objects = {name: obj if isinstance(obj, bytes) else base64.b64decode(obj, validate=True)
               for name, obj in answer["objects"].items()}
    header = json.dumps({"key": entry_key, "errors": answer["errors"],
                         "objects": [[name, len(obj)] for name, obj in objects.items()]}).encode()
    return b"".join((len(header).to_bytes(8, "little"), header, *objects.values()))


_SOURCES_MAGIC = b"onnxrun-kernel-sources 1\n"
_DIGEST_CHARS = 64


def read_sources(identity: str) -> str | None:
    """The digest of the kernels' sources stored under ``identity`` (their files' identities:
    see ``write_sources``), or None."""
    if folder() is None:
        return None
    payload = disk_cache.read(f"{identity}.sources", _SOURCES_MAGIC, identity, 4096)
    if payload is None or len(payload) != _DIGEST_CHARS:
        return None
    try:
        text = payload.decode("ascii")
        int(text, 16)
    except ValueError:
        return None
    return text


def write_sources(identity: str, digest: str) -> None:
    """Store ``digest``, the hex digest of the kernels' sources' bytes, under ``identity``, a
    digest of the files' paths, devices, inodes, sizes and modification times (what Python's
    own bytecode cache trusts): a later process stats the files instead of reading and hashing
    them (~1 MB, ~1.3 ms of its first compiled kernel)."""
    if folder() is not None:
        disk_cache.write(f"{identity}.sources", _SOURCES_MAGIC, identity, digest.encode())


def discard(entry_key: str | None) -> None:
    """Delete the entry (its objects did not load): the next process stores a good one."""
    if entry_key is not None:
        disk_cache.discard(entry_name(entry_key))


__all__ = ["discard", "entry_name", "folder", "key", "payload", "read", "read_sources",
           "write", "write_sources"]
