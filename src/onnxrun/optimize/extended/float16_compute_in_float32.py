"""Float16ComputeInFloat32: a float16 / bfloat16 model computes in float32, with Casts only at
its graph inputs and outputs.

Why: numpy has no half-precision BLAS and converts float16 / bfloat16 element by element, so a
model run op by op in float16 is 2.5-3x slower than its float32 original. onnxruntime's CPU
provider does the equivalent for the operators it has no float16 kernel for
(InsertCastTransformer, whose Cast pairs between consecutive such nodes are then removed).

What changes, in the main graph and every If/Loop/Scan body alike, so loop state and branch
outputs stay consistent:
- 16-bit float initializers become float32 copies (once, at session creation);
- a 16-bit float graph input gets a Cast to float32 right after it (Casts that read it directly
  need none); a 16-bit float graph output gets a Cast back right before it, under its own name,
  so callers see the names and dtypes the model declares;
- tensors held in attributes (Constant, ConstantOfShape, LabelEncoder, TreeEnsemble...) and the
  element types attributes choose (Cast ``to``, ``dtype`` of RandomNormal/EyeLike/Bernoulli/
  SequenceEmpty..., DequantizeLinear ``output_dtype``, window ``output_datatype``, ``stash_type``,
  Optional ``type``) become float32;
- the value types on the IR follow, so the later fusions (which ask for float32) fire.

Precision: every intermediate keeps float32 precision instead of being rounded to 16 bits after
each op; that includes explicit mid-graph ``Cast(to=FLOAT16)`` nodes, which become Casts to
float32 (then removed as no-ops). That is what onnxruntime's CPU provider computes for the ops it
wraps in Casts, and keeping one rounding at explicit Casts while dropping it after every other op
would not reproduce the float16 run anyway. Results are therefore at least as accurate as the
float16 run's, within float16 tolerance of it, not bit-identical; values that would overflow
float16 (beyond 65504) stay finite. QuantizeLinear / DequantizeLinear with 16-bit scales are
kept: onnxruntime computes those in float32 too.

Not fired: models that hold no 16-bit float data (no such initializer, attribute tensor, graph
input or output): a float32 model's explicit round trips through float16 are its intent.
Refused (model unchanged, reason logged at debug level): BitCast (bit patterns depend on the
exact type), Casts to string of 16-bit values (the text differs), nodes of domains whose kernels
are unknown here, 16-bit sequence / optional / map graph inputs or outputs, and graph inputs or
outputs of unknown type.
"""

from __future__ import annotations

import logging
from collections import Counter

import numpy as np

from ...dtypes import BFLOAT16
from ...ir import Attribute, Graph, Model, Node, Value
from ...proto import onnx
from ..base import EXTENDED, GraphPass, PassResult, register_pass
from ..graph_utils import all_graphs, unique_name

AttributeProto = onnx.AttributeProto
TensorProto = onnx.TensorProto

logger = logging.getLogger("onnxrun")

LOW = frozenset({TensorProto.FLOAT16, TensorProto.BFLOAT16})
FLOAT = TensorProto.FLOAT
_LOW_DTYPES = (np.dtype(np.float16), BFLOAT16)

# ai.onnx attributes that name an element type (of the output, or of the computation).
_TYPE_ATTRS = frozenset({"to", "dtype", "output_dtype", "output_datatype", "stash_type"})
# Domains whose kernels are onnxrun's own: they compute in whatever float type they are given.
_KNOWN_DOMAINS = frozenset({"", "ai.onnx.ml", "com.microsoft", "ai.onnxrun", "ai.onnx.preview",
                            "ai.onnx.preview.training"})


# -- types ---------------------------------------------------------------------------------------


def _has_low(tp: onnx.TypeProto | None) -> bool:
    if tp is None:
        return False
    kind = tp.WhichOneof("value")
    if kind in ("tensor_type", "sparse_tensor_type"):
        return getattr(tp, kind).elem_type in LOW
    if kind in ("sequence_type", "optional_type"):
        return _has_low(getattr(tp, kind).elem_type)
    if kind == "map_type":
        return _has_low(tp.map_type.value_type)
    return False


def _to_float32(tp: onnx.TypeProto) -> onnx.TypeProto:
    """A copy of ``tp`` with every 16-bit float element type float32 (shapes kept). Types may
    be shared between values (and a graph output must keep its own), so never edit in place."""
    out = onnx.TypeProto()
    out.CopyFrom(tp)
    stack = [out]
    while stack:
        t = stack.pop()
        kind = t.WhichOneof("value")
        if kind in ("tensor_type", "sparse_tensor_type"):
            inner = getattr(t, kind)
            if inner.elem_type in LOW:
                inner.elem_type = FLOAT
        elif kind in ("sequence_type", "optional_type"):
            stack.append(getattr(t, kind).elem_type)
        elif kind == "map_type":
            stack.append(t.map_type.value_type)
    return out


def _tensor_elem(v: Value | None) -> int | None:
    tp = v.type if v is not None else None
    if tp is None or tp.WhichOneof("value") != "tensor_type":
        return None
    return tp.tensor_type.elem_type or None


def _is_low_array(a: object) -> bool:
    return isinstance(a, np.ndarray) and a.dtype in _LOW_DTYPES


def _float32(a: np.ndarray) -> np.ndarray:
    out = a.astype(np.float32)
    out.flags.writeable = False
    return out


# -- what the model holds ------------------------------------------------------------------------


def _low_tensor_attr(a: Attribute) -> bool:
    if a.type in (AttributeProto.TENSOR, AttributeProto.SPARSE_TENSOR):
        return _is_low_array(a.value)
    if a.type in (AttributeProto.TENSORS, AttributeProto.SPARSE_TENSORS):
        return any(_is_low_array(x) for x in a.value or ())
    return False


def _holds_low_data(model: Model) -> bool:
    """The model stores 16-bit float data or declares 16-bit graph inputs / outputs."""
    g = model.graph
    if any(_has_low(v.type) for v in (*g.inputs, *g.outputs)):
        return True
    for graph in all_graphs(g):
        if any(_is_low_array(v.const_value) for v in graph.initializers.values()):
            return True
        for node in graph.nodes:
            if any(_low_tensor_attr(a) for a in node.attributes.values()):
                return True
    return False


def _refusal(model: Model) -> str | None:
    """Why the model cannot be converted safely, or None."""
    g = model.graph
    for v in (*g.inputs, *g.outputs):
        if v.type is None or v.type.WhichOneof("value") is None or (
                v.type.WhichOneof("value") == "tensor_type" and not _tensor_elem(v)):
            return f"graph input/output '{v.name}' has no known type: its Cast cannot be chosen"
        if _has_low(v.type) and v.type.WhichOneof("value") != "tensor_type":
            return f"graph input/output '{v.name}' is a non-tensor of 16-bit floats"
    for node in g.all_nodes():
        if node.domain not in _KNOWN_DOMAINS:
            return f"node '{node.label}' is of domain '{node.domain}', whose kernels may need " \
                   "the exact 16-bit type"
        if node.domain != "":
            continue
        if node.op_type == "BitCast":
            return f"BitCast '{node.label}' reinterprets the bits of the exact type"
        if node.op_type in ("Cast", "CastLike") and node.inputs and node.inputs[0] is not None:
            target = node.attr("to") if node.op_type == "Cast" else _tensor_elem(
                node.inputs[1] if len(node.inputs) > 1 else None)
            src = _tensor_elem(node.inputs[0])
            if target == TensorProto.STRING and (src is None or src in LOW):
                return f"'{node.label}' casts a 16-bit float (or untyped) value to string"
    return None


# -- the rewrite ---------------------------------------------------------------------------------


def _is_cast(node: Node) -> bool:
    return node.op_type == "Cast" and node.domain == ""


def _redirect(old: Value, new: Value, skip_casts: bool = False) -> None:
    """Make every node that reads ``old`` (at any depth) read ``new``; unlike
    replace_all_uses_with, the graph's output list keeps ``old``. (A subgraph cannot list an
    outer value as its output: onnx's checker refuses it at load.)"""
    for node, idx in list(old.uses):
        if not (skip_casts and _is_cast(node)):
            node.set_input(idx, new)


def _new_cast(graph: Graph, x: Value, out: Value, to: int, base: str) -> Node:
    node = Node("Cast", [x], [out], {"to": Attribute("to", AttributeProto.INT, to)},
                name=unique_name(graph, base))
    node.graph = graph
    return node


def _convert_attributes(node: Node, keep: set[int], changes: Counter) -> None:
    for name, a in list(node.attributes.items()):
        if a.ref_attr_name:
            continue
        value = a.value
        if _low_tensor_attr(a):
            if isinstance(value, list):
                value = [_float32(x) if _is_low_array(x) else x for x in value]
            else:
                value = _float32(value)
            node.attributes[name] = Attribute(name, a.type, value)
            changes["attribute tensors"] += 1
        elif (a.type == AttributeProto.INT and value in LOW and node.domain == ""
              and name in _TYPE_ATTRS and id(node) not in keep):
            node.attributes[name] = Attribute(name, a.type, FLOAT)
            changes[f"{node.op_type} {name}"] += 1
        elif a.type == AttributeProto.TYPE_PROTO and _has_low(value):
            node.attributes[name] = Attribute(name, a.type, _to_float32(value))
            changes["attribute types"] += 1
        elif a.type == AttributeProto.TYPE_PROTOS and any(_has_low(t) for t in value):
            node.attributes[name] = Attribute(name, a.type, [_to_float32(t) for t in value])
            changes["attribute types"] += 1


def _convert(model: Model) -> Counter:
    changes: Counter = Counter()
    root = model.graph
    main_inputs = {id(v) for v in root.inputs}
    main_outputs: dict[int, Value] = {id(v): v for v in root.outputs}
    keep: set[int] = set()  # ids of the Casts that produce 16-bit graph outputs
    kept_inits: set[int] = set()  # ids of 16-bit initializers that stay (graph outputs)

    # Graph outputs: a Cast back to the declared type, right after the float32 producer.
    for v in main_outputs.values():
        elem = _tensor_elem(v)
        if elem not in LOW or id(v) in main_inputs:
            continue
        n = v.producer
        if n is None:
            if v.const_value is None:
                continue  # an outer value cannot be a main graph output
            kept_inits.add(id(v))
            if v.uses:  # the nodes reading it get a float32 copy
                copy = Value(unique_name(root, f"{v.name}_float32"), type=_to_float32(v.type),
                             const_value=_float32(v.const_value), graph=root)
                root.initializers[copy.name] = copy
                _redirect(v, copy)
                changes["initializers"] += 1
            continue
        if _is_cast(n) and n.attr("to") == elem and not v.uses:
            keep.add(id(n))  # already the boundary
            continue
        new = Value(unique_name(root, f"{v.name}_float32"), type=_to_float32(v.type), graph=root)
        n.outputs[v.output_index] = new
        new.producer, new.output_index = n, v.output_index
        _redirect(v, new)
        cast = _new_cast(root, new, v, elem, f"{v.name}_cast_to_{_elem_name(elem)}")
        keep.add(id(cast))
        root.nodes.insert(root.nodes.index(n) + 1, cast)
        changes["graph outputs"] += 1

    # Graph inputs: a Cast to float32 first; Casts already reading them need none.
    position = 0
    for v in root.inputs:
        if _tensor_elem(v) not in LOW:
            continue
        if all(_is_cast(n) for n, _ in v.uses):
            continue
        new = Value(unique_name(root, f"{v.name}_float32"), type=_to_float32(v.type), graph=root)
        _redirect(v, new, skip_casts=True)
        root.nodes.insert(position, _new_cast(root, v, new, FLOAT, f"{v.name}_cast_to_float"))
        position += 1
        changes["graph inputs"] += 1

    # Every graph: initializers, subgraph inputs, attributes, value types.
    for graph in all_graphs(root):
        is_root = graph is root
        for v in graph.initializers.values():
            if not _is_low_array(v.const_value) or id(v) in kept_inits:
                continue
            if is_root and id(v) in main_inputs:
                continue  # a default a caller may override: read through its input Cast
            v.const_value = _float32(v.const_value)
            v.type = _to_float32(v.type) if v.type is not None else None
            changes["initializers"] += 1
        if not is_root:
            for v in graph.inputs:
                if _has_low(v.type):
                    v.type = _to_float32(v.type)
                    changes["value types"] += 1
        for name, tp in list(graph.value_info.items()):
            if _has_low(tp):
                graph.value_info[name] = _to_float32(tp)
        for node in graph.nodes:
            _convert_attributes(node, keep, changes)
            for v in node.outputs:
                if is_root and id(v) in main_outputs:
                    continue  # keeps its declared type: a boundary Cast or input produces it
                if _has_low(v.type):
                    v.type = _to_float32(v.type)
                    changes["value types"] += 1
    return changes


def _elem_name(elem: int) -> str:
    return "float16" if elem == TensorProto.FLOAT16 else "bfloat16"


@register_pass
class Float16ComputeInFloat32(GraphPass):
    name = "Float16ComputeInFloat32"
    level = EXTENDED
    order = 0  # before every fusion, so that they see float32 patterns

    def run(self, model: Model) -> PassResult:
        if not _holds_low_data(model):
            return PassResult(False)
        reason = _refusal(model)
        if reason is not None:
            logger.debug("%s: model left in 16-bit floats: %s", self.name, reason)
            return PassResult(False)
        changes = _convert(model)
        return PassResult(bool(changes), changes)
