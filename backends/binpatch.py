"""In-place binary patches: same-size instruction replacement in a cubin or hsaco, for when the kernel
cannot be reassembled (no PTX/AMDGCN at hand, or the assembler changes more than the edit).

A `BinaryPatch` names a code section, an offset in it, the bytes expected there (the anchor: a patch
never applies to different bytes) and the replacement of the same length. Checks after applying:
the ELF still parses with the same sections; only the patched bytes changed; every patched offset is
instruction-aligned; the disassembler still decodes the whole section with the same number of
instructions; and, when given, the disassembly of each new instruction contains the expected text.

JSON form (`.json`):

    {"schema": "kstrata.binary-patch/1", "kernel": "k", "description": "...",
     "edits": [{"section": ".text.k", "offset": 112, "old": "8179...", "new": "8179...", "expect": "LDG.E.CONSTANT"}]}
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kstrata.ir.errors import KstrataError

from .elf import read_elf

BINARY_PATCH_SCHEMA = "kstrata.binary-patch/1"


class BinaryPatchError(KstrataError):
    """A binary patch that cannot be read, does not match its anchor bytes, or fails a check."""


@dataclass(frozen=True)
class BinaryEdit:
    section: str
    offset: int
    old: bytes
    new: bytes
    expect: str | None = None


@dataclass(frozen=True)
class BinaryPatch:
    edits: tuple[BinaryEdit, ...]
    kernel: str | None = None
    description: str = ""

    @classmethod
    def from_json(cls, data: Any, origin: str | None = None) -> BinaryPatch:
        try:
            if data.get("schema") != BINARY_PATCH_SCHEMA:
                raise BinaryPatchError(f"expected schema {BINARY_PATCH_SCHEMA}", path=origin)
            edits = tuple(BinaryEdit(e["section"], int(e["offset"]), bytes.fromhex(e["old"]), bytes.fromhex(e["new"]),
                                     e.get("expect")) for e in data["edits"])
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise BinaryPatchError(f"not a kstrata binary patch: {exc}", path=origin) from None
        if not edits:
            raise BinaryPatchError("binary patch has no edits", path=origin)
        return cls(edits, data.get("kernel"), data.get("description", ""))

    @classmethod
    def load(cls, path: str | Path) -> BinaryPatch:
        from kstrata.ir.files import read_json, user_path

        p = user_path(path)
        return cls.from_json(read_json(p, "binary patch", error=BinaryPatchError), str(p))

    def to_json(self) -> dict[str, Any]:
        return {"schema": BINARY_PATCH_SCHEMA, "kernel": self.kernel, "description": self.description,
                "edits": [{"section": e.section, "offset": e.offset, "old": e.old.hex(), "new": e.new.hex(),
                           "expect": e.expect} for e in self.edits]}


# -- disassembly, per vendor ---------------------------------------------------------------------------
def nvidia_listing(cubin: bytes) -> dict[str, dict[int, str]]:
    """SASS per function: {function: {offset: instruction text}}."""
    from .nvidia import sass

    listing: dict[str, dict[int, str]] = {}
    current: dict[int, str] | None = None
    for line in sass(cubin).splitlines():
        m = re.match(r"\s*Function\s*:\s*(\S+)", line)
        if m:
            current = listing.setdefault(m.group(1), {})
            continue
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", line)
        if m and current is not None:
            current[int(m.group(1), 16)] = " ".join(m.group(2).split())
    return listing


def _amd_listing(hsaco: bytes, arch: str) -> dict[str, dict[int, str]]:
    """AMDGCN of `.text`, padding included: {".text": {offset in section: instruction text}}."""
    from .amd import disassemble_hsaco

    base = read_elf(hsaco).section(".text").addr
    return {".text": {i.address - base: i.text for i in disassemble_hsaco(hsaco, arch, functions_only=False)}}


def _section_listing(binary: bytes, vendor: str, arch: str, section: str) -> dict[int, str]:
    if vendor == "nvidia":
        fn = section.removeprefix(".text.")
        return nvidia_listing(binary).get(fn, {})
    return _amd_listing(binary, arch).get(section, {})


def apply_binary_patch(binary: bytes, patch: BinaryPatch, vendor: str, arch: str) -> tuple[bytes, list[dict[str, Any]]]:
    """Apply `patch` to a cubin (`vendor="nvidia"`) or hsaco (`"amd"`) and run the checks; returns the
    new binary and, per edit, the instruction before and after."""
    align = 16 if vendor == "nvidia" else 4
    elf = read_elf(binary)
    data = bytearray(binary)
    for i, e in enumerate(patch.edits, 1):
        sec = elf.section(e.section)
        if not sec.is_code:
            raise BinaryPatchError(f"edit {i}: section {e.section} is not code")
        if len(e.old) != len(e.new) or not e.old:
            raise BinaryPatchError(f"edit {i}: old and new must have the same, non-zero length ({len(e.old)} vs {len(e.new)})")
        if e.offset % align or len(e.old) % align:
            raise BinaryPatchError(f"edit {i}: offset {e.offset} and length {len(e.old)} must be multiples of {align} "
                                   f"(the {vendor} instruction size)")
        if e.offset + len(e.old) > sec.size:
            raise BinaryPatchError(f"edit {i}: offset {e.offset}+{len(e.old)} is past the end of {e.section} ({sec.size} bytes)")
        found = sec.data[e.offset:e.offset + len(e.old)]
        if found != e.old:
            raise BinaryPatchError(f"edit {i}: anchor bytes differ at {e.section}+{e.offset:#x}: "
                                   f"expected {e.old.hex()}, found {found.hex()}")
        data[sec.offset + e.offset:sec.offset + e.offset + len(e.new)] = e.new
    patched = bytes(data)
    new_elf = read_elf(patched)
    if [(s.name, s.size) for s in new_elf.sections] != [(s.name, s.size) for s in elf.sections]:
        raise BinaryPatchError("the ELF section layout changed")  # cannot happen with same-size edits; kept as a check
    changed = sum(a != b for a, b in zip(binary, patched, strict=True))
    expected = sum(sum(x != y for x, y in zip(e.old, e.new, strict=True)) for e in patch.edits)
    if changed != expected:
        raise BinaryPatchError(f"{changed} bytes changed, the edits account for {expected}")
    report: list[dict[str, Any]] = []
    listings: dict[str, tuple[dict[int, str], dict[int, str]]] = {}  # one disassembly per section and side
    for i, e in enumerate(patch.edits, 1):
        if e.section not in listings:
            listings[e.section] = (_section_listing(binary, vendor, arch, e.section),
                                   _section_listing(patched, vendor, arch, e.section))
        before, after = listings[e.section]
        if len(before) != len(after):
            raise BinaryPatchError(f"edit {i}: the disassembler decodes {len(after)} instructions in {e.section} "
                                   f"after the patch, {len(before)} before")
        old_text, new_text = before.get(e.offset, "?"), after.get(e.offset, "?")
        if e.expect and e.expect not in new_text:
            raise BinaryPatchError(f"edit {i}: the new instruction disassembles to {new_text!r}, "
                                   f"which does not contain {e.expect!r}")
        report.append({"edit": i, "section": e.section, "offset": e.offset, "before": old_text, "after": new_text})
    return patched, report
