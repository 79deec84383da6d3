"""The search over edit sequences of one compiled kernel: singletons first, then simulated annealing.

Every candidate (a sequence of atoms, `spaces.py`) goes through the engine in this order, and stops at
the first step that fails:

1. `Engine.build` (a worker process; lower levels rebuilt; signature and launch ABI checked);
2. the **gate**, `Engine.check` on the kernel's launch record (`device="cuda"` on an NVIDIA GPU: redzones,
   the differential run of both binaries on identical launches and a determinism re-run; compute-sanitizer
   runs on the candidate about to win, before it is accepted (`SearchConfig.sanitize`); on the CPU the
   interpreter or the symbolic checker for TTIR/TTGIR). A candidate that edits LLVM IR,
   PTX or AMDGCN counts as proven only with GPU evidence: on the CPU it is `unproven` whatever the other
   checks said, and is never timed; AMDGCN candidates also pass the `s_waitcnt` hazard check;
3. the **score**: on an NVIDIA GPU `Engine.measure` (interleaved A/B rounds against the original on the
   record; score = log speedup); for AMD kernels the static surrogate (`surrogate.py`; score = log of the
   cost ratio), and the candidate is `unmeasured` with the reason; on the CPU for NVIDIA kernels nothing
   (score None: the walk explores and gates but cannot rank, and says so).

Annealing (as CuAsmRL and AsmEvo search, without an LLM): from the best singleton, a neighbour adds an
atom of a pass not yet in the sequence, drops one, or swaps one for another instance of the same pass;
it is taken when its score is higher, or with probability exp(delta / T), T cooling each step. The
random generator is seeded: a run is reproducible.

A winner needs a measured speedup whose every A/B round beats the original, by more than the measured
noise (half the larger round-to-round spread, at least `MIN_GAIN`), with identical outputs (or the
tolerance its passes declare) and no suspicion flag (`engine.suspicious_reasons`).

When the kernel has **sibling configs** (`program.Program.siblings`: Inductor autotuned it over several
block sizes and launch options, and the recording ran one of them), the original it was timed against is
only the config the recording happened to run; at deployment Inductor's autotuner chooses among all of
them. The winner is then also timed against each sibling's original binary, each on its own launch record
(`Engine.measure(..., original_launches=)`), and stays a winner only if it beats every one, the fastest
included, by the same rule (`KernelSearch.siblings`, `baseline`).

Before the search each sibling's original is timed once against the recorded config's, the same way
(`best_config`); when one is faster beyond the noise the search starts from the fastest (`run.kernel_start`:
its entry, launch record and so its grid, num_warps and block constants), the recorded config becomes one of
the siblings a winner must beat, and a winner reports its speed over both (over its own config, the best one,
and `KernelSearch.against_recorded`). With no winning edit the result is then that config itself, as Inductor
compiled it (`ConfigChoice`, `config(KEY)`), when it beats every other config. The singletons are drafted
with the edits most likely to matter on the kernel's kind first (`spaces.FIRST_EDITS`), after what won on the
run's kernels of that kind (`SearchPrior.for_kernel`).

Before a winner is accepted it is checked again with compute-sanitizer (memcheck, one launch, every buffer
its own allocation); one that fails it is `different`, and the next best is considered. Candidates that
never win are not sanitized: a trial took 20-50 s on the H200, a sanitizer run being one of its child
processes (python, torch and Triton started under memcheck), and only a winner is deployed. The gate's
redzones, differential and determinism runs stay on every candidate before any timing.

That acceptance check is timed into the kernel's budget. The first trial to become the best gets it at once,
inside the search; what it took is kept back from the deadline while a later best is still unchecked
(`no_time`), and after the deadline only one more such check runs: a next best still unchecked is passed
over, with the reason, for one accepted already. At a published size the check is minutes: on gap task 01
(H100, 2026-12-07) it took 194 s after a search of 205 s, and the benchmark's call was cut.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from kstrata.agents.engine import (
    Budget,
    BuildResult,
    Candidate,
    Engine,
    Measurement,
    PipelineEdit,
    Provenance,
    Verdict,
)

from .spaces import Atom, Space, first_level, kernel_kind, kind_first, pipeline_of

#: The least gain a winner must show beyond the noise.
MIN_GAIN = 0.02
_LOW_LEVELS = ("llir", "ptx", "amdgcn")


@dataclass(frozen=True)
class SearchConfig:
    budget: int = 24
    seed: int = 0
    max_edits: int = 3
    temperature: float = 0.05
    cooling: float = 0.85
    #: "cuda" (gate on the GPU and time), "cpu" (gate on the CPU; nothing timed).
    device: str = "cpu"
    check_timeout: float = 900.0
    #: Parallel builds of the singletons (the engine's pool runs them).
    jobs: int = 1
    #: Why nothing can be timed here (None when timing runs): said on every unmeasured candidate.
    unmeasured_reason: str | None = None
    #: `time.perf_counter()` after which no further candidate is started (a caller's deadline: the optimizer's
    #: `ir` space searches within the task's time); None: the budget alone bounds the search.
    deadline: float | None = None
    #: On the GPU, when compute-sanitizer runs: "winner" (on the candidate about to win, before it is accepted;
    #: the gate of every candidate runs without it) or "every" (in every candidate's gate).
    sanitize: str = "winner"
    #: On the GPU, when the CPU interpreter runs on a TTIR/TTGIR edit: "winner" (in the check of the candidate
    #: about to win, with the sanitizer; the gate's GPU differential run checks every candidate's binary) or
    #: "every" (in every gate, as before).
    interpreter: str = "winner"
    #: The model's kernel-level answers (`kstrata.agents.llm.kernel.KernelLLM`, or a callable of its shape):
    #: after the singletons, its conversation's answers are trials of this search; None: no model.
    llm: Any = None
    #: What the model is told the profile found (the task optimizer's findings).
    llm_findings: tuple[str, ...] = ()
    #: The hot window's lines in the kernel's assembly (first, last), shown to the model's asm space.
    llm_window: tuple[int, int] | None = None

    def out_of_time(self) -> bool:
        return self.deadline is not None and time.perf_counter() > self.deadline


@dataclass
class Trial:
    """One candidate and what became of it."""

    pipeline: str
    spaces: list[str]
    level: str
    tolerance: str | None
    phase: str  # "singleton" or "anneal"
    key: str = ""
    #: built, failed, unchanged, duplicate, different, error, unproven, equivalent
    status: str = "built"
    reason: str = ""
    verdict: str | None = None
    entry: str | None = None
    binary_digest: str | None = None
    measured: bool = False
    unmeasured: str | None = None
    speedup: float | None = None
    speedup_range: list[float] | None = None
    time_before_us: float | None = None
    time_after_us: float | None = None
    noise: float | None = None
    suspicious: list[str] = field(default_factory=list)
    surrogate: dict[str, Any] | None = None
    score: float | None = None
    accepted_move: bool = False
    seconds: float = 0.0
    #: Where the seconds went: "build", "gate" (the engine's check), "measure" (a trial took 20-50 s on the
    #: H200 and one to three fitted a kernel's time: these say which step to make faster).
    phase_seconds: dict[str, float] = field(default_factory=dict)
    #: The windows its edits are confined to and where each came from (`spaces.WindowUse.to_json`, with
    #: the pass): sampled on a GPU or static.
    windows: list[dict[str, Any]] = field(default_factory=list)
    #: compute-sanitizer on the GPU: "in the gate", "deferred" (it runs only on a candidate about to win),
    #: "passed: …", "failed: …", or None (not a GPU gate).
    sanitizer: str | None = None
    #: The interpreter runs of a TTIR/TTGIR edit on the GPU: "in the gate", "deferred" (to the check of the
    #: candidate about to win), or None (not a GPU gate).
    interpreter: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Sibling:
    """Another compiled config of the kernel searched (same code apart from Inductor's autotuned constants and
    launch options: `program.KernelConfig`), registered with the engine as `base`, with its launch record."""

    base: str
    record: str
    #: `KernelConfig.to_json()`: launch options, grid, block constants, launches, and `words`.
    config: dict[str, Any]


@dataclass
class ConfigPairTiming:
    """Binaries of two configs of one kernel timed in interleaved A/B rounds, each on its own launch record
    (`Engine.measure(..., original_launches=)`): `speedup` is the other config's time over this side's, in
    every round within `speedup_range`; `status` says whether it cleared the noise."""

    config: dict[str, Any]
    status: str
    speedup: float | None = None
    speedup_range: list[float] | None = None
    noise: float | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class SiblingTiming(ConfigPairTiming):
    """The winner against one sibling config (`config`): the sibling's original on its own record (`time_us`)
    against the winner on the kernel's (`winner_us`). `status`: "beaten" (every round faster, by more than the
    noise), "not beaten", "unmeasured" (`reason` says why)."""

    time_us: float | None = None
    winner_us: float | None = None
    #: Whether both wrote the same bytes on the same inputs (information: another config may sum in
    #: another order; the winner's equivalence is to its own original, checked by the gate).
    outputs_equal: bool | None = None
    reason: str = ""


@dataclass
class ConfigTiming(ConfigPairTiming):
    """Another compiled config's original (`config`, `time_us`) against the recorded config's (`recorded_us`),
    before the search; `speedup` is the recorded config's time over this one's. `status`: "faster" (every round,
    by more than the noise), "not faster", "unmeasured". Inductor's autotuner benchmarks its configs once, at
    the program's start, and may keep a slower one: on the H200 (2026-12-03) it ran the 8-warp config of three
    pointwise kernels whose 4-warp config was faster on its own record."""

    time_us: float | None = None
    recorded_us: float | None = None
    reason: str = ""


@dataclass
class ConfigChoice:
    """A search's result without a winning edit when its base is another config that beat the recorded one:
    deploy that config as Inductor compiled it (Inductor's autotuner restricted to it), when it beat every
    other config too (`siblings`, each on its own record, the recorded one included)."""

    config: dict[str, Any]
    #: Over the recorded config (its time `time_before_us`, this config's `time_after_us`).
    speedup: float
    speedup_range: list[float] | None
    time_before_us: float | None
    time_after_us: float | None
    siblings: list[SiblingTiming]

    @property
    def edit(self) -> str:
        """How a report and the tuned database name it: `config(KEY)`, the config's Triton cache key."""
        return f"config({str(self.config.get('key', '?'))[:12]})"

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "edit": self.edit, "siblings": [t.to_json() for t in self.siblings]}


@dataclass
class KernelSearch:
    """The search of one kernel: every trial, the winner (a measured one) and the ranking mode."""

    kernel: str
    entry: str
    target: str
    mode: str  # "measured", "surrogate", "unranked"
    mode_note: str
    spaces: list[dict[str, Any]]
    trials: list[Trial] = field(default_factory=list)
    winner: int | None = None
    base_surrogate: dict[str, Any] | None = None
    seconds: float = 0.0
    #: The model's attempts on this kernel (`kstrata.agents.llm.kernel`: turn, outcome, stage, reason, the trial)
    llm: list[dict[str, Any]] = field(default_factory=list)
    #: Why the search stopped before its budget (the kernel's deadline), or None.
    stopped: str | None = None
    #: The config the candidates were timed against (`KernelConfig.to_json()` of the recorded one), when known.
    baseline: dict[str, Any] | None = None
    #: The best candidate against each sibling config (`compared`: its trial), and the verdict in words.
    siblings: list[SiblingTiming] = field(default_factory=list)
    compared: int | None = None
    sibling_verdict: str | None = None
    #: The launch record the candidates ran on (the base config's).
    record: str | None = None
    #: Each other config's original timed against the recorded one before the search (`best_config`).
    configs: list[ConfigTiming] = field(default_factory=list)
    #: The config the search started from when it is not the recorded one (`KernelConfig.to_json()`): the
    #: fastest config, whose entry and record every candidate edits and runs on.
    started_from: dict[str, Any] | None = None
    #: No edit won, and the config started from beat every other: deploy it as it is.
    choice: ConfigChoice | None = None

    @property
    def best(self) -> Trial | None:
        return self.trials[self.winner] if self.winner is not None else None

    def against_recorded(self) -> SiblingTiming | None:
        """The winner's (or the config choice's) timing against the recorded config, when the search started
        from another config."""
        if self.started_from is None or self.baseline is None:
            return None
        timings = self.choice.siblings if self.choice is not None and self.best is None else self.siblings
        return next((t for t in timings if t.config.get("key") == self.baseline.get("key")), None)

    def ranked_unmeasured(self) -> list[Trial]:
        """Surrogate-ranked candidates that passed the gate (and the hazard check), best first."""
        ok = [t for t in self.trials if t.score is not None and t.status in ("equivalent", "unproven")]
        return sorted(ok, key=lambda t: -(t.score or 0.0))

    def to_json(self) -> dict[str, Any]:
        return {"kernel": self.kernel, "entry": self.entry, "target": self.target, "mode": self.mode,
                "mode_note": self.mode_note, "spaces": self.spaces, "winner": self.winner,
                "base_surrogate": self.base_surrogate, "seconds": self.seconds, "stopped": self.stopped,
                "baseline": self.baseline, "siblings": [t.to_json() for t in self.siblings],
                "compared": self.compared, "sibling_verdict": self.sibling_verdict, "record": self.record,
                "configs": [t.to_json() for t in self.configs], "started_from": self.started_from,
                "choice": self.choice.to_json() if self.choice is not None else None,
                "trials": [t.to_json() for t in self.trials], "llm": self.llm}


Scorer = Callable[[BuildResult, Trial], None]


def _gate(engine: Engine, base: str, built: BuildResult, record: str | None, trial: Trial, levels: Sequence[str],
          cfg: SearchConfig) -> None:
    """`levels`: the levels the edit wrote itself (the ones below are Triton's or the assembler's rebuild)."""
    verify = None
    if cfg.device == "cuda":  # the sanitizer waits for a candidate about to win (`_sanitized`)
        from kstrata.agents.engine import VerifyOptions

        deferred = cfg.sanitize == "winner"
        later = cfg.interpreter == "winner"
        verify = VerifyOptions(seeds=1, device="cuda", sanitizer="none" if deferred else "auto", interpreter=not later)
        trial.sanitizer = "deferred" if deferred else "in the gate"
        trial.interpreter = "deferred" if later else "in the gate"
    result = engine.check(base, built, [record] if record else [], device=cfg.device, seeds=1,
                          tolerance=trial.tolerance, timeout=cfg.check_timeout, verify=verify)
    trial.verdict = result.verdict.value
    trial.reason = result.reason
    if result.verdict is Verdict.DIFFERENT:
        trial.status = "different"
        return
    if result.verdict is Verdict.ERROR:
        trial.status = "error"
        return
    low = [lv for lv in levels if lv in _LOW_LEVELS]
    from kstrata.backends.verify import ran_on_gpu

    gpu_evidence = ran_on_gpu(result.evidence)
    if result.verdict is Verdict.EQUIVALENT and low and not gpu_evidence and not built.same_binary_as_base:
        trial.status = "unproven"
        trial.reason = (f"edits {', '.join(dict.fromkeys(low))}, which only the GPU differential run checks; "
                        f"the checks that ran: {result.reason}")
        return
    trial.status = "equivalent" if result.verdict is Verdict.EQUIVALENT else "unproven"


def search_kernel(engine: Engine, base: str, kernel_name: str, entry: str, target: str, record: str | None,
                  spaces: Sequence[Space], cfg: SearchConfig, *, mode: str, mode_note: str,
                  surrogate: Callable[[str], dict[str, Any]] | None = None,
                  progress: Callable[[str], None] | None = None,
                  env: Mapping[str, str] | None = None,
                  prior: Mapping[str, float] | None = None,
                  siblings: Sequence[Sibling] = (), baseline: Mapping[str, Any] | None = None,
                  started_from: Sibling | None = None, config_timings: Sequence[ConfigTiming] = ()) -> KernelSearch:
    """Search `spaces` for the kernel `base` (an engine base digest of `entry`); see the module docstring.

    `prior`: pipeline spelling -> the log speedup it won on other kernels of the run (`SearchPrior`): those
    singletons are tried first, best first, the rest round-robin over the spaces as before. `siblings`: the
    kernel's other autotuning configs, which a measured winner must beat too; `baseline`: the recorded
    config's description (`KernelConfig.to_json()`), reported with them. `started_from`: the config `base`,
    `entry` and `record` are of when it is not the recorded one (`best_config` found it faster; `siblings` then
    hold the recorded config), and `config_timings` how each config did against the recorded one; without a
    winning edit the search's result is then that config itself (`KernelSearch.choice`).

    `mode`: "measured" (Engine.measure; needs an NVIDIA GPU and a record), "surrogate" (`surrogate(entry)`
    gives the static cost of a built entry; lower is better) or "unranked". `env`: the build workers'
    environment (`engine.tool_env(record)`: the ptxas the recorded program used)."""
    start = time.perf_counter()
    rng = random.Random(cfg.seed)
    result = KernelSearch(kernel_name, entry, target, mode, mode_note, [s.to_json() for s in spaces],
                          baseline=dict(baseline) if baseline is not None else None, record=record,
                          configs=list(config_timings),
                          started_from=dict(started_from.config) if started_from is not None else None)
    builds: dict[str, BuildResult] = {}
    by_pass: dict[str, list[Atom]] = {}
    for s in spaces:
        for a in s.atoms:
            by_pass.setdefault(a.pass_name, []).append(a)
    tried: dict[str, Trial] = {}
    base_cost: float | None = None
    if mode == "surrogate" and surrogate is not None:
        try:
            result.base_surrogate = surrogate(entry)
            base_cost = float(result.base_surrogate["cost"])
        except Exception as exc:  # the surrogate's tool is missing or failed: unranked, and why
            result.mode, result.mode_note = "unranked", f"{mode_note}; the static surrogate failed on the original: {exc}"
    best_us: float | None = None
    #: The acceptance check's seconds (`_sanitized`: the full check with compute-sanitizer and the interpreter),
    #: measured on the first trial that became the best: the time kept back for the final winner's check.
    accept_cost: list[float] = []

    def say(msg: str) -> None:
        if progress is not None:
            progress(msg)

    def no_time() -> bool:
        """Past the kernel's deadline, less the acceptance check the best trial still needs: on gap task 01
        (H100, 2026-12-07) that check took 194 s after a search of 205, and the run's re-check and end to end
        were cut."""
        if cfg.out_of_time():
            return True
        if cfg.deadline is None or not accept_cost:
            return False
        w = _winner(result.trials)
        pending = w is not None and "deferred" in (result.trials[w].sanitizer, result.trials[w].interpreter)
        return pending and time.perf_counter() > cfg.deadline - accept_cost[0]

    def accept_first(trial: Trial, built: BuildResult) -> None:
        """The first trial to become the best is given its acceptance check now, inside the kernel's time: its
        cost is then known (`no_time` keeps it back for a later best), and a fallback is accepted already."""
        if accept_cost or not record or "deferred" not in (trial.sanitizer, trial.interpreter):
            return
        w = _winner(result.trials)
        if w is None or result.trials[w] is not trial:
            return
        say(f"  {kernel_name}: {trial.pipeline}: the best so far; its acceptance check (compute-sanitizer, "
            "the interpreter) runs now")
        _sanitized(engine, base, built, record, trial, cfg)
        accept_cost.append(trial.phase_seconds.get("sanitize", 0.0))

    def evaluate(atoms: tuple[Atom, ...], phase: str) -> Trial:
        spec = pipeline_of(atoms)
        if spec in tried:
            return tried[spec]
        from kstrata.passes.pipeline import parse_pipeline

        tol = parse_pipeline(spec).tolerance()
        return run_trial(spec, PipelineEdit(spec), first_level(atoms), tol.spelling() if tol else None,
                         sorted({a.space for a in atoms}), phase, [a.level for a in atoms],
                         [{"pass": a.pass_name, **a.window.to_json()} for a in atoms if a.window is not None])

    def run_trial(spec: str, edit: Any, level: str, tolerance: str | None, spaces_: list[str], phase: str,
                  levels: Sequence[str], windows: Sequence[dict[str, Any]] = (), proposer: str = "compiled-search"
                  ) -> Trial:
        """One engine candidate (`edit` at `level`, named `spec` in the report) built, gated and scored."""
        nonlocal best_us
        trial = Trial(spec, spaces_, level, tolerance, phase, windows=list(windows))
        tried[spec] = trial
        result.trials.append(trial)
        t0 = time.perf_counter()
        cand = Candidate(base, trial.level, edit, trial.tolerance,
                         provenance=Provenance(proposer, None, ",".join(trial.spaces)))
        built = builds[spec] = engine.build(cand, env=env)
        trial.phase_seconds["build"] = round(time.perf_counter() - t0, 3)
        trial.key, trial.entry, trial.binary_digest = built.key, built.entry, built.binary_digest
        if built.status != "changed":
            trial.status, trial.reason = ("failed", built.error or "") if built.status == "failed" else \
                ("unchanged", "the edit changed nothing on this kernel")
        elif built.same_binary_as_base:
            trial.status, trial.reason = "unchanged", "the rebuilt binary is byte-identical to the original's"
        else:
            if built.duplicate_of:
                twin = next((t for t in result.trials if t.key == built.duplicate_of), None)
                if twin is not None and twin is not trial:
                    trial.status, trial.reason = "duplicate", f"same binary as {twin.pipeline}"
                    trial.verdict, trial.score, trial.speedup = twin.verdict, None, twin.speedup
                    trial.seconds = time.perf_counter() - t0
                    return trial
            t_gate = time.perf_counter()
            _gate(engine, base, built, record, trial, levels, cfg)
            trial.phase_seconds["gate"] = round(time.perf_counter() - t_gate, 3)
            if trial.status in ("equivalent", "unproven") and target.startswith("hip"):
                _hazards(engine, entry, built, trial)
            if trial.status in ("equivalent", "unproven"):
                if result.mode == "measured" and trial.status == "equivalent" and record:
                    t_measure = time.perf_counter()
                    m = engine.measure(base, built, [record], Budget(best_us=best_us),
                                       declared_tolerance=trial.tolerance)
                    trial.phase_seconds["measure"] = round(time.perf_counter() - t_measure, 3)
                    if m.status == "timed" and m.speedup:
                        trial.measured = True
                        trial.speedup, trial.time_before_us, trial.time_after_us = m.speedup, m.time_before_us, m.time_after_us
                        trial.speedup_range = m.detail.get("speedup_range")
                        trial.noise = _noise(m)
                        trial.suspicious = list(m.suspicious)
                        trial.score = math.log(m.speedup)
                        if m.time_after_us is not None:
                            best_us = min(best_us or m.time_after_us, m.time_after_us)
                        if cfg.device == "cuda":
                            accept_first(trial, built)
                    else:
                        trial.unmeasured = m.reason or m.status
                elif result.mode == "measured":
                    trial.unmeasured = (f"not timed: {trial.reason}" if trial.status == "unproven"
                                        else "not timed: no launch record")
                elif result.mode == "surrogate" and surrogate is not None and base_cost and trial.entry:
                    try:
                        trial.surrogate = surrogate(trial.entry)
                        trial.score = math.log(base_cost / float(trial.surrogate["cost"]))
                    except Exception as exc:
                        trial.surrogate = {"error": str(exc)}
                    trial.unmeasured = cfg.unmeasured_reason or "not timed"
                else:
                    trial.unmeasured = cfg.unmeasured_reason or "not timed"
        trial.seconds = time.perf_counter() - t0
        shown = (f"{trial.speedup:.3f}x" if trial.speedup else f"score {trial.score:+.3f}" if trial.score is not None
                 else trial.unmeasured or "")
        say(f"  {kernel_name}: {spec}: {trial.status}" + (f" ({shown})" if shown else ""))
        return trial

    atoms_all = [a for s in spaces for a in s.atoms]
    if not atoms_all:
        result.seconds = time.perf_counter() - start
        return result
    # singletons, round-robin over the spaces so a small budget still samples each one
    queues = [list(s.atoms) for s in spaces if s.atoms]
    singles: list[Atom] = []
    while any(queues):
        for q in queues:
            if q:
                singles.append(q.pop(0))
    # the edits most likely to matter on this kind of kernel first (`spaces.FIRST_EDITS`), and before them what
    # won on the run's other kernels of its kind (a stable sort: the order otherwise kept)
    singles = kind_first(kernel_kind(kernel_name), singles)
    if prior:
        singles.sort(key=lambda a: -max(0.0, prior.get(pipeline_of((a,)), 0.0)))
    n_single = min(len(singles), max(1, (2 * cfg.budget) // 3))
    if cfg.jobs > 1 and hasattr(engine, "build_many") and not cfg.out_of_time():
        # build the singletons in parallel; evaluate finds them cached
        from kstrata.passes.pipeline import parse_pipeline

        def candidate(a: Atom) -> Candidate:
            tol = parse_pipeline(pipeline_of((a,))).tolerance()
            return Candidate(base, first_level((a,)), PipelineEdit(pipeline_of((a,))), tol.spelling() if tol else None)

        engine.build_many([candidate(a) for a in singles[:n_single]], env_for=lambda _c: env)
    for i, a in enumerate(singles[:n_single]):
        if no_time():
            # the H200 crashed here (KeyError) when a kernel's search began with 6 s of the run left: what was
            # not tried is not in `tried`; the search returns what it has, and says so
            result.stopped = (f"the kernel's time ran out after {i} of its {n_single} single edits"
                              + ("" if i else ": no candidate was tried") + "; no annealing")
            break
        evaluate((a,), "singleton")

    if cfg.llm is not None and result.stopped is None and not no_time():
        _llm_turns(cfg, result, run_trial, tried, kernel_name, entry, target, say)

    def usable(t: Trial | None) -> bool:
        return t is not None and t.status in ("equivalent", "unproven", "duplicate")

    # annealing walks over the passes' atoms: it starts from the best singleton (a model's answer is no atom)
    scored = [t for t in result.trials if t.score is not None and t.phase == "singleton"]
    current: tuple[Atom, ...]
    if scored:
        top = max(scored, key=lambda t: t.score or 0.0)
        current = next((a,) for a in singles if pipeline_of((a,)) == top.pipeline)
        current_score = top.score or 0.0
    else:
        ok = [a for a in singles[:n_single] if usable(tried.get(pipeline_of((a,))))]
        current = (ok[0],) if ok else (singles[0],)
        current_score = 0.0
    temperature = cfg.temperature
    attempts = 0
    while len(result.trials) < cfg.budget and attempts < 20 * cfg.budget and result.stopped is None:
        if no_time():
            result.stopped = f"the kernel's time ran out after {len(result.trials)} of its {cfg.budget} trials"
            break
        attempts += 1
        nxt = _neighbour(current, by_pass, rng, cfg.max_edits)
        if nxt is None or pipeline_of(nxt) in tried:
            continue
        trial = evaluate(nxt, "anneal")
        if not usable(trial):
            continue
        if trial.score is None:  # nothing ranks here: walk on through candidates that passed the gate
            trial.accepted_move, current = True, nxt
            continue
        delta = trial.score - current_score
        if delta >= 0 or rng.random() < math.exp(delta / max(temperature, 1e-9)):
            trial.accepted_move, current, current_score = True, nxt, trial.score
        temperature *= cfg.cooling
    result.winner = _accepted(engine, base, result, builds, record, siblings, cfg)
    if result.winner is None and started_from is not None and record and result.mode == "measured":
        result.choice = _config_choice(engine, base, record, started_from, siblings, result)
    result.seconds = time.perf_counter() - start
    return result


def best_config(engine: Engine, base: str, record: str, siblings: Sequence[Sibling]
                ) -> tuple[Sibling | None, list[ConfigTiming]]:
    """Each sibling config's original timed against the recorded config's (`base` on `record`), each on its own
    record, once; the fastest that beat it in every round by more than the noise (None when none did), and every
    timing. The search then starts from that config: an edit of a slower config must first make up the
    difference between the configs, and Inductor's autotuner chooses among all of them at deployment."""
    timings: list[ConfigTiming] = []
    best: tuple[float, Sibling] | None = None
    for sib in siblings:
        m = engine.measure(base, engine.as_build(sib.base), [sib.record], Budget(), original_launches=[record])
        if m.status != "timed" or not m.speedup:
            timings.append(ConfigTiming(dict(sib.config), "unmeasured", reason=m.reason or m.status))
            continue
        t = ConfigTiming(dict(sib.config), "not faster", m.speedup, m.detail.get("speedup_range"), _noise(m),
                         m.time_after_us, m.time_before_us, "; ".join(m.suspicious))
        if _clears(t.speedup, t.speedup_range, t.noise) and not m.suspicious:
            t.status = "faster"
            if best is None or m.speedup > best[0]:
                best = (m.speedup, sib)
        timings.append(t)
    return (best[1] if best is not None else None), timings


def _config_choice(engine: Engine, base: str, record: str, started_from: Sibling, siblings: Sequence[Sibling],
                   result: KernelSearch) -> ConfigChoice | None:
    """The config the search started from, as it is, against every other config (the recorded one included):
    a `ConfigChoice` when it beat each, else None (and `result.sibling_verdict` says which it did not)."""
    timings = _timings_against(engine, engine.as_build(base), record, siblings)
    recorded = next((t for t in timings if result.baseline and t.config.get("key") == result.baseline.get("key")), None)
    lost = [t for t in timings if t.status != "beaten"]
    words = started_from.config.get("words", "?")
    if lost or recorded is None or recorded.speedup is None:
        result.sibling_verdict = (result.sibling_verdict or "") + (
            f"{'; ' if result.sibling_verdict else ''}the config started from ({words}) as it is did not beat "
            + ("; ".join(f"{t.config.get('words', '?')}: " + (f"{t.speedup:.3f}x" if t.speedup else f"unmeasured "
                                                              f"({t.reason})") for t in lost) or "the recorded config")
            + ": no config choice")
        return None
    return ConfigChoice(dict(started_from.config), recorded.speedup, recorded.speedup_range, recorded.time_us,
                        recorded.winner_us, timings)


def pipeline_spec(trial: Trial) -> str | None:
    """The pass pipeline that rebuilds `trial` (None for a model's generated pass or assembly patch, whose
    trial is named `llm:FORMAT:DIGEST`: its built entry is all there is)."""
    return None if trial.pipeline.startswith("llm:") else trial.pipeline


def _llm_turns(cfg: SearchConfig, result: KernelSearch, run_trial: Callable[..., Trial], tried: Mapping[str, Trial],
               kernel_name: str, entry: str, target: str, say: Callable[[str], None]) -> None:
    """The model's conversation on this kernel (`kstrata.agents.llm.kernel`): each answer an engine edit, run
    as a trial of this search (phase "llm"), its fate the next turn's feedback."""
    from kstrata.agents.llm.kernel import KernelView

    def evaluate(edit: Any, level: str, label: str, tolerance: str | None) -> Trial:
        if label in tried:  # the same answer again: the same trial (the model hears the same verdict)
            return tried[label]
        from kstrata.passes.pipeline import parse_pipeline

        levels = [st.level for st in parse_pipeline(edit.spec).stages] if isinstance(edit, PipelineEdit) else [level]
        return run_trial(label, edit, level, tolerance, ["llm"], "llm", levels, proposer="llm")

    tried_lines = tuple(f"{t.pipeline}: {t.status}" + (f" {t.speedup:.3f}x" if t.speedup else "")
                        + (f" ({t.reason[:120]})" if t.status in ("failed", "different") and t.reason else "")
                        for t in result.trials)
    view = KernelView(kernel_name, target, entry, findings=tuple(cfg.llm_findings), window=cfg.llm_window,
                      tried=tried_lines)
    try:
        tries = cfg.llm(view, evaluate, lambda t: _winner([t]) is not None, device=cfg.device,
                        out_of_time=cfg.out_of_time, say=say)
    except Exception as exc:  # the model's side failing costs its answers, not the search
        result.llm.append({"error": f"{type(exc).__name__}: {exc}"})
        return
    result.llm.extend({**t.attempt.to_json(), "trial": getattr(t.trial, "pipeline", None)} for t in tries)


def _accepted(engine: Engine, base: str, result: KernelSearch, builds: Mapping[str, BuildResult], record: str | None,
              siblings: Sequence[Sibling], cfg: SearchConfig) -> int | None:
    """The winner: the best trial that clears the guard, beats every sibling config (`_against_siblings`) and
    passes compute-sanitizer when the gate deferred it (`_sanitized`); a trial that fails the sanitizer is
    `different` and the next best is considered. None when there is none."""
    late: list[int] = []  # trials left unchecked: their acceptance check did not fit the kernel's time
    checked_late = False
    while (w := _winner(result.trials, skip=late)) is not None:
        trial, built = result.trials[w], builds[result.trials[w].pipeline]
        unchecked = "deferred" in (trial.sanitizer, trial.interpreter) and record is not None
        if unchecked and checked_late and cfg.out_of_time():
            # one acceptance check may run past the deadline (the time kept back for it); a second would take
            # the caller's time: a trial accepted already (the first best, `accept_first`) wins
            trial.reason = (f"{trial.reason}; not accepted: its acceptance check (compute-sanitizer, the "
                            "interpreter) did not fit the kernel's time")
            late.append(w)
            continue
        if siblings and record and not _against_siblings(engine, result, w, built, record, siblings):
            return None  # the fastest candidate lost to another config: a slower one would too
        if unchecked and record:
            checked_late = checked_late or cfg.out_of_time()
            if not _sanitized(engine, base, built, record, trial, cfg):
                continue
        return w
    return None


def _sanitized(engine: Engine, base: str, built: BuildResult, record: str, trial: Trial, cfg: SearchConfig) -> bool:
    """The gate again with compute-sanitizer and the interpreter runs (the full check), for a candidate about to
    win; False (and the trial `different` or `error`) when it does not pass."""
    from kstrata.agents.engine import VerifyOptions

    t0 = time.perf_counter()
    check = engine.check(base, built, [record], device="cuda", seeds=1, tolerance=trial.tolerance,
                         timeout=cfg.check_timeout, verify=VerifyOptions(seeds=1, device="cuda", sanitizer="auto"))
    trial.phase_seconds["sanitize"] = round(time.perf_counter() - t0, 3)
    parts: dict[str, float] = {}  # where the acceptance check's time went, by kind of check
    for e in check.evidence:
        if e.seconds is not None:
            kind = e.name.split(":")[0].split(" ")[0]
            parts[kind] = parts.get(kind, 0.0) + e.seconds
    trial.phase_seconds.update({f"sanitize/{k}": round(v, 3) for k, v in parts.items()})
    ran = [e for e in check.evidence if e.name.startswith("compute-sanitizer")]
    words = "; ".join(f"{e.name} {e.verdict}" + (f" ({e.detail})" if e.detail else "") for e in ran) or \
        "compute-sanitizer did not run (not found here)"
    interpreted = [e for e in check.evidence if e.name.startswith("interpreter")]
    if trial.interpreter == "deferred":
        failed = [e for e in interpreted if e.verdict == "fail"]
        trial.interpreter = (f"{'failed' if failed else 'passed'}: {len(interpreted)} interpreter runs"
                             + (f" ({failed[0].name}: {failed[0].detail})" if failed else ""))
        words = f"{words}; {trial.interpreter}"
    if check.verdict is Verdict.EQUIVALENT:
        trial.sanitizer = f"passed: {words}"
        trial.reason = f"{trial.reason}; before it was accepted: {words}"
        return True
    trial.sanitizer = f"failed: {words}"
    trial.status = "different" if check.verdict is Verdict.DIFFERENT else "error"
    trial.verdict, trial.reason = check.verdict.value, f"before it was accepted: {words}; {check.reason}"
    return False


def _noise(m: Measurement) -> float:
    """The gain a timing must show to be more than noise: half the larger round-to-round spread, at least
    `MIN_GAIN`."""
    spread = max(m.detail.get("spread_before_pct") or 0.0, m.detail.get("spread_after_pct") or 0.0)
    return max(MIN_GAIN, spread / 200.0)


def _clears(speedup: float | None, speedup_range: Sequence[float] | None, noise: float | None) -> bool:
    """Faster in every A/B round, and by more than the noise."""
    if speedup is None:
        return False
    low = (speedup_range or [speedup])[0]
    return low > 1.0 and speedup >= 1.0 + (noise or MIN_GAIN)


def _against_siblings(engine: Engine, result: KernelSearch, winner: int, built: BuildResult, record: str,
                      siblings: Sequence[Sibling]) -> bool:
    """Time the trial `winner` against each sibling config's original, each on its own record; True only when
    it beats every one (the fastest included) as it beat its own config. On the H200 (2026-12-03) the MLP's
    silu kernel won 1.215x against the 8-warp config the recording ran, while Inductor's autotuner picked the
    4-warp config at deployment: end to end the win never ran."""
    result.compared, result.siblings = winner, _timings_against(engine, built, record, siblings)
    best = result.trials[winner]
    lost = [t for t in result.siblings if t.status != "beaten"]
    if lost:
        result.sibling_verdict = (
            f"`{best.pipeline}` beat {'the recorded config' if result.started_from is None else 'the config it started from'}"
            f" by {best.speedup:.3f}x but not every config Inductor's "
            "autotuner chooses among: " + "; ".join(
                f"{t.config.get('words', '?')}: " + (f"{t.speedup:.3f}x" if t.speedup else f"unmeasured ({t.reason})")
                for t in lost) + ": not a win")
    else:
        fastest = min(result.siblings, key=lambda t: t.time_us or 0.0)
        result.sibling_verdict = (f"beats all {len(result.siblings)} other configs; against the fastest "
                                  f"({fastest.config.get('words', '?')}): {fastest.speedup:.3f}x")
    return not lost


def _timings_against(engine: Engine, built: BuildResult, record: str, siblings: Sequence[Sibling]) -> list[SiblingTiming]:
    """`built` on `record` against each sibling config's original on its own record."""
    out = []
    for sib in siblings:
        m = engine.measure(sib.base, built, [record], Budget(), original_launches=[sib.record])
        timing = SiblingTiming(dict(sib.config), "unmeasured", reason=m.reason or m.status)
        if m.status == "timed" and m.speedup:
            timing = SiblingTiming(dict(sib.config), "not beaten", m.speedup, m.detail.get("speedup_range"), _noise(m),
                                   m.time_before_us, m.time_after_us, m.detail.get("outputs_equal"),
                                   "; ".join(m.suspicious))
            if _clears(timing.speedup, timing.speedup_range, timing.noise) and not m.suspicious:
                timing.status = "beaten"
        out.append(timing)
    return out


class SearchPrior:
    """What won on the kernels already searched in one run, by kind of kernel (`spaces.kernel_kind`): pipeline
    spelling -> the best log speedup of a winner with that edit. Kernels of one program are often alike
    (Inductor's pointwise kernels): on the H200 `ttgir(num-warps{n=2})` won on the MLP's silu and the
    transformer's gelu kernel, while most kernels got one to three trials before the run's time ran out, so the
    next kernel tries the run's winners first; only those of its kind: what won on a pointwise kernel (fewer
    warps) is not tried first on a reduction, whose first trial may be its only one."""

    def __init__(self) -> None:
        self.by_kind: dict[str, dict[str, float]] = {}

    def learn(self, search: KernelSearch) -> None:
        w = search.best
        if w is not None and w.score is not None and w.score > 0:
            mine = self.by_kind.setdefault(kernel_kind(search.kernel), {})
            mine[w.pipeline] = max(mine.get(w.pipeline, 0.0), w.score)

    def for_kernel(self, name: str) -> dict[str, float]:
        """What won on the run's kernels of the same kind as the kernel `name`."""
        return dict(self.by_kind.get(kernel_kind(name), {}))


def _neighbour(current: tuple[Atom, ...], by_pass: dict[str, list[Atom]], rng: random.Random,
               max_edits: int) -> tuple[Atom, ...] | None:
    used = {a.pass_name for a in current}
    moves = []
    if len(current) < max_edits and len(used) < len(by_pass):
        moves.append("add")
    if len(current) > 1:
        moves.append("drop")
    if any(len(by_pass[a.pass_name]) > 1 for a in current):
        moves.append("swap")
    if not moves:
        return None
    move = rng.choice(moves)
    seq = list(current)
    if move == "add":
        name = rng.choice(sorted(set(by_pass) - used))
        seq.append(rng.choice(by_pass[name]))
    elif move == "drop":
        seq.pop(rng.randrange(len(seq)))
    else:
        i = rng.choice([i for i, a in enumerate(seq) if len(by_pass[a.pass_name]) > 1])
        seq[i] = rng.choice([b for b in by_pass[seq[i].pass_name] if b != seq[i]])
    return tuple(seq)


def _winner(trials: Sequence[Trial], skip: Sequence[int] = ()) -> int | None:
    """The measured trial with the best speedup that clears the guard (not one of `skip`), or None."""
    best: int | None = None
    for i, t in enumerate(trials):
        if i in skip or not t.measured or t.status != "equivalent" or t.speedup is None or t.suspicious:
            continue
        if not _clears(t.speedup, t.speedup_range, t.noise):
            continue
        if best is None or t.speedup > (trials[best].speedup or 0.0):
            best = i
    return best


def _hazards(engine: Engine, entry: str, built: BuildResult, trial: Trial) -> None:
    """AMDGCN candidates: no new use of a loaded register before its `s_waitcnt` (backends/amd_hazards.py)."""
    from pathlib import Path

    from kstrata.backends.amd_hazards import check_waitcnt_hazards
    from kstrata.backends.checks import CheckFailed

    original = next(Path(entry).glob("*.amdgcn"), None)
    candidate = next(Path(engine.built_entry(built)).glob("*.amdgcn"), None)
    if original is None or candidate is None:
        trial.status, trial.reason = "unproven", trial.reason + "; no AMDGCN to check for s_waitcnt hazards"
        return
    try:
        summary = check_waitcnt_hazards(original.read_text(), candidate.read_text())
    except CheckFailed as exc:
        trial.status, trial.reason = "different", f"s_waitcnt hazard: {exc}"
        return
    trial.reason = f"{trial.reason}; s_waitcnt: {summary}"
