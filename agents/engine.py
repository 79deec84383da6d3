"""The candidate engine: build, check and measure candidates through one cache, one worker pool and one
GPU timer. Every driver (`run-passes`, the optimizer, `eval`/`bench` for task candidates) sits on it.

A **candidate** is one change to one base (a kernel or a task), described by value::

    from kstrata.agents.engine import Candidate, Engine, PipelineEdit, Provenance

    engine = Engine("~/.cache/kstrata/engine", jobs=4)       # a WorkerPool of 4 CPU workers is made for it
    base = engine.add_kernel("cache/ABCD...")                # a Triton cache/dump entry -> its content digest
    cand = Candidate(base, "ttgir", PipelineEdit("ttgir(num-warps{n=8})"),
                     provenance=Provenance("my-proposer", parent=None, space="compiler"))
    built = engine.build(cand)                               # BuildResult: status, entry dir, binary digest, ...
    verdict = engine.check(base, built, ["launches/k-0.json"], device="cpu")   # CheckResult
    timing = engine.measure(base, built, ["launches/k-0.json"], Budget(best_us=12.5))  # Measurement (GPU)

- `Candidate` (frozen, hashable): `base` (content digest from `add_kernel`/`add_task`), `level` (one of
  `LEVELS`), `edit` (`PipelineEdit`, `AsmPatchEdit`, `OptionsEdit`, `ModelNewEdit`, `TritonSourceEdit`),
  `tolerance` (declared, `ir/tolerance.py` spelling, None = bit-exact), `policy` (precision policy, one of
  `POLICIES`) and `provenance` (proposer, parent candidate key, space; not part of equality or the key:
  two proposers that propose the same edit get one build). `candidate.key` is a content address: the
  base digest, level, edit, tolerance and policy, plus the Triton, ptxas, LLVM and kstrata versions
  (`tool_versions()`), so a tool upgrade never reuses a stale build.
- `Engine.build(c)` -> `BuildResult`: runs the edit in a worker process (a pipeline with lower levels
  rebuilt by Triton's stages, an option re-lowering, an assembly patch, a Triton kernel source compiled
  for the base's target with its options and runtime parameter types (`backends/triton_source.py`; a
  source with other runtime parameters is refused); a `ModelNew` source is written as a file), runs
  the static checks (signature, launch ABI) and stores the rebuilt kernel as a Triton cache entry under
  `CACHE/builds/<key>/`. Cached on disk by key (a rerun, or another driver, gets it
  back without a process), and deduplicated by binary digest: a build whose cubin/hsaco (or source)
  equals an earlier one's names it in `duplicate_of`, and its checks and timings are the earlier
  one's (`Engine.stats.deduplicated` counts them; reports print it). `build_many` builds in parallel.
- `Engine.check(original, built, launches)` -> `CheckResult`: `verdict` (`Verdict.EQUIVALENT` with
  dynamic evidence or identical code, `DIFFERENT` with the first difference, `UNPROVEN` with static
  evidence only, `ERROR` when it could not be decided) and the `evidence` (every check with its level,
  verdict and detail). Kernel candidates: the static checks of the build plus `kstrata verify` on each
  launch record, in a worker process (an LLVM abort is a verdict); `VerifyOptions` passes verify's own
  options (device, seeds, sanitizer, seconds per run, static evidence accepted). Task candidates: the
  hardened evaluator (`agents/evaluate.py`, each role in its own process); `TaskOptions` passes eval's
  (policy, trials, seed, timing, progress), and such a check is never cached (it carries this run's
  memory peaks and timings, which `measure` then returns). Cached by (original, built binary, launch
  records, device, tolerance, options).
- Candidates made outside the engine: `add_bundle(bundle)` registers a kernel the caller loaded (as
  `kstrata verify` loads an entry or an IR file) and `adopt(base, bundle)` a candidate loaded the same
  way, both by content digest; `check` of an adopted candidate is `kstrata verify` itself, in this
  process (its rebuilds and dynamic runs are child processes), with progress (`on_check`) and the whole
  `VerifyReport` in `CheckResult.report`, cached unless it is unproven because a check could not run
  (a GPU or a tool this machine lacks, decided again next time). `adopt_task(base, file)` is
  `kstrata eval`'s candidate: `Candidate.task` of the user's file, evaluated where it is.
- Clients: `run-passes` (`agents/run_passes.py`), `kstrata verify` (`add_bundle`, `adopt`, `check` with
  `VerifyOptions`), `kstrata eval` (`add_task`, `adopt_task`, `check` with `TaskOptions`), `kstrata bench`
  (`agents/bench.py`: each baseline the optimizer's configuration candidate, `Candidate.task`, checked with
  `TaskOptions(keep=True)` so a re-run answers from the cache, then `measure`), and the `torch.compile`
  backend (`tools/torch_backend.py`: `add_stage_kernel` of the kernel at the level its pipeline rewrites,
  `build` of `Candidate(base, level, PipelineEdit(pipeline))`, the built levels deployed only when the
  build's static checks passed).
- `Engine.measure(original, built, launches, budget)` -> `Measurement`: kernel candidates are timed
  against the original on replays of the launch record, outputs first compared byte for byte, then
  interleaved A/B rounds (`backends/timing.py`: CUDA events, device synchronize, L2 flush, warm-up,
  median with spread) that stop early when the candidate is clearly slower than `budget.best_us`; task
  candidates through the evaluator's timing. Every measurement carries the device and versions, and
  `suspicious` reasons (beyond 10x either way, faster than writing the outputs once at peak bandwidth).
  `original_launches=[R]` times against another config of the kernel (Inductor's autotuning: other block
  sizes, another grid): each binary on its own record; `as_build(base)` is such a config's original as the
  timed side (the compiled search times the configs Inductor benchmarked before it picks its base). GPU
  work is serialized per GPU through the pool's GPU queue: two measurements never share a GPU.
- `WorkerPool(cpu_workers, gpus)`: every job is a fresh spawned process (`backends/child.py`) with a
  timeout; a crash, a hang or a CUDA fault comes back as a `ChildResult` (never an exception in the
  caller); CPU jobs run `cpu_workers` at a time; GPU jobs run one at a time per GPU, on that GPU
  (`kstrata.agents.workers`: one worker per device, pinned; a faulting job retried on another GPU, a GPU
  that keeps faulting quarantined).

Task-level candidates carry their Triton kernels inside a `ModelNewEdit`; a `TritonSourceEdit` is one
kernel's `@triton.jit` function for a kernel base (its constexpr values given with it).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from enum import Enum
from pathlib import Path
from typing import Any, TypeVar

from kstrata.agents.workers import (
    CALL_JOB,
    GpuDevice,
    GpuScheduler,
    LocalWorkers,
    child_result,
    visible_gpu_count,
)
from kstrata.backends.child import ChildResult, call_in_child
from kstrata.ir.errors import KstrataError

T = TypeVar("T")

LEVELS = ("task", "triton", "ttir", "ttgir", "llir", "ptx", "amdgcn", "options")
POLICIES = ("strict", "tf32", "bf16", "fp16")
BUILD_SCHEMA = "kstrata.engine.build/1"
#: Speedups beyond this factor (either way) are flagged until explained (DESIGN.md, guarded measurement).
SUSPICIOUS_FACTOR = 10.0


class EngineError(KstrataError):
    """A candidate the engine cannot take (unknown base, an edit for the wrong level, a bad value)."""


# ---------------------------------------------------------------------------------------------------
# Versions: what a build's key must change with
# ---------------------------------------------------------------------------------------------------
def tool_versions(ptxas: str | None = None) -> tuple[tuple[str, str], ...]:
    """Triton, ptxas, LLVM (the AMD assembler and llvmlite) and kstrata versions, as sorted pairs.

    `ptxas`: the assembler Triton uses (`TRITON_PTXAS_PATH`, which Inductor sets to torch's own when it
    first compiles); default: this process's variable as it is now (read on every call, so a lookup after
    Inductor set it sees the ptxas that builds the kernels), else the one `find_nvidia_tool` finds."""
    return _tool_versions(os.environ.get("TRITON_PTXAS_PATH", "") if ptxas is None else ptxas)


@functools.lru_cache(maxsize=8)
def _tool_versions(ptxas: str) -> tuple[tuple[str, str], ...]:
    import importlib.metadata

    import kstrata

    out = {"kstrata": kstrata.__version__}
    for package in ("triton", "llvmlite"):
        try:
            out[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            out[package] = "absent"
    from kstrata.backends.tools import FoundTool, ToolError

    try:
        if ptxas:
            out["ptxas"] = f"{FoundTool('ptxas', Path(ptxas), 'TRITON_PTXAS_PATH').version()} ({ptxas})"
        else:
            from kstrata.backends.nvidia import find_nvidia_tool

            out["ptxas"] = find_nvidia_tool("ptxas").version()
    except ToolError:
        out["ptxas"] = "absent"
    try:
        from kstrata.backends.amd import find_amd_tool

        out["llvm-mc"] = find_amd_tool("llvm-mc").version()
    except ToolError:
        out["llvm-mc"] = "absent"
    return tuple(sorted(out.items()))


def _digest(data: bytes | str) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


def entry_digest(path: str | Path) -> str:
    """Content digest of a Triton cache or dump entry: every file's name and bytes, except the group file
    (it holds absolute paths, which differ between copies of one cache) and Triton's lock/temp files."""
    root = Path(path)
    h = hashlib.sha256()
    for f in sorted(root.iterdir()):
        if not f.is_file() or f.name.startswith(("__grp__", "lock", "tmp.")):
            continue
        h.update(f.name.encode() + b"\0")
        h.update(_digest(f.read_bytes()).encode())
    return h.hexdigest()


def bundle_digest(bundle: Any) -> str:
    """Content digest of a loaded kernel (`KernelBundle`): its name, target, metadata and every level."""
    h = hashlib.sha256(json.dumps({"name": bundle.name, "target": str(bundle.target), "metadata": bundle.metadata},
                                  sort_keys=True, default=str).encode())
    for level in sorted(bundle.levels):
        h.update(f"\0{level}\0{bundle.digest(level)}".encode())
    return h.hexdigest()


def _snapshot_digests(record_path: str) -> list[str]:
    """Digests of the input snapshots a launch record names (relative to its directory): part of a check's key."""
    data = _read_json(Path(record_path))
    args = data.get("args") if isinstance(data, dict) else None
    out = []
    for arg in args if isinstance(args, list) else []:
        snap = arg.get("snapshot") if isinstance(arg, dict) else None
        if snap:
            f = Path(record_path).parent / snap
            out.append(_digest(f.read_bytes()) if f.is_file() else f"missing {snap}")
    return out


def _gpu_visible() -> str:
    """Which GPU a check on `auto`/`cuda` would use (a check's verdict depends on it). Without any GPU
    device node (`/dev/nvidia*`, ROCm's `/dev/kfd`, WSL's `/dev/dxg`) no GPU can be visible: "none",
    without importing torch (1.5 s of every `kstrata verify` on a machine without a GPU)."""
    import glob

    if not glob.glob("/dev/nvidia[0-9]*") and not any(os.path.exists(p) for p in ("/dev/kfd", "/dev/dxg")):
        return "none"
    try:
        import torch

        if torch.cuda.is_available():
            return f"{torch.cuda.get_device_name(0)} (torch {torch.__version__}, hip {torch.version.hip})"
    except ImportError:
        return "no torch"
    return "none"


def _write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp.{os.getpid()}.{threading.get_ident()}")
    tmp.write_text(json.dumps(data, indent=1, default=str))
    tmp.replace(path)


def _read_json(path: Path) -> Any:
    """The JSON in `path`, or None when it is missing or unreadable (a truncated file is a cache miss)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


# ---------------------------------------------------------------------------------------------------
# Candidates
# ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PipelineEdit:
    """A pass pipeline (`ttir(a),ptx(b{x=1})`), run with the levels below each changed one rebuilt."""

    spec: str
    kind: str = "pipeline"


@dataclass(frozen=True)
class AsmPatchEdit:
    """An assembly patch (`kstrata asm patch v1` text) at the PTX or AMDGCN level."""

    text: str
    kind: str = "asm-patch"


@dataclass(frozen=True)
class OptionsEdit:
    """Compile/launch option overrides (`num_warps`, `num_stages`, …): TTIR re-lowered with them."""

    overrides: tuple[tuple[str, str | int | float | bool], ...]
    kind: str = "options"

    @staticmethod
    def of(options: Mapping[str, str | int | float | bool]) -> OptionsEdit:
        return OptionsEdit(tuple(sorted(options.items())))


@dataclass(frozen=True)
class ModelNewEdit:
    """A complete standalone `ModelNew` source for a task (imports torch and triton only)."""

    source: str
    kind: str = "model-new"


@dataclass(frozen=True)
class TritonSourceEdit:
    """A Triton kernel source replacing a kernel base's `@triton.jit` function (`backends/triton_source.py`):
    compiled for the base's target with its options and runtime parameter types; `constexprs` gives the
    values of the source's constexpr parameters (folded into the base's IR, they cannot be read back)."""

    source: str
    constexprs: tuple[tuple[str, str | int | float | bool], ...] = ()
    kind: str = "triton-source"

    @staticmethod
    def of(source: str, constexprs: Mapping[str, str | int | float | bool] | None = None) -> TritonSourceEdit:
        return TritonSourceEdit(source, tuple(sorted((constexprs or {}).items())))


@dataclass(frozen=True)
class IrTextEdit:
    """The whole text of one level replaced (what a generated pass wrote: `kstrata.agents.llm.proposer.
    run_generated_pass`), the levels below rebuilt from it. The text is untrusted: it is parsed in the
    build worker, a child process, where a crash of Triton's or LLVM's parser cannot hurt."""

    text: str
    kind: str = "ir-text"


Edit = PipelineEdit | AsmPatchEdit | OptionsEdit | ModelNewEdit | TritonSourceEdit | IrTextEdit
_EDITS: dict[str, type[Any]] = {"pipeline": PipelineEdit, "asm-patch": AsmPatchEdit, "options": OptionsEdit,
                                "model-new": ModelNewEdit, "triton-source": TritonSourceEdit, "ir-text": IrTextEdit}
#: Which levels each edit kind may name.
_EDIT_LEVELS = {"pipeline": ("ttir", "ttgir", "llir", "ptx", "amdgcn"), "asm-patch": ("ptx", "amdgcn"),
                "options": ("options",), "model-new": ("task",), "triton-source": ("triton",),
                "ir-text": ("ttir", "ttgir", "llir", "ptx", "amdgcn")}


def edit_to_json(edit: Edit) -> dict[str, Any]:
    data = asdict(edit)
    if isinstance(edit, OptionsEdit):
        data["overrides"] = [list(p) for p in edit.overrides]
    if isinstance(edit, TritonSourceEdit):
        data["constexprs"] = [list(p) for p in edit.constexprs]
    return data


def edit_from_json(data: Mapping[str, Any]) -> Edit:
    kind = data.get("kind")
    if kind not in _EDITS:
        raise EngineError(f"unknown edit kind {kind!r}; kinds: {', '.join(_EDITS)}")
    if kind == "options":
        return OptionsEdit(tuple((str(k), v) for k, v in data["overrides"]))
    if kind == "triton-source":
        return TritonSourceEdit(str(data["source"]), tuple((str(k), v) for k, v in data.get("constexprs") or ()))
    fields = {k: v for k, v in data.items() if k != "kind"}
    edit: Edit = _EDITS[kind](**fields)
    return edit


@dataclass(frozen=True)
class Provenance:
    """Who proposed a candidate and from where: the proposer's name, the parent candidate's key, the space."""

    proposer: str = "user"
    parent: str | None = None
    space: str = ""


@dataclass(frozen=True)
class Candidate:
    base: str
    level: str
    edit: Edit
    tolerance: str | None = None
    policy: str = "strict"
    provenance: Provenance = field(default=Provenance(), compare=False)

    def __post_init__(self) -> None:
        if self.level not in LEVELS:
            raise EngineError(f"unknown candidate level {self.level!r}; levels: {', '.join(LEVELS)}")
        if self.policy not in POLICIES:
            raise EngineError(f"unknown precision policy {self.policy!r}; policies: {', '.join(POLICIES)}")
        allowed = _EDIT_LEVELS[self.edit.kind]
        if self.level not in allowed:
            raise EngineError(f"a {self.edit.kind} edit works at {', '.join(allowed)}, not at {self.level}")

    def identity(self) -> dict[str, Any]:
        """What the key hashes: everything that changes the build, and nothing that does not."""
        return {"base": self.base, "level": self.level, "edit": edit_to_json(self.edit),
                "tolerance": self.tolerance, "policy": self.policy, "versions": dict(tool_versions())}

    @property
    def key(self) -> str:
        return _digest(json.dumps(self.identity(), sort_keys=True))[:32]

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "base": self.base, "level": self.level, "edit": edit_to_json(self.edit),
                "tolerance": self.tolerance, "policy": self.policy, "provenance": asdict(self.provenance)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Candidate:
        return cls(str(data["base"]), str(data["level"]), edit_from_json(data["edit"]), data.get("tolerance"),
                   str(data.get("policy", "strict")), Provenance(**(data.get("provenance") or {})))

    @classmethod
    def task(cls, base: str, source: str = "", *, policy: str = "strict", tolerance: str | None = None,
             provenance: Provenance | Mapping[str, Any] | None = None, level: str = "task",
             edit: Any = None) -> Candidate:
        """A task-level candidate: a complete `ModelNew` source for the task `base` (the optimizer's
        `TaskCandidate.engine_fields()` fit: `Candidate.task(base, **candidate.engine_fields())`)."""
        source = edit if isinstance(edit, str) else source
        if not source or level != "task":
            raise EngineError("a task candidate needs a ModelNew source, at level task")
        prov = provenance if isinstance(provenance, Provenance) else Provenance(**(provenance or {}))
        return cls(base, level, ModelNewEdit(source), tolerance, policy, prov)


# ---------------------------------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BuildResult:
    """What `build` made of a candidate. `status`: "changed" (a new kernel, `entry` holds it), "unchanged"
    (the edit changed nothing), "failed" (`error`; `repro` when a pass left a reproducer)."""

    key: str
    status: str
    kind: str = "kernel"  # "kernel" or "task"
    name: str = "?"
    target: str = "?"
    first_changed: str | None = None
    #: The rebuilt kernel as a Triton cache entry, or the `ModelNew` file of a task candidate.
    entry: str | None = None
    binary_digest: str | None = None
    #: The key of the first build with the same binary: this one is checked and timed as that one.
    duplicate_of: str | None = None
    #: The binary is byte-identical to the base's.
    same_binary_as_base: bool = False
    passes: list[dict[str, Any]] = field(default_factory=list)
    static_checks: dict[str, Any] = field(default_factory=dict)
    resources_before: dict[str, Any] = field(default_factory=dict)
    resources_after: dict[str, Any] = field(default_factory=dict)
    metadata_changes: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    repro: str | None = None
    seconds: float = 0.0
    #: Came from the engine cache (no process ran).
    cached: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"schema": BUILD_SCHEMA, **asdict(self)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> BuildResult:
        return cls(**{k: v for k, v in data.items() if k != "schema"})


class Verdict(str, Enum):
    """`kstrata verify`'s verdicts (`backends/verify.py`, same values) plus `error`: could not be decided
    (the check's process crashed or timed out, the build failed); never cached."""

    EQUIVALENT = "equivalent"
    DIFFERENT = "different"
    UNPROVEN = "unproven"
    ERROR = "error"


@dataclass(frozen=True)
class Evidence:
    name: str
    level: str
    verdict: str  # "pass", "fail", "skipped"
    detail: str
    #: The check's own wall time, when it ran a job (verify's `Check.seconds`).
    seconds: float | None = None


@dataclass(frozen=True)
class CheckResult:
    verdict: Verdict
    reason: str
    evidence: tuple[Evidence, ...] = ()
    seconds: float = 0.0
    cached: bool = False
    #: The whole report of the check, as JSON: `kstrata verify`'s (`VerifyReport.to_json()`) for a check
    #: with `VerifyOptions`, the evaluator's (`EvalVerdict.to_json()`) for a task check with `TaskOptions`.
    report: dict[str, Any] | None = field(default=None, compare=False)
    #: The evaluator's verdict itself (this process only; not cached): what `kstrata eval` prints.
    task_verdict: Any = field(default=None, compare=False, repr=False)

    @property
    def accepted(self) -> bool:
        return self.verdict is Verdict.EQUIVALENT

    def to_json(self) -> dict[str, Any]:
        data = {"verdict": self.verdict.value, "reason": self.reason, "evidence": [asdict(e) for e in self.evidence],
                "seconds": self.seconds}
        return {**data, "report": self.report} if self.report is not None else data

    @classmethod
    def from_json(cls, data: Mapping[str, Any], cached: bool = False) -> CheckResult:
        return cls(Verdict(data["verdict"]), str(data["reason"]), tuple(Evidence(**e) for e in data["evidence"]),
                   float(data.get("seconds", 0.0)), cached, data.get("report"))


@dataclass(frozen=True)
class TaskOptions:
    """How a task candidate is evaluated, `kstrata eval`'s options (`agents/evaluate.py` `evaluate`): the
    evaluator's policy (strict or kernelbench), trials, seed, timed runs, a CUDA graph, timing (None: on a
    GPU), and, not part of a check's identity, measured ceilings (roofline) and progress callbacks."""

    policy: str = "strict"
    trials: int = 6
    seed: int = 42
    runs: int = 100
    cuda_graph: bool = False
    timing: bool | None = None
    #: Keep this evaluation (its timings and memory peaks included) in the engine cache, keyed by the
    #: candidate's content, the base, these options, the device and the versions, and answer a repeat from
    #: it (`kstrata bench`'s baselines). `kstrata eval` leaves it off: every eval evaluates.
    keep: bool = False
    ceilings: Any = field(default=None, compare=False)
    #: The environment of the evaluator's processes (a GPU worker's `CUDA_VISIBLE_DEVICES`); None: this one's.
    env: Mapping[str, str] | None = field(default=None, compare=False)
    on_progress: Callable[..., None] | None = field(default=None, compare=False)
    on_plan: Callable[[Any], None] | None = field(default=None, compare=False)


@dataclass(frozen=True)
class VerifyOptions:
    """How a kernel candidate is checked, `kstrata verify`'s options (`backends/verify.py` `verify`): random
    input sets per dynamic check, the device (auto, cpu, cuda), the compute-sanitizer tool (auto, none,
    memcheck, …), seconds per dynamic run, static evidence accepted explicitly, the symbolic check when the
    verdict would be unproven, whether a launch kstrata knows (a suite kernel's) stands in for none, and whether
    the CPU interpreter runs on changed TTIR/TTGIR when the GPU differential run checks the binary as well
    (`interpreter=False` leaves it to a later, full check)."""

    seeds: int = 2
    device: str = "auto"
    sanitizer: str = "auto"
    timeout: float = 120.0
    static_only: bool = False
    symbolic: bool = False
    find_launch: bool = True
    interpreter: bool = True


@dataclass(frozen=True)
class Budget:
    """How much timing a candidate gets: `rounds` A/B rounds of `runs` runs each; `best_us` is the best
    time known so far (the early stop compares with it); `margin` is how much slower is "clearly"."""

    rounds: int = 6
    runs: int = 50
    best_us: float | None = None
    margin: float = 0.10
    timeout_s: float = 300.0


@dataclass(frozen=True)
class Measurement:
    """A timing of a candidate against its original. `status`: "timed", "skipped" (`reason` says why it
    cannot be timed here), "failed" (`reason`: the process crashed, hung or raised)."""

    status: str
    reason: str = ""
    time_before_us: float | None = None
    time_after_us: float | None = None
    speedup: float | None = None
    detail: dict[str, Any] = field(default_factory=dict)
    suspicious: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class EngineStats:
    builds: int = 0
    build_cache_hits: int = 0
    deduplicated: int = 0
    checks: int = 0
    check_cache_hits: int = 0
    measured: int = 0

    def to_json(self) -> dict[str, int]:
        return asdict(self)


# ---------------------------------------------------------------------------------------------------
# The worker pool
# ---------------------------------------------------------------------------------------------------
class WorkerPool:
    """Spawned processes with a timeout per job. CPU jobs run `cpu_workers` at a time; GPU jobs go through
    one worker per GPU (`kstrata.agents.workers.GpuScheduler`: one job at a time on each, its processes pinned
    with `CUDA_VISIBLE_DEVICES`; a job whose process dies, hangs or hits a CUDA error is retried on another
    GPU, and a GPU that keeps faulting is quarantined). `gpus`: indices, or `GpuDevice`s (`--gpus`; tests give
    fake ones); None: every visible GPU (GPU 0 when none is)."""

    def __init__(self, cpu_workers: int = 1, gpus: Sequence[int] | Sequence[GpuDevice] | None = None, *,
                 workers: LocalWorkers | None = None) -> None:
        self.cpu_workers = max(1, cpu_workers)
        self._cpu = ThreadPoolExecutor(max_workers=self.cpu_workers, thread_name_prefix="kstrata-cpu")
        self._gpu_spec: list[int | GpuDevice] | None = list(gpus) if gpus is not None else None
        # `workers`: another driver's GPU workers (the optimizer's), so this pool's GPU jobs share its per-GPU
        # scheduling (`GpuUse`) instead of timing beside that driver's jobs on the same device.
        self._workers: LocalWorkers | None = workers
        self._gpu_threads: ThreadPoolExecutor | None = (
            ThreadPoolExecutor(max_workers=2 * len(workers.gpus), thread_name_prefix="kstrata-gpu") if workers else None)
        self._lock = threading.Lock()

    def _gpu_workers(self) -> LocalWorkers:
        with self._lock:
            if self._workers is None:
                spec: list[int | GpuDevice] = self._gpu_spec if self._gpu_spec is not None else \
                    [*range(visible_gpu_count())] or [0]
                devices = [d if isinstance(d, GpuDevice) else GpuDevice(d, f"cuda:{d}", (("CUDA_VISIBLE_DEVICES",
                                                                                          str(d)),)) for d in spec]
                self._workers = LocalWorkers(devices)
                self._gpu_threads = ThreadPoolExecutor(max_workers=2 * len(devices), thread_name_prefix="kstrata-gpu")
            return self._workers

    def gpus(self) -> list[int]:
        return [d.index for d in self._gpu_workers().gpus]

    @property
    def scheduler(self) -> GpuScheduler:
        return self._gpu_workers().scheduler

    def _run_gpu(self, target: str, payload: Any, timeout: float, gpu: int | None,
                 env: Mapping[str, str] | None) -> ChildResult:
        workers = self._gpu_workers()
        affinity = None
        if gpu is not None:
            affinity = f"gpu {gpu}"
            workers.scheduler.bind(affinity, gpu)
        out = workers.run(CALL_JOB, {"target": target, "payload": payload, "timeout": timeout,
                                     "env": dict(env) if env is not None else None},
                          kind="gpu", affinity=affinity, exclusive=True)
        result: ChildResult = child_result(out)
        return result

    def submit(self, target: str, payload: Any, *, timeout: float, kind: str = "cpu", gpu: int | None = None,
               env: Mapping[str, str] | None = None) -> Future[ChildResult]:
        """Call `target` ("module:function") with `payload` in a fresh process; the future's result is the
        `ChildResult` (status ok/error/failed/crashed/timeout), never an exception."""
        if kind == "cpu":
            return self._cpu.submit(call_in_child, target, payload, timeout=timeout, env=env)
        if kind != "gpu":
            raise EngineError(f"unknown job kind {kind!r} (cpu or gpu)")
        self._gpu_workers()
        assert self._gpu_threads is not None
        return self._gpu_threads.submit(self._run_gpu, target, payload, timeout, gpu, env)

    def run(self, target: str, payload: Any, *, timeout: float, kind: str = "cpu", gpu: int | None = None,
            env: Mapping[str, str] | None = None) -> ChildResult:
        return self.submit(target, payload, timeout=timeout, kind=kind, gpu=gpu, env=env).result()

    def on_gpu(self, fn: Callable[[], T], gpu: int | None = None) -> T:
        """Run `fn` (which starts its own processes, e.g. the evaluator) holding a GPU's slot, and wait for it."""
        scheduler = self.scheduler
        affinity = None
        if gpu is not None:
            affinity = f"gpu {gpu}"
            scheduler.bind(affinity, gpu)
        return scheduler.run(lambda _device: fn(), is_fault=lambda _r: False, affinity=affinity, exclusive=True)

    def close(self) -> None:
        self._cpu.shutdown(wait=True)
        if self._gpu_threads is not None:
            self._gpu_threads.shutdown(wait=True)


# ---------------------------------------------------------------------------------------------------
# The engine
# ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BaseRef:
    kind: str  # "kernel" or "task"
    path: str
    override_key: str | None = None


def default_cache_dir() -> Path:
    env = os.environ.get("KSTRATA_ENGINE_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "kstrata" / "engine"


class Engine:
    """Build, check and measure candidates (see the module docstring)."""

    def __init__(self, cache_dir: str | Path | None = None, pool: WorkerPool | None = None, *, jobs: int = 1,
                 build_timeout: float = 600.0) -> None:
        self.cache_dir = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
        try:
            self.cache_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise EngineError(f"the engine's cache directory cannot be created: {exc.strerror or exc}",
                              path=self.cache_dir, hint="give --engine-cache DIR, or set KSTRATA_ENGINE_CACHE") from None
        self._own_pool = pool is None
        self.pool = pool or WorkerPool(jobs)
        self.build_timeout = build_timeout
        self.stats = EngineStats()
        self._bases: dict[str, BaseRef] = {}
        self._lock = threading.Lock()
        #: Timings of this session by (original, binary, launches, the original's own launches): a duplicate
        #: binary is timed once.
        self._timings: dict[tuple[str, str, tuple[str, ...], tuple[str, ...]], Measurement] = {}
        #: Kernels loaded by the caller (`add_bundle`) and candidates made outside the engine (`adopt`).
        self._bundles: dict[str, Any] = {}
        self._adopted: dict[str, tuple[Any, list[str] | None]] = {}

    def close(self) -> None:
        if self._own_pool:
            self.pool.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- bases ------------------------------------------------------------------------------------
    def add_kernel(self, entry: str | Path, override_key: str | None = None) -> str:
        """Register a Triton cache or dump entry as a base; returns its content digest."""
        path = Path(entry)
        if not path.is_dir():
            raise EngineError("no such kernel entry directory", path=path)
        digest = entry_digest(path)
        with self._lock:
            self._bases[digest] = BaseRef("kernel", str(path.resolve()), override_key)
        return digest

    def add_task(self, task: str | Path) -> str:
        """Register a KernelBench-format task file as a base; returns its content digest."""
        path = Path(task)
        if not path.is_file():
            raise EngineError("no such task file", path=path)
        digest = _digest(path.read_bytes())
        with self._lock:
            self._bases[digest] = BaseRef("task", str(path.resolve()))
        return digest

    def add_bundle(self, bundle: Any) -> str:
        """Register a kernel the caller has loaded (a `KernelBundle`: a cache or dump entry, or an IR file
        compiled for its target) as a base; returns its content digest (`bundle_digest`)."""
        digest = bundle_digest(bundle)
        with self._lock:
            self._bases[digest] = BaseRef("kernel", str(bundle.origin or bundle.name), bundle.override_key)
            self._bundles[digest] = bundle
        return digest

    def add_stage_kernel(self, bundle: Any) -> str:
        """Register a kernel caught mid-compile as a base (the `torch.compile` backend's stage hook: the levels
        Triton has made so far, down to the one a pipeline rewrites, and Triton's metadata at that point); returns
        its content digest (`bundle_digest`). It is kept as a cache entry under `CACHE/bases/<digest>/`; a build
        of a candidate of it first rebuilds its lower levels with Triton's stages, which gives Triton's own
        binary, so the static checks compare the rewrite with the kernel Triton would have made."""
        from kstrata.ir.triton_layout import write_cache_entry

        digest = bundle_digest(bundle)
        root = self.cache_dir / "bases" / digest
        entries = [d for d in root.iterdir() if d.is_dir()] if root.is_dir() else []
        entry = entries[0] if entries else write_cache_entry(bundle, root, overwrite=True)
        with self._lock:
            self._bases[digest] = BaseRef("kernel", str(entry), bundle.override_key)
        return digest

    def adopt(self, base: str, bundle: Any, *, edited: Sequence[str] | None = None) -> BuildResult:
        """A kernel candidate made outside the engine (a user's override entry, cache entry or IR file, loaded
        as `kstrata verify` loads it) as a build the engine checks. Its digest is its content (every level
        and the metadata, `bundle_digest`): a candidate checked before with the same content, by this
        engine or by an earlier run on the same cache, gets that check back. `edited`: the levels its
        pipeline edits on purpose (`kstrata-candidate.json`), which decide what verify rebuilds."""
        original = self._bundles.get(base)
        if original is None:
            self.base(base)  # unknown: the clear error
            raise EngineError("adopt takes a base registered with add_bundle (a loaded kernel)")
        digest = bundle_digest(bundle)
        levels = sorted(edited) if edited else None
        key = _digest(json.dumps({"base": base, "adopted": digest, "edited": levels,
                                  "versions": dict(tool_versions())}, sort_keys=True))[:32]
        with self._lock:
            self._adopted[key] = (bundle, levels)
        return BuildResult(key, "changed", name=bundle.name, target=str(bundle.target), entry=bundle.origin,
                           binary_digest=digest, same_binary_as_base=digest == base)

    def adopt_task(self, base: str, model_new: str | Path, *, policy: str = "strict") -> BuildResult:
        """A task candidate in the user's own file (`kstrata eval TASK CANDIDATE`): the build of
        `Candidate.task(base, its source)`, evaluated where it is (a ModelNew may import files beside it)."""
        ref = self.base(base)
        if ref.kind != "task":
            raise EngineError("adopt_task takes a task base (add_task)")
        path = Path(model_new)
        if not path.is_file():
            raise EngineError("no such candidate file", path=path)
        source = path.read_bytes()
        key = Candidate.task(base, source.decode(errors="replace"), policy=policy).key
        return BuildResult(key, "changed", "task", name=Path(ref.path).stem, target="task", first_changed="task",
                           entry=str(path), binary_digest=_digest(source))  # as given: the verdict names it

    def as_build(self, base: str) -> BuildResult:
        """A registered kernel base as it is, in the form `measure` times: another compiled config of a kernel
        (Inductor's autotuning) timed against the config a program ran, each on its own launch record."""
        ref = self.base(base)
        if ref.kind != "kernel":
            raise EngineError("as_build takes a kernel base (add_kernel)")
        bundle = _load_one(ref.path, ref.override_key)
        return BuildResult(f"config-{base[:27]}", "changed", name=bundle.name, target=str(bundle.target),
                           entry=ref.path, binary_digest=_digest(_binary(bundle)))

    def base(self, digest: str) -> BaseRef:
        try:
            return self._bases[digest]
        except KeyError:
            raise EngineError(f"unknown base {digest[:16]}…: register it with add_kernel/add_task first") from None

    # -- build ------------------------------------------------------------------------------------
    def _build_dir(self, key: str) -> Path:
        return self.cache_dir / "builds" / key

    def _cached_build(self, key: str) -> BuildResult | None:
        data = _read_json(self._build_dir(key) / "build.json")
        if not isinstance(data, dict) or data.get("schema") != BUILD_SCHEMA:
            return None
        try:
            result = BuildResult.from_json(data)
        except TypeError:
            return None
        if result.status == "changed" and not self._entry_intact(result):
            return None  # a truncated or removed output: build again
        return result

    @staticmethod
    def _entry_intact(result: BuildResult) -> bool:
        if result.entry is None or result.binary_digest is None:
            return False
        entry = Path(result.entry)
        if result.kind == "task":
            return entry.is_file() and _digest(entry.read_bytes()) == result.binary_digest
        binaries = [*entry.glob("*.cubin"), *entry.glob("*.hsaco")] if entry.is_dir() else []
        return len(binaries) == 1 and _digest(binaries[0].read_bytes()) == result.binary_digest

    def _dedupe(self, result: BuildResult) -> BuildResult:
        """Record the first build of each binary; a later build with the same binary points at it."""
        if result.status != "changed" or result.binary_digest is None:
            return result
        marker = self.cache_dir / "binaries" / f"{result.binary_digest}.json"
        first = _read_json(marker)
        if isinstance(first, dict) and first.get("key") not in (None, result.key) \
                and self._cached_build(str(first["key"])) is not None:
            return BuildResult.from_json({**result.to_json(), "duplicate_of": first["key"]})
        _write_json(marker, {"key": result.key})
        return result

    def build(self, candidate: Candidate, *, repro_dir: str | Path | None = None,
              env: Mapping[str, str] | None = None) -> BuildResult:
        """Build `candidate` (or return the cached build); see the module docstring. `env` is the worker's
        environment; a `TRITON_PTXAS_PATH` in it (the ptxas a recorded program used) is part of the key."""
        key = candidate.key
        ptxas = (env or {}).get("TRITON_PTXAS_PATH")
        if ptxas and ptxas != os.environ.get("TRITON_PTXAS_PATH"):
            key = _digest(f"{key}|ptxas={ptxas}")[:32]
        cached = self._cached_build(key)
        if cached is not None:
            with self._lock:
                self.stats.build_cache_hits += 1
                self.stats.deduplicated += cached.duplicate_of is not None
            return BuildResult.from_json({**cached.to_json(), "cached": True})
        base = self.base(candidate.base)
        out = self._build_dir(key)
        start = time.perf_counter()
        if base.kind == "task":
            result = self._build_task(candidate, base, out)
        elif isinstance(candidate.edit, ModelNewEdit):
            result = BuildResult(key, "failed", error="a model-new edit is for a task base (level task); a kernel "
                                 "base takes a pipeline, options, an assembly patch or a Triton source")
        else:
            payload = {"base": base.path, "override_key": base.override_key, "edit": edit_to_json(candidate.edit),
                       "level": candidate.level, "out": str(out / "entry"), "key": key,
                       "repro_dir": str(repro_dir) if repro_dir is not None else None,
                       "sources": str(self.cache_dir / "sources")}
            if isinstance(candidate.edit, TritonSourceEdit):  # @triton.jit must compile, not interpret
                env = {k: v for k, v in (env if env is not None else os.environ).items() if k != "TRITON_INTERPRET"}
            run = self.pool.run("kstrata.agents.engine:build_kernel_job", payload, timeout=self.build_timeout, env=env)
            if run.ok:
                result = BuildResult.from_json({**run.value, "key": key})
            elif run.status == "error":
                result = BuildResult(key, "failed", error=run.error)
            else:  # a crash or a hang is this candidate's failure; not cached (it may be the machine's)
                result = BuildResult(key, "failed", error=f"the build's worker process {run.reason()}",
                                     seconds=time.perf_counter() - start)
                with self._lock:
                    self.stats.builds += 1
                return result
        with self._lock:  # the marker and the first build's record are written together
            result = self._dedupe(result)
            _write_json(out / "build.json", result.to_json())
            self.stats.builds += 1
            self.stats.deduplicated += result.duplicate_of is not None
        return result

    def build_many(self, candidates: Iterable[Candidate], *, on_built: Callable[[Candidate, BuildResult], None]
                   | None = None, repro_dir: str | Path | None = None,
                   env_for: Callable[[Candidate], Mapping[str, str] | None] | None = None) -> list[BuildResult]:
        """`build` each candidate, `pool.cpu_workers` at a time, in the order given; `on_built` as each ends."""
        todo = list(candidates)

        def one(c: Candidate) -> BuildResult:
            result = self.build(c, repro_dir=repro_dir, env=env_for(c) if env_for else None)
            if on_built is not None:
                on_built(c, result)
            return result

        with ThreadPoolExecutor(max_workers=self.pool.cpu_workers) as threads:
            return list(threads.map(one, todo))

    def _build_task(self, candidate: Candidate, base: BaseRef, out: Path) -> BuildResult:
        if not isinstance(candidate.edit, ModelNewEdit):
            return BuildResult(candidate.key, "failed", "task",
                               error=f"a task base takes a model-new edit, not {candidate.edit.kind}")
        out.mkdir(parents=True, exist_ok=True)
        path = out / "model_new.py"
        tmp = out / ".model_new.py.tmp"
        tmp.write_text(candidate.edit.source)
        tmp.replace(path)
        return BuildResult(candidate.key, "changed", "task", name=Path(base.path).stem, target="task",
                           first_changed="task", entry=str(path), binary_digest=_digest(candidate.edit.source))

    def built_entry(self, result: BuildResult) -> str:
        """The entry to check and time for `result`: the first build with the same binary when deduplicated."""
        if result.duplicate_of:
            first = self._cached_build(result.duplicate_of)
            if first is not None and first.entry:
                return first.entry
        if result.entry is None:
            raise EngineError(f"candidate {result.key}: nothing was built ({result.status}: {result.error})")
        return result.entry

    # -- check ------------------------------------------------------------------------------------
    def check(self, original: str, built: BuildResult, launches: Sequence[str | Path] = (), *, device: str = "cpu",
              seeds: int = 1, tolerance: str | None = None, policy: str = "strict",
              timeout: float = 900.0, verify: VerifyOptions | None = None,
              on_check: Callable[[Any], None] | None = None, use_cache: bool = True,
              task: TaskOptions | None = None) -> CheckResult:
        """A verdict on `built` against the base `original`, with evidence (see the module docstring).

        A candidate from `adopt` is checked by `kstrata verify`'s pipeline in this process, with `verify`'s
        options (its own rebuilds and dynamic runs are child processes), `on_check(check)` called as each
        dynamic check ends; the result carries the whole report (`report`). Its verdict is cached unless it
        is unproven and a check could not run (the machine's lack: decided again next time; a GPU run
        skipped under --device cpu is the caller's choice, part of the key); `use_cache=False`
        decides it again anyway.

        A task candidate checked with `task` options (`kstrata eval`) is evaluated with them, in this
        process's call of the evaluator (each role in its own process), and never served from the cache: its
        verdict carries this run's memory peaks, and timings when it timed, which `measure` then returns
        instead of evaluating again. The result carries the evaluator's verdict (`task_verdict`, `report`)."""
        if built.status == "failed":
            return CheckResult(Verdict.ERROR, f"the build failed: {built.error}")
        if built.status == "unchanged":
            return CheckResult(Verdict.EQUIVALENT, "identical code: the edit changed nothing",
                               (Evidence("identical", "all", "pass", "no level changed"),))
        base = self.base(original)
        launch_paths = [str(Path(p).resolve()) for p in launches]
        adopted = self._adopted.get(built.key)
        ident: dict[str, Any] = {"original": original, "binary": built.binary_digest, "device": device,
                                 "seeds": seeds, "tolerance": tolerance, "policy": policy,
                                 "launches": [_digest(Path(p).read_bytes()) for p in launch_paths]}
        if adopted is not None or (verify is not None and base.kind == "kernel"):
            options = verify or VerifyOptions()
            ident = {**ident, "device": options.device, "seeds": options.seeds, "verify": asdict(options),
                     "edited": adopted[1] if adopted is not None else None,
                     "snapshots": [_snapshot_digests(p) for p in launch_paths],
                     "gpu": _gpu_visible() if options.device != "cpu" else None,
                     "versions": dict(tool_versions())}
        cache = self.cache_dir / "checks" / f"{_digest(json.dumps(ident, sort_keys=True))[:32]}.json"
        if task is not None and base.kind == "task":
            return self._evaluate_task(original, base, built, device, timeout, task, use_cache)
        data = _read_json(cache) if use_cache else None
        if isinstance(data, dict) and (adopted is None or isinstance(data.get("report"), dict)):
            with contextlib.suppress(KeyError, TypeError, ValueError):
                result = CheckResult.from_json(data, cached=True)
                with self._lock:
                    self.stats.check_cache_hits += 1
                return result
        start = time.perf_counter()
        if adopted is not None:
            result = self._check_adopted(original, adopted, launch_paths, tolerance, verify or VerifyOptions(),
                                         on_check)
        elif base.kind == "task":
            result = self._check_task(base, self.built_entry(built), device, policy, timeout)
        else:
            result = self._check_kernel(base, built, launch_paths, device, seeds, tolerance, timeout, verify)
        result = CheckResult(result.verdict, result.reason, result.evidence, time.perf_counter() - start,
                             report=result.report)
        # equivalent (evidence) and different (a failure found) stand; unproven for want of a check may not
        skipped = adopted is not None and result.verdict is Verdict.UNPROVEN and \
            any(e.verdict == "skipped" for e in result.evidence)
        if result.verdict is not Verdict.ERROR and not skipped:  # an error may be the machine's: decide it again
            _write_json(cache, result.to_json())
        with self._lock:
            self.stats.checks += 1
        return result

    def _check_adopted(self, original: str, adopted: tuple[Any, list[str] | None], launches: list[str],
                       tolerance: str | None, options: VerifyOptions,
                       on_check: Callable[[Any], None] | None) -> CheckResult:
        """`kstrata verify` of an adopted candidate against a loaded base, on the first launch record (or the
        launch kstrata knows for the kernel); raises `KstrataError` for what the user must fix."""
        from kstrata.backends.verify import verify
        from kstrata.ir.launch import LaunchRecord

        record = LaunchRecord.load(launches[0]) if launches else None
        report = verify(self._bundles[original], adopted[0], record, seeds=options.seeds, device=options.device,
                        tolerance=tolerance, sanitizer=options.sanitizer, timeout=options.timeout,
                        launch_dir=Path(launches[0]).parent if launches else None, on_check=on_check,
                        static_only=options.static_only, find_launch=options.find_launch,
                        symbolic=options.symbolic, edited=adopted[1])
        evidence = tuple(Evidence(c.name, c.level, c.verdict, c.detail, c.seconds) for c in report.checks)
        verdict = Verdict(report.verdict.value)
        failed = next((c for c in report.checks if c.verdict == "fail"), None)
        reason = (f"{failed.name} at {failed.level}: {failed.detail}" if failed is not None else
                  "; ".join(report.unproven_reasons()) if verdict is Verdict.UNPROVEN else
                  ", ".join(report.evidence()) or "identical code")
        return CheckResult(verdict, reason, evidence, report=report.to_json())

    def _check_kernel(self, base: BaseRef, built: BuildResult, launches: list[str], device: str, seeds: int,
                      tolerance: str | None, timeout: float, options: VerifyOptions | None = None) -> CheckResult:
        evidence = [Evidence(f"static: {name}", "launch", "pass", str(detail))
                    for name, detail in built.static_checks.items() if not isinstance(detail, list)]
        if built.same_binary_as_base:
            return CheckResult(Verdict.EQUIVALENT, "identical code: the binary is byte-identical to the original's",
                               (*evidence, Evidence("identical binary", "binary", "pass", "same bytes")))
        verdicts: list[str] = []
        reasons: list[str] = []
        for launch in launches:
            payload: dict[str, Any] = {
                "original": base.path, "override_key": base.override_key, "candidate": self.built_entry(built),
                "launch": launch, "device": device, "seeds": seeds, "tolerance": tolerance,
                # the levels the pipeline edited: verify rebuilds below the lowest, not below the highest
                "edited": sorted({str(r.get("level")) for r in built.passes if r.get("status") == "changed"})}
            if options is not None:  # verify's own options: the device, seeds, sanitizer, time per run
                payload.update({"device": options.device, "seeds": options.seeds, "sanitizer": options.sanitizer,
                                "run_timeout": options.timeout, "static_only": options.static_only,
                                "interpreter": options.interpreter})
            run = self.pool.run("kstrata.agents.engine:check_kernel_job", payload, timeout=timeout,
                                env=tool_env(launch))
            if not run.ok:
                return CheckResult(Verdict.ERROR, f"the check could not run on {launch}: "
                                   f"{run.error if run.status == 'error' else run.reason()}", tuple(evidence))
            evidence += [Evidence(**e) for e in run.value["checks"]]
            verdicts.append(run.value["verdict"])
            reasons += run.value["reasons"]
        if not launches:
            # no launch record: the symbolic checker (kstrata.ir.symbolic) gates TTIR/TTGIR edits before any GPU
            # time; a proof is evidence, a counterexample the interpreter confirmed is a difference
            # the job finds the levels that differ; PTX- or option-only edits give no symbolic check
            run = self.pool.run("kstrata.agents.engine:symbolic_check_job",
                                {"original": base.path, "override_key": base.override_key,
                                 "candidate": self.built_entry(built), "tolerance": tolerance}, timeout=timeout)
            if run.ok:
                evidence += [Evidence(**e) for e in run.value["checks"]]
            else:
                evidence.append(Evidence("symbolic", "ttir", "skipped", f"the symbolic check could not run: "
                                         f"{run.error if run.status == 'error' else run.reason()}"))
            return _verdict_of(evidence)
        # `kstrata verify`'s own verdict per launch record (backends/verify.py), combined over the records
        if Verdict.DIFFERENT.value in verdicts:
            return _verdict_of(evidence)
        if all(v == Verdict.EQUIVALENT.value for v in verdicts):
            from kstrata.backends.verify import GPU_DIFFERENTIAL

            dynamic = sum(1 for e in evidence if e.verdict == "pass"
                          and e.name.startswith(("interpreter", GPU_DIFFERENTIAL + ":", "determinism")))
            return CheckResult(Verdict.EQUIVALENT, f"equivalent on {len(launches)} launch records "
                               f"({dynamic} dynamic checks passed)", tuple(evidence))
        return CheckResult(Verdict.UNPROVEN, "; ".join(dict.fromkeys(reasons)) or "unproven", tuple(evidence))

    def _kept_evaluation(self, original: str, built: BuildResult, device: str, options: TaskOptions) -> Path:
        """Where a kept evaluation (`TaskOptions.keep`) of `built` lives: keyed by everything its figures
        depend on (the base, the candidate's content, the evaluator's options, the device and GPU, torch and
        the tool versions), so a changed task, option or version evaluates again."""
        import platform

        import torch

        ident = {"original": original, "candidate": built.binary_digest, "device": device,
                 "options": {"policy": options.policy, "trials": options.trials, "seed": options.seed,
                             "runs": options.runs, "cuda_graph": options.cuda_graph, "timing": options.timing},
                 "gpu": _gpu_visible() if device != "cpu" else None, "torch": torch.__version__,
                 "python": platform.python_version(), "versions": dict(tool_versions())}
        return self.cache_dir / "evaluations" / f"{_digest(json.dumps(ident, sort_keys=True))[:32]}.json"

    def _evaluate_task(self, original: str, base: BaseRef, built: BuildResult, device: str, timeout: float,
                       options: TaskOptions, use_cache: bool = True) -> CheckResult:
        from kstrata.agents.evaluate import evaluate

        start = time.perf_counter()
        memo = (original, built.binary_digest or "", (), ())
        kept = self._kept_evaluation(original, built, device, options) if options.keep else None
        data = _read_json(kept) if kept is not None and use_cache else None
        if isinstance(data, dict) and isinstance(data.get("report"), dict):
            with contextlib.suppress(KeyError, TypeError, ValueError):
                result = CheckResult.from_json(data, cached=True)
                assert result.report is not None
                with self._lock:
                    self.stats.check_cache_hits += 1
                    if result.report.get("reference_timing") and result.report.get("candidate_timing"):
                        self._timings[memo] = _task_measurement(result.report)
                return result

        def run() -> Any:
            return evaluate(base.path, self.built_entry(built), policy=options.policy, trials=options.trials,
                            seed=options.seed, device=device or None, timeout_s=timeout, timing=options.timing,
                            runs=options.runs, cuda_graph=options.cuda_graph, ceilings=options.ceilings,
                            on_progress=options.on_progress, on_plan=options.on_plan,
                            env=dict(options.env) if options.env is not None else None)

        # an evaluation that may time goes through the GPU queue: two timings never share a GPU
        v = run() if device == "cpu" or options.timing is False else self.pool.on_gpu(run)
        report = v.to_json()
        result = _task_result(v, options.policy)
        with self._lock:
            self.stats.checks += 1
            if v.reference_timing is not None and v.candidate_timing is not None:
                self._timings[memo] = _task_measurement(report)
        checked = CheckResult(result.verdict, result.reason, result.evidence, time.perf_counter() - start,
                              report=report, task_verdict=v)
        # a crash or a hang may be the machine's (a GPU fault, an overloaded host): evaluated again next time
        if kept is not None and v.failure not in ("crash", "timeout"):
            _write_json(kept, checked.to_json())
        return checked

    def _check_task(self, base: BaseRef, model_new: str, device: str, policy: str, timeout: float) -> CheckResult:
        from kstrata.agents.evaluate import evaluate

        eval_policy = "strict" if policy != "kernelbench" else policy
        v = evaluate(base.path, model_new, policy=eval_policy, device=device, timing=False, timeout_s=timeout)
        return _task_result(v, eval_policy)

    # -- measure ----------------------------------------------------------------------------------
    def measure(self, original: str, built: BuildResult, launches: Sequence[str | Path] = (),
                budget: Budget | None = None, *, original_launches: Sequence[str | Path] = (),
                declared_tolerance: str | None = None) -> Measurement:
        """Time `built` against `original` on the GPU (see the module docstring). `original_launches`: the
        original's own launch record, when it is another config of the kernel (other block sizes and grid,
        Inductor's autotuning): each binary then runs on its own record, and outputs need not be identical
        (the candidate's equivalence to its own original is the gate's business); by default both run on
        `launches[0]`. `declared_tolerance`: the tolerance the candidate's passes declare (`Candidate.tolerance`,
        which its gate judged it under): different bytes on the same replay are then expected, not a suspicion
        (a `num-warps` rewrite of a reduction sums in another order)."""
        budget = budget or Budget()
        if built.status != "changed":
            return Measurement("skipped", f"nothing to time: the build is {built.status}")
        memo = (original, built.binary_digest or "", tuple(str(Path(p).resolve()) for p in launches),
                tuple(str(Path(p).resolve()) for p in original_launches))
        result = self._timings.get(memo)
        if result is None:
            result = self._measure(original, built, launches, budget, original_launches)
            if result.status == "timed":
                self._timings[memo] = result
        if declared_tolerance and result.status == "timed":  # per call: the memo is the binary's, not the pipeline's
            detail = {**result.detail, "declared_tolerance": declared_tolerance}
            result = replace(result, detail=detail, suspicious=tuple(suspicious_reasons(detail)))
        return result

    def _measure(self, original: str, built: BuildResult, launches: Sequence[str | Path], budget: Budget,
                 original_launches: Sequence[str | Path] = ()) -> Measurement:
        base = self.base(original)
        if base.kind == "task":
            return self._measure_task(base, self.built_entry(built), budget)
        if not launches:
            return Measurement("skipped", "no launch record of this kernel (kstrata record, then --launches)")
        reason = measurement_unavailable(built.target)
        if reason is not None:
            return Measurement("skipped", reason)
        launch = str(Path(launches[0]).resolve())
        payload = {"original": base.path, "candidate": self.built_entry(built), "launch": launch,
                   "rounds": budget.rounds, "runs": budget.runs, "best_us": budget.best_us, "margin": budget.margin,
                   "original_launch": str(Path(original_launches[0]).resolve()) if original_launches else None}
        run = self.pool.run("kstrata.agents.engine:measure_kernel_job", payload, timeout=budget.timeout_s,
                            kind="gpu", env=tool_env(launch))
        with self._lock:
            self.stats.measured += 1
        if not run.ok:
            return Measurement("failed", f"the timing process {run.error if run.status == 'error' else run.reason()}")
        timing = dict(run.value)
        return Measurement("timed", "", timing["time_before_us"], timing["time_after_us"], timing["speedup"],
                           timing, tuple(suspicious_reasons(timing)))

    def _measure_task(self, base: BaseRef, model_new: str, budget: Budget) -> Measurement:
        from kstrata.agents.evaluate import evaluate

        try:
            import torch

            if not torch.cuda.is_available():
                return Measurement("skipped", "no CUDA GPU: task timing runs on the GPU")
        except ImportError:
            return Measurement("skipped", "torch is not installed")
        v = self.pool.on_gpu(lambda: evaluate(base.path, model_new, device="cuda", timing=True,
                                              runs=budget.runs * budget.rounds, timeout_s=budget.timeout_s))
        with self._lock:
            self.stats.measured += 1
        return _task_measurement(v.to_json())


def _task_result(v: Any, policy: str) -> CheckResult:
    """The evaluator's verdict `v` as a check: accepted is equivalent, a wrong result different, else error."""
    evidence = tuple(Evidence(f"trial {t.index} ({t.distribution})", "task", "pass" if t.passes(policy) else "fail",
                              "") for t in v.trials)
    if v.accepted:
        return CheckResult(Verdict.EQUIVALENT, v.reason, evidence)
    if v.failure in ("mismatch", "shape", "integrity", "flagged"):
        return CheckResult(Verdict.DIFFERENT, v.reason, evidence)
    return CheckResult(Verdict.ERROR, v.reason, evidence)


def _task_measurement(v: Mapping[str, Any]) -> Measurement:
    """The evaluator's timings of a task candidate (its verdict's JSON, `EvalVerdict.to_json()`) as a measurement."""
    ref, cand = v.get("reference_timing"), v.get("candidate_timing")
    if not ref or not cand:
        return Measurement("failed", str(v.get("reason", "")))
    return Measurement("timed", "" if v.get("accepted") else str(v.get("reason", "")), ref["median_us"],
                       cand["median_us"], v.get("speedup"),
                       {"device": v.get("device", ""), "versions": v.get("versions", {}), "reference": ref,
                        "candidate": cand, "accepted": bool(v.get("accepted"))}, tuple(v.get("flags") or ()))


def _verdict_of(evidence: list[Evidence]) -> CheckResult:
    failed = [e for e in evidence if e.verdict == "fail"]
    if failed:
        f = failed[0]
        return CheckResult(Verdict.DIFFERENT, f"{f.name} at {f.level}: {f.detail}", tuple(evidence))
    dynamic = [e for e in evidence if e.verdict == "pass" and e.name.startswith(("interpreter", "gpu", "symbolic"))]
    if dynamic:
        return CheckResult(Verdict.EQUIVALENT, f"{len(dynamic)} dynamic checks equivalent", tuple(evidence))
    return CheckResult(Verdict.UNPROVEN, "static checks only (no dynamic evidence: give a launch record)",
                       tuple(evidence))


# ---------------------------------------------------------------------------------------------------
# What runs in the worker processes
# ---------------------------------------------------------------------------------------------------
def resources(bundle: Any) -> dict[str, Any]:
    from kstrata.backends.resources import resource_usage

    usage = resource_usage(bundle).to_json()
    keep = ("registers", "sgprs", "agprs", "shared_bytes", "local_bytes", "stack_bytes", "vgpr_spills", "sgpr_spills")
    out = {k: usage[k] for k in keep if usage.get(k) is not None}
    out["triton_shared"] = bundle.shared
    out["num_warps"] = bundle.num_warps
    return out


def static_checks(before: Any, after: Any) -> dict[str, Any]:
    """What must not change for a launcher, checked; raises `KstrataError` on a violation."""
    checks: dict[str, Any] = {}
    if before.signature != after.signature:
        raise KstrataError(f"kernel {before.name}: the signature changed {before.signature} -> {after.signature}")
    checks["signature"] = "unchanged"
    from kstrata.backends import checks as shared

    if before.target.backend == "cuda":
        # option passes may change the block size on purpose: launch bounds are reported, not refused
        changed = shared.ptx_entry_changes(before.text("ptx"), after.text("ptx"), launch_bounds=False)
        if changed:
            raise KstrataError(f"kernel {before.name}: the PTX entry changed: {'; '.join(changed)}")
        checks["ptx_entry"] = "name and parameters unchanged"
        bounds = shared.ptx_entry_changes(before.text("ptx"), after.text("ptx"))
        checks["block_threads"] = "; ".join(bounds) or "unchanged"
    else:
        abi, other = shared.amd_metadata_changes(shared.binary(before.level("hsaco")),
                                                 shared.binary(after.level("hsaco")), workgroup=False)
        if abi:
            raise KstrataError(f"kernel {before.name}: the code object's ABI changed: {'; '.join(abi)}")
        checks["code_object_abi"] = "kernarg layout and wave size unchanged"
        checks["resource_changes"] = other
    return checks


def _load_one(path: str, override_key: str | None = None) -> Any:
    from kstrata.ir.triton_layout import load_any

    bundles, errors = load_any(path)
    if errors:
        raise errors[0]
    bundle = bundles[0]
    bundle.override_key = bundle.override_key or override_key
    return bundle


def _binary(bundle: Any) -> bytes:
    from kstrata.backends.checks import binary

    return binary(bundle.level("cubin" if bundle.target.backend == "cuda" else "hsaco"))


def build_kernel_job(p: dict[str, Any]) -> dict[str, Any]:
    """Worker: apply the edit to the base kernel, rebuild, run the static checks, write the entry."""
    from kstrata.ir.candidate import changed_metadata
    from kstrata.ir.triton_layout import write_cache_entry
    from kstrata.passes.pipeline import PassFailure, parse_pipeline, run_pipeline

    start = time.perf_counter()
    bundle = _load_one(p["base"], p.get("override_key"))
    if ("cubin" if bundle.target.backend == "cuda" else "hsaco") not in bundle.levels:
        # a kernel caught mid-compile (`add_stage_kernel`): its lower levels are Triton's own stages from its
        # lowest level, so the original is complete (and byte-identical to Triton's) before the edit
        from kstrata.backends.rebuild import rebuild_from

        bundle = rebuild_from(bundle, [lv for lv in bundle.target.levels if lv in bundle.levels][-1])
    edit = edit_from_json(p["edit"])
    out: dict[str, Any] = {"kind": "kernel", "name": bundle.name, "target": str(bundle.target)}
    new = bundle
    first_changed: str | None = None
    try:
        if isinstance(edit, PipelineEdit):
            result = run_pipeline(bundle, parse_pipeline(edit.spec), p.get("repro_dir"))
            out["passes"] = [r.__dict__ for r in result.records]
            new, first_changed = result.bundle, result.first_changed
        elif isinstance(edit, OptionsEdit):
            from kstrata.backends.rebuild import rebuild_from

            new = rebuild_from(bundle, "ttir", None, option_overrides=dict(edit.overrides))
            first_changed = "ttgir" if new.levels != bundle.levels else None
        elif isinstance(edit, AsmPatchEdit):
            from kstrata.backends.asm import patch_bundle
            from kstrata.backends.patch import AsmPatch

            new = patch_bundle(bundle, AsmPatch.from_text(edit.text)).bundle
            first_changed = p["level"] if new.levels != bundle.levels else None
        elif isinstance(edit, IrTextEdit):
            from kstrata.backends.rebuild import rebuild_from

            level = p["level"]
            if level not in bundle.levels:
                return {**out, "status": "failed", "error": f"the kernel has no {level} level to replace",
                        "seconds": time.perf_counter() - start}
            if edit.text == bundle.levels[level]:
                first_changed = None
            else:
                try:
                    new = rebuild_from(bundle, level, edit.text)
                except KstrataError as exc:
                    return {**out, "status": "failed", "error": f"the new {level} does not rebuild: {exc}",
                            "seconds": time.perf_counter() - start}
                first_changed = level
        elif isinstance(edit, TritonSourceEdit):
            from kstrata.backends.triton_source import compile_source

            # the source's file is named by its content, so one source compiles to one binary (line tables
            # name the file) and two candidates with the same source are deduplicated by binary digest
            where = Path(p["sources"]) / _digest(f"{edit.source}\0{bundle.name}")[:24]
            try:
                new = compile_source(bundle, edit.source, dict(edit.constexprs), where)
            except KstrataError as exc:
                return {**out, "status": "failed", "error": str(exc), "seconds": time.perf_counter() - start}
            first_changed = next((lv for lv in bundle.target.levels[1:] if lv in bundle.levels
                                  and bundle.levels[lv] != new.levels.get(lv)), None)
    except PassFailure as exc:
        return {**out, "status": "failed", "error": str(exc), "repro": exc.repro,
                "passes": [exc.record.__dict__], "seconds": time.perf_counter() - start}
    out["resources_before"] = resources(bundle)
    if first_changed is None:
        return {**out, "status": "unchanged", "seconds": time.perf_counter() - start}
    try:
        out["static_checks"] = static_checks(bundle, new)
    except KstrataError as exc:
        return {**out, "status": "failed", "first_changed": first_changed, "error": str(exc),
                "seconds": time.perf_counter() - start}
    out["resources_after"] = resources(new)
    out["metadata_changes"] = changed_metadata(bundle.metadata, new.metadata)
    shutil.rmtree(p["out"], ignore_errors=True)
    entry = write_cache_entry(new, p["out"], overwrite=True)
    binary = _binary(new)
    return {**out, "status": "changed", "first_changed": first_changed, "entry": str(entry),
            "binary_digest": _digest(binary), "same_binary_as_base": binary == _binary(bundle),
            "seconds": time.perf_counter() - start}


def check_kernel_job(p: dict[str, Any]) -> dict[str, Any]:
    """Worker: `kstrata verify` of the candidate against the original on one launch record: its verdict,
    why it is not proven (when it is not) and every check."""
    from kstrata.backends.verify import verify
    from kstrata.ir.launch import LaunchRecord

    original = _load_one(p["original"], p.get("override_key"))
    candidate = _load_one(p["candidate"])
    report = verify(original, candidate, LaunchRecord.load(p["launch"]), seeds=p["seeds"], device=p["device"],
                    tolerance=p["tolerance"], launch_dir=Path(p["launch"]).parent, edited=p.get("edited"),
                    sanitizer=p.get("sanitizer", "auto"), timeout=p.get("run_timeout", 120.0),
                    static_only=bool(p.get("static_only")), interpreter=bool(p.get("interpreter", True)))
    return {"verdict": report.verdict.value, "reasons": report.unproven_reasons(),
            "checks": [{"name": c.name, "level": c.level, "verdict": c.verdict, "detail": c.detail}
                       for c in report.checks]}


def symbolic_check_job(p: dict[str, Any]) -> dict[str, Any]:
    """Worker: the symbolic checks (backends/verify_symbolic.py) of the TTIR/TTGIR levels that differ."""
    from kstrata.backends.verify_symbolic import symbolic_checks

    original = _load_one(p["original"], p.get("override_key"))
    candidate = _load_one(p["candidate"])
    return {"checks": [{"name": c.name, "level": c.level, "verdict": c.verdict, "detail": c.detail}
                       for c in symbolic_checks(original, candidate, p.get("tolerance"))]}


def measure_kernel_job(p: dict[str, Any]) -> dict[str, Any]:
    """Worker (on one GPU): both binaries on identical replays of the launch record (or, with
    `original_launch`, the original on its own record: another config of the kernel), outputs compared byte
    for byte, then interleaved A/B rounds (`backends/timing.py`)."""
    import torch

    from kstrata.backends.launch import LoadedKernel
    from kstrata.backends.replay import compare_outputs, replay_args
    from kstrata.backends.timing import device_and_versions, interleaved_ab
    from kstrata.ir.launch import LaunchRecord, TensorArg

    record = LaunchRecord.load(p["launch"])
    records = (LaunchRecord.load(p["original_launch"]) if p.get("original_launch") else record, record)
    kernels = []
    for entry, rec in zip((p["original"], p["candidate"]), records, strict=True):
        bundle = _load_one(entry)
        rec.check_against(bundle.params)
        kernels.append(LoadedKernel(bundle))
    outputs = []
    replays = []
    for kernel, rec in zip(kernels, records, strict=True):
        args = replay_args(rec, "cuda", 0)  # identical contents for both: the same seed (and the same arguments)
        kernel.call_by_name(rec.grid, args)
        torch.cuda.synchronize()
        outputs.append({a.name: args[a.name].clone() for a in rec.args if isinstance(a, TensorArg) and a.written})
        replays.append(args)
    # another config's record may mark other tensors written (poisoned): compare what both wrote
    written = [n for n in outputs[0] if n in outputs[1]]
    first = compare_outputs(outputs[0], outputs[1], written)  # bytes; any NaN matches any NaN
    difference: dict[str, float] = {}
    for n in written:  # how far apart, when not bit-identical (floating outputs)
        a, b = outputs[0][n], outputs[1][n]
        if a.dtype.is_floating_point and not torch.equal(a, b):
            x, y = a.double(), b.double()
            both = torch.isfinite(x) & torch.isfinite(y)
            err = (x - y).abs()[both]
            rel = err / y.abs()[both].clamp_min(torch.finfo(a.dtype).tiny)
            difference[n] = float(err.max()) if err.numel() else 0.0
            difference[f"{n}.rel"] = float(rel.max()) if rel.numel() else 0.0
    calls = [functools.partial(k.call_by_name, rec.grid, args)
             for k, rec, args in zip(kernels, records, replays, strict=True)]
    # the device span: one kernel on its launch record, whose host side (a Python launcher and a synchronize,
    # 18-25 us a run on the H200) is not the kernel's (backends/timing.py; testsuite/results/timer-probe-gpu-*)
    ab = interleaved_ab(calls[0], calls[1], rounds=p["rounds"], runs=p["runs"], best_us=p.get("best_us"),
                        margin=p.get("margin", 0.10), span="device")
    env = device_and_versions()
    return {**ab.to_json(), "outputs_equal": first is None, "first_difference": first, "max_difference": difference,
            "grid": list(record.grid), "record": p["launch"], **env,
            **({"original_record": p["original_launch"], "original_grid": list(records[0].grid)}
               if p.get("original_launch") else {}),
            "write_bound_us": output_write_bound_us(record, env.get("device", ""))}


# ---------------------------------------------------------------------------------------------------
# Measurement guards and environment
# ---------------------------------------------------------------------------------------------------
def output_write_bound_us(record: Any, device_name: str) -> float | None:
    """A lower bound on the kernel's time: writing its outputs once at the device's peak bandwidth."""
    from kstrata.agents.roofline import datasheet_bandwidth
    from kstrata.ir.launch import TensorArg

    bandwidth = datasheet_bandwidth(device_name)
    written = sum(arg.nbytes for arg in record.args if isinstance(arg, TensorArg) and arg.written)
    return written / bandwidth * 1e6 if written else None


def suspicious_reasons(timing: Mapping[str, Any]) -> list[str]:
    """What makes a timing result doubtful until explained."""
    reasons = []
    speedup = timing.get("speedup")
    if speedup and (speedup > SUSPICIOUS_FACTOR or speedup < 1 / SUSPICIOUS_FACTOR):
        reasons.append(f"speedup {speedup:.2f}x is beyond {SUSPICIOUS_FACTOR:g}x either way")
    bound = timing.get("write_bound_us")
    for which in ("time_before_us", "time_after_us"):
        t = timing.get(which)
        if bound and t is not None and t < bound:
            reasons.append(f"{which} {t:.2f} us is below the time to write the outputs once at peak bandwidth "
                           f"({bound:.2f} us)")
    if timing.get("outputs_equal") is False and not timing.get("declared_tolerance") and \
            not timing.get("original_record"):  # another config of the kernel may sum in another order
        reasons.append("the rewritten binary wrote different bytes than the original on the same replay, and "
                       "no pass of the pipeline declares a tolerance")
    return reasons


def measurement_unavailable(target: str) -> str | None:
    """Why kernels of `target` cannot be timed on this machine, or None when they can."""
    try:
        import torch
    except ImportError:
        return "torch is not installed, and timing launches binaries through it"
    if not target.startswith("cuda"):
        return f"timing {target} binaries needs an AMD GPU; only NVIDIA GPUs are supported for timing so far"
    if torch.version.hip is not None or not torch.cuda.is_available():
        return (f"no NVIDIA GPU is visible to torch (torch {torch.__version__}, torch.cuda.is_available() is "
                f"{torch.cuda.is_available()}); timing runs the original and rewritten binaries on the GPU")
    return None


def tool_env(record_path: str | Path | None) -> dict[str, str] | None:
    """The environment a kernel's worker processes need to rebuild it as the recorded program built it.

    A program under Inductor compiles with torch's own ptxas (Inductor sets `TRITON_PTXAS_PATH`), whose
    PTX ISA version the ptxas Triton bundles may not know; rebuilding that PTX then fails. `kstrata record`
    keeps the variable in the record's `extra`, and it is passed on here unless this process sets its own.
    """
    from kstrata.ir.launch import LaunchRecord

    if record_path is None or os.environ.get("TRITON_PTXAS_PATH"):
        return None
    ptxas = LaunchRecord.load(record_path).extra.get("TRITON_PTXAS_PATH")
    if not ptxas or not Path(ptxas).is_file():
        return None
    return {**os.environ, "TRITON_PTXAS_PATH": str(ptxas)}
