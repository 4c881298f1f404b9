"""LLVM IR text -> machine code for this CPU, callable through ctypes.

llvmlite (LLVM's Python binding, the compiler under numba) is an optional dependency: without
it, or on a CPU without the instructions a module needs, ``compile_module`` raises
``Unavailable`` and the kernels keep their numpy path. Modules are compiled once per process,
on first use (tens of milliseconds each), for the host CPU's own instruction set.

ctypes releases the GIL for the duration of a call, so compiled kernels run truly in parallel
on the intra-op threads and under concurrent ``run`` calls. The generated functions only read
and write the buffers they are given; the Python wrappers check every shape and stride first.
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Iterable
from typing import Any


class Unavailable(RuntimeError):
    """The compiled path cannot be used here (no llvmlite, switched off, or CPU lacks a feature)."""


# ONNXRUN_COMPILED_KERNELS=0 keeps every kernel on its numpy path (for comparison and debugging).
_ENV_SWITCH = "ONNXRUN_COMPILED_KERNELS"

_lock = threading.Lock()
_state: dict[str, Any] = {}  # "llvm", "target_machine", "features", "error"
_modules: dict[str, Any] = {}
_forced_off = 0  # depth of `disabled()` blocks


def _init_llvm() -> None:
    """Import llvmlite and build the host target machine, once; failures are remembered."""
    if _state:
        return
    try:
        import llvmlite.binding as llvm

        try:  # llvmlite < 0.45 needs an explicit initialize(); newer ones refuse it
            llvm.initialize()
        except RuntimeError:
            pass
        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        features = llvm.get_host_cpu_features()
        target = llvm.Target.from_default_triple()
        tm = target.create_target_machine(cpu=llvm.get_host_cpu_name(),
                                          features=features.flatten(), opt=3,
                                          codemodel="jitdefault")
        _state.update(llvm=llvm, target_machine=tm,
                      features={k for k, v in features.items() if v}, error=None)
    except Exception as exc:  # ImportError, or an LLVM that cannot target this host
        _state.update(llvm=None, target_machine=None, features=set(),
                      error=f"{type(exc).__name__}: {exc}")


def enabled() -> bool:
    return _forced_off == 0 and os.environ.get(_ENV_SWITCH, "1") != "0"


def host_features() -> set[str]:
    """LLVM's names of the host CPU's features (e.g. 'avx512vnni'); empty without llvmlite."""
    with _lock:
        _init_llvm()
    return set(_state["features"])


def why_unavailable(requires: Iterable[str] = ()) -> str | None:
    """None when modules needing ``requires`` can be compiled here, else the reason."""
    if not enabled():
        return f"switched off ({_ENV_SWITCH}=0 or compiled.disabled())"
    with _lock:
        _init_llvm()
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

    def __init__(self, engine: Any, functions: dict[str, Any]) -> None:
        self._engine = engine  # keeps the machine code alive
        for name, fn in functions.items():
            setattr(self, name, fn)


def compile_module(name: str, ir: str, signatures: dict[str, ctypes._CFuncPtr],
                   requires: Iterable[str] = ()) -> Module:
    """Compile ``ir`` (LLVM assembly) once per process under ``name``; ``signatures`` maps each
    exported function to its ctypes prototype (``ctypes.CFUNCTYPE(...)``)."""
    reason = why_unavailable(requires)
    if reason:
        raise Unavailable(reason)
    with _lock:
        module = _modules.get(name)
        if module is None:
            llvm = _state["llvm"]
            parsed = llvm.parse_assembly(ir)
            parsed.verify()
            engine = llvm.create_mcjit_compiler(parsed, _state["target_machine"])
            engine.finalize_object()
            functions = {fn: proto(engine.get_function_address(fn))
                         for fn, proto in signatures.items()}
            module = _modules[name] = Module(engine, functions)
        return module


def assembly(ir: str) -> str:
    """The host assembly of ``ir`` (for tests that check which instructions were selected)."""
    reason = why_unavailable()
    if reason:
        raise Unavailable(reason)
    return _state["target_machine"].emit_assembly(_state["llvm"].parse_assembly(ir))


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


__all__ = ["Module", "Unavailable", "address", "assembly", "compile_module", "disabled", "enabled",
           "host_features", "why_unavailable"]
