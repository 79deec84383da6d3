"""What every `kstrata` command shares for output: the consoles, `--json` printing and user errors."""

from __future__ import annotations

import json
import sys
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape

#: The width of output that is not a terminal: wide enough that no kernel name, path or table cell is cut
#: or wrapped at 80 columns when piped into a file or `grep`.
PIPE_WIDTH = 10_000


def console(*, stderr: bool = False) -> Console:
    """A console for stdout or stderr: the terminal's width on a terminal, otherwise never wrapping."""
    c = Console(stderr=stderr)
    if not c.is_terminal:
        c = Console(stderr=stderr, width=PIPE_WIDTH, soft_wrap=True)
    return c


out = console()
err = console(stderr=True)

JsonFlag = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]


def emit_json(payload: Any) -> None:
    """Print `payload` as indented JSON on stdout (values JSON lacks are written with str())."""
    sys.stdout.write(json.dumps(payload, indent=2, default=str) + "\n")


def error_line(message: object) -> None:
    """Print `error: MESSAGE` on stderr as one line (the message is text, never markup: paths hold `[`)."""
    err.print(f"[bold red]error:[/] {escape(str(message))}", highlight=False, markup=True, soft_wrap=True)


def fail(message: str, code: int = 1) -> NoReturn:
    """Print one error line and exit with `code`."""
    error_line(message)
    raise typer.Exit(code)
