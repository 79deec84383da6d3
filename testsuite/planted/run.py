"""Run the planted cases through `kstrata verify` and report what was caught where.

    python -m kstrata.testsuite.planted.run [--device cpu|cuda] [--only NAME ...] [--json] [--results DIR]

Every case is built (its level edited or its passes run, lower levels rebuilt) and verified on the
device: `cpu` runs the static checks and the CPU interpreter, `cuda` adds the GPU differential run.
The report gives, per case, the expected and actual verdict (`unproven` where the device has no
dynamic check for the level) and the names of the checks that failed;
per level, the rejection rate of the wrong candidates and the acceptance of the correct ones; and the
wrong candidates only a GPU run catches (rejected, with every failed check a GPU check). With
`--results DIR`, a dated JSON and markdown file (device, versions, date) are written there. The exit
status is 0 when every case got its expected verdict among those the device can decide (wrong cases
declared for a GPU the device lacks are listed, not counted as failures).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import platform
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from .candidate import CaseResult, run_case
from .cases import CASES
from .spec import LEVELS, PlantedCase

#: Checks that run the candidate on an NVIDIA GPU.
GPU_CHECKS = ("differential", "determinism", "compute-sanitizer")


def decidable(case: PlantedCase, device: str) -> bool:
    """Whether a run on `device` is expected to give the case its verdict. Elsewhere the right verdict
    is `unproven`: a correct rewrite is accepted only with dynamic evidence (the interpreter for TTIR and
    TTGIR, an NVIDIA GPU run below them; an AMD one for AMDGCN, which the project has not), and a wrong
    case declared for a GPU must not be caught by the cheaper checkers."""
    if case.correct:
        return case.visible_on == "cpu" or (case.visible_on == "gpu" and device == "cuda")
    return case.visible_on in ("static", "cpu") or (case.visible_on == "gpu" and device == "cuda")


def expected_here(case: PlantedCase, device: str) -> str:
    """The verdict a run on `device` must give the case."""
    return case.expected if decidable(case, device) else "unproven"


def caught_only_by_gpu(result: CaseResult) -> bool:
    failed = [c for c in result.checks if c["verdict"] == "fail"]
    return result.verdict == "reject" and bool(failed) and all(c["name"].startswith(GPU_CHECKS) for c in failed)


def summarize(results: list[CaseResult], device: str) -> dict[str, Any]:
    """Per-level rejection and acceptance rates, the GPU-only catches and the unexpected verdicts."""
    by_name = {c.name: c for c in CASES}
    levels: dict[str, dict[str, Any]] = {}
    for level in LEVELS:
        wrong = [r for r in results if r.level == level and r.expected == "reject"]
        right = [r for r in results if r.level == level and r.expected == "accept"]
        if not wrong and not right:
            continue
        rejected = sum(r.verdict == "reject" for r in wrong)
        levels[level] = {"wrong": len(wrong), "rejected": rejected,
                         "rejection_rate": round(rejected / len(wrong), 3) if wrong else None,
                         "correct": len(right), "accepted": sum(r.verdict == "accept" for r in right)}
    # a case that could not be built or verified is unexpected on any device
    unexpected = [r.name for r in results if r.verdict != expected_here(by_name[r.name], device)]
    undecided = [r.name for r in results if r.name not in unexpected and not r.ok]
    return {
        "levels": levels,
        "gpu_only": [r.name for r in results if caught_only_by_gpu(r)],
        "declared_gpu_only": [r.name for r in results if by_name[r.name].visible_on == "gpu" and r.expected == "reject"],
        "declared_amd_gpu_only": [r.name for r in results
                                  if by_name[r.name].visible_on == "amd-gpu" and r.expected == "reject"],
        "unexpected": unexpected,
        "undecided_here": undecided,
        "errors": [r.name for r in results if r.verdict == "error"],
    }


def _environment(device: str) -> dict[str, Any]:
    import torch
    import triton

    env: dict[str, Any] = {"date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                           "python": platform.python_version(), "torch": torch.__version__,
                           "triton": triton.__version__, "host": platform.node()}
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10,
                              check=False, cwd=Path(__file__).resolve().parents[2]).stdout.strip()
        env["kstrata_commit"] = head or None
    except OSError:
        env["kstrata_commit"] = None
    if device == "cuda":
        env["device"] = torch.cuda.get_device_name()
        env["cuda"] = torch.version.cuda
    else:
        env["device"] = "CPU (static checks + Triton-IR interpreter)"
    return env


def write_results(results: list[CaseResult], summary: dict[str, Any], env: dict[str, Any], device: str,
                  directory: Path) -> Path:
    """`planted-<device>-<date>.json` and `.md` under `directory`; returns the JSON path."""
    directory.mkdir(parents=True, exist_ok=True)
    stem = f"planted-{'gpu' if device == 'cuda' else 'cpu'}-{env['date'][:10]}"
    payload = {"schema": "kstrata.planted/1", "environment": env, "summary": summary,
               "cases": [r.to_json() for r in results]}
    json_path = directory / f"{stem}.json"
    json_path.write_text(json.dumps(payload, indent=2) + "\n")
    by_name = {c.name: c for c in CASES}
    lines = [f"# Planted bugs on {env['device']}", "",
             f"{env['date']} · torch {env['torch']} · triton {env['triton']}"
             + (f" · CUDA {env['cuda']}" if "cuda" in env else "") + f" · kstrata {env.get('kstrata_commit')}", "",
             "## Per level", "", "| level | wrong | rejected | rejection rate | correct | accepted |",
             "|---|---|---|---|---|---|"]
    for level, row in summary["levels"].items():
        rate = "" if row["rejection_rate"] is None else f"{100 * row['rejection_rate']:.0f}%"
        lines.append(f"| {level} | {row['wrong']} | {row['rejected']} | {rate} | {row['correct']} | {row['accepted']} |")
    lines += ["", "## Caught only by the GPU run", ""]
    lines += [f"- {n}: {by_name[n].description}" for n in summary["gpu_only"]] or \
        ["- none on this device" + (" (no GPU run)" if device != "cuda" else "")]
    lines += ["", "Declared for the NVIDIA GPU run (the static checks and the CPU interpreter accept them): "
              + (", ".join(summary["declared_gpu_only"]) or "none"), "",
              "Declared for an AMD GPU run, which no machine of the project has (the static checks accept them): "
              + (", ".join(summary["declared_amd_gpu_only"]) or "none"), ""]
    if summary["unexpected"]:
        lines += [f"**Unexpected verdicts: {', '.join(summary['unexpected'])}**", ""]
    lines += ["## Cases", "", "| case | level | kind | expected | visible on | verdict | failed checks | s |",
              "|---|---|---|---|---|---|---|---|"]
    for r in results:
        failed = _failed_text(r)
        here = expected_here(by_name[r.name], device)
        mark = "" if r.ok else " ✗" if r.verdict != here else \
            " (needs an AMD GPU)" if r.target.startswith("hip") else " (needs an NVIDIA GPU)"
        lines.append(f"| {r.name} | {r.level} | {r.kind} | {r.expected} | {r.visible_on} | {r.verdict}{mark} | "
                     f"{failed.replace('|', '/')} | {r.seconds:.1f} |")
    (directory / f"{stem}.md").write_text("\n".join(lines) + "\n")
    return json_path


def _failed_text(r: CaseResult) -> str:
    if r.failed_checks:
        return ", ".join(r.failed_checks)
    return r.error.splitlines()[0] if r.error else ""


def _run(args: tuple[PlantedCase, str, int, bool]) -> CaseResult:
    return run_case(*args)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--only", nargs="*", default=None, help="case names (default: all)")
    parser.add_argument("--seeds", type=int, default=2, help="random input sets per dynamic check")
    parser.add_argument("--no-snapshots", action="store_true", help="do not replay the suite's own inputs")
    parser.add_argument("--jobs", type=int, default=1, help="cases verified in parallel")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--results", type=Path, default=None, help="write dated results files here")
    ns = parser.parse_args(argv)

    cases = list(CASES)
    if ns.only:
        unknown = set(ns.only) - {c.name for c in cases}
        if unknown:
            print(f"error: unknown planted cases: {', '.join(sorted(unknown))}", file=sys.stderr)
            return 2
        cases = [c for c in cases if c.name in ns.only]
    if ns.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print("error: --device cuda asked for, but torch sees no GPU", file=sys.stderr)
            return 2
    jobs = [(c, ns.device, ns.seeds, not ns.no_snapshots) for c in cases]
    results: list[CaseResult] = []
    by_name = {c.name: c for c in cases}

    def report(result: CaseResult) -> None:
        results.append(result)
        if not ns.json:
            here = expected_here(by_name[result.name], ns.device)
            mark = "ok  " if result.verdict == here else "MISS" if here != "unproven" else "gpu?"
            print(f"{mark} {result.name:30s} {result.level:6s} expected {result.expected:6s} got "
                  f"{result.verdict:6s} {result.seconds:6.1f}s  {_failed_text(result)}", flush=True)

    if ns.jobs > 1:
        with ProcessPoolExecutor(max_workers=ns.jobs) as pool:
            for result in pool.map(_run, jobs):
                report(result)
    else:
        for job in jobs:
            report(_run(job))
    summary = summarize(results, ns.device)
    env = _environment(ns.device)
    if ns.results:
        path = write_results(results, summary, env, ns.device, ns.results)
        if not ns.json:
            print(f"results: {path}")
    if ns.json:
        print(json.dumps({"environment": env, "summary": summary, "cases": [r.to_json() for r in results]}, indent=2))
    else:
        for level, row in summary["levels"].items():
            rate = "-" if row["rejection_rate"] is None else f"{100 * row['rejection_rate']:.0f}%"
            print(f"{level:6s} rejected {row['rejected']}/{row['wrong']} ({rate}), accepted "
                  f"{row['accepted']}/{row['correct']} correct")
        print("caught only by the GPU run: " + (", ".join(summary["gpu_only"]) or "none"))
        for kind, title in (("gpu", "an NVIDIA GPU run"), ("amd-gpu", "an AMD GPU run (none in the project)")):
            names = [n for n in summary["undecided_here"] if by_name[n].visible_on == kind]
            if names:
                print(f"needs {title} to decide: " + ", ".join(names))
        if summary["unexpected"]:
            print("UNEXPECTED: " + ", ".join(summary["unexpected"]))
    return 1 if summary["unexpected"] else 0


if __name__ == "__main__":
    sys.exit(main())
