"""Which ``onnx`` the session path uses: the onnx package where it imports, else pure.py.

``from onnxrun.proto import onnx`` gives the onnx package itself on CPython (its C++ checker,
shape inference, schemas and inliner with it: ``HAVE_ONNX``), or, where it cannot be imported
(Pyodide, a CPython without it), onnxrun's pure-Python stand-in with the same message classes
and the helpers the session needs; validate.py and load.py then use onnxrun's own checks and
inliner. ``ONNXRUN_NO_ONNX=1`` picks the stand-in on purpose (tests of that path on CPython:
it must be set before onnxrun is imported, in a process that does not import onnx).
"""

from __future__ import annotations

import os

if os.environ.get("ONNXRUN_NO_ONNX", "") not in ("", "0"):
    from . import pure as onnx

    HAVE_ONNX = False
else:
    try:
        import onnx
        import onnx.defs  # noqa: F401  (the C++ extension: fails where it was not built)

        HAVE_ONNX = True
    except ImportError:
        from . import pure as onnx

        HAVE_ONNX = False

__all__ = ["HAVE_ONNX", "onnx"]
