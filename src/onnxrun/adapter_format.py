"""onnxruntime's LoRA adapter file (``.onnx_adapter``): a FlatBuffers buffer with the schema of
onnxruntime's ``adapter_schema.fbs`` (identifier "TORT")::

    table Parameter { name:string; dims:[int64]; data_type:int32 (ONNX element type);
                      raw_data:[uint8] (force_align: 8); }
    table Adapter { format_version:int; adapter_version:int; model_version:int;
                    parameters:[Parameter]; }

FlatBuffers in brief: a buffer starts with the root table's offset (uint32) and the identifier;
a table starts with an int32 that locates its vtable (vtable = table - that value), and the
vtable lists, per field, its offset in the table (0: absent, the default). Strings, vectors and
sub-tables are reached through uint32 offsets relative to the field holding them; a vector is a
uint32 count followed by its elements. Everything is little-endian and aligned to its size.
The reader checks every offset against the buffer; the writer lays objects out front to back.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from .errors import InvalidArgument

FORMAT_VERSION = 1
IDENTIFIER = b"TORT"
STRING = 8  # the element type a parameter may not have


@dataclass
class Parameter:
    name: str
    dims: list[int]
    data_type: int  # ONNX TensorProto element type
    raw_data: memoryview  # little-endian element bytes


@dataclass
class Adapter:
    format_version: int
    adapter_version: int
    model_version: int
    parameters: list[Parameter]


# -- reading ------------------------------------------------------------------------------------

class _Reader:
    def __init__(self, buf: memoryview, what: str) -> None:
        self.buf, self.what = buf, what

    def fail(self, why: str) -> InvalidArgument:
        return InvalidArgument(f"{self.what} is not a valid onnxruntime adapter file: {why}")

    def _unpack(self, fmt: str, pos: int) -> int:
        size = struct.calcsize(fmt)
        if pos < 0 or pos + size > len(self.buf):
            raise self.fail(f"offset {pos} is outside the {len(self.buf)}-byte buffer")
        return struct.unpack_from(fmt, self.buf, pos)[0]

    def u32(self, pos: int) -> int:
        return self._unpack("<I", pos)

    def field(self, table: int, index: int) -> int | None:
        """The position of field ``index`` of the table at ``table``, None when absent."""
        vtable = table - self._unpack("<i", table)
        vt_size = self._unpack("<H", vtable)
        if vt_size < 4 or vt_size % 2:
            raise self.fail(f"malformed vtable at {vtable}")
        if 4 + 2 * index >= vt_size:
            return None
        offset = self._unpack("<H", vtable + 4 + 2 * index)
        return table + offset if offset else None

    def scalar(self, table: int, index: int, fmt: str = "<i") -> int:
        pos = self.field(table, index)
        return 0 if pos is None else self._unpack(fmt, pos)

    def target(self, table: int, index: int) -> int | None:
        pos = self.field(table, index)
        return None if pos is None else pos + self.u32(pos)

    def vector(self, table: int, index: int, item_size: int) -> tuple[int, int]:
        """(position of the first element, count) of a vector field; (0, 0) when absent."""
        start = self.target(table, index)
        if start is None:
            return 0, 0
        count = self.u32(start)
        if start + 4 + count * item_size > len(self.buf):
            raise self.fail(f"a vector of {count} items runs past the end of the buffer")
        return start + 4, count

    def string(self, table: int, index: int) -> str:
        start, count = self.vector(table, index, 1)
        try:
            return bytes(self.buf[start:start + count]).decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail("a parameter name is not UTF-8") from None


def read(data: bytes | memoryview, what: str = "the buffer") -> Adapter:
    """Parse an adapter file's bytes. Parameter data are views of ``data``, not copies."""
    buf = memoryview(data).cast("B")
    r = _Reader(buf, what)
    if len(buf) < 8 or bytes(buf[4:8]) != IDENTIFIER:
        raise r.fail(f"it does not carry the identifier {IDENTIFIER.decode()}")
    root = r.u32(0)
    version = r.scalar(root, 0)
    if version != FORMAT_VERSION:
        raise r.fail(f"format version {version}, this reader knows {FORMAT_VERSION}")
    first, count = r.vector(root, 3, 4)
    parameters = []
    for i in range(count):
        slot = first + 4 * i
        table = slot + r.u32(slot)
        dims_at, ndims = r.vector(table, 1, 8)
        data_at, nbytes = r.vector(table, 3, 1)
        dims = list(struct.unpack_from(f"<{ndims}q", buf, dims_at)) if ndims else []
        parameters.append(Parameter(r.string(table, 0), dims, r.scalar(table, 2),
                                    buf[data_at:data_at + nbytes]))
    return Adapter(version, r.scalar(root, 1), r.scalar(root, 2), parameters)


# -- writing ------------------------------------------------------------------------------------

class _Writer:
    def __init__(self) -> None:
        self.buf = bytearray()

    def align(self, n: int, then: int = 0) -> None:
        """Pad so that the position ``then`` bytes ahead is a multiple of ``n``."""
        self.buf += b"\0" * (-(len(self.buf) + then) % n)

    def put(self, fmt: str, *values: int) -> int:
        pos = len(self.buf)
        self.buf += struct.pack(fmt, *values)
        return pos

    def patch_offset(self, at: int) -> None:
        """Point the uint32 at ``at`` to the current position."""
        struct.pack_into("<I", self.buf, at, len(self.buf) - at)

    def table(self, fields: list[str]) -> tuple[int, list[int]]:
        """A vtable and its table for ``fields`` (struct formats, one value each, all 4 bytes),
        values zero; returns the table's position and each field's position."""
        self.align(4)
        vtable = self.put(f"<{2 + len(fields)}H", 4 + 2 * len(fields), 4 + 4 * len(fields),
                          *(4 + 4 * i for i in range(len(fields))))
        self.align(4)
        table = self.put("<i", 0)
        struct.pack_into("<i", self.buf, table, table - vtable)
        return table, [self.put(f, 0) for f in fields]

    def vector(self, at: int, count: int, payload: bytes, align: int) -> None:
        """A vector of ``count`` items (``payload``), its elements aligned to ``align``,
        referenced from the offset field at ``at``."""
        self.align(max(align, 4), then=4)
        self.patch_offset(at)
        self.put("<I", count)
        self.buf += payload


def write(adapter: Adapter) -> bytes:
    """The bytes of an adapter file (string parameters refused: InvalidArgument)."""
    for p in adapter.parameters:
        if p.data_type == STRING:
            raise InvalidArgument(
                f"adapter parameter '{p.name}' is a STRING tensor: adapter files hold numeric "
                "tensors only")
    w = _Writer()
    root_offset = w.put("<I", 0)
    w.buf += IDENTIFIER
    root, (version, adapter_version, model_version, params) = w.table(["<i", "<i", "<i", "<I"])
    struct.pack_into("<I", w.buf, root_offset, root)
    struct.pack_into("<iii", w.buf, version, adapter.format_version, adapter.adapter_version,
                     adapter.model_version)
    # the parameters vector: one offset slot per parameter, filled as their tables are laid out
    w.vector(params, len(adapter.parameters), b"\0" * 4 * len(adapter.parameters), 4)
    first_slot = len(w.buf) - 4 * len(adapter.parameters)
    for i, p in enumerate(adapter.parameters):
        w.align(4)
        table, (name, dims, data_type, raw) = w.table(["<I", "<I", "<i", "<I"])
        struct.pack_into("<I", w.buf, first_slot + 4 * i, table - (first_slot + 4 * i))
        struct.pack_into("<i", w.buf, data_type, p.data_type)
        encoded = p.name.encode("utf-8")
        w.vector(name, len(encoded), encoded + b"\0", 4)
        w.vector(dims, len(p.dims), struct.pack(f"<{len(p.dims)}q", *p.dims), 8)
        data = bytes(p.raw_data)
        w.vector(raw, len(data), data, 8)
    return bytes(w.buf)


def parameter_from_array(name: str, arr: np.ndarray, elem_type: int) -> Parameter:
    """A parameter holding ``arr`` (ONNX element type ``elem_type``)."""
    if elem_type == STRING or arr.dtype == object:
        raise InvalidArgument(
            f"adapter parameter '{name}' is a STRING tensor: adapter files hold numeric tensors "
            "only")
    arr = arr if arr.flags.c_contiguous else arr.copy(order="C")  # 0-d arrays stay 0-d
    if arr.dtype.byteorder == ">":
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    # bytes through a uint8 view: the buffer protocol refuses ml_dtypes' types (bfloat16...)
    return Parameter(name, [int(d) for d in arr.shape], int(elem_type),
                     memoryview(arr.reshape(-1).view(np.uint8)))
