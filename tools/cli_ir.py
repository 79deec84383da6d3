"""`kstrata ir`: TTIR/TTGIR through the typed xDSL dialects — `show` pretty-prints, `roundtrip` checks the contract.

`ir_app` is a typer sub-app (the main CLI mounts it as `ir`); run on its own it is the same sub-app
(`python -m kstrata.tools.cli_ir roundtrip FILE`). Exit codes: 0 when the contract holds, 1 when it does
not (the first text difference, Triton's parse error, or the first differing binary section is named),
2 for a user error (one line: `file:line:col`, the op and what was expected).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from kstrata.ir.errors import KstrataError
from kstrata.ir.target import Target
from kstrata.tools.console import console

ir_app = typer.Typer(help="TTIR/TTGIR as typed xDSL IR: pretty-print, and check the exact round trip.",
                     no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)

out = console()
err = console(stderr=True)


def _level_of(path: Path) -> str:
    ext = path.suffix.lstrip(".")
    if ext not in ("ttir", "ttgir"):
        other = (" (LLVM IR, PTX and AMDGCN are not MLIR: `kstrata bundle show ENTRY --level " + ext + "` prints "
                 "that level, `kstrata passes apply` rewrites it)") if ext in ("llir", "ptx", "amdgcn") else ""
        raise KstrataError(f"`kstrata ir` reads TTIR and TTGIR: expected a .ttir or .ttgir file{other}", path=path)
    return ext


def _fail(exc: KstrataError) -> None:
    err.print(f"error: {exc}", markup=False, highlight=False)
    raise typer.Exit(2)


@ir_app.command("show")
def ir_show(
    file: Annotated[Path, typer.Argument(metavar="FILE", help="A .ttir or .ttgir file.")],
    no_locations: Annotated[bool, typer.Option("--no-locations", help="Leave out loc(...) and #loc aliases.")] = False,
) -> None:
    """Parse FILE into the typed dialects, verify it, and print it with its op count per dialect and types."""
    try:
        _level_of(file)
        from kstrata.ir.triton_ir import parse_file, print_triton  # xDSL is slow to import: only when used

        module = parse_file(file)
    except KstrataError as exc:
        _fail(exc)
        return
    counts: dict[str, int] = {}
    for op in module.ops():
        counts[op.name] = counts.get(op.name, 0) + 1
    sys.stdout.write(print_triton(module, locations=not no_locations))
    err.print(f"{file}: {module.level}, {sum(counts.values())} ops, {len(counts)} kinds: "
              + ", ".join(f"{k} x{v}" for k, v in sorted(counts.items())), markup=False, highlight=False)


@ir_app.command("roundtrip")
def ir_roundtrip(
    file: Annotated[Path, typer.Argument(metavar="FILE", help="A .ttir or .ttgir file (a cache entry's; its .json gives the options).")],
    target: Annotated[str | None, typer.Option("--target", help="cuda:90, hip:gfx942, …; default: the module's.")] = None,
    no_compile: Annotated[bool, typer.Option("--no-compile", help="Check text and Triton's parser only.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Parse and print FILE; Triton must accept the output and compile it to the same cubin/hsaco."""
    try:
        level = _level_of(file)
        from kstrata.ir.files import read_ir_text, user_path

        file = user_path(file)
        text = read_ir_text(file, f"{level} file")
        tgt = Target.parse(target) if target else None
        from kstrata.ir.ir_roundtrip import check_roundtrip, load_metadata_beside

        metadata: dict[str, Any] = load_metadata_beside(file)
        if tgt is None and "target" in metadata:
            tgt = Target.from_triton(metadata["target"])
        result = check_roundtrip(text, level, tgt, metadata, path=file, compile=not no_compile)
    except KstrataError as exc:
        _fail(exc)
        return
    if as_json:
        sys.stdout.write(json.dumps({"file": str(file), **result.to_json()}, indent=2) + "\n")
    else:
        d = result.first_text_difference
        out.print(f"{file}: {level} for {result.target}", markup=False, highlight=False)
        out.print("  text: identical" if d is None else
                  f"  text: differs at {file}:{d.line}:{d.column}\n    input:   {d.expected}\n    printed: {d.got}",
                  markup=False, highlight=False)
        out.print("  Triton parser: accepts" if result.triton_parses else f"  Triton parser: rejects: {result.triton_error}",
                  markup=False, highlight=False)
        if result.binary_identical is not None:
            out.print("  binary: identical" if result.binary_identical else f"  binary: differs: {result.binary_difference}",
                      markup=False, highlight=False)
        out.print("  contract holds" if result.holds and result.text_identical else
                  ("  contract holds (text differs)" if result.holds else "  contract FAILS"), markup=False, highlight=False)
    if not result.holds:
        raise typer.Exit(1)


if __name__ == "__main__":
    ir_app()
