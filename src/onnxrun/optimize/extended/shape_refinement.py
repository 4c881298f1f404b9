"""Shape refinement (runs first at the extended level, changes no node): values whose shape
the load-time ONNX shape inference left unknown, wholly or in some dimensions, get one,
propagated forward through the common operators, including the com.microsoft ones the fusions
write; convolutions, pools, Pad and Resize by the kernels' own arithmetic (geometry.py).

Why: the fusions check ranks and hidden sizes (a bias over the last axis, a residual of the
same shape). ONNX inference gives up at some nodes (Reshape-13 to a computed target, or any
com.microsoft operator, a Pad whose pads a constant subgraph computes, as PyTorch exports
ZeroPad2d), after which every later value is unknown; onnxruntime re-infers after each fusion
and constant folding. The layout level needs the sizes: an SE block's gate is per channel only
if its pixels are known to be 1 x 1. Only provable facts are written: a dimension is an int,
a symbol copied from a known dimension, or left unknown.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ...dtypes import elem_type as array_elem_type
from ...dtypes import has_settled_shape, has_shape, tensor_type_proto
from ...geometry import resize_geometry, transpose_geometry, window_geometry
from ...ir import Model, Node
from ...proto import onnx
from ...providers.registry import text_attribute
from ..base import EXTENDED, GraphPass, PassResult, register_pass
from ..graph_utils import all_graphs, is_graph_output, pad_amounts
from ._helpers import MS, const_value, elem_type, shape, shape_items

Dims = list  # of int | str | None

_SAME = {
    "Relu", "Tanh", "Sigmoid", "Erf", "Sqrt", "Reciprocal", "Neg", "Abs", "Exp", "Log",
    "Identity", "Dropout", "Softmax", "LogSoftmax", "LeakyRelu", "Clip", "Elu", "Selu",
    "HardSigmoid", "HardSwish", "Softplus", "Softsign", "Gelu", "Not", "Cast", "Floor", "Ceil",
    "Round", "Sign", "LayerNormalization", "SimplifiedLayerNormalization", "RMSNormalization",
    "BatchNormalization", "InstanceNormalization", "Trilu", "CumSum",
}
_MS_SAME = {"Gelu", "FastGelu", "BiasGelu", "QuickGelu", "SkipLayerNormalization",
            "SkipSimplifiedLayerNormalization", "FusedConv", "BiasSoftmax"}
_BROADCAST = {"Add", "Sub", "Mul", "Div", "Pow", "Where", "Equal", "Less", "Greater", "And",
              "Or", "Max", "Min", "Mod", "LessOrEqual", "GreaterOrEqual"}
_BOOL_OUT = {"Equal", "Less", "Greater", "And", "Or", "Not", "LessOrEqual", "GreaterOrEqual"}


def _broadcast(shapes: list[Dims]) -> Dims:
    """Numpy broadcasting of partly known shapes. In a valid model every dimension is 1 or the
    result's, so one known size other than 1 decides the result even next to unknowns."""
    r = max(len(s) for s in shapes)
    out: Dims = []
    for i in range(r):
        dims = [s[i - r + len(s)] for s in shapes if i - r + len(s) >= 0]
        sizes = {d for d in dims if d is not None and d != 1}
        if len(sizes) == 1:
            out.append(sizes.pop())
        elif not sizes and all(d == 1 for d in dims):
            out.append(1)
        else:
            out.append(None)
    return out


def _matmul(a: Dims, b: Dims, trans_a: bool = False, trans_b: bool = False) -> Dims | None:
    if len(a) < 2 or len(b) < 2:
        return None
    m = a[-1] if trans_a else a[-2]
    n = b[-2] if trans_b else b[-1]
    return _broadcast([a[:-2], b[:-2]]) + [m, n] if (a[:-2] or b[:-2]) else [m, n]


def _reshape(node: Node, x: Dims | None) -> Dims | None:
    items = shape_items(node.inputs[1])
    if items is None:
        return None
    copy = node.attr("allowzero", 0) == 0
    out: Dims = []
    for k, item in enumerate(items):
        if item[0] == "const":
            value = item[1]
            if value == 0 and copy:
                out.append(x[k] if x is not None and k < len(x) else None)
            else:
                out.append(value if value > 0 else None)
        else:
            src = shape(item[1])
            out.append(src[item[2]] if src is not None and item[2] < len(src) else None)
    inferred = [k for k, item in enumerate(items) if item[0] == "const" and item[1] == -1]
    if len(inferred) == 1 and x is not None and all(isinstance(d, int) for d in x) and \
            all(isinstance(d, int) for k, d in enumerate(out) if k != inferred[0]):
        rest = _product([d for k, d in enumerate(out) if k != inferred[0]])
        if rest and _product(x) % rest == 0:  # (-1: what the other sizes leave)
            out[inferred[0]] = _product(x) // rest
    return out


def _axes(node: Node, model: Model) -> list[int] | None:
    if len(node.inputs) > 1 and node.inputs[1] is not None:
        c = const_value(node.inputs[1])
        return None if c is None else [int(a) for a in c.reshape(-1)]
    axes = node.attr("axes")
    return None if axes is None else [int(a) for a in axes]


def _infer(model: Model, node: Node, ins: list[Dims | None]) -> list[Dims | None]:
    """Output shapes (None: unknown) of ``node`` from its inputs' shapes."""
    op, x = node.op_type, ins[0] if ins else None
    n_out = len(node.outputs)
    if node.domain == MS:
        if op in _MS_SAME:
            return [x, None, None, x] if op.startswith("Skip") else [x]
        if op in ("FusedMatMul",) and x is not None and ins[1] is not None:
            if node.attr("transBatchA", 0) or node.attr("transBatchB", 0):
                return [None]
            return [_matmul(x, ins[1], bool(node.attr("transA", 0)),
                            bool(node.attr("transB", 0)))]
        if op == "FusedGemm" and x is not None and ins[1] is not None:
            return [_matmul(x, ins[1], bool(node.attr("transA", 0)),
                            bool(node.attr("transB", 0)))]
        if op == "Attention" and x is not None and len(x) == 3:
            sizes, w = node.attr("qkv_hidden_sizes"), ins[1]
            hidden = int(sizes[2]) if sizes else (
                w[1] // 3 if w is not None and len(w) == 2 and isinstance(w[1], int) else None)
            return [[x[0], x[1], hidden]] + [None] * (n_out - 1)
        return [None] * n_out
    if node.domain != "":
        return [None] * n_out
    if op in _SAME and x is not None:
        return [x] + [None] * (n_out - 1)
    if op in _BROADCAST and all(s is not None for s in ins) and ins:
        return [_broadcast(ins)]
    if op == "MatMul" and x is not None and ins[1] is not None:
        return [_matmul(x, ins[1])]
    if op == "Gemm" and x is not None and ins[1] is not None:
        return [_matmul(x, ins[1], bool(node.attr("transA", 0)), bool(node.attr("transB", 0)))]
    if op == "Transpose" and x is not None:
        perm = node.attr("perm") or list(range(len(x)))[::-1]
        return [[x[p] for p in perm]] if len(perm) == len(x) else [None]
    if op == "Reshape":
        return [_reshape(node, x)]
    if op == "Shape" and x is not None:
        start, end = node.attr("start", 0), node.attr("end", None)
        return [[len(x[slice(start, end)])]]
    if op in ("Unsqueeze", "Squeeze") and x is not None:
        axes = _axes(node, model)
        if axes is None:
            return [None]
        if op == "Unsqueeze":
            r = len(x) + len(axes)
            out = list(x)
            for a in sorted(a + r if a < 0 else a for a in axes):
                out.insert(a, 1)
            return [out]
        drop = {a + len(x) if a < 0 else a for a in axes}
        return [[d for i, d in enumerate(x) if i not in drop]]
    if op == "Gather" and x is not None and ins[1] is not None:
        axis = node.attr("axis", 0)
        axis += len(x) if axis < 0 else 0
        return [x[:axis] + ins[1] + x[axis + 1:]]
    if op == "Split" and x is not None:
        axis = node.attr("axis", 0)
        axis += len(x) if axis < 0 else 0
        return [x[:axis] + [None] + x[axis + 1:]] * n_out
    if op == "Concat" and all(s is not None for s in ins):
        axis = node.attr("axis", 0)
        axis += len(x) if axis < 0 else 0
        sizes = [s[axis] for s in ins]
        out = _broadcast(ins)  # the other dimensions agree in a valid model
        out[axis] = sum(sizes) if all(isinstance(d, int) for d in sizes) else None
        return [out]
    if op.startswith("Reduce") and x is not None:
        axes = _axes(node, model)
        if axes is None:
            return [None]
        axes_n = {a + len(x) if a < 0 else a for a in axes}
        if node.attr("keepdims", 1):
            return [[1 if i in axes_n else d for i, d in enumerate(x)]]
        return [[d for i, d in enumerate(x) if i not in axes_n]]
    if op == "Slice" and x is not None:
        return [[None] * len(x)]
    return [_more(node, x, ins)] + [None] * (n_out - 1)


_SPATIAL = {"Conv", "ConvTranspose", "MaxPool", "AveragePool", "LpPool", "ConvInteger"}
_RESIZING = frozenset({"Pad", "Resize", "Upsample"})


def _static_inputs(model: Model) -> bool:
    """Whether the main graph has inputs, each (bar initializers) of known static sizes."""
    sizes = [shape(v) for v in model.graph.inputs if v.const_value is None]
    return bool(model.graph.inputs) and all(
        dims is not None and _product(dims) is not None for dims in sizes)


def _left_unsized(graphs) -> bool:
    """Whether a Pad or a Resize, a Reshape of a window's output, or the last window of a
    graph was left unsized: after a Pad of pads that a constant subgraph computes (PyTorch's
    ZeroPad2d: PadFusion may have taken the Pad into the convolution since) every later
    window is unsized, and the layout level needs the sizes (an SE block's gate is per
    channel only at 1 x 1; SegFormer's image turned to tokens by a Reshape to a computed
    target)."""
    for g in graphs:
        last = None
        for n in g.nodes:
            if n.op_type in _SPATIAL:
                last = n
            elif (n.op_type in _RESIZING or n.op_type == "Reshape" and _reads_window(n)) \
                    and not _settled_outputs(n):
                return True
        if last is not None and not _settled_outputs(last):
            return True
    return False


def _reads_window(node: Node) -> bool:
    """Whether ``node``'s first input is a convolution's or a pool's output."""
    x = node.inputs[0] if node.inputs else None
    return x is not None and x.producer is not None and x.producer.op_type in _SPATIAL


def _settled_outputs(node: Node) -> bool:
    return all(has_settled_shape(v.type) for v in node.outputs if v.name)


def _more(node: Node, x: Dims | None, ins: list[Dims | None]) -> Dims | None:
    """The first output of the remaining operators the refinement knows."""
    op = node.op_type
    if op == "Constant":
        value = _constant(node)
        return None if value is None else list(value.shape)
    if op == "ConstantOfShape":
        items = shape_items(node.inputs[0])
        return None if items is None else [_item_dim(i) for i in items]
    if op == "Range":
        return [None]
    if op == "Size":
        return []
    if x is None:
        return None
    if op in _SPATIAL:
        return _spatial(node, x, ins)
    if op in ("GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool"):
        return x[:2] + [1] * (len(x) - 2)
    if op == "Flatten":
        axis = node.attr("axis", 1)
        axis += len(x) if axis < 0 else 0
        return [_product(x[:axis]), _product(x[axis:])]
    if op == "Pad":
        return _pad(node, x)
    if op in ("Resize", "Upsample"):
        return _resize(node, x)
    if op in ("DepthToSpace", "SpaceToDepth") and len(x) == 4:
        b = node.attr("blocksize")
        if not isinstance(b, int) or b <= 0:
            return [None] * 4
        if op == "DepthToSpace":
            return [x[0], _scaled(x[1], 1, b * b), _scaled(x[2], b, 1), _scaled(x[3], b, 1)]
        return [x[0], _scaled(x[1], b * b, 1), _scaled(x[2], 1, b), _scaled(x[3], 1, b)]
    if op == "Tile":
        repeats = const_value(node.inputs[1]) if len(node.inputs) > 1 else None
        if repeats is None or repeats.size != len(x):
            return [None] * len(x)
        return [_scaled(d, int(r), 1) for d, r in zip(x, repeats.ravel(), strict=True)]
    if op == "Expand":
        items = shape_items(node.inputs[1])
        return None if items is None else _broadcast([x, [_item_dim(i) for i in items]])
    return None


def _ints(values) -> tuple[int, ...] | None:
    if values is None:
        return None
    out = tuple(values)
    return out if all(isinstance(v, int) for v in out) else None


def _scaled(d, times: int, over: int):
    """d * times / over for a known size that divides evenly, else unknown."""
    if not isinstance(d, int) or (d * times) % over:
        return None
    return d * times // over


def _spatial(node: Node, x: Dims, ins: list[Dims | None]) -> Dims:
    """Conv / ConvTranspose / pools: the batch and channels, and the spatial sizes by the
    kernels' own arithmetic (geometry.py) where the input's and the window's are known."""
    op = node.op_type
    w = ins[1] if len(ins) > 1 else None
    if op == "Conv" and w is not None:
        channels = w[0]
    elif op == "ConvTranspose" and w is not None and isinstance(w[1], int):
        channels = w[1] * node.attr("group", 1)
    else:
        channels = x[1] if op not in ("Conv", "ConvTranspose", "ConvInteger") else None
    nd = len(x) - 2
    out = [x[0], channels] + [None] * nd
    spatial = _ints(x[2:])
    kernel = _ints(node.attr("kernel_shape") or ())
    if not kernel and op in ("Conv", "ConvTranspose", "ConvInteger") and w is not None:
        kernel = _ints(w[2:])
    if nd < 1 or spatial is None or not kernel or len(kernel) != nd:
        return out
    strides = _ints(node.attr("strides") or (1,) * nd)
    dilations = _ints(node.attr("dilations") or (1,) * nd)
    pads = _ints(node.attr("pads") or ())
    auto_pad = text_attribute(node.attr("auto_pad", "NOTSET"))
    if strides is None or dilations is None or pads is None or len(strides) != nd or \
            len(dilations) != nd or pads and len(pads) != 2 * nd or \
            min(strides + dilations) <= 0:
        return out
    if op == "ConvTranspose":
        adj = _ints(node.attr("output_padding") or ())
        shape_attr = _ints(node.attr("output_shape") or ())
        if adj is None or shape_attr is None:
            return out
        sizes = transpose_geometry(spatial, kernel, strides, dilations, pads, adj,
                                   shape_attr, auto_pad)[1]
    else:
        pool = op in ("MaxPool", "AveragePool", "LpPool")
        sizes = window_geometry(spatial, kernel, strides, dilations, pads, auto_pad,
                                int(node.attr("ceil_mode", 0)) if pool else 0,
                                dilated_same=not pool)[2]
    return out[:2] + list(sizes)


def _pad(node: Node, x: Dims) -> Dims:
    """Pad: each padded axis grows by its two pads (graph_utils.pad_amounts)."""
    pads = pad_amounts(node, len(x), const_value)
    if pads is None:
        return [None] * len(x)
    out = list(x)
    for a in range(len(x)):
        grow = pads[a] + pads[a + len(x)]
        if grow:
            out[a] = x[a] + grow if isinstance(x[a], int) and x[a] + grow >= 0 else None
    return out


def _resize(node: Node, x: Dims) -> Dims:
    """Resize / Upsample with constant scales or sizes, by the kernel's arithmetic."""
    unknown = [None] * len(x)
    if _ints(x) is None:
        return unknown
    ins = node.inputs
    if node.op_type == "Upsample" or len(ins) == 2:  # (X, scales): Upsample, Resize-10
        scales, sizes = (const_value(ins[1]) if len(ins) > 1 else None), None
        if scales is None:
            scales = np.asarray(node.attr("scales") or (), np.float32)
            if not scales.size:
                return unknown
    else:
        scales = const_value(ins[2]) if len(ins) > 2 and ins[2] is not None else None
        sizes = const_value(ins[3]) if len(ins) > 3 and ins[3] is not None else None
        if (scales is None or not scales.size) and sizes is None:
            return unknown
    if text_attribute(node.attr("coordinate_transformation_mode", "")) == "tf_crop_and_resize":
        return unknown  # (the roi scales the output too)
    axes = node.attr("axes")
    return resize_geometry(tuple(x), scales, sizes, None if axes is None else list(axes),
                           text_attribute(node.attr("keep_aspect_ratio_policy", "stretch")))[0]


def _constant(node: Node):
    for name in ("value", "value_float", "value_int", "value_floats", "value_ints"):
        v = node.attr(name)
        if v is not None:
            return np.asarray(v)
    return None


def _item_dim(item: tuple) -> int | str | None:
    if item[0] == "const":
        return item[1] if item[1] >= 0 else None
    src = shape(item[1])
    return src[item[2]] if src is not None and item[2] < len(src) else None


def _product(dims: Dims) -> int | None:
    out = 1
    for d in dims:
        if not isinstance(d, int):
            return None
        out *= d
    return out


def _type(elem: int, dims: Dims) -> onnx.TypeProto:
    return tensor_type_proto(elem, dims)


@register_pass
class ShapeRefinement(GraphPass):
    name = "ShapeRefinement"
    level = EXTENDED
    order = 1

    def run(self, model: Model) -> PassResult:
        graphs = list(all_graphs(model.graph))
        # Sizes ONNX inference named "unk__N" are looked for (has_settled_shape) in a graph
        # of static inputs, where every size can be found: then ConstantFolding takes every
        # Shape (and what it feeds) and the fusions see through (LeViT's MatMul -> Flatten ->
        # BatchNormalization had a Shape read beside it); else where _left_unsized says.
        # Elsewhere they are sequence lengths no rule here finds: asking of every value cost
        # BERT-base's creation 4 ms, reading every value's dimensions 1 ms
        unsized = _static_inputs(model) or _left_unsized(graphs)
        settled = has_settled_shape if unsized else has_shape
        foldable = False
        for graph in graphs:
            for node in graph.nodes:
                foldable |= self._refine(model, node, settled)
        # Types only: no node changed, so this alone asks for another round only where a
        # Shape (or Size) now reads a static size, which ConstantFolding then takes (BiT kept
        # 42 Shape nodes, and the Reshapes they fed computed their targets every run)
        return PassResult(foldable)

    def _refine(self, model: Model, node: Node, settled=has_settled_shape) -> bool:
        """Refine ``node``'s outputs' types; whether one became static under a Shape / Size
        reader (something for ConstantFolding)."""
        targets = [v for v in node.outputs
                   if v.name and not settled(v.type) and not is_graph_output(v)]
        if not targets:
            return False
        ins = [shape(v) if v is not None else None for v in node.inputs]
        try:
            outs = _infer(model, node, ins)
        except (TypeError, ValueError, IndexError):
            return False  # a malformed node: leave it to the run to report
        foldable = False
        for i, v in enumerate(node.outputs):
            if v not in targets or i >= len(outs) or outs[i] is None:
                continue
            dims = outs[i]
            if has_shape(v.type):  # partly known (ONNX inference stopped at a Pad or a
                # Resize of computed pads or scales, naming the sizes it did not know
                # "unk__N"): a size found here replaces an unknown or a symbol, nothing else
                known = shape(v)
                if known is None or len(known) != len(dims) or any(
                        isinstance(k, int) and isinstance(d, int) and k != d
                        for k, d in zip(known, dims, strict=True)):
                    continue
                dims = [d if isinstance(d, int) else k for k, d in zip(known, dims, strict=True)]
                if dims == known:
                    continue
            elem = elem_type(v) or _elem_of(node)
            if elem is not None:
                v.type = _type(elem, dims)
                foldable |= all(isinstance(d, int) for d in dims) and any(
                    u.op_type in ("Shape", "Size") and u.domain == "" for u, _ in v.uses)
        return foldable


def _value_elem(node: Node) -> int | None:
    value = _constant(node)
    if value is None:
        return onnx.TensorProto.FLOAT if node.op_type == "ConstantOfShape" else None
    try:
        return array_elem_type(value.dtype)
    except TypeError:
        return None


_elem_rules: dict[str, Callable[[Node], int | None]] = {
    "Shape": lambda n: onnx.TensorProto.INT64,
    "Size": lambda n: onnx.TensorProto.INT64,
    "Cast": lambda n: n.attr("to"),
    "Constant": _value_elem,
    "ConstantOfShape": _value_elem,
}


def _elem_of(node: Node) -> int | None:
    """The element type of the outputs _infer gives shapes to."""
    if node.op_type in _BOOL_OUT:
        return onnx.TensorProto.BOOL
    rule = _elem_rules.get(node.op_type)
    if rule is not None:
        return rule(node)
    if node.inputs:
        return elem_type(node.inputs[1] if node.op_type == "Where" else node.inputs[0])
    return None
