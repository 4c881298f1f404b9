"""CUDA graphs (``enable_cuda_graph``): the first run of an input-shape signature is captured,
later runs copy their feeds into the captured run's input buffers and replay it; the outputs
are the captured run's buffers, overwritten by the next replay (as onnxruntime's are).

Capture needs every step on the device: a host step would run once during capture and never
again. ``check_capturable`` refuses other partitions when the session is created, as
onnxruntime does.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from ...errors import Fail

MAX_GRAPHS = 16  # captured signatures kept per session


def check_capturable(steps: Sequence[Any], input_slots: set[int], constant_slots: set[int]
                     ) -> None:
    for step in steps:
        node = step.node
        if step.provider != "CUDAExecutionProvider":
            raise Fail("This session cannot use the CUDA Graph feature as requested by the user "
                       "as all compute graph nodes have not been partitioned to the CUDA "
                       f"EP (node '{node.label}' ({node.op_type}) runs on {step.provider}).")
        if node.op_type == "MemcpyToHost" or (
                node.op_type == "MemcpyFromHost"
                and step.inputs[0] not in input_slots | constant_slots):
            raise Fail("This session cannot use the CUDA Graph feature: node "
                       f"'{node.label}' copies between host and device during the run.")


class GraphRunner:
    """The captured graphs of one session, keyed by (fetches, input shapes and dtypes)."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self._graphs: dict[tuple, tuple[list[tuple[int, Any]], list[Any], Callable, Any]] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._graphs)

    def run(self, fetches: tuple[int, ...], feeds: list[tuple[int, Any]],
            run: Callable[[list[tuple[int, Any]]], list[Any]]) -> list[Any]:
        backend = self.backend
        device_feeds = [(s, v if backend.is_device_array(v) else backend.to_device(v))
                        for s, v in feeds]
        key = (fetches, tuple((s, tuple(v.shape), str(v.dtype)) for s, v in device_feeds))
        entry = self._graphs.get(key)
        if entry is None:
            with self._lock:
                entry = self._graphs.get(key)
                if entry is None and len(self._graphs) < MAX_GRAPHS:
                    # the captured run reads its own copies of the feeds: later feeds are
                    # copied into them
                    static = [(s, backend.xp.asarray(v, copy=True)) for s, v in device_feeds]
                    outputs, replay = backend.capture(lambda: run(static))
                    entry = self._graphs[key] = (static, outputs, replay, threading.Lock())
                    return list(outputs)
            if entry is None:  # cache full: run without a graph
                return run(device_feeds)
        static, outputs, replay, lock = entry
        with lock:
            for (_, buf), (_, value) in zip(static, device_feeds, strict=True):
                backend.copy_into(buf, value)
            replay()
            return list(outputs)
