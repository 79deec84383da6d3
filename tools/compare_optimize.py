"""Compare two `kstrata optimize` output directories (kstrata.agents.optimize.compare): exit 0 when every
task's final output was accepted in both and no candidate judged by both got a different verdict.

    python -m kstrata.tools.compare_optimize OUT_A OUT_B [--json]
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)


@app.command()
def main(a: Annotated[Path, typer.Argument()], b: Annotated[Path, typer.Argument()],
         as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    from kstrata.agents.optimize.compare import compare_runs

    for d in (a, b):
        if not d.is_dir():
            typer.echo(f"{d}: no such optimize output directory", err=True)
            raise typer.Exit(2)
    result = compare_runs(a, b)
    if as_json:
        typer.echo(json.dumps(result, indent=1))
    else:
        for name, t in result["tasks"].items():
            if "missing_in" in t:
                typer.echo(f"{name}: missing in {t['missing_in']}")
                continue
            typer.echo(f"{name}: {'identical' if t['identical'] else 'not identical'}; finals accepted "
                       f"{t['finals_accepted']}; {t['judged_by_both']} candidates judged by both, "
                       f"{len(t['verdict_disagreements'])} verdicts differ; only in A {t['only_in_a']}, "
                       f"only in B {t['only_in_b']}")
        typer.echo("verdicts agree" if result["verdicts_agree"] else "VERDICTS DIFFER")
    raise typer.Exit(0 if result["verdicts_agree"] else 1)


if __name__ == "__main__":
    app()
