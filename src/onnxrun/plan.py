"""Step 5 of a session: bind every node to a prepared kernel and lay out the run.

A ``Program`` is a graph compiled once: values live in numbered slots, each node becomes a step
``(kernel, input slots, output slots, slots to free)``. A ``Plan`` is the list of steps needed
for one set of requested outputs, with every intermediate freed right after its last use; plans
are cached per output set. Running copies the slot template into a local list, so concurrent
runs of one program share nothing mutable.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from .errors import InvalidGraph
from .execute import (
    CompiledSteps,
    ParallelSchedule,
    Step,
    parallel_schedule,
    run_steps,
    run_steps_parallel,
)
from .fuse import fuse_steps
from .ir import Graph, Model, Node, Value
from .ir.serde import tensor_type
from .ir.toposort import stable_topological_order
from .memory import Memory, Probe
from .partition import Assignment
from .proto import onnx
from .providers import KernelContext

AttributeProto = onnx.AttributeProto

# The RunOptions of the run in progress on this thread, so that subgraph bodies (Loop, Scan, If)
# check RunOptions.terminate between their nodes too.
_run_options: contextvars.ContextVar[Any] = contextvars.ContextVar("run_options", default=None)

NONE_SLOT = 0  # always None: a missing optional input reads it
DISCARD_SLOT = 1  # unnamed optional outputs are written here and never read


class Plan(NamedTuple):
    steps: list[Step]
    fetch_slots: list[int]
    schedule: ParallelSchedule | None = None  # set when the program runs in parallel mode
    compiled: CompiledSteps | None = None  # the steps as one function, for run_steps
    memory: Memory | None = None  # buffers for its intermediates (memory.py)


class Subgraph:
    """A compiled subgraph (If/Loop/Scan body) as its kernel sees it.

    ``sub(inputs, captured)`` runs the body with its formal inputs and the values it reads from
    enclosing scopes (in the order of the owning node's implicit inputs) and returns its outputs.
    """

    def __init__(self, program: Program) -> None:
        self.program = program
        self.graph = program.graph
        self.input_names = [v.name for v in program.graph.inputs]
        self.output_names = [v.name for v in program.graph.outputs]

    def __call__(self, inputs: Sequence[Any], captured: Sequence[Any] = ()) -> list[Any]:
        program = self.program
        feeds = list(zip(program.input_slots, inputs, strict=False))
        return program.run(program.full_plan, feeds, captured, _run_options.get())

    def inline_parts(self) -> tuple[list[Step], list[Any], list[int], list[int]]:
        """(steps, slot template, captured values' slots, output slots) of a body without
        formal inputs, what ``__call__`` runs: for an If's branch written into the enclosing
        plan's generated function (execute.Branches)."""
        program = self.program
        plan = program.full_plan
        return plan.steps, program.template, program.outer_slots, plan.fetch_slots


class Program:
    def __init__(
        self,
        graph: Graph,
        model: Model,
        assignment: Assignment,
        session_options: Any = None,
        outer: Sequence[Value] = (),
        pool: Any = None,
    ) -> None:
        self.graph = graph
        self.model = model
        self.reuse_memory = _reuses_memory(session_options)
        # runs of small element-wise steps as one (fuse.py), unless optimizations are off
        self.fuse = getattr(session_options, "graph_optimization_level", 99) != 0
        self._slot: dict[int, int] = {}
        template: list[Any] = [None, None]
        self.names: list[str] = ["<none>", "<discard>"]

        def slot(v: Value) -> int:
            s = self._slot.get(id(v))
            if s is None:
                s = self._slot[id(v)] = len(template)
                template.append(None)
                self.names.append(v.name)
            return s

        self.input_slots = [slot(v) for v in graph.inputs]
        self.outer_slots = [slot(v) for v in outer]
        overridable = {id(v) for v in graph.inputs}
        for v in graph.initializers.values():
            template[slot(v)] = v.const_value
        # values that are constant in every run (overridable initializers are inputs)
        self.constant_ids = {
            id(v) for v in graph.initializers.values() if id(v) not in overridable
        } | _outer_constant_ids(outer)

        order = _topological_order(graph, set(self._slot))
        self.steps: list[Step] = []
        release = _PrepackedRelease(graph, self.constant_ids, template, self._slot) \
            if _config(session_options).get(_KEEP_PREPACKED) != "1" and not any(
                (n.domain, n.op_type) in _READS_WHOLE_MODEL for n in _all_nodes(model.graph)) \
            else None
        for node in order:
            provider = assignment[id(node)]
            implicit = _implicit_inputs(node)
            attrs = self._attributes(node, model, assignment, session_options, implicit)
            ctx = KernelContext(
                node=node,
                opset=model.node_opset(node) or 0,
                constants=[
                    v.const_value if v is not None and id(v) in self.constant_ids else None
                    for v in node.inputs
                ],
                outputs_used=[bool(v.name) and (bool(v.uses) or v in graph.outputs)
                              for v in node.outputs],
                num_implicit_inputs=len(implicit),
                provider=provider,
                session_options=session_options,
                extra={"model": model},  # for kernels that prepare other nodes (Gradient)
            )
            try:
                kernel = provider.create_kernel(node, ctx.opset, ctx, attrs)
            except InvalidGraph:
                raise
            except Exception as e:
                raise InvalidGraph(
                    f"node '{node.label}' ({node.op_type}) could not be prepared: {e}"
                ) from e
            ins = tuple(NONE_SLOT if v is None else slot(v) for v in node.inputs) + tuple(
                slot(v) for v in implicit
            )
            outs = tuple(slot(v) if v.name else DISCARD_SLOT for v in node.outputs)
            self.steps.append(Step(kernel, ins, outs, (), node, provider.name))
            if release is not None:
                release.prepared(node, kernel)
        self.output_slots = [slot(v) for v in graph.outputs]
        self.template = template
        self._plans: dict[tuple[int, ...], Plan] = {}
        self._lock = threading.Lock()
        # ExecutionMode.ORT_PARALLEL: a thread pool for the top-level graph (subgraphs run
        # sequentially inside the node that owns them).
        self.pool = pool
        self.full_plan = self.plan(tuple(self.output_slots))
        # A top-level program's plans per input-shape signature: set by specialize.attach
        # (which reads the program, so this module does not import it).
        self.specializer: Any = None

    def slot_of(self, v: Value) -> int:
        return self._slot[id(v)]

    # -- preparation ---------------------------------------------------------------------------

    def _attributes(
        self, node: Node, model: Model, assignment: Assignment, options: Any, implicit: list[Value]
    ) -> dict[str, Any]:
        attrs: dict[str, Any] = {}
        for name, a in node.attributes.items():
            if a.type == AttributeProto.GRAPH:
                attrs[name] = Subgraph(Program(a.value, model, assignment, options, implicit))
            elif a.type == AttributeProto.GRAPHS:
                attrs[name] = [
                    Subgraph(Program(g, model, assignment, options, implicit)) for g in a.value
                ]
            else:
                attrs[name] = a.value
        return attrs

    def plan(self, fetch_slots: tuple[int, ...], known: frozenset[int] = frozenset()) -> Plan:
        """Steps that compute ``fetch_slots``, with frees after each value's last use. The values
        of the slots ``known`` are given with the feeds: their steps are left out."""
        key = (fetch_slots, known) if known else fetch_slots
        cached = self._plans.get(key)
        if cached is not None:
            return cached
        producer_step: dict[int, int] = {}
        for i, step in enumerate(self.steps):
            for s in step.outputs:
                if s != DISCARD_SLOT:
                    producer_step[s] = i
        needed = [False] * len(self.steps)
        stack = [s for s in fetch_slots]
        while stack:
            s = stack.pop()
            i = None if s in known else producer_step.get(s)
            if i is None or needed[i]:
                continue
            needed[i] = True
            stack.extend(self.steps[i].inputs)
        selected = [step for i, step in enumerate(self.steps) if needed[i]]
        keep = set(fetch_slots) | {NONE_SLOT, DISCARD_SLOT}
        last_use: dict[int, int] = {}
        for i, step in enumerate(selected):
            for s in step.inputs:
                last_use[s] = i
            for s in step.outputs:
                last_use.setdefault(s, i)  # produced but never read: free at once
        frees: list[list[int]] = [[] for _ in selected]
        for s, i in last_use.items():
            if s not in keep:
                frees[i].append(s)
        steps = [step._replace(frees=tuple(f)) for step, f in zip(selected, frees, strict=True)]
        if self.fuse:
            template = self.template
            constants = {s: template[s] for s in map(self._slot.get, self.constant_ids)
                         if s is not None and template[s] is not None}
            steps = fuse_steps(steps, constants)
        schedule = parallel_schedule(steps, keep) if self.pool is not None else None
        memory = Memory.of(steps, fetch_slots) if self.reuse_memory and schedule is None \
            else None
        plan = Plan(steps, list(fetch_slots), schedule,
                    CompiledSteps(steps, fetch_slots, memory and memory.candidates), memory)
        with self._lock:
            if len(self._plans) < 64:
                self._plans[key] = plan
        return plan

    # -- running -------------------------------------------------------------------------------

    def run(self, plan: Plan, feeds: Sequence[tuple[int, Any]], captured: Sequence[Any] = (),
            run_options: Any = None) -> list[Any]:
        slots = self.template.copy()
        for s, value in feeds:
            slots[s] = value
        for s, value in zip(self.outer_slots, captured, strict=False):
            slots[s] = value
        if plan.schedule is not None and len(plan.steps) > 1:
            token = _run_options.set(run_options)
            try:
                run_steps_parallel(plan.steps, plan.schedule, slots, run_options, self.pool)
            finally:
                _run_options.reset(token)
        elif plan.memory is not None:
            token = _run_options.set(run_options) if run_options is not None else None
            try:
                self._run_with_buffers(plan, plan.memory, slots, feeds, captured, run_options)
            finally:
                if token is not None:
                    _run_options.reset(token)
        elif run_options is None:
            run_steps(plan.steps, slots, self.names, None, plan.compiled)
        else:
            token = _run_options.set(run_options)
            try:
                run_steps(plan.steps, slots, self.names, run_options, plan.compiled)
            finally:
                _run_options.reset(token)
        return [slots[s] for s in plan.fetch_slots]

    def _run_with_buffers(self, plan: Plan, memory: Memory, slots: list[Any],
                          feeds: Sequence[tuple[int, Any]], captured: Sequence[Any],
                          run_options: Any) -> None:
        """A run whose intermediates go into the blocks of the pattern of its input shapes;
        the first run of those shapes records the pattern."""
        key = (tuple([getattr(v, "shape", None) for _, v in feeds]),
               tuple([getattr(v, "shape", None) for v in captured]))
        pattern = memory.patterns.get(key, False)
        if pattern is False and memory.first_sighting(key):
            # shapes seen once (a decode step's, whose past grows) are never recorded: the
            # recording loop is slower than the generated function
            run_steps(plan.steps, slots, self.names, run_options, plan.compiled)
        elif pattern is False:
            recorder = memory.recorder()
            if run_steps(plan.steps, slots, self.names, run_options, plan.compiled,
                         observe=recorder.observe):
                memory.learn(key, recorder)
        elif pattern is None:  # nothing large enough to reuse at these shapes
            run_steps(plan.steps, slots, self.names, run_options, plan.compiled)
        elif pattern.recorder is not None:  # its first run: which kernels write into out
            recorder = pattern.recorder
            if run_steps(plan.steps, slots, self.names, run_options, plan.compiled,
                         Probe(pattern), recorder.check):
                memory.verified(key, pattern, recorder.unused)
        else:
            buffers = pattern.checkout()
            try:
                run_steps(plan.steps, slots, self.names, run_options, plan.compiled, buffers)
            finally:
                pattern.checkin(buffers)

    def run_fetches(self, fetch_slots: tuple[int, ...], feeds: Sequence[tuple[int, Any]],
                    run_options: Any = None) -> list[Any]:
        """Run the plan for ``fetch_slots``, specialized to the feeds' shapes when it can be."""
        if self.specializer is not None:
            return self.specializer.run(fetch_slots, feeds, run_options)
        return self.run(self.plan(fetch_slots), feeds, (), run_options)

    def run_full(self, inputs: Sequence[Any], captured: Sequence[Any] = ()) -> list[Any]:
        feeds = list(zip(self.input_slots, inputs, strict=False))
        return self.run(self.full_plan, feeds, captured)


# onnxruntime's session config key: "1" keeps every initializer as given (here: the kernels
# still pack their weights, but the session keeps the originals too)
_KEEP_PREPACKED = "session.disable_prepacking"


class _PrepackedRelease:
    """Drops each initializer that every reader holds in its own layout (a kernel's
    ``prepacked_inputs``: a MatMul's weight in the compiled GEMM's panels) from the slots
    and from the IR as soon as its last reader is prepared, as onnxruntime frees a
    pre-packed initializer: a weight is held once, and never twice at the same time (the
    peak). Those readers are then called with None for that input. A value read inside a
    subgraph, a graph output or an overridable initializer is kept."""

    def __init__(self, graph: Graph, constant_ids: set[int], template: list[Any],
                 slots: dict[int, int]) -> None:
        self.template, self.slots = template, slots
        outputs = {id(v) for v in graph.outputs}
        own = {id(n) for n in graph.nodes}
        # initializer -> its readers not prepared yet (None: kept whatever they do)
        self.pending: dict[int, list[tuple[Node, int]] | None] = {}
        for v in graph.initializers.values():
            if id(v) in constant_ids and id(v) not in outputs and v.uses:
                self.pending[id(v)] = list(v.uses) if all(id(n) in own for n, _ in v.uses) \
                    else None
        self.kept: set[int] = set()  # initializers some prepared reader reads itself

    def prepared(self, node: Node, kernel: Any) -> None:
        packed = set(getattr(kernel, "prepacked_inputs", ()))
        for i, v in enumerate(node.inputs):
            readers = None if v is None else self.pending.get(id(v))
            if readers is None or (node, i) not in readers:
                continue
            if i not in packed:
                self.kept.add(id(v))
            readers.remove((node, i))
            if not readers and id(v) not in self.kept:
                del self.pending[id(v)]
                self.template[self.slots[id(v)]] = None
                if v.type is None:  # its shape and dtype stay known (a Conv's layout choice)
                    v.type = tensor_type(v.const_value)
                v.const_value = None


# Kernels that read initializers by name from the model, not through their inputs: the
# Gradient node runs the forward pass again on the constants it finds there.
_READS_WHOLE_MODEL = frozenset({("ai.onnx.preview.training", "Gradient")})


def _all_nodes(graph: Graph):
    for n in graph.nodes:
        yield n
        for sub in n.subgraphs():
            yield from _all_nodes(sub)


def _reuses_memory(options: Any) -> bool:
    """Whether runs reuse buffers for intermediates (memory.py): onnxruntime's options that
    turn its memory pattern and arena off turn this off."""
    return options is None or all(getattr(options, name, True) for name in (
        "enable_mem_pattern", "enable_cpu_mem_arena", "enable_mem_reuse"))


def _config(options: Any) -> dict:
    return getattr(options, "_config", None) or {}


def _outer_constant_ids(outer: Sequence[Value]) -> set[int]:
    ids = set()
    for v in outer:
        g = v.graph
        if v.is_initializer and g is not None and all(v is not i for i in g.inputs):
            ids.add(id(v))
    return ids


def _implicit_inputs(node: Node) -> list[Value]:
    """Outer-scope values read by the node's subgraphs (the node's implicit inputs)."""
    seen: dict[int, Value] = {}
    for sub in node.subgraphs():
        for v in sub.outer_references():
            seen.setdefault(id(v), v)
    return list(seen.values())


def _topological_order(graph: Graph, available: set[int]) -> list[Node]:
    """The graph's nodes, each after those it reads from, stable w.r.t. the file's order."""
    index = {id(v): i for i, n in enumerate(graph.nodes) for v in n.outputs}
    deps: list[set[int]] = []
    for i, n in enumerate(graph.nodes):
        d = set()
        for v in [*n.inputs, *_implicit_inputs(n)]:
            p = None if v is None else index.get(id(v))
            if p == i:
                raise InvalidGraph(f"node '{n.label}' ({n.op_type}) reads its own output")
            if p is not None:
                d.add(p)
        deps.append(d)
    order, stuck = stable_topological_order(deps)
    if stuck:
        names = [graph.nodes[i].label for i in stuck][:5]
        raise InvalidGraph(f"graph '{graph.name}' has a cycle (nodes involved: {names})")
    return [graph.nodes[i] for i in order]


__all__ = ["DISCARD_SLOT", "NONE_SLOT", "Plan", "Program", "Subgraph", "np"]
