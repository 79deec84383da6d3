"""Run the GPU tests one pytest process per test, each under its own time limit, and say each outcome as it ends.

    python -m kstrata.tools.gpu_tests [--per-test-s 150] [--slow-test-s 480] [--marker gpu] [--log FILE] [--json]
        TEST_FILE ...

One pytest session for every GPU test loses what matters on a machine reached a command at a time: pytest
prints a failure's traceback only when the session ends, so a session killed at its limit brings back the
names of its failures and not why (the H200, 2026-12-03: `test_optimize_ir` FAILED with no message), and one
hanging test takes the limit of all the tests after it (`test_compiled_window`'s Nsight Compute test ran
past 200 s there). Here each test is collected first (`--collect-only -m MARKER`), then run alone in its own
process group under `--per-test-s` (`--slow-test-s` for those also marked `slow`, such as a task optimized for
minutes), killed with everything it started when it runs past it; its outcome,
seconds and, for a failure, the end of its short traceback are printed (and appended to `--log`) the moment it
ends. Exit 0 when every test passed or was skipped, 1 otherwise, 2 for bad arguments.
"""

from __future__ import annotations

import json
import re
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated

import typer

from kstrata.backends.child import run_child

#: pytest's summary line of a one-test session: "1 passed in 3.2s", "1 failed, 2 warnings in ...".
_SUMMARY = re.compile(r"=+ .*?\b(\d+ (passed|failed|skipped|error|errors|xfailed|xpassed|deselected))\b.* in [\d.]+s")
#: Lines of a failure kept in the log and the JSON (the end of pytest's short traceback).
FAILURE_LINES = 40


@dataclass(frozen=True)
class TestOutcome:
    test: str
    outcome: str  # passed, failed, skipped, error, timeout, crashed
    seconds: float
    detail: str = ""


def collect(files: list[str], marker: str, *, python: str = sys.executable, timeout: float = 300.0) -> list[str]:
    """The node ids of the tests in `files` that carry `marker`; raises SystemExit with pytest's words when
    collection fails."""
    r = run_child([python, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-m", marker, *files],
                  timeout=timeout)
    ids = [ln.strip() for ln in r.stdout.splitlines() if "::" in ln and not ln.startswith(("=", " "))]
    if not r.ok and r.returncode != 5:  # 5: nothing collected
        raise SystemExit(f"error: collecting {' '.join(files)} failed: {r.reason()}\n{r.stdout[-2000:]}")
    return ids


def outcome_of(returncode: int | None, status: str, output: str) -> str:
    """One test's outcome from its pytest process: its summary line, else its exit status."""
    if status == "timeout":
        return "timeout"
    if status == "crashed":
        return "crashed"
    found = list(_SUMMARY.finditer(output))
    if found:
        m = found[-1]
        words = m.group(0)
        for kind in ("failed", "error", "passed", "skipped", "xfailed", "xpassed"):
            if re.search(rf"\b\d+ {kind}", words):
                return {"xfailed": "skipped", "xpassed": "passed"}.get(kind, kind)
    return "passed" if returncode == 0 else "failed"


def run_one(test: str, per_test_s: float, *, python: str = sys.executable) -> TestOutcome:
    r = run_child([python, "-m", "pytest", "-q", "-rfEs", "--tb=short", "-p", "no:cacheprovider", test],
                  timeout=per_test_s)
    text = r.stdout + r.stderr
    kind = outcome_of(r.returncode, r.status, text)
    detail = ""
    if kind not in ("passed",):
        lines = [ln for ln in text.splitlines() if ln.strip()]
        detail = "\n".join(lines[-FAILURE_LINES:]) if kind != "skipped" else next(
            (ln for ln in lines if ln.startswith("SKIPPED")), "")
        if kind == "timeout":
            detail = f"ran past {per_test_s:g} s and was killed with everything it started\n" + detail
    return TestOutcome(test, kind, round(r.seconds, 1), detail)


def main(
    files: Annotated[list[str], typer.Argument(help="Test files (or node ids) to take the marked tests from.")],
    per_test_s: Annotated[float, typer.Option("--per-test-s", help="Time limit of each test's process.")] = 150.0,
    slow_test_s: Annotated[float, typer.Option("--slow-test-s", help="... of a test also marked slow.")] = 480.0,
    marker: Annotated[str, typer.Option("--marker", help="The pytest marker that selects the tests.")] = "gpu",
    log: Annotated[Path | None, typer.Option("--log", help="Append each outcome and failure here too.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="The outcomes as JSON on stdout at the end.")] = False,
) -> None:
    if per_test_s <= 0 or slow_test_s <= 0:
        print("error: --per-test-s and --slow-test-s must be positive", file=sys.stderr)
        raise SystemExit(2)
    missing = [f for f in files if not Path(f.split("::")[0]).exists()]
    if missing:
        print(f"error: no such test file: {missing[0]}", file=sys.stderr)
        raise SystemExit(2)
    tests = collect(files, marker)
    slow = set(collect(files, f"({marker}) and slow"))
    def say(text: str) -> None:  # with --json, stdout holds the JSON alone
        print(text, file=sys.stderr if as_json else sys.stdout, flush=True)

    say(f"{len(tests)} tests marked {marker!r} in {len(files)} files, one process each, {per_test_s:g} s each at most")
    outcomes: list[TestOutcome] = []
    start = time.monotonic()
    for t in tests:
        o = run_one(t, slow_test_s if t in slow else per_test_s)
        outcomes.append(o)
        line = f"{o.outcome.upper():8} {o.seconds:7.1f} s  {o.test}"
        say(line)
        if o.detail and o.outcome != "passed":
            say("    " + o.detail.replace("\n", "\n    "))
        if log is not None:
            with log.open("a") as f:
                f.write(line + "\n" + (("    " + o.detail.replace("\n", "\n    ") + "\n") if o.detail else ""))
    counts: dict[str, int] = {}
    for o in outcomes:
        counts[o.outcome] = counts.get(o.outcome, 0) + 1
    say(f"{', '.join(f'{n} {k}' for k, n in sorted(counts.items())) or 'no tests'} in {time.monotonic() - start:.0f} s")
    if as_json:
        print(json.dumps({"tests": [asdict(o) for o in outcomes], "counts": counts}, indent=1))
    raise SystemExit(0 if all(o.outcome in ("passed", "skipped") for o in outcomes) else 1)


def cli() -> None:
    typer.run(main)


if __name__ == "__main__":
    cli()
