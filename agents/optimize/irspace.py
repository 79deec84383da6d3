"""The optimizer's `ir` space: IR passes on the incumbent's Triton kernels, enumerated from each pass's
`schedule_space` by the compiled-kernel search (`kstrata.agents.compiled`), deployed by a standalone
deployer in the candidate's `model_new.py` (`deployer.py`).

For a node to refine (the incumbent, or the best baseline), once per node:

1. **Record** (`record_node`): the node's ModelNew runs once on the GPU in a child process, under the
   launch recorder (`kstrata record`, started as a command: the recorder belongs to `tools/`, which the
   package never imports) with a Triton cache and an Inductor cache of its own (FX graph cache off, so
   Inductor compiles every kernel into that Triton cache). The job is the evaluator's `profile` job, so it
   goes through the loop's workers like every other GPU job of the task and also gives each kernel's share
   of the device time (torch.profiler). That gives the Triton kernels it launches, their launch records
   and shares. On the CPU Triton kernels run in the interpreter and nothing is compiled: the space says so
   in one note and proposes nothing.
2. **Search** (`search_node`): the `IR_KERNELS` largest kernels by share (at least `MIN_SHARE`), each with
   a small budget (`kernel_budget`: from the task's candidate budget and time left), through
   `compiled.run.search_one`: every pass's `schedule_space` atoms, singletons then annealing, each built by
   the engine, gated on the GPU on its launch record (differential run, redzones, determinism) and timed
   against the original there. The engine's GPU jobs go through the loop's own GPU workers (`WorkerPool(
   workers=...)`), so the GPU gating of `GpuUse` holds: a kernel timing never runs beside a check. Only a
   guarded winner (measured faster beyond its noise, `compiled.search._winner`) is kept.
3. **Propose**: each winner, and all of them together, become a `TaskCandidate` (space `ir`) whose source
   is the node's source plus the deployer and its spec (`render_ir_source`). It then goes the normal way:
   the hardened task evaluation under the precision policy, the interleaved timing, the benchmark guard.

The contract: `propose()` still evaluates nothing. Steps 1-2 run in `prepare(state, services)`, an optional
method of the proposer protocol that the loop calls on the strategy worker's thread, outside the task lock,
before `propose()`, with the loop's evaluator and deadline (`state.LoopServices`); its time is the task's
time. A node that is itself an `ir` candidate is not searched again (its deployer would meet a second one).
"""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kstrata.agents.optimize.candidate import TaskCandidate
from kstrata.agents.optimize.state import LoopServices, Node, SearchState

#: Kernels (largest shares first) searched per node.
IR_KERNELS = 2
#: Kernel-level candidates per kernel at most (and at least `MIN_KERNEL_BUDGET`).
MAX_KERNEL_BUDGET = 8
MIN_KERNEL_BUDGET = 2
#: Seconds one kernel-level trial is assumed to take (build, GPU gate, timing) when sizing the budget.
TRIAL_S = 20.0
#: The recording and the search get at most this fraction of the time the task has left.
TIME_FRACTION = 0.4
#: Below this many seconds left for it, the space does not record or search.
MIN_SECONDS = 60.0
#: The deployment spec's schema.
SPEC_SCHEMA = "kstrata.ir-deploy/1"


@dataclass
class IrWinner:
    """One kernel the search made faster: its original and rewritten entries and the engine's verdict."""

    name: str
    digest: str  # deployer.kernel_digest of the original
    original: str  # the original's cache entry
    built: str  # the rewritten cache entry (the engine's build)
    pipeline: str
    tolerance: str | None
    verdict: str | None
    reason: str
    speedup: float
    speedup_range: list[float] | None = None
    time_before_us: float | None = None
    time_after_us: float | None = None
    share: float | None = None

    def summary(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if k not in ("original", "built", "digest")}


@dataclass
class Prepared:
    """What `prepare` found for one node: winners, the kernel searches' summaries, and why when nothing."""

    winners: list[IrWinner] = field(default_factory=list)
    kernels: list[dict[str, Any]] = field(default_factory=list)
    note: str = ""
    seconds: float = 0.0


def _entry_files(entry: Path) -> dict[str, Path]:
    return {p.suffix[1:]: p for p in entry.iterdir() if p.is_file() and not p.name.startswith("__grp__")}


def original_digest(entry: str | Path) -> tuple[str, str]:
    """(kernel name, deployer.kernel_digest) of a Triton cache entry, from its TTIR and metadata."""
    from kstrata.agents.optimize.deployer import kernel_digest

    files = _entry_files(Path(entry))
    if "ttir" not in files or "json" not in files:
        raise ValueError(f"{entry}: a cache entry without TTIR or metadata cannot be deployed")
    meta = json.loads(files["json"].read_text())
    return str(meta.get("name", files["ttir"].stem)), kernel_digest(files["ttir"].read_text(), meta)


def deploy_kernel(w: IrWinner) -> dict[str, Any]:
    """The spec of one deployed kernel: the rewritten levels from the first one that differs from the original's
    (the binary always), the launch metadata they change, and the rewritten binary's digest."""
    from kstrata.agents.optimize.deployer import DEPLOY_LEVELS
    from kstrata.ir.candidate import changed_metadata

    old, new = _entry_files(Path(w.original)), _entry_files(Path(w.built))
    if "cubin" not in new:
        raise ValueError(f"{w.built}: the rewritten kernel {w.name} has no cubin (only NVIDIA kernels are deployed)")
    first = next((lv for lv in DEPLOY_LEVELS if lv in new and (lv not in old or old[lv].read_bytes() != new[lv].read_bytes())),
                 "cubin")
    levels: dict[str, str] = {}
    for lv in DEPLOY_LEVELS[DEPLOY_LEVELS.index(first):]:
        if lv not in new:
            continue
        data = new[lv].read_bytes()
        levels[lv] = base64.b64encode(data).decode() if lv == "cubin" else data.decode()
    changes = changed_metadata(json.loads(old["json"].read_text()), json.loads(new["json"].read_text()))
    return {"name": w.name, "digest": w.digest, "pipeline": w.pipeline, "levels": levels,
            "metadata_changes": changes, "cubin_sha256": hashlib.sha256(new["cubin"].read_bytes()).hexdigest()}


def deployment_spec(winners: list[IrWinner]) -> dict[str, Any]:
    kernels = [deploy_kernel(w) for w in winners]
    digest = hashlib.sha256(json.dumps(kernels, sort_keys=True).encode()).hexdigest()
    return {"schema": SPEC_SCHEMA, "digest": digest, "kernels": kernels}


def render_ir_source(source: str, winners: list[IrWinner]) -> str:
    """`source` (a ModelNew file) plus the standalone deployer of `winners` (see deployer.py)."""
    from kstrata.agents.optimize import deployer

    text = Path(deployer.__file__).read_text()
    if "'''" in text:
        raise ValueError("the deployer's text cannot be embedded in a raw string")
    spec = deployment_spec(winners)
    kernels = ", ".join(f"{k['name']} ({k['pipeline']})" for k in spec["kernels"])
    return (source.rstrip() + "\n\n\n"
            f"# --- kstrata ir space: the rewritten Triton kernels {kernels}, deployed by the code below (torch and\n"
            "# triton only). It raises IrDeployError when a deployed kernel is compiled or launched without them.\n"
            f"_KSTRATA_IR_DEPLOYER = r'''{text}'''\n"
            f"_KSTRATA_IR_SPEC = {json.dumps(json.dumps(spec, sort_keys=True))}\n\n\n"
            "def _kstrata_ir_module():\n"
            "    import json as _json\n"
            "    import sys as _sys\n"
            "    import types as _types\n"
            "    mod = _sys.modules.get('_kstrata_ir_deployer')\n"
            "    if mod is None:\n"
            "        mod = _types.ModuleType('_kstrata_ir_deployer')\n"
            "        _sys.modules['_kstrata_ir_deployer'] = mod\n"
            "        exec(compile(_KSTRATA_IR_DEPLOYER, '<kstrata ir deployer>', 'exec'), mod.__dict__)\n"
            "    return mod, _json.loads(_KSTRATA_IR_SPEC)\n\n\n"
            "_kstrata_ir, _kstrata_ir_spec = _kstrata_ir_module()\n"
            "ModelNew = _kstrata_ir._kstrata_ir_checked(ModelNew, _kstrata_ir._kstrata_ir_install(_kstrata_ir_spec))\n")


def kernel_budget(services: LoopServices, kernels: int) -> int:
    """Kernel-level candidates per kernel: what the time share allows at `TRIAL_S` each, within the bounds."""
    seconds = TIME_FRACTION * services.time_left_s() / max(1, kernels)
    return max(MIN_KERNEL_BUDGET, min(MAX_KERNEL_BUDGET, int(seconds // TRIAL_S)))


def record_node(node: Node, services: LoopServices, work: Path) -> tuple[Path, Path, dict[str, Any]]:
    """Run `node`'s ModelNew once under the recorder (see the module docstring); returns (Triton cache,
    launch records, the profile's data). Raises RuntimeError with the job's error when it failed."""
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    cand = (work / "model_new.py").resolve()
    cand.write_text(node.candidate.source)
    cache, records = (work / "triton-cache").resolve(), (work / "records").resolve()
    env = {"TRITON_CACHE_DIR": str(cache), "TORCHINDUCTOR_CACHE_DIR": str((work / "inductor-cache").resolve()),
           "TORCHINDUCTOR_FX_GRAPH_CACHE": "0", "TORCHINDUCTOR_BUNDLE_TRITON_INTO_FX_GRAPH_CACHE": "0"}
    prefix = [sys.executable, "-m", "kstrata.tools.cli", "record", "--out", str(records), "--"]
    limit = max(30.0, min(services.timeout_s, TIME_FRACTION * services.time_left_s()))
    # a generated (LLM) node's code runs in the sandbox here too, as in every other job that runs it
    r = services.evaluator.run_job({"cmd": "profile", "task": str(services.task), "candidate": str(cand)}, limit,
                                   argv_prefix=prefix, env_extra=env, affinity=str(services.task), budget=True,
                                   sandbox=bool(node.candidate.params.get("sandbox")))
    log = str((r.data or {}).get("_log", ""))
    if log:  # the recorder's own lines say why a launch was not recorded: kept beside the records
        (work / "record-log.txt").write_text(log[-200000:])
    if not r.ok:
        raise RuntimeError(f"the recorded run failed: {r.error or 'no result'}")
    if not records.is_dir() or not any(records.glob("*.json")):
        said = [ln.strip() for ln in log.splitlines() if ln.startswith("kstrata record:")]
        entries = sorted(p.parent.name for p in cache.glob("*/*.ttir")) if cache.is_dir() else []
        raise RuntimeError("the recorded run launched no compiled Triton kernel that the recorder saw ("
                           + (f"it said: {said[0][:300]}" if said else "the recorder said nothing")
                           + f"; {len(entries)} kernels compiled into its Triton cache; log: {work / 'record-log.txt'})")
    return cache, records, r.data


def rank_kernels(program: Any, profile: dict[str, Any]) -> list[Any]:
    """The program's recorded kernels with shares from the profile (a name's device-time share, split over its
    binaries by their launch counts), largest first; those under `compiled.program.MIN_SHARE` are skipped."""
    from kstrata.agents.compiled.program import MIN_SHARE

    by_name = {str(row.get("name")): float(row.get("share") or 0.0) for row in profile.get("kernels", [])}
    kept = [k for k in program.kernels if k.skip is None]
    launches: dict[str, int] = {}
    for k in kept:
        launches[k.name] = launches.get(k.name, 0) + (k.launches or 1)
    for k in kept:
        k.share = by_name.get(k.name, 0.0) * (k.launches or 1) / launches[k.name]
        if k.share < MIN_SHARE:
            k.skip = f"{k.share:.2%} of the device time, under {MIN_SHARE:.0%}"
    program.share_source, program.share_note = "profile", "torch.profiler device-time shares of the recorded run"
    return list(program.ranked())


def search_node(node: Node, services: LoopServices, findings: tuple[str, ...] = ()) -> Prepared:
    """Steps 1 and 2 of the module docstring for `node`; with a model (`services.kernel_llm`), its kernel-level
    answers join each kernel's search, told `findings`."""
    from kstrata.agents.compiled.program import MIN_SHARE, load_program
    from kstrata.agents.compiled.run import CompiledOptions, kernel_deadline, search_one
    from kstrata.agents.compiled.search import SearchPrior
    from kstrata.agents.engine import Engine, WorkerPool
    from kstrata.agents.workers import LocalWorkers

    start = time.monotonic()
    # the recording and the kernels' searches share TIME_FRACTION of the time left; a trial in flight at the
    # deadline finishes
    deadline = time.perf_counter() + TIME_FRACTION * services.time_left_s()
    out = Prepared()
    work = services.workdir / "ir" / node.key
    try:
        cache, records, profile = record_node(node, services, work)
    except RuntimeError as exc:
        out.note = f"{node.candidate.description}: {exc}"
        return out
    program = load_program(cache, records)
    ranked = rank_kernels(program, profile)[:IR_KERNELS]
    if not ranked:
        out.note = (f"{node.candidate.description}: no recorded Triton kernel has {MIN_SHARE:.0%} of the device time "
                    "or more")
        return out
    workers = services.evaluator.workers
    shared = isinstance(workers, LocalWorkers)
    if not shared:  # a Ray cluster: the engine's jobs run on this machine's GPUs, outside the cluster's queues
        out.kernels.append({"note": f"the engine's GPU jobs run on this machine, not through the {workers.name} "
                                    "workers: their timings are not serialized with the loop's jobs"})
    pool = WorkerPool(workers=workers) if shared else WorkerPool()
    budget = kernel_budget(services, len(ranked))
    # from the recorded config: a winner here replaces that config's kernel in the ModelNew (a variant of another
    # config would need Inductor's autotuner restricted to it, which the tuned backend does and a ModelNew does not)
    opts = CompiledOptions(budget=budget, device="cuda", timeout_s=services.timeout_s,
                           llm=getattr(services, "kernel_llm", None), llm_findings=findings, best_config=False)
    try:
        with Engine(services.workdir / "engine", pool) as engine:
            prior = SearchPrior()
            for i, k in enumerate(ranked):
                now = time.perf_counter()
                if now > deadline or services.time_left_s() < MIN_SECONDS:
                    out.kernels.append({"kernel": k.name, "skipped": "the task's time for the ir space ran out"})
                    continue
                # its share of the ir space's time among the kernels left (on the H200 the first of GroupNorm's
                # two kernels took it all); what a kernel leaves goes to the next, whose search tries first
                # what won here
                until = kernel_deadline(now, deadline, [x.share for x in ranked[i:]])
                services.progress(f"ir: {k.name} (share {k.share:.1%}): kernel-level search, budget {budget}, "
                                  f"{until - now:.0f} s")
                s = search_one(engine, k, "cuda", opts, services.progress, deadline=until, prior=prior.for_kernel(k.name),
                               program=program)
                prior.learn(s)
                row: dict[str, Any] = {"kernel": k.name, "share": k.share, "mode": s.mode, "trials": len(s.trials),
                                       "passed_gate": sum(1 for t in s.trials if t.status in ("equivalent", "unproven")),
                                       "tried": [f"{t.pipeline}: {t.status}" + (f" {t.speedup:.3f}x" if t.speedup else "")
                                                 for t in s.trials],
                                       **({"llm": s.llm} if s.llm else {})}
                best = s.best
                if best is not None and best.entry and best.speedup:
                    name, digest = original_digest(k.entry)
                    out.winners.append(IrWinner(name, digest, k.entry, best.entry, best.pipeline, best.tolerance,
                                                best.verdict, best.reason[:300], float(best.speedup),
                                                best.speedup_range, best.time_before_us, best.time_after_us, k.share))
                    row.update(winner=best.pipeline, speedup=best.speedup, verdict=best.verdict)
                if s.mode != "measured":  # no launch record, or no measurement here: nothing could win
                    row["unmeasured"] = s.mode_note
                out.kernels.append(row)
    finally:
        pool.close()
    out.seconds = time.monotonic() - start
    if not out.winners:
        searched = [r for r in out.kernels if "trials" in r]
        unmeasured = [r for r in searched if r.get("unmeasured")]
        skipped = [r for r in out.kernels if "skipped" in r]
        out.note = (f"{node.candidate.description}: {len(searched)} kernels searched "
                    f"({', '.join(str(r['kernel']) for r in searched)})"
                    + (f", {len(skipped)} skipped ({skipped[0]['skipped']})" if skipped else "")
                    + (f"; {len(unmeasured)} of them not timed on the GPU ({unmeasured[0]['unmeasured']}), so they "
                       "could not win" if unmeasured else "")
                    + ("; no timed rewrite beat its original beyond the noise" if len(unmeasured) < len(searched) else ""))
    return out


class IrPassProposer:
    """The `ir` space (see the module docstring): `prepare` records and searches a node's kernels, `propose`
    renders the winners as ModelNew candidates."""

    name = "ir-passes"
    space = "ir"

    def __init__(self) -> None:
        self._prepared: dict[str, Prepared] = {}
        # strategy workers are threads and several may reach this space at once: one records and searches a node
        # while the others wait for it (two would search it twice and remove each other's work directory)
        self._lock = threading.Lock()

    @staticmethod
    def _target(state: SearchState) -> Node:
        return state.parent or state.incumbent

    def _why_not(self, state: SearchState, node: Node) -> str:
        if state.device != "cuda":
            return ("needs an NVIDIA GPU: on the CPU Triton kernels run in the interpreter, so there are no compiled "
                    "kernels to rewrite; proposes nothing")
        if node.space == "ir" or "_KSTRATA_IR_SPEC = " in node.candidate.source:  # or another space's refinement of one
            return f"{node.candidate.description} is an ir candidate already; its kernels are not searched again"
        return ""

    def prepare(self, state: SearchState, services: LoopServices) -> dict[str, Any] | None:
        """Record and search the node's kernels once (GPU work through the loop's workers); a summary for the
        trajectory, or None when nothing ran."""
        with self._lock:
            return self._prepare(state, services)

    def _prepare(self, state: SearchState, services: LoopServices) -> dict[str, Any] | None:
        node = self._target(state)
        if node.key in self._prepared or self._why_not(state, node):
            return None
        if services.budget <= 0:
            return None  # the loop stops before it would judge a candidate
        if TIME_FRACTION * services.time_left_s() < MIN_SECONDS:
            self._prepared[node.key] = Prepared(note=f"not searched: under {MIN_SECONDS:.0f} s of the task's time "
                                                      "would be left for the recording and the kernel-level search")
            return None
        try:
            prepared = search_node(node, services, tuple(getattr(f, "text", str(f))
                                                         for f in getattr(state, "findings", ()) or ()))
        except Exception as exc:  # searched once: a failure is said, and not repeated on every proposal
            prepared = Prepared(note=f"{node.candidate.description}: the recording or the kernel-level search failed: "
                                     f"{type(exc).__name__}: {exc}")
        self._prepared[node.key] = prepared
        return {"node": node.key, "seconds": round(prepared.seconds, 1), "kernels": prepared.kernels,
                "winners": [w.summary() for w in prepared.winners], "note": prepared.note}

    def propose(self, state: SearchState) -> list[TaskCandidate]:
        node = self._target(state)
        why = self._why_not(state, node)
        if why:
            state.note(self.name, why)
            return []
        prepared = self._prepared.get(node.key)
        if prepared is None:
            state.note(self.name, f"{node.candidate.description}: not recorded yet (prepare did not run)")
            return []
        if not prepared.winners:
            state.note(self.name, prepared.note or "no winner")
            return []
        groups = ([prepared.winners] if len(prepared.winners) > 1 else []) + [[w] for w in prepared.winners]
        out, unusable = [], []
        for ws in groups:
            edit = "; ".join(f"{w.name}: {w.pipeline} ({w.speedup:.3f}x on its launch record, {w.verdict})" for w in ws)
            # the node's code is in it: so are the node's sandbox (generated code) and precision policy
            params = {"kernels": [w.summary() for w in ws], "refines": node.key,
                      **({"sandbox": True} if node.candidate.params.get("sandbox") else {})}
            try:  # one winner that cannot be deployed costs its own candidates, not the others'
                source = render_ir_source(node.candidate.source, ws)
            except (OSError, ValueError) as exc:
                unusable.append(f"{edit}: {exc}")
                continue
            out.append(TaskCandidate(source, "ir", self.name, f"ir: {edit}", params, policy=node.candidate.policy,
                                     parent=node.key))
        state.note(self.name, f"{len(prepared.winners)} kernel rewrites from {node.candidate.description}"
                   + (f"; not deployable: {'; '.join(unusable)}" if unusable else ""))
        return [c for c in out if c.key not in state.tried]
