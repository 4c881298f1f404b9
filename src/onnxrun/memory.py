"""Memory pattern: one arena for a plan's intermediates, its bytes reused across the plan's
nodes and runs (part of step 5, plan; execute.py hands the buffers to the kernels).

Every kernel used to write a fresh array per output, and large fresh arrays come from mmap:
each run paid first-touch page faults on every large intermediate (DenseNet-style's Relu
11-12 ms per run against 4-6 ms with the memory kept, docs/PERFORMANCE.md). onnxruntime plans
a run's memory once per input shapes (its memory pattern) and reuses it; so does this:

- The second run of a plan with given input shapes is *recorded* (shapes seen once, such as a
  decode step's whose past grows, never are): for each step whose kernel
  can write into a given array (``accepts_out``: a bare ufunc, or a kernel marked with
  ``registry.takes_out`` / ``accepts_out = True``), the shapes it read and the shape, dtype and
  strides of the fresh array it returned; and which later values alias that array (views:
  Reshape, Squeeze, Slice...): its memory is in use until the last of them is read.
- Outputs of at least ``MIN_BYTES`` (smaller ones come from malloc's heap, without page
  faults) get a place in an arena: offsets where no value live at the same time lies, the
  largest first. A graph output, or anything that aliases one, never gets one: what a run
  returns is never pooled memory.
- A Concat's input that it reads last (no view of it alive), from a kernel that writes
  its output once in order (an elementwise one, another Concat), is written in its place: its
  producer is handed its range of the Concat's bytes (``_Recorder._slices``; nested Concats
  too) and Concat copies nothing for it. An elementwise kernel's output (a ufunc, a kernel
  with ``in_place = True``) shares the bytes of a same-shaped input that dies at it
  (``_Recorder._in_place``), as onnxruntime's allocation planner reuses an input's buffer.
- The next run gives each such step memory of its own (``Probe``): the steps whose kernel
  returned something else (a method that writes no output of its own) are left out, since
  their bytes would be touched and a fresh array allocated besides.
- Later runs *check out* an arena (``Buffers``: one per concurrent run, kept between runs).
  A step is handed ``out=`` a view of its bytes only when its inputs have the recorded shapes
  and nothing holds a value that lay in those bytes earlier in the run (each value's bytes are
  exported by a handle of their own, and every array on them holds it, so a reference count
  shows a value that outlived what the record said, a kernel that kept an array, an exception's
  traceback); otherwise the kernel allocates, as before. When the run ends, an arena something
  still holds is dropped, and the next run allocates a new one.

Session options: ``enable_mem_pattern``, ``enable_cpu_mem_arena`` or ``enable_mem_reuse`` off
(onnxruntime's names) turns this off.
"""

from __future__ import annotations

import bisect
import ctypes
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

MIN_BYTES = 64 << 10  # smaller outputs: malloc's heap serves them without page faults
# The arena's first byte (its values' offsets are multiples of 64): a 64-byte vector load of
# a value's start, and of every 64 bytes after it, then lies in one cache line, not two
# (np.empty's large blocks start 16 bytes into a page). Alternating sessions, 1 thread,
# AVX-512 EPYC, medians of 3 x 40 runs: MobileNetV2 9.32-9.43 -> 8.88-9.02 ms, SqueezeNet
# 8.72-8.95 -> 8.51-8.79, DenseNet-style 50.6-50.9 -> 49.5-51.0.
ARENA_ALIGN = 64
_PAGE_BYTES = 4096  # the smallest page size of the platforms numpy runs on
_GUARD_BYTES = 4 * _PAGE_BYTES  # written margin before and after an arena (Buffers._allocate)
MAX_PATTERNS = 8  # input-shape signatures kept per plan
MAX_SEEN = 32  # signatures run once, remembered

_getrefcount = sys.getrefcount


def accepts_out(kernel: Any) -> bool:
    """Whether ``kernel(*inputs, out=array)`` writes its one output into ``array`` (or returns
    a fresh array when ``out`` is None): numpy's ufuncs with one output, and kernels (or the
    functions of their partials) with ``accepts_out = True``. Such a kernel's output shape is a
    function of its inputs' shapes, and ``out`` never overlaps its inputs."""
    if isinstance(kernel, np.ufunc):
        return kernel.nout == 1
    return getattr(kernel, "accepts_out", False) is True or \
        getattr(getattr(kernel, "func", None), "accepts_out", False) is True


def _root(value: Any) -> Any:
    """The object that owns ``value``'s memory: numpy collapses a view's base to the array
    that owns its data, or to the last array before another object that exports it."""
    while True:
        base = value.base
        if base is None:
            return value
        if not isinstance(base, np.ndarray):
            return base
        value = base


class _Recorder:
    """Watches one run (``observe`` after each step) and builds the pattern from it; then
    (``check``) the first run with the pattern, for the kernels that did not write into the
    buffer they were given."""

    def __init__(self, memory: Memory) -> None:
        self.memory = memory
        self.outs: dict[int, tuple] = {}  # candidate -> (arg shapes, shape, dtype, strides)
        self.group: dict[int, set[int]] = {}  # candidate -> the slots aliasing its output
        self.root: dict[int, int] = {}  # candidate -> id of its output's memory
        self.alive: dict[int, int] = {}  # id(memory) -> candidate, while a slot holds it
        self.owner: dict[int, int] = {}  # slot not freed yet -> the candidate it aliases
        self.refs: dict[int, int] = {}  # candidate -> its slots not freed yet
        self.unused: set[int] = set()  # candidates that wrote elsewhere (check)
        self.unsliced: set[int] = set()  # candidates that wrote elsewhere than a join's slice

    def observe(self, i: int, args: Sequence[Any], results: Sequence[Any],
                outs: Sequence[int], frees: Sequence[int]) -> None:
        j = self.memory.candidates.get(i)
        for s, r in zip(outs, results, strict=False):
            if not isinstance(r, np.ndarray):
                continue
            root = _root(r)
            owner = self.alive.get(id(root))  # ids are unique among live objects
            if owner is not None:  # a view of a candidate's output (or the output itself)
                self.group[owner].add(s)
                self.owner[s] = owner
                self.refs[owner] += 1
            elif j is not None and s == outs[0] and r.nbytes >= MIN_BYTES and \
                    isinstance(root, np.ndarray) and root.base is None and \
                    root.nbytes == r.nbytes and min(r.strides) >= 0 and \
                    r.ctypes.data == root.ctypes.data:
                # a fresh array that covers all of its memory, in some order of the axes
                self.outs[j] = (tuple(getattr(a, "shape", None) for a in args), r.shape,
                                r.dtype, r.strides)
                self.group[j] = {s}
                self.root[j] = id(root)
                self.alive[id(root)] = j
                self.owner[s] = j
                self.refs[j] = 1
        for s in frees:
            k = self.owner.pop(s, None)
            if k is not None:
                self.refs[k] -= 1
                if self.refs[k] == 0:
                    del self.alive[self.root[k]]

    def check(self, i: int, args: Sequence[Any], results: Sequence[Any], outs: Sequence[int],
              frees: Sequence[int], given: np.ndarray | None) -> None:
        if given is not None and (not isinstance(results[0], np.ndarray) or
                                  _root(results[0]) is not given.base):
            self.unused.add(self.memory.candidates[i])

    def pattern(self) -> Pattern | None:
        memory = self.memory
        live: dict[int, list[int]] = {}  # candidate -> [first step, last step]
        for j in self.outs:
            group = self.group[j]
            if not memory.fetch_slots.isdisjoint(group):
                continue  # returned to the caller (or a view of it is): fresh memory
            live[j] = [memory.step_of[j], max(memory.freed_at.get(s, memory.num_steps)
                                              for s in group)]
        if not live:
            return None
        parent = self._slices(live)
        best = self._place(live, parent)
        plain = self._place(live, {}) if parent else best
        if plain.nbytes < best.nbytes:
            # A slice keeps its join's bytes in use from its producer on: where that makes
            # the arena larger (DBNet-style: an early upsampled map, +7 MiB), the join's
            # slices are dropped, one join at a time, for as long as the arena shrinks; never
            # larger than without any
            for c in sorted({c for c, _, _ in parent.values()}):
                fewer = {k: v for k, v in parent.items() if v[0] != c}
                trial = self._place(live, fewer)
                if trial.nbytes < best.nbytes:
                    parent, best = fewer, trial
            if plain.nbytes < best.nbytes:
                best = plain
        return best

    def _place(self, live: dict[int, list[int]],
               parent: dict[int, tuple[int, int, int]]) -> Pattern:
        """The pattern with the slices of ``parent`` (and the values written over their
        inputs that these allow): offsets by liveness."""
        memory = self.memory
        live = {j: list(v) for j, v in live.items()}
        over = self._in_place(live, parent)
        root_of: dict[int, int] = {}
        for j in live:
            r = j
            while r in parent or r in over:
                r = parent[r][0] if r in parent else over[r][1]
            root_of[j] = r
            if r != j:  # a root's bytes are in use from its first slice's producer on,
                # until the last value written over it is gone
                live[r][0] = min(live[r][0], live[j][0])
                live[r][1] = max(live[r][1], live[j][1])
        roots = [j for j in live if j not in parent and j not in over]
        items = []  # (bytes, first step, last step, candidate)
        for j in roots:
            _, shape, dtype, strides = self.outs[j]
            size = dtype.itemsize * _extent(shape, strides, dtype.itemsize)
            items.append((max(64, (size + 63) // 64 * 64), live[j][0], live[j][1], j))
        # Offsets in one arena, the largest values first, each at the lowest offset where no
        # value live at the same time lies (greedy by size: within a few percent of the most
        # bytes live at once on these models)
        items.sort(key=lambda t: (-t[0], t[1]))
        placed: list[tuple[int, int, int, int, int]] = []  # (offset, bytes, first, last, j)
        specs: list[tuple | None] = [None] * len(memory.candidates)
        total = 0
        for size, start, end, j in items:
            offset = 0
            for o, n, first, last, _ in placed:
                if first > end or last < start:
                    continue  # not live at the same time
                if o - offset >= size:
                    break
                offset = max(offset, o + n)
            bisect.insort(placed, (offset, size, start, end, j))
            total = max(total, offset + size)
        inside: dict[int, list[int]] = {}  # root -> its slices and the values over it
        for j, r in root_of.items():
            if r != j:
                inside.setdefault(r, []).append(j)
        for offset, size, start, _, j in placed:
            # the values in the same bytes earlier in the run (and the slices they were
            # written in): all must be gone before j, or any of its slices, is written
            earlier = tuple(m for o, n, _, last, k in placed
                            if last < start and o < offset + size and offset < o + n
                            for m in (k, *inside.get(k, ())))
            arg_shapes, shape, dtype, strides = self.outs[j]
            specs[j] = (offset, size, earlier, arg_shapes, shape, dtype, strides)
            for k in inside.get(j, ()):
                at = offset
                m = k
                while m in parent:  # the slice's place in its join, in the root's layout
                    m, axis, pos = parent[m]
                    at += pos * strides[axis]
                arg_shapes_k, shape_k, _, _ = self.outs[k]
                specs[k] = (at, dtype.itemsize * _extent(shape_k, strides, dtype.itemsize),
                            earlier, arg_shapes_k, shape_k, dtype, strides)
        onto: list[tuple[int, int] | None] | None = None
        if over:
            onto = [None] * len(specs)
            for j, kp in over.items():
                onto[j] = kp
        return Pattern(total, specs, frozenset(parent), onto)

    def _in_place(self, live: dict[int, list[int]],
                  parent: dict[int, tuple[int, int, int]]) -> dict[int, tuple[int, int]]:
        """The candidates written over one of their inputs (as onnxruntime's allocation
        planner reuses an input's buffer for an elementwise node's output): j -> (the
        input's index, the candidate that wrote it). That input dies at j (its last reader,
        no view of it), has j's output's shape, dtype and strides, and lies in no join's
        slice; j is an elementwise kernel (``Memory.in_place``) in no slice itself."""
        memory = self.memory
        sole = {next(iter(g)): j for j, g in self.group.items() if len(g) == 1}
        over: dict[int, tuple[int, int]] = {}
        taken: set[int] = set()
        for j, slots in memory.in_place.items():
            if j not in live or j in parent:
                continue
            arg_shapes, shape, dtype, strides = self.outs[j]
            for k, s in enumerate(slots):
                p = sole.get(s)
                if p is not None and p in live and p not in parent and p not in taken and \
                        slots.count(s) == 1 and k < len(arg_shapes) and \
                        arg_shapes[k] == shape and \
                        memory.freed_at.get(s) == memory.step_of[j] and \
                        self.outs[p][1:] == (shape, dtype, strides):
                    over[j] = (k, p)
                    taken.add(p)
                    break
        return over

    def _slices(self, live: dict[int, list[int]]) -> dict[int, tuple[int, int, int]]:
        """The candidates written straight into a join's output (Concat: its inputs one
        after another along an axis): child -> (the join, its axis, the child's first index
        along it). A child is a join's input read last by it (no view of it), of the join's
        dtype, whose kernel writes its output once, in order (``Memory.streams``: a GEMM's
        tiles, read back across its K blocks, cost up to 1.5x in rows a Concat's width
        apart, far more than the copy saved), and wrote where it was told (else
        ``unsliced``)."""
        memory = self.memory
        sole = {next(iter(g)): j for j, g in self.group.items() if len(g) == 1}
        parent: dict[int, tuple[int, int, int]] = {}
        for c in sorted(memory.joins, key=memory.step_of.__getitem__):  # inner joins first
            if c not in live or c not in self.outs:
                continue
            axis, slots = memory.joins[c]
            arg_shapes, shape, dtype, _ = self.outs[c]
            axis = axis + len(shape) if axis < 0 else axis
            if not 0 <= axis < len(shape) or len(arg_shapes) != len(slots):
                continue
            pos = 0
            for s, arg_shape in zip(slots, arg_shapes, strict=True):
                p = sole.get(s)
                if p is not None and p in live and p not in parent and p in memory.streams \
                        and p not in self.unsliced and slots.count(s) == 1 and \
                        memory.freed_at.get(s) == memory.step_of[c] and \
                        self.outs[p][1] == arg_shape and self.outs[p][2] == dtype:
                    parent[p] = (c, axis, pos)
                if arg_shape is None or len(arg_shape) != len(shape):
                    break
                pos += arg_shape[axis]
        return parent


def _extent(shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int) -> int:
    """Elements an array of this shape and (non-negative) strides spans."""
    if 0 in shape:
        return 0
    return (sum((n - 1) * s for n, s in zip(shape, strides, strict=True)) + itemsize) // itemsize


class Pattern:
    """The arena of one input-shape signature: where each candidate's output lies in it."""

    __slots__ = ("nbytes", "specs", "slices", "over", "free", "recorder")

    def __init__(self, nbytes: int, specs: list[tuple | None],
                 slices: frozenset[int] = frozenset(),
                 over: list[tuple[int, int] | None] | None = None) -> None:
        self.nbytes = nbytes
        # per candidate: None, or (offset, bytes, the candidates earlier in the same bytes,
        # its inputs' shapes, its output's shape, dtype and strides)
        self.specs = specs
        self.slices = slices  # the candidates given a slice of a join's output
        # per candidate (or None for none): None, or (k, p): written over its input k, the
        # output of candidate p, whose bytes it shares (_Recorder._in_place)
        self.over = over
        self.free: list[Buffers] = []  # checked in, ready for the next run
        self.recorder: _Recorder | None = None  # set until the pattern's first run

    def checkout(self) -> Buffers:
        try:
            return self.free.pop()
        except IndexError:
            return Buffers(self)

    def checkin(self, buffers: Buffers) -> None:
        buffers.release()
        self.free.append(buffers)


class Buffers:
    """One run's arena (allocated with it, before the run's first kernel, and again at the first
    ``take`` after ``release`` dropped it). ``take(j, *args)`` is the ``out`` of
    candidate ``j`` called on ``args``, or None.

    Each candidate's bytes are exported by a handle of their own (a ctypes array over the
    arena): an array ``take`` makes on them, and every numpy view of it, holds the handle,
    so its reference count says whether anything still uses the value."""

    __slots__ = ("pattern", "specs", "over", "bases", "arena", "handles")

    def __init__(self, pattern: Pattern) -> None:
        self.pattern = pattern
        self.specs = pattern.specs
        self.over = pattern.over
        # the candidates whose values are written over: their arrays get an array of bytes
        # as base, which numpy gives every view of them as well, so that its reference
        # count says whether the value is still read through anything but the input
        self.bases = frozenset(kp[1] for kp in pattern.over or () if kp is not None)
        self.arena: np.ndarray | None = None
        self.handles: list[Any] = []
        # Allocated now, before the run's first kernel: in the middle of a run, malloc would
        # place it above arrays of that run, whose memory it then keeps, free, below it
        # (+3 MiB of heap on YOLOv8n-style)
        self._allocate()

    def _allocate(self) -> list[Any]:
        raw = np.empty(self.pattern.nbytes + ARENA_ALIGN + 2 * _GUARD_BYTES, np.uint8)
        # Every page written once now, and a written margin on each side: a page the run
        # never writes (a gap between values, the untouched end of the allocation beside
        # the arena) stays unmapped, and the hardware prefetchers' reads into it each cost a
        # failed page walk (nested, on a virtual machine). ShuffleNet's 3x3/2 MaxPool, its
        # input at the arena's start, took 160 us a call with unmapped pages before it,
        # 121 us with one written page there, 58 us with four (16 KiB) or more.
        raw[::_PAGE_BYTES] = 0
        start = _GUARD_BYTES - ctypes.addressof(ctypes.c_char.from_buffer(raw)) % ARENA_ALIGN
        self.arena = arena = raw[start:start + self.pattern.nbytes]
        self.handles = [None if spec is None else
                        (ctypes.c_char * spec[1]).from_buffer(arena, spec[0])
                        for spec in self.specs]
        return self.handles

    def take(self, j: int, *args: Any) -> np.ndarray | None:
        spec = self.specs[j]
        if spec is None:
            return None
        _, _, earlier, arg_shapes, shape, dtype, strides = spec
        for a, s in zip(args, arg_shapes, strict=True):
            if getattr(a, "shape", None) != s:
                return None
        handles = self.handles or self._allocate()
        for k in earlier:
            handle = handles[k]
            if _getrefcount(handle) != _BASELINE:
                return None  # a value in these bytes is still in use: the kernel allocates
        if self.over is not None and self.over[j] is not None:
            # written over input k: it must be p's value in these bytes, the one array on
            # them (a view that outlived what the record said would hold their base too)
            k, p = self.over[j]
            base = getattr(args[k], "base", None)
            if base.__class__ is not np.ndarray or base.base is not handles[p] or \
                    _getrefcount(base) != _SOLE:
                return None
        handle = handles[j]
        if _getrefcount(handle) != _BASELINE:
            return None
        if j in self.bases:  # its arrays' base: an array every view of them holds too
            return np.ndarray(shape, dtype, np.ndarray((spec[1],), np.uint8, handle), 0,
                              strides)
        return np.ndarray(shape, dtype, handle, 0, strides)

    def release(self) -> None:
        """Drop the arena if something still holds a value in it once the run is over (a
        value that aliases one and was returned, a traceback): the next run allocates a new
        one, and the old one lives as long as what holds it."""
        for handle in self.handles:
            if handle is not None and _getrefcount(handle) != _BASELINE:
                self.arena = None
                self.handles = []
                return


class Probe:
    """The first run of a pattern: each candidate is given fresh memory of its own (no
    arena yet), to see which kernels write into what they are given (``_Recorder.check``);
    the arena is allocated for the pattern that follows."""

    __slots__ = ("specs",)

    def __init__(self, pattern: Pattern) -> None:
        self.specs = pattern.specs

    def take(self, j: int, *args: Any) -> np.ndarray | None:
        spec = self.specs[j]
        if spec is None:
            return None
        _, size, _, arg_shapes, shape, dtype, strides = spec
        for a, s in zip(args, arg_shapes, strict=True):
            if getattr(a, "shape", None) != s:
                return None
        handle = (ctypes.c_char * size).from_buffer(np.empty(size, np.uint8))
        return np.ndarray(shape, dtype, handle, 0, strides)


def _baseline() -> int:
    """The reference count ``Buffers.take`` sees for a handle nothing else holds."""
    probe = Buffers(Pattern(64, [(0, 64, (), (), (16,), np.dtype(np.float32), (4,))]))
    handles = probe._allocate()
    handle = handles[0]
    return _getrefcount(handle)


_BASELINE = _baseline()


def _sole() -> int:
    """The reference count ``Buffers.take`` sees for the base of an array that is the one
    array on it (counted the same way: a local, then the call)."""
    a = np.ndarray((1,), np.uint8, np.empty(1, np.uint8))
    base = getattr(a, "base", None)
    return _getrefcount(base)


_SOLE = _sole()


class Memory:
    """The memory patterns of one plan, per input-shape signature."""

    __slots__ = ("candidates", "step_of", "fetch_slots", "freed_at", "num_steps", "joins",
                 "in_place", "streams", "patterns", "seen")

    def __init__(self, candidates: dict[int, int], fetch_slots: Sequence[int],
                 frees: Sequence[Sequence[int]],
                 joins: dict[int, tuple[int, tuple[int, ...]]] | None = None,
                 in_place: dict[int, tuple[int, ...]] | None = None,
                 streams: frozenset[int] = frozenset()) -> None:
        self.candidates = candidates  # step index -> candidate index
        # candidate -> (axis, input slots) of a join: a kernel whose output is its inputs
        # one after another along ``axis`` (``joins_axis``: Concat), skipping an input
        # already in its place (_Recorder._slices)
        self.joins = joins or {}
        # candidate -> input slots of an elementwise kernel, whose output may be written over
        # a same-shaped input (a numpy ufunc, a kernel with ``in_place = True``)
        self.in_place = in_place or {}
        # candidates whose kernel writes its output once, element by element (a ufunc, a
        # join, ``streams_out = True``): written into a join's slice at no cost
        self.streams = streams
        self.step_of = {j: i for i, j in candidates.items()}
        self.fetch_slots = frozenset(fetch_slots)
        self.freed_at = {s: i for i, f in enumerate(frees) for s in f}
        self.num_steps = len(frees)
        self.patterns: dict[tuple, Pattern | None] = {}
        self.seen: dict[tuple, None] = {}  # signatures run once, not recorded yet

    @classmethod
    def of(cls, steps: Sequence[Any], fetch_slots: Sequence[int]) -> Memory | None:
        """The plan's memory, or None when no step can be given a buffer."""
        fetch = set(fetch_slots)
        candidates: dict[int, int] = {}
        joins: dict[int, tuple[int, tuple[int, ...]]] = {}
        in_place: dict[int, tuple[int, ...]] = {}
        streams: set[int] = set()
        for i, step in enumerate(steps):
            if len(step.outputs) == 1 and step.outputs[0] > 1 and \
                    step.outputs[0] not in fetch and \
                    step.provider == "CPUExecutionProvider" and accepts_out(step.kernel):
                axis = getattr(step.kernel, "joins_axis", None)
                if type(axis) is int and len(step.inputs) > 1:
                    joins[len(candidates)] = (axis, tuple(step.inputs))
                if isinstance(step.kernel, np.ufunc) or \
                        getattr(step.kernel, "in_place", False) is True:
                    in_place[len(candidates)] = tuple(step.inputs)
                if isinstance(step.kernel, np.ufunc) or type(axis) is int or \
                        getattr(step.kernel, "streams_out", False) is True:
                    streams.add(len(candidates))
                candidates[i] = len(candidates)
        if not candidates:
            return None
        return cls(candidates, fetch_slots, [step.frees for step in steps], joins, in_place,
                   frozenset(streams))

    def first_sighting(self, key: tuple) -> bool:
        """Whether ``key`` has not been run before (it is noted); a second run records."""
        if self.seen.pop(key, False) is None:
            return False
        if len(self.seen) >= MAX_SEEN:
            self.seen.clear()
        self.seen[key] = None
        return True

    def recorder(self) -> _Recorder:
        return _Recorder(self)

    def learn(self, key: tuple, recorder: _Recorder) -> None:
        if len(self.patterns) >= MAX_PATTERNS:
            self.patterns.clear()
        pattern = self.patterns[key] = recorder.pattern()
        if pattern is not None:
            pattern.recorder = recorder  # until its first run has shown which kernels wrote

    def verified(self, key: tuple, pattern: Pattern, unused: set[int]) -> None:
        """After the first run of ``pattern``: the candidates in ``unused`` returned something
        else than the buffer they were given (a method that writes no output of its own, an
        output in another layout). Their bytes, shared with other values, would be touched and
        a fresh array allocated besides: the pattern is made again without them."""
        recorder, pattern.recorder = pattern.recorder, None
        if unused and recorder is not None:
            sliced = unused & pattern.slices
            for j in unused - sliced:
                recorder.outs.pop(j, None)
            # a kernel that wrote elsewhere than a join's slice is given bytes of its own,
            # and the next run checks again that it writes there
            recorder.unsliced |= sliced
            recorder.unused = set()
            pattern = self.patterns[key] = recorder.pattern()
            if sliced and pattern is not None:
                pattern.recorder = recorder



__all__ = ["MIN_BYTES", "Buffers", "Memory", "Pattern", "Probe", "accepts_out"]
