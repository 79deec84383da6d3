"""Hot windows: the part of a kernel's PTX or AMDGCN where its time goes, for assembly edits and for the
static surrogate (`backends/mca.py`).

Two sources:

- **static, loop-weighted** (any machine): loops are found from back edges (a branch to a label earlier
  in the text; in LLVM's output only those to the headers LLVM marks `Loop Header`), a loop spanning its
  header label to its last back edge. Every instruction counts `ASSUMED_TRIP ** depth`, `depth` being how
  many loops hold it — an estimate of how often it runs per entry of the outermost loop, since the trip
  counts of Triton's loops are runtime values the text does not hold —, and a loop's weight is the sum
  over the instructions of its span (out-of-line blocks placed inside the span included). The window is
  the loop of the highest weight: "the loop with the most instructions weighted by trip count". Because a
  loop's span holds its inner loops, whose instructions count in it too, an outer loop always outweighs
  the loops inside it: the window is always a whole top-level loop nest, never an inner loop alone (a
  nest of 4 instructions, 2 of them in an inner loop, weighs 2 * 8 + 2 * 64 = 144 and beats a flat loop
  of 10, 80). Without a loop it is the whole kernel
  body. This is what the issue asks for on AMD until a profile is available, and what kstrata uses on
  NVIDIA without a GPU; every window says which source it came from. (The llvm-mca surrogate models the
  window's instructions once each, as straight-line code: it does not weight an inner loop's more.)
- **Nsight Compute sampling** (NVIDIA GPU): `ncu --section SourceCounters --print-source ptx --page
  source --csv` gives warp-stall samples per PTX line (Triton's PTX carries `.loc` line info);
  `window_from_samples` takes the loop (or, without loops, the contiguous run of lines) holding the most
  samples. Written without a GPU: `profile_ptx_samples` runs ncu, `parse_ncu_source_csv` reads its CSV
  (tested on CSV in ncu's documented column shape, not yet on a real ncu run).
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .tools import run_tool

#: The trip count assumed per loop level by the static window (the text does not hold Triton's runtime
#: trip counts); stated in every static window's `source`.
ASSUMED_TRIP = 8

_AMD_LABEL = re.compile(r"^([.\w$]+):")
_AMD_BRANCH = re.compile(r"^\s*(s_cbranch_\w+|s_branch)\s+([.\w$]+)")
_PTX_LABEL = re.compile(r"^\s*(\$?[\w$]+):")
_PTX_BRANCH = re.compile(r"^\s*(?:@!?%\w+\s+)?bra(?:\.uni)?\s+(\$?[\w$]+)\s*;")


@dataclass(frozen=True)
class Loop:
    """A loop of the text: lines `start`..`end` (0-based, inclusive: the header label to the back edge)."""

    header: str
    start: int
    end: int
    depth: int = 1
    instructions: int = 0
    weight: float = 0.0


@dataclass(frozen=True)
class HotWindow:
    level: str  # "ptx" or "amdgcn"
    #: 1-based, inclusive line numbers of the window in the level's text.
    first_line: int
    last_line: int
    instructions: tuple[str, ...]
    weight: float
    #: How the window was chosen, in words ("static: loop-weighted, trip count 8 assumed per loop level").
    source: str
    header: str | None = None
    loops: tuple[Loop, ...] = field(default=(), compare=False)

    def to_json(self) -> dict[str, object]:
        return {"level": self.level, "first_line": self.first_line, "last_line": self.last_line,
                "instructions": len(self.instructions), "weight": self.weight, "source": self.source,
                "header": self.header, "loops": len(self.loops)}


def _is_instruction(line: str, level: str) -> bool:
    s = line.strip()
    if not s or s.startswith(("//", ";", "#", "}", "{", "@@")):
        return False
    if level == "amdgcn":
        return not s.startswith(".") and not _AMD_LABEL.match(s) and s[0].isalpha()
    if s.startswith(".") or _PTX_LABEL.match(s):
        return False
    return s.endswith(";") or s.endswith("{")


def _strip_comment(line: str, level: str) -> str:
    return line.split(";" if level == "amdgcn" else "//", 1)[0].rstrip() if level == "amdgcn" else \
        line.split("//", 1)[0].rstrip()


def _marked_header(lines: Sequence[str], i: int, level: str) -> bool:
    """LLVM's loop-header mark on the label's line or the comment-only lines right after it (a nested
    loop's label says `Parent Loop BB0_1 Depth=1`, and the next line `=>  This Inner Loop Header`)."""
    comment = ";" if level == "amdgcn" else "//"
    if "Loop Header" in lines[i]:
        return True
    j = i + 1
    while j < len(lines) and lines[j].strip().startswith(comment):
        if "Loop Header" in lines[j]:
            return True
        j += 1
    return False


def find_loops(text: str, level: str) -> list[Loop]:
    """Loops from back edges, with nesting depth, instruction counts and static weights."""
    lines = text.splitlines()
    labels: dict[str, int] = {}
    edges: list[tuple[str, int, int]] = []
    label_re, branch_re = (_AMD_LABEL, _AMD_BRANCH) if level == "amdgcn" else (_PTX_LABEL, _PTX_BRANCH)
    for i, line in enumerate(lines):
        m = label_re.match(line)
        if m:
            labels[m.group(1)] = i
    for i, line in enumerate(lines):
        m = branch_re.match(_strip_comment(line, level))
        if m:
            target = m.group(m.lastindex or 1)
            start = labels.get(target)
            if start is not None and start <= i:
                edges.append((target, start, i))
    # LLVM marks its loop headers (`; =>This Inner Loop Header: Depth=1`, `// =>This Loop Header: ...`);
    # when it did, only back edges to marked headers are loops (out-of-line blocks of an if also branch
    # back, to their merge point); hand-written text without the marks falls back to every back edge
    marked = {name for name, i in labels.items() if _marked_header(lines, i, level)}
    if marked or any(tag in text for tag in ("Lfunc_begin", "%bb.")):  # LLVM's output: it marks every loop
        edges = [e for e in edges if e[0] in marked]
    # one loop per header: the latest back edge closes it
    spans: dict[str, tuple[int, int]] = {}
    for header, start, end in edges:
        s, e = spans.get(header, (start, end))
        spans[header] = (min(s, start), max(e, end))
    is_ins = [_is_instruction(_strip_comment(ln, level), level) for ln in lines]
    depth_of = [0] * len(lines)
    for s, e in spans.values():
        for i in range(s, e + 1):
            depth_of[i] += 1
    loops = []
    for header, (s, e) in sorted(spans.items(), key=lambda kv: kv[1]):
        depth = sum(1 for s2, e2 in spans.values() if s2 <= s and e <= e2)
        count = sum(1 for i in range(s, e + 1) if is_ins[i])
        weight = float(sum(ASSUMED_TRIP ** depth_of[i] for i in range(s, e + 1) if is_ins[i]))
        loops.append(Loop(header, s, e, depth, count, weight))
    return loops


def _instructions(lines: Sequence[str], level: str) -> tuple[str, ...]:
    return tuple(_strip_comment(ln, level).strip() for ln in lines if _is_instruction(_strip_comment(ln, level), level))


def static_hot_window(text: str, level: str) -> HotWindow:
    """The heaviest loop (the module docstring: always a top-level nest; the outermost, then the first, on
    ties), or the whole kernel when it has no loop."""
    if level not in ("ptx", "amdgcn"):
        raise ValueError(f"hot windows are PTX or AMDGCN, not {level}")
    lines = text.splitlines()
    loops = find_loops(text, level)
    if loops:
        best = max(loops, key=lambda lp: (lp.weight, -lp.depth, -lp.start))
        return HotWindow(level, best.start + 1, best.end + 1, _instructions(lines[best.start:best.end + 1], level),
                         best.weight, f"static: the loop of the most instructions weighted by trip count "
                         f"({ASSUMED_TRIP} assumed per loop level; no profile)", best.header, tuple(loops))
    end = next((i for i, ln in enumerate(lines) if ln.startswith(".Lfunc_end")), len(lines))
    body = _instructions(lines[:end], level)  # AMDGCN: not the metadata after the function
    return HotWindow(level, 1, end, body, float(len(body)),
                     "static: the whole kernel (it has no loop; no profile)", None, ())


# ---------------------------------------------------------------------------------------------------
# Nsight Compute sampling (NVIDIA GPU)
# ---------------------------------------------------------------------------------------------------
def parse_ncu_source_csv(text: str) -> dict[int, float]:
    """PTX line number -> warp-stall samples, from `ncu --page source --print-source ptx --csv` output.

    The columns are found by name: a line column (`#`, `Line` or `Line #`) and the sampling column
    (`Warp Stall Sampling (All Samples)`, else any `Sampling` column). Rows that are not numbers (ncu's
    banner lines) are skipped."""
    rows = list(csv.reader(io.StringIO("\n".join(ln for ln in text.splitlines() if ln.count(",") >= 1))))
    header_at = next((i for i, r in enumerate(rows) if any("Sampling" in c for c in r)), None)
    if header_at is None:
        return {}
    header = [c.strip() for c in rows[header_at]]
    line_col = next((i for i, c in enumerate(header) if c in ("#", "Line", "Line #", "# Line")), None)
    sample_col = next((i for i, c in enumerate(header) if c.startswith("Warp Stall Sampling (All")), None)
    if sample_col is None:
        sample_col = next((i for i, c in enumerate(header) if "Sampling" in c), None)
    if line_col is None or sample_col is None:
        return {}
    samples: dict[int, float] = {}
    for r in rows[header_at + 1:]:
        try:
            line = int(r[line_col])
            value = float(r[sample_col].replace(",", "") or 0)
        except (IndexError, ValueError):
            continue
        samples[line] = samples.get(line, 0.0) + value
    return samples


def window_from_samples(ptx: str, samples: Mapping[int, float]) -> HotWindow:
    """The loop holding the most samples (1-based PTX lines), or the static window when nothing sampled."""
    if not samples or sum(samples.values()) <= 0:
        return static_hot_window(ptx, "ptx")
    lines = ptx.splitlines()
    loops = find_loops(ptx, "ptx")
    total = sum(samples.values())

    def held(lp: Loop) -> float:
        return sum(v for ln, v in samples.items() if lp.start + 1 <= ln <= lp.end + 1)

    if loops:
        best = max(loops, key=lambda lp: (held(lp), -lp.depth))
        if held(best) > 0:
            return HotWindow("ptx", best.start + 1, best.end + 1, _instructions(lines[best.start:best.end + 1], "ptx"),
                             held(best), f"ncu sampling: {held(best) / total:.0%} of the warp-stall samples",
                             best.header, tuple(loops))
    hot = max(samples, key=lambda ln: samples[ln])
    lo, hi = max(1, hot - 8), min(len(lines), hot + 8)
    part = sum(v for ln, v in samples.items() if lo <= ln <= hi)
    return HotWindow("ptx", lo, hi, _instructions(lines[lo - 1:hi], "ptx"), part,
                     f"ncu sampling: {part / total:.0%} of the warp-stall samples around line {hot}", None, ())


def profile_ptx_samples(ncu: str | Path, command: Sequence[str], kernel_name: str, timeout: float = 600.0) -> dict[int, float]:
    """Run `command` under Nsight Compute with source-level sampling of the kernel `kernel_name` and return
    PTX line -> samples. Needs an NVIDIA GPU and permission to profile; a failure is a `ToolError`."""
    argv = [str(ncu), "--section", "SourceCounters", "--section", "WarpStateStats", "--kernel-name", kernel_name,
            "--launch-count", "1", "--page", "source", "--print-source", "ptx", "--csv", *command]
    return parse_ncu_source_csv(run_tool(argv, timeout=timeout).stdout)
