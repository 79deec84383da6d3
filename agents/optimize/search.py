"""The search: one task from contract to `model_new.py`; a directory of tasks; resumable.

`optimize_task` runs, in order (each step an event in `trajectory.jsonl`, so `--resume` replays it):

1. **Contract** — the task spec, the policy, and the degenerate-task probe (`contract.py`).
2. **Baselines** — eager, `torch.compile`, `max-autotune` as ModelNew sources, each checked by the hardened
   evaluator (at the same time as the contract's probe, and as each other where the CPUs allow), then timed
   interleaved in one process; the fastest correct one is the incumbent (on the CPU nothing is timed: eager is
   the incumbent, and the compiled baselines are not built).
3. **Profile → findings** — torch.profiler, Nsight Compute (when `ncu` runs), SASS of the incumbent's Triton
   kernels, the roofline point; analyzers (`findings.py`).
4. **Plan** — spaces ordered by findings and headroom (`planner.py`).
5. **Tree search** — strategy workers (threads; the heavy work is in child processes), each owning a space
   from the plan. A worker picks the node to expand by UCT over log-scaled rewards with progressive widening
   (a node of `n` visits may have `ceil(WIDEN_C * (n + 1) ** WIDEN_ALPHA)` children), asks its space's
   proposers for the node's refinements, and judges the first untried one: hardened check, contract check,
   interleaved measurement against the best baseline and the incumbent. Workers share *conclusions* (the
   search memory), never candidates. A space failing `PRUNE_AFTER` times in a row is pruned; a worker whose
   last `plateau` measured candidates gained nothing drafts from another space. **Benchmark guard**: a
   challenger replaces the incumbent only after a fresh interleaved re-measurement (`guard_rounds`) beats it by
   more than the measured noise (the median of the per-round ratios against the relative half-range of those
   ratios, at least `MIN_NOISE`: `state.paired_ratio`) and is
   not flagged by the roofline (faster than SOL, or > 10x). A guard taken beside other work can drown a real
   gain in noise: a challenger faster by more than `MIN_NOISE` but within the noise is **deferred**, and once
   the workers have stopped (nothing else runs) the best `QUIET_GUARDS` of them are guarded again, in the
   quiet, against the incumbent of that moment. Stops at >= 95% of SOL, at the budget or the time limit, or
   when every space is exhausted or pruned.
6. **Final** — the incumbent written as `model_new.py` (its header: policy, space, measured speedup) and
   re-evaluated in fresh processes with fresh seeds; `report.md` with plots.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kstrata.agents.optimize.candidate import TaskCandidate
from kstrata.agents.optimize.codegen import set_measured
from kstrata.agents.optimize.configs import baseline_params, render
from kstrata.agents.optimize.contract import Contract, Degeneracy, judge_degeneracy, make_contract, output_layouts
from kstrata.agents.optimize.evaluation import Evaluator, FinalVerdict
from kstrata.agents.optimize.findings import AT_SOL, Evidence, Finding, analyze, discover_analyzers
from kstrata.agents.optimize.planner import Plan, plan
from kstrata.agents.optimize.proposers import Proposer, discover_proposers
from kstrata.agents.optimize.state import (
    CheckResult,
    Conclusion,
    LoopServices,
    Measurement,
    Node,
    SearchMemory,
    SearchState,
    TaskInfo,
    paired_ratio,
)
from kstrata.agents.optimize.trajectory import TRAJECTORY_SCHEMA, Trajectory, write_atomic
from kstrata.ir.errors import KstrataError
from kstrata.ir.files import make_dir

BASELINES = ("eager", "compile", "compile-max-autotune")
WIDEN_C = 1.0
WIDEN_ALPHA = 0.5
UCT_C = 0.7
PRUNE_AFTER = 3
MIN_NOISE = 0.01
#: Deferred challengers guarded again once the search stopped (see the module docstring): on the H200
#: (2026-12-02) a CUDA-graph candidate steady at 89-95 us lost its guard to a launch-bound torch.compile
#: incumbent whose rounds ranged 88-168 us while the ir space recorded and compiled beside it (1.13x, noise 38%).
QUIET_GUARDS = 2
#: Spaces whose workers may also refine the baselines other than the best (see `TaskSearch._expandable`).
OTHER_BASELINE_SPACES = ("library", "compiler", "graph")
FAILURE_REWARD = -1.0
#: The search starts no later than this fraction into the task's time limit: profiling that would run past it
#: is skipped (with a note), so every task gets a guaranteed share of its time for candidates.
SEARCH_START_FRACTION = 0.5
#: Below this per-task time limit (minutes) the compile-max-autotune baseline is not built (its autotuning
#: alone can take a minute); the note says so.
MAX_AUTOTUNE_MIN_MINUTES = 4.0
#: The deadline (`--minutes`) covers baselines, profile, search, the final re-evaluation and the report. The
#: final re-evaluation is the same hardened evaluation as a candidate's check, in fresh processes, plus the
#: timed runs of the candidate and of eager: its cost is estimated as FINAL_CHECK_FACTOR times the measured
#: check of the node, plus FINAL_TIMED_RUNS runs of both at FINAL_RUN_COST times their measured medians
#: (warm-up, the L2 flush between runs), plus FINAL_OVERHEAD_S (process start, imports).
FINAL_CHECK_FACTOR = 1.2
FINAL_TIMED_RUNS = 110
FINAL_RUN_COST = 2.0
FINAL_OVERHEAD_S = 5.0
#: Fresh re-evaluations of a win's skill gate (`kstrata.agents.skills.admit`: three seeds other than the task's).
SKILL_REPRODUCTIONS = 3
#: How far apart two fresh-process timings of the same code may be before the result says the host's timings
#: are not to be trusted to better than that.
SAME_CODE_SPREAD = 0.10
#: Writing report.md and its plots (matplotlib) after the final re-evaluation.
REPORT_S = 10.0
#: A child process started near the deadline gets at least this long (shorter than that it cannot finish
#: even a small evaluation); the cap on its time is what is left before the final's reserve.
MIN_CHILD_TIMEOUT_S = 30.0
#: The baselines' hardened checks run at the same time when the machine has this many usable CPUs for each
#: (its reference and candidate processes, an Inductor compile's workers); with fewer, one after the other,
#: so the second one reuses the reference run the first one left in the reference cache. Measured on a
#: shared 2-core machine, at the same time they gained nothing measurable (two reference runs on two busy
#: cores).
CPUS_PER_PARALLEL_CHECK = 4
#: ... and only for a task whose inputs, outputs and parameters take at most this much: each evaluation plans
#: its memory for itself alone (`kstrata.agents.evaluate.memory_plan`), so two at once are kept to tasks
#: whose evaluations are small beside a GPU's and the host's memory.
PARALLEL_CHECK_MAX_BYTES = 1 << 30
#: Loading and tracing a task touch torch's global state (RNG, default dtype and device), and proposers may
#: load and trace too: one at a time across the tasks a directory run optimizes in parallel.
TASK_LOCK = threading.RLock()


class OptimizeError(KstrataError):
    """The optimizer cannot run on this task or output directory (a user error: one line, exit 2)."""


@dataclass
class Options:
    budget: int = 24  # candidates beyond the baselines
    minutes: float = 10.0
    policy: str = "strict"
    workers: int = 1
    device: str = "cpu"
    resume: bool = False
    baselines: tuple[str, ...] = BASELINES
    spaces: tuple[str, ...] | None = None
    plateau: int = 4
    rounds: int = 5
    runs: int = 30
    guard_rounds: int = 7
    ncu: bool = True
    seed: int = 42
    final_seed: int = 20261201
    trials: int = 6
    timeout_s: float = 600.0
    plugins: bool = True
    extra_proposers: tuple[Any, ...] = ()
    ceilings: Any = None  # roofline.Ceilings (GPU), measured by the caller
    lock_path: Path | None = None
    progress: Callable[[str], None] = print
    clock: Callable[[], float] = time.monotonic  # a fake one in tests
    #: When set, a timed win is summarized into a skill there, admitted only if it reproduces (fresh
    #: processes, other seeds): kstrata.agents.skills.learn_from_win.
    skills_dir: Path | None = None
    #: Where the jobs run (kstrata.agents.workers: this machine's GPUs, or a Ray cluster); None: this machine,
    #: one unpinned GPU worker.
    pool: Any = None
    #: The model's kernel-level answers for the `ir` space (`kstrata.agents.llm.kernel.KernelLLM`); None: none.
    kernel_llm: Any = None


@dataclass
class TaskResult:
    task: str
    path: str
    out_dir: str
    status: str  # done, failed
    incumbent_baseline: str = ""
    chosen_space: str = ""
    chosen: str = ""
    speedup: float | None = None  # over the best baseline (interleaved rounds)
    speedup_vs_eager: float | None = None  # the final evaluation's (fresh process, fresh seeds)
    #: over the best baseline, re-measured at the end against it in a fresh process (`TaskSearch.confirm`)
    speedup_confirmed: float | None = None
    confirmation: str = ""  # faster, within noise, slower (fell back), failed, or "" when not confirmed
    sol_before: float | None = None
    sol_after: float | None = None
    timed: bool = False
    degenerate: bool = False
    degenerate_reasons: list[str] = field(default_factory=list)
    findings: list[str] = field(default_factory=list)
    candidates: int = 0
    seconds: float = 0.0
    stop_reason: str = ""
    cut_short: bool = False  # the deadline stopped the search before its budget or a plateau
    final_ok: bool = False
    final_reason: str = ""
    note: str = ""
    error: str = ""

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _sandboxed(c: TaskCandidate) -> bool:
    """Generated candidates (the LLM's) run in the restricted environment of kstrata.agents.llm.sandbox."""
    return bool(c.params.get("sandbox"))


def _box(sandbox: bool) -> dict[str, bool]:
    """`sandbox=True` for the evaluator only when needed (evaluators without the keyword keep working)."""
    return {"sandbox": True} if sandbox else {}


def parallel_checks(n: int, task_bytes: int = 0) -> int:
    """How many of `n` independent hardened checks of a task whose tensors take `task_bytes` to run at once on
    this machine (`CPUS_PER_PARALLEL_CHECK`, `PARALLEL_CHECK_MAX_BYTES`)."""
    if task_bytes > PARALLEL_CHECK_MAX_BYTES:
        return 1
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cpus = os.cpu_count() or 1
    return max(1, min(n, cpus // CPUS_PER_PARALLEL_CHECK))


def task_bytes(spec: Any) -> int:
    """The bytes of a task's inputs, outputs and parameters (what an evaluation holds at least, per copy)."""
    tensors = [a for a in (*spec.inputs, *spec.outputs) if hasattr(a, "bytes")]
    return int(sum(a.bytes for a in tensors) + spec.parameters.bytes)


def _cuda_arch() -> str:
    """The GPU's target name (`cuda:90`), '' when it cannot be read."""
    try:
        import torch

        major, minor = torch.cuda.get_device_capability()
        return f"cuda:{major}{minor}"
    except Exception:
        return ""


def _log_reward(speedup: float | None) -> float:
    return math.log(speedup) if speedup and speedup > 0 else 0.0


class TaskSearch:
    """The state of one task's optimization; `run()` does the steps of the module docstring."""

    def __init__(self, task_path: Path, out_dir: Path, opts: Options, evaluator: Evaluator) -> None:
        from kstrata.agents.tasks import load_task

        self.opts = opts
        self.ev = evaluator
        with TASK_LOCK:
            task = load_task(task_path)  # a TaskError names the file; the CLI turns it into one line, exit 2
        self.info = TaskInfo(task_path, task.name, task_path.read_text(), task.spec)
        self.out = out_dir
        self.cand_dir = out_dir / "candidates"
        self.traj = Trajectory(out_dir / "trajectory.jsonl")
        self.lock = threading.RLock()
        self.nodes: dict[str, Node] = {}
        self.order: list[str] = []
        self.memory = SearchMemory()
        self.notes: dict[str, str] = {}
        self.baselines: dict[str, Node] = {}
        self.base_key = ""  # the best baseline: speedups are over it
        self.incumbent_key = ""
        self.findings: list[Finding] = []
        self.evidence_json: dict[str, Any] = {}
        self.plan: Plan | None = None
        self.pruned: dict[str, str] = {}
        self.exhausted: set[str] = set()
        self.events: list[dict[str, Any]] = []
        self.contract: Contract | None = None
        self.elapsed_offset = 0.0
        self.start = opts.clock()
        self.stop_reason = ""
        self.final: dict[str, Any] | None = None
        self.confirmation: dict[str, Any] | None = None
        self._exhausted_nodes: set[tuple[str, str]] = set()  # (node, space) pairs with nothing left to propose
        self._candidate_s: list[float] = []  # seconds each judged candidate took (check, measure, guard)
        self._baseline_measure_s = 0.0
        self._repeated_reference: set[str] = set()  # baselines whose check ran the reference another one ran
        self.cut_short = ""  # why the deadline cut the search short, when it did
        #: challengers whose guard was within its noise but faster by more than MIN_NOISE: key -> ratio
        self.deferred: dict[str, float] = {}
        self.proposers, problems = discover_proposers(opts.extra_proposers, plugins=opts.plugins)
        for p in problems:
            self.notes[f"plugin {p.entry_point}"] = p.reason

    # -- bookkeeping -------------------------------------------------------------------------------
    def elapsed(self) -> float:
        return self.elapsed_offset + self.opts.clock() - self.start

    def search_start_s(self) -> float:
        """Elapsed seconds by which the search must start (profiling gives way after that, and never eats the
        final re-evaluation's reserve)."""
        limit = self.opts.minutes * 60
        return min(SEARCH_START_FRACTION * limit, limit - self.final_reserve_s())

    # -- the deadline ------------------------------------------------------------------------------
    def final_cost_s(self, n: Node) -> float:
        """Estimated seconds of a fresh final re-evaluation of `n`, from its measured check and timing."""
        check_s = self._check_s(n) if n.check and n.check.seconds else max(
            (self._check_s(m) for m in self.nodes.values() if m.check), default=0.0)
        timed_s = 0.0
        if self.ev.timed:
            eager = self.baselines.get("eager")
            us = [x.timing.median_us for x in (n, eager) if x is not None and x.timing]
            per_call = (sum(us) if len(us) == 2 else 2 * sum(us)) * 1e-6
            timed_s = FINAL_TIMED_RUNS * FINAL_RUN_COST * per_call
        return FINAL_CHECK_FACTOR * check_s + timed_s + FINAL_OVERHEAD_S

    def final_reserve_s(self) -> float:
        """What the end of the task needs: the incumbent's final re-evaluation and the report. A fallback's
        re-evaluation (rare: the incumbent passed the same hardened check during the search) is not reserved:
        it runs when it fits, and otherwise the output says it was not re-evaluated (`step_final`)."""
        with self.lock:
            inc = self.nodes.get(self.incumbent_key)
        if inc is None:  # before the baselines: nothing measured yet
            return REPORT_S + FINAL_OVERHEAD_S
        return (self.final_cost_s(inc) + self.skill_reserve_s(inc) + self.confirm_cost_s() + self.quiet_guard_reserve_s()
                + REPORT_S)

    def quiet_guard_reserve_s(self) -> float:
        """The deferred challengers' guards after the search: one measurement each (about what the baselines'
        measurement took), reserved once there is one (before that nothing is reserved)."""
        with self.lock:
            n = min(QUIET_GUARDS, len(self.deferred))
        return n * self._baseline_measure_s if self.ev.timed else 0.0

    def confirm_cost_s(self) -> float:
        """The end's confirmation measurement (`confirm`): about what the baselines' measurement took."""
        return self._baseline_measure_s if self.ev.timed else 0.0

    def skill_reserve_s(self, inc: Node) -> float:
        """With `--learn-skills`, a win's skill gate after the final: one fresh re-evaluation per other seed.
        Reserved as soon as there is a win (the incumbent is no baseline), so the search stops in time for it:
        on the H200 (2026-12-02) three wins were "not tried: its reproductions did not fit" when only the final
        was reserved. Not before a win: reserved from the start, it left a 2.1-minute task 85 s that no
        candidate fitted into, beside a 144 s reserve for a gate that only a win would have run (H200,
        2026-12-02, tag ir); a skill is worth less than the search that finds the win. A win found too late for
        its reproductions is said so ("not tried"). Nothing is reserved without a timer."""
        if self.opts.skills_dir is None or not self.ev.timed or inc.space == "baseline":
            return 0.0
        return SKILL_REPRODUCTIONS * self.final_cost_s(inc)

    def time_left_s(self) -> float:
        return self.opts.minutes * 60 - self.elapsed()

    def next_candidate_s(self) -> float:
        """Estimated seconds of the next candidate (check, measurement, guard): the mean of the last three,
        or before any, the mean baseline check plus the baselines' measurement (the slowest check is the cold
        compile of the compile baseline, which a template's or a configuration's check seldom repeats)."""
        with self.lock:
            recent = self._candidate_s[-3:]
        if recent:
            return sum(recent) / len(recent)
        checks = [self._check_s(n) for n in self.baselines.values() if n.check]
        return (sum(checks) / len(checks) if checks else 0.0) + self._baseline_measure_s

    def _check_s(self, n: Node) -> float:
        """The seconds of `n`'s check the deadline's estimates use: as measured, less its reference run when that
        run was only repeated because the baselines were checked at the same time (one after the other, the
        cache would have answered it, and the estimates stay those of that order)."""
        c = n.check
        if c is None:
            return 0.0
        return max(0.0, c.seconds - c.reference_s) if n.key in self._repeated_reference else c.seconds

    def _child_limit(self) -> dict[str, Any]:
        """`timeout_s=` for a candidate's child processes when the deadline is nearer than `opts.timeout_s`."""
        left = self.opts.minutes * 60 - self.elapsed() - self.final_reserve_s()
        cap = max(MIN_CHILD_TIMEOUT_S, left)
        return {"timeout_s": cap} if cap < self.opts.timeout_s else {}

    def say(self, msg: str) -> None:
        self.opts.progress(f"[{self.info.name}] {msg}")

    def emit(self, event: dict[str, Any]) -> None:
        event = {"type": event.pop("type"), "t": round(self.elapsed(), 3), **event}
        self.events.append(event)
        self.traj.append(event)

    @property
    def incumbent(self) -> Node:
        return self.nodes[self.incumbent_key]

    def write_candidate(self, c: TaskCandidate) -> Path:
        path = self.cand_dir / f"{c.key}.py"
        if not path.exists():
            write_atomic(path, c.source)
        return path

    def node_event(self, n: Node) -> dict[str, Any]:
        c = n.candidate
        return {"type": "candidate", "key": c.key, "index": n.index, "parent": c.parent, "depth": n.depth,
                "space": c.space, "proposer": c.proposer, "edit": c.edit_json(), "status": n.status,
                "verdict": n.check.to_json() if n.check else None, "timing": n.timing.to_json() if n.timing else None,
                "speedup": n.speedup, "sol_fraction": n.sol_fraction, "reward": n.reward, "note": n.note,
                "elapsed_s": round(n.elapsed_s, 3), "source": f"candidates/{c.key}.py"}

    # -- resume ------------------------------------------------------------------------------------
    def replay(self) -> None:
        for ev in self.traj.replay():
            kind = ev["type"]
            self.elapsed_offset = max(self.elapsed_offset, float(ev.get("t", 0.0)))
            if kind == "start":
                if ev.get("sha256") != self.info.spec.sha256:
                    raise OptimizeError(f"{self.traj.path}: the task file changed since this run started; "
                                        "use a new --out")
                if ev.get("policy") != self.opts.policy:
                    raise OptimizeError(f"{self.traj.path}: started under --precision {ev.get('policy')}; resume "
                                        "with the same policy or use a new --out")
            elif kind == "contract":
                self.contract = make_contract(self.info.spec, self.opts.policy, Degeneracy.from_json(ev["degeneracy"]))
            elif kind == "candidate":
                src = (self.out / ev["source"]).read_text() if (self.out / ev["source"]).exists() else None
                if src is None:
                    continue  # written after its event? never: sources are written first. Skip a stray event.
                e = ev["edit"]
                c = TaskCandidate(src, ev["space"], ev["proposer"], e["description"], e["params"], e["policy"],
                                  ev["parent"])
                n = Node(c, ev["index"], ev["depth"], ev["elapsed_s"],
                         CheckResult.from_json(ev["verdict"]) if ev["verdict"] else None,
                         Measurement.from_json(ev["timing"]) if ev["timing"] else None, ev["speedup"],
                         ev["sol_fraction"], ev["reward"], status=ev["status"], note=ev.get("note", ""))
                self._add_node(n, replayed=True)
            elif kind == "baselines":
                self.baselines = {b: self.nodes[k] for b, k in ev["keys"].items() if k in self.nodes}
                self.base_key = self.incumbent_key = ev["incumbent"]
                self.nodes[self.base_key].status = "incumbent"
            elif kind == "evidence":
                self.evidence_json = ev["evidence"]
            elif kind == "findings":
                self.findings = [Finding.from_json(f) for f in ev["findings"]]
            elif kind == "plan":
                self.plan = Plan.from_json(ev["plan"])
            elif kind == "incumbent":
                if self.incumbent_key in self.nodes:
                    self.nodes[self.incumbent_key].status = "measured"
                self.incumbent_key = ev["key"]
                self.nodes[self.incumbent_key].status = "incumbent"
            elif kind == "prune":
                self.pruned[ev["space"]] = ev["reason"]
            elif kind == "guard":
                if ev.get("deferred"):
                    self.deferred[ev["key"]] = float(ev["ratio"])
                elif ev.get("quiet"):
                    self.deferred.pop(ev["key"], None)
            elif kind == "conclusion":
                self.memory.add(Conclusion(**ev["conclusion"]))
            elif kind == "final":
                self.final = ev
            elif kind == "confirm":
                self.confirmation = ev
                if ev.get("verdict") == "slower" and ev.get("baseline") in self.nodes:
                    self._fall_back_to(ev["baseline"], ev["reason"])
            self.events.append(ev)

    def _add_node(self, n: Node, replayed: bool = False) -> None:
        with self.lock:
            self.nodes[n.key] = n
            if n.key not in self.order:
                self.order.append(n.key)
            parent = self.nodes.get(n.candidate.parent or "")
            if parent is not None and n.key not in parent.children:
                parent.children.append(n.key)
            if n.status not in ("pending",) and n.space != "baseline":
                self._backprop(n)

    def _backprop(self, n: Node) -> None:
        key: str | None = n.candidate.parent
        n.visits += 1
        seen = {n.key}
        while key and key in self.nodes and key not in seen:
            seen.add(key)
            p = self.nodes[key]
            p.visits += 1
            p.reward += (n.reward - p.reward) / p.visits  # running mean of the subtree's rewards
            key = p.candidate.parent

    # -- the steps -------------------------------------------------------------------------------
    def run(self) -> TaskResult:
        self.out.mkdir(parents=True, exist_ok=True)
        if self.opts.resume:
            self.replay()
        if self.final is None:
            if not any(e["type"] == "start" for e in self.events):
                self.emit({"type": "start", "schema": TRAJECTORY_SCHEMA, "task": str(self.info.path),
                           "sha256": self.info.spec.sha256, "policy": self.opts.policy, "device": self.opts.device})
            self.step_contract_and_baselines()
            if not self.findings:
                self.step_findings()
            if self.plan is None:
                self.plan = plan(self.findings, self.incumbent.sol_fraction, {p.space for p in self.proposers},
                                 self.opts.spaces)
                self.emit({"type": "plan", "plan": self.plan.to_json()})
            self.say("plan: " + (", ".join(f"{s.space} ({s.score:.2f})" for s in self.plan.order) or "nothing") +
                     (f"; stop: {self.plan.stop_reason}" if self.plan.stop_reason else ""))
            self.step_search()
            self.step_quiet_guards()
            self.step_final()
        from kstrata.agents.optimize.report import write_task_report

        result = self.result()
        write_task_report(self, result)
        write_atomic(self.out / "result.json", json.dumps(result.to_json(), indent=1) + "\n")
        return result

    def step_contract_and_baselines(self) -> None:
        """The contract's probe and the baselines' checks at the same time: neither reads the other (the
        baselines need only the task's spec; the probe runs the task's own Model), and neither is timed.
        The baselines' measurement still goes through the GPU's timing slot, so no timing is disturbed."""
        if self.contract is not None:
            if not self.baselines:
                self.step_baselines()
            return
        if self.baselines:
            self.step_contract()
            return
        with ThreadPoolExecutor(max_workers=1) as pool:
            contract = pool.submit(self.step_contract)
            try:
                self.step_baselines()
            except BaseException:
                contract.exception()  # its events are written before the baselines' error goes up
                raise
            contract.result()

    def step_contract(self) -> None:
        r = self.ev.probe(self.info.path)
        if r.ok:
            deg = judge_degeneracy(r.data, self.info.spec.parameters.count > 0)
        else:
            deg = Degeneracy(False, (f"the probe did not run: {r.error}",), {}, checked=False)
        self.contract = make_contract(self.info.spec, self.opts.policy, deg)
        self.emit({"type": "contract", "contract": self.contract.to_json(), "degeneracy": deg.to_json()})
        if deg.degenerate:
            self.say("DEGENERATE: " + "; ".join(deg.reasons) + " (optimized, but left out of geomeans)")

    def _judge_check(self, nodes: list[Node], limit: dict[str, Any] | None = None, parallel: int | None = None) -> None:
        """The hardened check of `nodes`, in parallel (each evaluation is its own processes; `parallel` of them
        at a time, by default `--workers`); `limit`: a `timeout_s` for their processes (a candidate judged near
        the deadline)."""
        todo = [n for n in nodes if n.check is None]
        if not todo:
            return
        paths = {n.key: self.write_candidate(n.candidate) for n in todo}
        with ThreadPoolExecutor(max_workers=max(1, parallel or self.opts.workers)) as pool:
            results = list(pool.map(lambda n: self.ev.check(self.info.path, paths[n.key],
                                                             **_box(_sandboxed(n.candidate)), **(limit or {})), todo))
        for n, r in zip(todo, results, strict=True):
            n.check = r
            n.elapsed_s = self.elapsed()
            if not r.ok:
                n.status, n.reward, n.note = "rejected", FAILURE_REWARD, r.reason
        ok = [n for n in todo if n.check and n.check.ok]
        eager = self.baselines.get("eager")
        if eager is not None and eager in ok:  # the task's own Model defines the layouts: nothing to check
            ok.remove(eager)
            eager.status, eager.note = "correct", "the reference itself (not timed: no GPU)" if not self.ev.timed else ""
        if ok and not self.ev.timed:  # on a GPU the measurement checks the contract in its own process
            problems = self.ev.contract(self.info.path, {n.key: paths[n.key] for n in ok}, output_layouts(self.info.spec),
                                        **_box(any(_sandboxed(n.candidate) for n in ok)))
            for n in ok:
                if problems.get(n.key):
                    n.status, n.reward, n.note = "rejected", FAILURE_REWARD, f"contract: {problems[n.key]}"
                else:
                    n.status, n.note = "correct", "not timed: no GPU"

    def _measure(self, nodes: list[Node], rounds: int, limit: dict[str, Any] | None = None) -> dict[str, Measurement | str]:
        keys = {n.key: self.write_candidate(n.candidate) for n in nodes}
        return self.ev.measure(self.info.path, keys, output_layouts(self.info.spec), rounds=rounds, runs=self.opts.runs,
                               **_box(any(_sandboxed(n.candidate) for n in nodes)), **(limit or {}))

    def _sol(self, us: float, speedup: float | None = None) -> tuple[float | None, list[str], list[str]]:
        """(fraction of SOL, flags, explanations) of a time; `speedup` is over the best baseline, whose own
        time (measured with the baselines, before this candidate's rounds) places it on the roofline."""
        if self.opts.ceilings is None:
            return None, [], []
        from kstrata.agents.roofline import assess

        base = self.nodes.get(self.base_key)
        base_us = base.timing.median_us if base is not None and base.timing else None
        point = assess(self.info.spec, self.opts.ceilings, us * 1e-6, speedup,
                       baseline_seconds=base_us * 1e-6 if base_us else None,
                       baseline=base.candidate.description if base is not None else "the baseline",
                       policy=self.opts.policy)
        return point.fraction, list(point.flags), list(point.explanations)

    def step_baselines(self) -> None:
        names = list(self.opts.baselines) if self.ev.timed else ["eager"]
        if "eager" not in names:
            names.insert(0, "eager")
        if self.ev.timed and "compile-max-autotune" in names and self.opts.minutes < MAX_AUTOTUNE_MIN_MINUTES:
            names.remove("compile-max-autotune")
            self.notes["baselines"] = (f"compile-max-autotune not built: the task's time limit "
                                       f"({self.opts.minutes:g} min) is below {MAX_AUTOTUNE_MIN_MINUTES:g} min and "
                                       "its autotuning would take the search's time")
            self.say(self.notes["baselines"])
        if not self.ev.timed and len(self.opts.baselines) > 1:
            self.notes["baselines"] = ("no GPU: nothing is timed, so eager is the incumbent and the compiled baselines "
                                       "were not built")
        nodes = []
        for b in names:
            c = render(self.info, baseline_params(b), space="baseline", proposer=f"baseline:{b}",
                       description=f"baseline {b}")
            existing = self.nodes.get(c.key)
            n = existing or Node(c, len(self.order), 0, self.elapsed())
            self.baselines[b] = n
            nodes.append(n)
            with self.lock:
                self.nodes[n.key] = n
                if n.key not in self.order:
                    self.order.append(n.key)
        # At the same time where the CPUs allow, whatever --workers says: they are independent and untimed (on
        # the H200, one after the other cost 19-20 s each of a 2.5-minute task limit). A cold reference cache is
        # then missed by each; the candidates after them hit it.
        at_once = parallel_checks(len(nodes), task_bytes(self.info.spec))
        self._judge_check(nodes, parallel=at_once)
        if at_once > 1:
            ran = [n for n in nodes if n.check and n.check.reference == "run"]
            self._repeated_reference.update(n.key for n in ran[1:])
        eager = self.baselines["eager"]
        if not (eager.check and eager.check.ok):
            for n in nodes:
                self.emit(self.node_event(n))
            raise OptimizeError(f"{self.info.path}: the task's own Model fails the hardened evaluation, so nothing "
                                f"can be judged: {eager.check.reason if eager.check else 'not checked'}")
        ok = [n for n in nodes if n.check and n.check.ok and n.status != "rejected"]
        best = eager
        if self.ev.timed:
            t0 = self.elapsed()
            ms = self._measure(ok, self.opts.rounds)
            self._baseline_measure_s = self.elapsed() - t0
            for n in ok:
                m = ms.get(n.key)
                if isinstance(m, Measurement):
                    n.timing, n.status = m, "measured"
                    n.sol_fraction = self._sol(m.median_us)[0]
                else:
                    n.status, n.note = "rejected", str(m)
            timed = [n for n in ok if n.timing]
            if timed:
                best = min(timed, key=lambda n: n.timing.median_us if n.timing else math.inf)
            for n in timed:
                assert n.timing is not None and best.timing is not None
                n.speedup = best.timing.median_us / n.timing.median_us
        for n in nodes:
            self.emit(self.node_event(n))
            self.say(f"baseline {n.candidate.proposer.split(':')[1]}: {n.status}" +
                     (f", {n.timing.median_us:.1f} us" if n.timing else "") + (f" ({n.note})" if n.note else ""))
        best.status = "incumbent"
        self.base_key = self.incumbent_key = best.key
        self.emit({"type": "baselines", "keys": {b: n.key for b, n in self.baselines.items()}, "incumbent": best.key,
                   "notes": self.notes.get("baselines", "")})
        self.say(f"incumbent: baseline {best.candidate.proposer.split(':')[1]}")
        self.write_provisional()

    def step_findings(self) -> None:
        from kstrata.agents.optimize.graph import applicable_rewrites, graph_ops
        from kstrata.agents.optimize.profile import collect_evidence

        inc = self.incumbent
        with TASK_LOCK:
            ops = graph_ops(self.info.path, self.info.spec.sha256)
            rewrites = applicable_rewrites(self.info.path, self.info.spec.sha256)
        ev = Evidence(spec=self.info.spec, policy=self.opts.policy, device=self.opts.device,
                      incumbent=inc.candidate.description, incumbent_us=inc.timing.median_us if inc.timing else None,
                      incumbent_best_us=min(inc.timing.rounds_us) if inc.timing and inc.timing.rounds_us else None,
                      degeneracy=self.contract.degeneracy if self.contract else None, graph_ops=ops, rewrites=rewrites)
        if self.opts.ceilings is not None and inc.timing:
            from kstrata.agents.roofline import assess

            ev.roofline = assess(self.info.spec, self.opts.ceilings, inc.timing.median_us * 1e-6,
                                 policy=self.opts.policy).to_json()
            ev.ceilings = self.opts.ceilings.to_json()
        left = self.search_start_s() - self.elapsed()
        if left <= 0 and self.ev.timed:
            ev.profile_note = (f"profiling skipped: {self.elapsed():.0f} s of the task's {self.opts.minutes:g}-minute "
                               f"limit were used before it, and the search starts by "
                               f"{100 * SEARCH_START_FRACTION:.0f}% of it (findings from the operators only)")
        else:
            collect_evidence(ev, self, self.write_candidate(inc.candidate),
                             time_left=lambda: self.search_start_s() - self.elapsed())
        self.findings = analyze(ev, discover_analyzers(self.opts.plugins))
        self.evidence_json = {"profile": ev.profile, "profile_note": ev.profile_note, "ncu": ev.ncu,
                              "ncu_note": ev.ncu_note, "sass": ev.sass, "sass_note": ev.sass_note,
                              "roofline": ev.roofline}
        self.emit({"type": "evidence", "evidence": self.evidence_json})
        self.emit({"type": "findings", "findings": [f.to_json() for f in self.findings]})
        for f in self.findings:
            self.say(f"finding [{f.analyzer}] {f.text}")
        for note in ev.notes():
            self.say(f"note: {note}")

    # -- the tree search -------------------------------------------------------------------------
    def candidates_judged(self) -> int:
        return sum(1 for n in self.nodes.values() if n.space != "baseline" and n.status != "pending")

    def should_stop(self) -> str:
        with self.lock:  # candidates being judged by other workers count too: the budget is never overshot
            started = sum(1 for n in self.nodes.values() if n.space != "baseline")
        if started >= self.opts.budget:
            return f"budget of {self.opts.budget} candidates reached"
        left = self.opts.minutes * 60 - self.elapsed()
        if left <= 0:
            return f"time limit of {self.opts.minutes:g} minutes reached"
        need_next, need_final = self.next_candidate_s(), self.final_reserve_s()
        if need_next + need_final > left:
            with self.lock:
                self.cut_short = self.cut_short or (
                    f"cut short by the deadline: {left:.0f} s of the {self.opts.minutes:g}-minute limit left; the next "
                    f"candidate (about {need_next:.0f} s) and the final re-evaluation and report (about "
                    f"{need_final:.0f} s) would not fit")
            return self.cut_short
        sol = self.incumbent.sol_fraction
        if sol is not None and sol >= AT_SOL:
            return f"incumbent at {100 * sol:.0f}% of SOL"
        return ""

    def open_spaces(self) -> list[str]:
        assert self.plan is not None
        return [s for s in self.plan.spaces if s not in self.pruned and s not in self.exhausted]

    def step_search(self) -> None:
        assert self.plan is not None
        if self.plan.stop_reason:
            self.stop_reason = self.plan.stop_reason
        elif not self.plan.order:
            self.stop_reason = "no space to search"
        else:
            spaces = self.open_spaces()
            k = max(1, min(self.opts.workers, len(spaces))) if spaces else 0
            if k:
                threads = [threading.Thread(target=self.worker, args=(i, spaces[i % len(spaces)]), daemon=True)
                           for i in range(k)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
            self.stop_reason = self.stop_reason or self.should_stop() or "every space exhausted or pruned"
        self.emit({"type": "stop", "reason": self.stop_reason, "notes": self.notes,
                   "deadline": bool(self.cut_short) and self.stop_reason == self.cut_short,
                   "final_reserve_s": round(self.final_reserve_s(), 1)})
        self.say(f"search stopped: {self.stop_reason}")

    def _state(self, parent: Node | None, space: str) -> SearchState:
        assert self.contract is not None
        return SearchState(self.info, self.contract, self.opts.policy, self.opts.device, list(self.findings),
                           self.incumbent, dict(self.baselines), self.memory, frozenset(self.nodes), parent, space,
                           self.notes)

    def _expandable(self, space: str) -> list[Node]:
        """Nodes a worker of `space` may refine: the incumbent, the best baseline, for the configuration spaces
        (`OTHER_BASELINE_SPACES`) the other baselines that passed their check, and its space's good nodes. The
        other baselines are there because a refinement of a slower lineage can beat the incumbent's: on the
        H200 (2026-12-03) a batch-1 MLP's incumbent was compile-max-autotune (303 us, already under Inductor's
        CUDA graphs, so no graph could wrap it) while eager under a CUDA graph had measured 120 us before; with
        only the incumbent expandable it was never tried. (The `ir` space records and searches a node's
        kernels, minutes on a GPU: it stays on the incumbent and the best baseline; the templates write new
        kernels from the task whatever the parent.)"""
        with self.lock:
            out = [self.incumbent]
            if self.base_key != self.incumbent_key:
                out.append(self.nodes[self.base_key])
            if space in OTHER_BASELINE_SPACES:
                out += [n for n in self.baselines.values() if n.status in ("measured", "correct", "incumbent")
                        and n.check is not None and n.check.ok and n not in out]
            out += [n for n in self.nodes.values() if n.space == space and n.status in ("measured", "correct", "incumbent")
                    and n not in out]
        return [n for n in out if (n.key, space) not in self._exhausted_nodes]

    def _select(self, space: str) -> Node | None:
        nodes = self._expandable(space)
        if not nodes:
            return None
        total = sum(n.visits for n in nodes) + 1

        def widen_ok(n: Node) -> bool:
            kids = [c for c in n.children if self.nodes[c].space == space]
            limit: int = math.ceil(WIDEN_C * float(n.visits + 1) ** WIDEN_ALPHA)
            return len(kids) < limit

        def uct(n: Node) -> float:
            # an unvisited baseline starts from its own standing against the best one (a slower lineage is
            # explored later, not never)
            reward = _log_reward(n.speedup) if n.space == "baseline" and not n.visits else n.reward
            return reward + UCT_C * math.sqrt(math.log(total + 1) / (n.visits + 1))

        open_nodes = [n for n in nodes if widen_ok(n)]
        return max(open_nodes or nodes, key=uct)

    def worker(self, index: int, space: str) -> None:
        no_gain = 0
        while True:
            why = self.should_stop()
            if why:
                self.stop_reason = self.stop_reason or why
                return
            if space in self.pruned or space in self.exhausted:
                nxt = self._next_space(space)
                if nxt is None:
                    return
                space, no_gain = nxt, 0
            node = self._select(space)
            if node is None:
                with self.lock:
                    self.exhausted.add(space)
                continue
            cand = self._propose(node, space)
            if cand is None:
                with self.lock:
                    self._exhausted_nodes.add((node.key, space))
                continue
            t0 = self.elapsed()
            n = self.judge(cand, node)
            promoted = (n.status == "measured" and n.speedup is not None and n.speedup > 1.0 + MIN_NOISE
                        and self._maybe_promote(n))
            with self.lock:
                self._candidate_s.append(self.elapsed() - t0)
            if promoted:
                no_gain = 0
            elif n.status in ("measured", "correct"):
                no_gain += 1
            if not self.ev.timed:
                # Nothing is timed, so no space can show a gain: draft from the next space every candidate,
                # so a correctness-only run covers every space.
                nxt = self._next_space(space)
                if nxt is not None:
                    space = nxt
                continue
            if no_gain >= self.opts.plateau:
                nxt = self._next_space(space)
                self.emit({"type": "plateau", "worker": index, "space": space, "next": nxt})
                self.say(f"worker {index}: plateau in {space} after {no_gain} candidates without gain" +
                         (f"; drafting from {nxt}" if nxt else ""))
                if nxt is None:
                    with self.lock:
                        self.stop_reason = self.stop_reason or f"plateau: {no_gain} candidates without gain in {space}, " \
                                                               "no other space open"
                    return
                space, no_gain = nxt, 0

    def _next_space(self, current: str) -> str | None:
        """The open space after `current` in the plan's order (cyclically)."""
        assert self.plan is not None
        with self.lock:
            order = self.plan.spaces
            open_ = set(self.open_spaces())
        start = order.index(current) + 1 if current in order else 0
        for s in order[start:] + order[:start]:
            if s in open_ and s != current:
                return s
        return None

    def services(self) -> LoopServices:
        """What a proposer's `prepare` may use (`state.LoopServices`)."""
        return LoopServices(self.ev, self.info.path, self.out / ".work",
                            lambda: self.time_left_s() - self.final_reserve_s(),
                            max(0, self.opts.budget - self.candidates_judged()), self.opts.timeout_s, self.say,
                            self.opts.kernel_llm)

    def _prepare(self, p: Proposer, state: SearchState) -> None:
        """A proposer's optional `prepare` (see `proposers.Proposer`): its run, timed, in the trajectory."""
        prepare = getattr(p, "prepare", None)
        if not callable(prepare):
            return
        t0 = self.elapsed()
        try:
            summary = prepare(state, self.services())
        except Exception as exc:  # a proposer's bug costs its proposals, not the run
            self.notes[p.name] = f"prepare() raised {type(exc).__name__}: {exc}"
            return
        if summary:
            self.emit({"type": "prepare", "proposer": p.name, "space": p.space, "seconds": round(self.elapsed() - t0, 3),
                       "summary": summary})

    def _propose(self, node: Node, space: str) -> TaskCandidate | None:
        state = self._state(node, space)
        for p in [p for p in self.proposers if p.space == space]:
            self._prepare(p, state)
            try:
                with TASK_LOCK:
                    proposals = p.propose(state)
            except Exception as exc:  # a proposer's bug costs its proposals, not the run
                self.notes[p.name] = f"propose() raised {type(exc).__name__}: {exc}"
                continue
            for c in proposals:
                if not isinstance(c, TaskCandidate):
                    self.notes[p.name] = f"returned {type(c).__name__}, not a TaskCandidate"
                    continue
                from kstrata.agents.optimize.candidate import policy_admits

                if not policy_admits(self.opts.policy, c.policy):
                    continue
                with self.lock:
                    if c.key in self.nodes:
                        continue
                    if c.parent is None or c.parent not in self.nodes:
                        c = TaskCandidate(c.source, c.space, c.proposer, c.description, c.params, c.policy, node.key)
                    parent = self.nodes[c.parent or node.key]
                    n = Node(c, len(self.order), parent.depth + 1, self.elapsed(), status="pending")
                    self.nodes[n.key] = n
                    self.order.append(n.key)
                    parent.children.append(n.key)
                return c
        return None

    def _tell_proposer(self, c: TaskCandidate, n: Node) -> None:
        """A proposer with `observe(candidate, check)` (the LLM's) hears the verdict on its own candidates."""
        for p in self.proposers:
            observe = getattr(p, "observe", None)
            if p.name == c.proposer and callable(observe):
                try:
                    observe(c, n.check, speedup=n.speedup, note=n.note if n.status == "rejected" else "")
                except Exception as exc:  # a proposer's bug costs its refinements, not the run
                    self.notes[p.name] = f"observe() raised {type(exc).__name__}: {exc}"

    def judge(self, c: TaskCandidate, parent: Node) -> Node:
        n = self.nodes[c.key]
        self.say(f"candidate {self.candidates_judged() + 1}/{self.opts.budget} [{c.space}/{c.proposer}] {c.description}")
        self._judge_check([n], self._child_limit())
        if n.check and n.check.ok and n.status != "rejected" and self.ev.timed:
            base = self.nodes[self.base_key]
            group = [base] + ([self.incumbent] if self.incumbent_key != self.base_key else []) + [n]
            ms = self._measure(group, self.opts.rounds, self._child_limit())
            m = ms.get(n.key)
            mb = ms.get(base.key)
            if isinstance(m, Measurement) and isinstance(mb, Measurement):
                n.timing, n.status = m, "measured"
                n.speedup = paired_ratio(mb, m, MIN_NOISE)[0]  # the per-round ratios' median (see the guard)
                n.sol_fraction, flags, explained = self._sol(m.median_us, n.speedup)
                n.reward = _log_reward(n.speedup)
                if flags:
                    n.status, n.note, n.reward = "rejected", "flagged: " + "; ".join(flags), FAILURE_REWARD
                elif explained:
                    n.note = "; ".join(explained)
            else:
                n.status, n.note, n.reward = "rejected", str(m if not isinstance(m, Measurement) else mb), FAILURE_REWARD
        n.elapsed_s = self.elapsed()
        self._tell_proposer(c, n)
        with self.lock:
            self._backprop(n)
        self.emit(self.node_event(n))
        outcome = {"rejected": "failed", "correct": "correct (not timed)"}.get(n.status)
        if outcome is None:
            outcome = "faster" if (n.speedup or 0) > 1 + MIN_NOISE else ("slower" if (n.speedup or 0) < 1 - MIN_NOISE
                                                                         else "no gain")
        conc = Conclusion(c.space, c.proposer, c.description, outcome, n.speedup, n.note[:160] if n.status == "rejected" else "")
        self.memory.add(conc)
        self.emit({"type": "conclusion", "conclusion": conc.to_json()})
        self.say(f"  -> {conc.text()}")
        fails = self.memory.consecutive_failures.get(c.space, 0)
        if fails >= PRUNE_AFTER and c.space not in self.pruned:
            why = f"{fails} candidates in a row failed (last: {n.note[:120]})"
            with self.lock:
                self.pruned[c.space] = why
            self.emit({"type": "prune", "space": c.space, "reason": why})
            self.say(f"pruned space {c.space}: {why}")
        return n

    def _maybe_promote(self, n: Node, quiet: bool = False) -> bool:
        """The benchmark guard: an interleaved re-measurement against the incumbent, beaten by more than noise.
        `quiet`: a deferred challenger's guard after the search (see the module docstring)."""
        with self.lock:
            inc = self.incumbent
        if inc.key == n.key:
            return False
        ms = self._measure([inc, n], self.opts.guard_rounds, self._child_limit())
        mi, mc = ms.get(inc.key), ms.get(n.key)
        if not (isinstance(mi, Measurement) and isinstance(mc, Measurement)):
            self.emit({"type": "guard", "key": n.key, "accepted": False, "quiet": quiet,
                       "reason": f"re-measurement failed: {mi} / {mc}"})
            return False
        ratio, noise = paired_ratio(mi, mc, MIN_NOISE)
        accepted = ratio > 1.0 + noise
        deferred = not accepted and not quiet and ratio > 1.0 + MIN_NOISE
        if deferred:
            with self.lock:
                self.deferred[n.key] = ratio
        self.emit({"type": "guard", "key": n.key, "incumbent": inc.key, "ratio": ratio, "noise": noise,
                   "accepted": accepted, "quiet": quiet, "deferred": deferred, "incumbent_timing": mi.to_json(),
                   "challenger_timing": mc.to_json()})
        self.say(f"  {'quiet ' if quiet else ''}guard: {ratio:.3f}x vs incumbent, noise {100 * noise:.1f}%: "
                 + ("ACCEPTED" if accepted else "deferred: guarded again once the search stopped" if deferred
                    else "kept the incumbent"))
        if accepted:
            with self.lock:
                if self.incumbent.key == inc.key:
                    inc.status = "measured" if inc.space != "baseline" or inc.timing else inc.status
                    n.status = "incumbent"
                    self.incumbent_key = n.key
                    self.emit({"type": "incumbent", "key": n.key, "speedup": n.speedup})
            self.write_provisional()
        return accepted

    def step_quiet_guards(self) -> None:
        """The deferred challengers, fastest (by their first guard) first, guarded again now that no worker runs,
        each against the incumbent of the moment, while the end's reserve still fits."""
        if not self.ev.timed:
            return
        with self.lock:
            order = sorted(self.deferred, key=lambda k: -self.deferred[k])[:QUIET_GUARDS]
            dropped = sorted(set(self.deferred) - set(order))
            for key in dropped:  # not guarded again: nothing of the end is reserved for them
                self.deferred.pop(key)
        for key in dropped:
            self.emit({"type": "guard", "key": key, "accepted": False, "quiet": True,
                       "reason": f"not guarded again: only the {QUIET_GUARDS} fastest deferred challengers are"})
        for key in order:
            n = self.nodes.get(key)
            with self.lock:
                self.deferred.pop(key, None)
            if n is None or n.status in ("incumbent", "rejected") or n.key == self.incumbent_key:
                continue
            left = self.opts.minutes * 60 - self.elapsed()
            if left < self.final_reserve_s() + self._baseline_measure_s:
                self.emit({"type": "guard", "key": key, "accepted": False, "quiet": True,
                           "reason": f"not guarded again: {left:.0f} s left, the end needs "
                                     f"{self.final_reserve_s():.0f} s"})
                continue
            self._maybe_promote(n, quiet=True)

    # -- the output ------------------------------------------------------------------------------
    def _learn_skill(self, inc: Node, verdict: Any, path: Path) -> dict[str, Any]:
        """The skill gate: re-evaluate the winner on other seeds in fresh processes before it is stored."""
        from kstrata.agents.skills import Reproduction, SkillLibrary, Win, learn_from_win

        c, spec = inc.candidate, self.info.spec
        # the classes a later task is looked up by: the roofline's bound and the launch/latency findings
        classes = [f"{f.data['bound']}-bound" for f in self.findings if f.kind == "roofline" and f.data.get("bound")]
        classes += [f.kind for f in self.findings if f.kind in ("launch-bound", "latency-bound", "many-kernels")]
        timing = getattr(verdict, "timing_us", None) or {}
        win = Win(task=self.info.name, space=c.space, proposer=c.proposer, description=c.description, params=c.params,
                  speedup=float(verdict.speedup), baseline="eager (the task's Model)", device=verdict.device,
                  versions=dict(verdict.versions), operators=tuple(op for op, _ in spec.flops_by_op[:6]),
                  roofline=",".join(dict.fromkeys(classes)), dtypes=tuple(spec.dtypes),
                  architecture=self.opts.device if self.opts.device != "cuda" else _cuda_arch(),
                  findings=tuple(f.text for f in self.findings), source=c.source,
                  baseline_us=timing.get("reference"), candidate_us=timing.get("candidate"))

        def remeasure(seed: int) -> Reproduction:
            v = self.ev.final(self.info.path, path, seed=seed, ceilings=self.opts.ceilings, **_box(_sandboxed(c)))
            return Reproduction(seed, bool(v.accepted), v.speedup, True, "" if v.accepted else v.reason)

        client = next((p.client for p in self.proposers if hasattr(p, "client")), None) or \
            getattr(self.opts.kernel_llm, "client", None)
        gate, how = learn_from_win(SkillLibrary(self.opts.skills_dir), win, remeasure, client=client,
                                   original_seed=self.opts.final_seed)
        self.say(f"skill: {'ADMITTED' if gate.admitted else 'not admitted'} — {gate.reason} ({how})")
        return {"admitted": gate.admitted, "reason": gate.reason, "summary": how,
                "path": str(gate.path) if gate.path else None}

    def write_provisional(self) -> None:
        """The verified incumbent as `model_new.py` (and `result.json`, status unfinished) while the task runs,
        so a run stopped before its final re-evaluation (killed at a deadline) still leaves a checked output
        that says what it is. The final step overwrites both."""
        with self.lock:
            inc = self.incumbent
        if inc.space == "baseline" and inc.key == self.base_key:
            what = f"the best baseline ({inc.candidate.description})"
        else:
            what = (f"the search's incumbent, {inc.speedup:.3f}x over the best baseline (interleaved medians)"
                    if inc.speedup else "the search's incumbent")
        src = set_measured(inc.candidate.source, [f"PROVISIONAL: {what}, passed the hardened check; the final "
                                                  "re-evaluation in fresh processes has not run yet"])
        write_atomic(self.out / "model_new.py", src)
        r = self.result()
        r.status, r.final_reason = "unfinished", "stopped before the final re-evaluation; model_new.py is provisional"
        write_atomic(self.out / "result.json", json.dumps(r.to_json(), indent=1) + "\n")

    def fallbacks(self, exclude: set[str]) -> list[Node]:
        """The baselines an output rejected by its final re-evaluation falls back to: the measured ones, fastest
        first (the best measured baseline, then the next), never one rejected already; untimed (no GPU): eager."""
        ok = [n for n in self.baselines.values()
              if n.key not in exclude and n.check is not None and n.check.ok and n.status != "rejected"]
        timed = sorted((n for n in ok if n.timing), key=lambda n: n.timing.median_us if n.timing else math.inf)
        if timed:
            return timed
        eager = self.baselines.get("eager")
        return [eager] if eager is not None and eager in ok else []

    def confirm(self) -> None:
        """The last measurement: the chosen candidate against the best baseline, interleaved in a fresh process
        at the end, when nothing else runs. The search's measurements were taken beside other work and at other
        moments: on the H200 (2026-12-02) one torch.compile model measured 84 us in one fresh process and 140 us
        in another minutes later, while a CUDA-graph candidate stayed at 88-92 us, so a ratio is only true at
        the moment it was taken. Clearly slower now (by more than the noise): the output falls back to the
        best baseline and says so; within the noise it stays, reported as such."""
        inc, base = self.incumbent, self.nodes[self.base_key]
        if self.confirmation is not None or not self.ev.timed or inc.key == base.key:
            return
        ms = self._measure([base, inc], self.opts.guard_rounds, self._child_limit())
        mb, mi = ms.get(base.key), ms.get(inc.key)
        ev: dict[str, Any] = {"type": "confirm", "key": inc.key, "baseline": base.key}
        if not (isinstance(mb, Measurement) and isinstance(mi, Measurement)):
            ev.update(verdict="failed", reason=f"re-measurement failed: {mb} / {mi}")
        else:
            ratio, noise = paired_ratio(mb, mi, MIN_NOISE)
            verdict = "faster" if ratio > 1.0 + noise else ("slower" if ratio < 1.0 - noise else "within noise")
            ev.update(verdict=verdict, ratio=ratio, noise=noise, baseline_timing=mb.to_json(), timing=mi.to_json(),
                      reason=f"{ratio:.3f}x over {base.candidate.description} re-measured at the end, noise "
                             f"{100 * noise:.1f}%: {verdict}")
        self.confirmation = ev
        self.emit(dict(ev))
        self.say(f"confirmation: {ev['reason']}")
        if ev["verdict"] == "slower":
            self._fall_back_to(base.key, ev["reason"])

    def _fall_back_to(self, key: str, why: str) -> None:
        with self.lock:
            inc = self.incumbent
            inc.status, inc.note = "rejected", f"final confirmation: {why}"
            self.incumbent_key = key
            self.nodes[key].status = "incumbent"

    def step_final(self) -> None:
        self.confirm()
        inc = self.incumbent
        base = self.nodes[self.base_key]
        lines = []
        if self.ev.timed and inc.speedup is not None and inc.timing:
            lines.append(f"{inc.speedup:.3f}x over the best baseline ({base.candidate.description}), "
                         f"{inc.timing.median_us:.1f} us, interleaved medians on {self.opts.device}")
            conf = self.confirmation or {}
            if conf.get("key") == inc.key and conf.get("reason"):
                lines.append(f"confirmed at the end: {conf['reason']}")
            if inc.key == base.key:
                lines.append("nothing beat the best baseline: this file IS that baseline" if conf.get("verdict") != "slower"
                             else f"the search's choice was slower at the end ({conf['reason']}): this file IS the best baseline")
        else:
            lines.append("nothing timed (no GPU): correctness only; this file is the eager baseline"
                         if inc.key == base.key else "nothing timed (no GPU): correctness only")
        src = set_measured(inc.candidate.source, lines)
        path = self.out / "model_new.py"
        write_atomic(path, src)
        verdict = self.ev.final(self.info.path, path, seed=self.opts.final_seed, ceilings=self.opts.ceilings,
                                **_box(_sandboxed(inc.candidate)))
        ev: dict[str, Any] = {"type": "final", "key": inc.key, "accepted": verdict.accepted, "reason": verdict.reason,
                              "seed": self.opts.final_seed, "speedup_vs_eager": verdict.speedup,
                              "roofline": verdict.roofline, "device": verdict.device,
                              "reference_source": getattr(verdict, "reference_source", "")}
        # The fresh re-evaluation is the last word: fall back to the best measured baseline (then the next
        # fastest), and say so.
        rejected = {inc.key}
        while not verdict.accepted:
            fallbacks = self.fallbacks(rejected)
            if not fallbacks:
                break
            nxt = fallbacks[0]
            rejected.add(nxt.key)
            was = self.nodes[ev["key"]].candidate.description
            need, left = self.final_cost_s(nxt), self.time_left_s() - REPORT_S
            self.say(f"final re-evaluation REJECTED {was} ({ev['key']}: {verdict.reason}); falling back to "
                     f"{nxt.candidate.description}, " + (f"the fastest measured baseline left ({nxt.timing.median_us:.1f} us)"
                                                         if nxt.timing else "the task's own model (nothing timed)"))
            ev.setdefault("fallback_from", ev["key"])
            ev.setdefault("rejected", []).append({"key": ev["key"], "description": was, "reason": verdict.reason})
            with self.lock:
                self.nodes[ev["key"]].status = "rejected"
                self.nodes[ev["key"]].note = f"final re-evaluation: {verdict.reason}"
                self.incumbent_key = nxt.key
                nxt.status = "incumbent"
            write_atomic(path, set_measured(nxt.candidate.source, ["the optimized candidate failed its final "
                                                                   f"re-evaluation; this file is {nxt.candidate.description}"]))
            if need > left:
                # The deadline is the user's: the fallback passed the hardened check with the baselines, but it
                # is not accepted without its fresh re-evaluation, and the output says so.
                why = (f"the fallback {nxt.candidate.description} was not re-evaluated: its fresh re-evaluation "
                       f"(about {need:.0f} s) did not fit in the {max(0.0, left):.0f} s left of the "
                       f"{self.opts.minutes:g}-minute limit (it passed the hardened check with the baselines)")
                self.say(why)
                ev.update({"key": nxt.key, "accepted": False, "reason": why, "speedup_vs_eager": None,
                           "roofline": None, "deadline": True})
                verdict = FinalVerdict(False, why, None, None, "", {}, "deadline")
                break
            verdict = self.ev.final(self.info.path, path, seed=self.opts.final_seed, ceilings=self.opts.ceilings)
            ev.update({"key": nxt.key, "accepted": verdict.accepted, "reason": verdict.reason,
                       "speedup_vs_eager": verdict.speedup, "roofline": verdict.roofline})
        if (self.opts.skills_dir is not None and verdict.accepted and self.incumbent.space != "baseline"
                and self.ev.timed and verdict.speedup):
            need = self.skill_reserve_s(self.incumbent)
            if need > self.time_left_s() - REPORT_S:
                ev["skill"] = {"admitted": False, "reason": f"not tried: its reproductions (about {need:.0f} s) did not "
                               f"fit before the {self.opts.minutes:g}-minute limit", "summary": "", "path": None}
                self.say(f"skill: not tried — {ev['skill']['reason']}")
            else:
                ev["skill"] = self._learn_skill(self.incumbent, verdict, path)
        self.final = ev
        self.emit(dict(ev))
        self.say(f"final (fresh process, seed {self.opts.final_seed}): " + ("ACCEPTED" if verdict.accepted else "REJECTED") +
                 f" — {verdict.reason}")

    def result(self) -> TaskResult:
        inc = self.incumbent
        base = self.nodes[self.base_key] if self.base_key else inc
        deg = self.contract.degeneracy if self.contract else None
        final = self.final or {}
        roof = final.get("roofline") or {}
        return TaskResult(
            task=self.info.name, path=str(self.info.path), out_dir=str(self.out), status="done",
            incumbent_baseline=base.candidate.proposer.removeprefix("baseline:"), chosen_space=inc.space,
            chosen=inc.candidate.description, speedup=inc.speedup if self.ev.timed else None,
            speedup_vs_eager=final.get("speedup_vs_eager"), sol_before=base.sol_fraction,
            speedup_confirmed=(self.confirmation or {}).get("ratio"),
            confirmation=(self.confirmation or {}).get("verdict", ""),
            sol_after=inc.sol_fraction if inc.sol_fraction is not None else roof.get("fraction"),
            timed=self.ev.timed, degenerate=bool(deg and deg.degenerate),
            degenerate_reasons=list(deg.reasons) if deg and deg.degenerate else [],
            findings=[f.kind for f in self.findings], candidates=self.candidates_judged(), seconds=self.elapsed(),
            stop_reason=self.stop_reason, cut_short=bool(self.cut_short) and self.stop_reason == self.cut_short,
            final_ok=bool(final.get("accepted")), final_reason=str(final.get("reason", "")),
            note=self._result_note(inc, final))

    def _result_note(self, inc: Node, final: Mapping[str, Any]) -> str:
        """What the result's figures mean beyond themselves. When the output is the eager baseline itself, the
        final's ratio over eager times the same code in two processes: it is the host's spread between
        processes, not a change (H200, 2026-12-02: 0.642x for an eager copy of level3/02, 18 launches per call)."""
        if not self.ev.timed:
            return "nothing was timed (no GPU): correctness only"
        ratio = final.get("speedup_vs_eager")
        if inc.candidate.proposer == "baseline:eager" and ratio:
            off = abs(math.log(ratio)) > math.log(1 + SAME_CODE_SPREAD)
            return (f"model_new.py is eager itself: its {ratio:.3f}x over eager in the final re-evaluation times the same "
                    "code in two processes" + (f", more than {SAME_CODE_SPREAD:.0%} apart: timings between processes on "
                                               "this host are not to be trusted to better than that" if off else
                                               " (within the expected spread)"))
        return ""


def prepare_out(out: Path, task_dirs: Iterable[Path], resume: bool) -> None:
    """Never overwrite a previous run's results without --resume."""
    for d in task_dirs:
        if (d / "trajectory.jsonl").exists() and not resume:
            raise OptimizeError(f"{d} holds a previous run (trajectory.jsonl); pass --resume to continue it, or "
                                "choose another --out")


def optimize(target: Path, out: Path, opts: Options, *, parallel_tasks: int = 1) -> list[TaskResult]:
    """Optimize one task file or every task of a directory; writes OUT/<task>/ and, for a directory, summary.md."""
    from kstrata.agents.optimize.report import write_summary
    from kstrata.agents.tasks import find_tasks, load_task

    if not target.exists():
        raise OptimizeError(f"{target}: no such task file or directory")
    paths = find_tasks(target)
    if not paths:
        raise OptimizeError(f"{target}: no task files")
    for p in paths:  # a bad task file is named (TaskError: one line, exit 2) before anything runs
        load_task(p)
    root = target if target.is_dir() else target.parent
    names = {p: (str(p.relative_to(root).with_suffix("")).replace("/", "__") if target.is_dir() else p.stem) for p in paths}
    dirs = {p: out / names[p] for p in paths}
    prepare_out(out, dirs.values(), opts.resume)
    make_dir(out, "--out directory", error=OptimizeError)
    evaluator = Evaluator(opts.device, opts.policy, out / ".work", timeout_s=opts.timeout_s, trials=opts.trials,
                          seed=opts.seed, lock_path=opts.lock_path, workers=opts.pool)

    def one(p: Path) -> TaskResult:
        try:
            return TaskSearch(p, dirs[p], opts, evaluator).run()
        except OptimizeError as exc:
            opts.progress(f"[{p.stem}] FAILED: {exc}")
            return TaskResult(p.stem, str(p), str(dirs[p]), "failed", error=str(exc))

    if parallel_tasks > 1 and len(paths) > 1:
        with ThreadPoolExecutor(max_workers=parallel_tasks) as pool:
            results = list(pool.map(one, paths))
    else:
        results = [one(p) for p in paths]
    if target.is_dir():
        write_summary(out, results, opts)
    return results


__all__ = ["BASELINES", "OptimizeError", "Options", "Proposer", "TaskResult", "TaskSearch", "optimize"]
