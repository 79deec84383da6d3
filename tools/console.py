"""What every `kstrata` command shares for output: the consoles, `--json` printing and user errors."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console

out = Console()
err = Console(stderr=True)

JsonFlag = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]


def emit_json(payload: Any) -> None:
    """Print `payload` as indented JSON on stdout (values JSON lacks are written with str())."""
    sys.stdout.write(json.dumps(payload, indent=2, default=str) + "\n")


def fail(message: str, code: int = 1) -> NoReturn:
    """Print one error line and exit with `code`."""
    err.print(f"[bold red]error:[/] {message}", highlight=False, markup=True, soft_wrap=True)
    raise typer.Exit(code)


def run_command(command: Callable[..., int], argv: list[str] | None = None, *, help: str | None = None) -> int:
    """Run a script's typer `command` on `argv` (default: `sys.argv[1:]`) and return its exit code.

    For the scripts under `tools/` (`python -m kstrata.tools.X`): their `main(argv)` stays callable
    from Python and returns an int (the command's own, 2 for a usage error, which typer explains).
    """

    @functools.wraps(command)
    def exit_with_code(*args: Any, **kwargs: Any) -> None:
        raise typer.Exit(int(command(*args, **kwargs) or 0))

    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    app.command(help=help or command.__doc__)(exit_with_code)
    try:
        app(args=sys.argv[1:] if argv is None else argv, prog_name=command.__module__.rsplit(".", 1)[-1])
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return 0
