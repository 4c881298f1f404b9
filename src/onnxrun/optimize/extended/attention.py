"""Multi-head self-attention fusion: each exported attention block becomes one
com.microsoft Attention node (packed QKV weights, the operator onnxruntime's CPU provider runs
and its transformer tooling writes for BERT and GPT-2).

Matched, from the Softmax outwards (BERT- and GPT-style TorchScript / HF exports)::

    qp, kp, vp = X @ Wq + bq, X @ Wk + bk, X @ Wv + bv        (or one X @ Wqkv + b, then Split)
    q = Transpose(Reshape(qp, [B, S, N, H]), [0, 2, 1, 3])    (v alike)
    kT = Transpose(Reshape(kp, [B, S, N, H]), [0, 2, 3, 1])   (or two Transposes)
    scores = (q @ kT) * scale                                 (Mul/Div by scalars on q, on kT
                                                               or on the product before masks)
    scores = masks(scores)                                    (see below)
    out = Reshape(Transpose(Softmax(scores) @ v, [0, 2, 1, 3]), [B, S, N*H])

Masks understood (anything else makes the fusion refuse):

* HF padding mask: scores + (1 - Cast(Unsqueeze(mask[B, T], 1, 2))) * c  ->  mask_index =
  mask as int32, mask_filter_value = c. (As in onnxruntime's tooling, the mask is taken to
  hold 0/1.)
* causal mask: Where(Not(Trilu(ConstantOfShape([S, S], true))), -inf, scores) or
  Where(Trilu(...), scores, -inf) (any fill <= -1e4), or a constant lower-triangular boolean
  or additive mask of static size  ->  unidirectional = 1.

The Reshape targets may be computed at run time (Shape -> Gather -> Unsqueeze -> Concat): each
element must provably be the batch / sequence dimension of the projected input, or the head
count and size. The shape-computing nodes die with the block.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from ...ir import Model, Node, Value
from ...proto import onnx
from ..base import EXTENDED, GraphPass, PassResult, register_pass
from ..graph_utils import all_graphs, constant_value, make_initializer, scalar_value
from ._helpers import (
    LOWEST_FLOAT32,
    MS,
    dim_matches,
    dying_nodes,
    elem_type,
    float_scalar,
    insert_before,
    is_float32,
    last_dim,
    make_node,
    opset,
    producer,
    rank,
    remove_nodes,
    same_dim,
    shape,
    shape_items,
    take_over,
)

BOOL = onnx.TensorProto.BOOL
INT32 = onnx.TensorProto.INT32

MIN_FILL = -1e4  # a replacing fill at most this small is "masked out" after Softmax


@dataclass
class _Block:
    """What one match found."""

    nodes: list[Node] = field(default_factory=list)
    scale: float = 1.0
    causal: bool = False
    mask: Value | None = None  # 2-D key padding mask (any integer/bool/float type)
    filter_value: float | None = None
    causal_fill: float | None = None


@dataclass
class _Projection:
    x: Value
    weight: np.ndarray
    bias: np.ndarray | None
    nodes: list[Node]


@dataclass
class _Projected:
    """Q, K and V as computed by anything else (integer products of a quantized model,
    non-constant weights): the block becomes MultiHeadAttention on them."""

    q: Value
    k: Value
    v: Value

    @property
    def x(self) -> Value:  # [batch, sequence, ...] of the block's input
        return self.q


def _perm(node: Node | None, expected: list[int]) -> bool:
    return node is not None and list(node.attr("perm", []) or []) == expected


def _scalar_scale(node: Node, data: Value) -> float | None:
    """node is Mul(data, c) or Div(data, c) with c a scalar float constant: the factor."""
    if node.domain != "" or len(node.inputs) != 2:
        return None
    if node.op_type == "Mul":
        other = node.inputs[1] if node.inputs[0] is data else node.inputs[0]
        c = float_scalar(other)
        return None if c is None or constant_value(other).ndim > 1 else c
    if node.op_type == "Div" and node.inputs[0] is data:
        c = float_scalar(node.inputs[1])
        if c is None or c == 0 or constant_value(node.inputs[1]).ndim > 1:
            return None
        return 1.0 / c
    return None


def _is_square(c: np.ndarray) -> bool:
    """[..., n, n] with every leading dimension 1."""
    return c.ndim >= 2 and c.shape[-1] == c.shape[-2] and all(d == 1 for d in c.shape[:-2])


def _strip_scales(v: Value, block: _Block) -> Value:
    """Follow scalar Mul/Div producers back from v, folding their factors into the block."""
    while v.producer is not None and v.producer.op_type in ("Mul", "Div"):
        n = v.producer
        for data in n.inputs[:1] if n.op_type == "Div" else n.inputs:
            f = _scalar_scale(n, data)
            if f is not None:
                block.scale *= f
                block.nodes.append(n)
                v = data
                break
        else:
            return v
    return v


class AttentionMatcher:
    def __init__(self, model: Model) -> None:
        self.model = model
        # the causal matrix's size: ("items", shape items) or ("static", n)
        self.square: tuple | None = None

    # -- entry ---------------------------------------------------------------------------------
    def match(self, softmax: Node) -> tuple[_Block, _Projection | _Projected, int, Node] | None:
        b = _Block()
        axis = softmax.attr("axis", -1 if opset(self.model, softmax) >= 13 else 1)
        if axis not in (-1, 3):
            return None
        probs = softmax.outputs[0]
        if len(probs.uses) != 1:
            return None
        pv, idx = probs.uses[0]
        if pv.op_type != "MatMul" or pv.domain != "" or idx != 0:
            return None
        ctx = pv.outputs[0]
        tr = ctx.uses[0][0] if len(ctx.uses) == 1 else None
        if tr is None or tr.op_type != "Transpose" or not _perm(tr, [0, 2, 1, 3]):
            return None
        t = tr.outputs[0]
        # Other readers of t (Shape, for the Reshape's own target) must die with the block
        readers = [n for n, i in t.uses if n.op_type == "Reshape" and n.domain == "" and i == 0]
        if len(readers) != 1:
            return None
        out_reshape = readers[0]
        # scores side
        mm = self._scores(softmax.inputs[0], b)
        if mm is None:
            return None
        q_in = _strip_scales(mm.inputs[0], b)
        k_in = _strip_scales(mm.inputs[1], b)
        q = self._heads(q_in, [0, 2, 1, 3], b)
        k = self._key_heads(k_in, b)
        v = self._heads(pv.inputs[1], [0, 2, 1, 3], b)
        if q is None or k is None or v is None:
            return None
        (qp, nq, hq), (kp, nk, hk), (vp, nv, hv) = q, k, v
        if not (nq == nk == nv and hq == hk == hv):
            return None
        num_heads, head = nq, hq
        proj = self._projections(qp, kp, vp, num_heads * head)
        if proj is None:
            proj = self._projected(qp, kp, vp, num_heads * head)
        if proj is None:
            return None
        if not self._output_shape(out_reshape, t, qp, num_heads * head):
            return None
        if b.mask is not None and not self._mask_fits(b.mask, proj.x):
            return None
        b.nodes += [mm, softmax, pv, tr]
        if isinstance(proj, _Projection):
            b.nodes += proj.nodes
        b.nodes.append(out_reshape)  # the root: last
        return b, proj, num_heads, out_reshape

    # -- scores and masks ----------------------------------------------------------------------
    def _scores(self, v: Value, b: _Block) -> Node | None:
        """Walk from the Softmax input to the Q.K MatMul through masks and scales."""
        masks_done = False
        for _ in range(8):
            n = v.producer
            if n is None or n.domain != "":
                return None
            if n.op_type == "MatMul":
                return n
            if n.op_type in ("Mul", "Div"):
                nxt = _strip_scales(v, b)
                if nxt is v:
                    return None
                v = nxt
                masks_done = True
                continue
            if masks_done:
                return None  # a scale applied after a mask would rescale its filter value
            if n.op_type == "Add":
                nxt = self._additive_mask(n, b)
            elif n.op_type == "Where":
                nxt = self._where_mask(n, b)
            else:
                return None
            if nxt is None:
                return None
            b.nodes.append(n)
            v = nxt
        return None

    def _additive_mask(self, add: Node, b: _Block) -> Value | None:
        for s, m in ((add.inputs[0], add.inputs[1]), (add.inputs[1], add.inputs[0])):
            if s is None or m is None:
                continue
            pad = self._padding_mask(m)
            if pad is not None and b.mask is None:
                b.mask, b.filter_value = pad
                return s
            fill = self._constant_causal(m)
            if fill is not None and not b.causal:
                b.causal, b.causal_fill = True, fill
                return s
        return None

    def _padding_mask(self, m: Value) -> tuple[Value, float] | None:
        """(1 - Cast(Unsqueeze(mask, [1, 2]))) * c -> (mask, c)."""
        mul = producer(m, "Mul")
        if mul is None:
            return None
        for sub_v, c_v in ((mul.inputs[0], mul.inputs[1]), (mul.inputs[1], mul.inputs[0])):
            c, sub = float_scalar(c_v), producer(sub_v, "Sub")
            if c is None or sub is None or not c < 0 or not np.isfinite(c):
                continue
            if scalar_value(sub.inputs[0]) != 1:
                continue
            mask = self._unsqueezed_mask(sub.inputs[1])
            if mask is not None and constant_value(c_v).ndim <= 1:
                return mask, c
        return None

    def _unsqueezed_mask(self, v: Value) -> Value | None:
        """v = Casts / Unsqueezes of a 2-D mask [B, T] giving [B, 1, 1, T]."""
        chain: list[Node] = []
        while v.producer is not None and v.producer.op_type in ("Cast", "Unsqueeze"):
            chain.append(v.producer)
            v = v.producer.inputs[0]
        if rank(v) != 2 or constant_value(v) is not None:
            return None
        dims = ["B", "T"]
        for n in reversed(chain):
            if n.op_type == "Cast":
                continue
            if opset(self.model, n) >= 13:
                axes_c = constant_value(n.inputs[1]) if len(n.inputs) > 1 else None
                axes = None if axes_c is None else [int(a) for a in axes_c.reshape(-1)]
            else:
                axes = n.attr("axes")
            if not axes:
                return None
            r = len(dims) + len(axes)
            for a in sorted(x + r if x < 0 else x for x in axes):
                dims.insert(a, "1")
        return v if dims == ["B", "1", "1", "T"] else None

    def _where_mask(self, where: Node, b: _Block) -> Value | None:
        cond, x, y = where.inputs
        if b.causal:
            return None
        for scores, fill_v, want_allowed in ((y, x, False), (x, y, True)):
            fill = float_scalar(fill_v)
            if fill is None or not fill <= MIN_FILL or constant_value(fill_v).ndim > 4:
                continue
            allowed = self._causal_condition(cond)
            if allowed is None or allowed != want_allowed:
                continue
            b.causal, b.causal_fill = True, fill
            return scores
        return None

    def _causal_condition(self, cond: Value) -> bool | None:
        """True if cond is the lower-triangular 'may attend' matrix, False if its negation."""
        negated = as_bool = False
        for _ in range(6):
            n = cond.producer
            if n is not None and n.op_type == "Cast" and n.attr("to") == BOOL:
                cond, as_bool = n.inputs[0], True  # nonzero -> True from here down
            elif n is not None and n.op_type == "Not":  # its input is bool by the spec
                negated = not negated
                cond = n.inputs[0]
            else:
                break
        if elem_type(cond) != BOOL and not as_bool:
            return None
        c = constant_value(cond)
        if c is not None:
            if not _is_square(c):
                return None
            sq = c.reshape(c.shape[-2:]).astype(bool)
            tril = np.tril(np.ones(sq.shape, bool))
            if np.array_equal(sq, ~tril):  # the 'future' positions, folded
                negated = not negated
            elif not np.array_equal(sq, tril):
                return None
            self.square = ("static", sq.shape[0])
            return not negated
        tri = producer(cond, "Trilu")
        if tri is None or tri.attr("upper", 1) != 0:
            return None
        if len(tri.inputs) > 1 and tri.inputs[1] is not None and scalar_value(tri.inputs[1]) != 0:
            return None
        ones = producer(tri.inputs[0], "ConstantOfShape")
        if ones is None:
            return None
        value = ones.attr("value")
        if value is None or not np.asarray(value).reshape(-1)[0]:
            return None  # all ones (true), so that Trilu keeps exactly the lower triangle
        items = shape_items(ones.inputs[0])
        if items is None or len(items) != 2:
            return None
        self.square = ("items", items)
        return not negated

    def _constant_causal(self, m: Value) -> float | None:
        """A constant additive causal mask: 0 on and below the diagonal, one fill <= -1e4
        above. Returns the fill."""
        c = constant_value(m)
        if c is None or c.dtype.kind != "f" or not _is_square(c):
            return None
        sq = c.reshape(c.shape[-2:])
        n = sq.shape[0]
        lower = np.tril(np.ones((n, n), bool))
        if np.any(sq[lower] != 0):
            return None
        upper = sq[~lower]
        if upper.size == 0 or np.any(upper != upper[0]) or not upper[0] <= MIN_FILL:
            return None
        self.square = ("static", n)
        return float(upper[0])

    # -- heads ---------------------------------------------------------------------------------
    def _heads(self, v: Value, perm: list[int], b: _Block) -> tuple[Value, int, int] | None:
        tr = producer(v, "Transpose")
        if not _perm(tr, perm):
            return None
        b.nodes.append(tr)
        return self._split_heads(tr.inputs[0], b)

    def _key_heads(self, v: Value, b: _Block) -> tuple[Value, int, int] | None:
        tr = producer(v, "Transpose")
        if _perm(tr, [0, 2, 3, 1]):
            b.nodes.append(tr)
            return self._split_heads(tr.inputs[0], b)
        if _perm(tr, [0, 1, 3, 2]):
            b.nodes.append(tr)
            return self._heads(tr.inputs[0], [0, 2, 1, 3], b)
        return None

    def _split_heads(self, v: Value, b: _Block) -> tuple[Value, int, int] | None:
        """v = Reshape(p, [B, S, N, H]) of a [B, S, N*H] projection p: (p, N, H)."""
        r = producer(v, "Reshape")
        if r is None:
            return None
        p = r.inputs[0]
        d = last_dim(p)
        items = shape_items(r.inputs[1])
        if rank(p) != 3 or d is None or items is None or len(items) != 4:
            return None
        if items[2][0] != "const" or items[2][1] <= 0:
            return None
        n = items[2][1]
        h = items[3][1] if items[3][0] == "const" else None
        if h == -1 and d % n == 0:
            h = d // n
        if h is None or n * h != d:
            return None
        copy = r.attr("allowzero", 0) == 0
        lead = [dim_matches(items[k], k, [p], copy) for k in (0, 1)]
        wild = [items[k] == ("const", -1) for k in (0, 1)]
        if not all(ok or w for ok, w in zip(lead, wild, strict=True)) or sum(wild) > 1:
            return None
        if any(wild) and items[3] == ("const", -1):
            return None
        b.nodes.append(r)
        return p, n, h

    # -- projections ---------------------------------------------------------------------------
    def _projection(self, p: Value) -> _Projection | None:
        nodes: list[Node] = []
        offset, size = None, None
        split = producer(p, "Split")
        if split is not None:
            sizes = self._split_sizes(split)
            if sizes is None:
                return None
            i = p.output_index
            offset, size = sum(sizes[:i]), sizes[i]
            nodes.append(split)
            p = split.inputs[0]
        bias = None
        add = producer(p, "Add")
        if add is not None:
            for mm_v, b_v in ((add.inputs[0], add.inputs[1]), (add.inputs[1], add.inputs[0])):
                bc = constant_value(b_v)
                if bc is not None and bc.ndim == 1 and producer(mm_v, "MatMul") is not None:
                    bias, p = bc, mm_v
                    nodes.append(add)
                    break
            else:
                return None
        mm = producer(p, "MatMul")
        if mm is None:
            return None
        w = constant_value(mm.inputs[1])
        x = mm.inputs[0]
        if w is None or w.ndim != 2 or rank(x) != 3 or last_dim(x) != w.shape[0]:
            return None
        if bias is not None and bias.shape[0] != w.shape[1]:
            return None
        nodes.append(mm)
        if offset is not None:
            if offset + size > w.shape[1]:
                return None
            w = w[:, offset:offset + size]
            bias = None if bias is None else bias[offset:offset + size]
        return _Projection(x, w, bias, nodes)

    def _split_sizes(self, split: Node) -> list[int] | None:
        r = rank(split.inputs[0])
        axis = split.attr("axis", 0)
        if r is None or axis not in (-1, r - 1):
            return None
        total = last_dim(split.inputs[0])
        count = len(split.outputs)
        if len(split.inputs) > 1 and split.inputs[1] is not None:
            c = constant_value(split.inputs[1])
            sizes = None if c is None else [int(s) for s in c.reshape(-1)]
        elif split.attr("split") is not None:
            sizes = [int(s) for s in split.attr("split")]
        elif total is not None and total % count == 0:
            sizes = [total // count] * count
        else:
            sizes = None
        if sizes is None or len(sizes) != count or (total is not None and sum(sizes) != total):
            return None
        return sizes

    def _projections(self, qp: Value, kp: Value, vp: Value, d: int) -> _Projection | None:
        parts = [self._projection(p) for p in (qp, kp, vp)]
        if any(p is None for p in parts):
            return None
        x = parts[0].x
        if any(p.x is not x for p in parts) or not is_float32(x):
            return None
        if any(p.weight.shape[1] != d for p in parts):
            return None
        if len({p.weight.dtype for p in parts}) != 1:
            return None
        w = np.concatenate([p.weight for p in parts], axis=1)
        bias = np.concatenate([p.bias if p.bias is not None else np.zeros(d, w.dtype)
                               for p in parts]).astype(w.dtype)
        nodes: list[Node] = []
        for p in parts:
            nodes += [n for n in p.nodes if n not in nodes]
        return _Projection(x, np.ascontiguousarray(w), bias, nodes)

    @staticmethod
    def _projected(qp: Value, kp: Value, vp: Value, d: int) -> _Projected | None:
        """Self-attention on Q, K, V of one [batch, sequence, d] shape, however computed."""
        if not is_float32(qp, kp, vp) or any(rank(p) != 3 or last_dim(p) != d
                                              for p in (qp, kp, vp)):
            return None
        if not all(same_dim(qp, p, k) for p in (kp, vp) for k in (0, 1)):
            return None
        return _Projected(qp, kp, vp)

    # -- checks that need the projected input ---------------------------------------------------
    def _output_shape(self, reshape: Node, t: Value, qp: Value, d: int) -> bool:
        items = shape_items(reshape.inputs[1])
        if items is None or len(items) != 3:
            return False
        copy = reshape.attr("allowzero", 0) == 0
        lead = [dim_matches(items[k], k, [t, qp], copy) for k in (0, 1)]
        last = items[2]
        if last[0] == "const":
            last_ok = last[1] in (d, -1)
        else:
            last_ok = dim_matches(last, 2, [qp], False)
        return all(lead) and last_ok

    def _mask_fits(self, mask: Value, x: Value) -> bool:
        """The key padding mask is [batch, sequence] of the input, as far as shapes tell."""
        ms, xs = shape(mask), shape(x)
        if ms is None or len(ms) != 2 or xs is None:
            return False
        for a, b in zip(ms, xs[:2], strict=True):
            if isinstance(a, int) and isinstance(b, int) and a != b:
                return False
        return elem_type(mask) in (
            onnx.TensorProto.INT64, INT32, BOOL, onnx.TensorProto.FLOAT,
            onnx.TensorProto.INT8, onnx.TensorProto.UINT8, onnx.TensorProto.INT16)


@register_pass
class AttentionFusion(GraphPass):
    name = "AttentionFusion"
    level = EXTENDED
    order = 20

    def run(self, model: Model) -> PassResult:
        changes: Counter = Counter()
        for graph in list(all_graphs(model.graph)):
            for node in list(graph.nodes):
                if node.graph is graph and node.op_type == "Softmax" and node.domain == "":
                    fused = self._fuse(model, node)
                    if fused:
                        changes[fused] += 1
        return PassResult(bool(changes), changes)

    def _fuse(self, model: Model, softmax: Node) -> str | None:
        """The fused operator's name, or None."""
        matcher = AttentionMatcher(model)
        found = matcher.match(softmax)
        if found is None:
            return None
        block, proj, num_heads, root = found
        if block.causal and not self._causal_fits(matcher, proj.x):
            return None
        graph = root.graph
        kept = [proj.q, proj.k, proj.v] if isinstance(proj, _Projected) else [proj.x]
        dead = dying_nodes(block.nodes, [*kept, block.mask])
        if dead is None:
            return None
        new_nodes: list[Node] = []
        mask_index = None
        if block.mask is not None:
            mask_index = block.mask
            if elem_type(mask_index) != INT32:
                cast = make_node(graph, model, "Cast", [block.mask], name=f"{root.label}_mask",
                                 to=INT32)
                new_nodes.append(cast)
                mask_index = cast.outputs[0]
        if block.filter_value is not None:
            filter_value = block.filter_value
        elif block.causal_fill is not None and np.isfinite(block.causal_fill):
            filter_value = block.causal_fill
        else:
            filter_value = LOWEST_FLOAT32
        if isinstance(proj, _Projected):
            # MultiHeadAttention(query, key, value, bias, key_padding_mask)
            op_type, inputs = "MultiHeadAttention", [proj.q, proj.k, proj.v, None, mask_index]
        else:
            w = make_initializer(graph, f"{root.label}_qkv_weight", proj.weight)
            b = make_initializer(graph, f"{root.label}_qkv_bias", proj.bias)
            op_type, inputs = "Attention", [proj.x, w, b, mask_index]
        while inputs[-1] is None:
            inputs.pop()
        attn = make_node(graph, model, op_type, inputs, domain=MS,
                         name=f"{root.label}_attention", num_heads=num_heads,
                         scale=float(block.scale), unidirectional=int(block.causal),
                         mask_filter_value=float(filter_value))
        take_over(attn, 0, root.outputs[0])
        new_nodes.append(attn)
        insert_before(graph, root, new_nodes)
        remove_nodes(graph, dead)
        return op_type

    @staticmethod
    def _causal_fits(matcher: AttentionMatcher, x: Value) -> bool:
        """The causal matrix is [S, S] for the input's sequence length S."""
        if matcher.square is None:
            return False
        kind, value = matcher.square
        if kind == "items":
            return all(dim_matches(item, 1, [x], False) for item in value)
        s = shape(x)
        return s is not None and s[1] == value
