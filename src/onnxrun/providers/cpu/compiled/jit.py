"""LLVM IR text -> machine code for this CPU, callable through ctypes.

llvmlite (LLVM's Python binding, the compiler under numba) is an optional dependency: without
it, or on a CPU without the instructions a module needs, ``compile_module`` raises
``Unavailable`` and the kernels keep their numpy path. Modules are compiled once per process,
on first use, for the host CPU's own instruction set — in a child process (``_compiler.py``),
whose ELF object ``elf.py`` loads into executable memory here: the engine's process never loads
LLVM, which would cost it 60-80 MB of resident memory for good (more than an int8 model saves).
A compile costs ~0.3-0.7 s (the child's start included), once per module and process; the
bundle's objects are kept on disk (``ONNXRUN_KERNEL_CACHE``, default
``~/.cache/onnxrun/kernels``; ``0`` turns it off), keyed by the IR and the CPU's identity, so a
later process loads them in milliseconds.

ctypes releases the GIL for the duration of a call, so compiled kernels run truly in parallel
on the intra-op threads and under concurrent ``run`` calls. The generated functions only read
and write the buffers they are given; the Python wrappers check every shape and stride first.
"""

from __future__ import annotations

import base64
import ctypes
import hashlib
import importlib.util
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterable
from typing import Any

from . import elf


class Unavailable(RuntimeError):
    """The compiled path cannot be used here (no llvmlite, switched off, or CPU lacks a feature)."""


# ONNXRUN_COMPILED_KERNELS=0 keeps every kernel on its numpy path (for comparison and debugging).
_ENV_SWITCH = "ONNXRUN_COMPILED_KERNELS"
_COMPILE_TIMEOUT_S = 120

_lock = threading.Lock()
_state: dict[str, Any] = {}  # the first compiler process's answer: features, error, objects
_modules: dict[str, Any] = {}
_forced_off = 0  # depth of `disabled()` blocks


# Modules compiled together, in the first compiler process of a process (their IR is cheap to
# write; one process start instead of one per module): each lists ``BUNDLE``, name -> (IR
# factory, required features).
_BUNDLE = ("int8_gemm", "quantize", "int8_elementwise", "int8_depthwise", "lstm", "depthwise")


def _compile(modules: dict[str, tuple[str, Iterable[str]]]) -> dict:
    """One request to a compiler process; its answer (see _compiler.py). Without llvmlite
    the answer is known without starting one (every float model with an LSTM or a depthwise
    convolution asks once per process)."""
    if importlib.util.find_spec("llvmlite") is None:  # locates it; does not import it
        return {"features": [], "error": "ModuleNotFoundError: No module named 'llvmlite'",
                "objects": {}, "errors": {}}
    request = json.dumps({"modules": {name: {"ir": ir, "requires": sorted(req)}
                                      for name, (ir, req) in modules.items()}})
    try:
        # the script by path: importing the package would import onnxrun, onnx, numpy first
        done = subprocess.run([sys.executable, os.path.join(os.path.dirname(__file__),
                                                            "_compiler.py")],
                              input=request, capture_output=True, text=True,
                              timeout=_COMPILE_TIMEOUT_S, check=False)
        answer = json.loads(done.stdout) if done.stdout else None
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        answer = {"error": f"compiler process: {type(exc).__name__}: {exc}"}
    else:
        if answer is None:
            tail = (done.stderr or "").strip().splitlines()[-1:]
            answer = {"error": f"compiler process failed ({done.returncode}): "
                      f"{tail[0] if tail else 'no output'}"}
    return {"features": [], "error": None, "objects": {}, "errors": {}, **answer}


def _compile_bundle() -> None:
    """Compile the bundle in one compiler process, once: it also reports the host's features.
    Failures are remembered."""
    if _state:
        return
    modules = {}
    for short in _BUNDLE:
        bundle = importlib.import_module(f"{__package__}.{short}").BUNDLE
        modules.update({name: (factory(), req) for name, (factory, req) in bundle.items()})
    key = _cache_key(modules)
    answer = _cache_read(key)
    if answer is None:
        answer = _compile(modules)
        if not answer["error"]:
            _cache_write(key, answer)
    _state.update(features=set(answer["features"]), error=answer["error"],
                  objects=answer["objects"], errors=answer["errors"], key=key)


# -- the on-disk cache of the bundle's objects ---------------------------------------------------

_CACHE_ENV = "ONNXRUN_KERNEL_CACHE"
_CACHE_VERSION = 1


def _cache_dir() -> str | None:
    configured = os.environ.get(_CACHE_ENV)
    if configured is not None:
        return None if configured in ("", "0") else configured
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "onnxrun", "kernels")


def _cpu_identity() -> str | None:
    """What the compiled code depends on besides its IR: the CPU model and its feature flags
    (Linux's /proc/cpuinfo); None where they cannot be read (then nothing is cached)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            head = f.read(1 << 16).split("\n\n", 1)[0]
    except OSError:
        return None
    wanted = {k: v.strip() for k, _, v in (line.partition(":") for line in head.splitlines())
              if k.strip() in ("vendor_id", "model name", "cpu family", "model", "flags")}
    if "flags" not in " ".join(wanted):
        return None
    return f"{platform.machine()}|{sorted(wanted.items())}"


def _cache_key(modules: dict[str, tuple[str, Iterable[str]]]) -> str | None:
    cpu = _cpu_identity()
    if cpu is None or _cache_dir() is None:
        return None
    digest = hashlib.sha256(f"v{_CACHE_VERSION}|{cpu}".encode())
    for name in sorted(modules):
        ir_text, requires = modules[name]
        digest.update(f"|{name}|{sorted(requires)}|".encode())
        digest.update(ir_text.encode())
    return digest.hexdigest()


def _cache_read(key: str | None) -> dict | None:
    """A stored answer for ``key``, or None (missing, unreadable or not one of ours)."""
    folder = _cache_dir()
    if key is None or folder is None:
        return None
    try:
        with open(os.path.join(folder, f"{key}.json"), encoding="utf-8") as f:
            answer = json.load(f)
        if answer.get("key") != key or not isinstance(answer.get("objects"), dict):
            return None
        return {"features": list(answer["features"]), "error": None,
                "objects": dict(answer["objects"]), "errors": dict(answer.get("errors", {}))}
    except (OSError, ValueError, TypeError, KeyError):
        return None


def _cache_discard(key: str | None) -> None:
    folder = _cache_dir()
    if key is not None and folder is not None:
        try:
            os.unlink(os.path.join(folder, f"{key}.json"))
        except OSError:
            pass


def _cache_write(key: str | None, answer: dict) -> None:
    """Store an answer atomically (a temporary file renamed); failures only cost the cache."""
    folder = _cache_dir()
    if key is None or folder is None:
        return
    try:
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=".json")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump({"key": key, "features": answer["features"],
                           "objects": answer["objects"], "errors": answer["errors"]}, f)
            os.replace(tmp, os.path.join(folder, f"{key}.json"))
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError:
        pass


def enabled() -> bool:
    return _forced_off == 0 and os.environ.get(_ENV_SWITCH, "1") != "0"


def host_features() -> set[str]:
    """LLVM's names of the host CPU's features (e.g. 'avx512vnni'); empty without llvmlite."""
    with _lock:
        _compile_bundle()
    return set(_state["features"])


def why_unavailable(requires: Iterable[str] = ()) -> str | None:
    """None when modules needing ``requires`` can be compiled here, else the reason."""
    if not enabled():
        return f"switched off ({_ENV_SWITCH}=0 or compiled.disabled())"
    with _lock:
        _compile_bundle()
    if _state["error"]:
        return f"llvmlite unusable: {_state['error']}"
    missing = sorted(set(requires) - _state["features"])
    return f"the CPU lacks {', '.join(missing)}" if missing else None


_char, _addressof = ctypes.c_char, ctypes.addressof


def address(a) -> int:
    """The address of a contiguous numpy array's first byte: through the buffer protocol,
    ~6x cheaper than ``a.ctypes.data`` (which a read-only array still needs)."""
    try:
        return _addressof(_char.from_buffer(a))
    except (TypeError, ValueError, BufferError):
        return a.ctypes.data


class Module:
    """Compiled functions of one IR module, as ctypes callables named like the IR functions."""

    def __init__(self, code: elf.LoadedCode, functions: dict[str, Any]) -> None:
        self._code = code  # keeps the machine code mapped
        for name, fn in functions.items():
            setattr(self, name, fn)


def compile_module(name: str, ir: str, signatures: dict[str, Any],
                   requires: Iterable[str] = ()) -> Module:
    """Compile ``ir`` (LLVM assembly) once per process under ``name``; ``signatures`` maps each
    exported function to its ctypes prototype (``ctypes.CFUNCTYPE(...)``)."""
    reason = why_unavailable(requires)
    if reason:
        raise Unavailable(reason)
    with _lock:
        module = _modules.get(name)
        if module is None:
            code = None
            obj = _state["objects"].pop(name, None)  # compiled with the bundle, or cached
            if obj is not None:
                try:
                    code = elf.load(base64.b64decode(obj))
                except (elf.ObjectError, OSError, ValueError):
                    code = None  # a damaged cache entry: compile afresh, rebuild it next time
                    _cache_discard(_state.get("key"))
            if code is None:
                answer = _compile({name: (ir, requires)})
                obj = answer["objects"].get(name)
                if obj is None:
                    raise Unavailable(f"compiling {name}: "
                                      f"{answer['error'] or answer['errors'].get(name)}")
                try:
                    code = elf.load(base64.b64decode(obj))
                except (elf.ObjectError, OSError) as exc:  # e.g. no executable mappings
                    raise Unavailable(f"loading {name}: {exc}") from exc
            missing = set(signatures) - set(code.address)
            if missing:
                raise Unavailable(f"{name}: no function {sorted(missing)} in the object")
            functions = {fn: proto(code.address[fn]) for fn, proto in signatures.items()}
            module = _modules[name] = Module(code, functions)
        return module


class disabled:
    """``with compiled.disabled():`` kernels prepared inside the block take their numpy path."""

    def __enter__(self) -> None:
        global _forced_off
        with _lock:
            _forced_off += 1

    def __exit__(self, *exc) -> None:
        global _forced_off
        with _lock:
            _forced_off -= 1


__all__ = ["Module", "Unavailable", "address", "compile_module", "disabled", "enabled",
           "host_features", "why_unavailable"]
