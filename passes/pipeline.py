"""Pipelines: `ttir(a,b{x=1 y=2}),ttgir(c),llir(d),ptx(e),amdgcn(f)` parsed, and run on a bundle.

Running a pipeline: passes run in order, each on the text of its level as the previous passes left it.
After every pass that changed something the level's verifier runs; a pass that fails (raises, or
leaves IR that does not verify) is reported with a reproducer directory (the IR before the pass, the
pipeline and the pass options). After each level group that changed something, every level below it
is rebuilt with Triton's stages, so later groups see the kernel as it now is.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import re
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kstrata.ir.bundle import KernelBundle
from kstrata.ir.errors import KstrataError
from kstrata.ir.tolerance import Tolerance

if TYPE_CHECKING:
    from kstrata.ir.triton_ir import TritonModule

from .base import PASS_LEVELS, KernelPass, PassContext, PassError
from .registry import get_pass


class PipelineSyntaxError(PassError):
    """A pipeline string that cannot be read; says at which column."""

    def __init__(self, spec: str, column: int, message: str, *, caret: bool = True) -> None:
        self.spec = spec
        self.column = column
        # a syntax error shows where it is; a pass or option error names the pass, on one line
        where = f"\n  {spec}\n  {' ' * column}^" if caret else ""
        super().__init__(f"pipeline:1:{column + 1}: {message}{where}")


@dataclass(frozen=True)
class PipelineStage:
    level: str
    passes: tuple[KernelPass, ...]


@dataclass(frozen=True)
class Pipeline:
    stages: tuple[PipelineStage, ...]

    def spelling(self) -> str:
        return ",".join(f"{s.level}(" + ",".join(p.spelling() for p in s.passes) + ")" for s in self.stages)

    @property
    def passes(self) -> list[tuple[str, KernelPass]]:
        return [(s.level, p) for s in self.stages for p in s.passes]

    def tolerance(self) -> Tolerance | None:
        """The loosest tolerance any pass declares (None: the pipeline keeps results bit-exact)."""
        declared = [t for _, p in self.passes if (t := p.declared_tolerance()) is not None]
        combined: Tolerance | None = None
        for t in declared:
            combined = t.combine(combined)
        return combined


_NAME = re.compile(r"[A-Za-z_][\w-]*")
_VALUE = re.compile(r'"(?:[^"\\]|\\.)*"|[^\s{}(),]+')


def parse_pipeline(spec: str) -> Pipeline:
    """Parse a pipeline string; unknown levels, passes and options are errors pointing at the column."""
    pos = 0
    stages: list[PipelineStage] = []

    def skip_ws() -> None:
        nonlocal pos
        while pos < len(spec) and spec[pos].isspace():
            pos += 1

    def expect(ch: str) -> None:
        nonlocal pos
        skip_ws()
        if pos >= len(spec) or spec[pos] != ch:
            got = repr(spec[pos]) if pos < len(spec) else "the end"
            raise PipelineSyntaxError(spec, pos, f"expected {ch!r}, got {got}")
        pos += 1

    def name(what: str) -> tuple[str, int]:
        nonlocal pos
        skip_ws()
        m = _NAME.match(spec, pos)
        if not m:
            raise PipelineSyntaxError(spec, pos, f"expected a {what}")
        pos = m.end()
        return m.group(0), m.start()

    if not spec.strip():
        raise PipelineSyntaxError(spec, 0, "empty pipeline")
    last_level = -1
    while True:
        level, at = name("level (" + ", ".join(PASS_LEVELS) + ")")
        if level not in PASS_LEVELS:
            raise PipelineSyntaxError(spec, at, f"unknown level {level!r}; levels: {', '.join(PASS_LEVELS)}")
        order = PASS_LEVELS.index(level) if level != "amdgcn" else PASS_LEVELS.index("ptx")
        if order < last_level:
            raise PipelineSyntaxError(spec, at, f"level {level} comes after a lower level: list levels top down")
        last_level = order
        expect("(")
        passes: list[KernelPass] = []
        skip_ws()
        while pos < len(spec) and spec[pos] != ")":
            pname, pat = name("pass name")
            options: dict[str, str] = {}
            skip_ws()
            if pos < len(spec) and spec[pos] == "{":
                pos += 1
                while True:
                    skip_ws()
                    if pos < len(spec) and spec[pos] == "}":
                        pos += 1
                        break
                    key, _ = name("option name")
                    expect("=")
                    skip_ws()
                    m = _VALUE.match(spec, pos)
                    if not m:
                        raise PipelineSyntaxError(spec, pos, f"expected a value for option {key!r}")
                    value = m.group(0)
                    options[key] = json.loads(value) if value.startswith('"') else value
                    pos = m.end()
            try:
                cls = get_pass(pname)
                instance = cls.from_options(options)
            except PassError as exc:
                raise PipelineSyntaxError(spec, pat, exc.message, caret=False) from None
            if level != cls.level and level not in cls.also_at:
                where = " and ".join((cls.level, *cls.also_at))
                raise PipelineSyntaxError(spec, pat, f"pass {pname} works at {where}, not {level}")
            passes.append(instance)
            skip_ws()
            if pos < len(spec) and spec[pos] == ",":
                pos += 1
                skip_ws()
        expect(")")
        stages.append(PipelineStage(level, tuple(passes)))
        skip_ws()
        if pos >= len(spec):
            break
        expect(",")
    return Pipeline(tuple(stages))


# ---------------------------------------------------------------------------------------------------
# Running
# ---------------------------------------------------------------------------------------------------
@dataclass
class PassRecord:
    level: str
    spelling: str
    status: str  # "changed", "unchanged", "skipped" or "failed"
    reason: str = ""
    lines_added: int = 0
    lines_removed: int = 0
    metadata_updates: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)


@dataclass
class PipelineOutcome:
    bundle: KernelBundle
    records: list[PassRecord]
    #: The highest level any pass changed (the levels below it were rebuilt), or None.
    first_changed: str | None
    repro: str | None = None

    @property
    def changed(self) -> bool:
        return self.first_changed is not None


class PassFailure(KstrataError):
    """A pass raised or left IR that does not verify; `repro` is the reproducer directory."""

    def __init__(self, message: str, *, repro: str | None, record: PassRecord) -> None:
        self.repro = repro
        self.record = record
        super().__init__(message + (f" (reproducer: {repro})" if repro else ""))


def _diff_counts(before: str, after: str) -> tuple[int, int]:
    added = removed = 0
    for line in difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="", n=0):
        if line.startswith("+") and not line.startswith("+++"):
            added += 1
        elif line.startswith("-") and not line.startswith("---"):
            removed += 1
    return added, removed


def _write_repro(repro_root: Path, bundle: KernelBundle, level: str, pipeline: Pipeline, kpass: KernelPass,
                 text_before: str, error: str) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    d = repro_root / f"{bundle.name}-{bundle.target.backend}-{kpass.name}-{stamp}"
    d.mkdir(parents=True, exist_ok=True)
    (d / f"before.{level}").write_text(text_before)
    (d / "pipeline.txt").write_text(pipeline.spelling() + "\n")
    (d / "pass.json").write_text(json.dumps({"pass": kpass.name, "spelling": kpass.spelling(), "level": level,
                                             "options": dataclasses.asdict(kpass), "kernel": bundle.name,
                                             "target": str(bundle.target), "origin": bundle.origin}, indent=2))
    (d / "error.txt").write_text(error)
    return str(d)


@dataclass
class StageOutcome:
    """The passes of one level run on one kernel: the level's new text and the metadata updates."""

    text: str
    updates: dict[str, Any]
    records: list[PassRecord]

    @property
    def changed(self) -> bool:
        return any(r.status == "changed" for r in self.records)


def run_stage(bundle: KernelBundle, stage: PipelineStage, pipeline: Pipeline | None = None,
              repro_root: str | Path | None = None, verify: bool = True) -> StageOutcome:
    """Run the passes of `stage` on `bundle` (which holds the level's current text), verifying after each.

    A pass for another backend, or whose precondition does not hold, is skipped with the reason. A pass
    that raises or leaves IR that does not verify raises `PassFailure` (with a reproducer directory when
    `repro_root` is given).
    """
    from .verifiers import verify_level

    level = stage.level
    if level not in bundle.target.levels:
        return StageOutcome("", {}, [PassRecord(level, p.spelling(), "skipped", f"{bundle.target} has no {level} level")
                                     for p in stage.passes])
    text = bundle.text(level) if level in bundle.levels else ""
    updates: dict[str, Any] = {}
    records: list[PassRecord] = []
    # The level's module, parsed at most once while passes rewrite it in place; a pass that makes
    # the text anew (a re-lowering) drops it, and the next pass that needs a module parses again.
    module: TritonModule | None = None
    for kpass in stage.passes:
        record = PassRecord(level, kpass.spelling(), "unchanged")
        records.append(record)
        start = time.perf_counter()
        view = dataclasses.replace(bundle, levels={**bundle.levels, level: text} if text else dict(bundle.levels),
                                   metadata={**bundle.metadata, **updates})
        ctx = PassContext(view, level, module)
        if bundle.target.backend not in kpass.backends:
            record.status, record.reason = "skipped", f"pass applies to {', '.join(kpass.backends)} only"
            continue
        why_not = kpass.precondition(ctx)
        if why_not:
            record.status, record.reason = "skipped", why_not
            continue
        module = ctx.parsed  # a precondition that parsed the text leaves the module for the next pass
        try:
            result = kpass.apply(ctx)
            if verify and result.text != text and level in view.levels:
                verify_level(view, level, result.text)
        except Exception as exc:
            record.status = "failed"
            record.reason = f"{type(exc).__name__}: {exc}"
            record.seconds = time.perf_counter() - start
            repro = None
            if repro_root is not None:
                repro = _write_repro(Path(repro_root), bundle, level, pipeline or Pipeline((stage,)), kpass, text,
                                     "".join(traceback.format_exception(exc)))
            raise PassFailure(f"kernel {bundle.name}: pass {kpass.spelling()} failed at {level}: {record.reason}",
                              repro=repro, record=record) from exc
        record.seconds = time.perf_counter() - start
        record.notes = result.notes
        if result.module is not None:
            module = result.module
        elif result.text != text:
            module = None
        if result.text != text or result.metadata_updates:
            record.status = "changed"
            record.lines_added, record.lines_removed = _diff_counts(text, result.text)
            record.metadata_updates = dict(result.metadata_updates)
            text = result.text
            updates.update(result.metadata_updates)
    return StageOutcome(text, updates, records)


def run_pipeline(bundle: KernelBundle, pipeline: Pipeline, repro_root: str | Path | None = None) -> PipelineOutcome:
    """Run `pipeline` on `bundle`; returns the new bundle (lower levels rebuilt) and a record per pass."""
    from kstrata.backends.rebuild import rebuild_from

    state = bundle
    records: list[PassRecord] = []
    first_changed: str | None = None
    for stage in pipeline.stages:
        outcome = run_stage(state, stage, pipeline, repro_root)
        records += outcome.records
        if outcome.changed:
            state = rebuild_from(state, stage.level, outcome.text, option_overrides=outcome.updates)
            first_changed = first_changed or stage.level
    return PipelineOutcome(state, records, first_changed)


@dataclass
class TextOutcome:
    """What `apply_passes` gives: the text of the last level the pipeline names, the metadata updates
    the passes asked for, that level, and a record per pass (changed, unchanged or skipped, and why)."""

    text: str
    updates: dict[str, Any]
    level: str
    records: list[PassRecord]

    def messages(self) -> list[str]:
        """One line per pass: what it did, or why it did nothing."""
        lines = []
        for r in self.records:
            if r.status == "changed":
                what = "; ".join(r.notes) or f"+{r.lines_added} -{r.lines_removed} lines"
                meta = "".join(f"; metadata {k}={v}" for k, v in sorted(r.metadata_updates.items()))
                lines.append(f"{r.level}: {r.spelling}: changed ({what}{meta})")
            elif r.status == "skipped":
                lines.append(f"{r.level}: {r.spelling}: skipped: {r.reason}")
            else:
                lines.append(f"{r.level}: {r.spelling}: {r.status}" + (f": {r.reason}" if r.reason else
                                                                       " (the pass found nothing to change)"))
        return lines


def apply_passes(bundle: KernelBundle, pipeline: Pipeline) -> TextOutcome:
    """Run the pipeline's passes without rebuilding lower levels (see `TextOutcome`).

    Preconditions still decide (a pass that does not hold changes nothing, and its record says why)
    and the verifier still runs. Used by golden tests and to look at what a pass does to one file.
    """
    state = bundle
    updates: dict[str, Any] = {}
    records: list[PassRecord] = []
    last = pipeline.stages[-1].level
    for stage in pipeline.stages:
        outcome = run_stage(state, stage, pipeline)
        records += outcome.records
        if outcome.changed:
            state = dataclasses.replace(state, levels={**state.levels, stage.level: outcome.text},
                                        metadata={**state.metadata, **outcome.updates})
            updates.update(outcome.updates)
        last = stage.level
    text = state.text(last) if last in state.levels else ""
    return TextOutcome(text, updates, last, records)


def apply_passes_only(bundle: KernelBundle, pipeline: Pipeline) -> tuple[str, dict[str, Any], str]:
    """`apply_passes` as (text, metadata updates, level)."""
    outcome = apply_passes(bundle, pipeline)
    return outcome.text, outcome.updates, outcome.level
