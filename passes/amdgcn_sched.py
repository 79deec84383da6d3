"""AMDGCN instruction reordering inside basic blocks (`amdgcn-reorder`), on the hot window, for gfx9/CDNA.

The rules of `ptx_sched.py`, with AMD's:

- **What ends a region**: labels, directives other than `.loc`, and every instruction outside the
  lists below — in particular `s_barrier`, `s_dcache_*`/`s_icache_*`, `buffer_wbl2`, `buffer_inv`,
  `buffer_wbinvl1*`, branches and `s_endpgm`, `s_setprio`, `s_nop`, `s_sleep`, `s_sendmsg`,
  `s_setreg`/`s_getreg`, `s_getpc`, `s_memtime`, atomics of every kind (`*_atomic_*`, `ds_add_*`, …),
  LDS-direct and `tfe`/`lwe` loads, DPP and SDWA forms, `v_readlane`/`v_readfirstlane`/`v_writelane`,
  `v_movrel*`, `v_interp*`, `v_div_*` (implicit VCC), `v_cmpx*`, `v_mfma*`/`v_smfmac*`, `v_accvgpr_*`,
  `v_swap*`, `v_permlane*`, and anything that names `exec`, `m0`, `ttmp*`, `flat_scratch` or
  `xnack_mask`: instructions whose effects are implicit or not certain are full barriers;
- **s_waitcnt** (`s_waitcnt`, `s_waitcnt_vmcnt`, `s_waitcnt_lgkmcnt`) is an instruction of the region that
  reads and writes every register any memory instruction of the function may write, and both counters:
  no memory op crosses a wait, and no instruction that reads or writes a register a load may write
  crosses one (so a use of a loaded register stays after the wait that covers it); other instructions
  may cross it (`sink-waits` moves a wait down past them, so independent work issues before the wave
  stalls). The vector memory ops (`global_`, `buffer_`, `flat_`, `scratch_`: loads and stores) keep
  their order among themselves, as do the LGKM ops (`ds_*`, `s_load*`, and `flat_*` again): every wait
  counts the same ops as before. The `s_waitcnt` hazard check (`backends/amd_hazards.py`) runs on every
  result and a new hazard is an error;
- **registers**: `v`, `s`, `a` registers and ranges, `vcc` (as `vcc_lo` + `vcc_hi`); an instruction's
  first operand is what it writes, the second too for VOP3b carry-outs (`*_co_*`, `v_mad_u64_u32`);
  scalar ALU instructions other than `s_mov*` read and write `scc`; every operand counts as read (MAC
  forms read their destination);
- **memory**: LDS, global (`global_`, `buffer_`, scalar loads) and private (`scratch_`) are separate
  spaces, `flat_` aliases all; loads may pass loads, nothing passes a store of an aliasing space;
- **wait states**: the hardware does not check some dependencies, and LLVM met them with the distances
  the original order has. Those that can involve the instructions this pass moves (gfx9/CDNA, from
  LLVM's hazard recognizer as read — not tested on hardware, there is no AMD GPU here): a VALU write of
  an SGPR or VCC read by a later instruction needs up to 5 wait states (vector/scalar memory reading it
  as an address); a transcendental (`v_exp`, `v_rcp`, …) or `op_sel` VALU result read by the next VALU
  (gfx940) up to 2 (1 required). So such a dependent pair is never brought closer than it was, up to that
  bound; an instruction reading a register that some VALU of the function writes that way does not move
  nearer the start of its region than it was (its producer may lie before the region, or at the end of
  the loop), nor does such a producer move nearer the end; and when the function holds MFMA
  instructions (whose results need up to 18 wait states) every instruction keeps its distances up to
  19; a write of the registers a vector store reads keeps 2 from the store. A strategy whose schedule
  cannot keep them leaves the region as it is (counted as `held`).

The result must reassemble with `llvm-mc` to the same instruction encodings, permuted within the
regions (`test_asm_reorder.py` checks it), and is unmeasured without an AMD GPU: it is ranked by the
llvm-mca surrogate like the other AMDGCN edits.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from kstrata.ir.bundle import KernelBundle

from .base import KernelPass, PassContext, PassError, PassResult
from .schedule import (
    ANY_SPACE,
    BlockReorder,
    Effects,
    Reordering,
    Stuck,
    Unit,
    clip_region,
    dependency_graph,
    hoist_rank,
    hot_window_lines,
    list_schedule,
    order_violations,
    render_units,
    sink_rank,
)
from .window import scope_option

_INSTRUCTION = re.compile(r"^\s+(?P<mn>[a-z][a-z0-9_]*)\b(?P<ops>[^;]*)")
_LABEL = re.compile(r"^[.\w$]+:")
_FUNCTION = re.compile(r"^\s*\.type\s+([\w$.]+)\s*,\s*@function")
_REGISTER = re.compile(r"(?<![\w.$])([vsa])(?:(\d+)|\[(\d+):(\d+)\])(?![\w$])")
_VCC = re.compile(r"(?<![\w.$])vcc(_lo|_hi)?(?![\w$])")
_FORBIDDEN_OPERAND = re.compile(r"(?<![\w.$])(exec\w*|m0|ttmp\d+|ttmp\[|flat_scratch\w*|xnack_mask\w*|src_\w+|"
                                r"lds_direct|row_\w+|quad_perm|bank_mask|dpp8|tfe|lwe|gds)(?![\w$])")
_SALU = re.compile(r"^s_(add|addc|sub|subb|addk|mul|mulk|mul_hi|lshl|lshr|ashr|and|or|xor|andn2|orn2|nand|nor|"
                   r"xnor|not|min|max|cmp|cmpk|cselect|mov|movk|cmov|cmovk|bfe|bfm|brev|bcnt0|bcnt1|ff0|ff1|flbit|"
                   r"sext|abs|absdiff|lshl[1-4]_add|pack|bitset0|bitset1|bitcmp0|bitcmp1|quadmask|wqm)_")
_VALU_BARRIER = re.compile(r"(_dpp|_sdwa)$|^v_(readlane|readfirstlane|writelane|movrel|interp|div_|cmpx|mfma|smfmac|"
                           r"accvgpr|swap|permlane|nop|pipeflush|s_)")
_CARRY_OUT = re.compile(r"_co_|^v_mad_[iu]64_[iu]32")
_DS = re.compile(r"^ds_(read|write|load|store)")
#: Wait states kept (see the module docstring): VALU-written SGPR/VCC, forwarded VALU results, MFMA code,
#: a write of the registers a vector store reads.
SGPR_DISTANCE = 5
FORWARD_DISTANCE = 2
MFMA_DISTANCE = 19
STORE_DATA_DISTANCE = 2
_TRANS = re.compile(r"^v_(exp|log|rcp|rsq|sqrt|sin|cos)_")


def _units(text: str) -> set[str]:
    out: set[str] = set()
    for m in _REGISTER.finditer(text):
        lo, hi = (int(m.group(2)),) * 2 if m.group(2) is not None else (int(m.group(3)), int(m.group(4)))
        out.update(f"{m.group(1)}{i}" for i in range(lo, hi + 1))
    for m in _VCC.finditer(text):
        out.update({"vcc_lo", "vcc_hi"} if not m.group(1) else {f"vcc{m.group(1)}"})
    return out


_WAITS = frozenset({"s_waitcnt", "s_waitcnt_vmcnt", "s_waitcnt_lgkmcnt"})
_MEMORY_PREFIXES = ("global_", "buffer_", "flat_", "scratch_", "tbuffer_", "image_", "ds_", "s_load", "s_buffer_load",
                    "s_scratch_load", "s_atomic", "s_buffer_atomic")
_COUNTERS = frozenset({"%vm", "%lgkm"})


def loaded_registers(text: str) -> frozenset[str]:
    """Every register a memory instruction of `text` may write (the first operand of every load, atomic
    and, conservatively, store): what an `s_waitcnt` may be waiting for."""
    out: set[str] = set()
    for line in text.split("\n"):
        m = _INSTRUCTION.match(line)
        if m and m["mn"].startswith(_MEMORY_PREFIXES) and m["ops"].strip():
            out |= _units(m["ops"].split(",", 1)[0])
    return frozenset(out)


def amdgcn_effects(mnemonic: str, operands: str, loaded: frozenset[str] | None = None) -> Effects | None:
    """What one AMDGCN instruction reads and writes, or None when it is a barrier (see the docstring).

    With `loaded` (`loaded_registers` of the function), an `s_waitcnt` is not a barrier but an instruction
    that reads and writes every register a load may write and both memory counters: every use of a loaded
    register and every memory op keeps its side of the wait, while other instructions may cross it."""
    if mnemonic in _WAITS and loaded is not None:
        waited = loaded | _COUNTERS
        return Effects(waited, waited)
    if _FORBIDDEN_OPERAND.search(operands) or "exec" in mnemonic:
        return None
    ops = [o.strip() for o in operands.split(",")] if operands.strip() else []
    first = _units(ops[0]) if ops else set()
    every = _units(operands)
    if mnemonic.startswith(("global_", "buffer_", "flat_", "scratch_")):
        kind = "load" if "_load" in mnemonic else "store" if "_store" in mnemonic else None
        if kind is None or "atomic" in mnemonic or "_lds" in mnemonic or re.search(r"(?<!\w)lds(?!\w)", operands):
            return None
        space = {"global": "global", "buffer": "global", "scratch": "private", "flat": ANY_SPACE}[mnemonic.split("_")[0]]
        counters = {"%vm", "%lgkm"} if mnemonic.startswith("flat_") else {"%vm"}
        if kind == "load":
            return Effects(frozenset(first | counters), frozenset(every | counters), reads=frozenset({space}),
                           hoistable_load=True)
        return Effects(frozenset(counters), frozenset(every | counters), writes=frozenset({space}), sinkable_store=True)
    if mnemonic.startswith("ds_"):
        if not _DS.match(mnemonic):
            return None
        if mnemonic.startswith(("ds_read", "ds_load")):
            return Effects(frozenset(first | {"%lgkm"}), frozenset(every | {"%lgkm"}), reads=frozenset({"lds"}))
        return Effects(frozenset({"%lgkm"}), frozenset(every | {"%lgkm"}), writes=frozenset({"lds"}))
    if mnemonic.startswith(("s_load_", "s_buffer_load_")):
        return Effects(frozenset(first | {"%lgkm"}), frozenset(every | {"%lgkm"}), reads=frozenset({"global"}))
    if mnemonic.startswith("s_"):
        if not _SALU.match(mnemonic):
            return None
        scc = set() if mnemonic.startswith(("s_mov_", "s_movk_")) else {"scc"}
        return Effects(frozenset(first | scc), frozenset(every | scc))
    if mnemonic.startswith("v_"):
        if _VALU_BARRIER.search(mnemonic):
            return None
        defs = set(first)
        if _CARRY_OUT.search(mnemonic) and len(ops) > 1 and (ops[1].startswith("s") or ops[1].startswith("vcc")):
            defs |= _units(ops[1])
        return Effects(frozenset(defs), frozenset(every))
    return None


# ---------------------------------------------------------------------------------------------------
# Regions of the text
# ---------------------------------------------------------------------------------------------------
@dataclass
class AmdRegion:
    start: int  # line indices, inclusive
    end: int
    units: list[Unit[str]]
    loc_before: str | None
    #: Registers the function's VALU instructions write that a later reader must keep its distance from:
    #: register -> wait states (SGPRs/VCC: 5; results of transcendental or op_sel instructions: 2).
    watched: dict[str, int]
    mfma: bool

    @property
    def effects(self) -> list[Effects]:
        return [u.effects for u in self.units]


def _is_loc(line: str) -> bool:
    return line.lstrip().startswith(".loc\t") or line.lstrip().startswith(".loc ")


def regions(text: str, waits_move: bool = True) -> list[AmdRegion]:
    """The reorderable regions (two instructions or more) of every function of `text`; `s_waitcnt`s are
    instructions of a region (see `amdgcn_effects`) unless `waits_move` is false."""
    lines = text.split("\n")
    functions = {m.group(1) for ln in lines if (m := _FUNCTION.match(ln))}
    out: list[AmdRegion] = []
    inside = False
    loc: str | None = None
    loc_at_pending: str | None = None
    units: list[Unit[str]] = []
    pending: list[str] = []
    start: int | None = None
    loc_before: str | None = None
    mfma = bool(re.search(r"\bv_(mfma|smfmac)", text))
    watched = _watched(lines)
    loaded = loaded_registers(text) if waits_move else None

    def close(units: list[Unit[str]], start: int | None, loc_before: str | None) -> None:
        if len(units) > 1 and start is not None:
            out.append(AmdRegion(start, units[-1].index, units, loc_before, watched, mfma))

    for i, line in enumerate(lines):
        if not pending:
            loc_at_pending = loc
        label = _LABEL.match(line)
        if label:
            name = line.split(":", 1)[0]
            if name in functions:
                inside = True
            elif name.startswith(".Lfunc_end"):
                inside = False
        stripped = line.strip()
        if inside and not label and (not stripped or stripped.startswith(";")):
            pending.append(line)
            continue
        if inside and _is_loc(line):
            pending.append(line)
            loc = line
            continue
        m = _INSTRUCTION.match(line) if inside and not label and not stripped.startswith(".") else None
        effects = amdgcn_effects(m["mn"], m["ops"], loaded) if m else None
        if effects is None:
            close(units, start, loc_before)
            units, start, pending = [], None, []
            continue
        if start is None:
            start = i - len(pending)
            loc_before = loc_at_pending
        units.append(Unit(i, line, effects, [p for p in pending if not _is_loc(p)], [], loc))
        pending = []
    close(units, start, loc_before)
    return out


def _hazard_writes(mnemonic: str, operands: str) -> dict[str, int]:
    """The registers a VALU instruction writes that a reader must keep its distance from, with the bound."""
    if not mnemonic.startswith("v_"):
        return {}
    ops = [o.strip() for o in operands.split(",")] if operands.strip() else []
    defs = _units(ops[0]) if ops else set()
    if _CARRY_OUT.search(mnemonic) and len(ops) > 1:
        defs |= _units(ops[1])
    out = {r: SGPR_DISTANCE for r in defs if r.startswith(("s", "vcc"))}
    if _TRANS.match(mnemonic) or "op_sel" in operands:
        out.update({r: max(out.get(r, 0), FORWARD_DISTANCE) for r in defs})
    return out


def _watched(lines: Sequence[str]) -> dict[str, int]:
    watched: dict[str, int] = {}
    for line in lines:
        m = _INSTRUCTION.match(line)
        if m:
            for r, b in _hazard_writes(m["mn"], m["ops"]).items():
                watched[r] = max(watched.get(r, 0), b)
    return watched


def _same_loc(a: str | None, b: str | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return a.split(";", 1)[0].split() == b.split(";", 1)[0].split()


def _order(region: AmdRegion, strategy: str) -> list[int] | None:
    preds = dependency_graph(region.effects)
    n = len(region.units)
    rank = _rank(region, preds, strategy)
    writes = [_hazard_writes(*_split(u.line)) for u in region.units]
    full = MFMA_DISTANCE if region.mfma else 0
    # the distance instruction i must keep from the start of the region (a producer before it) and the
    # distance it must keep from the end (a reader after it), and per edge from its producer
    start_bound = [max([full] + [region.watched.get(r, 0) for r in u.effects.uses]) for u in region.units]
    end_bound = [max([full, *w.values()]) for w in writes]

    def pair_bound(p: int, i: int) -> int:
        bound = max([full] + [b for r, b in writes[p].items() if r in region.units[i].effects.uses])
        if region.effects[p].sinkable_store and region.effects[p].uses & region.effects[i].defs:
            bound = max(bound, STORE_DATA_DISTANCE)  # a write of a store's data registers right after it
        return bound

    def eligible(i: int, slot: int, placed: dict[int, int]) -> bool:
        if slot < min(i, start_bound[i]) or (n - 1 - slot) < min(n - 1 - i, end_bound[i]):
            return False
        return all(slot - placed[p] >= min(i - p, pair_bound(p, i)) for p in preds[i])

    try:
        order = list_schedule(preds, rank, eligible)
    except Stuck:
        return None  # the strategy cannot keep the wait-state distances here: the region stays as it is
    if order_violations(preds, order):
        raise PassError("amdgcn-reorder: the schedule broke a dependency (a bug in kstrata)")
    return order


def _rank(region: AmdRegion, preds: Sequence[set[int]], strategy: str) -> Callable[[int], tuple[int, ...]]:
    if strategy == "hoist-loads":
        return hoist_rank(preds, region.effects)
    if strategy == "sink-waits":
        waits = {k for k, u in enumerate(region.units) if _split(u.line)[0] in _WAITS}
        return lambda i: (1 if i in waits else 0,)
    return sink_rank(region.effects)


def _split(line: str) -> tuple[str, str]:
    m = _INSTRUCTION.match(line)
    assert m is not None
    return m["mn"], m["ops"]


@functools.lru_cache(maxsize=32)
def reorder_amdgcn(text: str, strategy: str, first_line: int = 1, last_line: int = 1 << 30) -> Reordering:
    """Reorder the regions of `text` by `strategy`, each clipped to lines `first_line`..`last_line` (1-based)."""
    lines = text.split("\n")
    found = [c for r in regions(text) if (c := clip_region(r, first_line - 1, last_line - 1)) is not None]
    moved = changed = held = 0
    for region in sorted(found, key=lambda r: -r.start):
        if any(u.loc is None for u in region.units) and any(u.loc is not None for u in region.units):
            continue
        graph = dependency_graph(region.effects)
        free = list_schedule(graph, _rank(region, graph, strategy))
        order = _order(region, strategy)
        if order is None:
            held += free != list(range(len(free)))
            continue
        if order == list(range(len(order))):
            held += free != order
            continue
        lines[region.start:region.end + 1] = render_units(region.units, order, region.loc_before, _same_loc)
        moved += sum(1 for k, node in enumerate(order) if k != node)
        changed += 1
    return Reordering("\n".join(lines), moved, changed, len(found), held)


def hot_lines(text: str) -> tuple[int, int]:
    return hot_window_lines(text, "amdgcn")


@dataclass(frozen=True)
class AmdgcnReorder(BlockReorder, KernelPass):
    """Reorder instructions inside basic blocks of the hot window of AMDGCN, respecting register,
    `scc`/`vcc` and memory dependencies, the order of each memory counter's ops, the wait-state distances
    of the original, and never crossing a label, branch, `s_waitcnt`, barrier, cache control,
    `s_setprio` or an instruction the model does not understand (`passes/amdgcn_sched.py` has the rules).

    `strategy=hoist-loads` issues vector memory loads as early as their operands allow (memory ops never
    cross an `s_waitcnt`); `sink-stores` keeps stores back to the end of their block; `sink-waits` moves
    each `s_waitcnt` down past the instructions that do not touch a loaded register. Sound by the dependency graph;
    the `s_waitcnt` hazard check runs on the result. Unmeasured here (no AMD GPU): ranked by llvm-mca.
    """

    name = "amdgcn-reorder"
    level = "amdgcn"
    backends = ("hip",)
    strategy: Literal["hoist-loads", "sink-stores", "sink-waits"] = "hoist-loads"
    scope: str = scope_option("hot")

    @classmethod
    def space_values(cls, bundle: KernelBundle) -> dict[str, Sequence[Any]]:
        return {"strategy": ("hoist-loads", "sink-stores", "sink-waits"), "scope": ("hot",)}

    def _schedule(self, text: str, first_line: int, last_line: int) -> Reordering:
        return reorder_amdgcn(text, self.strategy, first_line, last_line)

    def apply(self, ctx: PassContext) -> PassResult:
        from kstrata.backends.amd_hazards import new_waitcnt_hazards

        result = self._reordered(ctx.text)
        new = new_waitcnt_hazards(ctx.text, result.text)
        if new:
            raise PassError(f"amdgcn-reorder: the reordered code has {len(new)} new s_waitcnt hazard(s), first "
                            f"{new[0]} (a bug in kstrata's dependency rules)")
        return PassResult(result.text, notes=self._notes(result))
