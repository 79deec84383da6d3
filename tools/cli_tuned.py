"""`kstrata tuned list|show|prune DIR`: the tuned database the torch.compile backend deploys
(`options={"tuned": DIR}`; kstrata.agents.tuned). Exit codes: 0 done; 2 a user error (not a tuned
database, no such record), one line."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from kstrata.tools.console import JsonFlag, emit_json, out

tuned_app = typer.Typer(help="The tuned database: kernels kstrata made faster, deployed by the torch.compile "
                             "backend.", no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)
DirArg = Annotated[Path, typer.Argument(help="A tuned database directory (kstrata optimize CACHE --out OUT: OUT/tuned).")]


@tuned_app.command("list")
def tuned_list(directory: DirArg, as_json: JsonFlag = False) -> None:
    """Every tuned kernel: name, target, the winning edit, its measured speedup, and whether it applies here."""
    from kstrata.agents.tuned import TunedDB, TunedError

    db = TunedDB(directory)
    rows: list[dict[str, Any]] = []
    for d, r in db.records():
        if isinstance(r, TunedError):
            rows.append({"id": d.name, "error": r.message})
            continue
        rows.append({"id": d.name, "kernel": r.kernel, "target": r.target, "edit": r.edit, "speedup": r.speedup,
                     "speedup_range": r.speedup_range, "device": r.device, "measured_at": r.measured_at,
                     "applies_here": db.stale_reason(d, r) is None, "stale": db.stale_reason(d, r)})
    if as_json:
        emit_json({"db": str(db.root), "tuned": rows})
        return
    if not rows:
        out.print(f"no tuned kernels in {db.root}", highlight=False)
        return
    table = Table(title=f"{len(rows)} tuned kernels ({db.root})")
    for col in ("id", "kernel", "target", "edit", "speedup", "applies here"):
        table.add_column(col)
    for row in rows:
        if "error" in row:
            table.add_row(row["id"], "-", "-", "-", "-", f"no: {row['error']}")
        else:
            table.add_row(row["id"], row["kernel"], row["target"], row["edit"], f"{row['speedup']:.3f}x",
                          "yes" if row["applies_here"] else f"no: {row['stale']}")
    out.print(table)


@tuned_app.command("show")
def tuned_show(directory: DirArg, name: Annotated[str, typer.Argument(help="A kernel name or a record id (prefix).")],
               as_json: JsonFlag = False) -> None:
    """One tuned kernel's record: the content digest, versions, edit, verdict and measurement."""
    from kstrata.agents.tuned import TunedDB, TunedError

    db = TunedDB(directory)
    found = db.find(name)
    if not found:
        raise TunedError(f"no tuned kernel named {name!r} (kstrata tuned list {directory})", path=db.root)
    payload = [{"id": d.name, "entry": str(d / "entry"), **r.to_json(), "stale": db.stale_reason(d, r)}
               for d, r in found]
    if as_json:
        emit_json({"db": str(db.root), "tuned": payload})
        return
    for p in payload:
        out.print(f"[bold]{p['id']}[/]", highlight=False)
        for key in ("kernel", "target", "content", "edit", "tolerance", "spaces", "verdict", "speedup",
                    "speedup_range", "time_before_us", "time_after_us", "device", "measured_at", "metadata_changes",
                    "original_binary", "tuned_binary", "entry", "stale"):
            out.print(f"  {key}: {p[key]}", highlight=False, markup=False)
        for key in ("config", "recorded_config"):  # the config deployed, and the one the recorded program ran
            if p.get(key):
                out.print(f"  {key}: {p[key].get('words', p[key])}", highlight=False, markup=False)
        if p.get("speedup_vs_recorded"):
            out.print(f"  speedup_vs_recorded: {p['speedup_vs_recorded']}", highlight=False, markup=False)


@tuned_app.command("prune")
def tuned_prune(directory: DirArg, dry_run: Annotated[bool, typer.Option("--dry-run", help="Say what would go.")] = False,
                as_json: JsonFlag = False) -> None:
    """Remove records that can never apply here: unreadable, made with other tool versions, or damaged."""
    from kstrata.agents.tuned import TunedDB

    gone = TunedDB(directory).prune(dry_run=dry_run)
    if as_json:
        emit_json({"db": str(directory), "dry_run": dry_run, "removed": [{"id": i, "why": w} for i, w in gone]})
        return
    for i, why in gone:
        out.print(f"{'would remove' if dry_run else 'removed'} {i}: {why}", highlight=False, markup=False)
    out.print(f"{len(gone)} {'would be ' if dry_run else ''}removed", highlight=False)
