"""The spaces the compiled-kernel search draws its edits from, each enumerated from the passes'
`schedule_space(bundle)` (nothing here hard-codes an option value):

- `options`: passes that re-lower with other launch/compile options (`num-warps`, `num-stages`) and the
  PTX assembler's (`max-registers` = maxnreg, `ptxas-options`);
- `ttir`, `ttgir`: IR rewrites; `llir`: LLVM IR (`noalias-args`, `flush-denormals`, …);
- `ptx`: PTX hot-window edits (`cache-hints`, `ld-nc`, `ptx-reorder` — instruction order inside the hot
  window's blocks —, `redundant-cvt`, `ptx-predicate` — if-conversion of short branches); `amdgcn`: AMDGCN
  hot-window edits (`nontemporal-hints`, `mfma-priority`, `amdgcn-reorder`, ranked like the others by the
  llvm-mca surrogate and checked for `s_waitcnt` hazards).

**Windows.** The passes with a window option (`passes/window.py`: the reorders and `ptx-predicate`) are
confined to the kernel's hot window. Given a **sampled** window (Nsight Compute on a GPU: `run.py`), their
schedule spaces offer it as `scope=lines:A-B@DIGEST` (the reorders in place of the static `hot`, the
predication beside `all`: `windowed_values`), anchored to the text that was sampled; without one the
reorders keep `scope=hot`, the static loop-weighted window. Every atom says which window it edits and where
that came from (`WindowUse`), and so does every trial of the search.

An **atom** is one pass instance; a candidate is a sequence of atoms (at most one per pass) spelled as
one pipeline (`ttgir(num-warps{n=8}),ptx(cache-hints{…})`), built by the engine with the lower levels
rebuilt. Atoms that are unsound without a promise are kept only with evidence: `noalias-args` and `ld-nc`
(read-only loads) need the launch records to show that no written buffer overlaps another argument
(`alias_evidence`); passes that declare a tolerance (reduction order under `num-warps`, fast-math) are
dropped under `exact=True`, and otherwise checked under the tolerance they declare.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kstrata.passes.window import LineWindow

#: The order pipeline stages must come in.
_LEVEL_ORDER = ("ttir", "ttgir", "llir", "ptx", "amdgcn")
#: Passes that are sound only when no output buffer overlaps another argument: the no-alias and read-only-load
#: edits, and the program-order permutations (a program could read what another writes through an overlap, and
#: the replays of the differential run give each argument its own buffer, so they would not show it).
NEEDS_NOALIAS = ("noalias-args", "ld-nc", "grouped-pid", "interleaved-pid")
#: Option passes, whatever level they run at.
_OPTION_PASSES = ("num-warps", "num-stages", "max-registers", "ptxas-options")


@dataclass(frozen=True)
class SampledWindow:
    """A hot window measured on a GPU: lines of the kernel's `level` text, anchored to the text sampled,
    and how it was chosen (`HotWindow.source`: "ncu sampling: 96% of the warp-stall samples")."""

    level: str
    lines: LineWindow
    source: str


@dataclass(frozen=True)
class WindowUse:
    """The lines of its level's text an atom edits, and where they came from: `sampled` (a profile) or
    `static` (`scope=hot`: the static window of the kernel's text as loaded; a rebuild above the level may
    move it, and the pass takes the static window of the text it is given)."""

    level: str
    scope: str
    first_line: int
    last_line: int
    origin: str  # "sampled" or "static"
    source: str

    def to_json(self) -> dict[str, Any]:
        return {"level": self.level, "scope": self.scope, "lines": f"{self.first_line}-{self.last_line}",
                "origin": self.origin, "source": self.source}

    def words(self) -> str:
        return f"{self.level} {self.first_line}-{self.last_line} ({self.origin})"


@dataclass(frozen=True)
class Atom:
    """One pass instance worth trying on one kernel."""

    space: str
    level: str
    pass_name: str
    spelling: str
    tolerance: str | None = None
    #: The window the edit is confined to (None: kernel-wide).
    window: WindowUse | None = None


@dataclass(frozen=True)
class Space:
    name: str
    atoms: tuple[Atom, ...]
    #: Why passes of this space offer nothing (pass name -> reason).
    skipped: tuple[tuple[str, str], ...] = ()

    def to_json(self) -> dict[str, Any]:
        windows = {a.window.words(): a.window.to_json() for a in self.atoms if a.window is not None}
        return {"space": self.name, "atoms": [a.spelling for a in self.atoms],
                "skipped": {name: why for name, why in self.skipped}, "windows": list(windows.values())}


def space_of(pass_name: str, level: str) -> str:
    return "options" if pass_name in _OPTION_PASSES else level


def alias_evidence(records: Sequence[str]) -> str | None:
    """None when every record proves that no written tensor's storage overlaps another tensor argument's
    (addresses from `kstrata record`'s `extra.storage`), else why it is not proven."""
    from kstrata.ir.launch import LaunchRecord, TensorArg

    if not records:
        return "no launch record: nothing shows that the buffers never overlap"
    for path in records:
        record = LaunchRecord.load(path)
        storage = record.extra.get("storage")
        tensors = [a for a in record.args if isinstance(a, TensorArg)]
        if not isinstance(storage, dict) or any(a.name not in storage for a in tensors):
            return (f"{Path(path).name} holds no buffer addresses (recorded by an older kstrata record, or "
                    "made by hand): overlap cannot be ruled out")
        ranges = {a.name: (int(storage[a.name][0]), int(storage[a.name][0]) + int(storage[a.name][1]))
                  for a in tensors}
        for a in tensors:
            if not a.written:
                continue
            lo, hi = ranges[a.name]
            for b in tensors:
                if b.name == a.name:
                    continue
                lo2, hi2 = ranges[b.name]
                if lo < hi2 and lo2 < hi:
                    return f"{Path(path).name}: the written buffer {a.name} overlaps {b.name}"
    return None


def _window_use(instance: Any, level: str, bundle: Any, sampled: SampledWindow | None) -> WindowUse | None:
    """The window `instance` (a pass) edits, when it has a window option set to one."""
    from kstrata.backends.hotwindow import static_hot_window
    from kstrata.passes.window import LineWindow

    scope = getattr(instance, "scope", None)
    if not isinstance(scope, str) or scope == "all":
        return None
    if scope == "hot":
        w = static_hot_window(bundle.text(level), level)
        return WindowUse(level, scope, w.first_line, w.last_line, "static", w.source)
    lines = LineWindow.parse(scope)
    if lines is None:
        return None
    from_profile = sampled is not None and sampled.level == level and sampled.lines == lines
    return WindowUse(level, scope, lines.first, lines.last, "sampled" if from_profile else "given",
                     sampled.source if from_profile and sampled is not None else "lines named in the pipeline")


def kernel_spaces(bundle: Any, records: Sequence[str], *, exact: bool = False,
                  only: Sequence[str] | None = None, window: SampledWindow | None = None) -> list[Space]:
    """Every space's atoms on `bundle` (a `KernelBundle`), in the order the search drafts them; `window`: the
    kernel's hot window sampled on a GPU, which the passes with a window option are offered (module docstring)."""
    from kstrata.passes.registry import available_passes, get_pass

    noalias_why = alias_evidence(records)
    by_space: dict[str, list[Atom]] = {}
    skipped: dict[str, list[tuple[str, str]]] = {}
    for name in sorted(available_passes()):
        cls = get_pass(name)
        space = space_of(name, cls.level)
        if only and space not in only:
            continue
        by_space.setdefault(space, [])
        sched = cls.schedule_space(bundle, window.lines if window is not None and window.level == cls.level else None)
        if not sched:
            skipped.setdefault(space, []).append((name, sched.reason or "nothing to try"))
            continue
        if name in NEEDS_NOALIAS and noalias_why is not None:
            skipped.setdefault(space, []).append((name, f"needs buffers that never overlap: {noalias_why}"))
            continue
        for instance in sched:
            tol = instance.declared_tolerance()
            if tol is not None and exact:
                skipped.setdefault(space, []).append((instance.spelling(), f"declares {tol.spelling()} "
                                                      "(not bit-exact) and --exact was given"))
                continue
            by_space[space].append(Atom(space, cls.level, name, instance.spelling(), tol.spelling() if tol else None,
                                        _window_use(instance, cls.level, bundle, window)))
    # the hot-window assembly edits of the target right after the options, then the IR levels top down
    asm = "amdgcn" if bundle.target.backend == "hip" else "ptx"
    order = ("options", asm, "ttgir", "ttir", "llir")
    return [Space(s, _interleave(by_space.get(s, [])), tuple(skipped.get(s, ()))) for s in order if s in by_space]


def _interleave(atoms: Sequence[Atom]) -> tuple[Atom, ...]:
    """The atoms round-robin over their passes (num-stages 2, num-warps 2, num-stages 4, …), so that a small
    budget tries every pass of a space before a second value of any."""
    by_pass: dict[str, list[Atom]] = {}
    for a in atoms:
        by_pass.setdefault(a.pass_name, []).append(a)
    out: list[Atom] = []
    while any(by_pass.values()):
        for q in by_pass.values():
            if q:
                out.append(q.pop(0))
    return tuple(out)


def kernel_kind(name: str) -> str:
    """"pointwise", "reduction" or "other", from the prefix Inductor gives a kernel's name (`triton_poi_`,
    `triton_per_` for persistent reductions, `triton_red_` for looped ones)."""
    if name.startswith("triton_poi_"):
        return "pointwise"
    if name.startswith(("triton_per_", "triton_red_")):
        return "reduction"
    return "other"


#: The single edits a search tries first on each kind of kernel, in this order (an atom's spelling, or a pass
#: name for any of its instances); the other atoms follow in their round-robin order. From the H200: on
#: Inductor's pointwise kernels fewer warps won (`num-warps{n=2}` 1.07-1.23x, 2026-12-03) and the cache-policy
#: edits are what is left to a memory-bound kernel (`cache-hints` 1.02x on the MLP's silu); on its LayerNorm
#: reductions `num-warps{n=8}` won 1.23-1.33x, while `max-registers`, which the round-robin drafted first, lost
#: (0.63x). A searched config already at a warp count has no instance of it (the precondition drops it).
#: `interleaved-pid` comes first where it is offered at all (a load that repeats with the program id: on the
#: gap LayerNorm's affine kernel, at 57% of its bandwidth bound, it won 1.627x, H100 2026-12-07); it is not
#: offered elsewhere.
FIRST_EDITS: dict[str, tuple[str, ...]] = {
    "pointwise": ("interleaved-pid{slices=16}", "num-warps{n=2}", "ld-nc", "cache-hints", "num-warps{n=8}",
                  "load-eviction", "num-warps{n=4}"),
    "reduction": ("num-warps{n=8}", "num-warps{n=16}", "ld-nc", "num-warps{n=4}", "cache-hints"),
}


def kind_first(kind: str, atoms: Sequence[Atom]) -> list[Atom]:
    """`atoms` with, first, one per entry of `FIRST_EDITS[kind]` in its order (the first atom that matches it and
    is not taken), then the rest in their order."""
    first: list[Atom] = []
    for want in FIRST_EDITS.get(kind, ()):
        hit = next((a for a in atoms if a not in first
                    and ((a.spelling == want) if "{" in want else (a.pass_name == want))), None)
        if hit is not None:
            first.append(hit)
    return [*first, *(a for a in atoms if a not in first)]


def pipeline_of(atoms: Sequence[Atom]) -> str:
    """The pipeline spelling of a sequence of atoms: stages in level order, passes in the given order except
    that atoms confined to explicit lines (a sampled window) come first in their stage: the lines are of the
    text as sampled, before any edit at that level (a pass before them would move or rewrite those lines,
    and the anchored window would refuse)."""
    stages: dict[str, list[str]] = {}
    explicit = [a for a in atoms if a.window is not None and a.window.origin != "static"]
    for a in [*explicit, *(a for a in atoms if a not in explicit)]:
        stages.setdefault(a.level, []).append(a.spelling)
    return ",".join(f"{lv}({','.join(stages[lv])})" for lv in _LEVEL_ORDER if lv in stages)


def first_level(atoms: Sequence[Atom]) -> str:
    return next(lv for lv in _LEVEL_ORDER if any(a.level == lv for a in atoms))
