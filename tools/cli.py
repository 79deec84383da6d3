"""The `kstrata` command line.

Every command takes `--json` for machine-readable output and exits non-zero on failure; a user error
(bad path, unknown target, corrupt file) prints one line naming the file, without a traceback.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import typer
from kstrata import __version__
from kstrata.ir.errors import KstrataError
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

app = typer.Typer(help="Make GPU kernels faster at every level of Triton's lowering, and prove it.",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)
suite_app = typer.Typer(help="The project's own kernel suite.", no_args_is_help=True)
bundle_app = typer.Typer(help="Kernel bundles: one kernel at every level.", no_args_is_help=True)
app.add_typer(suite_app, name="suite")
app.add_typer(bundle_app, name="bundle")

out = Console()
err = Console(stderr=True)
F = TypeVar("F", bound=Callable[..., Any])


def _fail(message: str, code: int = 1) -> None:
    err.print(f"[bold red]error:[/] {message}", highlight=False, markup=True, soft_wrap=True)
    raise typer.Exit(code)


def _emit_json(payload: Any) -> None:
    sys.stdout.write(json.dumps(payload, indent=2, default=str) + "\n")


def _version_callback(value: bool) -> None:
    if value:
        out.print(f"kstrata {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_version_callback, is_eager=True,
                                       help="Print the version and exit.")) -> None:
    """kstrata: capture, rewrite, verify and measure Triton kernels at every level."""


# ---------------------------------------------------------------------------------------------------
# suite
# ---------------------------------------------------------------------------------------------------
@suite_app.command("list")
def suite_list(as_json: bool = typer.Option(False, "--json", help="Machine-readable output.")) -> None:
    """List the suite's kernels with what each exercises."""
    from kstrata.testsuite.kernels import all_kernels

    kernels = all_kernels()
    rows = [{"name": k.name, "function": k.fn_name, "module": k.fn.__module__.rsplit(".", 1)[-1], "tags": list(k.tags),
             "num_warps": k.num_warps, "num_stages": k.num_stages, "outputs": list(k.outputs),
             "description": k.description} for k in kernels]
    if as_json:
        _emit_json({"kernels": rows})
        return
    table = Table(title=f"{len(rows)} suite kernels")
    for col in ("name", "module", "tags", "description"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["name"], r["module"], ", ".join(r["tags"]), r["description"])
    out.print(table)


def _resources(bundle: Any) -> dict[str, Any] | None:
    from kstrata.backends.resources import resource_usage

    try:
        return resource_usage(bundle).to_json()
    except KstrataError as exc:
        return {"error": str(exc)}


@suite_app.command("build")
def suite_build(
    target: list[str] = typer.Option(..., "--target", "-t", help="cuda:90, hip:gfx942, … (repeatable)."),
    cache_dir: Path = typer.Option(..., "--cache-dir", help="Directory to fill in Triton cache layout."),
    only: list[str] = typer.Option(None, "--only", help="Build only these kernels (repeatable)."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Compile the suite for each target into CACHE_DIR and show every kernel's levels and resources."""
    from kstrata.ir.target import Target
    from kstrata.testsuite.kernels import all_kernels
    from kstrata.testsuite.kernels.build import build_suite

    targets = [Target.parse(t) for t in target]
    kernels = all_kernels()
    if only:
        unknown = sorted(set(only) - {k.name for k in kernels})
        if unknown:
            _fail(f"unknown suite kernels: {', '.join(unknown)} (see `kstrata suite list`)")
        kernels = [k for k in kernels if k.name in only]
    results = []
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err, disable=as_json or not err.is_terminal) as progress:
        for tgt in targets:
            task = progress.add_task(f"building for {tgt}", total=len(kernels))

            def step(kernel: Any, bundle: Any, error: str | None, task: Any = task, tgt: Any = tgt) -> None:
                progress.advance(task)
                if error and not as_json:
                    err.print(f"[red]FAIL[/] {kernel.name} for {tgt}: {error}", highlight=False)

            results.append(build_suite(tgt, cache_dir, kernels, on_kernel=step))
    built_targets: list[dict[str, Any]] = []
    payload: dict[str, Any] = {"cache_dir": str(cache_dir), "targets": built_targets}
    for res in results:
        entries = []
        for name, bundle in res.bundles.items():
            entries.append({"kernel": name, "entry": bundle.origin, "levels": bundle.present_levels(),
                            "num_warps": bundle.num_warps, "num_stages": bundle.num_stages,
                            "shared": bundle.shared, "resources": _resources(bundle)})
        built_targets.append({"target": str(res.target), "built": len(res.bundles), "failed": res.errors,
                                   "skipped": res.skipped, "kernels": entries})
    if as_json:
        _emit_json(payload)
    else:
        for tgt_payload in built_targets:
            _print_build_table(tgt_payload)
            for name, why in tgt_payload["skipped"].items():
                out.print(f"  [yellow]skipped[/] {name}: {why}", highlight=False)
        out.print(f"cache: {cache_dir}")
    if any(t["failed"] for t in built_targets):
        raise typer.Exit(1)


def _print_build_table(tgt_payload: dict[str, Any]) -> None:
    from kstrata.ir.target import Target

    def levels_of(spelling: str) -> tuple[str, ...]:
        return Target.parse(spelling).levels

    amd = tgt_payload["target"].startswith("hip")
    table = Table(title=f"{tgt_payload['target']}: {tgt_payload['built']} kernels built, "
                        f"{len(tgt_payload['failed'])} failed")
    for col in ("kernel", "levels", "warps", "stages", "shared B", "VGPRs" if amd else "regs",
                "SGPRs" if amd else "local B", "spills" if amd else "stack B"):
        table.add_column(col, justify="left" if col in ("kernel", "levels") else "right")
    for e in tgt_payload["kernels"]:
        r = e["resources"] or {}
        if "error" in r:
            res_cells = ["?", "?", "?"]
        elif amd:
            res_cells = [str(r["registers"]), str(r["sgprs"]), str((r["vgpr_spills"] or 0) + (r["sgpr_spills"] or 0))]
        else:
            res_cells = [str(r["registers"]), str(r["local_bytes"]), str(r["stack_bytes"])]
        table.add_row(e["kernel"], f"{len(e['levels'])}/{len(levels_of(tgt_payload['target']))}", str(e["num_warps"]), str(e["num_stages"]), str(e["shared"]),
                      *res_cells)
    out.print(table)


# ---------------------------------------------------------------------------------------------------
# bundle
# ---------------------------------------------------------------------------------------------------
def _disassemble(bundle: Any, level: str) -> str:
    import tempfile

    from kstrata.backends.tools import run_tool

    data = bundle.level(level)
    with tempfile.NamedTemporaryFile(suffix=f".{level}") as f:
        f.write(data)
        f.flush()
        if level == "cubin":
            from kstrata.backends.nvidia import find_nvidia_tool

            return run_tool([find_nvidia_tool("cuobjdump").path, "--dump-sass", f.name]).stdout
        from kstrata.backends.amd import find_amd_tool

        return run_tool([find_amd_tool("llvm-objdump").path, "-d", f"--mcpu={bundle.target.arch}", f.name]).stdout


@bundle_app.command("show")
def bundle_show(
    path: Path = typer.Argument(..., help="A Triton cache entry or root, or a dump entry or root."),
    level: str = typer.Option(None, "--level", "-l", help="Print this level (binary levels are disassembled)."),
    kernel: str = typer.Option(None, "--kernel", "-k", help="Only the kernel with this name."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Show kernels at every level: metadata, signature, ABI, levels and resources."""
    from kstrata.ir.triton_layout import load_any

    bundles, errors = load_any(path)
    if kernel:
        bundles = [b for b in bundles if b.name == kernel]
        if not bundles:
            _fail(f"{path}: no kernel named {kernel!r}")
    for e in errors:
        err.print(f"[yellow]skipped:[/] {e}", highlight=False)
    if level:
        for b in bundles:
            art = b.level(level)
            text = _disassemble(b, level) if isinstance(art, bytes) else art
            if as_json:
                _emit_json({"name": b.name, "target": str(b.target), "level": level, "text": text})
            else:
                sys.stdout.write(text if text.endswith("\n") else text + "\n")
        return
    summaries = []
    for b in bundles:
        s = b.summary()
        s["resources"] = _resources(b)
        summaries.append(s)
    if as_json:
        _emit_json({"bundles": summaries, "errors": [str(e) for e in errors]})
    else:
        for s in summaries:
            _print_bundle(s)
    if errors:
        raise typer.Exit(1)


def _print_bundle(s: dict[str, Any]) -> None:
    out.print(f"[bold]{s['name']}[/]  {s['target']}  warps={s['num_warps']} stages={s['num_stages']} "
              f"shared={s['shared']}  [dim]{s['origin']}[/]", highlight=False)
    sig = ", ".join(f"{k}: {v}" for k, v in s["signature"].items())
    out.print(f"  signature: ({sig})", highlight=False)
    table = Table(show_header=True, box=None, padding=(0, 2))
    for col in ("level", "bytes", "lines", "sha256"):
        table.add_column(col)
    for lv, info in s["levels"].items():
        table.add_row(lv, str(info["bytes"]), "" if info["lines"] is None else str(info["lines"]), info["sha256"][:16])
    out.print(table)
    r = s.get("resources") or {}
    if "error" in r:
        out.print(f"  resources: unavailable ({r['error']})", highlight=False)
    elif r:
        keys = [k for k in ("registers", "sgprs", "agprs", "shared_bytes", "local_bytes", "stack_bytes", "vgpr_spills",
                            "sgpr_spills") if r.get(k) is not None]
        out.print("  resources: " + " ".join(f"{k}={r[k]}" for k in keys) + f"  [dim]({r['source']})[/]", highlight=False)
    for note in s["notes"]:
        out.print(f"  [dim]note: {note}[/]", highlight=False)
    out.print()


# ---------------------------------------------------------------------------------------------------
# doctor
# ---------------------------------------------------------------------------------------------------
@app.command()
def doctor(as_json: bool = typer.Option(False, "--json", help="Machine-readable output.")) -> None:
    """Which tools and versions were found, whether a GPU is present, and what can run here."""
    from kstrata.tools.doctor import diagnose

    report = diagnose()
    if as_json:
        _emit_json(report)
    else:
        table = Table(title="kstrata doctor")
        for col in ("component", "status", "detail"):
            table.add_column(col)
        for row in report["components"]:
            table.add_row(row["name"], "[green]ok[/]" if row["ok"] else "[red]missing[/]", row["detail"])
        out.print(table)
        cap = Table(title="what can run here")
        cap.add_column("capability")
        cap.add_column("")
        cap.add_column("why")
        for row in report["capabilities"]:
            cap.add_row(row["name"], "[green]yes[/]" if row["ok"] else "[yellow]no[/]", row["why"])
        out.print(cap)
    if not report["ok"]:
        raise typer.Exit(1)


def main() -> None:
    """Entry point: run the app, turning kstrata's user errors into one line and exit code 2."""
    try:
        app()
    except KstrataError as exc:
        err.print(f"[bold red]error:[/] {exc}", highlight=False, markup=True, soft_wrap=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
