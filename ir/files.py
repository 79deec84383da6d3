"""Reading the files a user hands kstrata: one place that turns every way a read fails into a `KstrataError`.

A path may start with `~`; it may be missing, a directory, unreadable, not UTF-8, or (JSON) invalid or
nested deeper than the parser recurses. Each is one message naming the file, and the line where there
is one. The same for the output directories a user names (`make_dir`): a file in the way is one message.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from kstrata.ir.errors import KstrataError

#: JSON nested deeper than this is refused before parsing (Python's parser recurses once per level).
MAX_JSON_DEPTH = 200

#: The longest line an IR file may have. Triton's IR lines are short (the longest in the suite and the
#: Inductor corpus is a few KiB); a longer line is not IR a compiler wrote, and parsers and tools take
#: minutes on one (a 10 MB line made `verify` and `run-passes` run past a minute).
MAX_IR_LINE_CHARS = 1 << 20


def user_path(path: str | os.PathLike[str]) -> Path:
    """`path` with a leading `~` expanded, as a shell would have."""
    return Path(path).expanduser()


def make_dir(path: str | os.PathLike[str], what: str = "output directory", *,
             error: type[KstrataError] = KstrataError) -> Path:
    """Create the directory `path` (and its parents) unless it is there; a file in the way, at `path` or
    above it, or a permission problem is an `error` naming `path`."""
    p = user_path(path)
    try:
        p.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise error(f"the {what} is a file, not a directory (or a file is in its path)", path=p) from None
    except OSError as exc:
        raise error(f"cannot create the {what}: {exc.strerror or exc}", path=p) from None
    return p


def read_bytes(path: str | os.PathLike[str], what: str = "file", *, error: type[KstrataError] = KstrataError) -> bytes:
    """The bytes of `path`; a missing file, a directory or a permission problem is an `error` naming it."""
    p = user_path(path)
    try:
        return p.read_bytes()
    except FileNotFoundError:
        raise error("no such file", path=p) from None
    except IsADirectoryError:
        raise error(f"expected a {what}, found a directory", path=p) from None
    except OSError as exc:
        raise error(f"cannot read the {what}: {exc.strerror or exc}", path=p) from None


def decode_text(data: bytes, path: str | os.PathLike[str], what: str = "file", *,
                error: type[KstrataError] = KstrataError) -> str:
    """`data` as UTF-8; otherwise an `error` at the line and column of the first bad byte."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        col = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise error(f"{what} is not UTF-8 text (byte 0x{data[exc.start]:02x} at column {col})",
                    path=f"{user_path(path)}:{line}") from None


def read_text(path: str | os.PathLike[str], what: str = "file", *, error: type[KstrataError] = KstrataError) -> str:
    """The UTF-8 text of `path` (see `read_bytes` and `decode_text` for the errors)."""
    return decode_text(read_bytes(path, what, error=error), path, what, error=error)


def check_ir_lines(text: str, path: str | os.PathLike[str], what: str = "IR file", *,
                   error: type[KstrataError] = KstrataError) -> None:
    """Refuse IR text with a line longer than `MAX_IR_LINE_CHARS` (naming the line)."""
    if len(text) <= MAX_IR_LINE_CHARS:
        return
    for number, line in enumerate(text.split("\n"), 1):
        if len(line) > MAX_IR_LINE_CHARS:
            raise error(f"{what} has a line of {len(line):,} characters (at most {MAX_IR_LINE_CHARS:,}): not IR a "
                        "compiler wrote", path=f"{user_path(path)}:{number}")


def read_ir_text(path: str | os.PathLike[str], what: str = "IR file", *,
                 error: type[KstrataError] = KstrataError) -> str:
    """`read_text`, then `check_ir_lines`."""
    text = read_text(path, what, error=error)
    check_ir_lines(text, path, what, error=error)
    return text


def parse_json(text: str, path: str | os.PathLike[str], what: str = "JSON file", *,
               error: type[KstrataError] = KstrataError) -> Any:
    """`json.loads(text)`; invalid or too deeply nested JSON is an `error` at its line."""
    depth = _max_nesting(text)
    if depth > MAX_JSON_DEPTH:
        raise error(f"{what} is nested {depth} levels deep (at most {MAX_JSON_DEPTH})", path=user_path(path))
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(f"corrupt JSON ({what}): {exc.msg} at line {exc.lineno}, column {exc.colno}",
                    path=user_path(path)) from None
    except RecursionError:  # pragma: no cover - the depth check comes first
        raise error(f"{what} is nested too deeply", path=user_path(path)) from None


def read_json(path: str | os.PathLike[str], what: str = "JSON file", *,
              error: type[KstrataError] = KstrataError) -> Any:
    """The JSON value in `path`."""
    return parse_json(read_text(path, what, error=error), path, what, error=error)


def _max_nesting(text: str) -> int:
    """The deepest bracket nesting outside strings (cheap: only the bracket and quote characters are visited)."""
    if text.count("[") + text.count("{") <= MAX_JSON_DEPTH:
        return 0
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest
