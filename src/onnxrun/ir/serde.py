"""Conversion between onnx protobuf messages and onnxrun's IR (both directions)."""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable, Sequence

import numpy as np

from ..dtypes import NUMPY_DTYPES, elem_type, narrow_type_error
from ..errors import InvalidGraph
from ..proto import onnx
from .core import Attribute, Graph, Model, Node, Value
from .toposort import stable_topological_order

AttributeProto = onnx.AttributeProto
TensorProto = onnx.TensorProto

# Reads the bytes of a tensor stored outside the model file (bytes, or a uint8 array the tensor
# may keep); supplied by the loader, which owns the policy of which files may be read.
ExternalReader = Callable[[TensorProto], bytes | memoryview | np.ndarray]


def _no_external(tensor: TensorProto) -> bytes:
    raise InvalidGraph(
        f"tensor '{tensor.name}' keeps its data in an external file, but the model was given as "
        "bytes with no folder to read it from: load it from its path instead"
    )


# ---------------------------------------------------------------------------------------------
# tensors


def _bits(elem: int) -> int:
    if elem in _SUB_BYTE:
        return _SUB_BYTE[elem]
    if elem == TensorProto.STRING:
        return 0
    return NUMPY_DTYPES[elem].itemsize * 8


_SUB_BYTE = {TensorProto.INT4: 4, TensorProto.UINT4: 4, TensorProto.FLOAT4E2M1: 4}
for _n in ("INT2", "UINT2"):
    if hasattr(TensorProto, _n):
        _SUB_BYTE[getattr(TensorProto, _n)] = 2

# Types numpy_helper.to_array unpacks from raw_data (sub-byte and 6-bit floats); every other
# type is read with np.frombuffer, as to_array would, except strings (never raw).
_PACKED = set(_SUB_BYTE) | {
    getattr(TensorProto, n) for n in ("FLOAT6E2M3", "FLOAT6E3M2") if hasattr(TensorProto, n)
}
_PLAIN_DTYPES: dict[int, np.dtype | None] = {}
# Element types whose typed field holds the values as they are (numpy_helper: the storage
# dtype is the element's own): the field and the dtype.
_TYPED_FIELDS: dict[int, tuple[str, type]] = {
    TensorProto.FLOAT: ("float_data", np.float32), TensorProto.DOUBLE: ("double_data", np.float64),
    TensorProto.INT32: ("int32_data", np.int32), TensorProto.INT64: ("int64_data", np.int64),
}


def _known_data_type(elem: int) -> bool:
    """Whether a TensorProto data type is one onnx (and so numpy, with ml_dtypes) can hold."""
    return elem in NUMPY_DTYPES


def _plain_dtype(elem: int) -> np.dtype | None:
    """The numpy dtype of a raw_data tensor that np.frombuffer reads as is, else None."""
    dt = _PLAIN_DTYPES.get(elem, False)
    if dt is False:
        dt = None
        if elem not in _PACKED and elem != TensorProto.STRING and sys.byteorder == "little":
            dt = NUMPY_DTYPES.get(elem)
        _PLAIN_DTYPES[elem] = dt
    return dt


def tensor_to_array(
    tensor: TensorProto, read_external: ExternalReader = _no_external,
    raw_data: bytes | memoryview | np.ndarray | None = None,
) -> np.ndarray:
    """Turn a TensorProto into a numpy array, refusing tensors whose data does not match dims.

    ``raw_data``: the tensor's raw_data, when the loader kept it out of the proto: a view of the
    model's bytes (copied once, into an aligned array), or the bytes read from the file into a
    uint8 array of their own (which the result then is, retyped)."""
    dims = tuple(int(d) for d in tensor.dims)
    if any(d < 0 for d in dims):
        raise InvalidGraph(f"tensor '{tensor.name}' has a negative dimension: {list(dims)}")
    count = math.prod(dims)
    if tensor.data_type == TensorProto.UNDEFINED:
        raise InvalidGraph(f"tensor '{tensor.name}' has no data type")
    if not _known_data_type(tensor.data_type):
        narrow = narrow_type_error(tensor.data_type, f"tensor '{tensor.name}'")
        if narrow is not None:
            raise narrow
        raise InvalidGraph(
            f"tensor '{tensor.name}' does not have a valid data type ({tensor.data_type})"
        )
    # Every read of ``raw_data`` copies the whole buffer out of the protobuf: read it once.
    raw: bytes | memoryview | np.ndarray | None = raw_data
    if raw is None:
        if tensor.data_location == TensorProto.EXTERNAL:
            raw = read_external(tensor)
        elif tensor.HasField("raw_data") and tensor.data_type != TensorProto.STRING:
            raw = tensor.raw_data
    if raw is not None and tensor.data_type != TensorProto.STRING:
        bits = _bits(tensor.data_type)
        expected = (count * bits + 7) // 8
        if len(raw) != expected:
            raise InvalidGraph(
                f"tensor '{tensor.name}' declares shape {list(dims)} ({expected} bytes) but holds "
                f"{len(raw)} bytes of data"
            )
        dtype = _plain_dtype(tensor.data_type)
        if dtype is not None:
            # What numpy_helper.to_array does for these types, without copying raw again.
            if isinstance(raw, memoryview):
                # A slice of the model's bytes: at any offset, and numpy's and BLAS's fast
                # paths need aligned data. One copy into an array of its own also lets the
                # model's bytes go once it is loaded.
                arr = np.empty(dims, dtype=dtype)
                arr.reshape(-1).view(np.uint8)[:] = np.frombuffer(raw, dtype=np.uint8)
            elif isinstance(raw, np.ndarray):
                arr = raw.view(dtype).reshape(dims)
            else:
                arr = np.frombuffer(raw, dtype=dtype).reshape(dims)
            arr.flags.writeable = False
            return arr
    if raw is None and tensor.data_type in _TYPED_FIELDS and not tensor.HasField("segment"):
        # The common typed fields read as numpy_helper reads them, without its generic
        # dispatch (ConstantOfShape's value, small shape constants: ~10x faster each); a
        # count that does not match goes on to numpy_helper's error below.
        field, dtype = _TYPED_FIELDS[tensor.data_type]
        arr = np.array(getattr(tensor, field), dtype=dtype)
        if arr.size == count:
            arr = arr.reshape(dims)
            arr.flags.writeable = False
            return arr
    if raw is not None and not tensor.HasField("raw_data"):
        local = TensorProto()
        local.CopyFrom(tensor)
        del local.external_data[:]
        local.data_location = TensorProto.DEFAULT
        local.raw_data = bytes(raw)
        tensor = local
    try:
        arr = onnx.numpy_helper.to_array(tensor)
    except Exception as e:  # malformed typed fields: a size mismatch or an unsupported type
        raise InvalidGraph(
            f"tensor '{tensor.name}' with shape {list(dims)} cannot be read: {e}"
        ) from None
    if arr.size != count:
        raise InvalidGraph(
            f"tensor '{tensor.name}' declares shape {list(dims)} ({count} elements) but holds "
            f"{arr.size}"
        )
    arr.flags.writeable = False  # weights are shared by every run: kernels must not write them
    return arr


def sparse_to_dense(sp: onnx.SparseTensorProto, read_external: ExternalReader) -> np.ndarray:
    name = sp.values.name
    values = tensor_to_array(sp.values, read_external)
    indices = tensor_to_array(sp.indices, read_external).astype(np.int64)
    dims = tuple(int(d) for d in sp.dims)
    if any(d < 0 for d in dims):
        raise InvalidGraph(f"sparse tensor '{name}' has a negative dimension: {list(dims)}")
    nnz = values.size
    if values.ndim != 1 or not (
        (indices.ndim == 1 and indices.shape[0] == nnz)
        or (indices.ndim == 2 and indices.shape == (nnz, len(dims)))
    ):
        raise InvalidGraph(
            f"sparse tensor '{name}': {nnz} values of shape {list(values.shape)} with indices "
            f"of shape {list(indices.shape)} do not describe a tensor of shape {list(dims)} "
            "(values must be [NNZ], indices [NNZ] or [NNZ, rank])"
        )
    # The dense size is declared, not backed by data: a few values may claim petabytes.
    nbytes = math.prod(dims) * values.dtype.itemsize
    limit = _memory_size()
    if limit is not None and nbytes > limit:
        raise InvalidGraph(
            f"sparse tensor '{name}' of shape {list(dims)} would take {nbytes} bytes once dense, "
            f"more than this machine's {limit} bytes of memory"
        )
    try:
        dense = np.zeros(dims, dtype=values.dtype)
    except (MemoryError, ValueError) as e:
        raise InvalidGraph(
            f"sparse tensor '{name}' of shape {list(dims)} ({nbytes} bytes once dense) cannot "
            f"be allocated: {e}"
        ) from None
    flat = dense.reshape(-1)
    if indices.ndim == 2:  # [NNZ, rank] coordinates
        if indices.size and (indices.min() < 0 or (indices >= np.array(dims)).any()):
            raise InvalidGraph(f"sparse tensor '{name}' has an index outside {list(dims)}")
        indices = np.ravel_multi_index(tuple(indices.T), dims) if indices.size else indices[:, 0]
    if indices.size and (indices.min() < 0 or indices.max() >= flat.size):
        raise InvalidGraph(f"sparse tensor '{name}' has an index outside {list(dims)}")
    flat[indices] = values
    return dense


def _memory_size() -> int | None:
    """The machine's physical memory in bytes, where the platform says (no dense tensor can
    be larger and still be used)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def tensor_type(arr: np.ndarray) -> onnx.TypeProto:
    """The tensor type of ``arr`` (what onnx.helper.make_tensor_type_proto builds), asked once
    per initializer and folded constant: a copy of the one built for the same dtype and shape
    before (one C-level copy, ~2.5x cheaper than setting the fields again; a fresh message
    each time, as callers may change it)."""
    key = (arr.dtype, arr.shape)
    built = _TENSOR_TYPES.get(key)
    if built is None:
        if len(_TENSOR_TYPES) >= 4096:  # bounded: shapes seen by a long-lived process
            _TENSOR_TYPES.clear()
        built = _TENSOR_TYPES[key] = _build_tensor_type(arr)
    tp = onnx.TypeProto()
    tp.CopyFrom(built)
    return tp


_TENSOR_TYPES: dict[tuple, onnx.TypeProto] = {}


def _build_tensor_type(arr: np.ndarray) -> onnx.TypeProto:
    tp = onnx.TypeProto()
    t = tp.tensor_type
    t.elem_type = elem_type(arr.dtype)
    shape = t.shape
    shape.SetInParent()  # a scalar has a shape, of no dimensions
    dims = shape.dim
    for d in arr.shape:
        dims.add().dim_value = d
    return tp


# ---------------------------------------------------------------------------------------------
# proto -> IR


class _Scope:
    """Names visible in a graph: its own, then its enclosing graphs' (for subgraphs)."""

    def __init__(self, parent: _Scope | None) -> None:
        self.parent = parent
        self.names: dict[str, Value] = {}

    def lookup(self, name: str) -> Value | None:
        scope: _Scope | None = self
        while scope is not None:
            v = scope.names.get(name)
            if v is not None:
                return v
            scope = scope.parent
        return None


class _Reader:
    def __init__(self, read_external: ExternalReader, ir_version: int = 99,
                 raw_data: Sequence[bytes | memoryview | np.ndarray | None] | None = None,
                 ) -> None:
        self.read_external = read_external
        # Per top-level initializer: its raw_data, when the loader left it out of the proto.
        self.raw_data = raw_data
        # Before IR 4 every initializer had to be listed as a graph input; onnxruntime treats
        # those as constants, not as inputs a caller may override. So do we.
        self.initializers_are_inputs = ir_version < 4

    def graph(
        self, gp: onnx.GraphProto, parent: Graph | None, parent_scope: _Scope | None
    ) -> Graph:
        g = Graph(gp.name, parent)
        g.doc_string = gp.doc_string
        scope = _Scope(parent_scope)

        def define(v: Value) -> None:
            if v.name in scope.names:
                raise InvalidGraph(f"graph '{gp.name}': value '{v.name}' is defined more than once")
            scope.names[v.name] = v

        raw = self.raw_data if parent is None else None
        for i, t in enumerate(gp.initializer):
            arr = tensor_to_array(t, self.read_external, raw[i] if raw else None)
            v = Value(t.name, const_value=arr, graph=g)
            v.type = tensor_type(v.const_value)
            g.initializers[t.name] = v
            define(v)
        for sp in gp.sparse_initializer:
            name = sp.values.name
            v = Value(name, const_value=sparse_to_dense(sp, self.read_external), graph=g)
            v.type = tensor_type(v.const_value)
            g.initializers[name] = v
            g.sparse_initializer_names.add(name)
            define(v)
        for vi in gp.input:
            _check_elem_types(vi, "input")
            existing = g.initializers.get(vi.name)
            if existing is not None and self.initializers_are_inputs:
                continue
            if existing is not None:  # an initializer a caller may override
                existing.type = vi.type
                g.inputs.append(existing)
                continue
            v = Value(vi.name, type=vi.type, graph=g)
            define(v)
            g.inputs.append(v)
        for vi in gp.value_info:
            g.value_info[vi.name] = vi.type

        # Outputs first, so nodes listed out of topological order still connect.
        outputs_of: list[list[Value]] = []
        for np_ in gp.node:
            outs = []
            for name in np_.output:
                v = Value(name, type=g.value_info.get(name), graph=g)
                if name:
                    define(v)
                outs.append(v)
            outputs_of.append(outs)
        for np_, outs in zip(gp.node, outputs_of, strict=True):
            inputs: list[Value | None] = []
            for name in np_.input:
                if not name:
                    inputs.append(None)
                    continue
                v = scope.lookup(name)
                if v is None:
                    raise InvalidGraph(
                        f"node '{np_.name or np_.op_type}' ({np_.op_type}) reads '{name}', which "
                        "is neither a graph input, an initializer, nor the output of any node"
                    )
                inputs.append(v)
            op_type, domain, name = np_.op_type, np_.domain, np_.name
            if type(op_type) is not str or type(domain) is not str or type(name) is not str:
                op_type, domain, name = _node_text(np_)
            attrs = {a.name: self.attribute(a, g, scope) for a in np_.attribute}
            node = Node(
                op_type,
                inputs,
                outs,
                attrs,
                domain=domain,
                name=name,
                overload=getattr(np_, "overload", ""),
                doc_string=np_.doc_string,
            )
            g.append(node)
        for vi in gp.output:
            _check_elem_types(vi, "output")
            v = scope.lookup(vi.name)
            if v is None:
                raise InvalidGraph(f"graph output '{vi.name}' is not produced by the graph")
            if vi.type.WhichOneof("value") is not None:
                v.type = vi.type
            g.outputs.append(v)
        return g

    def attribute(self, a: AttributeProto, g: Graph, scope: _Scope) -> Attribute:
        t = a.type
        if type(a.name) is not str:
            raise InvalidGraph(f"an attribute name is not valid UTF-8: {a.name!r}")
        if a.ref_attr_name:
            return Attribute(a.name, t, None, a.ref_attr_name)
        A = AttributeProto
        if t == A.FLOAT:
            value = float(a.f)
        elif t == A.INT:
            value = int(a.i)
        elif t == A.STRING:
            value = _decode(a.s)
        elif t == A.TENSOR:
            value = tensor_to_array(a.t, self.read_external)
        elif t == A.SPARSE_TENSOR:
            value = sparse_to_dense(a.sparse_tensor, self.read_external)
        elif t == A.GRAPH:
            value = self.graph(a.g, g, scope)
        elif t == A.TYPE_PROTO:
            value = a.tp
        elif t == A.FLOATS:
            value = [float(x) for x in a.floats]
        elif t == A.INTS:
            value = [int(x) for x in a.ints]
        elif t == A.STRINGS:
            value = [_decode(s) for s in a.strings]
        elif t == A.TENSORS:
            value = [tensor_to_array(x, self.read_external) for x in a.tensors]
        elif t == A.SPARSE_TENSORS:
            value = [sparse_to_dense(x, self.read_external) for x in a.sparse_tensors]
        elif t == A.GRAPHS:
            value = [self.graph(x, g, scope) for x in a.graphs]
        elif t == A.TYPE_PROTOS:
            value = list(a.type_protos)
        else:
            raise InvalidGraph(f"attribute '{a.name}' has an undefined type ({t})")
        return Attribute(a.name, t, value)


def _check_elem_types(vi: onnx.ValueInfoProto, what: str) -> None:
    """A graph input's or output's tensor element types must be ones onnx defines."""
    tp = vi.type
    while True:
        kind = tp.WhichOneof("value")
        if kind in ("tensor_type", "sparse_tensor_type"):
            elem = getattr(tp, kind).elem_type
            if elem != TensorProto.UNDEFINED and not _known_data_type(elem):
                narrow = narrow_type_error(elem, f"graph {what} '{vi.name}'")
                if narrow is not None:
                    raise narrow
                raise InvalidGraph(f"graph {what} '{vi.name}': invalid tensor data type {elem}")
            return
        if kind in ("sequence_type", "optional_type"):
            tp = getattr(tp, kind).elem_type
        elif kind == "map_type":
            tp = tp.map_type.value_type
        else:
            return


def _node_text(np_: onnx.NodeProto) -> tuple[str, str, str]:
    """A node's operator type, domain and name when protobuf handed back bytes (a string field
    that is not UTF-8). An operator cannot be looked up by bytes: refused; a name only labels
    the node (onnxruntime accepts any bytes there): kept, undecodable bytes escaped."""
    name = np_.name if type(np_.name) is str else np_.name.decode("utf-8", "backslashreplace")
    for what, text in (("operator type", np_.op_type), ("domain", np_.domain)):
        if type(text) is not str:
            raise InvalidGraph(
                f"node '{name or (np_.output[0] if np_.output else '')}': its {what} is not "
                f"valid UTF-8: {text!r}"
            )
    return np_.op_type, np_.domain, name


def _decode(s: bytes) -> str | bytes:
    try:
        return s.decode("utf-8")
    except UnicodeDecodeError:
        return s


def model_from_proto(
    mp: onnx.ModelProto, read_external: ExternalReader = _no_external,
    raw_data: Sequence[bytes | memoryview | np.ndarray | None] | None = None,
) -> Model:
    """``raw_data``: per top-level initializer, its raw_data when the proto was parsed without
    it (see load.py), else None."""
    opsets: dict[str, int] = {}
    for op in mp.opset_import:
        opsets["" if op.domain == "ai.onnx" else op.domain] = int(op.version)
    graph = _Reader(read_external, int(mp.ir_version), raw_data).graph(mp.graph, None, None)
    return Model(
        graph=graph,
        ir_version=int(mp.ir_version),
        opset_imports=opsets,
        producer_name=mp.producer_name,
        producer_version=mp.producer_version,
        domain=mp.domain,
        model_version=int(mp.model_version),
        doc_string=mp.doc_string,
        metadata_props={p.key: p.value for p in mp.metadata_props},
        functions={(f.domain, f.name): f for f in mp.functions},
    )


# ---------------------------------------------------------------------------------------------
# IR -> proto


def array_to_tensor(arr: np.ndarray, name: str) -> TensorProto:
    return onnx.numpy_helper.from_array(np.asarray(arr), name)


def _attribute_to_proto(a: Attribute) -> AttributeProto:
    if a.ref_attr_name:
        p = AttributeProto(name=a.name, type=a.type, ref_attr_name=a.ref_attr_name)
        return p
    v = a.value
    A = AttributeProto
    if a.type == A.GRAPH:
        v = graph_to_proto(v)
    elif a.type == A.GRAPHS:
        v = [graph_to_proto(x) for x in v]
    elif a.type in (A.TENSOR, A.SPARSE_TENSOR):
        v = array_to_tensor(v, "")
        return onnx.helper.make_attribute(a.name, v, attr_type=A.TENSOR)
    elif a.type in (A.TENSORS, A.SPARSE_TENSORS):
        v = [array_to_tensor(x, "") for x in v]
        return onnx.helper.make_attribute(a.name, v, attr_type=A.TENSORS)
    return onnx.helper.make_attribute(a.name, v, attr_type=a.type)


def _value_info(v: Value) -> onnx.ValueInfoProto:
    vi = onnx.ValueInfoProto(name=v.name)
    if v.type is not None:
        vi.type.CopyFrom(v.type)
    return vi


def _fill_tensor(t: TensorProto, arr: np.ndarray, name: str) -> None:
    """Write ``arr`` into ``t`` in place. Plain numeric arrays go straight to raw_data: building
    a TensorProto and copying it in costs a copy of every weight more."""
    arr = np.asarray(arr)
    if arr.dtype.kind in "biuf" and arr.dtype.isnative and arr.dtype.name in _PLAIN:
        t.name = name
        t.data_type = _PLAIN[arr.dtype.name]
        t.dims.extend(arr.shape)
        t.raw_data = np.ascontiguousarray(arr).tobytes()
    else:
        t.CopyFrom(array_to_tensor(arr, name))


_PLAIN = {n: elem_type(np.dtype(n)) for n in (
    "float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16",
    "uint32", "uint64", "bool")}


def _topological(g: Graph) -> list[Node]:
    """The nodes, each after the nodes it reads from (subgraphs' outer reads included), as onnx's
    checker wants them; stable, so a sorted list comes back as it is. The IR keeps the order the
    model listed, which onnxruntime does not require to be sorted."""
    index = {id(n): i for i, n in enumerate(g.nodes)}
    deps: list[set[int]] = []
    for n in g.nodes:
        read = [v for v in n.inputs if v is not None]
        for sub in n.subgraphs():
            read.extend(sub.outer_references())
        deps.append({index[id(v.producer)] for v in read
                     if v.producer is not None and id(v.producer) in index})
    if all(all(d < i for d in ds) for i, ds in enumerate(deps)):
        return list(g.nodes)
    order, stuck = stable_topological_order(deps)
    order += stuck  # a cycle: left for the checker to name
    return [g.nodes[i] for i in order]


def graph_to_proto(g: Graph, initializers_as_inputs: bool = False,
                   gp: onnx.GraphProto | None = None) -> onnx.GraphProto:
    """``g`` as a GraphProto, written into ``gp`` when given (no copy of the weights)."""
    if gp is None:
        gp = onnx.GraphProto()
    gp.name, gp.doc_string = g.name, g.doc_string
    gp.input.extend(_value_info(v) for v in g.inputs)
    if initializers_as_inputs:  # IR < 4 requires it
        listed = {v.name for v in g.inputs}
        gp.input.extend(_value_info(v) for n, v in g.initializers.items() if n not in listed)
    gp.output.extend(_value_info(v) for v in g.outputs)
    for name, v in g.initializers.items():
        _fill_tensor(gp.initializer.add(), v.const_value, name)
    for n in _topological(g):
        np_ = onnx.NodeProto(
            op_type=n.op_type,
            domain=n.domain,
            name=n.name,
            doc_string=n.doc_string,
            input=[v.name if v is not None else "" for v in n.inputs],
            output=[v.name for v in n.outputs],
        )
        if n.overload:
            np_.overload = n.overload
        np_.attribute.extend(_attribute_to_proto(a) for a in n.attributes.values())
        gp.node.append(np_)
        for v in n.outputs:
            if v.type is not None and v.name and v not in g.outputs:
                gp.value_info.append(_value_info(v))
    return gp


def model_to_proto(m: Model) -> onnx.ModelProto:
    mp = onnx.ModelProto(
        ir_version=m.ir_version,
        producer_name=m.producer_name,
        producer_version=m.producer_version,
        domain=m.domain,
        model_version=m.model_version,
        doc_string=m.doc_string,
    )
    graph_to_proto(m.graph, initializers_as_inputs=m.ir_version < 4, gp=mp.graph)
    for domain, version in m.opset_imports.items():
        mp.opset_import.append(onnx.helper.make_opsetid(domain, version))
    for k, v in m.metadata_props.items():
        mp.metadata_props.append(onnx.StringStringEntryProto(key=k, value=v))
    mp.functions.extend(m.functions.values())
    return mp
