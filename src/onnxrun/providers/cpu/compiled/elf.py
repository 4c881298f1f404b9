"""Load the code of an x86-64 ELF relocatable object (what LLVM emits for one IR module) into
executable memory: a minimal linker for self-contained objects.

The allocated sections (.text, constant pools) are laid out in one mapping, local and section
symbols resolved, and the PC-relative / absolute relocations LLVM emits for position-independent
code applied. An object that calls anything outside itself (an undefined symbol) or needs
another relocation kind is refused: the kernels here call nothing, by design.
"""

from __future__ import annotations

import ctypes
import mmap
import struct

SHT_SYMTAB, SHT_RELA, SHT_NOBITS = 2, 4, 8
SHF_ALLOC = 0x2
R_X86_64_64, R_X86_64_PC32, R_X86_64_PLT32, R_X86_64_PC64 = 1, 2, 4, 24


class ObjectError(ValueError):
    pass


class LoadedCode:
    """Executable memory holding the object's sections; ``address[name]`` of each function."""

    def __init__(self, memory: mmap.mmap, base: int, address: dict[str, int]) -> None:
        self.memory = memory  # kept alive as long as the functions may be called
        self.base = base
        self.address = address


def _sections(obj: bytes):
    if obj[:4] != b"\x7fELF" or obj[4] != 2 or obj[5] != 1:
        raise ObjectError("not a 64-bit little-endian ELF object")
    shoff, = struct.unpack_from("<Q", obj, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", obj, 0x3A)
    heads = [struct.unpack_from("<IIQQQQIIQQ", obj, shoff + i * shentsize) for i in range(shnum)]
    names_off = heads[shstrndx][4]

    def name(off: int) -> str:
        end = obj.index(b"\0", names_off + off)
        return obj[names_off + off:end].decode()

    return [dict(name=name(h[0]), type=h[1], flags=h[2], offset=h[4], size=h[5], link=h[6],
                 info=h[7], align=max(1, h[8]), entsize=h[9]) for h in heads]


def load(obj: bytes) -> LoadedCode:
    sections = _sections(obj)
    layout: dict[int, int] = {}  # section index -> offset in the mapping
    end = 0
    for i, s in enumerate(sections):
        if s["flags"] & SHF_ALLOC and s["size"]:
            end = -(-end // s["align"]) * s["align"]
            layout[i] = end
            end += s["size"]
    if not layout:
        raise ObjectError("the object has no code")
    memory = mmap.mmap(-1, max(end, 1), prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    base = ctypes.addressof(ctypes.c_char.from_buffer(memory))
    for i, off in layout.items():
        s = sections[i]
        if s["type"] != SHT_NOBITS:
            memory[off:off + s["size"]] = obj[s["offset"]:s["offset"] + s["size"]]
    symtab = next((s for s in sections if s["type"] == SHT_SYMTAB), None)
    if symtab is None:
        raise ObjectError("the object has no symbol table")
    strtab = sections[symtab["link"]]
    symbols = []
    for k in range(symtab["size"] // 24):
        st_name, info, _, shndx, value, _ = struct.unpack_from(
            "<IBBHQQ", obj, symtab["offset"] + 24 * k)
        end_name = obj.index(b"\0", strtab["offset"] + st_name)
        symbols.append((obj[strtab["offset"] + st_name:end_name].decode(), info, shndx, value))

    def resolve(index: int) -> int:
        name, _, shndx, value = symbols[index]
        if shndx not in layout:
            raise ObjectError(f"the object refers to {name or 'a section'} outside itself")
        return base + layout[shndx] + value

    for s in sections:
        if s["type"] != SHT_RELA or s["info"] not in layout:
            continue
        target = layout[s["info"]]
        for k in range(s["size"] // 24):
            r_offset, r_info, addend = struct.unpack_from("<QQq", obj, s["offset"] + 24 * k)
            kind, sym = r_info & 0xFFFFFFFF, r_info >> 32
            place = base + target + r_offset
            value = resolve(sym) + addend
            at = target + r_offset
            if kind in (R_X86_64_PC32, R_X86_64_PLT32):
                struct.pack_into("<i", memory, at, value - place)
            elif kind == R_X86_64_PC64:
                struct.pack_into("<q", memory, at, value - place)
            elif kind == R_X86_64_64:
                struct.pack_into("<Q", memory, at, value)
            else:
                raise ObjectError(f"unsupported relocation type {kind}")
    address = {name: base + layout[shndx] + value for name, info, shndx, value in symbols
               if name and (info & 0xF) == 2 and shndx in layout}  # STT_FUNC
    return LoadedCode(memory, base, address)


__all__ = ["LoadedCode", "ObjectError", "load"]
