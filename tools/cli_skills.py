"""`kstrata skills`: the verified skill library (list, show, search, add, remove, export).

`skills_app` is a typer sub-app; `kstrata.tools.cli` mounts it as `skills`. Every command takes `--dir`
(the writable library; default `KSTRATA_SKILLS_DIR` or `~/.local/share/kstrata/skills`) and `--json`.
Exit codes: 0 done, 2 a user error (a bad skill file, an unknown id, a skill without reproduced evidence).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from kstrata.tools.console import JsonFlag, emit_json, out

skills_app = typer.Typer(help="The verified skill library the LLM proposers retrieve from (BM25).",
                         no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)

DirOpt = Annotated[Path | None, typer.Option("--dir", help="The writable skill library (default: "
                                                        "$KSTRATA_SKILLS_DIR or ~/.local/share/kstrata/skills).")]


def _library(directory: Path | None):  # type: ignore[no-untyped-def]
    from kstrata.agents.skills import SkillLibrary

    return SkillLibrary(directory)


@skills_app.command("list")
def skills_list(directory: DirOpt = None, as_json: JsonFlag = False) -> None:
    """Every skill: id, title, spaces, best verified speedup, where it comes from."""
    lib = _library(directory)
    rows = [{"id": s.id, "title": s.title, "spaces": list(s.applies.spaces), "best_speedup": s.best_speedup(),
             "reproduced": any(e.reproduced for e in s.evidence), "origin": origin, "source": s.source}
            for s, origin in lib.load()]
    if as_json:
        emit_json({"library": str(lib.root), "skills": rows})
        return
    if not rows:
        out.print(f"no skills yet (library: {lib.root}; the shipped seeds are missing or turned off)",
                  highlight=False)
        return
    table = Table(title=f"{len(rows)} skills ({lib.root})")
    for col in ("id", "title", "spaces", "best", "origin"):
        table.add_column(col)
    for r in rows:
        best = f"{r['best_speedup']:.3f}x" if r["best_speedup"] else "-"
        table.add_row(r["id"], r["title"], ", ".join(r["spaces"]), best, r["origin"])
    out.print(table)


@skills_app.command("show")
def skills_show(skill_id: Annotated[str, typer.Argument(help="The skill's id.")], directory: DirOpt = None,
                as_json: JsonFlag = False) -> None:
    """One skill in full: when it applies, how, the example and the evidence."""
    skill = _library(directory).get(skill_id)
    if as_json:
        emit_json(skill.to_json())
        return
    out.print(skill.render(), highlight=False, markup=False)


@skills_app.command("search")
def skills_search(query: Annotated[str, typer.Argument(help="Words about the task and its findings.")],
                  k: Annotated[int, typer.Option("--k", help="How many skills.")] = 5,
                  space: Annotated[str | None, typer.Option("--space", help="Only skills for this space.")] = None,
                  directory: DirOpt = None, as_json: JsonFlag = False) -> None:
    """BM25 retrieval over the library, as the LLM proposers use it."""
    hits = _library(directory).search_hits(query, k, space=space)
    if as_json:
        emit_json({"query": query, "hits": [{"id": h.skill.id, "title": h.skill.title, "score": h.score,
                                             "origin": h.origin} for h in hits]})
        return
    if not hits:
        out.print("no skill matches", highlight=False)
    for h in hits:
        out.print(f"{h.score:7.3f}  {h.skill.id}  {h.skill.title}", highlight=False, markup=False)


@skills_app.command("add")
def skills_add(file: Annotated[Path, typer.Argument(help="A skill file (kstrata.skill/1 JSON).")],
               directory: DirOpt = None, as_json: JsonFlag = False) -> None:
    """Add a skill file; only one whose evidence records a reproduction (fresh process, other inputs)."""
    from kstrata.agents.skills import read_skill

    skill = read_skill(file)
    path = _library(directory).add(skill)
    if as_json:
        emit_json({"added": skill.id, "path": str(path)})
    else:
        out.print(f"added {skill.id} -> {path}", highlight=False)


@skills_app.command("remove")
def skills_remove(skill_id: Annotated[str, typer.Argument(help="The skill's id.")], directory: DirOpt = None,
                  as_json: JsonFlag = False) -> None:
    """Remove a skill from the writable library (shipped seeds cannot be removed)."""
    path = _library(directory).remove(skill_id)
    if as_json:
        emit_json({"removed": skill_id, "path": str(path)})
    else:
        out.print(f"removed {skill_id} ({path})", highlight=False)


@skills_app.command("export")
def skills_export(out_file: Annotated[Path, typer.Argument(help="Where to write the JSON bundle.")],
                  directory: DirOpt = None, as_json: JsonFlag = False) -> None:
    """Write every skill (seeds and the library) into one JSON file."""
    n = _library(directory).export(out_file)
    if as_json:
        emit_json({"exported": n, "path": str(out_file)})
    else:
        out.print(f"exported {n} skills -> {out_file}", highlight=False)
