"""The part of a level's text an assembly pass may edit: its `scope` option, `hot`, `all` or `lines:A-B`.

- `hot`: the static hot window of the text the pass sees (`backends/hotwindow.py`: the loop nest of the
  most instructions weighted by an assumed trip count, or the whole kernel without a loop);
- `all`: every line;
- `lines:A-B` (1-based, inclusive) or `lines:A-B@DIGEST`: exactly those lines of the level's text, e.g. a
  window sampled by Nsight Compute. `DIGEST` is the first 8 hex digits of the SHA-256 of the window's lines
  (each stripped, joined by newlines) in the text the window was taken from; with it, a pass run on another
  text (an earlier pass or a rebuild changed it) refuses instead of editing whatever now sits at A-B.
  Without it only the range is checked. A window that is not inside the text is refused with the reason,
  never clipped.

The passes with a window (`ptx-reorder`, `amdgcn-reorder`, `ptx-predicate`) edit instructions whose effect
is local to where they sit (the order inside a block, one branch). The cache-policy passes (`cache-hints`,
`ld-nc`, `nontemporal-hints`) have none: a policy is per access wherever it is (a streaming load before
the loop evicts as much as one inside it), and `ld-nc`'s soundness is a property of the whole kernel (no
store through a parameter it loads from), so a window would only hide accesses from it.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .base import OptionPattern, option

_LINES = re.compile(r"lines:([1-9]\d*)-([1-9]\d*)(?:@([0-9a-f]{8}))?")

#: `scope=all`: every line of the text.
ALL_LINES = (1, 1 << 30)


def _check_scope(value: str) -> str | None:
    m = _LINES.fullmatch(value)
    if m and int(m[1]) > int(m[2]):
        return f"the window's first line {m[1]} is after its last {m[2]}"
    return None


#: The grammar of a `scope` option: checked when the pass is built, like every option.
SCOPE = OptionPattern(r"hot|all|" + _LINES.pattern, "hot, all, lines:A-B or lines:A-B@DIGEST", _check_scope,
                      "lines:12-40@0123abcd")


def scope_option(default: str) -> Any:
    """The `scope` option of a pass with a window (a dataclass field, as `option` gives)."""
    return option(default, pattern=SCOPE, doc="hot (the static hot window), all, or lines:A-B[@DIGEST] "
                  "(lines A to B of the level's text, 1-based, inclusive; DIGEST anchors them to the text)")


def window_digest(lines: Sequence[str]) -> str:
    """The anchor of a window: 8 hex digits of the SHA-256 of its lines, each stripped."""
    return hashlib.sha256("\n".join(ln.strip() for ln in lines).encode()).hexdigest()[:8]


@dataclass(frozen=True)
class LineWindow:
    """Lines `first`..`last` (1-based, inclusive) of one level's text, anchored by `digest` when known."""

    first: int
    last: int
    digest: str | None = None

    @classmethod
    def of_text(cls, text: str, first: int, last: int) -> LineWindow:
        """The window of lines `first`..`last` of `text`, anchored to it."""
        return cls(first, last, window_digest(text.splitlines()[first - 1:last]))

    @classmethod
    def parse(cls, scope: str) -> LineWindow | None:
        """The window a `lines:A-B[@DIGEST]` scope names, or None for `hot` and `all`."""
        m = _LINES.fullmatch(scope)
        return cls(int(m[1]), int(m[2]), m[3]) if m else None

    def spelling(self) -> str:
        return f"lines:{self.first}-{self.last}" + (f"@{self.digest}" if self.digest else "")

    def refusal(self, text: str, level: str) -> str | None:
        """Why this window cannot be applied to `text` (None when it can)."""
        lines = text.splitlines()
        if self.last > len(lines):
            return (f"scope={self.spelling()}: the window ends past the {level} text's last line ({len(lines)}); "
                    f"it was taken on another text")
        if self.digest is not None and window_digest(lines[self.first - 1:self.last]) != self.digest:
            return (f"scope={self.spelling()}: lines {self.first}-{self.last} of this {level} are not the window's "
                    f"(their digest is {window_digest(lines[self.first - 1:self.last])}): the text changed since the "
                    f"window was taken (an earlier pass or a rebuild), so the pass does not edit it")
        return None


def scope_lines(scope: str, text: str, level: str) -> tuple[int, int] | str:
    """The 1-based line range `scope` names in `text`, or why it names none (a window of another text)."""
    if scope == "all":
        return ALL_LINES
    if scope == "hot":
        from kstrata.backends.hotwindow import static_hot_window

        w = static_hot_window(text, level)
        return w.first_line, w.last_line
    window = LineWindow.parse(scope)
    if window is None:  # the option's pattern admits nothing else
        raise ValueError(f"not a scope: {scope!r}")
    why = window.refusal(text, level)
    return why if why is not None else (window.first, window.last)


def scope_words(scope: str) -> str:
    """The scope in words, for a pass's notes and reasons."""
    return {"hot": "the hot window", "all": "the kernel"}.get(scope, f"lines {scope.removeprefix('lines:')}")
