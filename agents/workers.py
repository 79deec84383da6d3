"""Where the drivers' jobs run: on this machine (CPU work in the caller's threads, one GPU worker per device)
or on a Ray cluster (CPU jobs as Ray tasks, one Ray actor per GPU). The optimizer's evaluator and `bench`
go through a `Workers`; the engine's `WorkerPool` uses the same `GpuScheduler` for its GPU queues.

A **job** is a *driver*: a module-level function `fn(payload, ctx) -> dict` named "module:function", with a
JSON-able payload and result. A driver starts the real work in child processes of its own (with timeouts:
`backends/child.py`), so running it in a thread of this process and running it in a Ray worker on another
machine execute the same code and give the same result. `ctx` (`JobContext`) says where it runs: the
environment its children need (`CUDA_VISIBLE_DEVICES` of its GPU), a scratch directory on that machine,
and `timing_slot()`, the context manager a driver holds while it *times* (the GPU's exclusive slot).
Files travel by value (`FileRef`: path, digest and text); `materialize` uses the path when the same bytes
are there (a local run names the user's files in its messages) and writes a copy otherwise.

GPU scheduling (`GpuScheduler`, both backends):

- one worker per device, pinned: a local job's children get `CUDA_VISIBLE_DEVICES` of its device (the
  physical id, also under a parent's own `CUDA_VISIBLE_DEVICES`); a Ray actor holds one GPU, pinned by Ray;
- timing is serialized per GPU (`timing_slot()`, or the job's whole run with `exclusive=True`), and no other
  GPU job runs on the device while it times (`GpuUse`: checks share a GPU with each other, never with a
  measurement; in this process — other processes on the same GPU are kept from timing at once by the
  file lock, not from running beside a timing);
- `affinity`: jobs with the same affinity (the optimizer uses the task) run on the same GPU, so the benchmark
  guard re-measures a challenger on the GPU that measured it; a new affinity goes to the least busy device;
- faults: a job whose result says `device_fault` (its worker died, hit a CUDA error, or timed out on a GPU
  that then failed a health check) is retried on a healthy device it has not run on yet; when there is none
  (one GPU), its failure is returned at once: the same GPU again would only repeat it. A device whose job
  then succeeded elsewhere gets a strike; `quarantine_after` strikes in a row quarantine it (its affinities
  move). A job that faults everywhere is the job's own failure, not the devices': its result is returned and
  nobody is struck.
- timeouts: a job's child that ran past its time allowance is a device fault only when the GPU does not
  answer a health check afterwards (`probe_gpu`: a fresh process runs one small kernel there). A GPU that
  is gone shows in the job's own error (`CUDA_FAULT_MARKERS`: "no CUDA-capable device", "GPU is lost", ...),
  one that hangs only as a timeout, and the check tells that apart from a slow job on a healthy GPU: that one
  is the job's failure, and is not retried. A job whose limit is a share of a deadline rather than a hang
  guard (the optimizer's Nsight Compute budget) is not checked at all: running out of a budget says nothing
  about the GPU.

Ray (`RayWorkers`, `pip install "kstrata[ray]"`): `--workers ray` starts a local cluster on demand,
`--workers ray://HOST:PORT` joins an existing one through Ray Client. CPU jobs are tasks with `num_cpus=1`
and Ray's retries for lost workers and nodes (`max_retries`); GPU jobs go to `GpuWorker` actors
(`num_gpus=1`, restarted and their calls retried when a node is lost). The cluster's Python must have the same
kstrata installed: `connect` compares versions and refuses a mismatch.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib
import os
import tempfile
import threading
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

from kstrata.ir.errors import KstrataError

R = TypeVar("R")

#: How often a job that reported a device fault is tried in all (on different devices when there are any).
ATTEMPTS = 2
#: Strikes in a row (a job faulted here and then succeeded elsewhere) that quarantine a device.
QUARANTINE_AFTER = 2
#: Ray's retries of a task or actor call whose worker process or node died.
RAY_RETRIES = 3
RAY_HINT = 'pip install "kstrata[ray]"'
#: Text in a job's error that marks the device, not the job: a CUDA runtime or driver failure.
CUDA_FAULT_MARKERS = ("CUDA error", "CUDA-capable device", "cudaError", "CUDA driver", "uncorrectable ECC",
                      "unspecified launch failure", "an illegal memory access", "NVML", "GPU is lost")
#: The health check after a timeout (`probe_gpu`): a process start, torch's import, a CUDA context and one
#: small kernel take a few seconds on a healthy GPU; one that does not answer in this long is hung.
PROBE_TIMEOUT_S = 60.0
PROBE_JOB = "kstrata.agents.workers:cuda_probe"


class WorkersError(KstrataError):
    """The workers asked for cannot be had here (no such GPU, Ray not installed, a cluster unreachable)."""


# ---------------------------------------------------------------------------------------------------
# Devices
# ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GpuDevice:
    """One GPU worker's device: `index` as the user names it (`--gpus 0,1`), `label` for reports, and
    `env`, what its jobs' children get (`CUDA_VISIBLE_DEVICES`; empty: the process's own, unpinned)."""

    index: int
    label: str
    env: tuple[tuple[str, str], ...] = ()

    def environ(self) -> dict[str, str]:
        return dict(self.env)


def visible_gpu_count() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0


def _physical_ids(count: int) -> list[str]:
    """What `CUDA_VISIBLE_DEVICES` must say to pin a child to visible device i (the parent may be pinned)."""
    parent = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [s.strip() for s in parent.split(",") if s.strip()] if parent else []
    return ids[:count] if len(ids) >= count else [str(i) for i in range(count)]


def local_gpus(spec: str | None, available: int | None = None, *, flag: str = "--gpus") -> list[GpuDevice]:
    """The devices `--gpus SPEC` names: `all` or `0,1,...` (indices as torch sees them). `None`: one
    unpinned worker (the default device, as a run without `--gpus`)."""
    if spec is None:
        return [GpuDevice(0, "default GPU")]
    count = visible_gpu_count() if available is None else available
    text = spec.strip()
    if text == "all":
        if count == 0:
            raise WorkersError(f"{flag} all: no CUDA GPU is visible here (use --device cpu for a correctness-only run)")
        indices = list(range(count))
    else:
        try:
            indices = [int(s) for s in text.split(",")]
        except ValueError:
            raise WorkersError(f"{flag} {spec!r}: write all, or GPU indices such as 0,1") from None
        if len(set(indices)) != len(indices) or any(i < 0 for i in indices):
            raise WorkersError(f"{flag} {spec!r}: each GPU index once, none negative")
        if count == 0:
            raise WorkersError(f"{flag} {spec}: no CUDA GPU is visible here")
        bad = [i for i in indices if i >= count]
        if bad:
            have = f"{count} GPU{'s' if count != 1 else ''} ({', '.join(map(str, range(count)))})"
            raise WorkersError(f"{flag} {spec}: this machine has {have}; there is no GPU {', '.join(map(str, bad))}")
    phys = _physical_ids(count)
    return [GpuDevice(i, f"cuda:{i}", (("CUDA_VISIBLE_DEVICES", phys[i]),)) for i in indices]


# ---------------------------------------------------------------------------------------------------
# GPU scheduling: pinning, per-GPU exclusive slots, affinity, quarantine and retry
# ---------------------------------------------------------------------------------------------------
class GpuUse:
    """Who uses one GPU: any number of *sharing* jobs at once (checks, profiles: their kernels may overlap,
    nobody reads a clock) or one *timing* holder, never both. A timing waits until the sharing jobs running on
    the device have ended, and sharing jobs that arrive while a timing waits or runs wait for it (writer
    preference: a steady stream of checks cannot starve a measurement). Before it, timing was serialized
    only against timing, so another candidate's check (its trials on the GPU, its compiles on the host) could
    run beside a measurement. (On the H200, 2026-12-02, this was not the whole story: the same torch.compile
    model also drifted from 84 to 140 us between fresh processes with nothing else running, see
    testsuite/results/optimize-measurement-drift-gpu-2026-12-02.md.) A thread that holds a sharing use and asks to time (a gated job: its checks,
    then its timing) gives its share up for the timing and takes it back after; a thread that is timing
    and asks to share already has the device to itself."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._sharing = 0
        self._timing = False
        self._waiting = 0
        self._mine = threading.local()

    def _held(self) -> tuple[int, bool]:
        return getattr(self._mine, "shares", 0), getattr(self._mine, "timing", False)

    @property
    def state(self) -> tuple[int, bool, int]:
        """(sharing jobs, a timing runs, timings waiting): for tests and reports."""
        with self._cond:
            return self._sharing, self._timing, self._waiting

    @contextlib.contextmanager
    def sharing(self) -> Iterator[None]:
        shares, timing = self._held()
        if timing:
            yield
            return
        with self._cond:
            while self._timing or self._waiting:
                self._cond.wait()
            self._sharing += 1
        self._mine.shares = shares + 1
        try:
            yield
        finally:
            self._mine.shares = shares
            with self._cond:
                self._sharing -= 1
                self._cond.notify_all()

    @contextlib.contextmanager
    def timing(self) -> Iterator[None]:
        shares, timing = self._held()
        if timing:
            raise RuntimeError("GpuUse.timing: this thread is already timing on the device")
        with self._cond:
            self._sharing -= shares
            self._waiting += 1
            self._cond.notify_all()
            while self._timing or self._sharing:
                self._cond.wait()
            self._waiting -= 1
            self._timing = True
        self._mine.timing = True
        try:
            yield
        finally:
            self._mine.timing = False
            with self._cond:
                self._timing = False
                self._cond.notify_all()
                while shares and (self._timing or self._waiting):
                    self._cond.wait()
                self._sharing += shares
                self._cond.notify_all()


@dataclass
class DeviceState:
    device: GpuDevice
    busy: int = 0
    jobs: int = 0
    faults: int = 0
    strikes: int = 0
    quarantined: str = ""  # why, when it is
    use: GpuUse = field(default_factory=GpuUse)


@dataclass(frozen=True)
class Placement:
    """Where one attempt of a job ran: for reports and tests (`GpuScheduler.history`)."""

    job: str
    affinity: str | None
    device: int
    attempt: int
    fault: bool


class GpuScheduler:
    """One worker per device (see the module docstring). `run(job, ...)` calls `job(device)` (in the caller's
    thread) on the device it picks, and retries a device fault elsewhere."""

    def __init__(self, devices: Sequence[GpuDevice], *, quarantine_after: int = QUARANTINE_AFTER,
                 attempts: int = ATTEMPTS, on_event: Callable[[str], None] | None = None) -> None:
        if not devices:
            raise WorkersError("no GPU worker: give at least one device")
        self.states = {d.index: DeviceState(d) for d in devices}
        self.quarantine_after = quarantine_after
        self.attempts = attempts
        self.on_event = on_event
        self.history: list[Placement] = []
        self._affinity: dict[str, int] = {}
        self._lock = threading.Lock()

    @property
    def devices(self) -> list[GpuDevice]:
        return [s.device for s in self.states.values()]

    def healthy(self) -> list[DeviceState]:
        return [s for s in self.states.values() if not s.quarantined]

    def quarantined(self) -> dict[int, str]:
        return {i: s.quarantined for i, s in self.states.items() if s.quarantined}

    def _say(self, msg: str) -> None:
        if self.on_event is not None:
            self.on_event(msg)

    def _pick(self, affinity: str | None, avoid: set[int]) -> DeviceState | None:
        """The device of a job's next attempt (counted busy); `avoid`: the devices it faulted on. None when it
        faulted before and no healthy device is left that it has not run on."""
        with self._lock:
            pool = [s for s in self.healthy() if s.device.index not in avoid]
            if not pool:
                if avoid:
                    return None
                pool = list(self.states.values())  # every device quarantined: a first attempt still runs
            if affinity is not None:
                bound = self._affinity.get(affinity)
                if bound is not None and not self.states[bound].quarantined and bound not in avoid:
                    state = self.states[bound]
                    state.busy += 1
                    return state
            # the least busy, then the one with the fewest jobs so far, then the lowest index: deterministic
            state = min(pool, key=lambda s: (s.busy, s.jobs, s.device.index))
            if affinity is not None and not avoid:
                self._affinity[affinity] = state.device.index
            state.busy += 1
            return state

    def bind(self, affinity: str, index: int) -> None:
        """Send the jobs of `affinity` to device `index` (a caller that names its GPU) while it is healthy."""
        if index not in self.states:
            raise WorkersError(f"no GPU worker {index}; the workers have {', '.join(map(str, self.states))}")
        with self._lock:
            self._affinity.setdefault(affinity, index)

    def device_for(self, affinity: str) -> int | None:
        """The device an affinity is bound to (None before its first job)."""
        return self._affinity.get(affinity)

    @contextlib.contextmanager
    def slot(self, index: int) -> Iterator[None]:
        """The device's exclusive slot: one timing (or exclusive job) at a time on it, and no sharing job."""
        with self.states[index].use.timing():
            yield

    def run(self, job: Callable[[GpuDevice], R], *, is_fault: Callable[[R], bool], affinity: str | None = None,
            exclusive: bool = False, name: str = "job") -> R:
        tried: list[DeviceState] = []
        result: R | None = None
        state = self._pick(affinity, set())
        assert state is not None
        for attempt in range(self.attempts):
            try:
                with state.use.timing() if exclusive else state.use.sharing():
                    result = job(state.device)
            finally:
                with self._lock:
                    state.busy -= 1
                    state.jobs += 1
            fault = is_fault(result)
            with self._lock:
                self.history.append(Placement(name, affinity, state.device.index, attempt, fault))
            if not fault:
                self._succeeded(state, tried)
                return result
            with self._lock:
                state.faults += 1
            tried.append(state)
            if attempt + 1 >= self.attempts:
                self._say(f"GPU {state.device.label}: {name} faulted (attempt {attempt + 1}); giving up")
                break
            nxt = self._pick(affinity, {s.device.index for s in tried})
            if nxt is None:  # one GPU, or the others quarantined or tried: the same one again would repeat it
                self._say(f"{name} faulted on GPU {state.device.label}; no other GPU to retry on")
                break
            self._say(f"GPU {state.device.label}: {name} faulted (attempt {attempt + 1}); retrying on GPU "
                      f"{nxt.device.label}")
            state = nxt
        assert result is not None
        return result  # it faulted everywhere it ran: the job's own failure, nobody is struck

    def _succeeded(self, state: DeviceState, faulted: list[DeviceState]) -> None:
        with self._lock:
            state.strikes = 0
            for s in faulted:
                if s is state:
                    continue
                s.strikes += 1
                if s.strikes >= self.quarantine_after and not s.quarantined and len(self.healthy()) > 1:
                    s.quarantined = (f"{s.strikes} jobs in a row faulted on it and then succeeded on another GPU "
                                     f"({s.faults} faults in all)")
                    moved = [a for a, i in self._affinity.items() if i == s.device.index]
                    for a in moved:
                        del self._affinity[a]
                    self._say(f"GPU {s.device.label} quarantined: {s.quarantined}")

    def describe(self) -> list[dict[str, Any]]:
        return [{"index": s.device.index, "label": s.device.label, "jobs": s.jobs, "faults": s.faults,
                 "quarantined": s.quarantined or None} for s in self.states.values()]


# ---------------------------------------------------------------------------------------------------
# Jobs: drivers, their context, files by value
# ---------------------------------------------------------------------------------------------------
@dataclass
class JobContext:
    """Where a driver runs. `env`: what its children need on top of the process's environment (the GPU
    pinning). `workdir`: scratch space on the machine it runs on. `timing_slot()`: hold it while timing."""

    env: dict[str, str]
    workdir: Path
    device: GpuDevice | None = None
    timing_slot: Callable[[], contextlib.AbstractContextManager[None]] = contextlib.nullcontext
    #: The GPU's health check ('' when it answers, else why not); None: `probe_gpu` in this job's environment.
    probe: Callable[[], str] | None = None

    def environ(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        return {**(os.environ if base is None else base), **self.env}

    def timeout_is_fault(self) -> tuple[bool, str]:
        """Whether a child of this job that ran past its time allowance says the device is at fault, and the
        words that say so. Only a timeout on a GPU that then fails its health check is (see the module
        docstring): a slow job on a healthy GPU is the job's own failure, and a retry would repeat it."""
        if self.device is None:
            return False, ""
        why = (self.probe or (lambda: probe_gpu(self.environ())))()
        if why:
            return True, f"; GPU {self.device.label} did not answer a health check afterwards ({why[:200]})"
        return False, f"; GPU {self.device.label} answered a health check afterwards: the job's own time, not a fault"


def cuda_probe(payload: Mapping[str, Any]) -> dict[str, Any]:
    """Child job: one small kernel on this process's GPU, waited for (the health check of `probe_gpu`)."""
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("no CUDA-capable device is visible")
    x = torch.arange(1024, device="cuda", dtype=torch.float32)
    total = float((x * 2).sum().item())  # .item() waits for the kernel
    if total != 1023 * 1024:
        raise RuntimeError(f"a kernel computed {total}, not {1023 * 1024}")
    return {"device": torch.cuda.get_device_name(0)}


def probe_gpu(env: Mapping[str, str] | None, timeout: float = PROBE_TIMEOUT_S) -> str:
    """'' when the GPU of `env` (its `CUDA_VISIBLE_DEVICES`) runs a small kernel in a fresh process within
    `timeout` seconds, else why not."""
    from kstrata.backends.child import call_in_child

    run = call_in_child(PROBE_JOB, {}, timeout=timeout, env=env)
    return "" if run.ok else run.reason()


def file_ref(path: str | Path) -> dict[str, str]:
    """A file by value, for a job that may run on another machine."""
    data = Path(path).read_bytes()
    return {"path": str(Path(path).resolve()), "sha256": hashlib.sha256(data).hexdigest(),
            "text": data.decode("utf-8", errors="surrogateescape")}


def materialize(ref: Mapping[str, str], ctx: JobContext) -> Path:
    """The file of `ref` on this machine: its own path when the same bytes are there, else a copy in
    `ctx.workdir` (same base name, so messages name the same file)."""
    path = Path(ref["path"])
    with contextlib.suppress(OSError):
        if hashlib.sha256(path.read_bytes()).hexdigest() == ref["sha256"]:
            return path
    copy = ctx.workdir / "files" / ref["sha256"][:24] / path.name
    if not copy.exists():
        copy.parent.mkdir(parents=True, exist_ok=True)
        tmp = copy.with_name(f".{copy.name}.{os.getpid()}.{threading.get_ident()}")
        tmp.write_bytes(ref["text"].encode("utf-8", errors="surrogateescape"))
        tmp.replace(copy)
    return copy


def resolve(target: str) -> Callable[[dict[str, Any], JobContext], dict[str, Any]]:
    module, _, name = target.partition(":")
    fn: Callable[[dict[str, Any], JobContext], dict[str, Any]] = getattr(importlib.import_module(module), name)
    return fn


def is_device_fault(result: Mapping[str, Any]) -> bool:
    return bool(result.get("device_fault"))


def fault_in(text: str) -> bool:
    """Whether an error text is a CUDA runtime/driver failure (the device's, until a retry says otherwise)."""
    return any(m in text for m in CUDA_FAULT_MARKERS)


def call_job(p: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """Driver: `call_in_child(p["target"], p["payload"])` (backends/child.py) in a fresh process with the
    job's environment (its GPU's pinning); the `ChildResult` as JSON. The engine's GPU jobs run through it.
    A child that died or raised a CUDA error on a GPU worker is a device fault until a retry elsewhere says it
    is the job's; one that timed out is when its GPU then fails the health check (`JobContext.timeout_is_fault`)."""
    from dataclasses import asdict

    from kstrata.backends.child import call_in_child

    base = dict(p["env"]) if p.get("env") is not None else None
    env = ctx.environ(base) if (ctx.env or base is not None) else None
    run = call_in_child(p["target"], p["payload"], timeout=float(p["timeout"]), env=env)
    died = run.status in ("crashed", "failed")
    fault = ctx.device is not None and (died or (run.status == "error" and fault_in(run.error or "")))
    said = ""
    if run.status == "timeout":
        fault, said = ctx.timeout_is_fault()
    return {"ok": run.ok, "child": asdict(run), "device_fault": fault,
            "error": "" if run.ok else run.reason() + said}


CALL_JOB = "kstrata.agents.workers:call_job"


def child_result(out: Mapping[str, Any]) -> Any:
    """The `ChildResult` of a `call_job` result (or of a job that failed before it ran)."""
    from kstrata.backends.child import ChildResult

    if "child" in out:
        return ChildResult(**out["child"])
    return ChildResult("error", None, "", "", 0.0, 0.0, error=str(out.get("error", "the job failed")))


@contextlib.contextmanager
def file_lock(path: Path | None) -> Iterator[None]:
    """An exclusive lock on `path` (processes that share a GPU); none when `path` is None."""
    if path is None:
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


class Workers(Protocol):
    """What a driver of the optimizer or bench needs: run a job on a CPU worker or a GPU worker."""

    name: str

    def run(self, target: str, payload: dict[str, Any], *, kind: str = "cpu", affinity: str | None = None,
            exclusive: bool = False) -> dict[str, Any]: ...

    @property
    def gpus(self) -> list[GpuDevice]: ...

    def describe(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


def _failure(target: str, exc: BaseException, *, fault: bool) -> dict[str, Any]:
    return {"ok": False, "error": f"{target}: {type(exc).__name__}: {str(exc)[:500]}", "device_fault": fault}


class LocalWorkers:
    """Jobs on this machine: CPU jobs in the caller's thread (the drivers start processes; the callers have
    their own thread pools), GPU jobs through a `GpuScheduler` over `gpus` (injectable: tests give fake
    devices whose jobs do CPU work). `lock_path`: a file lock per device, for several processes sharing one.
    `probe(device)`: the health check after a job timed out there ('' when healthy; default `probe_gpu`)."""

    name = "local"

    def __init__(self, gpus: Sequence[GpuDevice] | None = None, *, workdir: Path | None = None,
                 lock_path: Path | None = None, quarantine_after: int = QUARANTINE_AFTER,
                 on_event: Callable[[str], None] | None = None,
                 probe: Callable[[GpuDevice], str] | None = None) -> None:
        self.scheduler = GpuScheduler(list(gpus) if gpus else local_gpus(None), quarantine_after=quarantine_after,
                                      on_event=on_event)
        self.workdir = workdir or Path(tempfile.gettempdir()) / f"kstrata-workers-{os.getpid()}"
        self.lock_path = lock_path
        self.probe = probe  # the GPU health check after a timeout; None: `probe_gpu` (tests give fake ones)

    @property
    def gpus(self) -> list[GpuDevice]:
        return self.scheduler.devices

    def _device_lock(self, index: int) -> Path | None:
        if self.lock_path is None:
            return None
        if len(self.scheduler.states) == 1:
            return self.lock_path
        return self.lock_path.with_name(f"{self.lock_path.name}.gpu{index}")

    def _slot(self, index: int) -> Callable[[], contextlib.AbstractContextManager[None]]:
        @contextlib.contextmanager
        def slot() -> Iterator[None]:
            with self.scheduler.slot(index), file_lock(self._device_lock(index)):
                yield

        return slot

    def run(self, target: str, payload: dict[str, Any], *, kind: str = "cpu", affinity: str | None = None,
            exclusive: bool = False) -> dict[str, Any]:
        fn = resolve(target)
        if kind == "cpu":
            try:
                return fn(payload, JobContext({}, self.workdir))
            except Exception as exc:  # a driver's bug is this job's failure, not the caller's exception
                return _failure(target, exc, fault=False)
        if kind != "gpu":
            raise WorkersError(f"unknown job kind {kind!r} (cpu or gpu)")

        def attempt(device: GpuDevice) -> dict[str, Any]:
            probe = self.probe
            ctx = JobContext(device.environ(), self.workdir, device,
                             contextlib.nullcontext if exclusive else self._slot(device.index),
                             (lambda: probe(device)) if probe is not None else None)
            try:
                if exclusive:
                    with file_lock(self._device_lock(device.index)):
                        return fn(payload, ctx)
                return fn(payload, ctx)
            except Exception as exc:
                return _failure(target, exc, fault=fault_in(str(exc)))

        return self.scheduler.run(attempt, is_fault=is_device_fault, affinity=affinity, exclusive=exclusive,
                                  name=target.rpartition(":")[2])

    def describe(self) -> dict[str, Any]:
        return {"workers": self.name, "gpus": self.scheduler.describe()}

    def close(self) -> None:
        pass


# ---------------------------------------------------------------------------------------------------
# Ray
# ---------------------------------------------------------------------------------------------------
def _import_ray(flag: str) -> Any:
    try:
        return importlib.import_module("ray")
    except ImportError:
        raise WorkersError(f"{flag}: Ray is not installed; {RAY_HINT}") from None


def _versions() -> dict[str, str]:
    """What must match between this process and the cluster's workers for results to be the same."""
    import importlib.metadata

    import kstrata

    out = {"kstrata": kstrata.__version__}
    for package in ("torch", "triton"):
        try:
            out[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            out[package] = "absent"
    return out


def _ray_workdir() -> Path:
    return Path(tempfile.gettempdir()) / f"kstrata-ray-{os.getpid()}"


def ray_run_job(target: str, payload: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
    """What a Ray CPU task runs (in a Ray worker process)."""
    try:
        return resolve(target)(payload, JobContext(env, _ray_workdir()))
    except Exception as exc:
        return _failure(target, exc, fault=False)


class GpuWorkerActor:
    """One GPU of the cluster (a Ray actor with `num_gpus=1`): its calls run one at a time, so timing on it
    is serialized; Ray pins it with `CUDA_VISIBLE_DEVICES`, which its jobs' children inherit."""

    def where(self) -> dict[str, Any]:
        import socket

        return {"host": socket.gethostname(), "pid": os.getpid(),
                "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES", "")}

    def run(self, target: str, payload: dict[str, Any], env: dict[str, str], index: int, label: str) -> dict[str, Any]:
        pin = {"CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", "")}
        try:
            return resolve(target)(payload, JobContext({**env, **pin}, _ray_workdir(), GpuDevice(index, label)))
        except Exception as exc:
            return _failure(target, exc, fault=fault_in(str(exc)))


class RayWorkers:
    """Jobs on a Ray cluster (see the module docstring). `address`: None starts a local cluster; an address
    (`ray://HOST:PORT`, or `auto`) joins one. `gpus`: which of the cluster's GPUs get a worker (None: all).
    `local_cpus`/`local_gpus`: the resources of a local cluster (tests declare GPUs on a CPU machine: their
    jobs do CPU work, and Ray still pins each actor with `CUDA_VISIBLE_DEVICES`)."""

    name = "ray"

    def __init__(self, address: str | None = None, *, gpus: Sequence[int] | None = None, local_cpus: int | None = None,
                 local_gpus: int | None = None, quarantine_after: int = QUARANTINE_AFTER,
                 on_event: Callable[[str], None] | None = None, flag: str | None = None) -> None:
        flag = flag or f"--workers {address or 'ray'}"
        ray = _import_ray(flag)
        self.ray = ray
        self.address = address
        self._started = False
        if not ray.is_initialized():
            # a local cluster's workers inherit this process's environment; a remote one's have their own
            kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False, "configure_logging": False}
            try:
                with warnings.catch_warnings():  # Ray Client warns before it raises: the error says it all
                    warnings.simplefilter("ignore")
                    self._init(ray, address, local_cpus, local_gpus, kwargs)
            except Exception as exc:
                raise WorkersError(f"{flag}: Ray could not start or connect: {type(exc).__name__}: "
                                   f"{str(exc).splitlines()[0][:300] if str(exc) else ''}") from None
            self._started = True
        self._task = ray.remote(ray_run_job).options(num_cpus=1, max_retries=RAY_RETRIES, retry_exceptions=False)
        remote_versions = ray.get(ray.remote(_versions).options(num_cpus=1).remote())
        if remote_versions != _versions():
            raise WorkersError(f"{flag}: the cluster runs {remote_versions}, this process {_versions()}: "
                               "install the same kstrata, torch and triton on its nodes")
        total = int(ray.cluster_resources().get("GPU", 0))
        wanted = list(range(total)) if gpus is None else list(gpus)
        bad = [g for g in wanted if g >= total]
        if bad:
            raise WorkersError(f"--gpus {','.join(map(str, wanted))}: the Ray cluster has {total} GPU"
                               f"{'s' if total != 1 else ''}")
        actor_cls = ray.remote(GpuWorkerActor).options(num_cpus=0, num_gpus=1, max_restarts=RAY_RETRIES,
                                                        max_task_retries=RAY_RETRIES)
        self._actors = {i: actor_cls.remote() for i in wanted}
        where = dict(zip(self._actors, ray.get([a.where.remote() for a in self._actors.values()]), strict=True))
        devices = [GpuDevice(i, f"{w['host']}:gpu{w['cuda_visible_devices']}") for i, w in where.items()]
        self.scheduler: GpuScheduler | None = GpuScheduler(devices, quarantine_after=quarantine_after,
                                                           on_event=on_event) if devices else None

    @staticmethod
    def _init(ray: Any, address: str | None, cpus: int | None, gpus: int | None, kwargs: dict[str, Any]) -> None:
        if address is None:
            ray.init(address="local", num_cpus=cpus, num_gpus=gpus, object_store_memory=256 * 2**20, **kwargs)
        else:
            ray.init(address=address, **kwargs)

    @property
    def gpus(self) -> list[GpuDevice]:
        return self.scheduler.devices if self.scheduler else []

    def run(self, target: str, payload: dict[str, Any], *, kind: str = "cpu", affinity: str | None = None,
            exclusive: bool = False) -> dict[str, Any]:
        env: dict[str, str] = {}
        if kind == "cpu":
            try:
                result: dict[str, Any] = self.ray.get(self._task.remote(target, payload, env))
                return result
            except Exception as exc:  # lost more often than Ray retries: the job's failure, said so
                return _failure(target, exc, fault=False) | {"error": f"{target}: the Ray task was lost "
                                                             f"{RAY_RETRIES + 1} times ({type(exc).__name__})"}
        if kind != "gpu":
            raise WorkersError(f"unknown job kind {kind!r} (cpu or gpu)")
        if self.scheduler is None:
            return {"ok": False, "error": "the Ray cluster has no GPU", "device_fault": False}

        def attempt(device: GpuDevice) -> dict[str, Any]:
            try:
                actor = self._actors[device.index]
                out: dict[str, Any] = self.ray.get(actor.run.remote(target, payload, env, device.index, device.label))
                return out
            except Exception as exc:  # the actor's node was lost beyond its restarts
                return _failure(target, exc, fault=True)

        # an actor runs one call at a time: every GPU job there is exclusive already
        return self.scheduler.run(attempt, is_fault=is_device_fault, affinity=affinity, exclusive=False,
                                  name=target.rpartition(":")[2])

    def describe(self) -> dict[str, Any]:
        return {"workers": self.name, "address": self.address or "local",
                "gpus": self.scheduler.describe() if self.scheduler else []}

    def close(self) -> None:
        for actor in getattr(self, "_actors", {}).values():
            with contextlib.suppress(Exception):
                self.ray.kill(actor)
        if self._started:
            self.ray.shutdown()


def make_workers(spec: str | None, gpus: str | None, *, on_event: Callable[[str], None] | None = None,
                 lock_path: Path | None = None, workdir: Path | None = None) -> Workers:
    """The workers `--workers SPEC --gpus GPUS` ask for: `local` (default), `ray` (a local cluster started
    on demand) or `ray://HOST:PORT`; a bad spec, a missing GPU or Ray not installed is a `WorkersError`."""
    kind = (spec or "local").strip()
    if kind == "local":
        return LocalWorkers(local_gpus(gpus), on_event=on_event, lock_path=lock_path, workdir=workdir)
    if kind == "ray" or kind.startswith("ray://"):
        _import_ray(f"--workers {kind}")
        indices: list[int] | None = None
        if gpus is not None and gpus.strip() != "all":
            try:
                indices = [int(s) for s in gpus.split(",")]
            except ValueError:
                raise WorkersError(f"--gpus {gpus!r}: write all, or GPU indices such as 0,1") from None
        return RayWorkers(None if kind == "ray" else kind, gpus=indices, on_event=on_event)
    raise WorkersError(f"--workers {spec!r}: choose local, ray, or ray://HOST:PORT")

