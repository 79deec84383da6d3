"""What the assembly-level passes find on a Triton cache (no GPU needed): per pass and kernel, whether it
changes the kernel, how much, whether the rebuilt machine code differs (SASS from ptxas + cuobjdump for
PTX passes; the `s_waitcnt` hazard check and a relink for AMDGCN ones), and how long the pass took.

    python -m kstrata.tools.asm_pass_survey CACHE_DIR [--results testsuite/results] [--only NAME ...]

`CACHE_DIR` is a cache `kstrata suite build --target cuda:90 --target hip:gfx942 --cache-dir DIR` made (or
any Triton cache). Prints a table and writes `asm-pass-survey-<date>.{json,md}` under `--results`.
"""

from __future__ import annotations

import datetime as _dt
import json
import platform
import re
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer

PTX_PIPELINES = ("ptx-reorder{strategy=hoist-loads scope=hot}", "ptx-reorder{strategy=sink-stores scope=hot}",
                 "redundant-cvt", "ptx-predicate{max_instructions=8 scope=all}")
AMD_PIPELINES = ("amdgcn-reorder{strategy=hoist-loads scope=hot}", "amdgcn-reorder{strategy=sink-stores scope=hot}",
                 "amdgcn-reorder{strategy=sink-waits scope=hot}")


def _sass(cubin: bytes) -> str:
    from kstrata.backends.nvidia import sass

    return re.sub(r"/\*[0-9a-f]{4,}\*/", "", sass(cubin))


def _row(bundle: Any, spec: str) -> dict[str, Any]:
    from kstrata.backends.amd_hazards import new_waitcnt_hazards
    from kstrata.passes.pipeline import parse_pipeline, run_pipeline

    level = "ptx" if bundle.target.backend == "cuda" else "amdgcn"
    row: dict[str, Any] = {"kernel": bundle.name, "target": str(bundle.target), "pass": spec}
    t0 = time.perf_counter()
    try:
        outcome = run_pipeline(bundle, parse_pipeline(f"{level}({spec})"))
    except Exception as exc:  # reported per row; the survey goes on
        row.update(status="error", error=f"{type(exc).__name__}: {exc}")
        return row
    row["seconds"] = round(time.perf_counter() - t0, 3)
    record = outcome.records[0]
    row.update(status=record.status, note="; ".join(record.notes) if record.notes else record.reason)
    if not outcome.changed:
        return row
    new = outcome.bundle
    if level == "ptx":
        before, after = bundle.level("cubin"), new.level("cubin")
        assert isinstance(before, bytes) and isinstance(after, bytes)
        row["machine_code_differs"] = _sass(after) != _sass(before)
    else:
        row["new_hazards"] = len(new_waitcnt_hazards(bundle.text("amdgcn"), new.text("amdgcn")))
        row["machine_code_differs"] = new.level("hsaco") != bundle.level("hsaco")
    return row


def command(
    cache_dir: Annotated[Path, typer.Argument(help="A Triton cache (kstrata suite build ... --cache-dir DIR).")],
    results: Annotated[Path, typer.Option("--results", help="Where the dated results go.")] = Path("testsuite/results"),
    only: Annotated[list[str] | None, typer.Option("--only", help="Only kernels with these names.")] = None,
) -> int:
    import triton

    from kstrata.ir.triton_layout import load_cache_root

    bundles, errors = load_cache_root(cache_dir)
    bundles = [b for b in bundles if not only or b.name in only]
    rows = []
    for b in sorted(bundles, key=lambda b: (str(b.target), b.name)):
        for spec in PTX_PIPELINES if b.target.backend == "cuda" else AMD_PIPELINES:
            rows.append(_row(b, spec))
            print(json.dumps({k: rows[-1].get(k) for k in ("kernel", "target", "pass", "status", "machine_code_differs")}),
                  flush=True)
    env = {"date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), "device": "cpu (static)",
           "machine": platform.machine(), "python": platform.python_version(), "triton": triton.__version__}
    summary: dict[str, dict[str, Any]] = {}
    for r in rows:
        key = f"{r['target']} {r['pass']}"
        s = summary.setdefault(key, {"kernels": 0, "changed": 0, "machine_code_differs": 0, "errors": 0,
                                     "new_hazards": 0, "seconds": 0.0})
        s["kernels"] += 1
        s["changed"] += r.get("status") == "changed"
        s["machine_code_differs"] += bool(r.get("machine_code_differs"))
        s["errors"] += r.get("status") == "error"
        s["new_hazards"] += int(r.get("new_hazards") or 0)
        s["seconds"] += float(r.get("seconds") or 0.0)
    results.mkdir(parents=True, exist_ok=True)
    stem = f"asm-pass-survey-{env['date'][:10]}"
    payload = {"schema": "kstrata.asm-pass-survey/1", "environment": env, "cache": str(cache_dir),
               "load_errors": [str(e) for e in errors], "summary": summary, "rows": rows}
    (results / f"{stem}.json").write_text(json.dumps(payload, indent=1, default=str) + "\n")
    lines = [f"# Assembly passes on {cache_dir.name} (static, no GPU)", "",
             f"{env['date']} · Triton {env['triton']} · Python {env['python']}", "",
             "| target and pass | kernels | changed | machine code differs | new s_waitcnt hazards | errors | pass time s |",
             "|---|---|---|---|---|---|---|"]
    for key, s in summary.items():
        lines.append(f"| `{key}` | {s['kernels']} | {s['changed']} | {s['machine_code_differs']} | {s['new_hazards']} "
                     f"| {s['errors']} | {s['seconds']:.1f} |")
    (results / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if not any(s["errors"] or s["new_hazards"] for s in summary.values()) else 1


def main(argv: list[str] | None = None) -> int:
    from kstrata.tools.console import run_command

    return run_command(command, argv, help=__doc__)


if __name__ == "__main__":
    sys.exit(main())
