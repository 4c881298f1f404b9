"""Shape specialization: plans specialized per input-shape signature (part of step 5, plan).

A model exported with dynamic axes computes from its inputs' *shapes* as well as their values:
``Shape -> Gather -> Range -> Gather(position embeddings)``, ``ConstantOfShape`` for an RNN's
initial state, a causal mask sliced to the sequence length. The optimizer folds that arithmetic
when shapes are fixed in the file (or by free-dimension overrides); at run time the shapes are
known too, and an application usually repeats them. So:

- At plan time, the steps whose outputs depend only on the shapes of the graph inputs (not their
  values) are found: ``Shape``/``Size`` of a graph input, or of a value whose inferred shape is
  made of numbers and the inputs' named dimensions; then every deterministic step that reads only
  constants and such values. Their outputs read by other steps form the *frontier*.
- A run keeps the frontier values. The second time a run comes with a given signature (the
  shapes of all inputs, and the outputs requested), and its frontier values equal the first
  run's, later runs with that signature use a plan without the shape steps, the frontier values
  filled in like initializers. A bounded cache (least recently used out first) holds the
  specializations.

Kernels never write into their inputs (GroupQueryAttention's opt-in shared past/present writes
only into the past buffers the caller feeds), so a cached frontier value is as safe as an
initializer.
The session option ``onnxrun.shape_specialization`` = "0" turns this off; it follows the graph
optimization level (off at ORT_DISABLE_ALL).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np

from .dtypes import type_shape
from .plan import Plan, Program

MAX_SIGNATURES = 8  # specializations kept per program
# Larger frontier values are not worth the memory: the steps run every time. Also the bound on
# the values remembered for signatures seen once.
MAX_FRONTIER_BYTES = 64 << 20
_MAX_SEEN = 32  # signatures seen once, remembered with their frontier values

# Operators whose outputs are not a function of their inputs alone.
_NONDETERMINISTIC = frozenset({
    "RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial",
    "Bernoulli", "Dropout",
})
_DOMAINS = frozenset({"", "com.microsoft"})


class ShapeSpecializer:
    """The shape-only steps of a top-level program and its cache of specializations."""

    def __init__(self, program: Program) -> None:
        self.program = program
        inputs = set(program.input_slots)
        names = set()  # named dimensions of the graph inputs
        for v in program.graph.inputs:
            for d in type_shape(v.type) or ():
                if isinstance(d, str) and d:
                    names.add(d)
        outputs = set(program.output_slots)
        constant = {program.slot_of(v) for v in program.graph.initializers.values()
                    if id(v) in program.constant_ids}
        shape_only: set[int] = set()  # slots whose value depends on input shapes alone
        steps: set[int] = set()
        for i, step in enumerate(program.steps):
            node = step.node
            if node.domain not in _DOMAINS or node.op_type in _NONDETERMINISTIC or \
                    node.subgraphs() or any(s in outputs for s in step.outputs):
                continue  # graph outputs are computed afresh: the caller owns what it gets
            if step.provider != "CPUExecutionProvider":
                continue  # device values (a copy's upload among them) are not cached here
            if node.op_type in ("Shape", "Size"):
                src = node.inputs[0]
                dims = type_shape(src.type)
                ok = step.inputs[0] in inputs or (dims is not None and all(
                    isinstance(d, int) or d in names for d in dims))
            else:
                reads = [s for s in step.inputs if s != 0]
                ok = bool(reads) and all(s in constant or s in shape_only for s in reads) and \
                    any(s in shape_only for s in reads)
            if ok:
                steps.add(i)
                shape_only.update(step.outputs)
        frontier = set()
        for i, step in enumerate(program.steps):
            if i not in steps:
                frontier.update(s for s in step.inputs if s in shape_only)
        self.steps = frozenset(steps)
        self.frontier = tuple(sorted(frontier))
        self._input_slots = tuple(program.input_slots)
        self._cache: OrderedDict[tuple, tuple[Plan, list[tuple[int, Any]]] | None] = \
            OrderedDict()
        # signature -> (frontier values of its first run, their bytes)
        self._seen: OrderedDict[tuple, tuple[list[tuple[int, Any]], int]] = OrderedDict()
        self._seen_bytes = 0
        self._lock = threading.Lock()

    @property
    def active(self) -> bool:
        return bool(self.frontier)

    def signature(self, feeds: Sequence[tuple[int, Any]], fetch_slots: tuple[int, ...]) -> tuple:
        shapes = dict.fromkeys(self._input_slots)
        for s, value in feeds:
            shapes[s] = getattr(value, "shape", None)
        return tuple(shapes.values()), fetch_slots

    def run(self, fetch_slots: tuple[int, ...], feeds: Sequence[tuple[int, Any]],
            run_options: Any) -> list[Any]:
        program = self.program
        key = self.signature(feeds, fetch_slots)
        entry = self._cache.get(key, False)
        if entry:
            with self._lock:
                if key in self._cache:
                    self._cache.move_to_end(key)
            plan, known = entry
            return program.run(plan, [*feeds, *known], (), run_options)
        if entry is None:  # specializing this signature was declined
            return program.run(program.plan(fetch_slots), feeds, (), run_options)
        # Not specialized yet: run keeping the frontier values.
        capture = program.plan(fetch_slots + self.frontier)
        results = program.run(capture, feeds, (), run_options)
        n = len(fetch_slots)
        known = [(s, v) for s, v in zip(self.frontier, results[n:], strict=True)
                 if v is not None]
        size = sum(v.nbytes for _, v in known if isinstance(v, np.ndarray))
        with self._lock:
            first = self._seen.pop(key, None)
            if first is None and size <= MAX_FRONTIER_BYTES:
                # First sighting: remember the values, to compare them the next time.
                self._seen[key] = (known, size)
                self._seen_bytes += size
                while len(self._seen) > _MAX_SEEN or self._seen_bytes > MAX_FRONTIER_BYTES:
                    self._seen_bytes -= self._seen.popitem(last=False)[1][1]
                return results[:n]
            if first is not None:
                self._seen_bytes -= first[1]
        # Second sighting. The values must not have changed: a shape the inferred types called
        # input-determined that is not (a mislabelled data-dependent dimension) shows here.
        specialized = None
        if first is not None and _same(first[0], known):
            plan = program.plan(fetch_slots, known=frozenset(s for s, _ in known))
            if len(plan.steps) < len(capture.steps):
                specialized = (plan, known)
        with self._lock:
            self._cache[key] = specialized
            while len(self._cache) > MAX_SIGNATURES:
                self._cache.popitem(last=False)
        return results[:n]


def _same(a: list[tuple[int, Any]], b: list[tuple[int, Any]]) -> bool:
    if len(a) != len(b):
        return False
    for (sa, va), (sb, vb) in zip(a, b, strict=True):
        if sa != sb or not (isinstance(va, np.ndarray) and isinstance(vb, np.ndarray)):
            return False  # sequences and the like: not worth comparing, never specialized
        if va.dtype != vb.dtype or va.shape != vb.shape or \
                not np.array_equal(va, vb, equal_nan=va.dtype.kind in "fc"):
            return False
    return True


def attach(program: Program) -> None:
    """Let a top-level program's runs use specialized plans, when it has shape-only steps."""
    specializer = ShapeSpecializer(program)
    if specializer.active:
        program.specializer = specializer


__all__ = ["MAX_SIGNATURES", "ShapeSpecializer", "attach"]
