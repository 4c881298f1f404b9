"""The attention-mask arithmetic in front of GroupQueryAttention, computed by the engine.

The model builder derives GroupQueryAttention's ``seqlens_k`` and ``total_sequence_length``
from the attention mask in a small subgraph (``Cast(ReduceSum(mask, [1]) - 1)`` and
``Cast(Gather(Shape(mask), 1))``): six tiny kernels a decode step, each costing a kernel call's
Python in the run (~25-40 us of a small model's ~700 us step). Where those values are made
from the mask by such operators alone (integer arithmetic, read off the decoder's own plan),
the engine computes them with the same numpy operations and feeds them to the plan, whose
steps that make them are then left out (``InferenceSession._runner``'s ``computed``). Any
other operator, dtype or attribute in the way: None, and the model's own steps run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..dtypes import np_dtype
from ..plan import NONE_SLOT, Program

Fn = Callable[[np.ndarray], np.ndarray]
_INTS = (np.dtype(np.int32), np.dtype(np.int64))


def mask_values(program: Program, mask: str, dtype: np.dtype) -> list[tuple[int, Fn]] | None:
    """(slot, function of the mask) for every GroupQueryAttention's seqlens_k and
    total_sequence_length, where the plan makes each from the graph input ``mask`` (of
    ``dtype``, fed as (rows, length)) by the operators below; None where it does not (or the
    model has no GroupQueryAttention)."""
    inputs = {v.name: s for v, s in zip(program.graph.inputs, program.input_slots, strict=True)}
    mask_slot = inputs.get(mask)
    if mask_slot is None:
        return None
    dtype = np.dtype(dtype)
    if dtype not in _INTS:
        return None
    producer = {s: step for step in program.steps for s in step.outputs}
    targets: list[int] = []
    for step in program.steps:
        if step.node.op_type == "GroupQueryAttention" and step.node.domain == "com.microsoft":
            for s in step.inputs[5:7]:
                if s != NONE_SLOT and s not in targets:
                    targets.append(s)
    if not targets:
        return None
    made: dict[int, tuple[Fn, np.dtype] | None] = {mask_slot: (_identity, dtype)}

    def build(slot: int) -> tuple[Fn, np.dtype] | None:
        if slot not in made:
            step = producer.get(slot)
            made[slot] = None if step is None or len(step.outputs) != 1 else \
                _node(program, step, build, producer)
        return made[slot]

    out = []
    for s in targets:
        got = build(s)
        if got is None or s in inputs.values():
            return None
        out.append((s, _array(got[0])))
    return out


def _identity(m: np.ndarray) -> np.ndarray:
    return m


def _array(f: Fn) -> Fn:
    """``f`` whose value is an array (a reduction to a number gives a numpy scalar)."""
    return lambda m: np.asarray(f(m))


def _constant(program: Program, step: Any, i: int) -> np.ndarray | None:
    """Input i of ``step`` where it is a constant of the plan (an initializer), else None."""
    v = step.node.inputs[i] if i < len(step.node.inputs) else None
    if v is None or id(v) not in program.constant_ids:
        return None
    value = program.template[step.inputs[i]]
    return value if isinstance(value, np.ndarray) else None


def _attr(step: Any, name: str, default: Any) -> Any:
    a = step.node.attributes.get(name)
    return default if a is None else a.value


def _node(program: Program, step: Any, build: Callable[[int], tuple[Fn, np.dtype] | None],
          producer: dict[int, Any]) -> tuple[Fn, np.dtype] | None:
    """One operator of the chain as a function of the mask, with its output dtype, computed
    as onnxrun's kernel computes it for these integer operands; None for anything else."""
    node = step.node
    if node.domain not in ("", "ai.onnx") or not step.inputs:
        return None
    op = node.op_type
    src = build(step.inputs[0])
    if src is None:
        return None
    f, dt = src
    if op == "ReduceSum":
        axes = _constant(program, step, 1) if len(step.inputs) > 1 and \
            step.inputs[1] != NONE_SLOT else None
        axes = axes if axes is not None else np.asarray(_attr(step, "axes", []), np.int64)
        keep = bool(_attr(step, "keepdims", 1))
        if axes.dtype.kind != "i" or axes.ndim > 1 or not axes.size or \
                len(step.inputs) > 2 or dt not in _INTS or \
                not all(-2 <= a < 2 for a in axes.reshape(-1).tolist()):
            return None
        ax = tuple(int(a) for a in axes.reshape(-1))
        return (lambda m: np.add.reduce(f(m), axis=ax, dtype=dt, keepdims=keep)), dt
    if op in ("Sub", "Add"):
        c = _constant(program, step, 1) if len(step.inputs) == 2 else None
        if c is None or c.dtype != dt or c.size != 1 or c.ndim > 1:
            return None
        ufunc = np.subtract if op == "Sub" else np.add
        return (lambda m: ufunc(f(m), c)), dt
    if op == "Cast":
        try:
            to = np.dtype(np_dtype(int(_attr(step, "to", 0))))
        except Exception:  # noqa: BLE001 - a type this module does not handle
            return None
        if to not in _INTS or len(step.inputs) != 1:
            return None
        return (lambda m: f(m).astype(to)), to
    if op == "Shape":
        if len(step.inputs) != 1 or "start" in node.attributes or "end" in node.attributes:
            return None
        return (lambda m: np.array(f(m).shape, np.int64)), np.dtype(np.int64)
    if op == "Gather":
        idx = _constant(program, step, 1) if len(step.inputs) == 2 else None
        data = producer.get(step.inputs[0])
        # an element of the mask's shape (rows, length)
        if idx is None or idx.dtype not in _INTS or int(_attr(step, "axis", 0)) != 0 or \
                idx.ndim != 0 or not -2 <= int(idx) < 2 or data is None or \
                data.node.op_type != "Shape" or \
                (build(data.inputs[0]) or (None,))[0] is not _identity:
            return None
        k = int(idx)
        return (lambda m: np.asarray(f(m)[k])), dt
    return None
