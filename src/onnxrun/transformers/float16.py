"""float32 to float16 model conversion, with the API of ``onnxruntime.transformers.float16``.

``convert_float_to_float16(model)`` turns every float32 tensor of a model into float16:
initializers, graph inputs, outputs and value_info, tensors held in attributes (Constant,
ConstantOfShape), ``Cast(to=FLOAT)`` targets and the ``dtype`` of generator ops, in the main
graph and in If/Loop/Scan bodies. Values are clamped into float16's finite range and tiny ones are
kept from flushing to zero (``convert_np_to_float16``). Operators in the block list (no float16
kernel, or too imprecise) stay float32: Casts are inserted at their boundaries, and an initializer
that only blocked operators read keeps float32.

The graphs written are those of onnxruntime's converter (same nodes, Cast names, value_info and
initializers), with four differences that make them sounder: the input ModelProto is never
modified; inserted Casts are placed in topological order (right after the value they convert), so
the model passes ``onnx.checker``; a Cast for a value defined inside a subgraph goes into that
subgraph instead of the main graph; and ``Constant(value_float[s])`` becomes a float16 tensor.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Iterable

import ml_dtypes
import numpy as np
import onnx
from onnx import (
    AttributeProto,
    GraphProto,
    ModelProto,
    NodeProto,
    TensorProto,
    ValueInfoProto,
    helper,
)

logger = logging.getLogger(__name__)

DEFAULT_OP_BLOCK_LIST = [
    "ArrayFeatureExtractor",
    "Binarizer",
    "CastMap",
    "CategoryMapper",
    "DictVectorizer",
    "FeatureVectorizer",
    "Imputer",
    "LabelEncoder",
    "LinearClassifier",
    "LinearRegressor",
    "Normalizer",
    "OneHotEncoder",
    "RandomUniformLike",
    "SVMClassifier",
    "SVMRegressor",
    "Scaler",
    "TreeEnsembleClassifier",
    "TreeEnsembleRegressor",
    "TreeEnsemble",
    "ZipMap",
    "NonMaxSuppression",
    "TopK",
    "RoiAlign",
    "Range",
    "CumSum",
    "Min",
    "Max",
    "Upsample",
]

# Inputs whose type the operator fixes to float32 (op_type -> input indices); force_fp16_inputs
# overrides them.
ALWAYS_FLOAT_INPUTS = {"Resize": [2], "GroupNorm": [1, 2], "SkipGroupNorm": [1, 2]}

# Generators whose ``dtype`` attribute picks the output type; in the second set the attribute
# defaults to FLOAT, so it must be added when absent.
_DTYPE_OPS = {
    "EyeLike", "Multinomial", "RandomNormal", "RandomNormalLike", "RandomUniform",
    "RandomUniformLike", "SequenceEmpty", "Bernoulli",
}
_DTYPE_DEFAULTS_TO_FLOAT = {"RandomNormal", "RandomUniform", "SequenceEmpty"}

_FLOAT = TensorProto.FLOAT
_FLOAT16 = TensorProto.FLOAT16
_START = -1  # "node index" of values defined before a graph's first node (inputs, initializers)


def convert_np_to_float16(np_array, min_positive_val=5.96e-08, max_finite_val=65504.0):
    """Convert a float array to float16 without changing sign or finiteness.

    Nonzero magnitudes below ``min_positive_val`` become ``min_positive_val`` and finite ones
    above ``max_finite_val`` become ``max_finite_val`` (signs kept); NaN, 0 and +-inf are kept.
    """
    a = np.asarray(np_array)
    mag = np.abs(a)
    tiny = (mag > 0) & (mag < min_positive_val)  # NaN compares False: left alone
    huge = (mag > max_finite_val) & (mag < np.inf)
    if tiny.any() or huge.any():
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug("%d values truncated to +-%g and %d to +-%g", int(tiny.sum()),
                         min_positive_val, int(huge.sum()), max_finite_val)
        a = a.copy()
        a[tiny] = np.copysign(min_positive_val, a[tiny])
        a[huge] = np.copysign(max_finite_val, a[huge])
    return a.astype(np.float16)


def convert_tensor_float_to_float16(tensor, min_positive_val=5.96e-08, max_finite_val=65504.0):
    """Convert a float32 TensorProto to float16 in place (other types are left alone)."""
    if not isinstance(tensor, TensorProto):
        raise ValueError(f"Expected input type is an ONNX TensorProto but got {type(tensor)}")
    if tensor.data_type != _FLOAT:
        return tensor
    if tensor.data_location == TensorProto.EXTERNAL and not tensor.raw_data:
        raise ValueError(
            f"tensor '{tensor.name}' keeps its data in an external file: load the model with "
            "its external data (onnx.load(path)) before converting it"
        )
    tensor.data_type = _FLOAT16
    if tensor.float_data:
        half = convert_np_to_float16(np.asarray(tensor.float_data, dtype=np.float32),
                                     min_positive_val, max_finite_val)
        # float16 values are stored as their bit patterns in int32_data
        tensor.int32_data[:] = half.view(np.uint16).astype(np.int32).tolist()
        del tensor.float_data[:]
    if tensor.raw_data:
        half = convert_np_to_float16(np.frombuffer(tensor.raw_data, dtype="<f4"),
                                     min_positive_val, max_finite_val)
        tensor.raw_data = half.astype("<f2").tobytes()
    return tensor


def _convert_tensor_to_bfloat16(tensor: TensorProto) -> None:
    if tensor.data_location == TensorProto.EXTERNAL and not tensor.raw_data:
        raise ValueError(f"tensor '{tensor.name}' keeps its data in an external file")
    tensor.data_type = TensorProto.BFLOAT16
    if tensor.float_data:
        data = np.asarray(tensor.float_data, dtype=np.float32).astype(ml_dtypes.bfloat16)
        tensor.int32_data[:] = data.view(np.uint16).astype(np.int32).tolist()
        del tensor.float_data[:]
    if tensor.raw_data:
        data = np.frombuffer(tensor.raw_data, dtype="<f4").astype(ml_dtypes.bfloat16)
        tensor.raw_data = data.tobytes()


def make_value_info_from_tensor(tensor):
    return helper.make_tensor_value_info(tensor.name, tensor.data_type, list(tensor.dims))


def float_to_float16_max_diff(tensor, min_positive_val=5.96e-08, max_finite_val=65504.0):
    """Largest absolute change that converting a float32 TensorProto to float16 would make."""
    if not isinstance(tensor, TensorProto):
        raise ValueError(f"Expected input type is an ONNX TensorProto but got {type(tensor)}")
    if tensor.data_type != _FLOAT:
        raise ValueError("Expected tensor data type is float.")
    if tensor.raw_data:
        data = np.frombuffer(tensor.raw_data, dtype="<f4")
    elif tensor.float_data:
        data = np.asarray(tensor.float_data, dtype=np.float32)
    else:
        raise RuntimeError("external data not loaded!")
    half = convert_np_to_float16(data, min_positive_val, max_finite_val)
    return np.amax(np.abs(data - half.astype(np.float32)))


def convert_float_to_float16(
    model,
    min_positive_val=5.96e-08,
    max_finite_val=65504.0,
    keep_io_types=False,
    disable_shape_infer=False,
    op_block_list=None,
    node_block_list=None,
    force_fp16_initializers=False,
    force_fp16_inputs=None,
    use_bfloat16_as_blocked_nodes_dtype=False,
):
    """Convert the float32 tensors of a model to float16.

    Args:
        model: a ModelProto (left unmodified) or the path of a model file.
        min_positive_val: nonzero magnitudes below it are raised to it (at least 5.96e-08,
            float16's smallest subnormal).
        max_finite_val: finite magnitudes above it are lowered to it (at most 65504).
        keep_io_types: True to keep float32 graph inputs and outputs (Casts are inserted), or a
            list of the input/output names to keep float32.
        disable_shape_infer: skip onnx shape inference (when the model already has value_info
            for its intermediate values; Casts are only inserted where types are known).
        op_block_list: op types left in float32; None for ``DEFAULT_OP_BLOCK_LIST``.
        node_block_list: node names left in float32.
        force_fp16_initializers: convert every float32 initializer, even one that only blocked
            nodes read.
        force_fp16_inputs: {op_type: [input indices]} to convert even where the operator keeps
            float32 (``ALWAYS_FLOAT_INPUTS``, e.g. Resize's scales).
        use_bfloat16_as_blocked_nodes_dtype: run blocked nodes in bfloat16 instead of float32.

    Returns:
        ModelProto: the converted model.
    """
    if not min_positive_val >= 5.96e-08:
        raise ValueError("invalid min_positive_val: the smallest positive float16 value is "
                         "5.96e-08 (subnormal), 6.104e-05 normalized")
    if not max_finite_val <= float(np.finfo(np.float16).max):
        raise ValueError("invalid max_finite_val: the largest float16 value is 65504")
    model = _prepared_copy(model, disable_shape_infer)
    converter = _Converter(
        model,
        min_positive_val=min_positive_val,
        max_finite_val=max_finite_val,
        op_block_list=DEFAULT_OP_BLOCK_LIST if op_block_list is None else op_block_list,
        node_block_list=node_block_list or (),
        force_fp16_initializers=force_fp16_initializers,
        force_fp16_inputs=force_fp16_inputs or {},
        blocked_dtype=TensorProto.BFLOAT16 if use_bfloat16_as_blocked_nodes_dtype else _FLOAT,
    )
    converter.convert(keep_io_types)
    return model


def _prepared_copy(model, disable_shape_infer: bool) -> ModelProto:
    """A private copy of the model, with inferred value_info unless disabled."""
    if isinstance(model, str | os.PathLike):
        path = os.fspath(model)
        if disable_shape_infer:
            return onnx.load(path)
        # infer_shapes_path handles models over 2 GB; the temporary file sits next to the
        # model so that relative external-data paths still resolve
        fd, tmp = tempfile.mkstemp(suffix=".onnx", dir=os.path.dirname(os.path.abspath(path)))
        os.close(fd)
        try:
            onnx.shape_inference.infer_shapes_path(path, tmp)
            return onnx.load(tmp)
        finally:
            os.remove(tmp)
    if not isinstance(model, ModelProto):
        raise ValueError(f"Expected an ONNX ModelProto but got {type(model)}")
    if not disable_shape_infer:
        return onnx.shape_inference.infer_shapes(model)  # returns a new model
    copy = ModelProto()
    copy.CopyFrom(model)
    return copy


def _float_tensor_type(tp: onnx.TypeProto) -> onnx.TypeProto.Tensor | None:
    """The tensor type to convert inside ``tp``: a float tensor or a sequence of them."""
    if tp.HasField("tensor_type"):
        return tp.tensor_type if tp.tensor_type.elem_type == _FLOAT else None
    if tp.HasField("sequence_type"):
        return _float_tensor_type(tp.sequence_type.elem_type)
    return None


class _Edits:
    """Casts to insert into one graph, by position."""

    def __init__(self) -> None:
        self.start: list[NodeProto] = []  # graph-input casts (keep_io_types)
        self.start_casts: list[NodeProto] = []  # casts of graph inputs and initializers
        # node index -> the Casts that restore a blocked node's float16 outputs
        self.after_outputs: dict[int, list[NodeProto]] = {}
        # node index -> casts of the values it defines (for blocked or mixed-type readers)
        self.after: dict[int, list[NodeProto]] = {}
        self.end: list[NodeProto] = []  # graph-output casts (keep_io_types)

    def empty(self) -> bool:
        return not (self.start or self.start_casts or self.after_outputs or self.after
                    or self.end)


class _Converter:
    def __init__(self, model: ModelProto, *, min_positive_val: float, max_finite_val: float,
                 op_block_list: Iterable[str], node_block_list: Iterable[str],
                 force_fp16_initializers: bool, force_fp16_inputs: dict[str, list[int]],
                 blocked_dtype: int) -> None:
        self.model = model
        self.min_positive_val = min_positive_val
        self.max_finite_val = max_finite_val
        self.op_block_list = set(op_block_list)
        self.node_block_list = set(node_block_list)
        self.force_fp16_initializers = force_fp16_initializers
        self.force_fp16_inputs = force_fp16_inputs
        self.blocked_dtype = blocked_dtype
        # Resize takes [X, scales] up to opset 10 and [X, roi, scales, sizes] from opset 11
        opset = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")),
                    default=11)
        self.always_float = dict(ALWAYS_FLOAT_INPUTS)
        if opset <= 10:
            self.always_float["Resize"] = [1]

        self.graphs: list[GraphProto] = []
        self.edits: list[_Edits] = []
        # name -> type info of every value that is float16 after conversion (first one wins)
        self.fp16_values: dict[str, ValueInfoProto] = {}
        self.parent: list[int | None] = []  # per graph: the graph its owner node is in
        # value name -> {graph index: index of its producer there, or _START}
        self.definer: dict[str, dict[int, int]] = {}
        self.names: set[str] = set()  # value and node names in use, for fresh ones
        self.name_mapping: dict[str, str] = {}  # graph I/O renamed by keep_io_types
        self.io_to_skip: set[str] = set()
        self.cast_outputs: dict[tuple, str] = {}
        # float32 initializer -> [TensorProto, read by a float16 node, read by a float32 node]
        self.initializers: dict[str, list] = {}
        self.blocked: list[tuple[int, int, NodeProto]] = []
        self.mixed: list[tuple[int, int, NodeProto]] = []

    # -- driver ----------------------------------------------------------------------------------

    def convert(self, keep_io_types) -> None:
        self._collect_names(self.model.graph)
        self._add_graph(self.model.graph, None)
        self._keep_io_types(keep_io_types)
        queue = [(self.model.graph, None)]
        while queue:  # breadth first, as onnxruntime's converter
            next_level: list[tuple[GraphProto, int]] = []
            for g, parent in queue:
                gi = 0 if parent is None else self._add_graph(g, parent)
                next_level.extend((sub, gi) for sub in self._convert_graph(g, gi))
            queue = next_level
        self._convert_initializers()
        for gi, _idx, node in self.mixed:
            fixed = self.always_float[node.op_type]
            forced = self.force_fp16_inputs.get(node.op_type, [])
            for i, name in enumerate(node.input):
                if i in fixed and i not in forced and name in self.fp16_values:
                    node.input[i] = self._cast_input(name, _FLOAT, gi)
        for gi, idx, node in self.blocked:
            for i, name in enumerate(node.input):
                if name in self.fp16_values:
                    node.input[i] = self._cast_input(name, self.blocked_dtype, gi)
            for i, name in enumerate(node.output):
                if name in self.fp16_values:
                    node.output[i] = self._cast_output(name, gi, idx)
        # inner graphs first: rebuilding an outer graph copies its nodes, subgraphs included
        for g, edits in reversed(list(zip(self.graphs, self.edits, strict=True))):
            if not edits.empty():
                _rebuild(g, edits)

    def _collect_names(self, g: GraphProto) -> None:
        for v in (*g.input, *g.output, *g.value_info):
            self.names.add(v.name)
        self.names.update(t.name for t in g.initializer)
        for n in g.node:
            self.names.add(n.name)
            self.names.update(n.output)
            for a in n.attribute:
                if a.HasField("g"):
                    self._collect_names(a.g)
                for sub in a.graphs:
                    self._collect_names(sub)

    def _add_graph(self, g: GraphProto, parent: int | None) -> int:
        gi = len(self.graphs)
        self.graphs.append(g)
        self.parent.append(parent)
        self.edits.append(_Edits())
        for v in g.input:
            self._define(v.name, gi, _START)
        for t in g.initializer:
            self._define(t.name, gi, _START)
        return gi

    def _define(self, name: str, gi: int, idx: int) -> None:
        self.definer.setdefault(name, {}).setdefault(gi, idx)

    def _keep_io_types(self, keep_io_types) -> None:
        graph = self.model.graph
        inputs = [v.name for v in graph.input if v.type.tensor_type.elem_type == _FLOAT]
        outputs = [v.name for v in graph.output if v.type.tensor_type.elem_type == _FLOAT]
        if isinstance(keep_io_types, list | tuple | set | frozenset):
            inputs = [n for n in inputs if n in keep_io_types]
            outputs = [n for n in outputs if n in keep_io_types]
        elif not keep_io_types:
            return
        edits = self.edits[0]
        for i, v in enumerate(graph.input):
            if v.name in inputs:
                cast_name = f"graph_input_cast_{i}"
                self._map_io(v, cast_name)
                edits.start.append(helper.make_node("Cast", [v.name], [cast_name],
                                                    to=_FLOAT16, name=f"graph_input_cast{i}"))
                self._define(cast_name, 0, _START)
        for i, v in enumerate(graph.output):
            if v.name in outputs:
                cast_name = f"graph_output_cast_{i}"
                self._map_io(v, cast_name)
                edits.end.append(helper.make_node("Cast", [cast_name], [v.name], to=_FLOAT,
                                                  name=f"graph_output_cast{i}"))

    def _map_io(self, v: ValueInfoProto, cast_name: str) -> None:
        self.name_mapping[v.name] = cast_name
        self.io_to_skip.add(v.name)
        self.names.add(cast_name)
        info = self.model.graph.value_info.add()
        info.CopyFrom(v)
        info.name = cast_name
        info.type.tensor_type.elem_type = _FLOAT16
        self.fp16_values.setdefault(cast_name, info)

    # -- one graph -------------------------------------------------------------------------------

    def _convert_graph(self, g: GraphProto, gi: int) -> list[GraphProto]:
        """Convert one graph's nodes and types; return the subgraphs to convert next."""
        for t in g.initializer:
            if t.data_type == _FLOAT:
                self.initializers.setdefault(t.name, [t, False, False])
        subgraphs: list[GraphProto] = []
        for idx, n in enumerate(g.node):
            for i, name in enumerate(n.input):
                if name in self.name_mapping:
                    n.input[i] = self.name_mapping[name]
            for i, name in enumerate(n.output):
                if name in self.name_mapping:
                    n.output[i] = self.name_mapping[name]
                self._define(n.output[i], gi, idx)
            blocked = n.op_type in self.op_block_list or n.name in self.node_block_list
            fixed = self.always_float.get(n.op_type, ())
            forced = self.force_fp16_inputs.get(n.op_type, ())
            for i, name in enumerate(n.input):
                record = self.initializers.get(name)
                if record is not None:
                    keeps_fp32 = blocked or (i in fixed and i not in forced)
                    record[2 if keeps_fp32 else 1] = True
            if blocked:
                self.blocked.append((gi, idx, n))
                continue
            self._convert_node_attributes(n)
            if n.op_type in self.always_float and n.op_type not in self.force_fp16_inputs:
                self.mixed.append((gi, idx, n))  # its attributes keep their types
                continue
            for a in n.attribute:
                subgraphs.extend(self._convert_attribute(a))
        for v in (*g.input, *g.output, *g.value_info):
            tensor_type = _float_tensor_type(v.type)
            if tensor_type is not None and v.name not in self.io_to_skip:
                tensor_type.elem_type = _FLOAT16
                self.fp16_values.setdefault(v.name, v)
        return subgraphs

    def _convert_node_attributes(self, n: NodeProto) -> None:
        """Attributes that name float32 as a type (Cast's target, generators' dtype)."""
        if n.op_type == "Cast":
            for a in n.attribute:
                if a.name == "to" and a.i == _FLOAT:
                    a.i = _FLOAT16
        elif n.op_type in _DTYPE_OPS:
            has_dtype = False
            for a in n.attribute:
                if a.name == "dtype":
                    has_dtype = True
                    if a.i == _FLOAT:
                        a.i = _FLOAT16
            if not has_dtype and n.op_type in _DTYPE_DEFAULTS_TO_FLOAT:
                n.attribute.append(helper.make_attribute("dtype", _FLOAT16))
        elif n.domain in ("", "ai.onnx") and n.op_type == "ConstantOfShape":
            if not any(a.name == "value" for a in n.attribute):  # the default is float32 zero
                value = helper.make_tensor("value", _FLOAT16, [1], [0])
                n.attribute.append(helper.make_attribute("value", value))
        elif n.domain in ("", "ai.onnx") and n.op_type == "Constant":
            for a in n.attribute:
                if a.name in ("value_float", "value_floats"):
                    # a float32 constant would contradict its float16 value_info
                    data = [a.f] if a.name == "value_float" else list(a.floats)
                    dims = [] if a.name == "value_float" else [len(data)]
                    half = convert_np_to_float16(np.asarray(data, dtype=np.float32),
                                                 self.min_positive_val, self.max_finite_val)
                    tensor = helper.make_tensor("value", _FLOAT16, dims, half.tobytes(),
                                                raw=True)
                    a.CopyFrom(helper.make_attribute("value", tensor))

    def _convert_attribute(self, a: AttributeProto) -> list[GraphProto]:
        lo, hi = self.min_positive_val, self.max_finite_val
        if a.HasField("t"):
            convert_tensor_float_to_float16(a.t, lo, hi)
        for t in a.tensors:
            convert_tensor_float_to_float16(t, lo, hi)
        if a.HasField("sparse_tensor"):
            convert_tensor_float_to_float16(a.sparse_tensor.values, lo, hi)
        return ([a.g] if a.HasField("g") else []) + list(a.graphs)

    def _convert_initializers(self) -> None:
        for tensor, fp16_use, fp32_use in self.initializers.values():
            # an initializer read only by float32 nodes keeps its precision
            if not (self.force_fp16_initializers or fp16_use):
                if fp32_use and self.blocked_dtype == TensorProto.BFLOAT16:
                    _convert_tensor_to_bfloat16(tensor)  # blocked nodes run in bfloat16
                continue
            convert_tensor_float_to_float16(tensor, self.min_positive_val, self.max_finite_val)
            self.fp16_values.setdefault(tensor.name, make_value_info_from_tensor(tensor))
            if fp32_use and not self.force_fp16_initializers:
                logger.info("initializer %s is read by float16 and float32 nodes", tensor.name)

    # -- Casts -----------------------------------------------------------------------------------

    def _fresh(self, base: str) -> str:
        name, k = base, 0
        while name in self.names:
            k += 1
            name = f"{base}_{k}"
        self.names.add(name)
        return name

    def _scope_of(self, name: str, gi: int) -> tuple[int, int]:
        """Where the consumer graph ``gi`` sees ``name`` defined: its graph or an outer one."""
        defs = self.definer.get(name, {})
        g: int | None = gi
        while g is not None:
            if g in defs:
                return g, defs[g]
            g = self.parent[g]
        return gi, _START  # undefined (an invalid model): cast at the consumer graph's start

    def _typed_info(self, source: ValueInfoProto, name: str, elem: int, gi: int) -> None:
        info = self.graphs[gi].value_info.add()
        info.CopyFrom(source)
        info.name = name
        info.type.tensor_type.elem_type = elem

    def _cast_input(self, name: str, to: int, consumer_graph: int) -> str:
        """The name of ``name`` cast to ``to``: one Cast, right after the value's definition."""
        gi, idx = self._scope_of(name, consumer_graph)
        key = (name, to, gi)
        out = self.cast_outputs.get(key)
        if out is not None:
            return out
        suffix = "fp32" if to == _FLOAT else "bfloat16"
        out = self._fresh(f"{name}_cast_to_{suffix}")
        cast = helper.make_node("Cast", [name], [out], to=to, name=self._fresh(f"{out}_node"))
        self._typed_info(self.fp16_values[name], out, to, gi)
        edits = self.edits[gi]
        if idx == _START:
            edits.start_casts.append(cast)
        else:
            edits.after.setdefault(idx, []).append(cast)
        self.cast_outputs[key] = out
        return out

    def _cast_output(self, name: str, gi: int, idx: int) -> str:
        """Rename a blocked node's float16 output; a Cast after the node restores ``name``."""
        out = self._fresh(f"{name}_cast_to_fp16")
        cast = helper.make_node("Cast", [out], [name], to=_FLOAT16,
                                name=self._fresh(f"{name}_cast_to_fp16_node"))
        self._typed_info(self.fp16_values[name], out, self.blocked_dtype, gi)
        self.edits[gi].after_outputs.setdefault(idx, []).append(cast)
        return out


def _rebuild(g: GraphProto, edits: _Edits) -> None:
    nodes: list[NodeProto] = [*edits.start, *edits.start_casts]
    for idx, n in enumerate(g.node):
        nodes.append(n)
        nodes.extend(edits.after_outputs.get(idx, ()))
        nodes.extend(edits.after.get(idx, ()))
    nodes.extend(edits.end)
    copies = []
    for n in nodes:  # copies first: the originals are removed from the graph below
        c = NodeProto()
        c.CopyFrom(n)
        copies.append(c)
    del g.node[:]
    g.node.extend(copies)


__all__ = [
    "ALWAYS_FLOAT_INPUTS",
    "DEFAULT_OP_BLOCK_LIST",
    "convert_float_to_float16",
    "convert_np_to_float16",
    "convert_tensor_float_to_float16",
    "float_to_float16_max_diff",
]
