"""Load the code of an x86-64 ELF relocatable object (what LLVM emits for one IR module) into
executable memory: a minimal linker for self-contained objects.

The allocated sections (.text, constant pools) are laid out in one image, local and section
symbols resolved, and the PC-relative / absolute relocations LLVM emits for position-independent
code applied. An object that calls anything outside itself (an undefined symbol) or needs
another relocation kind is refused: the kernels here call nothing, by design.

Every read of the object is bounds-checked: damaged bytes (truncated, offsets out of the file,
relocations out of their section) are an ``ObjectError``, never a ``struct.error`` or a write
outside the image. The memory is never writable and executable at once (W^X): it is mapped
read-write, filled with the relocated image, then switched to read-execute with ``mprotect``.
"""

from __future__ import annotations

import ctypes
import mmap
import struct
import weakref

EM_X86_64, ET_REL = 62, 1
_MACHINES = {3: "i386", 40: "ARM", 183: "AArch64", 243: "RISC-V", 21: "PowerPC64",
             22: "s390"}
SHT_SYMTAB, SHT_STRTAB, SHT_RELA, SHT_NOBITS = 2, 3, 4, 8
SHF_ALLOC = 0x2
STT_FUNC = 2
R_X86_64_64, R_X86_64_PC32, R_X86_64_PLT32, R_X86_64_PC64 = 1, 2, 4, 24
_MAX_IMAGE = 64 << 20  # the kernels' objects are ~100 KB: a larger image is damage
_MAX_ALIGN = 4096
# what each relocation kind writes: struct format, the range its value must fit, its width
_FIELDS = {R_X86_64_PC32: ("<i", -1 << 31, 1 << 31, 4),
           R_X86_64_PLT32: ("<i", -1 << 31, 1 << 31, 4),
           R_X86_64_PC64: ("<q", -1 << 63, 1 << 63, 8), R_X86_64_64: ("<Q", 0, 1 << 64, 8)}
_PC_RELATIVE = frozenset({R_X86_64_PC32, R_X86_64_PLT32, R_X86_64_PC64})


class ObjectError(ValueError):
    """The bytes are not an object this loader links: damaged, truncated, or needing a symbol
    or relocation it does not provide."""


def _unpack(fmt: str, obj: bytes, offset: int, what: str) -> tuple:
    if offset < 0 or offset + struct.calcsize(fmt) > len(obj):
        raise ObjectError(f"{what} at byte {offset} lies outside the {len(obj)}-byte object")
    return struct.unpack_from(fmt, obj, offset)


class _Section:
    __slots__ = ("type", "flags", "offset", "size", "link", "info", "align", "entsize")

    def __init__(self, head: tuple) -> None:
        _, self.type, self.flags, _, self.offset, self.size, self.link, self.info, align, \
            self.entsize = head
        self.align = max(1, align)


def _sections(obj: bytes) -> list[_Section]:
    ident = _unpack("<4sBB", obj, 0, "the ELF identification")
    if ident != (b"\x7fELF", 2, 1):
        raise ObjectError("not a 64-bit little-endian ELF object")
    e_type, machine = _unpack("<HH", obj, 0x10, "the ELF header")
    if machine != EM_X86_64:  # another architecture's code: never mapped executable here
        raise ObjectError(f"an object for {_MACHINES.get(machine, f'ELF machine {machine}')}: "
                          "this loader links x86-64 code only")
    if e_type != ET_REL:
        raise ObjectError(f"not a relocatable object (ELF type {e_type})")
    shoff, = _unpack("<Q", obj, 0x28, "the ELF header")
    shentsize, shnum = _unpack("<HH", obj, 0x3A, "the ELF header")
    if shentsize != 64 or shnum == 0:
        raise ObjectError(f"bad section table ({shnum} entries of {shentsize} bytes)")
    sections = [_Section(_unpack("<IIQQQQIIQQ", obj, shoff + 64 * i, f"section header {i}"))
                for i in range(shnum)]
    for i, s in enumerate(sections):
        if s.type != SHT_NOBITS and s.offset + s.size > len(obj):
            raise ObjectError(f"section {i} ({s.size} bytes at {s.offset}) lies outside the "
                              f"{len(obj)}-byte object")
        if s.align & (s.align - 1) or s.align > _MAX_ALIGN:
            raise ObjectError(f"section {i}: bad alignment {s.align}")
        if s.flags & SHF_ALLOC and s.size > _MAX_IMAGE:
            raise ObjectError(f"section {i}: {s.size} bytes")
    return sections


def _string(obj: bytes, table: _Section, offset: int) -> str:
    start, end = table.offset + offset, table.offset + table.size
    stop = obj.find(b"\0", start, end)
    if offset >= table.size or stop < 0:
        raise ObjectError(f"a name at {offset} runs past its string table")
    try:
        return obj[start:stop].decode()
    except UnicodeDecodeError as exc:
        raise ObjectError(f"a name at {offset} is not UTF-8") from exc


def _symbols(obj: bytes, sections: list[_Section]) -> tuple[list[tuple], _Section]:
    """(name offset, info, section index, value) of each symbol, and their string table."""
    symtab = next((s for s in sections if s.type == SHT_SYMTAB), None)
    if symtab is None:
        raise ObjectError("the object has no symbol table")
    if symtab.entsize != 24 or symtab.link >= len(sections) or \
            sections[symtab.link].type != SHT_STRTAB:
        raise ObjectError("bad symbol table")
    # the table lies inside the object (_sections checked it): unpacked in one pass
    table = obj[symtab.offset:symtab.offset + symtab.size // 24 * 24]
    symbols = [(name, info, shndx, value)
               for name, info, _, shndx, value, _ in struct.iter_unpack("<IBBHQQ", table)]
    return symbols, sections[symtab.link]


def _link(obj: bytes, sections: list[_Section], layout: dict[int, int], size: int,
          base: int) -> tuple[bytearray, dict[str, int]]:
    """The image as it will run at ``base``, and the address of each function."""
    image = bytearray(size)
    for i, at in layout.items():
        s = sections[i]
        if s.type != SHT_NOBITS:
            image[at:at + s.size] = obj[s.offset:s.offset + s.size]
    symbols, strtab = _symbols(obj, sections)

    def resolve(index: int) -> int:
        if index >= len(symbols):
            raise ObjectError(f"a relocation names symbol {index} of {len(symbols)}")
        name, _, shndx, value = symbols[index]
        if shndx not in layout:
            what = _string(obj, strtab, name) if name else "a section"
            raise ObjectError(f"the object refers to {what or 'a symbol'} outside itself")
        return base + layout[shndx] + value

    for s in sections:
        if s.type != SHT_RELA or s.info not in layout:
            continue
        if s.entsize != 24:
            raise ObjectError("bad relocation table")
        at0, limit = layout[s.info], sections[s.info].size
        resolved: dict[int, int] = {}  # symbol index -> address (a symbol recurs: its pool)
        # the table lies inside the object (_sections checked it): unpacked in one pass
        for r_offset, r_info, addend in struct.iter_unpack(
                "<QQq", obj[s.offset:s.offset + s.size // 24 * 24]):
            kind, sym = r_info & 0xFFFFFFFF, r_info >> 32
            field = _FIELDS.get(kind)
            if field is None:
                raise ObjectError(f"unsupported relocation type {kind}")
            fmt, lo, hi, width = field
            if r_offset + width > limit:
                raise ObjectError(f"a relocation at {r_offset} lies outside its {limit}-byte "
                                  "section")
            at = at0 + r_offset
            address = resolved.get(sym)
            if address is None:
                address = resolved[sym] = resolve(sym)
            value = address + addend
            if kind in _PC_RELATIVE:
                value -= base + at
            if not lo <= value < hi:
                raise ObjectError(f"relocation type {kind} at {r_offset}: {value:#x} does not fit")
            struct.pack_into(fmt, image, at, value)
    address = {}
    for name, info, shndx, value in symbols:
        if name and (info & 0xF) == STT_FUNC and shndx in layout:
            if value >= sections[shndx].size:
                raise ObjectError(f"a function at {value} lies outside its section")
            address[_string(obj, strtab, name)] = base + layout[shndx] + value
    return image, address


# -- executable memory (libc through an instance of our own: no process-wide ctypes setting) --

_P, _Z, _I = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int
_libc: dict[str, object] = {}


def _libc_function(name: str, restype, *argtypes):
    fn = _libc.get(name)
    if fn is None:
        fn = getattr(ctypes.CDLL(None, use_errno=True), name)
        fn.restype, fn.argtypes = restype, argtypes
        _libc[name] = fn
    return fn


def _map(size: int) -> int:
    fn = _libc_function("mmap", _P, _P, _Z, _I, _I, _I, ctypes.c_long)
    addr = fn(None, size, mmap.PROT_READ | mmap.PROT_WRITE,
              mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
    if addr is None or addr == _P(-1).value:
        err = ctypes.get_errno()
        raise OSError(err, f"mmap of {size} bytes failed")
    return addr


def _protect(addr: int, size: int, prot: int) -> None:
    if _libc_function("mprotect", _I, _P, _Z, _I)(addr, size, prot) != 0:
        err = ctypes.get_errno()
        raise OSError(err, "mprotect to read-execute refused")


def _unmap(addr: int, size: int) -> None:
    _libc_function("munmap", _I, _P, _Z)(addr, size)


class LoadedCode:
    """Read-execute memory holding the object's sections; ``address[name]`` of each function.
    The memory is unmapped when this object is collected: keep it while the functions may be
    called."""

    def __init__(self, base: int, size: int, address: dict[str, int]) -> None:
        self.base, self.size, self.address = base, size, address
        # not at exit: a daemon thread may still be running the code while the process ends
        weakref.finalize(self, _unmap, base, size).atexit = False


def load(obj: bytes) -> LoadedCode:
    sections = _sections(obj)
    layout: dict[int, int] = {}  # section index -> offset in the image
    end = 0
    for i, s in enumerate(sections):
        if s.flags & SHF_ALLOC and s.size:
            end = -(-end // s.align) * s.align
            layout[i] = end
            end += s.size
    if not layout:
        raise ObjectError("the object has no code")
    if end > _MAX_IMAGE:
        raise ObjectError(f"the object's sections take {end} bytes")
    size = -(-end // mmap.PAGESIZE) * mmap.PAGESIZE
    base = _map(size)
    try:
        image, address = _link(obj, sections, layout, end, base)
        ctypes.memmove(base, (ctypes.c_char * end).from_buffer(image), end)
        _protect(base, size, mmap.PROT_READ | mmap.PROT_EXEC)
    except BaseException:
        _unmap(base, size)
        raise
    return LoadedCode(base, size, address)


__all__ = ["LoadedCode", "ObjectError", "load"]
