"""Whether this process can start threads: not in Pyodide (WebAssembly without pthreads).

Where it cannot, what would run on threads runs on the calling thread instead: ORT_PARALLEL
runs the graph sequentially, ``run_async`` runs before it returns (the callback still gets
``(results, user_data, err)``), kernels do not split their work. Never an exception.
"""

from __future__ import annotations

import functools
import sys
import threading


@functools.cache
def available() -> bool:
    if sys.platform not in ("emscripten", "wasi"):
        return True
    try:  # a build of CPython for WebAssembly with threads would start this one
        t = threading.Thread(target=lambda: None, name="onnxrun-thread-probe")
        t.start()
        t.join()
        return True
    except RuntimeError:
        return False


def native_id() -> int:
    """The calling thread's id as the OS knows it (profile events' ``tid``); Pyodide's
    ``threading`` has no ``get_native_id``, only the interpreter's ``get_ident``."""
    get = getattr(threading, "get_native_id", None)
    return get() if get is not None else threading.get_ident()
