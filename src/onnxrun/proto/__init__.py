"""Which ``onnx`` the session path uses: the onnx package where it is installed, else pure.py.

``from onnxrun.proto import onnx`` gives, on CPython with onnx installed (``HAVE_ONNX``), a
stand-in module for the onnx package that imports it only when something beyond its protobuf
messages is first asked for (``onnx.helper``, ``onnx.checker``, ``onnx.defs``...): importing
onnx is ~100 ms (its compose, hub, parser, reference modules, importlib.metadata), twice all
of onnxrun's own import, and a session whose model file was validated before (the validation
cache) needs only the messages. The messages are onnx's own classes: onnx's generated
``onnx_ml_pb2.py`` executed from onnx's folder (under a private module name, so onnx's
package is not half-imported), which puts the same descriptor in protobuf's default pool that
``import onnx`` adds later, and upb gives one class per descriptor: ``onnx.ModelProto`` is the
very class the user's ``import onnx`` returns. Where that cannot be relied on (protobuf's
pure-Python runtime, a file that does not load), onnx is imported at once, as before.

Where onnx cannot be imported (Pyodide, a CPython without it): onnxrun's pure-Python stand-in
with the same message classes and the helpers the session needs; validate.py and load.py then
use onnxrun's own checks and inliner. ``ONNXRUN_NO_ONNX=1`` picks the stand-in on purpose (tests
of that path on CPython: it must be set before onnxrun is imported, in a process that does not
import onnx).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import threading
import types
from typing import Any


def _onnx_extension() -> str | None:
    """The path of onnx's C++ extension where onnx is installed with it (nothing imported)."""
    try:
        spec = importlib.util.find_spec("onnx")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = list(spec.submodule_search_locations)[0]
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return None
    for name in names:
        if name.startswith("onnx_cpp2py_export") and name.endswith((".so", ".pyd")):
            return os.path.join(folder, name)
    return None  # a build without its extension (onnx's checker would not import)


def _messages(folder: str) -> types.ModuleType | None:
    """onnx's ``onnx_ml_pb2`` executed from ``folder`` under a private name, or None where the
    classes it makes could differ from those of a later ``import onnx``."""
    from google.protobuf.internal import api_implementation

    if api_implementation.Type() != "upb":
        return None  # the pure-Python runtime makes a second class per descriptor
    spec = importlib.util.spec_from_file_location("onnxrun.proto._onnx_ml_pb2",
                                                  os.path.join(folder, "onnx_ml_pb2.py"))
    if spec is None or spec.loader is None:
        return None
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception:  # an onnx layout this does not know: import onnx instead
        return None
    return module


class _DeferredOnnx(types.ModuleType):
    """The onnx package's namespace: its protobuf messages and enums at once, everything else
    from the package, imported on first use of such a name."""

    def __init__(self, messages: types.ModuleType) -> None:
        super().__init__("onnx", __doc__)
        self._lock = threading.Lock()
        self._package: types.ModuleType | None = None
        for name, value in vars(messages).items():
            if not name.startswith("_"):
                setattr(self, name, value)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name != "__version__":
            raise AttributeError(name)
        with self._lock:
            if self._package is None:
                self._package = importlib.import_module("onnx")
        value = getattr(self._package, name)
        setattr(self, name, value)
        return value


if os.environ.get("ONNXRUN_NO_ONNX", "") not in ("", "0"):
    from . import pure as onnx

    HAVE_ONNX = False
elif "onnx" not in sys.modules and (_extension := _onnx_extension()) is not None \
        and (_pb2 := _messages(os.path.dirname(_extension))) is not None:
    onnx = _DeferredOnnx(_pb2)
    HAVE_ONNX = True
else:
    try:
        import onnx
        import onnx.defs  # noqa: F401  (the C++ extension: fails where it was not built)

        HAVE_ONNX = True
    except ImportError:
        from . import pure as onnx

        HAVE_ONNX = False


def onnx_build() -> str:
    """What identifies the onnx that checks and infers here (a key of results it gave, kept
    across processes), without importing it: its C++ extension's path, size and time."""
    if not HAVE_ONNX:
        return "none"
    path = _onnx_extension()
    try:
        st = os.stat(path) if path is not None else None
    except OSError:
        st = None
    if st is None:
        return f"onnx {onnx.__version__}"
    return f"onnx {path} {st.st_size} {st.st_mtime_ns}"


__all__ = ["HAVE_ONNX", "onnx", "onnx_build"]
