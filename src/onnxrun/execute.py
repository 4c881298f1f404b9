"""Step 6 of a session: the run loop. It only moves values between slots and calls kernels."""

from __future__ import annotations

import operator
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

from . import profile
from .dtypes import describe
from .errors import Fail, InvalidArgument, RuntimeException
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


NONE_SLOT = 0  # plan.NONE_SLOT: always None, a missing optional input reads it
DISCARD = 1  # plan.DISCARD_SLOT: where the result of a node without outputs goes


class Branches(NamedTuple):
    """What an If-like kernel offers to be written into the generated function: its
    ``inline_branches()`` returns these three (a tuple, or None): ``condition(value) ->
    bool`` on its first input, then each branch's steps, slot template (its constants),
    slots of the values it reads from the enclosing graph (the kernel's inputs after the
    first, in order) and output slots (plan.Subgraph.inline_parts)."""

    condition: Callable[[Any], bool]
    then_branch: tuple[list[Step], list[Any], Sequence[int], Sequence[int]]
    else_branch: tuple[list[Step], list[Any], Sequence[int], Sequence[int]]


class CompiledSteps:
    """A plan's steps as the run loop reads them: once a plan has run GENERATE_AFTER times,
    one generated Python function of straight-line code, each value a local variable, each
    step one call of its kernel (a closure variable) on them, a value set to None after its
    last use. A node then costs its kernel call and a store: no loop, no slot list, no
    argument tuple (a chain of 1000 small Add/Mul nodes: 0.88 -> 0.53 us of CPU a node).
    An If's branches are written in as an if / else of their steps (``Branches``): no
    nested run (slot list, plan lookup, function call) per call. Compiling the function
    costs ~20-40 us a step (Python's compiler), tens of runs' savings: until then, and for
    plans of more than MAX_GENERATED steps, the loop over a table (``table``) runs it. A plan
    of at most SMALL_PLAN steps (a streaming model's, a loop body's) is generated after
    GENERATE_AFTER_SMALL runs, once its memory pattern is in use (memory.py: from the fourth
    run), for ~1-2 ms once: it is called thousands of times, and its runs until then cost 20-40%
    more (the VAD-style model: 150-230 against 110-130 us, an If's branches run as nested
    plans). The
    terminate check between nodes is in the variant made for runs with RunOptions; the variant
    made for runs with buffers (memory.py) hands each step of ``outs`` (step index -> its
    index in the buffers) ``out=buffers.take(j, *its inputs)``."""

    __slots__ = ("steps", "fetch_slots", "table", "outs", "_fns", "_lines", "_runs", "_after")

    GENERATE_AFTER = 8
    GENERATE_AFTER_SMALL = 3
    SMALL_PLAN = 64
    MAX_GENERATED = 5000

    def __init__(self, steps: list[Step], fetch_slots: Sequence[int],
                 outs: dict[int, int] | None = None) -> None:
        self.steps = steps
        self.fetch_slots = tuple(fetch_slots)
        self.outs = outs or {}
        self.table = _table(steps, self.outs)
        self._fns: dict[tuple[bool, bool], Callable[..., None]] = {}
        # per generated function's code: the line of a step's call -> (the step's index, the
        # locals of its arguments, the node of a branch's step written in, else None)
        self._lines: dict[Any, dict[int, tuple[int, tuple[str, ...], Node | None]]] = {}
        self._runs = 0
        self._after = self.GENERATE_AFTER_SMALL if len(steps) <= self.SMALL_PLAN else \
            self.GENERATE_AFTER

    def function(self, check_terminate: bool, buffers: bool = False
                 ) -> Callable[..., None] | None:
        """The generated function (``run(slots, ro)``, or ``run(slots, ro, buffers)``), or
        None while the loop runs this plan."""
        fn = self._fns.get((check_terminate, buffers))
        if fn is None:
            self._runs += 1  # not exact under concurrent runs: it only picks the moment
            if self._runs <= self._after or len(self.steps) > self.MAX_GENERATED:
                return None
            fn = self._fns[check_terminate, buffers] = self._generate(check_terminate, buffers)
        return fn

    def _generate(self, check_terminate: bool, buffers: bool) -> Callable[..., None]:
        steps = self.steps
        # Locals are reused once their value is freed (a register allocation): compiling a
        # function costs more than linear time in its number of distinct locals.
        names: dict[Any, str] = {NONE_SLOT: "None", DISCARD: "_d"}
        pool: list[str] = []
        closure: list[Any] = []  # the kernels, conditions and branch constants

        def assign(slot: Any) -> str:
            if slot not in names:
                names[slot] = pool.pop() if pool else f"v{len(names)}"
            return names[slot]

        def release(slot: Any) -> None:
            pool.append(names.pop(slot))

        def constant(value: Any) -> str:
            closure.append(value)
            return f"k{len(closure) - 1}"

        produced = {s for step in steps for s in step.outputs}
        read = {s for step in steps for s in step.inputs} | set(self.fetch_slots)
        external = sorted(read - produced - {NONE_SLOT, DISCARD})
        body = [f"    {assign(s)} = slots[{s}]" for s in external]
        if buffers:
            body.append("    _take = _b.take")
        lines: dict[int, tuple[int, tuple[str, ...], Node | None]] = {}
        first = 4  # the body's first line: after the factory's two lines and "def run"

        def call(kernel: Any, args: tuple[str, ...], outs: list[str], indent: str,
                 where: tuple[int, Node | None], j: int | None = None) -> None:
            if check_terminate:
                body.append(f"{indent}if ro.terminate: raise _Terminated(_TERMINATED)")
            expr = f"{constant(kernel)}({', '.join(args)})"
            if j is not None:  # one output, written into the buffer handed to it
                expr = f"{expr[:-1]}{', ' if args else ''}out=_take({', '.join((str(j), *args))}))"
            lines[first + len(body)] = (where[0], args, where[1])
            if len(outs) > 1:
                body.append(f"{indent}{', '.join(outs)} = _spread({expr}, {len(outs)})")
            elif isinstance(kernel, np.ufunc) and kernel.nout == 1:
                body.append(f"{indent}{outs[0] if outs else '_d'} = {expr}")
            else:  # a kernel may return its outputs as a tuple, whatever the node uses
                body.extend([f"{indent}r = {expr}",
                             f"{indent}{outs[0] if outs else '_d'} = r[0] if r.__class__ "
                             "is _tuple else r"])

        def branch_steps(i: int, branch: tuple[list[Step], list[Any], Sequence[int],
                                               Sequence[int]],
                         captured: tuple[str, ...], outs: list[str]) -> None:
            """One branch's steps under the If's condition: its slots as locals of their
            own (keys (i, branch, slot)), the values it reads from the enclosing graph as
            the If's argument locals, its constants as closure variables; its outputs
            assigned to the If's."""
            branch_steps_, template, outer, fetches = branch
            tag = id(branch_steps_)
            local: dict[int, str] = dict(zip(outer, captured, strict=False))

            def name(s: int) -> str:
                got = local.get(s) or names.get((i, tag, s))
                if got is None:
                    if s in (NONE_SLOT, DISCARD):
                        return names[s]
                    # read before any step writes it: a constant of the branch (or None)
                    value = template[s]
                    got = local[s] = "None" if value is None else constant(value)
                return got

            for step in branch_steps_:
                args = tuple(name(s) for s in step.inputs)
                outs_ = [("_d" if s == DISCARD else assign((i, tag, s))) for s in step.outputs]
                call(step.kernel, args, outs_, "        ", (i, step.node))
                for s in step.frees:
                    if (i, tag, s) in names:
                        body.append(f"        {names[(i, tag, s)]} = None")
                        release((i, tag, s))
            values = [name(s) for s in fetches]
            body.append(f"        {', '.join(outs or ['_d'])}, = {', '.join(values)},")
            for k in [k for k in names if isinstance(k, tuple) and k[:2] == (i, tag)]:
                body.append(f"        {names[k]} = None")  # the branch's outputs, now the If's
                release(k)

        for i, step in enumerate(steps):
            args = tuple(names[s] for s in step.inputs)
            branches = _branches(step)
            if branches is None:
                call(step.kernel, args, [assign(s) for s in step.outputs], "    ", (i, None),
                     self.outs.get(i) if buffers else None)
            else:
                if check_terminate:
                    body.append("    if ro.terminate: raise _Terminated(_TERMINATED)")
                lines[first + len(body)] = (i, args, None)  # the condition is the If's
                body.append(f"    if {constant(branches.condition)}({args[0]}):")
                outs = [assign(s) for s in step.outputs]
                for k, branch in enumerate((branches.then_branch, branches.else_branch)):
                    if k:
                        body.append("    else:")
                    branch_steps(i, branch, args[1:], outs)
            for s in step.frees:
                if s not in (NONE_SLOT, DISCARD) and s in names:
                    body.append(f"    {names[s]} = None")
                    release(s)
        body += [f"    slots[{s}] = {names[s]}" for s in self.fetch_slots if s != NONE_SLOT]
        kernels = ", ".join(f"k{i}" for i in range(len(closure)))
        source = "\n".join([
            "def _factory(_K, _spread, _tuple, _Terminated, _TERMINATED):",
            f"  {kernels}{',' if len(closure) == 1 else ''} = _K" if closure else "  pass",
            f"  def run(slots, ro{', _b' if buffers else ''}):",
            *[f"  {line}" for line in body],
            "      return",
            "  return run"])
        namespace: dict[str, Any] = {}
        exec(compile(source, "<onnxrun plan>", "exec"), namespace)  # noqa: S102 - our own code
        run = namespace["_factory"](tuple(closure), _spread, tuple, RunTerminated, _TERMINATED)
        self._lines[run.__code__] = lines
        return run

    def failed_step(self, error: BaseException
                    ) -> tuple[int, list[Any], Node | None] | None:
        """(the index of the step whose kernel raised ``error``, its arguments, the node of
        the branch step written in that raised it or None), from the generated function's
        frame in the traceback; None if the error did not come from a kernel call."""
        tb = error.__traceback__
        while tb is not None:
            lines = self._lines.get(tb.tb_frame.f_code)
            if lines is not None:
                found = lines.get(tb.tb_lineno)
                if found is None:
                    return None
                index, args, inner = found
                local = tb.tb_frame.f_locals  # a branch's constants too (free variables)
                return index, [None if a == "None" else local.get(a) for a in args], inner
            tb = tb.tb_next
        return None


_TERMINATED = "Exiting due to terminate flag being set to true."


def _branches(step: Step) -> Branches | None:
    """The step's Branches when its kernel offers them and they fit its outputs."""
    offer = getattr(type(step.kernel), "inline_branches", None)  # not a wrapper's
    got = offer(step.kernel) if offer is not None else None
    if got is None:
        return None
    got = Branches(*got)
    if not step.inputs or any(len(b[3]) != len(step.outputs)
                              for b in (got.then_branch, got.else_branch)):
        return None
    return got


def _spread(result: Any, n: int) -> tuple[Any, ...]:
    """A kernel's result as ``n`` outputs: a tuple's items (None for those it lacks), or one
    value as the first output."""
    if result.__class__ is tuple:
        if len(result) == n:
            return result
        return (result + (None,) * n)[:n]
    return (result,) + (None,) * (n - 1)


def _table(steps: list[Step], outs: dict[int, int] | None = None) -> list[tuple[Any, ...]]:
    """The steps as the loop reads them: the kernel, a C-level getter for its arguments
    (operator.itemgetter) and whether it returns one value or a tuple to spread, the first
    output slot, all output slots, the slots to free, the step's index (for errors) and its
    index in the buffers (or -1)."""
    table = []
    outs = outs or {}
    for i, (kernel, ins, out_slots, frees, _node, _provider) in enumerate(steps):
        get = operator.itemgetter(*ins) if ins else None
        arity = 2 if len(ins) > 1 else len(ins)
        table.append((kernel, get, arity, out_slots[0] if out_slots else DISCARD, out_slots,
                      frees, i, outs.get(i, -1)))
    return table


def run_steps(steps: list[Step], slots: list[Any], names: list[str], run_options: Any = None,
              compiled: CompiledSteps | None = None, buffers: Any = None,
              observe: Callable[..., None] | None = None) -> bool:
    """Run ``steps`` on ``slots``; ``compiled``: CompiledSteps(steps, fetches), when the caller
    keeps it (without it, the loop runs them and leaves every output in its slot).
    ``buffers``: a memory.Buffers whose arena the steps of ``compiled.outs`` write into;
    ``observe(i, args, results, outs, frees)``: called after each step (memory.py records a
    run; with ``buffers`` too, it is also given the step's ``out``, or None). Profiled
    (``profile.active()``), the observed loop times each step: the buffers and the recording
    as in an unprofiled run, so that a profile shows the kernels of a run (without them,
    every large output was fresh memory and its page faults). Returns True."""
    profiler = profile.active()
    if observe is not None or profiler is not None:
        _run_steps_observed(steps, slots, run_options, observe, buffers,
                            compiled.outs if compiled is not None and buffers is not None
                            else {}, profiler)
        return True
    run = None if compiled is None else \
        compiled.function(run_options is not None, buffers is not None)
    if run is None:
        _run_table(steps, compiled.table if compiled is not None else _table(steps), slots,
                   run_options, buffers)
        return True
    try:
        if buffers is None:
            run(slots, run_options)
        else:
            run(slots, run_options, buffers)
    except RunTerminated:
        raise
    except Exception as e:
        failed = compiled.failed_step(e)
        if failed is None:
            raise
        index, args, inner = failed
        if inner is None:
            raise kernel_error(steps[index].node, args, e) from e
        # in a branch written in: the error a nested run of it would have raised, named
        # by the If's node as well
        cause = kernel_error(inner, args, e)
        cause.__cause__ = e
        raise kernel_error(steps[index].node, [], cause) from cause
    return True


def _run_table(steps: list[Step], table: list[tuple[Any, ...]], slots: list[Any],
               run_options: Any, buffers: Any = None) -> None:
    check_terminate = run_options is not None
    for kernel, get, arity, out, outs, frees, index, j in table:
        if check_terminate and run_options.terminate:
            raise RunTerminated(_TERMINATED)
        try:
            if j >= 0 and buffers is not None:
                args = [slots[s] for s in steps[index].inputs]
                result = kernel(*args, out=buffers.take(j, *args))
            elif arity == 2:
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


def _run_steps_observed(steps: list[Step], slots: list[Any], run_options: Any,
                        observe: Callable[..., None] | None, buffers: Any = None,
                        pooled: dict[int, int] | None = None,
                        profiler: profile.Profiler | None = None) -> None:
    """The loop, calling ``observe(i, args, results, outs, frees)`` after each step (and the
    step's ``out`` after those, when ``buffers`` give the steps of ``pooled`` one), and
    recording each step's time and shapes with ``profiler``."""
    clock = time.perf_counter_ns
    for i, (kernel, ins, outs, frees, node, provider) in enumerate(steps):
        if run_options is not None and run_options.terminate:
            raise RunTerminated(_TERMINATED)
        args = [slots[s] for s in ins]
        j = -1 if buffers is None else pooled.get(i, -1)
        given = None if j < 0 else buffers.take(j, *args)
        start = clock()
        try:
            result = kernel(*args) if j < 0 else kernel(*args, out=given)
        except RunTerminated:
            raise
        except Exception as e:
            raise kernel_error(node, args, e) from e
        end = clock()
        results = result if type(result) is tuple else (result,)
        if profiler is not None:
            profiler.node_event(node, provider, args[: len(node.inputs)], list(results),
                                start, end)
        for s, r in zip(outs, results, strict=False):
            slots[s] = r
        for s in frees:
            slots[s] = None
        if observe is None:
            pass
        elif buffers is None:
            observe(i, args, results, outs, frees)
        else:
            observe(i, args, results, outs, frees, given)
        del args, result, results, given


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
                    raise RunTerminated(_TERMINATED)
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


def kernel_error(node: Node, args: list[Any], error: Exception) -> Fail | RuntimeException:
    if getattr(error, "names_its_node", False):  # a fused step's node's error (fuse.py)
        return type(error)(str(error))
    if isinstance(error, RuntimeException) and "while running node" in str(error):
        # An error from inside a subgraph: keep its node context and add ours in front.
        return RuntimeException(
            f"while running node '{node.label}' ({node.op_type}) subgraph: {error}"
        )
    shapes = ", ".join(describe(a) for a in args[: len(node.inputs)])
    # a kernel's InvalidArgument (inputs onnxruntime refuses as INVALID_ARGUMENT) keeps its type
    kind = InvalidArgument if isinstance(error, InvalidArgument) else RuntimeException
    return kind(
        f"while running node '{node.label}' ({node.op_type}) with inputs {shapes}: "
        f"{type(error).__name__}: {error}"
    )
