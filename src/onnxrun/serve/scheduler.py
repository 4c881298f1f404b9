"""A model's scheduler: its request queue, its dynamic batcher and its instances.

Each instance is one session run by one thread. Without ``dynamic_batching`` (or with
``max_batch_size`` 0) an instance takes one request at a time. With it, an instance takes the
oldest request and the later ones of the same signature (dtypes and non-batch dimensions:
requests of different shapes are never merged), in arrival order, up to ``max_batch_size``; it
runs them as soon as they reach the largest preferred batch size (else ``max_batch_size``), or
when the oldest has waited ``max_queue_delay_microseconds``. The merged batch is one session
call along dimension 0, and its outputs are split back. Requests are dicts of numpy arrays."""

from __future__ import annotations

import copy
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import Fail, OnnxRunError


class Unavailable(Fail):
    """The request was not run: the model is shutting down (HTTP 503, gRPC UNAVAILABLE)."""


class QueueFull(Unavailable):
    """The model's queue is full: refused at once (HTTP 503, gRPC RESOURCE_EXHAUSTED)."""


class RequestTimeout(Unavailable):
    """The request's timeout expired while it was queued (HTTP 503, gRPC DEADLINE_EXCEEDED)."""


@dataclass(eq=False)  # identity: == would compare the requests' arrays
class Request:
    inputs: dict[str, np.ndarray]
    outputs: list[str]
    batch: int
    signature: tuple
    arrival_ns: int
    deadline_ns: int | None  # Triton's per-request "timeout": failed if still queued then
    future: Future = field(default_factory=Future)


@dataclass
class Duration:
    count: int = 0
    ns: int = 0

    def add(self, ns: int, count: int = 1) -> None:
        self.count += count
        self.ns += ns


@dataclass
class Statistics:
    """Triton's per-model statistics (what ``/v2/models/{name}/stats`` shows)."""

    inference_count: int = 0  # batch items inferred
    execution_count: int = 0  # session runs
    last_inference_ms: int = 0
    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    queue: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    batch_sizes: dict[int, Duration] = field(default_factory=dict)  # executions by batch size


class Scheduler:
    """``model`` is the repository's Model (its name, config, outputs and request checks;
    not imported here: the repository imports this module)."""

    def __init__(self, model: Any, sessions: list[Any]):
        self.model = model
        cfg = model.config
        self.batching = cfg.dynamic_batching and cfg.max_batch_size > 0
        self.max_batch = cfg.max_batch_size
        self.target = max(cfg.preferred_batch_size, default=cfg.max_batch_size)
        self.delay_ns = cfg.max_queue_delay_us * 1000
        self.stats = Statistics()
        self._queue: list[Request] = []
        self._cond = threading.Condition()
        self._closed = False
        self._threads = [threading.Thread(target=self._serve, args=(s,), daemon=True,
                                          name=f"onnxrun-serve-{model.name}-{i}")
                         for i, s in enumerate(sessions)]
        for t in self._threads:
            t.start()

    def submit(self, inputs: dict[str, np.ndarray], outputs: list[str] | None = None,
               timeout_us: int | None = None) -> Future:
        """Queue a request; its future gets ``{output name: array}``, or Unavailable when it is
        still queued ``timeout_us`` after now. A request the model cannot take raises here
        (a ModelError), before it is queued."""
        try:
            batch = self.model.check_inputs(inputs)
            names = self.model.check_outputs(outputs)
        except OnnxRunError:
            with self._cond:
                self.stats.fail.add(0)  # rejected (Triton counts it a failure too)
            raise
        skip = 1 if self.model.config.max_batch_size > 0 else 0
        signature = tuple((n, a.dtype.str, a.shape[skip:]) for n, a in sorted(inputs.items()))
        now = time.monotonic_ns()
        deadline = None if not timeout_us else now + timeout_us * 1000
        request = Request(inputs, names, batch, signature, now, deadline)
        with self._cond:
            if self._closed:
                raise Unavailable(f"model '{self.model.name}' is shutting down")
            if len(self._queue) >= self.model.config.max_queue_size:
                self.stats.fail.add(0)
                raise QueueFull(f"model '{self.model.name}': its queue is full "
                                  f"({self.model.config.max_queue_size} requests waiting); "
                                  "retry later")
            self._queue.append(request)
            self._cond.notify()
        return request.future

    def statistics(self) -> Statistics:
        """A consistent copy of the model's statistics."""
        with self._cond:
            return copy.deepcopy(self.stats)

    def pending(self) -> int:
        """Requests waiting in the queue."""
        with self._cond:
            return len(self._queue)

    def shutdown(self) -> None:
        """Refuse new requests and run the queued ones now (no more waiting for a batch)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def close(self) -> None:
        """Refuse new requests, finish the queued ones, stop the instances."""
        self.shutdown()
        for t in self._threads:
            t.join()

    # -- the instances --------------------------------------------------------------------

    def _serve(self, session: Any) -> None:
        while True:
            with self._cond:
                group: list[Request] = []
                while not group:
                    while not self._queue and not self._closed:
                        self._cond.wait()
                    if not self._queue:
                        return
                    group = self._take()
            self._run(session, group)

    def _expire(self) -> int | None:
        """Drop the queued requests whose caller cancelled them (a client that went away) and
        fail those past their timeout (holding the lock); the nanoseconds until the next
        timeout, None when none has one."""
        now = time.monotonic_ns()
        expired = [r for r in self._queue if r.future.cancelled()
                   or (r.deadline_ns is not None and r.deadline_ns <= now)]
        if expired:
            gone = {id(r) for r in expired}  # by identity: == would compare their arrays
            self._queue = [r for r in self._queue if id(r) not in gone]
            for r in expired:
                self.stats.fail.add(now - r.arrival_ns)
                if not r.future.set_running_or_notify_cancel():
                    continue  # cancelled: nobody waits for an answer
                r.future.set_exception(RequestTimeout(
                    f"model '{self.model.name}': request timeout expired after "
                    f"{(now - r.arrival_ns) // 1000} us in the queue"))
        deadlines = [r.deadline_ns for r in self._queue if r.deadline_ns is not None]
        return min(deadlines) - now if deadlines else None

    def _take(self) -> list[Request]:
        """The next batch to run (holding the lock, with a non-empty queue); [] when the
        requests timed out or another instance took them."""
        while True:
            until_timeout = self._expire()
            if not self._queue:
                return []
            if not self.batching:
                return self._start([self._queue.pop(0)])
            oldest = self._queue[0]
            group, total = [], 0
            for r in self._queue:
                if r.signature == oldest.signature and total + r.batch <= self.max_batch:
                    group.append(r)
                    total += r.batch
            wait_ns = oldest.arrival_ns + self.delay_ns - time.monotonic_ns()
            if total >= self.target or wait_ns <= 0 or self._closed:
                taken = {id(r) for r in group}
                self._queue = [r for r in self._queue if id(r) not in taken]
                if self._queue:
                    self._cond.notify()  # another instance may take the rest
                return self._start(group)
            self._cond.wait(min(wait_ns, until_timeout or wait_ns) / 1e9)

    def _start(self, group: list[Request]) -> list[Request]:
        """The requests of ``group`` still wanted, marked running: a caller can no longer
        cancel them (a future cancelled now could not take its result: set_result raises, and
        would end the instance's thread). Holding the lock."""
        started, now = [], time.monotonic_ns()
        for r in group:
            if r.future.set_running_or_notify_cancel():
                started.append(r)
            else:
                self.stats.fail.add(now - r.arrival_ns)
        return started

    def _run(self, session: Any, group: list[Request]) -> None:
        if not group:
            return
        start = time.monotonic_ns()
        names = [s.name for s in self.model.outputs
                 if any(s.name in r.outputs for r in group)]
        try:
            if len(group) == 1:
                feeds = group[0].inputs
            else:
                feeds = {n: np.concatenate([r.inputs[n] for r in group])
                         for n in group[0].inputs}
            results = dict(zip(names, session.run(names, feeds), strict=True))
            total = sum(r.batch for r in group)
            if len(group) > 1:
                for n, v in results.items():
                    if np.ndim(v) == 0 or v.shape[0] != total:
                        raise Fail(f"model '{self.model.name}': output '{n}' has shape "
                                   f"{list(np.shape(v))}, not a batch of {total} to split back")
        except (OnnxRunError, ValueError, TypeError, MemoryError) as e:
            end = time.monotonic_ns()
            with self._cond:
                for r in group:
                    self.stats.fail.add(end - r.arrival_ns)
            for r in group:
                r.future.set_exception(e)
            return
        end = time.monotonic_ns()
        offset = 0
        replies = []
        for r in group:
            if len(group) == 1:
                replies.append({n: results[n] for n in r.outputs})
            else:
                replies.append({n: results[n][offset:offset + r.batch] for n in r.outputs})
            offset += r.batch
        with self._cond:
            s = self.stats
            s.execution_count += 1
            s.inference_count += total
            s.last_inference_ms = time.time_ns() // 1_000_000
            s.compute_infer.add(end - start)
            s.batch_sizes.setdefault(total, Duration()).add(end - start)
            for r in group:
                s.queue.add(start - r.arrival_ns)
                s.success.add(end - r.arrival_ns)
        for r, reply in zip(group, replies, strict=True):
            r.future.set_result(reply)
