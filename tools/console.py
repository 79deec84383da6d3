"""What every `kstrata` command shares for output: the consoles, `--json` printing and user errors."""

from __future__ import annotations

import json
import sys
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape

out = Console()
err = Console(stderr=True)

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
