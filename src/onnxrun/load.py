"""Step 1 of a session: turn a path, bytes or ModelProto into onnxrun's IR.

External data is read here, under one rule: a tensor's ``location`` must name a file inside the
model's folder. Absolute paths, ``..`` escapes and symlinks leading out are refused before any
byte is read, and offset/length are checked against the file's size. A caller may also hand
the files' bytes, or the tensors themselves, from memory (SessionOptions'
``add_external_initializers*``).
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnx
import onnx.inliner
from google.protobuf.message import DecodeError
from onnx import TensorProto

from .errors import InvalidGraph, InvalidProtobuf, NoSuchFile
from .ir import Model, model_from_proto

ModelSource = str | os.PathLike | bytes | bytearray | memoryview | onnx.ModelProto


class ExternalDataReader:
    """Reads tensors' external data from files under ``base_dir`` and nowhere else, or from the
    caller's buffers: ``files`` (location -> the file's bytes, onnxruntime's
    ``add_external_initializers_from_files_in_memory``) and ``provided`` (tensor name -> the
    array that replaces it, ``add_external_initializers``: its file is never opened)."""

    def __init__(self, base_dir: str | os.PathLike | None,
                 files: Mapping[str, memoryview] | None = None,
                 provided: Mapping[str, np.ndarray] | None = None) -> None:
        self.base_dir = Path(base_dir).resolve() if base_dir is not None else None
        self.files = {os.path.normpath(k): v for k, v in (files or {}).items()}
        self.provided = provided or {}

    def __call__(self, tensor: TensorProto) -> bytes | memoryview:
        info = {e.key: e.value for e in tensor.external_data}
        location = info.get("location", "")
        given = self.provided.get(tensor.name)
        if given is not None:
            # the user's array replaces the tensor after loading; here its bytes stand in, so
            # the declared type and shape are still checked against it
            return memoryview(np.ascontiguousarray(given)).cast("B")
        if location and os.path.normpath(location) in self.files:
            data = self.files[os.path.normpath(location)]
            offset, length = self._range(tensor, info, len(data), location)
            return data[offset:len(data) if length is None else offset + length]
        if self.base_dir is None:
            raise InvalidGraph(
                f"tensor '{tensor.name}' keeps its data in external file '{location}', but the "
                "model was given as bytes: load it from its path, or set the session config entry "
                "'session.model_external_initializers_file_folder_path'"
            )
        if not location:
            raise InvalidGraph(f"tensor '{tensor.name}' is external but names no location")
        if os.path.isabs(location) or location.startswith(("/", "\\")) or "\x00" in location:
            raise InvalidGraph(
                f"tensor '{tensor.name}': external data location '{location}' is an absolute "
                "path; only files inside the model's folder may be read"
            )
        path = (self.base_dir / location).resolve()
        if not path.is_relative_to(self.base_dir):
            raise InvalidGraph(
                f"tensor '{tensor.name}': external data location '{location}' points outside "
                f"the model's folder '{self.base_dir}'; refused"
            )
        if not path.is_file():
            raise NoSuchFile(f"tensor '{tensor.name}': external data file '{path}' not found")
        size = path.stat().st_size
        offset, length = self._range(tensor, info, size, path.name)
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read(size - offset if length is None else length)
        return data

    @staticmethod
    def _range(tensor: TensorProto, info: dict[str, str], size: int, file: str
               ) -> tuple[int, int | None]:
        """The (offset, length) of the tensor's bytes, checked against the file's size."""
        try:
            offset = int(info.get("offset", "0") or 0)
            length = int(info["length"]) if info.get("length") else None
        except ValueError:
            raise InvalidGraph(
                f"tensor '{tensor.name}': malformed external data offset/length"
            ) from None
        if (
            offset < 0
            or offset > size
            or (length is not None and (length < 0 or offset + length > size))
        ):
            raise InvalidGraph(
                f"tensor '{tensor.name}': external data range offset={offset} length={length} "
                f"exceeds the {size} bytes of '{file}'"
            )
        return offset, length


def parse_model(source: ModelSource) -> tuple[onnx.ModelProto, Path | None]:
    """Parse the source into a ModelProto (external data not yet read) and the model's folder."""
    if isinstance(source, onnx.ModelProto):
        return source, None
    if isinstance(source, bytes | bytearray | memoryview):
        return _parse_bytes(bytes(source), "<bytes>"), None
    if isinstance(source, str | os.PathLike):
        path = Path(source)
        if not path.exists():
            raise NoSuchFile(f"Load model from {os.fspath(source)} failed: file does not exist")
        if not path.is_file():
            raise NoSuchFile(f"Load model from {os.fspath(source)} failed: not a file")
        return _parse_bytes(path.read_bytes(), os.fspath(source)), path.resolve().parent
    raise TypeError(
        "InferenceSession expects a model path (str or PathLike), serialized bytes or an "
        f"onnx.ModelProto, got {type(source).__name__}"
    )


def _parse_source(
    source: ModelSource,
) -> tuple[onnx.ModelProto, Path | None, list[memoryview | None] | None]:
    """parse_model, with the large weights of serialized models left out of the parse: the
    third value gives, per top-level initializer, a view of its raw_data in the file's bytes
    (None: in the proto as usual). Parsing copies every weight into the protobuf, and reading
    ``raw_data`` back copies it again; from the views, the loader copies each weight once."""
    if isinstance(source, str | os.PathLike) and Path(source).is_file():
        path = Path(source)
        data, origin, folder = _map_file(path), os.fspath(source), path.resolve().parent
    elif isinstance(source, bytes):
        data, origin, folder = source, "<bytes>", None
    else:
        mp, folder = parse_model(source)
        return mp, folder, None
    split = _strip_weights(data)
    if split is not None:
        stripped, raw = split
        mp = onnx.ModelProto()
        try:
            mp.ParseFromString(stripped)
        except (DecodeError, RuntimeError, ValueError):
            mp = None
        if mp is not None and len(mp.graph.initializer) == len(raw) and mp.ir_version > 0:
            return mp, folder, raw
    return _parse_bytes(bytes(data), origin), folder, None


_MAP_MIN_BYTES = 1 << 20


def _map_file(path: Path) -> bytes | mmap.mmap:
    """The file's bytes; a large file is mapped rather than read. The weights are copied out
    of it once (into aligned arrays of their own), so a read would only add a copy of the
    whole file, and a buffer of its size to allocate. The mapping goes when the last view of
    it does, once the model is loaded."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < _MAP_MIN_BYTES:
            return f.read()
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)


# -- the protobuf wire format, just enough to find the initializers' raw_data -------------------

_MIN_VIEW_BYTES = 1024  # smaller raw_data stays in the proto: a view would save nothing
_GRAPH, _FUNCTIONS = 7, 25  # ModelProto fields
_INITIALIZER = 5  # GraphProto field
_SEGMENT, _RAW_DATA, _DATA_LOCATION = 3, 9, 14  # TensorProto fields


class _Unusual(Exception):
    """A layout the scanner does not handle: the protobuf parser reads the whole model."""


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise _Unusual


def _encode_varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _fields(data: bytes, pos: int, end: int):
    """(field number, wire type, start of the field, start of its payload, end) per field."""
    while pos < end:
        start = pos
        key, pos = _varint(data, pos)
        field, wire = key >> 3, key & 7
        body = pos
        if wire == 0:
            _, pos = _varint(data, pos)
        elif wire == 1:
            pos += 8
        elif wire == 2:
            size, body = _varint(data, pos)
            pos = body + size
        elif wire == 5:
            pos += 4
        else:  # groups: not in ONNX
            raise _Unusual
        if pos > end:
            raise _Unusual
        yield field, wire, start, body, pos


def _raw_data_span(data: bytes, pos: int, end: int) -> tuple[int, int, int] | None:
    """(field start, payload start, end) of a TensorProto's one raw_data field, if it has one
    and nothing that would change how it is read (a segment, a data_location)."""
    found = None
    for field, wire, start, body, stop in _fields(data, pos, end):
        if field == _RAW_DATA and wire == 2:
            if found is not None:
                return None
            found = (start, body, stop)
        elif field in (_SEGMENT, _DATA_LOCATION):
            return None
    return found


def _strip_weights(data: bytes | mmap.mmap) -> tuple[bytes, list[memoryview | None]] | None:
    try:
        return _strip(data)
    except (_Unusual, IndexError):
        return None


def _strip(data: bytes | mmap.mmap) -> tuple[bytes, list[memoryview | None]] | None:
    graph = None
    for field, wire, start, body, stop in _fields(data, 0, len(data)):
        if field == _FUNCTIONS:
            return None  # functions are inlined on the proto: keep it whole
        if field == _GRAPH and wire == 2:
            if graph is not None:
                return None  # a repeated message field is merged: leave that to protobuf
            graph = (start, body, stop)
    if graph is None:
        return None
    g_start, g_body, g_end = graph
    view = memoryview(data)
    chunks: list[bytes | memoryview] = []
    raw: list[memoryview | None] = []
    copied = g_body
    for field, wire, start, body, stop in _fields(data, g_body, g_end):
        if field != _INITIALIZER:
            continue
        if wire != 2:
            raise _Unusual
        span = _raw_data_span(data, body, stop)
        if span is None or span[2] - span[1] < _MIN_VIEW_BYTES:
            raw.append(None)
            continue
        r_start, r_body, r_end = span
        chunks += [view[copied:start], _encode_varint((_INITIALIZER << 3) | 2),
                   _encode_varint(stop - body - (r_end - r_start)), view[body:r_start],
                   view[r_end:stop]]
        raw.append(view[r_body:r_end])
        copied = stop
    if not any(r is not None for r in raw):
        return None
    chunks.append(view[copied:g_end])
    graph_bytes = b"".join(chunks)
    stripped = b"".join([view[:g_start], _encode_varint((_GRAPH << 3) | 2),
                         _encode_varint(len(graph_bytes)), graph_bytes, view[g_end:]])
    return stripped, raw


def _parse_bytes(data: bytes, origin: str) -> onnx.ModelProto:
    mp = onnx.ModelProto()
    try:
        mp.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as e:
        raise InvalidProtobuf(
            f"Load model from {origin} failed: protobuf parsing failed ({e})"
        ) from None
    # Random bytes can parse as a message that is almost empty; a model has a graph and a version.
    if not mp.HasField("graph") or mp.ir_version <= 0:
        raise InvalidProtobuf(
            f"Load model from {origin} failed: the data is not an ONNX model "
            f"(ir_version={mp.ir_version}, graph "
            f"{'present' if mp.HasField('graph') else 'missing'})"
        )
    return mp


def load_model(
    source: ModelSource, external_data_dir: str | os.PathLike | None = None,
    files: Mapping[str, memoryview] | None = None,
    provided: Mapping[str, np.ndarray] | None = None,
) -> tuple[onnx.ModelProto, Model]:
    """Parse and convert a model. Returns the proto (for validation) and the IR.
    ``files`` and ``provided``: external data the caller holds in memory (ExternalDataReader)."""
    mp, folder, raw = _parse_source(source)
    if len(mp.functions):
        # Model-local functions run by expansion: inline them once, at load.
        try:
            mp = onnx.inliner.inline_local_functions(mp)
        except Exception as e:
            raise InvalidGraph(f"model-local functions could not be inlined: {e}") from None
    reader = ExternalDataReader(external_data_dir if external_data_dir is not None else folder,
                                files, provided)
    return mp, model_from_proto(mp, reader, raw)
