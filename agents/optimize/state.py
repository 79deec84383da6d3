"""What the search knows, as typed values: nodes of the tree, the per-task memory, and `SearchState`,
the read-only view a proposer gets (see the package docstring for the proposer interface)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kstrata.agents.optimize.candidate import TaskCandidate

if TYPE_CHECKING:
    from kstrata.agents.optimize.contract import Contract
    from kstrata.agents.optimize.findings import Finding
    from kstrata.agents.tasks import TaskSpec


@dataclass(frozen=True)
class CheckResult:
    """The hardened evaluator's verdict on one candidate (correctness and integrity; no timing)."""

    ok: bool
    reason: str
    failure: str | None  # evaluate's failure kind: crash, timeout, import, integrity, mismatch, shape, flagged
    eval_policy: str  # the evaluator's policy that decided: strict, or kernelbench for tf32/bf16/fp16 runs
    seconds: float
    #: Where the reference's trials came from: "run", or "cache <key>" (kstrata.agents.reference_cache); "" unknown.
    reference: str = ""
    #: Of `seconds`, those until the reference's trials were there (its run, or the cache's answer); 0 unknown.
    reference_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "reason": self.reason, "failure": self.failure, "eval_policy": self.eval_policy,
                "seconds": round(self.seconds, 3), "reference_source": self.reference,
                "reference_s": round(self.reference_s, 3)}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> CheckResult:
        return cls(d["ok"], d["reason"], d.get("failure"), d.get("eval_policy", "strict"), d.get("seconds", 0.0),
                   d.get("reference_source", ""), d.get("reference_s", 0.0))


@dataclass(frozen=True)
class Measurement:
    """One candidate's time in an interleaved measurement: the median over rounds of per-round medians."""

    median_us: float
    rounds_us: tuple[float, ...]  # per-round medians, in the order measured
    runs_per_round: int
    spread: float  # relative half-range of the round medians: this candidate's own noise

    def to_json(self) -> dict[str, Any]:
        return {"median_us": self.median_us, "rounds_us": list(self.rounds_us), "runs_per_round": self.runs_per_round,
                "spread": self.spread}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Measurement:
        return cls(d["median_us"], tuple(d["rounds_us"]), d["runs_per_round"], d["spread"])


def paired_ratio(ref: Measurement, new: Measurement, floor: float) -> tuple[float, float]:
    """How much faster `new` is than `ref`, and the noise of that figure, from one interleaved measurement.

    The two were timed round by round, side by side (`worker.measure` rotates the order each round), so round
    i of one and round i of the other saw the same moment of the host: their ratio cancels what the two share
    (a slow patch of the host slows both). The answer is the median of the per-round ratios and their relative
    half-range (at least `floor`), the same noise measure as `Measurement.spread`, taken of the ratio rather
    than of each side. Before (until 2026-12-03) the noise was the larger spread of the two sides, which
    counts a drift common to both as noise: on the H200 an addmm epilogue won all 7 rounds of its confirmation
    against eager, by 1.4% to 9.2% (median 5.8%), and was called "within noise" because eager's own rounds
    spread 5.8%. Paired, the noise is 3.7% and the win stands; a challenger whose per-round ratios straddle 1
    by more than their median gain is still noise. With rounds that do not pair up (different counts, fewer
    than 3), the medians' ratio and the larger spread, as before."""
    if len(ref.rounds_us) == len(new.rounds_us) >= 3 and all(x > 0 for x in new.rounds_us):
        rs = sorted(a / b for a, b in zip(ref.rounds_us, new.rounds_us, strict=True))
        k = len(rs)
        med = rs[k // 2] if k % 2 else (rs[k // 2 - 1] + rs[k // 2]) / 2
        return med, max((rs[-1] - rs[0]) / 2 / med, floor)
    return ref.median_us / new.median_us, max(ref.spread, new.spread, floor)


@dataclass
class Node:
    """One candidate in the search tree."""

    candidate: TaskCandidate
    index: int  # order of creation within the task
    depth: int
    elapsed_s: float  # seconds since the task started, when it was judged
    check: CheckResult | None = None
    timing: Measurement | None = None
    speedup: float | None = None  # over the best baseline (the starting incumbent), from interleaved rounds
    sol_fraction: float | None = None
    reward: float = 0.0
    visits: int = 0
    children: list[str] = field(default_factory=list)
    status: str = "pending"  # pending, rejected, correct (not timed), measured, incumbent, skipped
    note: str = ""

    @property
    def key(self) -> str:
        return self.candidate.key

    @property
    def space(self) -> str:
        return self.candidate.space


@dataclass(frozen=True)
class Conclusion:
    """What a worker learned, shared with the others (never the candidate itself)."""

    space: str
    proposer: str
    what: str  # the edit, in words
    outcome: str  # "faster", "no gain", "slower", "failed", "correct (not timed)"
    speedup: float | None = None
    detail: str = ""

    def text(self) -> str:
        s = f"{self.space}: {self.what}: {self.outcome}"
        if self.speedup is not None:
            s += f" ({self.speedup:.3f}x)"
        return s + (f" — {self.detail}" if self.detail else "")

    def to_json(self) -> dict[str, Any]:
        return {"space": self.space, "proposer": self.proposer, "what": self.what, "outcome": self.outcome,
                "speedup": self.speedup, "detail": self.detail}


class SearchMemory:
    """The per-task memory: conclusions, and per space how often it failed or gained (for pruning)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.conclusions: list[Conclusion] = []
        self.failures: dict[str, int] = {}
        self.consecutive_failures: dict[str, int] = {}
        self.wins: dict[str, int] = {}

    def add(self, c: Conclusion) -> None:
        with self._lock:
            self.conclusions.append(c)
            if c.outcome == "failed":
                self.failures[c.space] = self.failures.get(c.space, 0) + 1
                self.consecutive_failures[c.space] = self.consecutive_failures.get(c.space, 0) + 1
            else:
                self.consecutive_failures[c.space] = 0
            if c.outcome == "faster":
                self.wins[c.space] = self.wins.get(c.space, 0) + 1

    def about(self, space: str) -> list[Conclusion]:
        with self._lock:
            return [c for c in self.conclusions if c.space == space]


@dataclass(frozen=True)
class TaskInfo:
    path: Path
    name: str
    source: str  # the task file's text
    spec: TaskSpec


@dataclass
class SearchState:
    """The view a proposer gets. Proposers read it; only `note` writes (a reason the report shows)."""

    task: TaskInfo
    contract: Contract
    policy: str
    device: str
    findings: list[Finding]
    incumbent: Node
    baselines: dict[str, Node]
    memory: SearchMemory
    tried: frozenset[str]
    parent: Node | None = None
    space: str | None = None
    notes: dict[str, str] = field(default_factory=dict)

    def note(self, proposer: str, why: str) -> None:
        """Why `proposer` had nothing for this state's parent. The parent is named: a proposer is asked once per
        parent, and the last answer is the one kept (on the H200, 2026-12-04, the report said "no addmm-epilogue
        pattern in the task's graph" beside the addmm-epilogue candidate that won: it had been asked again on
        that winner, where the pattern was gone)."""
        where = self.parent.candidate.description if self.parent is not None else ""
        self.notes[proposer] = f"{why} (asked on {where})" if where and where not in why else why

    def finding(self, kind: str) -> Finding | None:
        return next((f for f in self.findings if f.kind == kind), None)


@dataclass(frozen=True)
class LoopServices:
    """What the loop lends a proposer's optional `prepare(state, services)` (the one place a proposer may run
    work that builds, checks or times: the `ir` space's recording and kernel-level search). `evaluator` is the
    loop's (`evaluation.Evaluator`: its `workers` are the pool every GPU job of the task goes through, so a
    kernel's timing waits for the loop's checks and they for it); `time_left_s()` is what the task may still
    spend before its final re-evaluation's reserve; `budget` the candidates the task may still judge."""

    evaluator: Any
    task: Path
    workdir: Path
    time_left_s: Any  # Callable[[], float]
    budget: int
    timeout_s: float
    progress: Any  # Callable[[str], None]
    #: The model's kernel-level answers (`kstrata.agents.llm.kernel.KernelLLM`, with `--llm --llm-spaces ir,asm`):
    #: the `ir` space's kernel searches hand it each kernel after the passes' singletons; None without a model.
    kernel_llm: Any = None
