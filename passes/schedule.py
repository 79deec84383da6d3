"""Dependency graphs of straight-line code and the list scheduler the reordering passes share
(`ptx_sched.py` for PTX, `amdgcn_sched.py` for AMDGCN).

A region is a run of instructions with no label, branch or barrier inside it; each instruction says
what it reads and writes (`Effects`: registers, and memory by state space), and `dependency_graph`
orders every pair that touches the same register (read after write, write after read, write after
write) or the same memory where one of them writes. Any topological order of that graph computes the
same thing as the original order: each instruction sees the same register values and the same memory,
and leaves the same. The target-specific parts — which instructions are understood at all (the others
end a region), what counts as a memory space, extra ordering such as AMD's in-order memory counters —
are the callers'; `extra_edges` carries those.

`list_schedule` picks, at each step, the ready instruction of the smallest rank (the strategies:
`hoist_rank` issues the loads and what feeds them first, `sink_rank` keeps stores back until nothing
else is ready); ties keep the original order, so an order with nothing to gain is the original one.
`order_violations` is the check the tests and the passes run on every result: each edge of the graph
must point forward in the new order.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from .base import PassError, ScopeWindow
from .window import scope_lines, scope_words

T = TypeVar("T")

#: Memory spaces that every other space may alias (PTX generic addresses, AMD flat).
ANY_SPACE = "generic"


@dataclass(frozen=True)
class Effects:
    """What one instruction reads and writes. Registers are names (`%r1`, `v7`); memory is by space."""

    defs: frozenset[str] = frozenset()
    uses: frozenset[str] = frozenset()
    reads: frozenset[str] = frozenset()
    writes: frozenset[str] = frozenset()
    #: A load the hoisting strategy issues early (global memory loads).
    hoistable_load: bool = False
    #: A store the sinking strategy keeps back.
    sinkable_store: bool = False


def _spaces_overlap(a: str, b: str, read_only: frozenset[str]) -> bool:
    if a in read_only or b in read_only:
        return False  # nothing writes a read-only space (PTX .param, .const)
    return a == b or ANY_SPACE in (a, b)


def _memory_conflict(x: Effects, y: Effects, read_only: frozenset[str]) -> bool:
    return any(_spaces_overlap(a, b, read_only) for a in x.writes for b in (y.reads | y.writes)) or \
        any(_spaces_overlap(a, b, read_only) for a in x.reads for b in y.writes)


def dependency_graph(effects: Sequence[Effects], *, read_only: Iterable[str] = (),
                     extra_edges: Iterable[tuple[int, int]] = ()) -> list[set[int]]:
    """`preds[i]`: the instructions that must stay before instruction `i` (indices into `effects`)."""
    ro = frozenset(read_only)
    n = len(effects)
    preds: list[set[int]] = [set() for _ in range(n)]
    last_def: dict[str, int] = {}
    readers: dict[str, list[int]] = {}
    for i, e in enumerate(effects):
        for r in e.uses:
            if r in last_def:
                preds[i].add(last_def[r])  # read after write
        for r in e.defs:
            if r in last_def:
                preds[i].add(last_def[r])  # write after write
            preds[i].update(j for j in readers.get(r, ()) if j != i)  # write after read
        for r in e.uses:
            readers.setdefault(r, []).append(i)
        for r in e.defs:
            last_def[r] = i
            readers[r] = [i] if r in e.uses else []
    memory = [i for i, e in enumerate(effects) if e.reads or e.writes]
    for k, i in enumerate(memory):
        for j in memory[:k]:
            if _memory_conflict(effects[j], effects[i], ro):
                preds[i].add(j)
    for a, b in extra_edges:
        if a < b:
            preds[b].add(a)
        elif b < a:
            preds[a].add(b)
    return preds


def order_violations(preds: Sequence[set[int]], order: Sequence[int]) -> list[tuple[int, int]]:
    """The edges (before, after) that `order` (a permutation of the instructions) puts backwards."""
    if sorted(order) != list(range(len(preds))):
        raise ValueError("not a permutation of the region's instructions")
    position = {node: k for k, node in enumerate(order)}
    return [(p, i) for i in range(len(preds)) for p in preds[i] if position[p] > position[i]]


class Stuck(Exception):
    """No ready instruction may be placed at the next slot (`list_schedule`'s `eligible` held them all)."""


def list_schedule(preds: Sequence[set[int]], rank: Callable[[int], tuple[int, ...]],
                  eligible: Callable[[int, int, dict[int, int]], bool] | None = None) -> list[int]:
    """A topological order of the graph: at each step the ready instruction of the smallest
    `(rank(i), i)`. `eligible(i, slot, placed)`, when given, may refuse an instruction at a slot
    (`placed`: instruction -> slot so far); when it refuses every ready one, `Stuck` is raised."""
    n = len(preds)
    succs: list[list[int]] = [[] for _ in range(n)]
    waiting = [len(p) for p in preds]
    for i, ps in enumerate(preds):
        for p in ps:
            succs[p].append(i)
    heap = [(rank(i), i) for i in range(n) if waiting[i] == 0]
    heapq.heapify(heap)
    order: list[int] = []
    placed: dict[int, int] = {}
    while heap:
        if eligible is None:
            _, i = heapq.heappop(heap)
        else:
            ok = sorted(heap)
            pick = next((item for item in ok if eligible(item[1], len(order), placed)), None)
            if pick is None:
                raise Stuck(f"no ready instruction may take slot {len(order)}")
            heap.remove(pick)
            heapq.heapify(heap)
            i = pick[1]
        placed[i] = len(order)
        order.append(i)
        for s in succs[i]:
            waiting[s] -= 1
            if waiting[s] == 0:
                heapq.heappush(heap, (rank(s), s))
    if len(order) != n:
        raise ValueError("the dependency graph has a cycle")
    return order


def ancestors_of(preds: Sequence[set[int]], seeds: Iterable[int]) -> set[int]:
    """The seeds and every instruction they depend on, transitively."""
    out: set[int] = set()
    stack = list(seeds)
    while stack:
        i = stack.pop()
        if i in out:
            continue
        out.add(i)
        stack.extend(preds[i])
    return out


def hoist_rank(preds: Sequence[set[int]], effects: Sequence[Effects]) -> Callable[[int], tuple[int, ...]]:
    """Loads (and the address arithmetic and predicates they wait for) before everything else."""
    feeding = ancestors_of(preds, [i for i, e in enumerate(effects) if e.hoistable_load])
    return lambda i: (0 if i in feeding else 1,)


def sink_rank(effects: Sequence[Effects]) -> Callable[[int], tuple[int, ...]]:
    """Stores last: one is taken only when nothing else is ready."""
    return lambda i: (1 if effects[i].sinkable_store else 0,)


# ---------------------------------------------------------------------------------------------------
# Regions as lines of text: what travels with an instruction, and the region printed in a new order
# ---------------------------------------------------------------------------------------------------
@dataclass
class Unit(Generic[T]):
    """One instruction of a region with the lines that travel with it (`T`: the level's line type)."""

    index: int  # the instruction's line index in its file
    line: T
    effects: Effects
    #: Comments and blank lines before it (its line-info directives are not kept: see `loc`).
    before: list[T] = field(default_factory=list)
    #: Lines that close it (`// end inline asm`).
    after: list[T] = field(default_factory=list)
    #: The line-info directive (`.loc`) in effect at it.
    loc: T | None = None


def render_units(units: Sequence[Unit[T]], order: Sequence[int], loc_before: T | None,
                 same_loc: Callable[[T | None, T | None], bool]) -> list[T]:
    """The region's lines in `order`: each instruction with its comments, and a `.loc` wherever the
    line changes from the one in effect; the line in effect after the region is the original's."""
    lines: list[T] = []
    emitted = loc_before
    for k in order:
        u = units[k]
        if u.loc is not None and not same_loc(u.loc, emitted):
            lines.append(u.loc)
            emitted = u.loc
        lines.extend(u.before)
        lines.append(u.line)
        lines.extend(u.after)
    final = units[-1].loc
    if final is not None and not same_loc(final, emitted):
        lines.append(final)
    return lines


class Spanned(Protocol):
    """A region as the reordering passes keep it: a dataclass of its first and last line (indices, inclusive),
    its units, and the `.loc` in effect before it."""

    __dataclass_fields__: ClassVar[dict[str, Any]]
    start: int
    end: int
    units: list[Unit[Any]]
    loc_before: Any


R = TypeVar("R", bound=Spanned)


def clip_region(region: R, first: int, last: int) -> R | None:
    """The part of `region` whose lines all lie in lines `first`..`last` (0-based, inclusive), or None when
    fewer than two instructions do. A unit's lines are the comments and line info before it, itself and its
    closing lines; a contiguous run of a region's units is itself a region (straight-line code, nothing
    between), and the `.loc` in effect before it is the one of the unit before it."""
    units = region.units
    kept: list[int] = []
    span_start = region.start
    for k, u in enumerate(units):
        span_end = u.index + len(u.after)
        if first <= span_start and span_end <= last:
            kept.append(k)
        span_start = span_end + 1
    if len(kept) < 2:
        return None
    k, m = kept[0], kept[-1]
    if (k, m) == (0, len(units) - 1):
        return region
    start = region.start if k == 0 else units[k - 1].index + len(units[k - 1].after) + 1
    loc_before = region.loc_before if k == 0 else units[k - 1].loc
    return dataclasses.replace(region, start=start, end=units[m].index + len(units[m].after), units=units[k:m + 1],
                               loc_before=loc_before)


@dataclass(frozen=True)
class Reordering:
    """The result of reordering a module: the new text, how many instructions moved in how many regions,
    and (AMDGCN) how many regions a strategy would change but had to keep for their wait-state distances."""

    text: str
    moved: int
    regions_changed: int
    regions_seen: int
    held: int = 0


def hot_window_lines(text: str, level: str) -> tuple[int, int]:
    """The 1-based line range of the static hot window of a `ptx` or `amdgcn` text (`backends/hotwindow.py`)."""
    lines = scope_lines("hot", text, level)
    assert not isinstance(lines, str)  # the static window is always inside its own text
    return lines


class BlockReorder:
    """What the basic-block reordering passes share (`ptx-reorder`, `amdgcn-reorder`): the scope (the hot
    window, every block, or explicit lines: `passes/window.py`), the skip reason when nothing moves, and
    the notes. A subclass is a frozen `KernelPass` dataclass with `strategy` and `scope` options and gives
    `_schedule`, which reorders only the blocks whose every line lies within the lines it is given."""

    level: ClassVar[str]
    strategy: str
    scope: str

    def _schedule(self, text: str, first_line: int, last_line: int) -> Reordering:
        raise NotImplementedError

    def _reorder(self, text: str) -> Reordering | str:
        """The reordering of `text` within the scope, or why the scope names no lines of it."""
        lines = scope_lines(self.scope, text, self.level)
        return lines if isinstance(lines, str) else self._schedule(text, *lines)

    def _reordered(self, text: str) -> Reordering:
        result = self._reorder(text)
        if isinstance(result, str):  # apply without its precondition: refuse, never edit other lines
            raise PassError(f"{self.strategy}: {result}")
        return result

    @classmethod
    def windowed_values(cls, values: dict[str, Sequence[Any]], window: ScopeWindow) -> dict[str, Sequence[Any]]:
        """A profiled window replaces the static one: both name where the time goes, the profile by
        measurement, so reordering the static guess too would spend trials on blocks the profile says are
        cold (or, when the two agree, build the same candidate twice)."""
        return {**values, "scope": tuple(window.spelling() if s == "hot" else s for s in values["scope"])}

    def precondition(self, ctx: Any) -> str | None:
        result = self._reorder(ctx.text)
        if isinstance(result, str):
            return result
        if result.moved:
            return None
        why = (f"; {result.held} held back to keep wait-state distances" if result.held
               else "; every instruction already as early/late as its dependencies allow")
        return (f"{self.strategy}: nothing to move in {scope_words(self.scope)} ({result.regions_seen} reorderable "
                f"block(s){why})")

    def _notes(self, result: Reordering) -> list[str]:
        return [f"{self.strategy}: {result.moved} instructions moved in {result.regions_changed} of "
                f"{result.regions_seen} blocks of {scope_words(self.scope)}"
                + (f"; {result.held} held back (wait states)" if result.held else "")]
