"""Global thread pools: ``set_global_thread_pool_sizes`` and ``use_per_session_threads``.

As in onnxruntime, a session uses its own threads (``intra_op_num_threads``,
``inter_op_num_threads``) unless ``SessionOptions.use_per_session_threads`` is False; then it
runs on the process's global pools, which ``set_global_thread_pool_sizes`` creates once. A
session that asks for the global pools before they exist, or for its own threads once they do,
is refused (RuntimeError), as onnxruntime refuses it.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from ..errors import Fail


@dataclass(frozen=True)
class SessionThreads:
    """The threads one session runs on. ``pool``: the shared inter-op pool (global pools
    only); a per-session pool is the session's own to create and shut down."""

    intra_op_num_threads: int
    inter_op_num_threads: int
    pool: ThreadPoolExecutor | None = None


_lock = threading.Lock()
_sizes: tuple[int, int] | None = None  # (intra, inter) once set_global_thread_pool_sizes ran
_inter_pool: ThreadPoolExecutor | None = None


def set_global_thread_pool_sizes(intra_op_num_threads: int = 0,
                                 inter_op_num_threads: int = 0) -> None:
    """Create the process's global intra-op and inter-op thread pools (0: every core), used by
    sessions whose ``use_per_session_threads`` is False. Once only: the pools cannot be
    replaced."""
    sizes = []
    for name, value in (("intra_op_num_threads", intra_op_num_threads),
                        ("inter_op_num_threads", inter_op_num_threads)):
        if isinstance(value, bool) or not hasattr(value, "__index__"):
            raise TypeError(f"set_global_thread_pool_sizes(): {name} must be an integer, "
                            f"got {type(value).__name__}")
        sizes.append(max(0, value.__index__()))  # onnxruntime takes a negative size as default
    global _sizes
    with _lock:
        if _sizes is not None:
            raise Fail("Global thread pools have already been created, cannot replace them")
        _sizes = (sizes[0], sizes[1])


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
        os.cpu_count() or 1)


def for_session(options: Any) -> SessionThreads:
    """The threads a session with ``options`` (SessionOptions) runs on, or RuntimeError."""
    global _inter_pool
    with _lock:
        sizes = _sizes
    if options.use_per_session_threads:
        if sizes is not None:
            raise Fail("use_per_session_threads must be false when using a global thread pool "
                       "(set_global_thread_pool_sizes was called)")
        return SessionThreads(options.intra_op_num_threads, options.inter_op_num_threads)
    if sizes is None:
        raise Fail("When the session is not configured to use per session threadpools "
                   "(use_per_session_threads is False), the global thread pools must exist: "
                   "call set_global_thread_pool_sizes() first")
    intra, inter = sizes
    with _lock:
        if _inter_pool is None:
            _inter_pool = ThreadPoolExecutor(max_workers=inter or _cores(),
                                             thread_name_prefix="onnxrun-global-inter-op")
        pool = _inter_pool
    return SessionThreads(intra, inter, pool)
