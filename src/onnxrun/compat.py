"""Run code written for onnxruntime on onnxrun, unchanged.

In-process::

    import onnxrun.compat
    onnxrun.compat.install()        # from here on, ``import onnxruntime`` gives onnxrun
    import onnxruntime as ort
    sess = ort.InferenceSession("model.onnx", providers=["CPUExecutionProvider"])
    from onnxruntime.capi.onnxruntime_pybind11_state import InvalidArgument
    ...
    onnxrun.compat.uninstall()      # restore whatever ``onnxruntime`` was before

From the command line, for a script or module that imports onnxruntime::

    python -m onnxrun.compat script.py [args...]
    python -m onnxrun.compat -m package.module [args...]

``install()`` puts onnxruntime's package in ``sys.modules`` and a finder on ``sys.meta_path``:
``onnxruntime``, ``onnxruntime.capi``, ``onnxruntime.capi._pybind_state``,
``onnxruntime.capi.onnxruntime_pybind11_state`` (the native classes and the exception classes:
Fail, InvalidArgument, NoSuchFile, InvalidProtobuf, InvalidGraph, NotImplemented,
RuntimeException, EPFail...) and ``onnxruntime.capi.onnxruntime_inference_collection``
(InferenceSession, IOBinding, OrtValue) are built at install, and ``onnxruntime_genai`` is
``onnxrun.genai`` (onnxruntime-genai's API: its example scripts run unchanged); every other
``onnxruntime.X.Y`` is onnxrun's ``onnxrun.X.Y`` module itself, imported only when first asked
for (``onnxruntime.quantization``, ``onnxruntime.transformers.float16``, ``onnxruntime.tools``...).
A submodule onnxrun does not have raises ``ModuleNotFoundError`` naming it.
It works whether or not the real onnxruntime is installed or already imported: after
``install()`` onnxrun wins, and ``uninstall()`` puts the previous modules back. Modules that
bound the old ``onnxruntime`` before ``install()`` keep their reference to it.
``onnxruntime.__version__`` is onnxrun's version. Child processes started with the ``spawn``
method re-import the script without the alias: call ``install()`` at the top of the script
instead if it uses them.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import runpy
import sys
import types
from typing import Any

import onnxrun

from . import errors

_TOP = "onnxruntime"
_NAMES = (
    "onnxruntime",
    "onnxruntime.capi",
    "onnxruntime.capi._pybind_state",
    "onnxruntime.capi.onnxruntime_pybind11_state",
    "onnxruntime.capi.onnxruntime_inference_collection",
)
# What sys.modules held under onnxruntime's names before install(); None while not installed.
_saved: dict[str, types.ModuleType] | None = None
_modules: dict[str, types.ModuleType] | None = None
_finder: _AliasFinder | None = None

# onnxruntime's native module: the exception classes (below) and these names of onnxrun's top
# level, which onnxruntime's pybind module defines and its package re-exports.
_NATIVE = (
    "SessionOptions", "RunOptions", "GraphOptimizationLevel", "ExecutionMode", "ExecutionOrder",
    "ModelMetadata", "NodeArg", "get_available_providers", "get_all_providers", "get_device",
    "get_version_string", "get_build_info", "set_default_logger_severity",
    "set_default_logger_verbosity", "set_seed", "enable_telemetry_events",
    "disable_telemetry_events", "OrtAllocatorType", "OrtArenaCfg", "OrtDeviceMemoryType",
    "OrtHardwareDeviceType", "OrtMemType", "OrtMemoryInfo", "OrtMemoryInfoDeviceType",
    "create_and_register_allocator", "create_and_register_allocator_v2",
    "set_global_thread_pool_sizes", "SparseTensor", "OrtSparseFormat", "AdapterFormat",
    "LoraAdapter", "OrtEpDevice", "OrtHardwareDevice", "get_ep_devices",
)


def _exception(name: str) -> type[Exception]:
    # onnxruntime status codes that onnxrun never raises: defined so ``except`` clauses naming
    # them still work.
    return type(name, (errors.Fail,), {"__module__": _NAMES[3], "__doc__": f"onnxruntime's {name}"})


def _module(name: str, doc: str, attrs: dict[str, Any], package: bool = False
            ) -> types.ModuleType:
    mod = types.ModuleType(name, doc)
    mod.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=package)
    if package:
        # Submodules come from the finder, never from a folder.
        mod.__path__ = []
        mod.__spec__.submodule_search_locations = []
    mod.__file__ = onnxrun.__file__ if name == "onnxruntime" else __file__
    mod.__dict__.update(attrs)
    return mod


def _build() -> dict[str, types.ModuleType]:
    from .api import blockwise, devices, ep_devices
    from .api.ortvalue import OrtValue
    from .api.ortvalue_vector import OrtValueVector
    from .api.session import check_and_normalize_provider_args

    public = {n: v for n, v in vars(onnxrun).items()
              if not n.startswith("_") and not isinstance(v, types.ModuleType)}
    public["__version__"] = onnxrun.__version__
    public["preload_dlls"] = _preload_dlls

    exceptions: dict[str, Any] = {
        n: getattr(errors, n)
        for n in ("Fail", "InvalidArgument", "NoSuchFile", "InvalidProtobuf", "InvalidGraph",
                  "NotImplemented", "RuntimeException", "EPFail")
    }
    for n in ("EngineError", "ModelLoaded", "NoModel", "NotFound", "DeviceReset",
              "ModelLoadCanceled", "ModelRequiresCompilation"):
        exceptions[n] = _exception(n)
    # _pybind_state re-exports the native module: the exceptions and the C++-level classes.
    native = dict(exceptions)
    for n in _NATIVE:
        if n in public:
            native[n] = public[n]
    native["OrtValue"] = OrtValue
    # Names only the native module has; its OrtDevice is the class onnxruntime.OrtDevice wraps.
    native.update(OrtDevice=devices.NativeOrtDevice, OrtValueVector=OrtValueVector,
                  SessionIOBinding=onnxrun.IOBinding,
                  OrtCompiledModelCompatibility=devices.OrtCompiledModelCompatibility,
                  ArenaExtendStrategy=devices.ArenaExtendStrategy,
                  kNextPowerOfTwo=devices.ArenaExtendStrategy.kNextPowerOfTwo,
                  kSameAsRequested=devices.ArenaExtendStrategy.kSameAsRequested,
                  get_default_session_options=onnxrun.SessionOptions,
                  quantize_matmul_2bits=blockwise.quantize_matmul_2bits,
                  quantize_matmul_4bits=blockwise.quantize_matmul_4bits,
                  quantize_matmul_8bits=blockwise.quantize_matmul_8bits,
                  quantize_matmul_bnb4=blockwise.quantize_matmul_bnb4)
    native.update({n: getattr(ep_devices, n) for n in (
        "OrtDeviceEpIncompatibilityReason", "get_hardware_devices",
        "get_hardware_device_ep_incompatibility_details", "get_model_compatibility_for_ep_devices",
        "get_compatibility_info_from_model", "get_compatibility_info_from_model_bytes")})

    pybind11 = _module(_NAMES[3], "onnxrun's stand-in for onnxruntime's native module.", native)
    pybind = _module(_NAMES[2], "Re-exports onnxruntime_pybind11_state.", native)
    collection = _module(
        _NAMES[4], "onnxruntime's Python classes, from onnxrun.",
        {"InferenceSession": onnxrun.InferenceSession, "Session": onnxrun.InferenceSession,
         "IOBinding": onnxrun.IOBinding, "OrtValue": OrtValue, "OrtDevice": devices.OrtDevice,
         "OrtDeviceVendorId": devices.OrtDeviceVendorId, "SparseTensor": onnxrun.SparseTensor,
         "AdapterFormat": onnxrun.AdapterFormat,
         "check_and_normalize_provider_args": check_and_normalize_provider_args, "C": pybind},
    )
    capi = _module(
        _NAMES[1], "onnxruntime.capi, from onnxrun.",
        {"_pybind_state": pybind, "onnxruntime_pybind11_state": pybind11,
         "onnxruntime_inference_collection": collection},
        package=True,
    )
    top = _module(_NAMES[0], onnxrun.__doc__, {**public, "capi": capi}, package=True)
    top.__getattr__ = _fallback  # type: ignore[attr-defined]
    return dict(zip(_NAMES, (top, capi, pybind, pybind11, collection), strict=True))


def _fallback(name: str) -> Any:
    """``onnxruntime.X`` for a name added to onnxrun after install(): ``onnxrun.X``."""
    try:
        return getattr(onnxrun, name)
    except AttributeError:
        raise AttributeError(
            f"module 'onnxruntime' (provided by onnxrun) has no attribute '{name}'"
        ) from None


def _preload_dlls(*args: Any, **kwargs: Any) -> None:
    """onnxruntime loads CUDA libraries here; onnxrun needs none."""


def _ours(name: str) -> str:
    """onnxrun's name for the module ``name`` of onnxruntime's package."""
    return "onnxrun" + name[len(_TOP):]


class _AliasFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``onnxruntime.X.Y`` -> the module ``onnxrun.X.Y`` itself, imported when first asked for.

    The import system files the module under both names; its own name, spec and file stay
    onnxrun's, so pickles, tracebacks and ``importlib.reload`` see onnxrun's module.
    """

    def __init__(self) -> None:
        self._specs: dict[str, importlib.machinery.ModuleSpec] = {}

    def find_spec(self, fullname: str, path: Any = None, target: Any = None
                  ) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith(_TOP + "."):
            return None
        if fullname.startswith(_NAMES[1] + "."):
            return None  # onnxruntime.capi holds only the modules built at install
        try:
            spec = importlib.util.find_spec(_ours(fullname))
        except ModuleNotFoundError:
            spec = None
        if spec is None:
            # None, as any finder: the import raises ModuleNotFoundError naming `fullname`,
            # and importlib.util.find_spec("onnxruntime.X") probes answer None.
            return None
        return importlib.machinery.ModuleSpec(
            fullname, self, origin=spec.origin,
            is_package=spec.submodule_search_locations is not None)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = importlib.import_module(_ours(spec.name))
        # The import system sets __spec__ to ours between create_module and exec_module.
        self._specs[spec.name] = module.__spec__
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        module.__spec__ = self._specs.pop(module.__spec__.name, module.__spec__)


_GENAI = "onnxruntime_genai"


def _onnxruntime_names() -> list[str]:
    return [n for n in sys.modules
            if n in (_TOP, _GENAI) or n.startswith((_TOP + ".", _GENAI + "."))]


def install() -> types.ModuleType:
    """Make ``import onnxruntime`` and its submodules resolve to onnxrun.

    Idempotent. Returns the ``onnxruntime`` module installed. Submodules
    (``onnxruntime.quantization``...) are imported only when asked for.
    """
    global _saved, _modules, _finder
    if _modules is None:
        _modules = _build()
        # onnxruntime-genai's package is onnxrun.genai (its Python API, on onnxrun's sessions)
        _modules[_GENAI] = importlib.import_module("onnxrun.genai")
    if _saved is None:
        # Whatever was imported under onnxruntime's names (the real package, its submodules)
        # steps aside until uninstall().
        _saved = {n: sys.modules.pop(n) for n in _onnxruntime_names()}
        _finder = _AliasFinder()
        sys.meta_path.insert(0, _finder)
    elif _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)
    sys.modules.update(_modules)
    return _modules["onnxruntime"]


def uninstall() -> None:
    """Undo ``install()``: restore the previous ``onnxruntime`` modules (or their absence)."""
    global _saved, _finder
    if _saved is None:
        return
    while _finder in sys.meta_path:
        sys.meta_path.remove(_finder)
    for name in _onnxruntime_names():
        del sys.modules[name]
    sys.modules.update(_saved)
    _saved = None
    _finder = None


def is_installed() -> bool:
    return _saved is not None and sys.modules.get("onnxruntime") is (_modules or {}).get(
        "onnxruntime")


_USAGE = """usage: python -m onnxrun.compat SCRIPT.py [ARGS...]
       python -m onnxrun.compat -m MODULE [ARGS...]

Runs SCRIPT (or MODULE) as __main__ with `import onnxruntime` resolving to onnxrun."""


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(_USAGE, file=sys.stderr if not argv else sys.stdout)
        return 0 if argv else 2
    install()
    if argv[0] == "-m":
        if len(argv) < 2:
            print(_USAGE, file=sys.stderr)
            return 2
        sys.argv = [argv[1], *argv[2:]]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        return 0
    script = argv[0]
    if not os.path.exists(script):
        print(f"python -m onnxrun.compat: can't open file '{script}': no such file",
              file=sys.stderr)
        return 2
    sys.argv = list(argv)
    # As `python script.py` does: the script's folder comes first on the path, instead of the
    # current directory that `python -m` put there.
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    runpy.run_path(script, run_name="__main__")
    return 0


if __name__ == "__main__":
    # Run as `python -m onnxrun.compat`: use the importable module, not this __main__ copy, so
    # the script sees one install state.
    from onnxrun import compat as _compat

    raise SystemExit(_compat.main())
