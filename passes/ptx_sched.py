"""PTX instruction reordering inside basic blocks (`ptx-reorder`), on the hot window.

A **region** is a run of instructions the model understands, with no label, brace, directive other
than `.loc`, or barrier between them (`regions`). What ends a region — conservative on purpose:

- labels, branches (`bra`, `brx`), `call`, `ret`, `exit`, `trap`, and every line inside an inline-asm
  `{ … }` scope;
- barriers and fences: `bar`, `barrier`, `membar`, `fence`, `mbarrier.*`, `cp.async.commit_group` /
  `wait_group` / `wait_all` / `bulk.*`, `wgmma.*` (its fences and its asynchronous MMA), `griddepcontrol`,
  `setmaxnreg`, and atomics and reductions (`atom`, `red`), whatever their state space;
- loads and stores with a memory order or `volatile` (`.relaxed`, `.acquire`, `.release`, `.mmio`, a
  scope), `st.param` (call arguments);
- warp-collective instructions (`shfl`, `vote`, `match`, `redux`, `mma`, `ldmatrix`, `stmatrix`, …) and
  reads of clocks and other volatile special registers (`%clock`, `%globaltimer`, `%smid`, `%warpid`);
- **any opcode not in the list below**: the model does not know which operands it writes, so it is
  treated as a full barrier.

Understood: integer and floating arithmetic, logic, shifts, comparisons and selects, conversions
(`cvt`, `cvta`), moves, `ld`/`ldu`/`st` (with their state space; none = generic, which aliases every
space), and `cp.async.{ca,cg}` (a read of global memory and a write of shared memory). The first
operand is what an instruction defines (a vector `{%r1, %r2}` or a predicate pair `%p|%q` defines each
register); a guarded instruction (`@%p`) also reads the registers it defines, because it keeps their
old values when the guard is false; carry-chain arithmetic (`add.cc`, `addc`, …) reads and writes the
carry flag. Memory: loads may pass loads; nothing passes a store to the same state space or to a
generic address (no address analysis: two global accesses are assumed to alias); `.param` and `.const`
are read-only.

Strategies: `hoist-loads` issues global loads (and the address arithmetic and guards they wait for)
as early as the dependency graph allows, so their latency overlaps the arithmetic that follows;
`sink-stores` keeps global stores back until nothing else in the region is ready. `.loc` line info
moves with its instruction (a `.loc` is re-emitted wherever the line changes, and the line in effect
after a region is the original one), comments move with the instruction they precede.

Any order that respects the dependency graph computes what the original does; the rebuilt PTX must
still pass ptxas, and the candidate is checked like every other — the differential run on a GPU; on
the CPU it stays `unproven`. ptxas schedules the machine code itself, so a PTX order it undoes gives a
byte-identical cubin (the engine then reports the candidate unchanged).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from kstrata.backends.ptx import Blank, Brace, Comment, Directive, Instruction, PtxLine, PtxModule, parse_ptx
from kstrata.ir.bundle import KernelBundle

from .base import KernelPass, PassContext, PassResult
from .schedule import (
    BlockReorder,
    Effects,
    Reordering,
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

_REGISTER = re.compile(r"%[A-Za-z_$][\w$]*")

#: Opcodes whose first operand is what they define and whose other operands are read.
_ARITHMETIC = frozenset("""
add sub mul mad mul24 mad24 sad fma div rem abs neg min max and or xor not cnot shl shr cvt cvta mov selp setp
set slct rcp sqrt rsqrt ex2 lg2 sin cos tanh popc clz brev bfe bfi bfind prmt lop3 shf copysign testp fns dp4a
dp2a isspacep addc subc madc
""".split())
#: Special registers that hold the same value for the whole launch (reading them has no order).
_CONSTANT_SPECIALS = frozenset("""
%tid %ntid %ctaid %nctaid %laneid %lanemask_eq %lanemask_le %lanemask_lt %lanemask_ge %lanemask_gt %clusterid
%nclusterid %cluster_ctaid %cluster_nctaid %cluster_ctarank %cluster_nctarank %is_explicit_cluster
%dynamic_smem_size %total_smem_size %aggr_smem_size %gridid
""".split())
#: Special registers whose value changes while the kernel runs: reading one is a barrier.
_VOLATILE_SPECIALS = re.compile(r"^%(clock|clock64|globaltimer\w*|smid|nsmid|warpid|nwarpid|pm\d\w*|envreg\d+|"
                                r"reserved_smem\w*|current_graph_exec)$")
_ORDERED = frozenset({"volatile", "relaxed", "acquire", "release", "mmio", "sys", "gpu", "cta", "cluster",
                      "acq_rel", "sc"})
_SPACES = {"global": "global", "shared": "shared", "shared::cta": "shared", "shared::cluster": "shared",
           "local": "local", "param": "param", "const": "const"}
READ_ONLY = ("param", "const")


def _regs(text: str) -> set[str]:
    return set(_REGISTER.findall(text))


def ptx_effects(ins: Instruction) -> Effects | None:
    """What `ins` reads and writes, or None when the model does not understand it (a barrier)."""
    mods = ins.modifiers
    base = ins.base_opcode
    tokens = _regs(" ".join(ins.operands)) | (_regs(ins.predicate) if ins.predicate else set())
    if any(_VOLATILE_SPECIALS.match(t) for t in tokens):
        return None
    specials = {t for t in tokens if t in _CONSTANT_SPECIALS}
    guard = _regs(ins.predicate) if ins.predicate else set()
    first = _regs(ins.operands[0]) - specials if ins.operands else set()
    rest = _regs(" ".join(ins.operands[1:])) - specials
    if base in ("ld", "ldu"):
        if _ORDERED & set(mods) or not ins.operands:
            return None
        space = next((_SPACES[m] for m in mods if m in _SPACES), "generic")
        return Effects(frozenset(first), frozenset(rest | guard | (first if ins.predicate else set())),
                       reads=frozenset({space}), hoistable_load=space == "global")
    if base == "st":
        if _ORDERED & set(mods) or "param" in mods:
            return None
        space = next((_SPACES[m] for m in mods if m in _SPACES), "generic")
        return Effects(frozenset(), frozenset(first | rest | guard), writes=frozenset({space}),
                       sinkable_store=space == "global")
    if base == "cp":
        if len(mods) < 3 or mods[0] != "async" or mods[1] not in ("ca", "cg") or not mods[2].startswith("shared"):
            return None
        return Effects(frozenset(), frozenset(first | rest | guard), reads=frozenset({"global"}),
                       writes=frozenset({"shared"}))
    if base not in _ARITHMETIC or not ins.operands:
        return None
    defs, uses = set(first), rest | guard | (first if ins.predicate else set())
    if "cc" in mods or base in ("addc", "subc", "madc"):
        defs.add("%%carry")
        uses.add("%%carry")
    return Effects(frozenset(defs), frozenset(uses))


# ---------------------------------------------------------------------------------------------------
# Regions and their text
# ---------------------------------------------------------------------------------------------------
_Unit = Unit[PtxLine]


@dataclass
class Region:
    """A run of understood instructions: lines `start`..`end` (indices, inclusive) of the module."""

    start: int
    end: int
    units: list[_Unit]
    #: The `.loc` in effect before the region's first line.
    loc_before: Directive | None

    @property
    def effects(self) -> list[Effects]:
        return [u.effects for u in self.units]

    def graph(self) -> list[set[int]]:
        return dependency_graph(self.effects, read_only=READ_ONLY)


def regions(module: PtxModule) -> list[Region]:
    """The reorderable regions (two instructions or more) of every entry of `module`."""
    out: list[Region] = []
    for entry in module.entries:
        depth = 0
        loc: Directive | None = None
        loc_at_pending: Directive | None = None  # the .loc in effect before the first pending line
        units: list[_Unit] = []
        pending: list[PtxLine] = []
        start: int | None = None
        loc_before: Directive | None = None

        def close(units: list[_Unit], start: int | None, loc_before: Directive | None) -> None:
            if len(units) > 1 and start is not None:
                last = units[-1]
                out.append(Region(start, last.index + len(last.after), units, loc_before))

        for i in range(entry.body_start + 1, entry.body_end):
            line = module.lines[i]
            if not pending:
                loc_at_pending = loc
            if isinstance(line, (Blank, Comment)):
                if isinstance(line, Comment) and line.text.startswith("// end inline asm") and units \
                        and not pending and units[-1].index + len(units[-1].after) == i - 1:
                    units[-1].after.append(line)
                else:
                    pending.append(line)
                continue
            if isinstance(line, Directive) and line.name == ".loc":
                pending.append(line)
                loc = line
                continue
            if isinstance(line, Brace):
                depth += 1 if line.brace == "{" else -1
            effects = ptx_effects(line) if isinstance(line, Instruction) and depth == 0 else None
            if effects is None or not isinstance(line, Instruction):
                close(units, start, loc_before)  # a label, brace, directive, barrier or unknown instruction
                units, start, pending = [], None, []
                continue
            if start is None:
                start = i - len(pending)
                loc_before = loc_at_pending
            units.append(_Unit(i, line, effects, [p for p in pending if not isinstance(p, Directive)], [], loc))
            pending = []
        close(units, start, loc_before)
    return out


def _same_loc(a: PtxLine | None, b: PtxLine | None) -> bool:
    if isinstance(a, Directive) and isinstance(b, Directive):
        return a.rest == b.rest
    return a is None and b is None


def _render_region(region: Region, order: Sequence[int]) -> list[PtxLine]:
    return render_units(region.units, order, region.loc_before, _same_loc)


Strategy = Literal["hoist-loads", "sink-stores"]


def _order(region: Region, strategy: str) -> list[int]:
    preds = region.graph()
    rank = hoist_rank(preds, region.effects) if strategy == "hoist-loads" else sink_rank(region.effects)
    order = list_schedule(preds, rank)
    bad = order_violations(preds, order)
    if bad:  # the scheduler's own contract; never expected
        raise AssertionError(f"reordering broke dependencies {bad[:3]}")
    return order


@functools.lru_cache(maxsize=32)
def reorder_ptx(text: str, strategy: str, first_line: int = 1, last_line: int = 1 << 30) -> Reordering:
    """Reorder the regions of `text` by `strategy`, each clipped to lines `first_line`..`last_line` (1-based)."""
    module = parse_ptx(text)
    # each block clipped to its run of instructions whose every line (the comments and .loc before each too)
    # lies in the window: the rendering rewrites them all, and nothing else
    found = [c for r in regions(module) if (c := clip_region(r, first_line - 1, last_line - 1)) is not None]
    moved = changed = 0
    new_lines = list(module.lines)
    for region in sorted(found, key=lambda r: -r.start):
        if any(u.loc is None for u in region.units) and any(u.loc is not None for u in region.units):
            continue  # instructions before the first .loc mixed with later ones: their line info cannot move
        order = _order(region, strategy)
        if order == list(range(len(order))):
            continue
        new_lines[region.start:region.end + 1] = _render_region(region, order)
        moved += sum(1 for k, node in enumerate(order) if k != node)
        changed += 1
    module.lines = new_lines
    return Reordering(str(module), moved, changed, len(found))


def hot_lines(text: str) -> tuple[int, int]:
    return hot_window_lines(text, "ptx")


@dataclass(frozen=True)
class PtxReorder(BlockReorder, KernelPass):
    """Reorder instructions inside basic blocks of the hot window, respecting register, predicate and
    memory dependencies and never crossing a label, branch, barrier, fence or an instruction the model
    does not understand (`passes/ptx_sched.py` lists the rules).

    `strategy=hoist-loads` issues global loads as early as their operands allow (latency overlap for
    loop bodies that load, then compute); `sink-stores` delays global stores to the end of their block.
    `scope=hot` edits the hot window only (`backends/hotwindow.py`: the heaviest loop, or the whole
    kernel when it has none); `scope=all` every block; `scope=lines:A-B[@DIGEST]` the blocks lying within
    those PTX lines (a sampled window; refused when the lines are not the window's: `passes/window.py`). Sound: a topological order of the dependency
    graph computes the same values; checked on a GPU by the differential run like any PTX edit.
    """

    name = "ptx-reorder"
    level = "ptx"
    backends = ("cuda",)
    strategy: Strategy = "hoist-loads"
    scope: str = scope_option("hot")

    @classmethod
    def space_values(cls, bundle: KernelBundle) -> dict[str, Sequence[Any]]:
        return {"strategy": ("hoist-loads", "sink-stores"), "scope": ("hot",)}

    def _schedule(self, text: str, first_line: int, last_line: int) -> Reordering:
        return reorder_ptx(text, self.strategy, first_line, last_line)

    def apply(self, ctx: PassContext) -> PassResult:
        result = self._reordered(ctx.text)
        return PassResult(result.text, notes=self._notes(result))
