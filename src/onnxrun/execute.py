"""Step 6 of a session: the run loop. It only moves values between slots and calls kernels."""

from __future__ import annotations

import operator
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from . import profile
from .dtypes import describe
from .errors import Fail, RuntimeException
from .ir import Node


class Step(NamedTuple):
    kernel: Callable[..., Any]
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    frees: tuple[int, ...]
    node: Node
    provider: str = "CPUExecutionProvider"


class RunTerminated(Fail):
    """RunOptions.terminate was set while the run was in progress (onnxruntime raises Fail)."""


DISCARD = 1  # plan.DISCARD_SLOT: where the result of a node without outputs goes


def compile_steps(steps: list[Step]) -> list[tuple[Any, ...]]:
    """The steps as the run loop reads them: the kernel, a C-level getter for its arguments
    (operator.itemgetter) and whether the getter returns one value or a tuple to spread, the
    first output slot, all output slots, the slots to free, and the step's index (for errors).
    Building each step's argument list in Python was a good part of the cost of a small node."""
    compiled = []
    for i, (kernel, ins, outs, frees, _node, _provider) in enumerate(steps):
        get = operator.itemgetter(*ins) if ins else None
        arity = 2 if len(ins) > 1 else len(ins)
        compiled.append((kernel, get, arity, outs[0] if outs else DISCARD, outs, frees, i))
    return compiled


def run_steps(steps: list[Step], slots: list[Any], names: list[str], run_options: Any = None,
              compiled: list[tuple[Any, ...]] | None = None) -> None:
    """Run ``steps`` on ``slots``; ``compiled``: compile_steps(steps), when the caller keeps it."""
    profiler = profile.active()
    if profiler is not None:
        _run_steps_profiled(steps, slots, run_options, profiler)
        return
    if compiled is None:
        compiled = compile_steps(steps)
    check_terminate = run_options is not None
    for kernel, get, arity, out, outs, frees, index in compiled:
        if check_terminate and run_options.terminate:
            raise RunTerminated("Exiting due to terminate flag being set to true.")
        try:
            if arity == 2:
                result = kernel(*get(slots))
            elif arity == 1:
                result = kernel(get(slots))
            else:
                result = kernel()
        except RunTerminated:
            raise
        except Exception as e:
            step = steps[index]
            raise kernel_error(step.node, [slots[i] for i in step.inputs], e) from e
        if type(result) is tuple:
            for s, r in zip(outs, result, strict=False):
                slots[s] = r
        else:
            slots[out] = result
        for s in frees:
            slots[s] = None


def _run_steps_profiled(steps: list[Step], slots: list[Any], run_options: Any,
                        profiler: profile.Profiler) -> None:
    """The same loop, timing each node and recording its input and output shapes."""
    clock = time.perf_counter_ns
    for kernel, ins, outs, frees, node, provider in steps:
        if run_options is not None and run_options.terminate:
            raise RunTerminated("Exiting due to terminate flag being set to true.")
        args = [slots[i] for i in ins]
        start = clock()
        try:
            result = kernel(*args)
        except RunTerminated:
            raise
        except Exception as e:
            raise kernel_error(node, args, e) from e
        end = clock()
        results = result if type(result) is tuple else (result,)
        profiler.node_event(node, provider, args[: len(node.inputs)], list(results), start, end)
        for s, r in zip(outs, results, strict=False):
            slots[s] = r
        for s in frees:
            slots[s] = None


class ParallelSchedule(NamedTuple):
    """Dependencies of a plan's steps, for running independent branches concurrently."""

    successors: tuple[tuple[int, ...], ...]  # per step: the steps that read its outputs
    num_predecessors: tuple[int, ...]  # per step: how many steps it waits for
    consumers: dict[int, int]  # slot -> number of steps that read it
    keep: frozenset[int]  # slots never freed (fetches, the None/discard slots)


def parallel_schedule(steps: list[Step], keep: set[int]) -> ParallelSchedule:
    producer: dict[int, int] = {}
    for i, step in enumerate(steps):
        for s in step.outputs:
            producer[s] = i
    successors: list[set[int]] = [set() for _ in steps]
    preds: list[set[int]] = [set() for _ in steps]
    consumers: dict[int, int] = {}
    for i, step in enumerate(steps):
        for s in set(step.inputs):
            consumers[s] = consumers.get(s, 0) + 1
            p = producer.get(s)
            if p is not None and p != i:
                successors[p].add(i)
                preds[i].add(p)
    return ParallelSchedule(tuple(tuple(sorted(x)) for x in successors),
                            tuple(len(x) for x in preds), consumers, frozenset(keep))


def run_steps_parallel(steps: list[Step], schedule: ParallelSchedule, slots: list[Any],
                       run_options: Any, pool: Any) -> None:
    """ORT_PARALLEL: a step starts as soon as the steps it reads from are done.

    numpy releases the GIL in BLAS calls and large ufuncs, so independent branches (Inception's
    towers, a transformer's Q/K/V projections) overlap. A value is freed when its last reader
    finishes (reference counts, since the order is no longer fixed).
    """
    n = len(steps)
    if n == 0:
        return
    lock = threading.Lock()
    done = threading.Event()
    waiting = list(schedule.num_predecessors)
    readers = dict(schedule.consumers)
    keep = schedule.keep
    state = {"finished": 0, "error": None}
    profiler = profile.active()

    def run_one(i: int) -> None:
        while True:
            if state["error"] is not None:
                return
            kernel, ins, outs, _, node, provider = steps[i]
            try:
                if run_options is not None and run_options.terminate:
                    raise RunTerminated("Exiting due to terminate flag being set to true.")
                args = [slots[s] for s in ins]
                start = time.perf_counter_ns() if profiler is not None else 0
                try:
                    result = kernel(*args)
                except RunTerminated:
                    raise
                except Exception as e:
                    raise kernel_error(node, args, e) from e
                results = result if type(result) is tuple else (result,)
                if profiler is not None:
                    profiler.node_event(node, provider, args[: len(node.inputs)], list(results),
                                        start, time.perf_counter_ns())
            except BaseException as e:  # noqa: BLE001 - handed to the calling thread
                with lock:
                    if state["error"] is None:
                        state["error"] = e
                done.set()
                return
            ready: list[int] = []
            with lock:
                for s, r in zip(outs, results, strict=False):
                    slots[s] = r
                    if s not in keep and s not in readers:
                        slots[s] = None  # produced, never read
                for s in set(ins):
                    left = readers[s] - 1
                    readers[s] = left
                    if left == 0 and s not in keep:
                        slots[s] = None
                for j in schedule.successors[i]:
                    waiting[j] -= 1
                    if waiting[j] == 0:
                        ready.append(j)
                state["finished"] += 1
                if state["finished"] == n:
                    done.set()
            if not ready:
                return
            for j in ready[1:]:
                pool.submit(run_one, j)
            i = ready[0]  # continue on this thread: no hand-off for a chain

    for i in range(n):
        if schedule.num_predecessors[i] == 0:
            pool.submit(run_one, i)
    done.wait()
    if state["error"] is not None:
        raise state["error"]


def kernel_error(node: Node, args: list[Any], error: Exception) -> RuntimeException:
    if isinstance(error, RuntimeException) and "while running node" in str(error):
        # An error from inside a subgraph: keep its node context and add ours in front.
        return RuntimeException(
            f"while running node '{node.label}' ({node.op_type}) subgraph: {error}"
        )
    shapes = ", ".join(describe(a) for a in args[: len(node.inputs)])
    return RuntimeException(
        f"while running node '{node.label}' ({node.op_type}) with inputs {shapes}: "
        f"{type(error).__name__}: {error}"
    )
