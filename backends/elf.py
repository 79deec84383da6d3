"""A small ELF64 reader: sections, symbols and notes of GPU code objects (AMD hsaco, NVIDIA cubin).

Pure Python over `struct`, vendor-neutral: it knows the generic ELF layout and nothing about what a
vendor puts in its sections. Both GPU code-object formats are ELF64 (little-endian in practice; the
byte order is read from the header all the same). ELF32 is refused: no GPU code object uses it.

Every offset and size read from the file is checked against the file's length, so a truncated or
corrupt binary gives a `BundleError` that says which structure is broken, never an `IndexError` or a
silently short section.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass

from kstrata.ir.errors import BundleError

ELF_MAGIC = b"\x7fELF"
ELFCLASS64 = 2

# Section types a reader needs to name (the rest are shown as numbers).
SHT_NULL = 0
SHT_PROGBITS = 1
SHT_SYMTAB = 2
SHT_STRTAB = 3
SHT_NOTE = 7
SHT_NOBITS = 8
SHT_DYNSYM = 11
SHT_SYMTAB_SHNDX = 18

SHF_WRITE = 0x1
SHF_ALLOC = 0x2
SHF_EXECINSTR = 0x4

# Special section indices of a symbol.
SHN_UNDEF = 0
SHN_LORESERVE = 0xFF00
SHN_ABS = 0xFFF1
SHN_COMMON = 0xFFF2
SHN_XINDEX = 0xFFFF

STT_NAMES = {0: "notype", 1: "object", 2: "func", 3: "section", 4: "file", 5: "common", 6: "tls"}
STB_NAMES = {0: "local", 1: "global", 2: "weak"}

_EHDR_SIZE = 64
_SHDR_SIZE = 64
_SYM_SIZE = 24


@dataclass(frozen=True)
class ElfSection:
    """One section: its header fields and its bytes (empty for `SHT_NOBITS`, e.g. `.bss`)."""

    index: int
    name: str
    type: int
    flags: int
    addr: int
    offset: int
    size: int
    link: int
    info: int
    addralign: int
    entsize: int
    data: bytes

    @property
    def is_code(self) -> bool:
        return bool(self.flags & SHF_EXECINSTR)


@dataclass(frozen=True)
class ElfSymbol:
    """One symbol of `.symtab` or `.dynsym`."""

    name: str
    value: int
    size: int
    bind: str  # local, global, weak, or the number
    type: str  # notype, object, func, section, file, …, or the number
    other: int  # visibility in the low bits
    shndx: int
    #: Name of the section the symbol is defined in; `None` for undefined, absolute and common symbols.
    section: str | None
    #: `.symtab` or `.dynsym`.
    table: str


@dataclass(frozen=True)
class ElfNote:
    """One note record: owner name (e.g. `AMDGPU`), type, and descriptor bytes."""

    owner: str
    type: int
    desc: bytes
    section: str


@dataclass(frozen=True)
class ElfFile:
    """A parsed ELF64 file: header fields and sections; symbols and notes are read on demand."""

    data: bytes
    byteorder: str  # "<" or ">"
    osabi: int
    abiversion: int
    type: int
    machine: int
    version: int
    entry: int
    flags: int
    sections: tuple[ElfSection, ...]
    origin: str | None = None

    # -- sections ---------------------------------------------------------------------------------
    def get_section(self, name: str) -> ElfSection | None:
        """The first section called `name`, or `None`."""
        for sec in self.sections:
            if sec.name == name:
                return sec
        return None

    def section(self, name: str) -> ElfSection:
        """The section called `name`; a `BundleError` listing the sections otherwise."""
        sec = self.get_section(name)
        if sec is None:
            names = ", ".join(s.name for s in self.sections if s.name) or "none"
            raise BundleError(f"ELF has no section {name!r} (sections: {names})", path=self.origin)
        return sec

    def section_names(self) -> list[str]:
        return [s.name for s in self.sections if s.index != 0]

    # -- symbols ----------------------------------------------------------------------------------
    def symbols(self, table: str | None = None) -> list[ElfSymbol]:
        """Symbols of `.symtab`, then `.dynsym` (or only `table`), in table order, null symbols left out."""
        out: list[ElfSymbol] = []
        # .symtab before .dynsym: the static table is the complete one when both exist.
        for kind in (SHT_SYMTAB, SHT_DYNSYM):
            for sec in self.sections:
                if sec.type == kind and (table is None or sec.name == table):
                    out.extend(self._read_symbols(sec))
        return out

    def symbol(self, name: str) -> ElfSymbol:
        """The symbol called `name`, `.symtab` first; a `BundleError` if there is none."""
        for sym in self.symbols():
            if sym.name == name:
                return sym
        raise BundleError(f"ELF has no symbol {name!r}", path=self.origin)

    def symbol_bytes(self, sym: ElfSymbol) -> bytes:
        """The `size` bytes a defined symbol covers in its section (e.g. a 64-byte kernel descriptor)."""
        if sym.section is None:
            raise BundleError(f"symbol {sym.name!r} is not defined in a section", path=self.origin)
        sec = self.sections[sym.shndx]
        start = sym.value - sec.addr if self.type != 1 else sym.value  # ET_REL symbols are section offsets
        if start < 0 or start + sym.size > len(sec.data):
            raise BundleError(f"symbol {sym.name!r} [{sym.value:#x}, +{sym.size}) lies outside section {sec.name}",
                              path=self.origin)
        return sec.data[start:start + sym.size]

    def _read_symbols(self, sec: ElfSection) -> Iterator[ElfSymbol]:
        if sec.entsize not in (0, _SYM_SIZE) or sec.size % _SYM_SIZE:
            raise BundleError(f"ELF symbol table {sec.name} has entry size {sec.entsize}, size {sec.size}",
                              path=self.origin)
        strtab = self._linked(sec, "string table")
        xindex = next((s for s in self.sections if s.type == SHT_SYMTAB_SHNDX and s.link == sec.index), None)
        fmt = self.byteorder + "IBBHQQ"
        for i in range(1, sec.size // _SYM_SIZE):  # entry 0 is the null symbol
            name_off, info, other, shndx, value, size = struct.unpack_from(fmt, sec.data, i * _SYM_SIZE)
            if shndx == SHN_XINDEX and xindex is not None and len(xindex.data) >= 4 * (i + 1):
                (shndx,) = struct.unpack_from(self.byteorder + "I", xindex.data, 4 * i)
            section: str | None = None
            if shndx != SHN_UNDEF and not (SHN_LORESERVE <= shndx <= 0xFFFF and shndx != SHN_XINDEX):
                if shndx >= len(self.sections):
                    raise BundleError(f"ELF symbol {i} of {sec.name} names section {shndx}, which does not exist",
                                      path=self.origin)
                section = self.sections[shndx].name
            yield ElfSymbol(
                name=_cstring(strtab.data, name_off, what=f"name of symbol {i} in {sec.name}", origin=self.origin),
                value=value, size=size,
                bind=STB_NAMES.get(info >> 4, str(info >> 4)), type=STT_NAMES.get(info & 0xF, str(info & 0xF)),
                other=other, shndx=shndx, section=section, table=sec.name,
            )

    def _linked(self, sec: ElfSection, what: str) -> ElfSection:
        if not 0 < sec.link < len(self.sections):
            raise BundleError(f"ELF section {sec.name} links to {what} {sec.link}, which does not exist", path=self.origin)
        return self.sections[sec.link]

    # -- notes ------------------------------------------------------------------------------------
    def notes(self, owner: str | None = None, type: int | None = None) -> list[ElfNote]:
        """Every note record of every `SHT_NOTE` section, optionally only those of `owner` / `type`."""
        out: list[ElfNote] = []
        for sec in self.sections:
            if sec.type != SHT_NOTE:
                continue
            for note in self._read_notes(sec):
                if (owner is None or note.owner == owner) and (type is None or note.type == type):
                    out.append(note)
        return out

    def _read_notes(self, sec: ElfSection) -> Iterator[ElfNote]:
        # Note records are 4-byte aligned, except in sections aligned to 8 (e.g. GNU property notes).
        align = 8 if sec.addralign == 8 else 4
        data, pos = sec.data, 0
        while pos < len(data):
            if pos + 12 > len(data):
                raise BundleError(f"ELF note section {sec.name} is truncated at offset {pos}", path=self.origin)
            namesz, descsz, ntype = struct.unpack_from(self.byteorder + "III", data, pos)
            name_start = pos + 12
            desc_start = name_start + _align(namesz, align)
            end = desc_start + _align(descsz, align)
            if desc_start + descsz > len(data):
                raise BundleError(f"ELF note at offset {pos} of {sec.name} runs past the section "
                                  f"(name {namesz} B, desc {descsz} B, section {len(data)} B)", path=self.origin)
            owner = data[name_start:name_start + namesz].rstrip(b"\0").decode(errors="replace")
            yield ElfNote(owner, ntype, data[desc_start:desc_start + descsz], sec.name)
            pos = end


def _align(n: int, a: int) -> int:
    return (n + a - 1) // a * a


def _cstring(table: bytes, offset: int, *, what: str, origin: str | None) -> str:
    if offset >= len(table) and not (offset == 0 and not table):
        raise BundleError(f"ELF {what}: string offset {offset} is outside its string table ({len(table)} B)", path=origin)
    end = table.find(b"\0", offset)
    return table[offset:end if end >= 0 else len(table)].decode(errors="replace")


def is_elf(data: bytes) -> bool:
    return data[:4] == ELF_MAGIC


def read_elf(data: bytes, *, origin: str | None = None) -> ElfFile:
    """Parse an ELF64 file; a `BundleError` (naming `origin`) for anything that is not a whole ELF64 file."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise BundleError(f"expected ELF bytes, got {type(data).__name__}", path=origin)
    data = bytes(data)
    if len(data) < 16 or not is_elf(data):
        head = data[:4].hex() or "empty"
        raise BundleError(f"not an ELF file (starts with {head}, expected 7f454c46)", path=origin)
    if data[4] != ELFCLASS64:
        raise BundleError(f"ELF class {data[4]} is not ELF64; GPU code objects are ELF64", path=origin)
    if data[5] not in (1, 2):
        raise BundleError(f"ELF data encoding {data[5]} is neither little- nor big-endian", path=origin)
    bo = "<" if data[5] == 1 else ">"
    if len(data) < _EHDR_SIZE:
        raise BundleError(f"ELF header is truncated ({len(data)} of {_EHDR_SIZE} bytes)", path=origin)
    (etype, machine, version, entry, _phoff, shoff, flags, _ehsize, _phentsize, _phnum,
     shentsize, shnum, shstrndx) = struct.unpack_from(bo + "HHIQQQIHHHHHH", data, 16)
    osabi, abiversion = data[7], data[8]
    if shoff == 0:
        return ElfFile(data, bo, osabi, abiversion, etype, machine, version, entry, flags, (), origin)
    if shentsize != _SHDR_SIZE:
        raise BundleError(f"ELF section header size is {shentsize}, expected {_SHDR_SIZE}", path=origin)

    def header(i: int) -> tuple[int, ...]:
        at = shoff + i * _SHDR_SIZE
        if at + _SHDR_SIZE > len(data):
            raise BundleError(f"ELF section header {i} at offset {at:#x} lies past the end of the file "
                              f"({len(data)} bytes): the file is truncated", path=origin)
        return struct.unpack_from(bo + "IIQQQQIIQQ", data, at)

    # Extended numbering: with 0xff00 sections or more, the counts live in section header 0.
    first = header(0)
    if shnum == 0:
        shnum = first[5]
    if shstrndx == SHN_XINDEX:
        shstrndx = first[6]
    raw = [first] + [header(i) for i in range(1, shnum)]
    if not 0 <= shstrndx < shnum:
        raise BundleError(f"ELF section-name table index {shstrndx} is out of range ({shnum} sections)", path=origin)

    def contents(i: int, h: tuple[int, ...]) -> bytes:
        stype, offset, size = h[1], h[4], h[5]
        if stype in (SHT_NOBITS, SHT_NULL):
            return b""
        if offset + size > len(data):
            raise BundleError(f"ELF section {i} [{offset:#x}, +{size}) lies past the end of the file "
                              f"({len(data)} bytes): the file is truncated", path=origin)
        return data[offset:offset + size]

    names_data = contents(shstrndx, raw[shstrndx])
    sections = []
    for i, h in enumerate(raw):
        name_off, stype, sflags, addr, offset, size, link, info, addralign, entsize = h
        name = _cstring(names_data, name_off, what=f"name of section {i}", origin=origin) if i else ""
        sections.append(ElfSection(i, name, stype, sflags, addr, offset, size, link, info, addralign, entsize,
                                   contents(i, h)))
    return ElfFile(data, bo, osabi, abiversion, etype, machine, version, entry, flags, tuple(sections), origin)
