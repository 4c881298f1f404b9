"""LLVM IR text -> machine code for this CPU, callable through ctypes.

llvmlite (LLVM's Python binding, the compiler under numba) is an optional dependency: without
it, or on a CPU without the instructions a module needs, ``compile_module`` raises
``Unavailable`` and the kernels keep their numpy path. Modules are compiled once per process,
on first use, for the host CPU's own instruction set — in a child process (``_compiler.py``),
whose ELF object ``elf.py`` loads into executable memory here: the engine's process never loads
LLVM, which would cost it 60-80 MB of resident memory for good (more than an int8 model saves).
A compile costs ~0.3-0.7 s (the child's start included), once per module and process; the
objects are kept on disk (``cache.py``: ``ONNXRUN_KERNEL_CACHE``, default
``~/.cache/onnxrun/kernels``; ``0`` turns it off), keyed by the IR and the CPU's identity and
tagged with a per-user HMAC, so a later process loads them in milliseconds.

ctypes releases the GIL for the duration of a call, so compiled kernels run truly in parallel
on the intra-op threads and under concurrent ``run`` calls. The generated functions only read
and write the buffers they are given; the Python wrappers check every shape and stride first.
"""

from __future__ import annotations

import base64
import ctypes
import importlib.util
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable
from typing import Any

from . import cache, elf


class Unavailable(RuntimeError):
    """The compiled path cannot be used here (no llvmlite, switched off, or CPU lacks a feature)."""


# ONNXRUN_COMPILED_KERNELS=0 keeps every kernel on its numpy path (for comparison and debugging).
_ENV_SWITCH = "ONNXRUN_COMPILED_KERNELS"
_COMPILE_TIMEOUT_S = 120

_lock = threading.Lock()
_state: dict[str, Any] = {}  # the first compiler process's answer: features, error, objects
_modules: dict[str, Any] = {}
_failed: dict[str, str] = {}  # module name -> why it could not be had (not retried)
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


def _obtain(modules: dict[str, tuple[str, Iterable[str]]],
            fresh: bool = False) -> tuple[dict, str | None, bool]:
    """The compiler's answer for ``modules``, its cache key, and whether it came from the cache
    (a verified entry; ``fresh`` skips it). A fresh answer is stored for later processes."""
    key = cache.key(modules)
    answer = None if fresh else cache.read(key)
    if answer is not None:
        return answer, key, True
    answer = _compile(modules)
    if not answer["error"]:
        cache.write(key, answer)
    return answer, key, False


def _compile_bundle() -> None:
    """Compile the bundle in one compiler process, once: it also reports the host's features.
    Failures are remembered."""
    if _state:
        return
    modules = {}
    for short in _BUNDLE:
        bundle = importlib.import_module(f"{__package__}.{short}").BUNDLE
        modules.update({name: (factory(), req) for name, (factory, req) in bundle.items()})
    answer, key, cached = _obtain(modules)
    _state.update(features=set(answer["features"]), error=answer["error"],
                  objects=answer["objects"], errors=answer["errors"], key=key, cached=cached)


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


def why_not_loaded(name: str, get: Callable[[], Module]) -> str | None:
    """None when module ``name`` is loaded or ``get()`` (its ``compile_module`` call) loads it,
    else why not: a kernel asks before it takes its compiled path, so an object that cannot be
    had (damaged, refused by the loader) leaves it on its numpy path. Cheap once answered."""
    if name in _modules:
        return None
    if name in _failed:
        return _failed[name]
    try:
        get()
    except Unavailable as exc:
        return str(exc)
    return None


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
    exported function to its ctypes prototype (``ctypes.CFUNCTYPE(...)``). Raises
    ``Unavailable`` (remembered: not retried) where the object cannot be had."""
    reason = why_unavailable(requires)
    if reason:
        raise Unavailable(reason)
    with _lock:
        module = _modules.get(name)
        if module is None:
            if name in _failed:
                raise Unavailable(_failed[name])
            try:
                code = _code(name, ir, requires)
                missing = set(signatures) - set(code.address)
                if missing:
                    raise Unavailable(f"{name}: no function {sorted(missing)} in the object")
            except Unavailable as exc:
                _failed[name] = str(exc)
                raise
            functions = {fn: proto(code.address[fn]) for fn, proto in signatures.items()}
            module = _modules[name] = Module(code, functions)
        return module


def _code(name: str, ir: str, requires: Iterable[str]) -> elf.LoadedCode:
    """The loaded object of ``name``: the bundle's, else its own request's (cached like the
    bundle). An object that does not load is discarded with its cache entry and compiled
    afresh once."""
    obj = _state["objects"].pop(name, None)
    if obj is not None:
        try:
            return _load(name, obj)
        except elf.ObjectError:
            if _state["cached"]:  # the next process compiles the bundle afresh and stores it
                cache.discard(_state["key"])
    fresh = False
    while True:
        answer, key, cached = _obtain({name: (ir, requires)}, fresh)
        obj = answer["objects"].get(name)
        if obj is None:
            raise Unavailable(f"compiling {name}: {answer['error'] or answer['errors'].get(name)}")
        try:
            return _load(name, obj)
        except elf.ObjectError as exc:
            if not cached:
                raise Unavailable(f"loading {name}: {exc}") from exc
        cache.discard(key)
        fresh = True


def _load(name: str, obj: str) -> elf.LoadedCode:
    try:
        data = base64.b64decode(obj, validate=True)
    except (ValueError, TypeError) as exc:
        raise elf.ObjectError(f"not base64: {exc}") from exc
    try:
        return elf.load(data)
    except OSError as exc:  # e.g. no executable mappings allowed here
        raise Unavailable(f"loading {name}: {exc}") from exc


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
           "host_features", "why_not_loaded", "why_unavailable"]
