"""LLVM IR text -> machine code for a named target CPU level, callable through ctypes.

llvmlite (LLVM's Python binding, the compiler under numba) is an optional dependency: without
it, on a host the loader does not handle (not x86-64 Linux), or where the selected target
lacks the instructions a module needs, ``compile_module`` raises ``Unavailable`` and the
kernels keep their numpy path. Each module is generated and compiled for one target
(``targets.py``: avx512vnni, avx512, avxvnni, avx2), the best the host supports unless
``ONNXRUN_COMPILED_TARGET`` or ``forced_target`` names another; once per process and target,
on first use, in a child process (``_compiler.py``) whose ELF object ``elf.py`` loads into
executable memory here: the engine's process never loads LLVM, which would cost it 60-80 MB of
resident memory for good (more than an int8 model saves). A compile costs ~0.3-0.7 s (the
child's start included); the objects are kept on disk (``cache.py``: ``ONNXRUN_KERNEL_CACHE``,
default ``~/.cache/onnxrun/kernels``; ``0`` turns it off), keyed by the IR and the target and
tagged with a per-user MAC, so a later process loads them in milliseconds.

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

from ....disk_cache import blake2b
from . import cache, elf, targets
from .targets import Target


class Unavailable(RuntimeError):
    """The compiled path cannot be used here (no llvmlite, switched off, a host the loader does
    not handle, or a target without the features a module needs)."""


# ONNXRUN_COMPILED_KERNELS=0 keeps every kernel on its numpy path (for comparison and debugging).
_ENV_SWITCH = "ONNXRUN_COMPILED_KERNELS"
_COMPILE_TIMEOUT_S = 120

_lock = threading.RLock()
_state: dict[str, dict] = {}  # target name -> its bundle's answer: error, objects, key, cached
_modules: dict[tuple[str, str], Any] = {}  # (module name, target name) -> Module
_failed: dict[tuple[str, str], str] = {}  # (module name, target name) -> why not (not retried)
_forced_off = 0  # depth of `disabled()` blocks
_forced_targets: list[str] = []  # `forced_target()` blocks, innermost last

# A module's IR: text, or a generator called with the target it is compiled for.
IR = str | Callable[[Target], str]

# Modules compiled together, in the first compiler process of a process and target (their IR
# is cheap to write; one process start instead of one per module): each lists ``BUNDLE``,
# name -> (IR generator taking the target, features the module needs of the target).
_BUNDLE = ("int8_gemm", "quantize", "int8_elementwise", "int8_depthwise", "lstm", "depthwise",
           "float_gemm", "nbits_gemv", "nbits_gemm", "logistic", "spin", "gqa",
           "rms_norm", "pool", "winograd", "layer_norm", "shuffle", "copy",
           "attention_heads", "scale_shift", "float_chain", "softmax", "batched_gemm")


def _compile(modules: dict[str, str], target: Target) -> dict:
    """One request to a compiler process (name -> IR text, compiled for ``target``); its answer
    (see _compiler.py). Without llvmlite the answer is known without starting one (every
    float model with an LSTM or a depthwise convolution asks once per process)."""
    if importlib.util.find_spec("llvmlite") is None:  # locates it; does not import it
        return {"error": "ModuleNotFoundError: No module named 'llvmlite'", "objects": {},
                "errors": {}}
    request = json.dumps({"target": {"triple": targets.TRIPLE, "cpu": target.cpu,
                                     "features": list(target.features)},
                          "modules": modules})
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
    return {"error": None, "objects": {}, "errors": {}, **answer}


def _obtain(modules: dict[str, str], target: Target,
            fresh: bool = False) -> tuple[dict, str | None, bool]:
    """The compiler's answer for ``modules`` on ``target``, its cache key, and whether it came
    from the cache (a verified entry; ``fresh`` skips it). A fresh answer is stored for later
    processes."""
    key = cache.key(modules, target)
    answer = None if fresh else cache.read(key)
    if answer is not None:
        return answer, key, True
    answer = _compile(modules, target)
    if not answer["error"]:
        cache.write(key, answer)
    return answer, key, False


def _bundle_ir(target: Target) -> dict[str, str]:
    """The IR of each bundled module that ``target`` can run."""
    modules = {}
    for short in _BUNDLE:
        bundle = importlib.import_module(f"{__package__}.{short}").BUNDLE
        modules.update({name: factory(target) for name, (factory, req) in bundle.items()
                        if set(req) <= set(target.features)})
    return modules


def _bundle_key(target: Target) -> str | None:
    """The bundle's cache key from the code that writes its IR (this package's sources) and
    the target, instead of the IR itself: writing every module's IR only to find the entry
    cost 30-100 ms, most of a small model's kernel preparation. None where the sources cannot
    be read (the IR's key is used then)."""
    digest = _sources_digest(os.path.dirname(os.path.abspath(__file__)))
    if digest is None:
        return None
    return cache.key({"bundle": ",".join(_BUNDLE), "sources": digest}, target)


def _sources_digest(here: str) -> str | None:
    """One digest of the package's sources' bytes (read as bytes: decoded to text they cost
    ~4 ms of every process's first compiled kernel, ~1.3 ms so), kept in the cache under the
    files' identities (``cache.write_sources``): a later process stats them (~0.1 ms)."""
    try:
        names = sorted(name for name in os.listdir(here) if name.endswith(".py"))
        stats = [os.stat(os.path.join(here, name)) for name in names]
    except OSError:
        return None
    identity = blake2b(here.encode(), digest_size=32)
    for name, st in zip(names, stats, strict=True):
        identity.update(f"|{name}|{st.st_dev}|{st.st_ino}|{st.st_size}|{st.st_mtime_ns}"
                        .encode())
    memo = identity.hexdigest()
    known = cache.read_sources(memo)
    if known is not None:
        return known
    digest = blake2b(digest_size=32)
    try:
        for name in names:
            with open(os.path.join(here, name), "rb") as f:
                data = f.read()
            digest.update(f"|{name}|{len(data)}|".encode())
            digest.update(data)
    except OSError:
        return None
    sources = digest.hexdigest()
    cache.write_sources(memo, sources)
    return sources


def _compile_bundle(target: Target) -> dict:
    """The bundle's modules that ``target`` can run, compiled in one compiler process, once per
    target; its state (failures are remembered)."""
    state = _state.get(target.name)
    if state is None:
        key = _bundle_key(target)
        answer = cache.read(key)
        cached = answer is not None
        if answer is None:
            modules = _bundle_ir(target)
            if key is None:
                answer, key, cached = _obtain(modules, target)
            else:
                answer = _compile(modules, target)
                if not answer["error"]:
                    cache.write(key, answer)
        state = _state[target.name] = dict(error=answer["error"], objects=answer["objects"],
                                           errors=answer["errors"], key=key, cached=cached)
    return state


def enabled() -> bool:
    return _forced_off == 0 and os.environ.get(_ENV_SWITCH, "1") != "0"


def host_features() -> set[str]:
    """LLVM's names of the host CPU's features (e.g. 'avx512vnni'); empty where unreadable."""
    return set(targets.host_features())


def _selected() -> tuple[Target | None, str | None]:
    name = _forced_targets[-1] if _forced_targets else os.environ.get(targets.ENV) or None
    target, reason = targets.select(name)
    if reason and name and not _forced_targets:
        reason = f"{targets.ENV}={name}: {reason}"
    return target, reason


def target() -> Target:
    """The target kernels prepared now are compiled for: the best the host supports, or the
    one forced (``forced_target``, else ``ONNXRUN_COMPILED_TARGET``). Raises ``Unavailable``
    where there is none."""
    selected, reason = _selected()
    if selected is None:
        raise Unavailable(reason)
    return selected


def _why(requires: Iterable[str]) -> tuple[Target | None, str | None]:
    if not enabled():
        return None, f"switched off ({_ENV_SWITCH}=0 or compiled.disabled())"
    selected, reason = _selected()
    if selected is None:
        return None, reason
    missing = sorted(set(requires) - set(selected.features))
    if missing:
        return None, f"the {selected.name} target lacks {', '.join(missing)}"
    with _lock:
        state = _compile_bundle(selected)
    if state["error"]:
        return None, f"llvmlite unusable: {state['error']}"
    return selected, None


def _switches() -> tuple:
    """What the answers below depend on besides the host: the switch and the forced target."""
    return (_forced_off, _getenv(_ENV_SWITCH),
            _forced_targets[-1] if _forced_targets else _getenv(targets.ENV))


def switches() -> tuple:
    """The switch state (see _switches), for kernels that remember answers of their own."""
    return _switches()


def _getenv(name: str) -> str | None:
    """``os.environ.get(name)``, read from the mapping's own data where it has CPython's
    POSIX layout: ``get`` of an unset name raises and catches a KeyError inside (~4 us), and
    the switches are read by every availability check (a YOLO-style creation: ~1,500 reads).
    The data is what ``os.environ`` writes through to, so a change is seen at once."""
    environ = os.environ
    data = getattr(environ, "_data", None)
    if type(data) is not dict or os.name != "posix":
        return environ.get(name)
    key = _ENV_KEYS.get(name)
    if key is None:
        key = _ENV_KEYS[name] = environ.encodekey(name)
    value = data.get(key)
    return None if value is None else environ.decodevalue(value)


_ENV_KEYS: dict[str, bytes] = {}  # _getenv's names as the environment's data holds them


def _answers() -> dict:
    """compile_module's and why_unavailable's remembered answers (kernels ask per call, e.g.
    Sigmoid whether its compiled path runs: a lookup instead of _why's checks, ~12 us), tied
    to _modules' identity: tests that reset it start from nothing."""
    global _ready, _ready_owner
    if _ready_owner is not _modules:
        _ready, _ready_owner = {}, _modules
    return _ready


def why_unavailable(requires: Iterable[str] = ()) -> str | None:
    """None when modules needing the features ``requires`` (LLVM's names) can be compiled for
    the selected target and loaded here, else the reason (remembered per switch state)."""
    key = ("why", tuple(requires), *_switches())
    answers = _answers()
    if key not in answers:
        answers[key] = _why(requires)[1]
    return answers[key]


def why_not_loaded(name: str, get: Callable[[], Module]) -> str | None:
    """None when ``get()`` (module ``name``'s ``compile_module`` call) loads it for the
    selected target, else why not: a kernel asks before it takes its compiled path, so an
    object that cannot be had (damaged, refused by the loader) leaves it on its numpy path.
    A lookup once answered (compile_module remembers failures too)."""
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


def elementwise_out(name: str, x: Any, out: Any) -> Any:
    """The output of an element-wise float32 kernel of ``x`` (contiguous float32): ``out``
    checked (the same; may be ``x``), or a new array when None. ``name``: the kernel's."""
    import numpy as np

    if x.dtype != np.float32 or not x.flags.c_contiguous:
        raise ValueError(f"{name}: expected a contiguous float32 array")
    if out is None:
        return np.empty(x.shape, np.float32)
    if out.shape != x.shape or out.dtype != np.float32 or not out.flags.c_contiguous:
        raise ValueError(f"{name}: out must be a contiguous float32 {list(x.shape)}")
    return out


class Module:
    """Compiled functions of one IR module, as ctypes callables named like the IR functions;
    ``target``: what it was compiled for (a wrapper packs its operands for that target)."""

    def __init__(self, code: elf.LoadedCode, functions: dict[str, Any], target: Target) -> None:
        self._code = code  # keeps the machine code mapped
        self.target = target
        for name, fn in functions.items():
            setattr(self, name, fn)


def compile_module(name: str, ir: IR, signatures: dict[str, Any],
                   requires: Iterable[str] = ()) -> Module:
    """Module ``name`` compiled for the selected target, once per process and target: ``ir``
    is its LLVM assembly, or a generator called with the target; ``signatures`` maps each
    exported function to its ctypes prototype (``ctypes.CFUNCTYPE(...)``); ``requires``: the
    features (LLVM's names) the IR needs of the target. Raises ``Unavailable`` (remembered:
    not retried) where the object cannot be had."""
    requires = tuple(requires)
    # Kernels call this per run (their module for the target selected now): the answer, a
    # module or why not, is remembered per switch/target state (~0.3 us instead of ~12 us).
    state = (name, requires, *_switches())
    answers = _answers()
    answer = answers.get(state)
    if answer is None:
        try:
            answer = _compile_module(name, ir, signatures, requires)
        except Unavailable as exc:
            answer = exc
        answers[state] = answer
    if isinstance(answer, Unavailable):
        raise Unavailable(str(answer))
    return answer


_ready: dict[tuple, Any] = {}  # compile_module's and why_unavailable's answers (_answers)
_ready_owner: dict | None = None


def _compile_module(name: str, ir: IR, signatures: dict[str, Any],
                    requires: Iterable[str]) -> Module:
    selected, reason = _why(requires)
    if selected is None:
        raise Unavailable(reason)
    key = (name, selected.name)
    with _lock:
        module = _modules.get(key)
        if module is None:
            if key in _failed:
                raise Unavailable(_failed[key])
            try:
                code = _code(name, ir, selected)
                missing = set(signatures) - set(code.address)
                if missing:
                    raise Unavailable(f"{name}: no function {sorted(missing)} in the object")
            except Unavailable as exc:
                _failed[key] = str(exc)
                raise
            functions = {fn: proto(code.address[fn]) for fn, proto in signatures.items()}
            module = _modules[key] = Module(code, functions, selected)
        return module


def _code(name: str, ir: IR, target: Target) -> elf.LoadedCode:
    """The loaded object of ``name`` for ``target``: the bundle's, else its own request's
    (cached like the bundle). An object that does not load is discarded with its cache entry
    and compiled afresh once. The IR is written only when the bundle lacks the object (an
    LSTM's module: ~10 ms of a first session)."""
    state = _compile_bundle(target)
    obj = state["objects"].pop(name, None)
    if obj is not None:
        try:
            return _load(name, obj)
        except elf.ObjectError:
            if state["cached"]:  # the next process compiles the bundle afresh and stores it
                cache.discard(state["key"])
    if callable(ir):
        ir = ir(target)
    fresh = False
    while True:
        answer, key, cached = _obtain({name: ir}, target, fresh)
        obj = answer["objects"].get(name)
        if obj is None:
            raise Unavailable(f"compiling {name} for {target.name}: "
                              f"{answer['error'] or answer['errors'].get(name)}")
        try:
            return _load(name, obj)
        except elf.ObjectError as exc:
            if not cached:
                raise Unavailable(f"loading {name}: {exc}") from exc
        cache.discard(key)
        fresh = True


def _load(name: str, obj: bytes | str) -> elf.LoadedCode:
    """Object ``obj`` loaded: bytes (the cache's), or base64 text (a compiler's answer)."""
    try:
        data = obj if isinstance(obj, bytes) else base64.b64decode(obj, validate=True)
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


class forced_target:
    """``with compiled.forced_target("avx2"):`` kernels prepared inside the block are compiled
    for that target (for tests and benchmarks: a host runs the code of every target below its
    best). Process-wide, like ``disabled``; an unknown name is a ValueError, a target the
    host lacks leaves the kernels on their numpy path (``why_unavailable`` says why)."""

    def __init__(self, name: str) -> None:
        self.name = targets.get(name).name

    def __enter__(self) -> Target:
        with _lock:
            _forced_targets.append(self.name)
        return targets.get(self.name)

    def __exit__(self, *exc) -> None:
        with _lock:
            del _forced_targets[len(_forced_targets) - 1 - _forced_targets[::-1].index(self.name)]


__all__ = ["IR", "Module", "Target", "Unavailable", "address", "compile_module", "disabled",
           "enabled", "forced_target", "host_features", "target", "why_not_loaded",
           "why_unavailable"]
