"""Control flow (If, Loop, Scan, SequenceMap), sequences and optionals.

Subgraph attributes arrive as callable ``Subgraph`` objects: ``body(inputs, captured)`` returns
the body's outputs. A node that owns subgraphs receives, after its own inputs, the outer-scope
values its subgraphs read (``ctx.num_implicit_inputs`` of them); they are handed to every body
call unchanged. Sequences are Python lists of arrays; an empty optional is None.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ....dtypes import np_dtype
from ..kernels import KernelContext, op

_LATEST = (19, 21, 23, 24, 25)  # type-only revisions of If/Loop/Scan


def _scalar_bool(value: Any, what: str) -> bool:
    a = np.asarray(value)
    if a.size != 1:
        raise ValueError(f"{what} must have exactly one element, got shape {list(a.shape)}")
    return bool(a.reshape(-1)[0])


def _scalar_int(value: Any, what: str) -> int:
    a = np.asarray(value)
    if a.size != 1:
        raise ValueError(f"{what} must have exactly one element, got shape {list(a.shape)}")
    return int(a.reshape(-1)[0])


def _output_templates(body: Any) -> list[tuple[np.dtype, list[int] | None]]:
    """Per body output: its element dtype and static shape (None where unknown).

    Used to shape scan outputs of zero iterations, which have no value to copy them from.
    """
    templates = []
    for v in body.graph.outputs:
        tp = v.type
        dtype, shape = np.dtype(np.float32), None
        if tp is not None and tp.WhichOneof("value") == "tensor_type":
            try:
                dtype = np_dtype(tp.tensor_type.elem_type)
            except TypeError:
                pass
            if tp.tensor_type.HasField("shape"):
                dims = [d.dim_value if d.HasField("dim_value") else None
                        for d in tp.tensor_type.shape.dim]
                shape = None if None in dims else dims
        templates.append((dtype, shape))
    return templates


def _empty_scan(template: tuple[np.dtype, list[int] | None]) -> np.ndarray:
    dtype, shape = template
    return np.empty([0, *(shape or [])], dtype)


# -- If -------------------------------------------------------------------------------------------


@op("If", 1, 11, 13, 16, *_LATEST)
class If:
    def __init__(self, ctx: KernelContext, *, then_branch, else_branch) -> None:
        self.then_branch = then_branch
        self.else_branch = else_branch

    def __call__(self, cond, *captured):
        branch = self.then_branch if _if_condition(cond) else self.else_branch
        return tuple(branch((), captured))

    def inline_branches(self):
        """The condition and both branches' steps, for the enclosing plan's generated
        function to run in place of this kernel (execute.Branches); None where a branch has
        formal inputs (not an If body)."""
        if self.then_branch.input_names or self.else_branch.input_names:
            return None
        return (_if_condition, self.then_branch.inline_parts(),
                self.else_branch.inline_parts())


def _if_condition(cond: Any) -> bool:
    if cond.__class__ is np.ndarray and cond.size == 1:
        return bool(cond.item())
    return _scalar_bool(cond, "If condition")


# -- Loop -----------------------------------------------------------------------------------------


@op("Loop", 1, 11, 13, 16, *_LATEST)
class Loop:
    def __init__(self, ctx: KernelContext, *, body) -> None:
        self.body = body
        self.n_carried = ctx.num_inputs - 2
        n_body_out = len(body.output_names)
        self.n_scan = n_body_out - 1 - self.n_carried
        if len(body.input_names) != 2 + self.n_carried or self.n_scan < 0:
            raise ValueError(
                f"Loop body has {len(body.input_names)} inputs and {n_body_out} outputs for "
                f"{self.n_carried} loop-carried value(s)"
            )
        self.scan_templates = _output_templates(body)[1 + self.n_carried:]

    def __call__(self, M=None, cond=None, *rest):
        n_carried, body = self.n_carried, self.body
        carried = list(rest[:n_carried])
        captured = rest[n_carried:]
        trips = None if M is None else _scalar_int(M, "Loop trip count M")
        keep_going = True if cond is None else _scalar_bool(cond, "Loop condition")
        scans: list[list[Any]] = [[] for _ in range(self.n_scan)]
        i = 0
        while keep_going and (trips is None or i < trips):
            outs = body([np.array(i, np.int64), np.array(keep_going), *carried], captured)
            # Honoured even without a cond input (the spec's for-loop pseudo-code ignores it,
            # onnxruntime does not).
            keep_going = _scalar_bool(outs[0], "Loop body condition output")
            carried = outs[1:1 + n_carried]
            for acc, v in zip(scans, outs[1 + n_carried:], strict=True):
                acc.append(v)
            i += 1
        stacked = [_stack(acc, 0) if acc else _empty_scan(t)
                   for acc, t in zip(scans, self.scan_templates, strict=True)]
        return (*carried, *stacked)


def _stack(values: list[np.ndarray], axis: int) -> np.ndarray:
    first = values[0]
    for k, v in enumerate(values):
        if v.shape != first.shape:
            raise ValueError(
                f"scan output of iteration {k} has shape {list(v.shape)}, "
                f"iteration 0 had {list(first.shape)}"
            )
    return np.stack(values, axis)


# -- Scan -----------------------------------------------------------------------------------------


def _norm_axis(axis: int, rank: int, what: str) -> int:
    if not -rank <= axis < rank:
        raise ValueError(f"{what} {axis} is out of range for rank {rank}")
    return axis % rank


@op("Scan", 9, 11, 16, *_LATEST)
class Scan:
    def __init__(self, ctx: KernelContext, *, body, num_scan_inputs, scan_input_axes=None,
                 scan_input_directions=None, scan_output_axes=None,
                 scan_output_directions=None) -> None:
        self.body = body
        self.n_own = ctx.num_inputs
        self.n_scan_in = int(num_scan_inputs)
        self.n_state = self.n_own - self.n_scan_in
        self.n_scan_out = len(body.output_names) - self.n_state
        if self.n_state < 0 or self.n_scan_out < 0:
            raise ValueError("Scan: num_scan_inputs does not match the node and its body")
        self.in_axes = list(scan_input_axes or [0] * self.n_scan_in)
        self.in_rev = [bool(d) for d in (scan_input_directions or [0] * self.n_scan_in)]
        self.out_axes = list(scan_output_axes or [0] * self.n_scan_out)
        self.out_rev = [bool(d) for d in (scan_output_directions or [0] * self.n_scan_out)]
        for name, lst, n in (("scan_input_axes", self.in_axes, self.n_scan_in),
                             ("scan_input_directions", self.in_rev, self.n_scan_in),
                             ("scan_output_axes", self.out_axes, self.n_scan_out),
                             ("scan_output_directions", self.out_rev, self.n_scan_out)):
            if len(lst) != n:
                raise ValueError(f"Scan: {name} has {len(lst)} entries, expected {n}")
        self.scan_templates = _output_templates(body)[self.n_state:]

    def __call__(self, *args):
        own, captured = args[:self.n_own], args[self.n_own:]
        states = list(own[:self.n_state])
        xs = own[self.n_state:]
        axes = [_norm_axis(a, x.ndim, "scan_input_axes entry")
                for a, x in zip(self.in_axes, xs, strict=True)]
        lengths = {x.shape[a] for a, x in zip(axes, xs, strict=True)}
        if len(lengths) > 1:
            raise ValueError(f"Scan inputs have different sequence lengths {sorted(lengths)}")
        T = lengths.pop() if lengths else 0
        index = [(slice(None),) * a for a in axes]
        scans: list[list[Any]] = [[] for _ in range(self.n_scan_out)]
        for t in range(T):
            slices = [x[ix + (T - 1 - t if rev else t,)]
                      for x, ix, rev in zip(xs, index, self.in_rev, strict=True)]
            outs = self.body([*states, *slices], captured)
            states = outs[:self.n_state]
            for acc, v in zip(scans, outs[self.n_state:], strict=True):
                acc.append(v)
        results = []
        for acc, axis, rev, tmpl in zip(scans, self.out_axes, self.out_rev, self.scan_templates,
                                        strict=True):
            if not acc:
                results.append(_empty_scan(tmpl))
                continue
            if rev:
                acc = acc[::-1]
            axis = _norm_axis(axis, acc[0].ndim + 1, "scan_output_axes entry")
            results.append(_stack(acc, axis))
        return (*states, *results)


@op("Scan", 8)
class Scan8:
    """Scan-8: a leading batch axis on every state and scan input, and optional sequence_lens."""

    def __init__(self, ctx: KernelContext, *, body, num_scan_inputs, directions=None) -> None:
        self.body = body
        self.n_own = ctx.num_inputs
        self.n_scan_in = int(num_scan_inputs)
        self.n_state = self.n_own - 1 - self.n_scan_in
        self.n_scan_out = len(body.output_names) - self.n_state
        if self.n_state < 0 or self.n_scan_out < 0:
            raise ValueError("Scan: num_scan_inputs does not match the node and its body")
        self.rev = [bool(d) for d in (directions or [0] * self.n_scan_in)]
        self.scan_templates = _output_templates(body)[self.n_state:]

    def __call__(self, sequence_lens=None, *args):
        own, captured = args[:self.n_own - 1], args[self.n_own - 1:]
        states, xs = own[:self.n_state], own[self.n_state:]
        batch = (states or xs)[0].shape[0]
        max_len = xs[0].shape[1] if xs else 0
        lens = ([max_len] * batch if sequence_lens is None
                else [int(v) for v in np.asarray(sequence_lens).reshape(-1)])
        if len(lens) != batch or any(not 0 <= n <= max_len for n in lens):
            raise ValueError(f"invalid sequence_lens {lens} for batch {batch}, length {max_len}")
        final_states: list[list[Any]] = [[] for _ in range(self.n_state)]
        per_batch: list[list[np.ndarray]] = [[] for _ in range(self.n_scan_out)]
        for b in range(batch):
            st = [s[b] for s in states]
            L = lens[b]
            scans: list[list[Any]] = [[] for _ in range(self.n_scan_out)]
            for t in range(L):
                slices = [x[b, L - 1 - t if rev else t]
                          for x, rev in zip(xs, self.rev, strict=True)]
                outs = self.body([*st, *slices], captured)
                st = outs[:self.n_state]
                for acc, v in zip(scans, outs[self.n_state:], strict=True):
                    acc.append(v)
            for k, v in enumerate(st):
                final_states[k].append(v)
            for k, acc in enumerate(scans):
                if acc:
                    y = _stack(acc, 0)
                    if L < max_len:  # shorter sequences are padded with zeros
                        y = np.concatenate([y, np.zeros((max_len - L, *y.shape[1:]), y.dtype)])
                else:
                    dtype, shape = self.scan_templates[k]
                    y = np.zeros([max_len, *(shape or [])], dtype)
                per_batch[k].append(y)
        return (*[_stack(v, 0) for v in final_states], *[_stack(v, 0) for v in per_batch])


# -- SequenceMap ----------------------------------------------------------------------------------


@op("SequenceMap", 17)
class SequenceMap:
    def __init__(self, ctx: KernelContext, *, body) -> None:
        self.body = body
        self.n_own = ctx.num_inputs
        self.n_out = len(body.output_names)

    def __call__(self, input_sequence, *args):
        extra, captured = args[:self.n_own - 1], args[self.n_own - 1:]
        n = len(input_sequence)
        for a in extra:
            if isinstance(a, list) and len(a) != n:
                raise ValueError(f"SequenceMap: sequences have lengths {n} and {len(a)}")
        results: list[list[Any]] = [[] for _ in range(self.n_out)]
        for i in range(n):
            ins = [input_sequence[i], *(a[i] if isinstance(a, list) else a for a in extra)]
            for acc, v in zip(results, self.body(ins, captured), strict=True):
                acc.append(v)
        return tuple(results)


# -- sequences ------------------------------------------------------------------------------------


def _position(position: Any, n: int, upper: int, what: str) -> int:
    """Normalize a possibly negative position into [0, upper]; the valid range is [-n, upper]."""
    p = _scalar_int(position, f"{what} position")
    if not -n <= p <= upper:
        raise ValueError(f"{what}: position {p} is out of range for a sequence of length {n}")
    return p + n if p < 0 else p


@op("SequenceEmpty", 11)
def SequenceEmpty(*, dtype=None):
    return []


@op("SequenceConstruct", 11)
def SequenceConstruct(*inputs):
    if inputs and any(x.dtype != inputs[0].dtype for x in inputs):
        raise ValueError("SequenceConstruct: all tensors must have the same element type")
    return list(inputs)


@op("SequenceAt", 11)
def SequenceAt(input_sequence, position):
    n = len(input_sequence)
    return input_sequence[_position(position, n, n - 1, "SequenceAt")]


@op("SequenceInsert", 11)
def SequenceInsert(input_sequence, tensor, position=None):
    n = len(input_sequence)
    if input_sequence and tensor.dtype != input_sequence[0].dtype:
        raise ValueError(
            f"SequenceInsert: tensor type {tensor.dtype} differs from the sequence's "
            f"{input_sequence[0].dtype}"
        )
    p = n if position is None else _position(position, n, n, "SequenceInsert")
    out = list(input_sequence)
    out.insert(p, tensor)
    return out


@op("SequenceErase", 11)
def SequenceErase(input_sequence, position=None):
    n = len(input_sequence)
    if n == 0:
        raise ValueError("SequenceErase: the sequence is empty")
    p = n - 1 if position is None else _position(position, n, n - 1, "SequenceErase")
    out = list(input_sequence)
    del out[p]
    return out


@op("SequenceLength", 11)
def SequenceLength(input_sequence):
    return np.array(len(input_sequence), np.int64)


@op("SplitToSequence", 11, 24)
def SplitToSequence(input, split=None, *, axis=0, keepdims=1):  # noqa: A002 - schema name
    axis = _norm_axis(axis, input.ndim, "SplitToSequence axis")
    n = input.shape[axis]
    if split is None:
        parts = np.split(input, n, axis=axis) if n else []
        return [np.squeeze(p, axis) for p in parts] if not keepdims else parts
    split = np.asarray(split)
    if split.ndim == 0:
        k = int(split)
        if k <= 0:
            raise ValueError(f"SplitToSequence: split must be positive, got {k}")
        bounds = list(range(k, n, k))
    else:
        sizes = [int(s) for s in split.reshape(-1)]
        if any(s < 0 for s in sizes) or sum(sizes) != n:
            raise ValueError(f"SplitToSequence: split {sizes} does not sum to dimension {n}")
        bounds = list(np.cumsum(sizes)[:-1])
    return np.split(input, bounds, axis=axis)


@op("ConcatFromSequence", 11)
def ConcatFromSequence(input_sequence, *, axis, new_axis=0):
    if not input_sequence:
        raise ValueError("ConcatFromSequence: the sequence is empty")
    rank = input_sequence[0].ndim + (1 if new_axis else 0)
    axis = _norm_axis(axis, rank, "ConcatFromSequence axis")
    if new_axis:
        return np.stack(input_sequence, axis)
    return np.concatenate(input_sequence, axis)


# -- optionals ------------------------------------------------------------------------------------


@op("Optional", 15, 28)
def Optional(input=None, *, type=None):  # noqa: A002 - schema names
    return input


@op("OptionalHasElement", 15, 18, 28)
def OptionalHasElement(input=None):  # noqa: A002 - schema name
    return np.array(input is not None)


@op("OptionalGetElement", 15, 18, 28)
def OptionalGetElement(input):  # noqa: A002 - schema name
    if input is None:
        raise ValueError("OptionalGetElement: the optional is empty")
    return input
