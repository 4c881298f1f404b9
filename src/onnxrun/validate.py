"""Step 2 of a session: check the model's structure and types, and infer shapes.

onnx's checker and shape inference run on a *skeleton* of the model: the same graph with the
top-level initializers turned into typed graph inputs. That keeps validation's cost independent of
the weights' size (the checker would otherwise serialize every weight), while the weights' own
consistency is checked when the loader reads them.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Callable, Iterator, Sequence

from . import validate_cache
from .dtypes import elem_type, has_negative_dim, type_shape, type_string, without_negative_dims
from .errors import InvalidGraph
from .ir import Graph, Model
from .ir.toposort import stable_topological_order
from .proto import HAVE_ONNX, onnx
from .validate_types import check_types

logger = logging.getLogger("onnxrun")

# The newest IR version and operator sets onnxrun accepts: those of the onnx package it checks
# and infers with (as onnxruntime accepts those of the onnx it was built with; without onnx,
# those of the onnx that proto/onnx_pb.py was generated from), and onnxruntime's own
# com.microsoft set. Other domains are custom: any version.
_MAX_IR = onnx.IR_VERSION
# The newest operator set of each domain in onnx 1.17, the oldest onnx onnxrun supports (or
# lower): a model that imports none newer passes check_versions without asking the installed
# onnx, whose import (~100 ms) a session of a validated model file does not otherwise need.
_OLDEST_ONNX_OPSETS = {"": 22, "ai.onnx.ml": 4, "ai.onnx.training": 1,
                       "ai.onnx.preview.training": 1, "com.microsoft": 1}


@functools.cache
def _newest_opsets() -> dict[str, int]:
    newest = dict(onnx.NEWEST_OPSETS) if not HAVE_ONNX else {
        ("" if domain == "ai.onnx" else domain): versions[1]
        for domain, versions in onnx.defs.C.schema_version_map().items()
    }
    newest["com.microsoft"] = 1
    return newest


_GENERATED = re.compile(r"unk__\d+")
# A negative int64 is a 10-byte varint; after tag 0x08 (field 1, a varint) it is how a negative
# TensorShapeProto.Dimension.dim_value is written. Looked for in the skeleton's bytes, so a model
# without one pays no walk over its value types (a false match only costs that walk).
_NEGATIVE_FIELD_1 = re.compile(rb"\x08[\x80-\xff]{9}\x01")


def skeleton(mp: onnx.ModelProto, presorted: bool = False) -> onnx.ModelProto:
    """The model without its weights (see the module's doc). ``presorted``: the caller knows the
    nodes are listed in a topological order, so they are copied as they are."""
    skel = onnx.ModelProto()
    for fd, value in mp.ListFields():
        if fd.name != "graph":
            if getattr(fd, "is_repeated", None) or getattr(fd, "label", 0) == 3:
                getattr(skel, fd.name).extend(value)
            elif fd.message_type is not None:
                getattr(skel, fd.name).CopyFrom(value)
            else:
                setattr(skel, fd.name, value)
    src, dst = mp.graph, skel.graph
    dst.name, dst.doc_string = src.name, src.doc_string
    dst.node.extend(src.node if presorted else _sorted_nodes(src.node))
    dst.input.extend(src.input)
    dst.output.extend(src.output)
    dst.value_info.extend(src.value_info)
    declared = {vi.name for vi in src.input}
    for t in src.initializer:
        if t.name not in declared:
            _add_input(dst, t.name, t.data_type, t.dims)
    for sp in src.sparse_initializer:
        if sp.values.name not in declared:
            _add_input(dst, sp.values.name, sp.values.data_type, sp.dims)
    return skel


def _add_input(graph: onnx.GraphProto, name: str, elem_type: int, dims) -> None:
    """A tensor input of that type and shape: what helper.make_tensor_value_info makes, field
    by field (a third of its cost; once per initializer, every session)."""
    vi = graph.input.add()
    vi.name = name
    t = vi.type.tensor_type
    t.elem_type = elem_type
    shape = t.shape
    shape.SetInParent()
    for d in dims:
        shape.dim.add().dim_value = d


def _int_tensor(arr, name: str) -> onnx.TensorProto:
    """numpy_helper.from_array for an integer array (the same fields and bytes, without its
    dispatch: once per small constant, every session)."""
    t = onnx.TensorProto()
    t.name = name
    t.data_type = elem_type(arr.dtype)
    t.dims.extend(arr.shape)
    t.raw_data = arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()
    return t


def _sorted_nodes(nodes: Sequence[onnx.NodeProto]) -> list[onnx.NodeProto]:
    """The nodes in a topological order, stable (a sorted list comes back unchanged).

    onnxruntime runs graphs whose nodes are listed out of order, onnx's checker refuses them: it
    checks this order instead. A node depends on what it and its subgraphs read.
    """
    producer = {name: i for i, n in enumerate(nodes) for name in n.output if name}
    deps = [{producer[name] for name in _reads(n) if name in producer} for n in nodes]
    order, stuck = stable_topological_order(deps)
    if stuck:
        names = [nodes[i].name or nodes[i].output[0] for i in stuck][:5]
        raise InvalidGraph(f"the graph has a cycle (nodes involved: {names})")
    return [nodes[i] for i in order]


def _ir_sorted(graph: Graph) -> bool:
    """Whether the IR's nodes (the proto's, in the same order) are already in a topological
    order: the common case, checked on the IR without the cost of reading every NodeProto."""
    done: set[int] = set()
    for node in graph.nodes:
        reads = node.inputs
        subs = node.subgraphs()
        if subs:
            reads = [*reads, *(v for sub in subs for v in sub.outer_references())]
        for v in reads:
            if v is not None and v.producer is not None and v.producer.graph is graph and (
                id(v.producer) not in done
            ):
                return False
        done.add(id(node))
    return True


def _reads(node: onnx.NodeProto) -> set[str]:
    names = {name for name in node.input if name}
    for a in node.attribute:
        for g in [a.g] if a.HasField("g") else a.graphs:
            for sub in g.node:
                names |= _reads(sub)
    return names


# Operators onnxrun runs but onnx's checker does not accept at the model's opset: onnxruntime's
# own ai.onnx-domain ops (LayerNormalization before opset 17, SimplifiedLayerNormalization, which
# its optimizer writes) and deprecated versions onnxruntime still runs (GroupNormalization-18).
# They are checked under a private domain the checker does not know, so it skips them.
_UNCHECKED_DOMAIN = "onnxrun.unchecked"


def _ai_onnx_opset(skel: onnx.ModelProto) -> int | None:
    return next((o.version for o in skel.opset_import if o.domain in ("", "ai.onnx")), None)


def _hide_unknown_ai_onnx_ops(
    skel: onnx.ModelProto, has_kernel: Callable[[str, int], bool]
) -> set[str]:
    """Move the operators of _UNCHECKED_DOMAIN's kind there; returns their types."""
    opset = _ai_onnx_opset(skel)
    if opset is None:
        return set()
    hidden: set[str] = set()
    hide: dict[str, bool] = {}  # op_type -> whether to hide it (one schema lookup per type)
    for node in _all_node_protos(skel.graph):
        if node.domain not in ("", "ai.onnx"):
            continue
        op_type = node.op_type
        h = hide.get(op_type)
        if h is None:
            try:
                known = not onnx.defs.get_schema(op_type, opset, "").deprecated
            except onnx.defs.SchemaError:
                known = False
            h = hide[op_type] = not known and has_kernel(op_type, opset)
        if h:
            node.domain = _UNCHECKED_DOMAIN
            hidden.add(op_type)
    if hidden:
        skel.opset_import.add(domain=_UNCHECKED_DOMAIN, version=1)
    return hidden


def _all_node_protos(g: onnx.GraphProto):
    for node in g.node:
        yield node
        for a in node.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                yield from _all_node_protos(a.g)
            elif a.type == onnx.AttributeProto.GRAPHS:
                for sub in a.graphs:
                    yield from _all_node_protos(sub)


def validate(
    mp: onnx.ModelProto,
    model: Model,
    *,
    infer_shapes: bool = True,
    has_kernel: Callable[[str, int], bool] | None = None,
    released_opsets_only: bool = True,
    min_inputs: Callable[[str, int], int | None] | None = None,
    cache: bool = False,
) -> None:
    """Raise InvalidGraph if the model is malformed; fill in inferred value types on the IR.

    ``has_kernel(op_type, opset)`` says whether a provider runs an ai.onnx operator that onnx
    itself does not define at that opset (see _UNCHECKED_DOMAIN). ``released_opsets_only``
    (onnxruntime's ``session.allow_released_opsets_only``): refuse operator sets newer than
    onnxrun knows. ``min_inputs(op_type, opset)``: how many inputs an ai.onnx operator's
    kernel needs at the least (None: no kernel), for the checks without onnx. ``cache``: look
    the skeleton up in, and store an acceptance to, the validation cache
    (validate_cache.py)."""
    check_versions(model, released_opsets_only)
    if not HAVE_ONNX:
        # No checker or shape inference (Pyodide): onnxrun's own checks of what the kernels
        # would otherwise meet at run time (unknown operators and missing attributes are
        # refused when the session plans its kernels).
        if has_kernel is not None:
            _check_known_ops(model, has_kernel)
        if min_inputs is not None:
            _check_input_counts(model, min_inputs)
        check_types(model)
        return
    # The IR lists the proto's nodes in its order (unless the caller sorted the proto since).
    presorted = len(model.graph.nodes) == len(mp.graph.node) and _ir_sorted(model.graph)
    skel = skeleton(mp, presorted)
    _add_shape_constants(skel, model)
    data = skel.SerializeToString()  # once, for the cache's key, the checker and the inference
    if _NEGATIVE_FIELD_1.search(data) and _unknown_negative_dims(skel, model):
        data = skel.SerializeToString()
    entry_key = validate_cache.key(data, infer_shapes) if cache else None
    if _cached(entry_key, skel, model, has_kernel):
        return
    hidden = _hide_unknown_ai_onnx_ops(skel, has_kernel) if has_kernel is not None else set()
    if hidden:
        data = skel.SerializeToString()
    checked = _with_ranks(skel)
    try:
        onnx.checker.check_model(data if checked is skel else checked, full_check=False)
    except onnx.checker.ValidationError as e:
        raise InvalidGraph(f"model failed validation: {_first_line(e)}") from None
    if not infer_shapes:
        validate_cache.write(entry_key, hidden, None)
        return
    try:
        inferred = _infer(data)
    except InvalidGraph:
        # Declared types that disagree with inference: onnxruntime warns and merges leniently,
        # so a model it loads (the genai builder's value_info on a Constant among them) loads.
        lenient = _without_conflicting_declarations(skel, model)
        if lenient is None:
            raise
        lenient, reported = lenient
        inferred = _infer(lenient.SerializeToString())
        entry_key = None  # the IR's declarations were changed: not a result to replay
    else:
        reported = {}
    types = None if inferred is None else _inferred_types(inferred)
    if types is not None:
        _apply_value_info(model, types)
    validate_cache.write(entry_key, hidden, types)
    for g in _graphs(model.graph):
        for v in g.outputs:
            if v.name in reported:
                v.type = reported[v.name]


def _cached(entry_key: str | None, skel: onnx.ModelProto, model: Model,
            has_kernel: Callable[[str, int], bool] | None) -> bool:
    """Whether the validation cache accepted this skeleton: then its inferred types are on the
    IR. The operators it hid from the checker must still be run by a provider here."""
    found = validate_cache.read(entry_key)
    if found is None:
        return False
    hidden, types = found
    if hidden:
        opset = _ai_onnx_opset(skel)
        if has_kernel is None or opset is None or not all(
                has_kernel(op_type, opset) for op_type in hidden):
            return False
    if types is not None:
        _apply_value_info(model, types)
    return True


def _infer(data: bytes) -> onnx.ModelProto | None:
    """Strict type and shape inference on the skeleton's bytes; None where onnx cannot infer."""
    try:
        return onnx.shape_inference.infer_shapes(data, check_type=True, strict_mode=True)
    except onnx.shape_inference.InferenceError as e:
        if str(e).count("Inference error(s)") <= 1:
            raise InvalidGraph(f"type/shape inference failed: {_first_line(e)}") from None
        # The error is inside a function body's own inference (onnx cannot infer through some
        # bodies whose optional attributes are unset, e.g. MeanVarianceNormalization without
        # axes): a limit of the inference, not a fault of the model. Infer what can be inferred.
        logger.debug("strict shape inference failed inside a function body: %s", e)
        try:
            return onnx.shape_inference.infer_shapes(data, check_type=True)
        except Exception as e2:
            logger.debug("shape inference skipped: %s", e2)
            return None
    except Exception as e:  # shape inference itself can fail on exotic graphs: not fatal
        logger.debug("shape inference skipped: %s", e)
        return None


def _without_conflicting_declarations(
    skel: onnx.ModelProto, model: Model
) -> tuple[onnx.ModelProto, dict[str, onnx.TypeProto]] | None:
    """The skeleton without the declared shapes that contradict inference, or None if no
    declaration does (the inference error is then the model's own).

    What onnxruntime does: a value_info or graph output whose shape disagrees with the inferred
    one (another rank, another size) is a warning, and its shape is merged leniently; a
    Constant's declared type is ignored altogether (Constants become initializers); another
    node output declared with another element type is an error. Here the conflicting
    value_info is dropped (the IR takes the inferred type), and a graph output reports the
    union of both shapes, as onnxruntime's ``get_outputs`` does (the returned dict)."""
    bare = onnx.ModelProto()
    bare.CopyFrom(skel)
    for gp in _graph_protos(bare.graph):
        del gp.value_info[:]
        for vi in gp.output:
            vi.ClearField("type")
    try:
        try:
            inferred = onnx.shape_inference.infer_shapes(bare, check_type=True, strict_mode=True)
        except onnx.shape_inference.InferenceError:
            inferred = onnx.shape_inference.infer_shapes(bare, check_type=True)
    except Exception:
        return None
    types = {
        vi.name: vi.type
        for gp in _graph_protos(inferred.graph) for vi in [*gp.value_info, *gp.output]
    }
    producers = {
        name: node for gp in _graph_protos(skel.graph) for node in gp.node for name in node.output
    }
    conflicts: dict[str, tuple[onnx.TypeProto, onnx.TypeProto]] = {}
    for gp in _graph_protos(skel.graph):
        for vi in [*gp.value_info, *gp.output]:
            got = types.get(vi.name)
            if got is None or not (vi.type.HasField("tensor_type") and got.HasField("tensor_type")):
                continue
            node = producers.get(vi.name)
            have_elem, got_elem = vi.type.tensor_type.elem_type, got.tensor_type.elem_type
            if have_elem and got_elem and have_elem != got_elem:
                if node is not None and node.op_type != "Constant":
                    raise InvalidGraph(
                        f"Type Error: Type ({type_string(vi.type)}) of output arg ({vi.name}) "
                        f"of node ({node.name}) does not match expected type "
                        f"({type_string(got)})."
                    )
                conflicts[vi.name] = (vi.type, got)
            elif _shapes_conflict(vi.type, got):
                conflicts[vi.name] = (vi.type, got)
    if not conflicts:
        return None
    names = list(conflicts)
    logger.warning(
        "%d declared type(s) disagree with type/shape inference and are replaced by the "
        "inferred ones (onnxruntime merges them leniently): %s%s", len(names),
        ", ".join(f"'{n}' declared {type_shape(conflicts[n][0])}, inferred "
                  f"{type_shape(conflicts[n][1])}" for n in names[:5]),
        " ..." if len(names) > 5 else "")
    lenient = onnx.ModelProto()
    lenient.CopyFrom(skel)
    for gp in _graph_protos(lenient.graph):
        kept = [vi for vi in gp.value_info if vi.name not in conflicts]
        del gp.value_info[:]
        gp.value_info.extend(kept)
        for vi in gp.output:
            if vi.name in conflicts and vi.type.HasField("tensor_type"):
                vi.type.tensor_type.ClearField("shape")
    reported: dict[str, onnx.TypeProto] = {}
    for g in _graphs(model.graph):
        outputs = {v.name for v in g.outputs}
        for node in g.nodes:
            for v in node.outputs:
                if v.name in conflicts and v.name not in outputs:
                    v.type = None  # the inferred type replaces it
        for name in list(g.value_info):
            if name in conflicts:
                del g.value_info[name]
        for v in g.outputs:
            if v.name in conflicts:
                reported[v.name] = _union(*conflicts[v.name])
    return lenient, reported


def _shapes_conflict(declared: onnx.TypeProto, inferred: onnx.TypeProto) -> bool:
    """Whether onnx's shape merge refuses the pair: another rank, or two different sizes."""
    a, b = declared.tensor_type, inferred.tensor_type
    if not (a.HasField("shape") and b.HasField("shape")):
        return False
    if len(a.shape.dim) != len(b.shape.dim):
        return True
    return any(
        d.WhichOneof("value") == "dim_value" and i.WhichOneof("value") == "dim_value"
        and d.dim_value != i.dim_value
        for d, i in zip(a.shape.dim, b.shape.dim, strict=True)
    )


def _union(declared: onnx.TypeProto, inferred: onnx.TypeProto) -> onnx.TypeProto:
    """onnxruntime's lenient merge of a declared shape with an inferred one: another rank
    leaves the rank unknown, a size on which they differ becomes unknown."""
    tp = onnx.TypeProto()
    tp.CopyFrom(inferred)
    t = tp.tensor_type
    have = declared.tensor_type.shape.dim
    if len(have) != len(t.shape.dim):
        t.ClearField("shape")
        return tp
    for d, i in zip(have, t.shape.dim, strict=True):
        if d.WhichOneof("value") != i.WhichOneof("value") or (
            d.dim_value != i.dim_value or d.dim_param != i.dim_param
        ):
            i.Clear()
    return tp


def _check_known_ops(model: Model, has_kernel: Callable[[str, int], bool]) -> None:
    """Without onnx's schemas: an ai.onnx operator no provider runs is refused with the
    checker's words (onnxruntime's InvalidGraph), not later by the partitioner."""
    opset = model.opset("")
    if opset is None:
        return
    seen: set[str] = set()
    for g in _graphs(model.graph):
        for node in g.nodes:
            if node.domain == "" and node.op_type not in seen:
                if not has_kernel(node.op_type, opset):
                    raise InvalidGraph(
                        f"model failed validation: No Op registered for {node.op_type} with "
                        f"domain_version of {opset} (node '{node.label}')"
                    )
                seen.add(node.op_type)


def _check_input_counts(model: Model, min_inputs: Callable[[str, int], int | None]) -> None:
    """Without onnx's schemas: a node with fewer inputs than its kernel needs is refused as the
    checker refuses it (InvalidGraph), not met later by an optimizer pass or the run. The
    kernels need no more than the schemas' minimum (tests/test_without_onnx.py checks)."""
    opset = model.opset("")
    if opset is None:
        return
    needs: dict[str, int | None] = {}
    for g in _graphs(model.graph):
        for node in g.nodes:
            if node.domain != "":
                continue
            if node.op_type not in needs:
                needs[node.op_type] = min_inputs(node.op_type, opset)
            least = needs[node.op_type]
            if least is not None and len(node.inputs) < least:
                raise InvalidGraph(
                    f"model failed validation: Node({node.label}) of type {node.op_type} "
                    f"(opset {opset}) has input size {len(node.inputs)}, fewer than the "
                    f"{least} it needs"
                )


def check_versions(model: Model, released_opsets_only: bool = True) -> None:
    """Refuse an IR version or operator set newer than onnxrun knows, as onnxruntime does: a
    newer version may change what an operator means, and running it with the older meaning
    would give silently wrong results."""
    if model.ir_version > _MAX_IR:
        raise InvalidGraph(
            f"Unsupported model IR version: {model.ir_version}, max supported IR version: "
            f"{_MAX_IR}"
        )
    if not released_opsets_only:
        return
    for domain, version in model.opset_imports.items():
        floor = _OLDEST_ONNX_OPSETS.get(domain)
        if floor is None and not domain.startswith("ai.onnx") or version <= (floor or 0):
            continue  # a custom domain, or an operator set every onnx knows
        newest = _newest_opsets().get(domain)
        if newest is not None and version > newest:
            raise InvalidGraph(
                f"the model imports opset {version} of domain '{domain or 'ai.onnx'}', newer "
                f"than onnxrun supports: the newest is opset {newest} (the session config "
                "entry 'session.allow_released_opsets_only' = '0' lifts this check)"
            )


def unknown_negative_dims(graph: onnx.GraphProto) -> bool:
    """A negative dimension size in a declared type means "any size" (Paddle2ONNX writes -1;
    onnxruntime accepts any size there). Make each one in ``graph`` (inputs, outputs and
    value_info, subgraphs included) an unknown dimension, in place, so onnx's shape inference
    infers it rather than conflicting with it. Returns whether there was one."""
    found = False
    for gp in _graph_protos(graph):
        for vi in [*gp.input, *gp.output, *gp.value_info]:
            if has_negative_dim(vi.type):
                vi.type.CopyFrom(without_negative_dims(vi.type))
                found = True
    return found


def _unknown_negative_dims(skel: onnx.ModelProto, model: Model) -> bool:
    """unknown_negative_dims on the skeleton, and the same in the IR, so feeds, reported
    shapes, the optimizer and a saved model see unknown dimensions too."""
    if not unknown_negative_dims(skel.graph):
        return False
    # The IR's types may be messages of the caller's proto: replaced, never changed.
    for g in _graphs(model.graph):
        for name, tp in g.value_info.items():
            g.value_info[name] = without_negative_dims(tp)
        for v in [*g.inputs, *g.outputs, *(v for n in g.nodes for v in n.outputs)]:
            if v.type is not None:
                v.type = without_negative_dims(v.type)
    return True


def _graph_protos(g: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    yield g
    for node in g.node:
        for a in node.attribute:
            for sub in [a.g] if a.type == onnx.AttributeProto.GRAPH else a.graphs:
                yield from _graph_protos(sub)


def _graphs(g: Graph) -> Iterator[Graph]:
    yield g
    for node in g.nodes:
        for sub in node.subgraphs():
            yield from _graphs(sub)


# Integer constants this small are shapes, axes, indices: shape inference reads their values
# (Reshape's target, Unsqueeze's axes...), so they stay constants in the skeleton.
_SHAPE_CONSTANT_MAX = 1024


def _add_shape_constants(skel: onnx.ModelProto, model: Model) -> None:
    """Put the small integer initializers back into the skeleton as initializers, with the
    values the session will run (overrides applied); ones a caller may feed stay inputs."""
    g = model.graph
    fed = {id(v) for v in g.inputs}
    small = {
        name: v.const_value for name, v in g.initializers.items()
        if id(v) not in fed and v.const_value is not None
        and v.const_value.dtype.kind in "iu" and v.const_value.size <= _SHAPE_CONSTANT_MAX
    }
    if not small:
        return
    if skel.ir_version >= 4:  # IR < 4 lists every initializer as an input too
        kept = [vi for vi in skel.graph.input if vi.name not in small]
        del skel.graph.input[:]
        skel.graph.input.extend(kept)
    skel.graph.initializer.extend(_int_tensor(arr, name) for name, arr in small.items())


def _with_ranks(skel: onnx.ModelProto) -> onnx.ModelProto:
    """onnx's checker requires a shape on the main graph's tensor inputs and outputs, onnxruntime
    accepts tensors of unknown rank there: check a copy where such types carry an empty shape
    (shape inference still runs on the original, so no rank is assumed)."""

    def unranked(vi: onnx.ValueInfoProto) -> bool:
        return vi.type.HasField("tensor_type") and not vi.type.tensor_type.HasField("shape")

    def untyped(vi: onnx.ValueInfoProto) -> bool:
        return vi.type.WhichOneof("value") is None

    g = skel.graph
    if not any(unranked(vi) for vi in [*g.input, *g.output]) and not any(
        untyped(vi) for vi in g.output
    ):
        return skel
    copy = onnx.ModelProto()
    copy.CopyFrom(skel)
    if any(untyped(vi) for vi in g.output):
        # Graph outputs declared without a type (onnxruntime infers them): give the checker the
        # inferred type; an output inference cannot type still fails the check.
        try:
            inferred = onnx.shape_inference.infer_shapes(skel)
            types = {
                vi.name: vi.type for vi in [*inferred.graph.output, *inferred.graph.value_info]
            }
        except Exception:
            types = {}
        for vi in copy.graph.output:
            if untyped(vi) and vi.name in types:
                vi.type.CopyFrom(types[vi.name])
    for vi in [*copy.graph.input, *copy.graph.output]:
        if unranked(vi):
            vi.type.tensor_type.shape.SetInParent()
    return copy


def _inferred_types(inferred: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    """The main graph's inferred value types by name (an output's over its value_info)."""
    types = {vi.name: vi.type for vi in inferred.graph.value_info}
    types.update({vi.name: vi.type for vi in inferred.graph.output})
    return types


def _apply_value_info(model: Model, types: dict[str, onnx.TypeProto]) -> None:
    g = model.graph
    for node in g.nodes:
        for v in node.outputs:
            t = types.get(v.name)
            if t is None:
                continue
            if v.type is None or v.type.WhichOneof("value") is None:
                v.type = t
            elif _gains_shape(v.type, t):
                v.type = _without_generated_symbols(t)


def _gains_shape(declared: onnx.TypeProto, inferred: onnx.TypeProto) -> bool:
    """Whether inference knows more of a tensor's shape than its declaration: a shape where none
    was declared (e.g. a graph output), or sizes where the declaration left a dimension open
    (unknown, symbolic or negative). onnxruntime reports the merged shape; so do we."""
    if declared == inferred:  # most values: one C-level comparison, not a walk of the dims
        return False
    if not (
        declared.HasField("tensor_type")
        and inferred.HasField("tensor_type")
        and inferred.tensor_type.HasField("shape")
        and inferred.tensor_type.elem_type == declared.tensor_type.elem_type
    ):
        return False
    if not declared.tensor_type.HasField("shape"):
        return True
    have, got = declared.tensor_type.shape.dim, inferred.tensor_type.shape.dim
    return len(have) == len(got) and any(
        i.WhichOneof("value") == "dim_value" and d.WhichOneof("value") != "dim_value"
        for d, i in zip(have, got, strict=True)
    )


def _without_generated_symbols(tp: onnx.TypeProto) -> onnx.TypeProto:
    """Shape inference names unknown dimensions ``unk__N``; onnxruntime reports them as None."""
    copy = onnx.TypeProto()
    copy.CopyFrom(tp)
    for d in copy.tensor_type.shape.dim:
        if d.WhichOneof("value") == "dim_param" and _GENERATED.fullmatch(d.dim_param):
            d.ClearField("dim_param")
    return copy


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return " ".join(lines[:3]) if lines else type(e).__name__
