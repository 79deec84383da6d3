"""Generated in-place SASS patches for a bare cubin: the L2 evict-first policy on global loads and stores.

NVIDIA publishes no SASS assembler, so an instruction cannot be re-encoded from text. What can be done
without one: learn the encoding of one modifier from ptxas itself. A probe kernel is assembled twice for the
cubin's architecture, once with plain `ld.global`/`st.global` and once with `.cs` (cache streaming, which
ptxas turns into the `.EF` evict-first policy); the two cubins must differ in exactly the memory instructions,
each `LDG` by the same XOR mask and each `STG` by the same mask (the policy field), or nothing is learned.

A patch sets that field on every `LDG`/`STG` of the target cubin whose field holds the default policy (the
probe's plain value): the instruction's bytes XOR the mask. `backends/binpatch.py` applies it with its checks
(anchors, alignment, section layout, same instruction count), and each patched instruction must disassemble to
its old text with `.EF` added after the opcode's `.E` and nothing else changed. Evict-first is a cache
priority: it changes no value.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from kstrata.ir.errors import KstrataError

from .binpatch import BinaryEdit, BinaryPatch, nvidia_listing
from .elf import read_elf

#: A probe kernel: scalar and 128-bit loads and stores, plain or with PTX cache operators (`{lop}`, `{sop}`).
_PROBE = """.version 8.0
.target {arch}
.address_size 64
.visible .entry kstrata_policy_probe(.param .u64 a, .param .u64 b)
{{
  .reg .b64 %rd<8>; .reg .f32 %f<12>; .reg .b32 %r<4>;
  ld.param.u64 %rd1, [a]; ld.param.u64 %rd2, [b];
  cvta.to.global.u64 %rd3, %rd1; cvta.to.global.u64 %rd4, %rd2;
  mov.u32 %r1, %tid.x; mul.wide.u32 %rd5, %r1, 16; add.s64 %rd6, %rd3, %rd5; add.s64 %rd7, %rd4, %rd5;
  ld.global{lop}.f32 %f1, [%rd6];
  ld.global{lop}.v4.f32 {{%f2, %f3, %f4, %f5}}, [%rd6+4096];
  add.f32 %f6, %f1, %f2; add.f32 %f6, %f6, %f3; add.f32 %f6, %f6, %f4; add.f32 %f6, %f6, %f5;
  st.global{sop}.f32 [%rd7], %f6;
  st.global{sop}.v4.f32 [%rd7+4096], {{%f6, %f2, %f3, %f1}};
  ret;
}}
"""

_MEMORY = re.compile(r"^(?:@!?U?P\w+\s+)?(LDG|STG)\.E\b")


@dataclass(frozen=True)
class PolicyField:
    """The evict-first encoding of one opcode: `mask` (the bits `.cs` flips), `field` (every bit any cache
    operator the probe tried flips: the policy bits and their neighbours) and `default` (the plain
    instruction's bits under `field`). Only an instruction whose `field` bits equal `default` is patched."""

    opcode: str
    mask: bytes
    field: bytes
    default: bytes


#: The cache operators whose encodings bound the field (loads, stores): each must change only bits of the
#: memory instructions.
_OTHER_OPS = ((".lu", ""), (".ca", ".wt"), (".cg", ".cg"), (".nc", ""))


def cubin_arch(cubin: bytes) -> str:
    """The SASS architecture of `cubin` (`sm_90a`), from its listing."""
    from .nvidia import sass

    m = re.search(r"code for (sm_\d+[a-z]?)", sass(cubin))
    if not m:
        raise KstrataError("the cubin's SASS listing names no architecture")
    return m.group(1)


def _words(cubin: bytes) -> dict[int, tuple[str, bytes]]:
    """{offset: (instruction text, its 16 bytes)} of the probe's one function."""
    elf = read_elf(cubin)
    (name, listing), = nvidia_listing(cubin).items()
    data = elf.section(f".text.{name}").data
    return {off: (text, bytes(data[off:off + 16])) for off, text in listing.items()}


def _xor(a: bytes, b: bytes) -> bytes:
    return bytes(x ^ y for x, y in zip(a, b, strict=True))


def _and(a: bytes, b: bytes) -> bytes:
    return bytes(x & y for x, y in zip(a, b, strict=True))


def _or(a: bytes, b: bytes) -> bytes:
    return bytes(x | y for x, y in zip(a, b, strict=True))


@functools.lru_cache(maxsize=8)
def learn_evict_first(arch: str) -> dict[str, PolicyField]:
    """The evict-first field of `LDG` and `STG` for `arch`, learned from ptxas (module docstring). Raises
    `KstrataError` when the probe's builds differ otherwise than in their memory instructions, or `.cs` does
    not flip one set of bits an opcode."""
    from .nvidia import PtxasOptions, assemble_ptx

    def build(lop: str, sop: str) -> dict[int, tuple[str, bytes]]:
        ptx = _PROBE.format(arch=arch, lop=lop, sop=sop)
        return _words(assemble_ptx(ptx, PtxasOptions(arch=arch, lineinfo=False)).cubin)

    plain, streaming = build("", ""), build(".cs", ".cs")
    others = [build(lop, sop) for lop, sop in _OTHER_OPS]
    for variant in (streaming, *others):
        if list(variant) != list(plain):
            raise KstrataError(f"ptxas {arch}: a cache operator changed the probe's instructions, not only their bits")
    fields: dict[str, PolicyField] = {}
    for off, (text, word) in plain.items():
        m = _MEMORY.match(text)
        if not m:
            if any(v[off][1] != word for v in (streaming, *others)):
                raise KstrataError(f"ptxas {arch}: a cache operator changed a non-memory instruction ({text})")
            continue
        text_cs, word_cs = streaming[off]
        if ".EF" not in text_cs or text_cs.replace(".EF", "", 1) != text:
            raise KstrataError(f"ptxas {arch}: {text!r} with .cs became {text_cs!r}, not its evict-first form")
        mask = _xor(word, word_cs)
        field = mask
        for v in others:
            field = _or(field, _xor(word, v[off][1]))
        learned = PolicyField(m.group(1), mask, field, _and(word, field))
        if not any(mask) or fields.setdefault(learned.opcode, learned) != learned:
            raise KstrataError(f"ptxas {arch}: the {learned.opcode} instructions of the probe differ by other bits "
                               "between the builds: no single policy field")
    if set(fields) != {"LDG", "STG"}:
        raise KstrataError(f"ptxas {arch}: the probe has no LDG and STG to learn from")
    return fields


def evict_first_patch(cubin: bytes, *, loads: bool, stores: bool,
                      arch: str | None = None) -> tuple[BinaryPatch | None, list[str]]:
    """A patch giving every plain-policy `LDG` (`loads`) and `STG` (`stores`) of `cubin` the evict-first policy,
    and the memory instructions left alone with why (another cache operator or policy already). None when
    nothing is to patch. Whether each patched instruction reads back as intended is `check_evict_first`'s
    question, after `apply_binary_patch`."""
    arch = arch or cubin_arch(cubin)
    fields = learn_evict_first(arch)
    elf = read_elf(cubin)
    edits: list[BinaryEdit] = []
    skipped: list[str] = []
    for fn, listing in nvidia_listing(cubin).items():
        section = f".text.{fn}"
        data = elf.section(section).data
        for off, text in sorted(listing.items()):
            m = _MEMORY.match(text)
            if not m or not (loads if m.group(1) == "LDG" else stores):
                continue
            f = fields[m.group(1)]
            word = bytes(data[off:off + 16])
            if _and(word, f.field) != f.default:
                skipped.append(f"{fn}+{off:#x} {text}: another cache operator or policy already")
                continue
            new = _xor(word, f.mask)
            edits.append(BinaryEdit(section, off, word, new, ".EF"))
    if not edits:
        return None, skipped
    what = " and ".join(w for w, on in (("loads", loads), ("stores", stores)) if on)
    return BinaryPatch(tuple(edits), None, f"L2 evict-first on the global {what} ({arch}, the field learned "
                                            "from ptxas's .cs encoding)"), skipped


def check_evict_first(report: list[dict[str, object]]) -> str | None:
    """Why an applied evict-first patch is wrong (None: each instruction is its old text with `.EF` added)."""
    for r in report:
        before, after = str(r["before"]), str(r["after"])
        if ".EF" not in after or after.replace(".EF", "", 1) != before:
            return f"{r['section']}+{int(str(r['offset'])):#x}: {before!r} became {after!r}"
    return None
