"""onnxrun's on-disk cache folder (``ONNXRUN_KERNEL_CACHE``, default
``~/.cache/onnxrun/kernels``; ``0`` turns it off): entries that a later process reads instead
of doing the work again, each tagged so that only this user's onnxrun could have written it.
Three kinds live there: compiled kernels and the digest of their sources
(``providers/cpu/compiled/cache.py``), and validation results (``validate_cache.py``); each has
its own file suffix and tag prefix ("magic"), so an entry of one kind never verifies as another.

Whoever can write the cache decides what every later process runs (machine code; which models
are accepted), so an entry is used only when:

- the folder belongs to the current user and is not writable by group or others (otherwise
  the cache is not used at all, with one warning per process);
- the entry is a regular file of that user, not writable by group or others;
- its tag, keyed BLAKE2b (a MAC by design, no HMAC construction needed) with a per-user
  secret (``secret``: 32 random bytes, created atomically with mode 0600 in the folder,
  refused with a warning if its owner or mode is wrong), matches the magic, the key and the
  bytes. A plain digest would catch damage only: anyone able to plant an entry could write
  its digest too. The secret also ties an entry to the cache that wrote it: entries copied
  from another user or machine are refused.

An entry that fails its tag (damaged, planted, written by another secret) is deleted and the
work done afresh. Every file is reached through the opened folder's descriptor, so a folder
swapped after its check is never followed.
"""

from __future__ import annotations

import os
import stat
import warnings

# BLAKE2b and the constant-time comparison from the interpreter's own modules: hashlib and
# hmac import OpenSSL's libcrypto, which costs a process's first session 3.5 MiB resident
# and ~5 ms for digests of a few hundred kilobytes (the same functions, the same results).
try:
    from _blake2 import blake2b
    from _operator import _compare_digest as compare_digest
except ImportError:  # another interpreter
    from hashlib import blake2b
    from hmac import compare_digest

ENV = "ONNXRUN_KERNEL_CACHE"
_SECRET = "secret"
_SECRET_BYTES = 32
_TAG_CHARS = 64  # the hex digest of a 32-byte BLAKE2b
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)

_refused: set[str] = set()  # folders refused in this process: not used again, warned once


def folder() -> str | None:
    """The cache folder, or None when the cache is switched off."""
    configured = os.environ.get(ENV)
    if configured is not None:
        return None if configured in ("", "0") else configured
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "onnxrun", "kernels")


def _refuse(path: str, why: str) -> None:
    if path in _refused:
        return
    _refused.add(path)
    try:
        warnings.warn(f"onnxrun: the kernel cache {path} is not used: {why}; the compiled "
                      f"kernels are compiled in memory, models validated afresh (fix it, or "
                      f"set {ENV}=0)",
                      RuntimeWarning, stacklevel=3)
    except Warning:  # warnings turned into errors: the refusal stands, the session goes on
        pass


def _owned_safely(st: os.stat_result) -> bool:
    return st.st_uid == os.getuid() and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


class _Folder:
    """The checked, opened cache folder (``with _Folder(create) as f``); ``f.fd`` is None
    where it is missing, off or refused."""

    def __init__(self, create: bool) -> None:
        self.path, self.fd = folder(), None
        if self.path is None or self.path in _refused:
            return
        try:
            if create:
                os.makedirs(self.path, mode=0o700, exist_ok=True)
            fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | _O_CLOEXEC)
        except OSError:  # missing, or not ours to create: only the cache is lost
            return
        st = os.fstat(fd)
        if not _owned_safely(st):
            os.close(fd)
            owner = "another user" if st.st_uid != os.getuid() else "you"
            _refuse(self.path, f"it belongs to {owner} (uid {st.st_uid}) with mode "
                    f"{stat.S_IMODE(st.st_mode):04o}; it must be yours and not writable by "
                    "group or others")
            return
        self.fd = fd

    def __enter__(self) -> _Folder:
        return self

    def __exit__(self, *exc) -> None:
        if self.fd is not None:
            os.close(self.fd)

    def open_file(self, name: str) -> tuple[int, os.stat_result] | None:
        """A file of the folder opened for reading, if it is a regular file of ours that
        group and others cannot write; None where it is missing; refused (with the warning)
        otherwise."""
        try:
            fd = os.open(name, os.O_RDONLY | _O_NOFOLLOW | _O_CLOEXEC, dir_fd=self.fd)
        except FileNotFoundError:
            return None
        except OSError as exc:  # a symbolic link (ELOOP), unreadable: not one of ours
            _refuse(self.path, f"{name}: {exc.strerror}")
            raise _Refused from exc
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or not _owned_safely(st):
            os.close(fd)
            _refuse(self.path, f"{name} belongs to uid {st.st_uid} with mode "
                    f"{stat.S_IMODE(st.st_mode):04o}")
            raise _Refused
        return fd, st

    def write_file(self, name: str, data: bytes, exclusive: bool) -> None:
        """``data`` as ``name``, whole or not at all (a temporary file renamed, or linked
        where ``exclusive``: a file already there is kept)."""
        tmp = f".tmp-{os.urandom(8).hex()}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW | _O_CLOEXEC,
                     0o600, dir_fd=self.fd)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            if exclusive:
                try:
                    os.link(tmp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
                except FileExistsError:
                    pass
            else:
                os.replace(tmp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        finally:
            try:
                os.unlink(tmp, dir_fd=self.fd)
            except FileNotFoundError:  # renamed
                pass

    def secret(self, create: bool) -> bytes | None:
        """The folder's MAC key (made on first write), or None."""
        opened = self.open_file(_SECRET)
        if opened is None:
            if not create:
                return None
            self.write_file(_SECRET, os.urandom(_SECRET_BYTES), exclusive=True)
            opened = self.open_file(_SECRET)
            if opened is None:
                return None
        fd, st = opened
        with os.fdopen(fd, "rb") as f:
            data = f.read(_SECRET_BYTES + 1)
        if st.st_mode & 0o077 or len(data) != _SECRET_BYTES:
            _refuse(self.path, f"its {_SECRET} must be {_SECRET_BYTES} bytes with mode 0600 "
                    f"(found {len(data)} bytes, mode {stat.S_IMODE(st.st_mode):04o})")
            raise _Refused
        return data


class _Refused(Exception):
    """The folder or one of its files failed a check (already warned about)."""


def tag(secret: bytes, magic: bytes, key: str, payload: bytes) -> bytes:
    """The entry's MAC (hex): keyed BLAKE2b of the magic, the key and the payload."""
    mac = blake2b(magic + key.encode() + b"\0", digest_size=32, key=secret)
    mac.update(payload)
    return mac.hexdigest().encode()


def read(name: str, magic: bytes, key: str, max_bytes: int) -> bytes | None:
    """The payload of entry ``name`` if it is ``magic``'s and its tag verifies for ``key``;
    None where it is missing, refused, or damaged (then deleted)."""
    with _Folder(create=False) as f:
        if f.fd is None:
            return None
        try:
            opened = f.open_file(name)
            if opened is None:
                return None
            fd, st = opened
            with os.fdopen(fd, "rb") as file:
                data = file.read(max_bytes + 1)
            secret = f.secret(create=False)
        except (_Refused, OSError):
            return None
        payload = _verified(data, secret, magic, key, max_bytes)
        if payload is None:
            try:  # unless another process has just replaced it
                if os.stat(name, dir_fd=f.fd, follow_symlinks=False).st_ino == st.st_ino:
                    os.unlink(name, dir_fd=f.fd)
            except OSError:
                pass
        return payload


def _verified(data: bytes, secret: bytes | None, magic: bytes, key: str,
              max_bytes: int) -> bytes | None:
    head, tag_end = len(magic), len(magic) + _TAG_CHARS
    if secret is None or len(data) > max_bytes or not data.startswith(magic) or \
            data[tag_end:tag_end + 1] != b"\n":
        return None
    payload = data[tag_end + 1:]
    if not compare_digest(data[head:tag_end], tag(secret, magic, key, payload)):
        return None
    return payload


def write(name: str, magic: bytes, key: str, payload: bytes) -> None:
    """Store ``payload`` (tagged) as entry ``name``; failures only cost the cache."""
    with _Folder(create=True) as f:
        if f.fd is None:
            return
        try:
            secret = f.secret(create=True)
            if secret is not None:
                f.write_file(name, magic + tag(secret, magic, key, payload) + b"\n" + payload,
                             exclusive=False)
        except (_Refused, OSError):
            pass


def discard(name: str) -> None:
    """Delete entry ``name`` (it verified but could not be used)."""
    with _Folder(create=False) as f:
        if f.fd is not None:
            try:
                os.unlink(name, dir_fd=f.fd)
            except OSError:
                pass


__all__ = ["ENV", "blake2b", "discard", "folder", "read", "tag", "write"]
