"""Build a planted case's original and candidate bundles, and run `kstrata verify` on them.

The original is the suite kernel compiled for the case's target (once per process). The candidate is
the original with the case's level edited (or the case's pass pipeline run) and every lower level
rebuilt with the project's rebuild (`backends.rebuild.rebuild_from`, the same one the pass runner
uses). The verdict comes from `backends.verify.verify` on the suite kernel's own launch. For AMD
candidates whose AMDGCN changed, verify's static checks include the waitcnt hazard check
(`backends.amd_hazards`).
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kstrata.backends.verify import VerifyReport
from kstrata.ir.bundle import KernelBundle
from kstrata.ir.errors import KstrataError
from kstrata.ir.launch import LaunchRecord
from kstrata.ir.target import Target

from .spec import PlantedCase

_ORIGINALS: dict[tuple[str, str], KernelBundle] = {}
_CACHE_DIR: list[Path] = []


def _cache_dir() -> Path:
    """A directory for the process's original bundles (Triton cache layout) and input snapshots,
    removed when the process exits."""
    if not _CACHE_DIR:
        path = Path(tempfile.mkdtemp(prefix="kstrata-planted-"))
        atexit.register(shutil.rmtree, path, ignore_errors=True)
        _CACHE_DIR.append(path)
    return _CACHE_DIR[0]


def original_bundle(case: PlantedCase) -> KernelBundle:
    """The suite kernel of `case` compiled for its target (built once per process)."""
    from kstrata.testsuite.kernels import get_kernel
    from kstrata.testsuite.kernels.build import bundle_for

    key = (case.kernel, case.target)
    if key not in _ORIGINALS:
        _ORIGINALS[key] = bundle_for(get_kernel(case.kernel), Target.parse(case.target), _cache_dir())
    return _ORIGINALS[key]


def build_candidate(case: PlantedCase, original: KernelBundle | None = None) -> KernelBundle:
    """The candidate of `case`: its level edited (or its pipeline run) and the lower levels rebuilt."""
    from kstrata.backends.rebuild import rebuild_from
    from kstrata.passes.pipeline import parse_pipeline, run_pipeline

    original = original or original_bundle(case)
    if case.pipeline:
        candidate = run_pipeline(original, parse_pipeline(case.pipeline)).bundle
    elif case.stale:  # the level edited, every level below left as the original's
        import dataclasses

        candidate = dataclasses.replace(original, levels={**original.levels,
                                                          case.level: case.apply_edits(original.text(case.level))})
    else:
        candidate = rebuild_from(original, case.level, case.apply_edits(original.text(case.level)))
    if candidate.levels.get(case.level) == original.levels.get(case.level):
        raise KstrataError(f"planted case {case.name}: the candidate's {case.level} is the original's "
                           "(the edit or pass changed nothing)")
    return candidate


def launch_for(case: PlantedCase, snapshot_dir: Path | None = None) -> LaunchRecord:
    """The suite kernel's own launch (`testsuite.kernels.launch`), with snapshots of its inputs in
    `snapshot_dir` when given."""
    from kstrata.testsuite.kernels import get_kernel
    from kstrata.testsuite.kernels.launch import suite_launch_record

    record = suite_launch_record(get_kernel(case.kernel), case.target, seed=0,
                                 snapshot_dir=None if case.large_rows else snapshot_dir)
    return record if case.large_rows is None else with_rows(record, case.large_rows)


def with_rows(record: LaunchRecord, rows: int) -> LaunchRecord:
    """A row-wise kernel's launch (one program per row, row-major tensors) with `rows` rows."""
    import dataclasses

    from kstrata.ir.launch import TensorArg

    n_rows = record.grid[0]
    args = []
    for arg in record.args:
        if isinstance(arg, TensorArg) and arg.shape and arg.shape[0] == n_rows:
            shape = (rows, *arg.shape[1:])
            numel = 1
            for d in shape:
                numel *= d
            arg = dataclasses.replace(arg, shape=shape, storage_numel=numel, snapshot=None)
        args.append(arg)
    return dataclasses.replace(record, grid=(rows, record.grid[1], record.grid[2]), args=tuple(args))


def verify_candidate(original: KernelBundle, candidate: KernelBundle, launch: LaunchRecord, device: str,
                     seeds: int = 2, launch_dir: Path | None = None, sanitizer: str | None = None) -> VerifyReport:
    """`kstrata verify` on the pair."""
    from kstrata.backends.verify import verify

    return verify(original, candidate, launch, device=device, seeds=seeds, launch_dir=launch_dir, sanitizer=sanitizer)


@dataclass
class CaseResult:
    """The outcome of one planted case on one device."""

    name: str
    kernel: str
    target: str
    level: str
    kind: str
    expected: str  # "reject" or "accept"
    visible_on: str
    device: str
    #: "reject", "accept", "unproven" (only static evidence here) or "error" (not built or not verified)
    verdict: str = "error"
    rebuilt_levels: list[str] = field(default_factory=list)
    failed_checks: list[str] = field(default_factory=list)
    checks: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.verdict == self.expected

    def to_json(self) -> dict[str, Any]:
        return {**self.__dict__, "ok": self.ok}


def run_case(case: PlantedCase, device: str = "cpu", seeds: int = 2, snapshots: bool = False) -> CaseResult:
    """Build `case` and verify it on `device` ("cpu" or "cuda") with `seeds` random input sets (and
    the suite's own inputs as a recorded snapshot with `snapshots=True`)."""
    result = CaseResult(case.name, case.kernel, case.target, case.level, case.kind, case.expected,
                        case.visible_on, device)
    start = time.perf_counter()
    try:
        original = original_bundle(case)
        candidate = build_candidate(case, original)
        launch_dir = _cache_dir() / "launches" if snapshots else None
        sanitizer = (case.gpu_sanitizer or "auto") if device == "cuda" else None
        seeds = 1 if case.large_rows else seeds
        report = verify_candidate(original, candidate, launch_for(case, launch_dir), device, seeds, launch_dir,
                                  sanitizer)
        result.checks = [dict(c.__dict__) for c in report.checks]
        result.failed_checks = [f"{c.name}@{c.level}" for c in report.checks if c.verdict == "fail"]
        result.verdict = {"equivalent": "accept", "different": "reject", "unproven": "unproven"}[report.verdict.value]
        result.rebuilt_levels = list(report.rebuilt_levels)
    except Exception as exc:  # a case that cannot be built is reported, the run goes on
        result.error = f"{type(exc).__name__}: {exc}"
        if not isinstance(exc, KstrataError):
            result.error += "\n" + traceback.format_exc(limit=4)
    result.seconds = round(time.perf_counter() - start, 2)
    return result
