"""CUDA graph capture on CuPy. The captured run allocates from a memory pool of its own that
lives as long as the graph: the addresses a replay writes belong to no other array."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def capture(cp: Any, fn: Callable[[], Any]) -> tuple[Any, Callable[[], None]]:
    pool = cp.cuda.MemoryPool()
    stream = cp.cuda.get_current_stream()
    with cp.cuda.using_allocator(pool.malloc):
        fn()  # warm-up outside capture: kernels compiled, cuBLAS handle and workspace made
        stream.synchronize()
        stream.begin_capture()
        try:
            result = fn()
        finally:
            graph = stream.end_capture()
    graph.launch(stream)  # capture records without running: compute this run's outputs

    def replay() -> None:
        graph.launch(cp.cuda.get_current_stream())

    replay.pool = pool  # the graph's memory, alive as long as the replay is
    return result, replay
