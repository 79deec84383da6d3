"""Assembly patches: anchored, reviewable edits of a hot window of PTX or AMDGCN.

A patch is plain text that a person and an LLM can both write and review:

    # kstrata asm patch v1
    level: ptx
    kernel: matmul_kernel
    description: read A through the non-coherent (read-only) cache

    @@ $L__BB0_2
     mov.pred %p35, -1;
    -@%p3 ld.global.b16 { %rs1 }, [ %rd25 + 0 ];
    +@%p3 ld.global.nc.b16 { %rs1 }, [ %rd25 + 0 ];

Each hunk starts with `@@`, optionally followed by an *anchor*: a label (`$L__BB0_2`, `.LBB0_3`) or the
exact text of one line. The hunk's window runs from the anchor to the next label (or the end of the
text when there is no anchor). Lines starting with ` ` are context, `-` removed, `+` added. The context
and removed lines must occur exactly once, contiguously, in the window: a patch never applies to a
different place. Matching ignores differences in whitespace runs and trailing comments (`//` in PTX,
`;` in AMDGCN); added lines take the indentation of the line they replace. A missing or ambiguous anchor or hunk is an `AsmPatchError` that says which
hunk, and where the near misses are.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kstrata.ir.errors import KstrataError, cut_text

PATCH_HEADER = "# kstrata asm patch v1"
PATCH_LEVELS = ("ptx", "amdgcn")
_LABEL_LINE = re.compile(r"^\s*([$.\w]+):")


class AsmPatchError(KstrataError):
    """A patch that cannot be read, or cannot be applied at exactly one place."""


@dataclass(frozen=True)
class Hunk:
    """Context, removed and added lines, in order; `anchor` scopes where they may match."""

    anchor: str | None
    lines: tuple[tuple[str, str], ...]  # (" " | "-" | "+", text)
    line: int | None = field(default=None, compare=False)  # of its `@@` in the patch file, for errors

    @property
    def before(self) -> list[str]:
        return [t for k, t in self.lines if k in (" ", "-")]

    @property
    def after(self) -> list[str]:
        return [t for k, t in self.lines if k in (" ", "+")]


@dataclass(frozen=True)
class AsmPatch:
    level: str
    hunks: tuple[Hunk, ...]
    kernel: str | None = None
    description: str = ""
    origin: str | None = field(default=None, compare=False)  # the patch file, for errors

    def __post_init__(self) -> None:
        if self.level not in PATCH_LEVELS:
            raise AsmPatchError(f"patch level must be one of {', '.join(PATCH_LEVELS)}, not {self.level!r}")
        if not self.hunks:
            raise AsmPatchError("patch has no hunks")
        for i, h in enumerate(self.hunks, 1):
            if not any(k in "-+" for k, _ in h.lines):
                raise AsmPatchError(f"hunk {i} changes nothing (no - or + lines)")
            if not h.before:
                raise AsmPatchError(f"hunk {i} has no context or removed lines to anchor it")

    # -- text form ----------------------------------------------------------------------------------
    def to_text(self) -> str:
        out = [PATCH_HEADER, f"level: {self.level}"]
        if self.kernel:
            out.append(f"kernel: {self.kernel}")
        if self.description:
            out.append(f"description: {self.description}")
        for h in self.hunks:
            out.append("")
            out.append("@@" + (f" {h.anchor}" if h.anchor else ""))
            out += [k + t for k, t in h.lines]
        return "\n".join(out) + "\n"

    @classmethod
    def from_text(cls, text: str, origin: str | None = None) -> AsmPatch:
        where = origin or "<patch>"
        lines = text.splitlines()
        if not lines or lines[0].strip() != PATCH_HEADER:
            raise AsmPatchError(f"{where}:1: a patch starts with `{PATCH_HEADER}`")
        headers: dict[str, str] = {}
        hunks: list[Hunk] = []
        current: list[tuple[str, str]] | None = None
        anchor: str | None = None
        at = 0
        for n, line in enumerate(lines[1:], 2):
            if line.startswith("@@"):
                if current is not None:
                    hunks.append(Hunk(anchor, tuple(current), at))
                anchor = line[2:].strip() or None
                current = []
                at = n
            elif current is None:
                if not line.strip() or line.startswith("#"):
                    continue
                key, sep, value = line.partition(":")
                if not sep or key.strip() not in ("level", "kernel", "description"):
                    raise AsmPatchError(f"{where}:{n}: expected `level:`, `kernel:`, `description:` or `@@`, got {cut_text(repr(line))}")
                headers[key.strip()] = value.strip()
            elif line[:1] in (" ", "-", "+"):
                current.append((line[0], line[1:]))
            elif not line.strip():
                continue  # blank lines between hunks
            else:
                raise AsmPatchError(f"{where}:{n}: hunk lines start with ' ', '-' or '+', got {cut_text(repr(line))}")
        if current is not None:
            hunks.append(Hunk(anchor, tuple(current), at))
        if "level" not in headers:
            raise AsmPatchError(f"{where}: no `level:` header (ptx or amdgcn)")
        try:
            return cls(headers["level"], tuple(hunks), headers.get("kernel") or None, headers.get("description", ""),
                       origin)
        except AsmPatchError as exc:
            raise AsmPatchError(f"{where}: {exc.message}") from None

    @classmethod
    def load(cls, path: str | Path) -> AsmPatch:
        from kstrata.ir.files import parse_json, read_text, user_path

        p = user_path(path)
        text = read_text(p, "patch file", error=AsmPatchError)
        if p.suffix == ".json":
            data = parse_json(text, p, "patch file", error=AsmPatchError)
            try:
                hunks = tuple(Hunk(h.get("anchor"), tuple((k, t) for k, t in h["lines"])) for h in data["hunks"])
                return cls(data["level"], hunks, data.get("kernel"), data.get("description", ""), str(p))
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                raise AsmPatchError(f"not a kstrata JSON patch: {type(exc).__name__}: {cut_text(str(exc))}",
                                    path=p) from None
        return cls.from_text(text, str(p))

    def to_json(self) -> dict[str, Any]:
        return {"schema": "kstrata.asm-patch/1", "level": self.level, "kernel": self.kernel,
                "description": self.description,
                "hunks": [{"anchor": h.anchor, "lines": [list(x) for x in h.lines]} for h in self.hunks]}


_COMMENT = {"ptx": re.compile(r"//.*$"), "amdgcn": re.compile(r";.*$")}


def _norm(line: str, level: str | None = None) -> str:
    """A line as matching sees it: trailing comment dropped (`//` in PTX, `;` in AMDGCN), whitespace runs
    collapsed."""
    if level is not None:
        line = _COMMENT[level].sub("", line)
    return " ".join(line.split())


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip())]


@dataclass
class HunkResult:
    index: int
    start_line: int  # 1-based line of the first matched line in the text before the patch
    removed: int
    added: int


@dataclass
class PatchResult:
    text: str
    hunks: list[HunkResult] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"hunks": [asdict(h) for h in self.hunks]}


def _window(lines: list[str], anchor: str | None, hunk_no: int) -> tuple[int, int]:
    if anchor is None:
        return 0, len(lines)
    label = anchor[:-1] if anchor.endswith(":") else anchor
    starts = [i for i, ln in enumerate(lines) if (m := _LABEL_LINE.match(ln)) and m.group(1) == label]
    if not starts:
        wanted = _norm(anchor)
        starts = [i for i, ln in enumerate(lines) if _norm(ln) == wanted]
    if not starts:
        # (difflib is quadratic: no near misses for an anchor longer than any line a compiler writes)
        close = (difflib.get_close_matches(wanted, {_norm(ln) for ln in lines if ln.strip()}, n=3)
                 if len(anchor) <= 1000 else [])
        hint = f"; near misses: {close}" if close else ""
        raise AsmPatchError(f"hunk {hunk_no}: anchor {cut_text(repr(anchor))} not found{hint}")
    if len(starts) > 1:
        raise AsmPatchError(f"hunk {hunk_no}: anchor {cut_text(repr(anchor))} is ambiguous: lines "
                            + ", ".join(str(s + 1) for s in starts[:10]))
    start = starts[0]
    end = next((i for i in range(start + 1, len(lines)) if _LABEL_LINE.match(lines[i])), len(lines))
    return start, end


def apply_patch(text: str, patch: AsmPatch) -> PatchResult:
    """Apply every hunk of `patch` to `text`, strictly; hunks apply in order, each to the text so far."""
    trailing = text.endswith("\n")
    lines = (text[:-1] if trailing else text).split("\n")
    results: list[HunkResult] = []
    for no, hunk in enumerate(patch.hunks, 1):
        try:
            results.append(_apply_hunk(lines, patch, no, hunk))
        except AsmPatchError as exc:
            if patch.origin and exc.path is None:  # the patch file and the line of the hunk's `@@`
                raise AsmPatchError(exc.message, path=f"{patch.origin}:{hunk.line}" if hunk.line else patch.origin,
                                    hint=exc.hint) from None
            raise
    return PatchResult("\n".join(lines) + ("\n" if trailing else ""), results)


def _apply_hunk(lines: list[str], patch: AsmPatch, no: int, hunk: Hunk) -> HunkResult:
    """Apply one hunk to `lines` in place."""
    lo, hi = _window(lines, hunk.anchor, no)
    before = [_norm(t, patch.level) for t in hunk.before]
    normed = [_norm(ln, patch.level) for ln in lines]
    matches = [i for i in range(lo, hi - len(before) + 1) if normed[i:i + len(before)] == before]
    if not matches:
        first = before[0]
        near = [i + 1 for i in range(lo, hi) if normed[i] == first]
        where = f"in the window after {cut_text(repr(hunk.anchor))}" if hunk.anchor else "anywhere"
        detail = (f"; its first line occurs at line(s) {near[:10]} but the following lines differ" if near
                  else f"; its first line {cut_text(repr(hunk.before[0].strip()))} does not occur {where}")
        raise AsmPatchError(f"hunk {no}: context and removed lines not found {where}{detail}")
    if len(matches) > 1:
        raise AsmPatchError(f"hunk {no}: matches {len(matches)} places (lines "
                            + ", ".join(str(m + 1) for m in matches[:10])
                            + "); add context or an anchor so it matches exactly one")
    at = matches[0]
    replacement: list[str] = []
    cursor = at
    indent = _indent(lines[at])
    for kind, t in hunk.lines:
        if kind == " ":
            replacement.append(lines[cursor])
            indent = _indent(lines[cursor])
            cursor += 1
        elif kind == "-":
            indent = _indent(lines[cursor])
            cursor += 1
        else:
            replacement.append(indent + t.lstrip() if t.strip() else t)
    lines[at:cursor] = replacement
    return HunkResult(no, at + 1, sum(k == "-" for k, _ in hunk.lines), sum(k == "+" for k, _ in hunk.lines))


def make_patch(level: str, before: str, after: str, kernel: str | None = None, description: str = "",
               context: int = 2) -> AsmPatch:
    """A patch that turns `before` into `after`, with `context` lines around each change."""
    a, b = before.splitlines(), after.splitlines()
    hunks = []
    for group in difflib.SequenceMatcher(None, a, b, autojunk=False).get_grouped_opcodes(context):
        hlines: list[tuple[str, str]] = []
        for tag, i1, i2, j1, j2 in group:
            if tag == "equal":
                hlines += [(" ", x) for x in a[i1:i2]]
            else:
                hlines += [("-", x) for x in a[i1:i2]] + [("+", x) for x in b[j1:j2]]
        first, last = group[0][1], group[-1][2]
        anchor_at = next((i for i in range(first, -1, -1) if _LABEL_LINE.match(a[i])), None)
        # the window of an anchor ends at the next label: anchor only hunks that stay inside it
        inner_label = any(_LABEL_LINE.match(x) for x in a[max(first, (anchor_at or 0) + 1):last])
        anchor = None
        if anchor_at is not None and not inner_label:
            m = _LABEL_LINE.match(a[anchor_at])
            anchor = m.group(1) if m else None
        hunks.append(Hunk(anchor, tuple(hlines)))
    return AsmPatch(level, tuple(hunks), kernel, description)
