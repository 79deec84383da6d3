"""Removal of redundant conversions and copies in PTX (`redundant-cvt`).

Only exact identities are removed; each rule is proven bit for bit in `test_asm_reorder.py` (exhaustive
over 16-bit values, randomized with edge values over 32 and 64 bits, in numpy and torch):

1. `cvt.T.T d, s` and `cvt.uN.sN` / `cvt.sN.uN` (integers of one width N in 16, 32, 64, no `.sat`, both
   registers declared N bits wide) copy the bits: `mov.bN d, s`;
2. narrowing a widening back: `w = cvt.{u,s}M.{u,s}N x` then `y = cvt.{u,s}N.{u,s}M w` (M > N, no
   `.sat`) is `y = x` whatever the signedness of each (truncating a sign- or zero-extension keeps the low
   N bits): `mov.bN y, x`;
3. floating round trips through a wider type: `w = cvt.f32.f16 x` then `y = cvt.rn.f16.f32 w` (likewise
   `bf16` through `f32` and `f32` through `f64`; any of the rounding modes `rn rz rm rp`, no `.ftz`,
   `.sat` or `.relu`) is `y = x`: widening is exact, and a value the narrow type holds rounds to itself.
   NaNs stay NaN, but the hardware may quiet or canonicalize a NaN's payload in the round trip while the
   copy keeps it: equal under kstrata's comparison (any NaN matches any NaN), not bit-identical for NaN
   inputs; `float_roundtrips=false` leaves these alone;
4. copy chains: `b = mov a` then `c = mov b` (or a `cvt` reading `b`) reads `a` directly.

Each rule needs the producer and the consumer in one region (`ptx_sched.regions`: no label, barrier or
instruction the model does not understand between them), the producer unguarded, and its source not
redefined in between. A producer left with no reader anywhere in the kernel is deleted. Not a rule: a
narrowing followed by a widening (`cvt.rn.f16.f32` then `cvt.f32.f16` rounds; `cvt.u16.u32` then
`cvt.u32.u16` drops the high bits), 8-bit types (their registers are 16 bits wide and the conversion
extends), saturating or flushing conversions.
"""

from __future__ import annotations

import functools
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from kstrata.backends.ptx import Instruction, PtxModule, parse_ptx
from kstrata.ir.bundle import KernelBundle

from .base import KernelPass, PassContext, PassResult
from .ptx_sched import regions

_INT_WIDTH = {"u16": 16, "s16": 16, "u32": 32, "s32": 32, "u64": 64, "s64": 64}
_ROUNDING = ("rn", "rz", "rm", "rp")
#: (narrow, wide) floating types whose round trip narrow -> wide -> narrow is exact.
_FLOAT_PAIRS = {("f16", "f32"): 16, ("bf16", "f32"): 16, ("f32", "f64"): 32}
_TYPE_WIDTH = re.compile(r"^\.[busf](\d+)$")
_PLAIN_REGISTER = re.compile(r"^%[A-Za-z_$][\w$]*$")


def register_widths(module: PtxModule) -> dict[str, int]:
    """Register name or name prefix (`%r` of `%r<39>`) -> declared width in bits."""
    widths: dict[str, int] = {}
    for name, kind in module.register_declarations().items():
        m = _TYPE_WIDTH.match(kind)
        if not m:
            continue
        prefix = re.match(r"^(%[A-Za-z_$][\w$]*?)<\d+>$", name)
        widths[prefix.group(1) if prefix else name] = int(m.group(1))
    return widths


def _width(reg: str, widths: dict[str, int]) -> int | None:
    if not _PLAIN_REGISTER.match(reg):
        return None
    if reg in widths:
        return widths[reg]
    return widths.get(re.sub(r"\d+$", "", reg))


@dataclass(frozen=True)
class _Copy:
    """A producer a later instruction may read through: `dest = op(src)`, with src's version then."""

    index: int
    kind: str  # "mov", "widen-int", "widen-float"
    src: str
    src_version: int
    narrow: str = ""  # the source type of a widening
    wide: str = ""


@dataclass(frozen=True)
class CvtRewrite:
    text: str
    rewritten: tuple[tuple[int, str, str], ...]  # (PTX line, before, after)
    deleted: tuple[int, ...]


def _mov(ins: Instruction, width: int, dest: str, src: str) -> Instruction:
    return replace(ins, opcode=f"mov.b{width}").with_operands((dest, src))


@functools.lru_cache(maxsize=32)
def remove_redundant_conversions(text: str, float_roundtrips: bool = True) -> CvtRewrite:
    module = parse_ptx(text)
    widths = register_widths(module)
    rewritten: list[tuple[int, str, str]] = []
    producers_used: set[int] = set()
    for region in regions(module):
        version: Counter[str] = Counter()
        copies: dict[str, _Copy] = {}
        for unit in region.units:
            ins = module.lines[unit.index]
            assert isinstance(ins, Instruction)
            new = _rewrite(ins, copies, version, widths, float_roundtrips)
            if new is not None:
                new_ins, producer = new
                rewritten.append((ins.lineno, _show(ins), _show(new_ins)))
                producers_used.add(producer)
                module.lines[unit.index] = ins = new_ins
            for reg in unit.effects.defs:
                version[reg] += 1
                copies.pop(reg, None)
            record = _producer(ins, unit.index, version, widths)
            if record is not None:
                copies[ins.operands[0].strip()] = record
    deleted = _delete_dead(module, producers_used)
    return CvtRewrite(str(module), tuple(rewritten), deleted)


def _show(ins: Instruction) -> str:
    return f"{ins.opcode} {', '.join(ins.operands)}"


def _producer(ins: Instruction, index: int, version: Counter[str], widths: dict[str, int]) -> _Copy | None:
    if ins.predicate or len(ins.operands) != 2:
        return None
    dest, src = (o.strip() for o in ins.operands)
    if _width(src, widths) is None or _width(dest, widths) is None or src == dest:
        return None
    mods = ins.modifiers
    if ins.base_opcode == "mov" and len(mods) == 1 and _width(src, widths) == _width(dest, widths):
        return _Copy(index, "mov", src, version[src])
    if ins.base_opcode == "cvt" and len(mods) == 2:
        wide, narrow = mods
        if wide in _INT_WIDTH and narrow in _INT_WIDTH and _INT_WIDTH[wide] > _INT_WIDTH[narrow]:
            return _Copy(index, "widen-int", src, version[src], narrow, wide)
        if (narrow, wide) in _FLOAT_PAIRS:
            return _Copy(index, "widen-float", src, version[src], narrow, wide)
    return None


def _rewrite(ins: Instruction, copies: dict[str, _Copy], version: Counter[str], widths: dict[str, int],
             float_roundtrips: bool) -> tuple[Instruction, int] | None:
    """The instruction `ins` becomes, and the producer it now reads past, when a rule applies."""
    if len(ins.operands) != 2:
        return None
    dest, src = (o.strip() for o in ins.operands)
    wd, ws = _width(dest, widths), _width(src, widths)
    if wd is None or ws is None:
        return None
    mods = ins.modifiers
    base = ins.base_opcode
    # 1. same-width integer conversions copy the bits
    if base == "cvt" and len(mods) == 2 and all(m in _INT_WIDTH for m in mods) and \
            _INT_WIDTH[mods[0]] == _INT_WIDTH[mods[1]] == wd == ws:
        return _mov(ins, wd, dest, src), -1
    copy = copies.get(src)
    if copy is None or version[copy.src] != copy.src_version:
        return None
    origin_width = _width(copy.src, widths)
    # 2. narrowing an integer widening back to its own width
    if copy.kind == "widen-int" and base == "cvt" and len(mods) == 2 and all(m in _INT_WIDTH for m in mods) \
            and _INT_WIDTH[mods[1]] == _INT_WIDTH[copy.wide] and _INT_WIDTH[mods[0]] == _INT_WIDTH[copy.narrow] \
            == origin_width == wd:
        return _mov(ins, wd, dest, copy.src), copy.index
    # 3. a floating round trip through a wider type
    if float_roundtrips and copy.kind == "widen-float" and base == "cvt" and len(mods) == 3 \
            and mods[0] in _ROUNDING and mods[1:] == (copy.narrow, copy.wide) \
            and _FLOAT_PAIRS[(copy.narrow, copy.wide)] == origin_width == wd:
        return _mov(ins, wd, dest, copy.src), copy.index
    # 4. copy chains: read the copy's source
    if copy.kind == "mov" and origin_width == ws and ((base == "mov" and len(mods) == 1) or base == "cvt"):
        return ins.with_operands((ins.operands[0], copy.src)), copy.index
    return None


def _delete_dead(module: PtxModule, producers: set[int]) -> tuple[int, ...]:
    """Delete the producers (line indices) whose destination no instruction reads any more."""
    if not producers:
        return ()
    counts: Counter[str] = Counter()
    for entry in module.entries:
        for _, ins in module.instructions(entry.name):
            for op in ins.operands:
                counts.update(re.findall(r"%[A-Za-z_$][\w$]*", op))
            if ins.predicate:
                counts.update(re.findall(r"%[A-Za-z_$][\w$]*", ins.predicate))
    deleted = []
    for index in sorted(producers - {-1}, reverse=True):
        producer = module.lines[index]
        assert isinstance(producer, Instruction)
        if counts[producer.operands[0].strip()] == 1:  # only its own definition
            deleted.append(producer.lineno)
            del module.lines[index]
    _reindex(module)
    return tuple(sorted(deleted))


def _reindex(module: PtxModule) -> None:
    """Entries' body ranges after lines were deleted: parse the printed text again."""
    fresh = parse_ptx(str(module))
    module.lines, module.entries = fresh.lines, fresh.entries


@dataclass(frozen=True)
class RedundantConversions(KernelPass):
    """Remove conversions and copies that are exact identities (`passes/ptx_cvt.py` lists and proves the
    rules): same-width integer `cvt`s become `mov`s, a narrowing of a widening (integer, or a floating
    round trip such as f16 -> f32 -> f16) reads the original register, copy chains read their source,
    and producers left unread are deleted.

    Helps little where ptxas already folds the same patterns (often the cubin is unchanged; the engine
    then says so), more on PTX written by hand or by other generators. Sound: every rule is an identity
    on the bits, except that a floating round trip may change a NaN's payload (not whether it is NaN);
    `float_roundtrips=false` keeps those.
    """

    name = "redundant-cvt"
    level = "ptx"
    backends = ("cuda",)
    float_roundtrips: bool = True

    @classmethod
    def space_values(cls, bundle: KernelBundle) -> dict[str, Sequence[Any]]:
        return {"float_roundtrips": (True,)}

    def precondition(self, ctx: PassContext) -> str | None:
        if not remove_redundant_conversions(ctx.text, self.float_roundtrips).rewritten:
            return "no redundant conversion or copy chain"
        return None

    def apply(self, ctx: PassContext) -> PassResult:
        result = remove_redundant_conversions(ctx.text, self.float_roundtrips)
        return PassResult(result.text, notes=[f"{len(result.rewritten)} conversions/copies rewritten, "
                                              f"{len(result.deleted)} dead producers deleted"])
