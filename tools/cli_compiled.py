"""`kstrata optimize CACHE_DIR --launches RECORDS`: the compiled-kernel optimizer's command line
(kstrata.agents.compiled); `kstrata optimize` sends a Triton cache directory here.

Exit codes: 0 the run finished (whether or not a kernel got faster: the report says); 2 a user error
(no such directory, an output inside the cache, a bad option), one line.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from kstrata.tools.console import emit_json, err, out


def run_compiled(cache_dir: Path, out_dir: Path, launches: Path | None, *, budget: int, minutes: float, device: str,
                 spaces: str, exact: bool, seed: int, jobs: int, engine_cache: Path | None, only: list[str] | None,
                 max_edits: int, timeout: float, as_json: bool) -> None:
    from kstrata.agents.compiled.run import CompiledOptions, optimize_cache
    from kstrata.ir.errors import KstrataError

    if device not in ("", "cuda", "cpu"):
        raise KstrataError(f"--device {device!r}: choose cuda or cpu")
    stream = err if as_json else out

    def progress(msg: str) -> None:
        if stream.is_terminal:
            stream.print(msg, highlight=False, markup=False, soft_wrap=True)
        else:
            print(msg, file=sys.stderr if as_json else sys.stdout, flush=True)

    opts = CompiledOptions(budget=budget, minutes=minutes, device=device, exact=exact,
                           spaces=tuple(s.strip() for s in spaces.split(",") if s.strip()) or None, seed=seed,
                           jobs=jobs, engine_cache=str(engine_cache) if engine_cache else None,
                           only=tuple(only or ()), max_edits=max_edits, timeout_s=timeout, progress=progress)
    report = optimize_cache(cache_dir, launches, out_dir, opts)
    payload: dict[str, Any] = report.to_json()
    if as_json:
        emit_json(payload)
        return
    for k in report.kernels:
        out.print(f"{k['name']} ({k['target']}, share {k['share']:.1%}): " if k.get("share") is not None
                  else f"{k['name']} ({k['target']}): ", end="", highlight=False)
        out.print(k.get("skip") or k.get("result", ""), highlight=False, markup=False)
    for note in report.notes:
        out.print(f"note: {note}", highlight=False, markup=False)
    out.print(f"report: {Path(report.out) / 'optimize-compiled.md'}", highlight=False, markup=False)
