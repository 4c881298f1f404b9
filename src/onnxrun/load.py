"""Step 1 of a session: turn a path, bytes or ModelProto into onnxrun's IR.

What is read, and from where:

- The model file is read, never mapped: a file truncated or rewritten while it loads gives an
  error (a short or mixed read fails to parse), where a mapping would raise SIGBUS and kill the
  process. A scan of the protobuf wire format reads all but the large weights, which are read
  straight from the file into arrays of their own: no buffer of the whole file is made.
- External data follows one rule. A tensor's ``location`` must be relative with no ``..``
  component (checked on the string). It names a file relative to the model path as given, and
  that file may resolve (symlinks followed) inside the folder of the model path as given, or
  inside the folder the model file itself resolves to: Hugging Face's hub cache keeps
  ``snapshots/<rev>/model.onnx`` and ``model.onnx_data`` as symlinks into ``../../blobs/``.
  Anything else is refused. A model given as bytes reads from the session config entry's folder,
  or from the working directory, as onnxruntime does. A caller may also hand the files' bytes,
  or the tensors themselves, from memory (SessionOptions' ``add_external_initializers*``).
- What is checked is what is read: each file is opened, then the opened file's real path is
  checked against the rule, and only that file descriptor is read. A folder swapped for a
  symlink between a check and an open cannot redirect a read.
"""

from __future__ import annotations

import io
import os
import stat
import sys
from collections.abc import Mapping, Sequence

import numpy as np
from google.protobuf.message import DecodeError

from .errors import Fail, InvalidGraph, InvalidProtobuf, NoSuchFile
from .inline import inline_local_functions
from .ir import Model, model_from_proto
from .proto import HAVE_ONNX, onnx

TensorProto = onnx.TensorProto

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None

ModelSource = str | os.PathLike | bytes | bytearray | memoryview | onnx.ModelProto

_CONFIG_FOLDER = "session.model_external_initializers_file_folder_path"

# O_NONBLOCK: opening a FIFO (or a device) must not block the loader; a regular file ignores it.
_OPEN_FLAGS = (os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0)
               | getattr(os, "O_BINARY", 0))


def _open_regular(path: str, what: str) -> int:
    """A descriptor of the regular file at ``path``, for reading. ``what`` starts the message
    of the NoSuchFile raised when it is missing (or vanished since a check) or not a file."""
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except (FileNotFoundError, NotADirectoryError):
        raise NoSuchFile(f"{what}: file does not exist") from None
    except IsADirectoryError:
        raise NoSuchFile(f"{what}: not a file") from None
    except OSError as e:
        raise Fail(f"{what}: {e.strerror or e}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NoSuchFile(f"{what}: not a file")
        if _OPEN_FLAGS & getattr(os, "O_NONBLOCK", 0):
            os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _opened_path(fd: int, path: str) -> str | None:
    """The real path of the file open at ``fd`` (opened from ``path``), or None when it cannot
    be told: the file the descriptor reads, not whatever ``path`` names now."""
    if sys.platform.startswith("linux"):
        try:
            real = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # /proc not mounted: the fallback below
            real = None
        if real is not None and real.startswith("/"):
            if real.endswith(" (deleted)") and os.fstat(fd).st_nlink == 0:
                real = real[: -len(" (deleted)")]  # unlinked since opened: its bytes stay readable
            return real
    if hasattr(fcntl, "F_GETPATH"):  # macOS
        try:
            raw = fcntl.fcntl(fd, fcntl.F_GETPATH, bytes(4096))
            return os.fsdecode(raw.split(b"\0", 1)[0])
        except OSError:
            pass
    # Elsewhere: the path resolved now is the file only if it is the same device and inode.
    real = _realpath(path)
    try:
        st, opened = os.stat(real), os.fstat(fd)
    except (OSError, TypeError):
        return None
    return real if (st.st_dev, st.st_ino) == (opened.st_dev, opened.st_ino) else None


def _realpath(path: str) -> str | None:
    """os.path.realpath, or None when a component changed while it was resolved (Python 3.11's
    realpath raises then: a symlink it saw may be a folder by the time it reads the link)."""
    try:
        return os.path.realpath(path)
    except OSError:
        return None


def _inside(real: str, folders: Sequence[str]) -> bool:
    real = os.path.normcase(real)
    return any(real.startswith(os.path.join(os.path.normcase(f), "")) for f in folders)


class ExternalDataReader:
    """Reads tensors' external data under the folder rule (see the module's docstring), or from
    the caller's buffers: ``files`` (location -> the file's bytes, onnxruntime's
    ``add_external_initializers_from_files_in_memory``) and ``provided`` (tensor name -> the
    array that replaces it, ``add_external_initializers``: its file is never opened).

    ``base``: the folder locations are relative to; ``folders``: the real paths of the folders
    a data file may resolve into; ``origin``: where the locations come from, for messages. Each
    data file is opened once per load: use the reader as a context manager, which closes them.
    """

    def __init__(self, base: str, folders: Sequence[str], origin: str,
                 files: Mapping[str, memoryview] | None = None,
                 provided: Mapping[str, np.ndarray] | None = None) -> None:
        self.base, self.folders, self.origin = base, list(dict.fromkeys(folders)), origin
        self._files: dict[str, tuple[io.FileIO, int]] = {}
        self.files = {os.path.normpath(k): v for k, v in (files or {}).items()}
        self.provided = provided or {}

    def __enter__(self) -> ExternalDataReader:
        return self

    def __exit__(self, *exc: object) -> None:
        for f, _ in self._files.values():
            f.close()
        self._files.clear()

    def _refuse(self, name: str, location: str, why: str) -> InvalidGraph:
        return InvalidGraph(
            f"External data path validation failed for tensor '{name}': location '{location}' "
            f"{why}; only files inside the model's folder may be read"
        )

    def _outside(self, name: str, location: str, real: str) -> InvalidGraph:
        folders = " or ".join(repr(f) for f in self.folders)
        return self._refuse(name, location, f"resolves to '{real}', outside the model's folder "
                            f"({folders})")

    def _open(self, name: str, location: str) -> tuple[io.FileIO, int, str]:
        path = os.path.join(self.base, location)
        if path in self._files:
            return (*self._files[path], path)
        # Checked before opening too, so nothing outside is even opened (a device, a FIFO)
        # unless a swap happens in between; the check that counts is on the opened file.
        real = _realpath(path)
        if real is not None and not _inside(real, self.folders):
            raise self._outside(name, location, real)
        fd = _open_regular(path, f"tensor '{name}': external data file '{path}' ({self.origin})")
        try:
            real = _opened_path(fd, path)
            if real is None or not _inside(real, self.folders):
                raise self._outside(name, location, real or path)
            f = io.FileIO(fd, "rb", closefd=True)
        except BaseException:
            os.close(fd)
            raise
        self._files[path] = (f, os.fstat(fd).st_size)
        return f, self._files[path][1], path

    def __call__(self, tensor: TensorProto) -> np.ndarray | memoryview:
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
        if not location:
            raise InvalidGraph(f"tensor '{tensor.name}' is external but names no location")
        if "\x00" in location:
            raise self._refuse(tensor.name, location, "holds a NUL character")
        if (os.path.isabs(location) or location.startswith(("/", "\\"))
                or os.path.splitdrive(location)[0]):
            raise self._refuse(tensor.name, location, "is an absolute path")
        if ".." in location.replace("\\", "/").split("/"):
            raise self._refuse(tensor.name, location, "has a '..' component")
        f, size, path = self._open(tensor.name, location)
        offset, length = self._range(tensor, info, size, os.path.basename(path))
        data = np.empty(size - offset if length is None else length, np.uint8)
        if _read_at(f, offset, data) < len(data):  # only if the file shrank since its fstat
            raise InvalidGraph(
                f"tensor '{tensor.name}': external data file '{path}' ended before byte "
                f"{offset + len(data)}, the end of its range (it changed while loading)"
            )
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


def _external_reader(model_path: tuple[str, str | None] | None,
                     folder: str | os.PathLike | None,
                     files: Mapping[str, memoryview] | None,
                     provided: Mapping[str, np.ndarray] | None) -> ExternalDataReader:
    """The reader for a model read from ``model_path`` ((path as given, real path), None for
    bytes or a ModelProto), with ``folder`` the session config entry's, if set."""
    if folder is not None:
        base = os.path.abspath(os.fspath(folder))
        folders, origin = [os.path.realpath(base)], (
            f"from the folder {base!r} of session config entry '{_CONFIG_FOLDER}'")
    elif model_path is None:
        try:
            base = os.getcwd()
        except OSError:  # removed: only an external data file would need it
            base = os.path.join(os.sep, "<the working directory, removed>")
        folders, origin = [os.path.realpath(base)], (
            "the model was given as bytes: locations are read from the working directory, or "
            f"from the folder of session config entry '{_CONFIG_FOLDER}'")
    else:
        given, real = model_path
        # Not normalized: 'link/../m.onnx' names what the OS opened, wherever link points.
        base = os.path.dirname(given if os.path.isabs(given) else os.path.join(os.getcwd(), given))
        folders = [os.path.realpath(base)] + ([os.path.dirname(real)] if real else [])
        origin = f"for model '{given}'"
    return ExternalDataReader(base, folders, origin, files, provided)


Raw = bytes | memoryview | np.ndarray


def _parse_source(
    source: ModelSource,
) -> tuple[onnx.ModelProto, tuple[str, str | None] | None, list[Raw | None] | None]:
    """Parse the source into a ModelProto (external data not yet read). Also returns the model
    file's (path as given, real path), None for bytes or a ModelProto, and the large weights of
    a serialized model, left out of the parse: per top-level initializer, its raw_data (None:
    in the proto as usual). Parsing copies every weight into the protobuf, and reading
    ``raw_data`` back copies it again; this way each weight is copied once."""
    if isinstance(source, onnx.ModelProto):
        return source, None, None
    if isinstance(source, str | os.PathLike):
        given = os.fsdecode(os.fspath(source))
        fd = _open_regular(given, f"Load model from {given} failed")
        try:
            real = _opened_path(fd, given)
            with io.FileIO(fd, "rb", closefd=False) as f:
                mp, raw = _parse_file(f, given)
        finally:
            os.close(fd)
        return mp, (given, real), raw
    if isinstance(source, bytes | bytearray | memoryview):
        data = bytes(source)
        split = _strip_weights(data)
        if split is not None:
            mp = _parse_stripped(split[0], len(split[1]))
            if mp is not None:
                view = memoryview(data)  # each view is copied once, into an aligned array
                return mp, None, [None if s is None else view[s[0]:s[1]] for s in split[1]]
        return _parse_bytes(data, "<bytes>"), None, None
    raise TypeError(
        "InferenceSession expects a model path (str or PathLike), serialized bytes or an "
        f"onnx.ModelProto, got {type(source).__name__}"
    )


def _parse_file(f: io.FileIO, origin: str) -> tuple[onnx.ModelProto, list[Raw | None] | None]:
    size = os.fstat(f.fileno()).st_size
    if size <= _WHOLE_READ:
        # read at once and scanned in memory, as serialized bytes are (the file window's
        # per-byte reads made the scan of a 70 KB model ~10 ms)
        data = f.readall()
        split = _strip_weights(data)
        if split is not None:
            mp = _parse_stripped(split[0], len(split[1]))
            if mp is not None:
                view = memoryview(data)
                return mp, [None if s is None else view[s[0]:s[1]] for s in split[1]]
        return _parse_bytes(data, origin), None
    split = _strip_weights(_FileWindow(f, size))
    if split is not None:
        mp = _parse_stripped(split[0], len(split[1]))
        if mp is not None:
            return mp, [None if s is None else _read_weight(f, *s, origin) for s in split[1]]
    f.seek(0)
    return _parse_bytes(f.readall(), origin), None


def _parse_stripped(stripped: bytes, initializers: int) -> onnx.ModelProto | None:
    mp = onnx.ModelProto()
    try:
        mp.ParseFromString(stripped)
    except (DecodeError, RuntimeError, ValueError):
        return None
    if len(mp.graph.initializer) != initializers or mp.ir_version <= 0:
        return None
    return mp


def _read_at(f: io.FileIO, offset: int, buffer: bytearray | memoryview) -> int:
    """Fill ``buffer`` from the file's bytes at ``offset``; how many bytes there were."""
    f.seek(offset)
    got, view = 0, memoryview(buffer).cast("B")
    while got < len(view):
        n = f.readinto(view[got:])
        if not n:
            break
        got += n
    return got


def _read_weight(f: io.FileIO, start: int, end: int, origin: str) -> np.ndarray:
    """A weight's raw_data, read from the file straight into an (aligned) array of its own."""
    arr = np.empty(end - start, np.uint8)
    if _read_at(f, start, arr) < len(arr):
        raise InvalidProtobuf(
            f"Load model from {origin} failed: the file ends inside a tensor's data (it changed "
            "while loading)"
        )
    return arr


class _FileWindow:
    """The file's bytes as the scanner reads them (``data[i]``, ``data[a:b]``), through a small
    buffer: only what the scan asks for is read. Past the end of a file that shrank: IndexError,
    and the scan gives up."""

    _SPAN = 1 << 16

    def __init__(self, f: io.FileIO, size: int) -> None:
        self.f, self.size, self.start, self.buf = f, size, 0, b""

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int | slice) -> int | bytes:
        if isinstance(i, slice):
            start, stop, _ = i.indices(self.size)
            buf = bytearray(max(stop - start, 0))
            if _read_at(self.f, start, buf) < len(buf):
                raise IndexError(i)
            return bytes(buf)
        if not 0 <= i - self.start < len(self.buf):
            buf = bytearray(min(self._SPAN, max(self.size - i, 1)))
            self.buf, self.start = buf[: _read_at(self.f, i, buf)], i
            if not self.buf:
                raise IndexError(i)
        return self.buf[i - self.start]


# -- the protobuf wire format, just enough to find the initializers' raw_data -------------------

_MIN_VIEW_BYTES = 1024  # smaller raw_data stays in the proto: a view would save nothing
_WHOLE_READ = 4 << 20  # model files up to this size are read whole before the scan
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


Spans = list[tuple[int, int] | None]


def _strip_weights(data: bytes | _FileWindow) -> tuple[bytes, Spans] | None:
    """The model's bytes without its initializers' large raw_data, and where each was (payload
    start and end; None: left in the proto), or None for a layout the scan does not handle."""
    try:
        return _strip(data)
    except (_Unusual, IndexError):
        return None


def _strip(data: bytes | _FileWindow) -> tuple[bytes, Spans] | None:
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
    view = memoryview(data) if isinstance(data, bytes) else data  # slices: no copy of bytes
    chunks: list[bytes | memoryview] = []
    raw: Spans = []
    copied = g_body
    for field, wire, start, body, stop in _fields(data, g_body, g_end):
        if field != _INITIALIZER:
            continue
        if wire != 2:
            raise _Unusual
        # (a tensor smaller than a view's minimum is not scanned: most of a model's are)
        span = _raw_data_span(data, body, stop) if stop - body >= _MIN_VIEW_BYTES else None
        if span is None or span[2] - span[1] < _MIN_VIEW_BYTES:
            raw.append(None)
            continue
        r_start, r_body, r_end = span
        chunks += [view[copied:start], _encode_varint((_INITIALIZER << 3) | 2),
                   _encode_varint(stop - body - (r_end - r_start)), view[body:r_start],
                   view[r_end:stop]]
        raw.append((r_body, r_end))
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
    ``external_data_dir``: the folder external data is read from instead of the model's (the
    session config entry 'session.model_external_initializers_file_folder_path'); ``files``
    and ``provided``: external data the caller holds in memory (ExternalDataReader)."""
    mp, model_path, raw = _parse_source(source)
    if len(mp.functions):
        # Model-local functions run by expansion: inline them once, at load.
        try:
            if HAVE_ONNX:
                import onnx.inliner

                mp = onnx.inliner.inline_local_functions(mp)
            else:
                mp = inline_local_functions(mp)
        except InvalidGraph:
            raise
        except Exception as e:
            raise InvalidGraph(f"model-local functions could not be inlined: {e}") from None
    with _external_reader(model_path, external_data_dir, files, provided) as reader:
        _inline_attribute_data(mp.graph, reader)
        return mp, model_from_proto(mp, reader, raw)


def _inline_attribute_data(graph: onnx.GraphProto, reader: ExternalDataReader) -> None:
    """Put the external data of tensors in node attributes (a Constant's value) into the proto:
    validation checks these tensors, and onnx's checker would look for their files itself,
    relative to the working directory and under rules of its own."""
    for node in graph.node:
        for a in node.attribute:
            tensors = [a.t] if a.HasField("t") else list(a.tensors)
            for sp in [a.sparse_tensor] if a.HasField("sparse_tensor") else a.sparse_tensors:
                tensors += [sp.values, sp.indices]
            for t in tensors:
                if t.data_location == TensorProto.EXTERNAL:
                    t.raw_data = bytes(reader(t))
                    del t.external_data[:]
                    t.data_location = TensorProto.DEFAULT
            for g in [a.g] if a.HasField("g") else a.graphs:
                _inline_attribute_data(g, reader)
