"""Symbolic shape inference: onnxruntime's ``onnxruntime.tools.symbolic_shape_infer`` API.

``SymbolicShapeInference.infer_shapes(model)`` returns a copy of the model whose ``value_info``
(and graph outputs) carry every node output's type and shape, where a dimension that is not a
number is a sympy expression of the input dimensions written as onnxruntime writes it
(``batch``, ``seq + 1``, ``2*seq``, ``floor(-1/N) + 3``)::

    python -m onnxrun.tools.symbolic_shape_infer --input m.onnx --output m.shaped.onnx --auto_merge

How: nodes are visited in graph order. Shape arithmetic (Shape, Gather, Slice, Concat,
Unsqueeze, Squeeze, Reshape, ConstantOfShape, Expand, Resize, Einsum, elementwise broadcast)
is done here on sympy expressions, and small integer tensors (shape vectors) are carried as
values so that a shape computed in the graph becomes a symbolic shape. A few com.microsoft
operators onnx does not know are handled here too; every other node goes through onnx's own
shape inference on a one-node model, and a dimension it cannot name gets a fresh symbol
``unk__N``. Needs sympy (``pip install sympy``).
"""

from __future__ import annotations

import argparse
import heapq
import logging
import math
import sys
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["SymbolicShapeInference", "main"]

_log = logging.getLogger(__name__)

# Constant tensors up to this many elements are carried as values (shape vectors, scalars).
_MAX_VALUE_SIZE = 64
_CMP = {"Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "And", "Or", "Xor", "Not"}
_NUMERIC = {TensorProto.INT64, TensorProto.INT32, TensorProto.INT16, TensorProto.INT8,
            TensorProto.UINT64, TensorProto.UINT32, TensorProto.UINT16, TensorProto.UINT8,
            TensorProto.BOOL, TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16}


def _sympy() -> Any:
    try:
        import sympy
    except ImportError as e:  # an optional dependency: only this tool needs it
        raise ImportError("onnxrun.tools.symbolic_shape_infer needs sympy: pip install sympy "
                          "(or pip install onnxrun[tools])") from e
    return sympy


def _type_name(t: int) -> str:
    return TensorProto.DataType.Name(t)


def _used(node: onnx.NodeProto) -> set[str]:
    """The names a node reads, its subgraphs' references to the outer scope included."""
    names = {n for n in node.input if n}
    for a in node.attribute:
        for g in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
            inner = {i.name for i in g.input} | {i.name for i in g.initializer}
            for n in g.node:
                inner.update(n.output)
            for n in g.node:
                names.update(x for x in _used(n) if x not in inner)
    return names


def _topological(nodes: Any) -> list[onnx.NodeProto]:
    """The nodes in an order where each comes after its producers (onnxruntime accepts graphs
    whose node list is not sorted); nodes in a cycle keep their place at the end."""
    nodes = list(nodes)
    producer = {o: i for i, n in enumerate(nodes) for o in n.output if o}
    deps = [{producer[x] for x in _used(n) if x in producer} - {i} for i, n in enumerate(nodes)]
    users: dict[int, list[int]] = {}
    for i, d in enumerate(deps):
        for j in d:
            users.setdefault(j, []).append(i)
    waiting = [len(d) for d in deps]
    ready = [i for i, w in enumerate(waiting) if w == 0]  # a heap: the earliest node first
    order: list[int] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for u in users.get(i, ()):
            waiting[u] -= 1
            if waiting[u] == 0:
                heapq.heappush(ready, u)
    done = set(order)
    return [nodes[i] for i in order] + [n for i, n in enumerate(nodes) if i not in done]


class _Graph:
    """Infers one graph (the main graph or a subgraph that sees its outer scope's names)."""

    def __init__(self, owner: SymbolicShapeInference, graph: onnx.GraphProto,
                 outer: _Graph | None = None) -> None:
        self.o = owner
        self.sp = owner.sp
        self.graph = graph
        # name -> (elem_type, dims or None); dims are sympy expressions
        self.types: dict[str, tuple[int, list | None]] = dict(outer.types) if outer else {}
        self.values: dict[str, np.ndarray] = dict(outer.values) if outer else {}
        # values that are not tensors (sequences, optionals, maps): their type as onnx gave it
        self.other: dict[str, onnx.TypeProto] = dict(outer.other) if outer else {}
        self.inferred: list[str] = []
        self.position: dict[int, int] = {}
        self.other_inferred: list[str] = []

    # ---- dimensions and values -----------------------------------------------------------------
    def dim(self, d: onnx.TensorShapeProto.Dimension, hint: str | None = None) -> Any:
        if d.HasField("dim_value") and d.dim_value >= 0:  # some exporters write -1: unknown
            return self.sp.Integer(d.dim_value)
        if d.dim_param:
            return self.o.symbol(d.dim_param)
        return self.o.fresh(hint)

    def dims_of(self, tp: onnx.TypeProto, hint: str | None = None) -> list | None:
        """The dims of a tensor type; an unnamed one is called ``{hint}{i}`` when a hint is
        given (``X_d0`` for input X, ``node_o0__d1`` for an operator's output, as onnxruntime
        names them), else ``unk__N``."""
        tt = tp.tensor_type
        if not tt.HasField("shape"):
            return None
        return [self.dim(d, f"{hint}{i}" if hint else None) for i, d in enumerate(tt.shape.dim)]

    def shape(self, name: str) -> list | None:
        t = self.types.get(name)
        return None if t is None or t[1] is None else list(t[1])

    def etype(self, name: str) -> int:
        t = self.types.get(name)
        return t[0] if t else TensorProto.UNDEFINED

    def value(self, name: str) -> np.ndarray | None:
        return self.values.get(name) if name else None

    def set(self, name: str, etype: int, dims: list | None, value: np.ndarray | None = None
            ) -> None:
        if not name:
            return
        if dims is not None:
            dims = [self.sp.sympify(d) for d in dims]
        self.types[name] = (etype, dims)
        if value is not None:
            value = np.asarray(value, dtype=object)  # np.take of a scalar index gives a scalar
            if value.size <= _MAX_VALUE_SIZE:
                self.values[name] = value
        self.inferred.append(name)

    def unnamed(self, node: onnx.NodeProto, k: int) -> str:
        """The prefix of a name for output k's dims no rule gives: ``Loop_3_o0__d`` (operator,
        its place in the graph, output), onnxruntime's names."""
        return f"{node.op_type}_{self.position.get(id(node), 0)}_o{k}__d"

    def as_value(self, arr: np.ndarray) -> np.ndarray | None:
        if arr.size > _MAX_VALUE_SIZE or arr.dtype.kind not in "iubf":
            return None
        conv = self.sp.Integer if arr.dtype.kind in "iub" else self.sp.Rational
        out = np.empty(arr.shape, dtype=object)
        for i, v in np.ndenumerate(arr):
            out[i] = conv(int(v) if arr.dtype.kind in "iub" else float(v)) \
                if arr.dtype.kind != "f" or math.isfinite(float(v)) else self.sp.nan
        return out

    def known(self, rel: Any) -> bool | None:
        """True / False when sympy decides the relation for positive integer symbols."""
        r = self.sp.sympify(rel)
        if r == self.sp.true:
            return True
        if r == self.sp.false:
            return False
        return None

    def pick(self, expr: Any, fallback: Any) -> Any:
        # Min/Max that sympy cannot decide: assume the index is in range, as onnxruntime does.
        return fallback if expr.has(self.sp.Min, self.sp.Max) else expr

    def merge(self, a: Any, b: Any) -> Any:
        if a == b or b == 1:
            return a
        if a == 1:
            return b
        if self.sp.simplify(a - b) == 0:
            return a
        # broadcasting makes the two equal (neither is 1): keep the number, else the plain
        # symbol. With auto_merge, of two symbols one replaces the other everywhere in the
        # output (not a symbol met by a number: the symbol may still be 1 elsewhere).
        keep, drop = (a, b) if a.is_Integer or (a.is_Symbol and not b.is_Integer) else (b, a)
        if keep.is_Symbol and drop.is_Symbol and str(drop) < str(keep):
            keep, drop = drop, keep  # of two names, the first in sort order: deterministic
        if self.o.auto_merge and drop.is_Symbol and not keep.is_Integer:
            self.o.merged[drop] = keep
        return keep

    def broadcast(self, shapes: list[list | None]) -> list | None:
        if any(s is None for s in shapes):
            return None
        rank = max((len(s) for s in shapes), default=0)
        out: list = []
        for i in range(rank):
            d = None
            for s in shapes:
                k = i - (rank - len(s))
                if k >= 0:
                    d = s[k] if d is None else self.merge(d, s[k])
            out.append(d)
        return out

    # ---- the walk ------------------------------------------------------------------------------
    def run(self, given: dict[str, tuple[int, list | None]] | None = None) -> None:
        """``given``: what the caller knows of inputs the graph leaves untyped or unshaped
        (a Loop body's loop-carried values)."""
        g = self.graph
        for vi in g.input:
            known = (given or {}).get(vi.name)
            if known is not None and not (vi.type.HasField("tensor_type") and
                                          vi.type.tensor_type.HasField("shape")):
                etype = vi.type.tensor_type.elem_type if vi.type.HasField("tensor_type") else 0
                self.types[vi.name] = (etype or known[0], known[1])
            elif vi.type.HasField("tensor_type"):
                self.types[vi.name] = (vi.type.tensor_type.elem_type,
                                       self.dims_of(vi.type, f"{vi.name}_d"))
            elif vi.type.WhichOneof("value") is not None:
                self.other[vi.name] = vi.type
        for init in g.initializer:
            value = None
            # an initializer is taken as the constant it holds even when it is also an input
            # (as onnxruntime's tool does; before IR 4 every initializer had to be one)
            if math.prod(init.dims) <= _MAX_VALUE_SIZE and init.data_type in _NUMERIC:
                value = self.as_value(numpy_helper.to_array(init))
            self.types[init.name] = (init.data_type, [self.sp.Integer(d) for d in init.dims])
            if value is not None:
                self.values[init.name] = value
        self.position = {id(n): i for i, n in enumerate(g.node)}
        for node in _topological(g.node):
            self.node(node)
        self.write()

    def node(self, node: onnx.NodeProto) -> None:
        domain = node.domain if node.domain not in ("ai.onnx",) else ""
        handler = getattr(self, f"op_{node.op_type}", None)
        # onnxruntime's contrib operators are also found when a model leaves the domain out
        if domain == "com.microsoft" or (domain == "" and not onnx.defs.has(node.op_type)):
            handler = getattr(self, f"ms_{node.op_type}", None)
        elif domain != "":
            handler = None
        try:
            if handler is None or handler(node) is NotImplemented:
                self.fallback(node)
        except (ValueError, TypeError, IndexError) as e:
            if node.op_type == "If":
                raise
            raise ValueError(f"symbolic shape inference failed on node {node.name!r} "
                             f"({node.op_type}): {e}") from e
        if self.o.verbose >= 2:
            for out in node.output:
                _log.info("%s %s: %s", node.op_type, out, self.types.get(out))

    def write(self) -> None:
        g = self.graph
        made = {}
        for name in dict.fromkeys(self.inferred):
            etype, dims = self.types[name]
            made[name] = helper.make_tensor_value_info(
                name, etype, None if dims is None else [self.o.render(d) for d in dims])
        for name in dict.fromkeys(self.other_inferred):
            if name not in made:
                made[name] = helper.make_value_info(name, self.other[name])
        keep = [vi for vi in g.value_info if vi.name not in made]
        inits = {i.name for i in g.initializer}
        del g.value_info[:]
        g.value_info.extend(keep + [vi for n, vi in made.items() if n not in inits])
        for out in g.output:
            if out.name in made:
                doc = out.doc_string
                out.type.CopyFrom(made[out.name].type)
                out.doc_string = doc

    def fallback(self, node: onnx.NodeProto) -> None:
        """onnx's shape inference on a model holding this one node."""
        vis, inits = [], []
        for name in dict.fromkeys(n for n in node.input if n):
            if name in self.other:
                vis.append(helper.make_value_info(name, self.other[name]))
            if name not in self.types:
                continue
            etype, dims = self.types[name]
            val = self.values.get(name)
            if val is not None and etype in (TensorProto.INT64, TensorProto.INT32) and all(
                    v.is_Integer for v in val.flat):
                arr = np.array([int(v) for v in val.flat], dtype=np.int64).reshape(val.shape)
                inits.append(numpy_helper.from_array(
                    arr.astype(np.int32 if etype == TensorProto.INT32 else np.int64), name))
            vis.append(helper.make_tensor_value_info(
                name, etype, None if dims is None else [self.o.render(d) for d in dims]))
        graph = helper.make_graph([node], "node", vis, [], inits)
        model = helper.make_model(graph, opset_imports=list(self.o.opsets),
                                  ir_version=self.o.ir_version)
        try:
            result = onnx.shape_inference.infer_shapes(model, strict_mode=True)
        except Exception as e:  # onnx's InferenceError / ValidationError: leave outputs unknown
            why = str(e).strip().splitlines()[-1] if str(e).strip() else repr(e)
            _log.log(logging.WARNING if self.o.verbose else logging.DEBUG,
                     "node %r (%s): onnx's shape inference failed: %s", node.name,
                     node.op_type, why)
            result = model
        found = {vi.name: vi for vi in result.graph.value_info}
        first = self.shape(node.input[0]) if node.input and node.input[0] else None
        for k, name in enumerate(node.output):
            vi = found.get(name)
            if vi is not None and vi.type.HasField("tensor_type"):
                self.set(name, vi.type.tensor_type.elem_type,
                         self.dims_of(vi.type, self.unnamed(node, k)))
            elif vi is not None and vi.type.WhichOneof("value") is not None:
                self.other[name] = vi.type
                self.other_inferred.append(name)
            elif name and self.o.guess_output_rank and node.input:
                self.set(name, self.etype(node.input[0]),
                         None if first is None else [self.o.fresh() for _ in first])

    # ---- value-carrying and shape operators ----------------------------------------------------
    def attr(self, node: onnx.NodeProto, name: str, default: Any = None) -> Any:
        for a in node.attribute:
            if a.name == name:
                return helper.get_attribute_value(a)
        return default

    def ints_input(self, node: onnx.NodeProto, i: int) -> list | None:
        if len(node.input) <= i or not node.input[i]:
            return None
        v = self.value(node.input[i])
        return None if v is None else list(v.flat)

    def op_Constant(self, node: onnx.NodeProto) -> Any:
        for a in node.attribute:
            if a.name == "value" and a.type == onnx.AttributeProto.TENSOR:
                arr = numpy_helper.to_array(a.t)
                etype = a.t.data_type
            elif a.name in ("value_int", "value_ints"):
                arr, etype = np.array(helper.get_attribute_value(a), np.int64), TensorProto.INT64
            elif a.name in ("value_float", "value_floats"):
                arr, etype = np.array(helper.get_attribute_value(a), np.float32), \
                    TensorProto.FLOAT
            else:
                return NotImplemented
            self.set(node.output[0], etype, list(arr.shape), self.as_value(arr))
            return None
        return NotImplemented

    def op_Shape(self, node: onnx.NodeProto) -> Any:
        s = self.shape(node.input[0])
        if s is None:
            return NotImplemented
        r = len(s)
        start, end = self.attr(node, "start", 0), self.attr(node, "end", r)
        start, end = (max(0, min(r, x + r if x < 0 else x)) for x in (start, end))
        val = np.array(s[start:end] if end > start else [], dtype=object)
        self.set(node.output[0], TensorProto.INT64, [len(val)], val)
        return None

    def op_Size(self, node: onnx.NodeProto) -> Any:
        s = self.shape(node.input[0])
        if s is None:
            return NotImplemented
        self.set(node.output[0], TensorProto.INT64, [],
                 np.array(self.sp.Mul(*s) if s else self.sp.Integer(1), dtype=object))
        return None

    def _same(self, node: onnx.NodeProto, fn: Any = None, etype: int | None = None) -> Any:
        src = node.input[0]
        if src not in self.types:
            return NotImplemented
        v = self.value(src)
        if v is not None and fn is not None:
            v = np.frompyfunc(fn, 1, 1)(v) if v.size else v
            v = np.asarray(v, dtype=object).reshape(self.values[src].shape)
        self.set(node.output[0], self.etype(src) if etype is None else etype, self.shape(src),
                 v if fn is not None else None)
        return None

    def op_Identity(self, node: onnx.NodeProto) -> Any:
        return self._same(node, lambda x: x)

    def op_Neg(self, node: onnx.NodeProto) -> Any:
        return self._same(node, lambda x: -x)

    def op_Floor(self, node: onnx.NodeProto) -> Any:
        return self._same(node, self.sp.floor)

    def op_Ceil(self, node: onnx.NodeProto) -> Any:
        return self._same(node, self.sp.ceiling)

    def op_Cast(self, node: onnx.NodeProto) -> Any:
        to = self.attr(node, "to")
        integral = to in (TensorProto.INT64, TensorProto.INT32, TensorProto.INT16,
                          TensorProto.INT8, TensorProto.UINT8, TensorProto.UINT16,
                          TensorProto.UINT32, TensorProto.UINT64)
        # casting to an integer truncates toward zero
        return self._same(node, (lambda x: self.sp.Integer(int(x)) if x.is_Number else x)
                          if integral else (lambda x: x), etype=to)

    def _binary_fn(self, op: str, integral: bool) -> Any:
        sp = self.sp
        return {
            "Add": lambda a, b: a + b,
            "Sub": lambda a, b: a - b,
            "Mul": lambda a, b: a * b,
            "Div": (lambda a, b: sp.floor(a / b) if (a / b).is_Number or
                    (a / b).is_integer is not True else a / b) if integral
            else (lambda a, b: a / b),
            "Max": lambda a, b: self.pick(sp.Max(a, b), a if b.is_Number else b),
            "Min": lambda a, b: self.pick(sp.Min(a, b), a if b.is_Number else b),
        }.get(op)

    def _binary(self, node: onnx.NodeProto, a: str, b: str, etype: int) -> Any:
        shapes = [self.shape(n) for n in node.input if n]
        if node.op_type in ("Sum", "Mean", "Max", "Min"):
            ins = [n for n in node.input if n]
        else:
            ins = [a, b]
        if any(n not in self.types for n in ins):
            return NotImplemented
        out = self.broadcast(shapes)
        val = None
        fn = self._binary_fn(node.op_type, etype not in (
            TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.BFLOAT16))
        va, vb = self.value(a), self.value(b)
        if fn is not None and len(ins) == 2 and va is not None and vb is not None:
            val = np.frompyfunc(fn, 2, 1)(va, vb)
            val = np.asarray(val, dtype=object).reshape(np.broadcast_shapes(va.shape, vb.shape))
            val = np.frompyfunc(lambda x: self.sp.Integer(x) if x.is_Number and
                                x == int(x) else x, 1, 1)(val) if val.size else val
            val = np.asarray(val, dtype=object)
        self.set(node.output[0], etype, out, val)
        return None

    def _elementwise(self, node: onnx.NodeProto) -> Any:
        """Broadcasting operators; arithmetic on shape values is carried out symbolically."""
        op = node.op_type
        if op == "Where":
            if any(n not in self.types for n in node.input):
                return NotImplemented
            self.set(node.output[0], self.etype(node.input[1]),
                     self.broadcast([self.shape(n) for n in node.input]))
            return None
        etype = TensorProto.BOOL if op in _CMP else self.etype(node.input[0])
        b = node.input[1] if len(node.input) > 1 else node.input[0]
        return self._binary(node, node.input[0], b, etype)

    op_Add = op_Sub = op_Mul = op_Div = op_Max = op_Min = op_Mod = op_Pow = _elementwise
    op_Where = op_BitShift = op_PRelu = op_Sum = op_Mean = _elementwise
    op_Equal = op_Less = op_Greater = op_LessOrEqual = op_GreaterOrEqual = _elementwise
    op_And = op_Or = op_Xor = _elementwise

    def op_Gather(self, node: onnx.NodeProto) -> Any:
        data, idx = self.shape(node.input[0]), self.shape(node.input[1])
        if data is None or idx is None:
            return NotImplemented
        axis = self.attr(node, "axis", 0)
        axis = axis + len(data) if axis < 0 else axis
        val = None
        vd, vi = self.value(node.input[0]), self.value(node.input[1])
        if vd is not None and vi is not None and all(v.is_Integer for v in vi.flat):
            n = vd.shape[axis]
            ii = np.array([int(v) + n if int(v) < 0 else int(v) for v in vi.flat],
                          dtype=np.int64).reshape(vi.shape)
            # an index out of range is the runtime's error to raise, not a shape's
            val = np.take(vd, ii, axis=axis) if ((ii >= 0) & (ii < n)).all() else None
        self.set(node.output[0], self.etype(node.input[0]),
                 data[:axis] + idx + data[axis + 1:], val)
        return None

    def op_Concat(self, node: onnx.NodeProto) -> Any:
        ins = [n for n in node.input if n]
        shapes = [self.shape(n) for n in ins]
        if any(s is None for s in shapes) or not shapes:
            return NotImplemented
        axis = self.attr(node, "axis")
        r = len(shapes[0])
        if any(len(s) != r for s in shapes):
            raise ValueError(f"Concat inputs have different ranks: {shapes}")
        axis = axis + r if axis < 0 else axis
        out = list(shapes[0])
        out[axis] = self.sp.Add(*[s[axis] for s in shapes])
        for s in shapes[1:]:
            for i in range(r):
                if i != axis:
                    out[i] = self.merge(out[i], s[i])
        vals = [self.value(n) for n in ins]
        val = np.concatenate(vals, axis=axis) if all(v is not None for v in vals) else None
        self.set(node.output[0], self.etype(ins[0]), out, val)
        return None

    def _axes(self, node: onnx.NodeProto) -> list | None:
        if self.o.opset < 13:
            return self.attr(node, "axes")
        got = self.ints_input(node, 1)
        return None if got is None else [int(a) for a in got]

    def op_Unsqueeze(self, node: onnx.NodeProto) -> Any:
        s, axes = self.shape(node.input[0]), self._axes(node)
        if s is None or axes is None:
            return NotImplemented
        r = len(s) + len(axes)
        axes = sorted(a + r if a < 0 else a for a in axes)
        out = list(s)
        for a in axes:
            out.insert(a, self.sp.Integer(1))
        v = self.value(node.input[0])
        self.set(node.output[0], self.etype(node.input[0]), out,
                 None if v is None else v.reshape([int(d) for d in out]))
        return None

    def op_Squeeze(self, node: onnx.NodeProto) -> Any:
        s, axes = self.shape(node.input[0]), self._axes(node)
        if s is None:
            return NotImplemented
        if axes is None:
            if len(node.input) > 1 and node.input[1] and self.o.opset >= 13:
                return NotImplemented
            axes = [i for i, d in enumerate(s) if d == 1]
        axes = {a + len(s) if a < 0 else a for a in axes}
        out = [d for i, d in enumerate(s) if i not in axes]
        v = self.value(node.input[0])
        self.set(node.output[0], self.etype(node.input[0]), out,
                 None if v is None else v.reshape([int(d) for d in out]))
        return None

    def op_Reshape(self, node: onnx.NodeProto) -> Any:
        s, target = self.shape(node.input[0]), self.ints_input(node, 1)
        if target is None:
            ts = self.shape(node.input[1])
            if ts is None or not ts[0].is_Integer:
                return NotImplemented
            self.set(node.output[0], self.etype(node.input[0]),
                     [self.o.fresh() for _ in range(int(ts[0]))])
            return None
        allowzero = self.attr(node, "allowzero", 0)
        out: list = []
        hole = None
        for i, t in enumerate(target):
            if t == 0 and not allowzero and s is not None:
                out.append(s[i])
            elif t == -1:
                hole = i
                out.append(None)
            else:
                out.append(t)
        if hole is not None:
            known = self.sp.Mul(*[d for d in out if d is not None])
            out[hole] = self.sp.simplify(self.sp.Mul(*s) / known) if s is not None \
                else self.o.fresh()
        v = self.value(node.input[0])
        val = None
        if v is not None and all(d.is_Integer for d in out):
            val = v.reshape([int(d) for d in out])
        self.set(node.output[0], self.etype(node.input[0]), out, val)
        return None

    def op_ConstantOfShape(self, node: onnx.NodeProto) -> Any:
        target = self.ints_input(node, 0)
        t = self.attr(node, "value")
        etype = t.data_type if t is not None else TensorProto.FLOAT
        if target is None:
            s = self.shape(node.input[0])
            if s is None or not s[0].is_Integer:
                return NotImplemented
            self.set(node.output[0], etype, [self.o.fresh() for _ in range(int(s[0]))])
            return None
        val = None
        if all(d.is_Integer for d in target) and math.prod(int(d) for d in target) \
                <= _MAX_VALUE_SIZE:
            fill = numpy_helper.to_array(t).reshape(-1)[0] if t is not None else np.float32(0)
            val = self.as_value(np.full([int(d) for d in target], fill))
        self.set(node.output[0], etype, target, val)
        return None

    def op_Expand(self, node: onnx.NodeProto) -> Any:
        s, target = self.shape(node.input[0]), self.ints_input(node, 1)
        if s is None or target is None:
            return NotImplemented
        self.set(node.output[0], self.etype(node.input[0]), self.broadcast([s, target]))
        return None

    def op_Range(self, node: onnx.NodeProto) -> Any:
        got = [self.ints_input(node, i) for i in range(3)]
        if any(g is None for g in got):
            return NotImplemented
        start, limit, delta = (g[0] for g in got)
        n = self.sp.Max(self.sp.ceiling((limit - start) / delta), 0)
        n = self.pick(n, self.sp.ceiling((limit - start) / delta))
        val = None
        if n.is_Integer and all(x.is_Number for x in (start, delta)):
            val = np.array([start + i * delta for i in range(int(n))], dtype=object)
        self.set(node.output[0], self.etype(node.input[0]), [n], val)
        return None

    def op_Resize(self, node: onnx.NodeProto) -> Any:
        s = self.shape(node.input[0])
        if s is None:
            return NotImplemented
        scales_at = 1 if self.o.opset < 11 else 2
        sizes = self.ints_input(node, 3)
        scales = self.ints_input(node, scales_at)
        if sizes:
            out = [self.sp.Integer(int(d)) if d.is_Number else d for d in sizes]
        elif scales:
            out = [self.sp.floor(d * sc) for d, sc in zip(s, scales, strict=True)]
        else:
            return NotImplemented
        self.set(node.output[0], self.etype(node.input[0]), out)
        return None

    op_Upsample = op_Resize

    def _slice_len(self, d: Any, start: Any, end: Any, step: Any) -> Any:
        sp, big = self.sp, self.o.int_max
        if all(x.is_Integer for x in (d, start, end, step)):
            return sp.Integer(len(range(int(d))[int(start):int(end):int(step)]))
        forward = self.known(step > 0)
        if forward is None:
            return self.o.fresh()

        def norm(x: Any) -> Any:
            if x.is_Number and x >= big:
                return d if forward else d - 1
            if x.is_Number and x <= -big:
                return sp.Integer(0) if forward else sp.Integer(-1)
            if self.known(x < 0):
                return d + x
            return self.pick(sp.Min(x, d if forward else d - 1), x)

        lo, hi = norm(start), norm(end)
        n = sp.ceiling((hi - lo) / step)
        return self.pick(sp.Max(n, 0), n)

    def op_Slice(self, node: onnx.NodeProto) -> Any:
        s = self.shape(node.input[0])
        if s is None:
            return NotImplemented
        if self.o.opset < 10:
            starts, ends = self.attr(node, "starts"), self.attr(node, "ends")
            axes, steps = self.attr(node, "axes"), None
            starts, ends = [self.sp.Integer(x) for x in starts], [self.sp.Integer(x) for x in ends]
        else:
            starts, ends = self.ints_input(node, 1), self.ints_input(node, 2)
            axes, steps = self.ints_input(node, 3), self.ints_input(node, 4)
            if len(node.input) > 3 and node.input[3] and axes is None:
                return NotImplemented
            if len(node.input) > 4 and node.input[4] and steps is None:
                return NotImplemented
        if starts is None or ends is None:
            # which axes are cut is unknown: keep the rank, fresh symbols where cut
            axes_known = None if axes is None else {int(a) % len(s) for a in axes}
            self.set(node.output[0], self.etype(node.input[0]),
                     [self.o.fresh() if axes_known is None or i in axes_known else d
                      for i, d in enumerate(s)])
            return None
        axes = list(range(len(starts))) if axes is None else [int(a) for a in axes]
        steps = [self.sp.Integer(1)] * len(starts) if steps is None else steps
        out = list(s)
        index: list = [slice(None)] * len(s)
        for a, st, en, sp_ in zip(axes, starts, ends, steps, strict=True):
            a = a + len(s) if a < 0 else a
            out[a] = self._slice_len(s[a], st, en, sp_)
            if all(x.is_Integer for x in (st, en, sp_)):
                index[a] = slice(int(st), int(en), int(sp_))
            else:
                index = None  # type: ignore[assignment]
                break
        v = self.value(node.input[0])
        self.set(node.output[0], self.etype(node.input[0]), out,
                 v[tuple(index)] if v is not None and index is not None else None)
        return None

    def equal(self, a: Any, b: Any) -> None:
        """Two dims an operator needs equal (a MatMul's contracted dims): with auto_merge a
        symbol found equal to a number or another symbol is replaced by it in the output."""
        if self.o.auto_merge and a != b:
            if a.is_Symbol and (b.is_Integer or b.is_Symbol):
                self.o.merged[a] = b
            elif b.is_Symbol and a.is_Integer:
                self.o.merged[b] = a

    def matmul(self, a: list | None, b: list | None, trans_a: int = 0, trans_b: int = 0
               ) -> list | None:
        if a is None or b is None or not a or not b:
            return None
        a, b = list(a), list(b)
        if trans_a and len(a) >= 2:
            a[-2:] = a[-1], a[-2]
        if trans_b and len(b) >= 2:
            b[-2:] = b[-1], b[-2]
        one = self.sp.Integer(1)
        va, vb = len(a) == 1, len(b) == 1
        a, b = ([one] + a if va else a), (b + [one] if vb else b)
        self.equal(a[-1], b[-2])
        out = self.broadcast([a[:-2], b[:-2]]) + [a[-2], b[-1]]
        if vb:
            out.pop(-1)
        if va:
            out.pop(-2 if not vb else -1)
        return out

    def op_MatMul(self, node: onnx.NodeProto) -> Any:
        out = self.matmul(self.shape(node.input[0]), self.shape(node.input[1]))
        if out is None:
            return NotImplemented
        self.set(node.output[0], self.etype(node.input[0]), out)
        return None

    def op_MatMulInteger(self, node: onnx.NodeProto) -> Any:
        out = self.matmul(self.shape(node.input[0]), self.shape(node.input[1]))
        if out is None:
            return NotImplemented
        self.set(node.output[0], TensorProto.INT32, out)
        return None

    def ms_FusedMatMul(self, node: onnx.NodeProto) -> Any:
        out = self.matmul(self.shape(node.input[0]), self.shape(node.input[1]),
                          self.attr(node, "transA", 0), self.attr(node, "transB", 0))
        self.set(node.output[0], self.etype(node.input[0]), out)
        return None

    def ms_MatMulIntegerToFloat(self, node: onnx.NodeProto) -> Any:
        out = self.matmul(self.shape(node.input[0]), self.shape(node.input[1]))
        self.set(node.output[0], self.etype(node.input[2]), out)
        return None

    def ms_DynamicQuantizeMatMul(self, node: onnx.NodeProto) -> Any:
        out = self.matmul(self.shape(node.input[0]), self.shape(node.input[1]))
        self.set(node.output[0], self.etype(node.input[0]), out)
        return None

    def _like_input(self, node: onnx.NodeProto) -> Any:
        self.set(node.output[0], self.etype(node.input[0]), self.shape(node.input[0]))
        return None

    ms_Gelu = ms_FastGelu = ms_BiasGelu = ms_QuickGelu = ms_SkipLayerNormalization = \
        ms_SkipSimplifiedLayerNormalization = ms_BiasAdd = _like_input

    def op_LayerNormalization(self, node: onnx.NodeProto) -> Any:
        # also before opset 17, where onnxruntime defines it in the onnx domain itself
        x = self.shape(node.input[0])
        if x is None:
            return NotImplemented
        self.set(node.output[0], self.etype(node.input[0]), x)
        axis = self.attr(node, "axis", -1)
        axis = axis + len(x) if axis < 0 else axis
        stash = self.attr(node, "stash_type", TensorProto.FLOAT)
        stats = x[:axis] + [self.sp.Integer(1)] * (len(x) - axis)
        for out in node.output[1:]:
            self.set(out, stash, stats)
        return None

    ms_LayerNormalization = ms_SimplifiedLayerNormalization = op_LayerNormalization
    op_SimplifiedLayerNormalization = op_LayerNormalization

    def op_SoftmaxCrossEntropyLoss(self, node: onnx.NodeProto) -> Any:
        scores, labels = self.shape(node.input[0]), self.shape(node.input[1])
        reduction = self.attr(node, "reduction", b"mean")
        reduction = reduction.decode() if isinstance(reduction, bytes) else reduction
        self.set(node.output[0], self.etype(node.input[0]),
                 labels if reduction == "none" else [])
        if len(node.output) > 1:
            self.set(node.output[1], self.etype(node.input[0]), scores)
        return None

    ms_SoftmaxCrossEntropyLossInternal = op_SoftmaxCrossEntropyLoss

    def ms_Attention(self, node: onnx.NodeProto) -> Any:
        x, w = self.shape(node.input[0]), self.shape(node.input[1])
        if x is None or w is None or len(x) != 3:
            return NotImplemented
        sizes = self.attr(node, "qkv_hidden_sizes")
        hidden = self.sp.Integer(sizes[2]) if sizes else self.sp.simplify(w[1] / 3)
        self.set(node.output[0], self.etype(node.input[0]), [x[0], x[1], hidden])
        past = self.shape(node.input[4]) if len(node.input) > 4 and node.input[4] else None
        if len(node.output) > 1 and past is not None and len(past) == 5:
            self.set(node.output[1], self.etype(node.input[0]),
                     past[:3] + [past[3] + x[1], past[4]])
        return None

    def ms_MultiHeadAttention(self, node: onnx.NodeProto) -> Any:
        q = self.shape(node.input[0])
        v = self.shape(node.input[2]) if len(node.input) > 2 and node.input[2] else None
        if q is None or len(q) != 3:
            return NotImplemented
        hidden = q[2]
        if v is not None and len(v) == 3:
            hidden = v[2]
        elif v is not None and len(v) == 4:
            hidden = v[1] * v[3]
        self.set(node.output[0], self.etype(node.input[0]), [q[0], q[1], hidden])
        return None

    def op_Einsum(self, node: onnx.NodeProto) -> Any:
        eq = self.attr(node, "equation").decode().replace(" ", "")
        lhs, arrow, rhs = eq.partition("->")
        terms = lhs.split(",")
        shapes = [self.shape(n) for n in node.input]
        if any(s is None for s in shapes) or len(terms) != len(shapes):
            return NotImplemented
        letters: dict[str, Any] = {}
        counts: dict[str, int] = {}
        ellipsis: list = []
        for term, shape in zip(terms, shapes, strict=True):
            head, dots, tail = term.partition("...")
            n_ell = len(shape) - len(head) - len(tail) if dots else 0
            if dots:
                ell = shape[len(head):len(head) + n_ell]
                ellipsis = self.broadcast([ellipsis, ell])
            named = list(zip(head, shape[:len(head)], strict=True)) + \
                list(zip(tail, shape[len(head) + n_ell:], strict=True))
            for ch, d in named:
                letters[ch] = self.merge(letters[ch], d) if ch in letters else d
                counts[ch] = counts.get(ch, 0) + 1
        if arrow:
            head, dots, tail = rhs.partition("...")
            out = [letters[c] for c in head] + (ellipsis if dots else []) + \
                [letters[c] for c in tail]
        else:
            out = ellipsis + [letters[c] for c in sorted(letters) if counts[c] == 1]
        self.set(node.output[0], self.etype(node.input[0]), out)
        return None

    def op_Loop(self, node: onnx.NodeProto) -> Any:
        body = self.attr(node, "body")
        carried = [n for n in node.input[2:]]
        given = {}
        for vi, name in zip(body.input[2:], carried, strict=False):
            if name in self.types:
                given[vi.name] = self.types[name]
        if len(body.input) > 0:
            given[body.input[0].name] = (TensorProto.INT64, [])
        if len(body.input) > 1:
            given[body.input[1].name] = (TensorProto.BOOL, [])
        sub = _Graph(self.o, body, outer=self)
        sub.run(given)
        trip = self.ints_input(node, 0)
        for k, name in enumerate(node.output):
            got = sub.types.get(body.output[k + 1].name) if k + 1 < len(body.output) else None
            if got is None:
                continue
            etype, dims = got
            if k < len(carried):  # a loop-carried value: its dims may change per iteration
                before = self.shape(carried[k]) if carried[k] else None
                if dims is not None and before is not None and len(before) == len(dims):
                    dims = [a if a == b else self.o.fresh(f"{self.unnamed(node, k)}{j}")
                            for j, (a, b) in enumerate(zip(before, dims, strict=True))]
            else:  # a scan output: the iterations stacked
                count = trip[0] if trip and trip[0].is_Integer and len(node.input[1]) == 0 \
                    else self.o.fresh(f"{self.unnamed(node, k - len(carried))}0")
                dims = None if dims is None else [count] + dims
            self.set(name, etype, dims)
        return None

    def op_If(self, node: onnx.NodeProto) -> Any:
        branches = {}
        for a in node.attribute:
            if a.name in ("then_branch", "else_branch"):
                sub = _Graph(self.o, a.g, outer=self)
                sub.run()
                branches[a.name] = [sub.types.get(o.name) for o in a.g.output]
        then, other = branches["then_branch"], branches["else_branch"]
        for i, name in enumerate(node.output):
            t, e = then[i], other[i]
            if t is None or e is None or TensorProto.UNDEFINED in (t[0], e[0]):
                if t is not None or e is not None:
                    self.set(name, (t or e)[0] or (e or t)[0], None)
                continue
            if t[0] != e[0]:
                raise ValueError(
                    f"If node {node.name!r}: output {i} ({name!r}) is {_type_name(t[0])} in "
                    f"then_branch but {_type_name(e[0])} in else_branch")
            dims = None
            if t[1] is not None and e[1] is not None and len(t[1]) == len(e[1]):
                dims = [a if a == b else self.o.fresh() for a, b in zip(t[1], e[1], strict=True)]
            self.set(name, t[0], dims)
        return None

    # ---- com.microsoft operators onnx does not know ----------------------------------------
    def ms_EmbedLayerNormalization(self, node: onnx.NodeProto) -> Any:
        ids, word = self.shape(node.input[0]), self.shape(node.input[2])
        if ids is None or word is None:
            return NotImplemented
        etype = self.etype(node.input[2])
        self.set(node.output[0], etype, ids + [word[1]])
        if len(node.output) > 1:
            self.set(node.output[1], TensorProto.INT32, ids[:1])
        if len(node.output) > 2:
            self.set(node.output[2], etype, ids + [word[1]])
        return None

    def ms_QuantizeLinear(self, node: onnx.NodeProto) -> Any:
        zp = node.input[2] if len(node.input) > 2 and node.input[2] else None
        self.set(node.output[0], self.etype(zp) if zp else TensorProto.UINT8,
                 self.shape(node.input[0]))
        return None

    def ms_DequantizeLinear(self, node: onnx.NodeProto) -> Any:
        self.set(node.output[0], self.etype(node.input[1]), self.shape(node.input[0]))
        return None

    def ms_MatMulNBits(self, node: onnx.NodeProto) -> Any:
        a = self.shape(node.input[0])
        n = self.attr(node, "N")
        self.set(node.output[0], self.etype(node.input[0]),
                 None if a is None else a[:-1] + [n])
        return None

    def _qlinear_binary(self, node: onnx.NodeProto) -> Any:
        self.set(node.output[0], self.etype(node.input[0]),
                 self.broadcast([self.shape(node.input[0]), self.shape(node.input[3])]))
        return None

    ms_QLinearAdd = ms_QLinearMul = _qlinear_binary


class SymbolicShapeInference:
    """onnxruntime's symbolic shape inference, on onnxrun. Use ``infer_shapes``."""

    def __init__(self, int_max: int = 2**31 - 1, auto_merge: bool = False,
                 guess_output_rank: bool = False, verbose: int = 0) -> None:
        self.sp = _sympy()
        self.int_max = int_max
        self.auto_merge = auto_merge
        self.guess_output_rank = guess_output_rank
        self.verbose = verbose
        self.symbols: dict[str, Any] = {}
        self.merged: dict[Any, Any] = {}  # auto_merge: symbol -> what it was found equal to
        self.count = 0
        self.opsets: list[onnx.OperatorSetIdProto] = []
        self.opset = 0
        self.ir_version = onnx.IR_VERSION

    def symbol(self, name: str) -> Any:
        if name not in self.symbols:
            self.symbols[name] = self.sp.Symbol(name, integer=True, positive=True)
        return self.symbols[name]

    def fresh(self, name: str | None = None) -> Any:
        if name and name not in self.symbols:
            return self.symbol(name)
        while f"unk__{self.count}" in self.symbols:
            self.count += 1
        return self.symbol(f"unk__{self.count}")

    def render(self, d: Any) -> int | str:
        d = self.sp.sympify(d)
        for _ in range(len(self.merged)):  # chains a -> b -> 3
            if not d.free_symbols & self.merged.keys():
                break
            d = d.xreplace(self.merged)
        if d.is_Integer:
            return int(d)
        if d.is_Number:  # a fraction or float cannot be a dimension: name it
            d = self.fresh()
        return str(d)

    @staticmethod
    def infer_shapes(in_mp: onnx.ModelProto, int_max: int = 2**31 - 1, auto_merge: bool = False,
                     guess_output_rank: bool = False, verbose: int = 0
                     ) -> onnx.ModelProto | None:
        """A copy of ``in_mp`` with every node output's type and symbolic shape in
        ``graph.value_info`` and the graph outputs. Returns None (with a warning) for models
        below opset 7, as onnxruntime does; raises ValueError naming the node when a node's
        inputs contradict it (an If whose branches give different types)."""
        if not isinstance(in_mp, onnx.ModelProto):
            raise TypeError(f"infer_shapes expects an onnx.ModelProto, got "
                            f"{type(in_mp).__name__}")
        self = SymbolicShapeInference(int_max, auto_merge, guess_output_rank, verbose)
        opset = next((o.version for o in in_mp.opset_import if o.domain in ("", "ai.onnx")), 0)
        if opset < 7:
            _log.warning("Only support models of onnx opset 7 and above.")
            return None
        out = onnx.ModelProto()
        out.CopyFrom(in_mp)
        self.opsets = list(out.opset_import)
        if not any(o.domain == "com.microsoft" for o in self.opsets):
            self.opsets.append(helper.make_opsetid("com.microsoft", 1))
        self.opset = opset
        self.ir_version = out.ir_version or onnx.IR_VERSION
        # declared names are symbols from the start, so fresh ones never collide with them
        for vi in list(out.graph.input) + list(out.graph.output) + list(out.graph.value_info):
            for d in vi.type.tensor_type.shape.dim:
                if d.dim_param:
                    self.symbol(d.dim_param)
        _Graph(self, out.graph).run()
        return out


def main(argv: list[str] | None = None) -> int:
    """``python -m onnxrun.tools.symbolic_shape_infer --input m.onnx --output out.onnx``."""
    p = argparse.ArgumentParser(prog="symbolic_shape_infer",
                                description="Annotate a model with symbolic shapes.")
    p.add_argument("--input", required=True, help="the input model file")
    p.add_argument("--output", help="where to write the model with shapes")
    p.add_argument("--auto_merge", action="store_true",
                   help="merge symbolic dimensions that broadcasting shows to be equal")
    p.add_argument("--int_max", type=int, default=2**31 - 1,
                   help="a Slice index at or beyond this is the end of the axis")
    p.add_argument("--guess_output_rank", action="store_true",
                   help="give unknown operators' outputs the first input's rank")
    p.add_argument("--verbose", type=int, default=0, help="0: quiet, 1: warnings, 2: per node")
    p.add_argument("--save_as_external_data", action="store_true")
    p.add_argument("--all_tensors_to_one_file", action="store_true")
    p.add_argument("--external_data_location", default="./")
    p.add_argument("--external_data_size_threshold", type=int, default=1024)
    args = p.parse_args(argv)
    if args.verbose:
        logging.basicConfig(level=logging.INFO if args.verbose > 1 else logging.WARNING)
    model = onnx.load(args.input)
    out = SymbolicShapeInference.infer_shapes(model, args.int_max, args.auto_merge,
                                              args.guess_output_rank, args.verbose)
    if out is None:
        print(f"symbolic_shape_infer: {args.input}: opset below 7, nothing written",
              file=sys.stderr)
        return 1
    if args.output:
        onnx.save(out, args.output, save_as_external_data=args.save_as_external_data,
                  all_tensors_to_one_file=args.all_tensors_to_one_file,
                  location=args.external_data_location if args.save_as_external_data else None,
                  size_threshold=args.external_data_size_threshold)
    return 0


if __name__ == "__main__":
    sys.exit(main())
