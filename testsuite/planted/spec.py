"""What a planted case is: a suite kernel, a target, one level, and a reviewable change of that level.

A `PlantedCase` is either a wrong candidate (a bug planted on purpose: `correct=False`) that
`kstrata verify` must reject, or a correct rewrite (`correct=True`) it must accept. The change is
either a list of anchored `TextEdit`s of the level's text, each of which must match exactly the
number of times it declares (so that a change in Triton's output fails loudly instead of planting
nothing), or a pass pipeline of the project's own passes. `visible_on` says which checker is expected
to decide a wrong case: `static` (the static checks, anywhere), `cpu` (the CPU interpreter),
`gpu` (the differential run on an NVIDIA GPU) or `amd-gpu` (a differential run on an AMD GPU,
which no machine of the project has: such cases are declared, built and statically checked only).
A `gpu` or `amd-gpu` case is one the cheaper checkers accept: that is what makes the list of bugs
only a GPU catches true. For a correct rewrite, `visible_on` is the most thorough checker that can
run on it, the one whose acceptance counts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kstrata.ir.errors import KstrataError

LEVELS = ("ttir", "ttgir", "llir", "ptx", "amdgcn")
VISIBLE_ON = ("static", "cpu", "gpu", "amd-gpu")


class PlantedEditError(KstrataError):
    """An edit's anchor is not found as often as the case declares (Triton's output changed?)."""


@dataclass(frozen=True)
class TextEdit:
    """Replace `pattern` (literal text, or a regular expression with `regex=True`) by `replacement`;
    the pattern must occur exactly `count` times."""

    pattern: str
    replacement: str
    count: int = 1
    regex: bool = False

    def apply(self, text: str, where: str) -> str:
        found = len(re.findall(self.pattern, text, re.MULTILINE)) if self.regex else text.count(self.pattern)
        if found != self.count:
            raise PlantedEditError(f"{where}: the anchor {self.pattern!r} occurs {found} time(s), expected "
                                   f"{self.count}", hint="re-anchor the edit on the kernel's current text")
        if self.regex:
            return re.sub(self.pattern, self.replacement, text, flags=re.MULTILINE)
        return text.replace(self.pattern, self.replacement)


@dataclass(frozen=True)
class PlantedCase:
    """One planted-bug or correct-rewrite case (see the module docstring)."""

    name: str
    kernel: str  # a suite kernel name
    target: str  # "cuda:90" or "hip:gfx942"
    level: str
    correct: bool
    visible_on: str
    description: str
    edits: tuple[TextEdit, ...] = ()
    #: A pipeline of the project's passes (`ptx(cache-hints)`) instead of edits.
    pipeline: str | None = None
    #: The kind of bug or rewrite, for the report (`off-by-one mask`, `dropped barrier`, `pass`, …).
    kind: str = ""
    #: A compute-sanitizer tool the GPU run adds (`racecheck` for a dropped barrier: a race need not
    #: change the outputs of a given run, the sanitizer sees it on every run).
    gpu_sanitizer: str | None = None
    #: The candidate keeps the original's lower levels (a stale cubin under an edited PTX, as an entry
    #: edited by hand has): verify must rebuild them from the edited level before it checks anything.
    stale: bool = False
    #: Replay a row-wise kernel's launch with this many rows instead of its suite launch's (a launch past
    #: 2^31 elements, which only the GPU run can afford).
    large_rows: int | None = None

    def __post_init__(self) -> None:
        if self.level not in LEVELS:
            raise ValueError(f"planted case {self.name}: unknown level {self.level!r}")
        if self.visible_on not in VISIBLE_ON:
            raise ValueError(f"planted case {self.name}: visible_on must be one of {VISIBLE_ON}")
        if bool(self.edits) == bool(self.pipeline):
            raise ValueError(f"planted case {self.name}: give either edits or a pipeline")
        if (self.level == "ptx" and not self.target.startswith("cuda")) or \
                (self.level == "amdgcn" and not self.target.startswith("hip")):
            raise ValueError(f"planted case {self.name}: level {self.level} does not exist for {self.target}")

    @property
    def expected(self) -> str:
        return "accept" if self.correct else "reject"

    def apply_edits(self, text: str) -> str:
        """The level's text with every edit applied (in order)."""
        for i, edit in enumerate(self.edits):
            text = edit.apply(text, f"planted case {self.name} ({self.kernel}, {self.target} {self.level}) edit {i}")
        return text
