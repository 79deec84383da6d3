"""ELF64 sections, symbols and notes of GPU code objects (AMD hsaco, NVIDIA cubin), read with pyelftools.

pyelftools parses the headers, the section table, string tables, symbol tables and note records;
this module turns them into small frozen values (`ElfFile`, `ElfSection`, `ElfSymbol`, `ElfNote`) with
numeric types, and adds what pyelftools does not do: every offset and size is checked against the
file's length first (pyelftools reads a truncated section as silently short data), so a truncated or
corrupt binary gives a `BundleError` naming the file and the broken structure, never an `IndexError`,
a `struct.error` or a short section. Vendor-neutral: nothing here knows what a vendor puts in its
sections. ELF32 is refused: no GPU code object uses it.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from elftools.common.exceptions import ELFError, ELFParseError
from elftools.construct import ConstructError
from elftools.elf import enums as _enums
from elftools.elf.elffile import ELFFile
from elftools.elf.sections import NoteSection, SymbolTableIndexSection, SymbolTableSection

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
        with _decoding(self.origin, f"symbol table {sec.name}"):
            parsed = _parsed(self)
            table = parsed.get_section(sec.index)
            xindex = next((s for s in parsed.iter_sections() if isinstance(s, SymbolTableIndexSection)
                           and s["sh_link"] == sec.index), None)
            count = table.num_symbols() if isinstance(table, SymbolTableSection) else 0
        for i in range(1, count):  # entry 0 is the null symbol
            assert isinstance(table, SymbolTableSection)
            with _decoding(self.origin, f"symbol {i} of {sec.name}"):
                sym = table.get_symbol(i)
                name_off = sym["st_name"]
                shndx = _number(sym["st_shndx"], _enums.ENUM_ST_SHNDX)
                if shndx == SHN_XINDEX and xindex is not None:
                    shndx = xindex.get_section_index(i)
                info = sym["st_info"]
                bind = _number(info["bind"], _enums.ENUM_ST_INFO_BIND)
                kind = _number(info["type"], _enums.ENUM_ST_INFO_TYPE)
                # all eight bits of st_other (vendors use the high ones); pyelftools decodes only visibility
                other = sec.data[i * _SYM_SIZE + 5]
            section: str | None = None
            if shndx != SHN_UNDEF and not (SHN_LORESERVE <= shndx <= 0xFFFF and shndx != SHN_XINDEX):
                if shndx >= len(self.sections):
                    raise BundleError(f"ELF symbol {i} of {sec.name} names section {shndx}, which does not exist",
                                      path=self.origin)
                section = self.sections[shndx].name
            yield ElfSymbol(
                name=_cstring(strtab.data, name_off, what=f"name of symbol {i} in {sec.name}", origin=self.origin),
                value=sym["st_value"], size=sym["st_size"],
                bind=STB_NAMES.get(bind, str(bind)), type=STT_NAMES.get(kind, str(kind)),
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
        with _decoding(self.origin, f"note section {sec.name}"):
            note_section = _parsed(self).get_section(sec.index)
        if not isinstance(note_section, NoteSection):
            raise BundleError(f"ELF section {sec.name} is not a note section", path=self.origin)
        end = sec.offset + sec.size
        last = sec.offset
        with _decoding(self.origin, f"the notes of {sec.name}"):
            for note in note_section.iter_notes():
                pos = note["n_offset"] - sec.offset
                desc_end = note["n_offset"] + 12 + _align(note["n_namesz"], 4) + note["n_descsz"]
                if desc_end > end:
                    raise BundleError(f"ELF note at offset {pos} of {sec.name} runs past the section "
                                      f"(name {note['n_namesz']} B, desc {note['n_descsz']} B, section {sec.size} B)",
                                      path=self.origin)
                ntype = _number(note["n_type"], _enums.ENUM_NOTE_N_TYPE, _enums.ENUM_CORE_NOTE_N_TYPE)
                yield ElfNote(note["n_name"] or "", ntype, bytes(note["n_descdata"]), sec.name)
                last = note["n_offset"] + note["n_size"]
        if 0 < end - last < 12:  # pyelftools stops silently where a note header no longer fits
            raise BundleError(f"ELF note section {sec.name} is truncated at offset {last - sec.offset}",
                              path=self.origin)


def _align(n: int, a: int) -> int:
    return (n + a - 1) // a * a


def _cstring(table: bytes, offset: int, *, what: str, origin: str | None) -> str:
    if offset >= len(table) and not (offset == 0 and not table):
        raise BundleError(f"ELF {what}: string offset {offset} is outside its string table ({len(table)} B)", path=origin)
    end = table.find(b"\0", offset)
    return table[offset:end if end >= 0 else len(table)].decode(errors="replace")


def _number(value: Any, *names: Mapping[str, Any]) -> int:
    """pyelftools spells known enum values by name (`SHT_NOTE`, `STB_GLOBAL`): their number."""
    if isinstance(value, int):
        return value
    for table in names:
        number = table.get(value)
        if isinstance(number, int):
            return number
    raise BundleError(f"ELF value {value!r} has no number kstrata knows")


class _decoding:
    """Turns pyelftools' and struct's decoding errors into a `BundleError` naming the file and `what`."""

    def __init__(self, origin: str | None, what: str) -> None:
        self.origin, self.what = origin, what

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        if exc is not None and isinstance(exc, (ELFError, ELFParseError, ConstructError, struct.error, ValueError,
                                                KeyError, IndexError, UnicodeDecodeError)):
            raise BundleError(f"corrupt ELF: cannot decode {self.what}: {type(exc).__name__}: {exc}",
                              path=self.origin) from None


_SH_TYPES: dict[str, int] = {}
for _table in (_enums.ENUM_SH_TYPE_BASE, _enums.ENUM_SH_TYPE_AMD64, _enums.ENUM_SH_TYPE_AARCH64,
               _enums.ENUM_SH_TYPE_ARM, _enums.ENUM_SH_TYPE_MIPS, _enums.ENUM_SH_TYPE_RISCV):
    _SH_TYPES.update({k: v for k, v in _table.items() if isinstance(v, int)})

def _parsed(elf: ElfFile) -> ELFFile:
    """pyelftools' view of `elf` (it parses lazily, so making one is cheap)."""
    return ELFFile(io.BytesIO(elf.data))


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
    if len(data) < _EHDR_SIZE:
        raise BundleError(f"ELF header is truncated ({len(data)} of {_EHDR_SIZE} bytes)", path=origin)
    with _decoding(origin, "the ELF header"):
        parsed = ELFFile(io.BytesIO(data))
        header = parsed.header
        etype = _number(header["e_type"], _enums.ENUM_E_TYPE)
        machine = _number(header["e_machine"], _enums.ENUM_E_MACHINE)
        version = _number(header["e_version"], _enums.ENUM_E_VERSION)
        ident = header["e_ident"]
        osabi = _number(ident["EI_OSABI"], _enums.ENUM_EI_OSABI)
        abiversion = ident["EI_ABIVERSION"]
        shoff, shentsize = header["e_shoff"], header["e_shentsize"]
    bo = "<" if data[5] == 1 else ">"
    if shoff == 0:
        return ElfFile(data, bo, osabi, abiversion, etype, machine, version, header["e_entry"], header["e_flags"],
                       (), origin)
    if shentsize != _SHDR_SIZE:
        raise BundleError(f"ELF section header size is {shentsize}, expected {_SHDR_SIZE}", path=origin)

    def check_header(i: int) -> None:
        at = shoff + i * _SHDR_SIZE
        if at + _SHDR_SIZE > len(data):
            raise BundleError(f"ELF section header {i} at offset {at:#x} lies past the end of the file "
                              f"({len(data)} bytes): the file is truncated", path=origin)

    check_header(0)  # extended numbering: with 0xff00 sections or more, the counts live in header 0
    with _decoding(origin, "the section table"):
        shnum = parsed.num_sections()
    for i in range(shnum):
        check_header(i)
    with _decoding(origin, "the section table"):
        shstrndx = parsed.get_shstrndx()
    if not 0 <= shstrndx < shnum:
        raise BundleError(f"ELF section-name table index {shstrndx} is out of range ({shnum} sections)", path=origin)

    def contents(i: int, h: Any) -> bytes:
        stype, offset, size = _number(h["sh_type"], _SH_TYPES), h["sh_offset"], h["sh_size"]
        if stype in (SHT_NOBITS, SHT_NULL):
            return b""
        if offset + size > len(data):
            raise BundleError(f"ELF section {i} [{offset:#x}, +{size}) lies past the end of the file "
                              f"({len(data)} bytes): the file is truncated", path=origin)
        return data[offset:offset + size]

    with _decoding(origin, "the section headers"):
        headers = [parsed._get_section_header(i) for i in range(shnum)]
    names_data = contents(shstrndx, headers[shstrndx])
    sections = []
    for i, h in enumerate(headers):
        name = _cstring(names_data, h["sh_name"], what=f"name of section {i}", origin=origin) if i else ""
        sections.append(ElfSection(i, name, _number(h["sh_type"], _SH_TYPES), _number(h["sh_flags"]), h["sh_addr"],
                                   h["sh_offset"], h["sh_size"], h["sh_link"], h["sh_info"], h["sh_addralign"],
                                   h["sh_entsize"], contents(i, h)))
    return ElfFile(data, bo, osabi, abiversion, etype, machine, version, header["e_entry"], header["e_flags"],
                   tuple(sections), origin)
