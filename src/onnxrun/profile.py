"""Session profiling in onnxruntime's Chrome-trace format (chrome://tracing, Perfetto).

With ``SessionOptions.enable_profiling`` the session records ``Session`` events (model loading,
session initialization, each run) and one ``Node`` event per executed node with its operator,
provider and input/output types and shapes; ``InferenceSession.end_profiling()`` writes the JSON
array and returns the file name (``<profile_file_prefix>_<date>_<time>.json``).
"""

from __future__ import annotations

import contextvars
import datetime
import json
import os
import threading
import time
from typing import Any

import numpy as np

from .dtypes import elem_name, elem_type
from .threads import native_id

_active: contextvars.ContextVar[Profiler | None] = contextvars.ContextVar("profiler", default=None)


def active() -> Profiler | None:
    return _active.get()


def _type_shape(value: Any) -> dict[str, list[int]]:
    if isinstance(value, np.ndarray):
        try:
            name = elem_name(elem_type(value.dtype))
        except TypeError:
            name = str(value.dtype)
        return {name: [int(d) for d in value.shape]}
    if isinstance(value, list):
        return {"sequence": [len(value)]}
    if hasattr(value, "shape") and hasattr(value, "dtype"):  # a device array
        name = str(value.dtype).rsplit(".", 1)[-1]
        return {_DEVICE_NAMES.get(name, name): [int(d) for d in value.shape]}
    return {type(value).__name__: []}


# array-API dtype names where onnxruntime's type names differ
_DEVICE_NAMES = {"float32": "float", "float64": "double", "bool": "bool"}


class Profiler:
    def __init__(self, prefix: str, start: tuple[int, int] | None = None) -> None:
        """``start``: when profiling began, (perf_counter_ns, time_ns); default now."""
        self.prefix = prefix
        self.start_ns, self.start_wall_ns = start or (time.perf_counter_ns(), time.time_ns())
        self.pid = os.getpid()
        self._events: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def _us(self, t_ns: int) -> int:
        return (t_ns - self.start_ns) // 1000

    def session_event(self, name: str, start_ns: int, end_ns: int, **args: Any) -> None:
        self._add({"cat": "Session", "name": name, "ts": self._us(start_ns),
                   "dur": max(0, (end_ns - start_ns) // 1000), "args": args})

    def node_event(self, node: Any, provider: str, inputs: list[Any], outputs: list[Any],
                   start_ns: int, end_ns: int) -> None:
        args = {
            "op_name": node.op_type,
            "provider": provider,
            "input_type_shape": [_type_shape(v) for v in inputs if v is not None],
            "output_type_shape": [_type_shape(v) for v in outputs if v is not None],
        }
        self._add({"cat": "Node", "name": f"{node.label}_kernel_time", "ts": self._us(start_ns),
                   "dur": max(0, (end_ns - start_ns) // 1000), "args": args})

    def _add(self, event: dict[str, Any]) -> None:
        event.update(ph="X", pid=self.pid, tid=native_id())
        with self._lock:
            self._events.append(event)

    def activate(self) -> contextvars.Token:
        return _active.set(self)

    @staticmethod
    def deactivate(token: contextvars.Token) -> None:
        _active.reset(token)

    def end(self) -> str:
        stamp = datetime.datetime.fromtimestamp(self.start_wall_ns / 1e9)
        path = f"{self.prefix}_{stamp:%Y-%m-%d_%H-%M-%S}.json"
        with self._lock:
            events = list(self._events)
            self._events.clear()
        with open(path, "w", encoding="utf-8") as f:
            json.dump(events, f, separators=(",", ":"))
        return path
