"""The spaces the compiled-kernel search draws its edits from, each enumerated from the passes'
`schedule_space(bundle)` (nothing here hard-codes an option value):

- `options`: passes that re-lower with other launch/compile options (`num-warps`, `num-stages`) and the
  PTX assembler's (`max-registers` = maxnreg, `ptxas-options`);
- `ttir`, `ttgir`: IR rewrites; `llir`: LLVM IR (`noalias-args`, `flush-denormals`, …);
- `ptx`: PTX hot-window edits (`cache-hints`, `ld-nc`, `ptx-reorder` — instruction order inside the hot
  window's blocks —, `redundant-cvt`, `ptx-predicate` — if-conversion of short branches); `amdgcn`: AMDGCN hot-window edits (`nontemporal-hints`,
  `mfma-priority`, `amdgcn-reorder`, ranked like the others by the llvm-mca surrogate and checked for
  `s_waitcnt` hazards).

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
from typing import Any

#: The order pipeline stages must come in.
_LEVEL_ORDER = ("ttir", "ttgir", "llir", "ptx", "amdgcn")
#: Passes that are sound only when no output buffer overlaps another argument.
NEEDS_NOALIAS = ("noalias-args", "ld-nc")
#: Option passes, whatever level they run at.
_OPTION_PASSES = ("num-warps", "num-stages", "max-registers", "ptxas-options")


@dataclass(frozen=True)
class Atom:
    """One pass instance worth trying on one kernel."""

    space: str
    level: str
    pass_name: str
    spelling: str
    tolerance: str | None = None


@dataclass(frozen=True)
class Space:
    name: str
    atoms: tuple[Atom, ...]
    #: Why passes of this space offer nothing (pass name -> reason).
    skipped: tuple[tuple[str, str], ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"space": self.name, "atoms": [a.spelling for a in self.atoms],
                "skipped": {name: why for name, why in self.skipped}}


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


def kernel_spaces(bundle: Any, records: Sequence[str], *, exact: bool = False,
                  only: Sequence[str] | None = None) -> list[Space]:
    """Every space's atoms on `bundle` (a `KernelBundle`), in the order the search drafts them."""
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
        sched = cls.schedule_space(bundle)
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
            by_space[space].append(Atom(space, cls.level, name, instance.spelling(), tol.spelling() if tol else None))
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


def pipeline_of(atoms: Sequence[Atom]) -> str:
    """The pipeline spelling of a sequence of atoms: stages in level order, passes in the given order."""
    stages: dict[str, list[str]] = {}
    for a in atoms:
        stages.setdefault(a.level, []).append(a.spelling)
    return ",".join(f"{lv}({','.join(stages[lv])})" for lv in _LEVEL_ORDER if lv in stages)


def first_level(atoms: Sequence[Atom]) -> str:
    return next(lv for lv in _LEVEL_ORDER if any(a.level == lv for a in atoms))
