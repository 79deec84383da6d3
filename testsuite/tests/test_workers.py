"""Workers across GPUs (kstrata.agents.workers) on the CPU: fake devices whose GPU jobs are real child processes
doing CPU work, so the pinning, the per-GPU serialization, affinity, quarantine and retry run for real."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from kstrata.agents.workers import GpuDevice, LocalWorkers, WorkersError, child_result, local_gpus, make_workers

from .conftest import has_cuda

REPO = Path(__file__).resolve().parents[2]
WHERE = "kstrata.testsuite.jobs:where"
CALL = "kstrata.agents.workers:call_job"


def fake_gpus(n: int, broken: tuple[int, ...] = ()) -> list[GpuDevice]:
    """`n` fake devices; a broken one's processes cannot start (PYTHONHOME points nowhere): a real death."""
    return [GpuDevice(i, f"fake{i}", (("CUDA_VISIBLE_DEVICES", str(i)),) +
                      ((("PYTHONHOME", "/nonexistent"),) if i in broken else ())) for i in range(n)]


def where(workers: LocalWorkers, *, affinity: str | None = None, sleep: float = 0.0, die_on: tuple[str, ...] = (),
          exclusive: bool = True, tag: str = "", hang_on: tuple[str, ...] = (), timeout: float = 60) -> Any:
    out = workers.run(CALL, {"target": WHERE, "payload": {"sleep": sleep, "die_on": list(die_on), "tag": tag,
                                                          "hang_on": list(hang_on)},
                             "timeout": timeout}, kind="gpu", affinity=affinity, exclusive=exclusive)
    return child_result(out)


def test_gpus_spec_is_checked_against_the_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(WorkersError, match=r"^--gpus 3: this machine has 1 GPU \(0\); there is no GPU 3$"):
        local_gpus("3", available=1)
    with pytest.raises(WorkersError, match="no CUDA GPU is visible here"):
        local_gpus("all", available=0)
    with pytest.raises(WorkersError, match="each GPU index once"):
        local_gpus("0,0", available=2)
    with pytest.raises(WorkersError, match="write all, or GPU indices"):
        local_gpus("first", available=2)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert [d.environ() for d in local_gpus("all", available=2)] == [{"CUDA_VISIBLE_DEVICES": "0"},
                                                                    {"CUDA_VISIBLE_DEVICES": "1"}]
    # a parent pinned to GPUs 4 and 5: visible index 1 is physical GPU 5
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    assert [d.environ()["CUDA_VISIBLE_DEVICES"] for d in local_gpus("1", available=2)] == ["5"]
    assert local_gpus(None)[0].environ() == {}  # the plain run: one unpinned worker
    with pytest.raises(WorkersError, match="choose local, ray"):
        make_workers("slurm", None)


def test_jobs_are_pinned_serialized_per_gpu_and_kept_on_their_affinity(tmp_path: Path) -> None:
    workers = LocalWorkers(fake_gpus(2), workdir=tmp_path)
    results: list[Any] = [None] * 6

    def one(i: int) -> None:
        results[i] = where(workers, sleep=0.6, affinity=None if i < 4 else "task-a", tag=str(i))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(r.ok for r in results), [r.reason() for r in results]
    by_gpu: dict[str, list[Any]] = {}
    for r in results:
        by_gpu.setdefault(r.value["cuda_visible_devices"], []).append(r.value)
    assert sorted(by_gpu) == ["0", "1"]  # both GPUs worked
    for runs in by_gpu.values():  # exclusive jobs never overlap on one GPU
        runs.sort(key=lambda v: v["start"])
        assert all(a["end"] <= b["start"] for a, b in itertools.pairwise(runs)), runs
    placed = {p.device for p in workers.scheduler.history if p.affinity == "task-a"}
    assert len(placed) == 1 and {r.value["cuda_visible_devices"] for r in results[4:]} == {str(placed.pop())}


def test_a_faulting_gpu_is_quarantined_and_its_jobs_retried_elsewhere(tmp_path: Path) -> None:
    events: list[str] = []
    workers = LocalWorkers(fake_gpus(2), workdir=tmp_path, on_event=events.append)
    assert where(workers, affinity="a", die_on=("1",)).value["cuda_visible_devices"] == "0"
    for _ in range(2):  # "b" is bound to GPU 1, whose processes are killed: retried on GPU 0
        r = where(workers, affinity="b", die_on=("1",))
        assert r.ok and r.value["cuda_visible_devices"] == "0"
    assert list(workers.scheduler.quarantined()) == [1], workers.scheduler.describe()
    assert any("fake1 quarantined" in e for e in events)
    before = len(workers.scheduler.history)
    assert where(workers, affinity="b", die_on=("1",)).value["cuda_visible_devices"] == "0"
    assert [p.device for p in workers.scheduler.history[before:]] == [0]  # straight to the healthy GPU
    # a job that dies everywhere is its own failure: reported, nobody else quarantined
    r = where(workers, die_on=("0", "1"))
    assert not r.ok and r.status == "crashed" and list(workers.scheduler.quarantined()) == [1]


def test_a_job_failing_on_every_gpu_quarantines_none(tmp_path: Path) -> None:
    workers = LocalWorkers(fake_gpus(2), workdir=tmp_path)
    for _ in range(3):
        assert not where(workers, die_on=("0", "1")).ok
    assert workers.scheduler.quarantined() == {}
    assert all(s["faults"] == 3 for s in workers.scheduler.describe())


def test_with_one_gpu_a_faulted_job_is_not_retried_on_the_same_gpu(tmp_path: Path) -> None:
    """One GPU: a job whose worker died there has nowhere else to go; running it again on the same GPU would
    only repeat it (the H200 run's 'retrying on another GPU' that ran on the same one)."""
    events: list[str] = []
    workers = LocalWorkers(fake_gpus(1), workdir=tmp_path, on_event=events.append)
    r = where(workers, die_on=("0",))
    assert not r.ok and r.status == "crashed"
    assert [(p.device, p.attempt, p.fault) for p in workers.scheduler.history] == [(0, 0, True)]
    assert events == ["call_job faulted on GPU fake0; no other GPU to retry on"]
    assert workers.scheduler.quarantined() == {}
    # two GPUs, one quarantined: the same, a retry goes only to a healthy GPU it has not run on
    two = LocalWorkers(fake_gpus(2), workdir=tmp_path, on_event=events.append)
    two.scheduler.states[1].quarantined = "test"
    assert not where(two, die_on=("0",)).ok
    assert [p.device for p in two.scheduler.history] == [0]


def test_a_timeout_is_a_device_fault_only_when_the_gpu_fails_its_health_check(tmp_path: Path) -> None:
    """A child over its time allowance on a GPU that then answers the health check is the job's own failure
    (not retried, nobody struck); on one that does not answer (hung), a fault retried on another GPU."""
    probed: list[int] = []

    def healthy(device: GpuDevice) -> str:
        probed.append(device.index)
        return ""

    workers = LocalWorkers(fake_gpus(2), workdir=tmp_path, probe=healthy)
    slow = where(workers, hang_on=("0", "1"), timeout=0.5, affinity="t")
    assert slow.status == "timeout" and not slow.ok
    assert [(p.device, p.fault) for p in workers.scheduler.history] == [(0, False)] and probed == [0]
    out = workers.run(CALL, {"target": WHERE, "payload": {"hang_on": ["0", "1"]}, "timeout": 0.5}, kind="gpu")
    assert not out["device_fault"] and "answered a health check afterwards" in out["error"]

    hung = LocalWorkers(fake_gpus(2), workdir=tmp_path, probe=lambda d: "timed out after 60 s" if d.index == 0 else "")
    r = where(hung, hang_on=("0",), timeout=0.5, affinity="t")
    assert r.ok and r.value["cuda_visible_devices"] == "1"  # retried on the healthy GPU
    assert [(p.device, p.fault) for p in hung.scheduler.history] == [(0, True), (1, False)]
    assert hung.scheduler.states[0].strikes == 1


def test_a_profile_job_over_its_allowance_on_a_healthy_gpu_is_not_retried(tmp_path: Path) -> None:
    """The optimizer's driver (`worker_job`): the ncu profile of level1/22 timed out at 15 s on the H200's one
    GPU and ran again there (30 s lost). Its child here is a sleeper under the ncu-style argv prefix."""
    from kstrata.agents.optimize.evaluation import Evaluator

    task = REPO / "testsuite" / "optimize_tasks" / "01_relu_small.py"
    workers = LocalWorkers(fake_gpus(1), workdir=tmp_path / "work", probe=lambda d: "")
    ev = Evaluator("cpu", "strict", tmp_path / "work", timeout_s=60, workers=workers, gpu_jobs=True)
    r = ev.run_job({"cmd": "profile", "task": str(task), "candidate": str(task)}, 0.5,
                   argv_prefix=[sys.executable, "-c", "import time; time.sleep(60)"], affinity="relu")
    assert not r.ok and r.error.startswith("profile timed out after 0.5 s; GPU fake0 answered a health check")
    assert [(p.device, p.fault) for p in workers.scheduler.history] == [(0, False)]
    # Nsight Compute's timeout is the profiling share of the task's time: a budget, so no health check is
    # asked (a probe that would call the GPU hung is never consulted) and nothing is retried
    probed: list[int] = []
    budgeted = LocalWorkers(fake_gpus(2), workdir=tmp_path / "work", probe=lambda d: probed.append(d.index) or "hung")
    ev = Evaluator("cpu", "strict", tmp_path / "work", timeout_s=60, workers=budgeted, gpu_jobs=True)
    fake_ncu = tmp_path / "ncu"
    fake_ncu.write_text("#!/bin/sh\nexec sleep 60\n")
    fake_ncu.chmod(0o755)
    n = ev.ncu(task, task, str(fake_ncu), timeout_s=0.5)
    assert not n.ok and n.error == "profile timed out after 0.5 s (its time budget)", n.error
    assert [(p.device, p.fault) for p in budgeted.scheduler.history] == [(0, False)] and probed == []


@pytest.mark.slow
def test_optimizer_timing_jobs_stay_on_their_gpu_and_a_dead_gpu_is_retried(tmp_path: Path) -> None:
    """The evaluator's gated measure job (the real worker, CPU wall clock) on fake GPUs: pinned, on the task's
    GPU for every measurement, and moved off a GPU whose processes cannot start."""
    from kstrata.agents.optimize.configs import baseline_params, render
    from kstrata.agents.optimize.contract import output_layouts
    from kstrata.agents.optimize.evaluation import Evaluator
    from kstrata.agents.optimize.state import TaskInfo
    from kstrata.agents.tasks import load_task

    task_path = REPO / "testsuite" / "optimize_tasks" / "01_relu_small.py"
    task = load_task(task_path)
    info = TaskInfo(task_path, task.name, task_path.read_text(), task.spec)
    eager = render(info, baseline_params("eager"), space="baseline", proposer="baseline:eager")
    cand = tmp_path / f"{eager.key}.py"
    cand.write_text(eager.source)
    workers = LocalWorkers(fake_gpus(2, broken=(1,)), workdir=tmp_path / "work")
    ev = Evaluator("cpu", "strict", tmp_path / "work", timeout_s=120, workers=workers, gpu_jobs=True)
    job = {"cmd": "measure", "task": str(task_path), "layouts": output_layouts(info.spec), "rounds": 2, "runs": 3,
           "cpu_wall_clock": True, "candidates": {eager.key: str(cand)}}
    first = ev.run_job(job, gated=True, affinity="relu")
    second = ev.run_job(job, gated=True, affinity="relu")
    assert first.ok and second.ok, (first.error, second.error)
    assert first.data["_cuda_visible_devices"] == second.data["_cuda_visible_devices"] == "0"
    assert len(first.data["candidates"][eager.key]["rounds_us"]) == 2
    other = ev.run_job(job, gated=True, affinity="other-task")  # bound to GPU 1, which cannot start a process
    assert other.ok and other.data["_cuda_visible_devices"] == "0"
    hist = [(p.affinity, p.device, p.fault) for p in workers.scheduler.history]
    assert hist == [("relu", 0, False), ("relu", 0, False), ("other-task", 1, True), ("other-task", 0, False)]


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kstrata.tools.cli", *args], capture_output=True, text=True,
                          timeout=120, env=env)


@pytest.mark.slow
def test_cli_workers_and_gpus_errors_are_one_line(tmp_path: Path) -> None:
    task = REPO / "testsuite" / "optimize_tasks" / "01_relu_small.py"
    # Ray absent: a `ray` module that cannot be imported, first on the path
    fake = tmp_path / "noray" / "ray"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('No module named ray')\n")
    env = {**os.environ, "PYTHONPATH": f"{fake.parent}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    cases = [
        (["--workers", "ray"], env, 'Ray is not installed; pip install "kstrata[ray]"'),
        (["--workers", "slurm"], None, "choose local, ray or ray://HOST:PORT"),
        (["--gpus", "0"], None, "--device cpu runs no GPU job"),
    ]
    for extra, e, want in cases:
        p = _cli("optimize", str(task), "--out", str(tmp_path / "out"), "--device", "cpu", *extra, env=e)
        lines = p.stderr.strip().splitlines()
        assert p.returncode == 2 and len(lines) == 1 and want in lines[0], (extra, p.stdout, p.stderr)
        assert not (tmp_path / "out").exists()
    b = _cli("bench", str(task.parent), "--out", str(tmp_path / "b"), "--gpus", "3", "--json")
    lines = b.stderr.strip().splitlines()
    assert b.returncode == 2 and len(lines) == 1 and "--gpus 3" in lines[0], b.stderr


def test_engine_pool_gpu_jobs_go_through_the_scheduler(tmp_path: Path) -> None:
    """The engine's WorkerPool: GPU jobs pinned per device, a GPU whose processes cannot start quarantined, its
    jobs retried on the other; an explicit `gpu=` is honoured."""
    from kstrata.agents.engine import WorkerPool

    pool = WorkerPool(cpu_workers=1, gpus=fake_gpus(2, broken=(1,)))
    try:
        results = [pool.run(WHERE, {}, timeout=60, kind="gpu") for _ in range(4)]
        assert all(r.ok for r in results), [r.reason() for r in results]
        assert {r.value["cuda_visible_devices"] for r in results} == {"0"}
        assert list(pool.scheduler.quarantined()) == [1]
    finally:
        pool.close()
    healthy = WorkerPool(cpu_workers=1, gpus=fake_gpus(2))
    try:
        assert healthy.run(WHERE, {}, timeout=60, kind="gpu", gpu=1).value["cuda_visible_devices"] == "1"
    finally:
        healthy.close()


@pytest.mark.gpu
@pytest.mark.skipif(not has_cuda(), reason="needs an NVIDIA GPU")
def test_each_real_gpu_worker_sees_exactly_its_device(tmp_path: Path) -> None:
    workers = LocalWorkers(local_gpus("all"), workdir=tmp_path)
    seen = []
    for d in workers.gpus:
        workers.scheduler.bind(f"gpu {d.index}", d.index)
        out = child_result(workers.run(CALL, {"target": "kstrata.testsuite.jobs:cuda_device", "payload": {},
                                              "timeout": 120}, kind="gpu", affinity=f"gpu {d.index}", exclusive=True))
        assert out.ok, out.reason()
        assert out.value["count"] == 1 and out.value["cuda_visible_devices"] == d.environ()["CUDA_VISIBLE_DEVICES"]
        seen.append(out.value["uuid"])
    assert len(set(seen)) == len(seen)  # a different physical GPU each


RELU_TASK = """import torch
import torch.nn as nn
class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x) * {k}
def get_inputs():
    return [torch.randn(32, 64)]
def get_init_inputs():
    return []
"""


@pytest.mark.slow
def test_bench_spreads_tasks_over_gpus_and_retries_a_dead_gpus_tasks(tmp_path: Path) -> None:
    """`bench --gpus`: each task a job of its own on fake GPUs (CPU work), one of which cannot start a process;
    its tasks are retried on the other, and every row equals the plain sequential run's verdicts."""
    from kstrata.agents import bench, roofline

    ceilings = roofline.Ceilings(device="Test GPU", date="2026-12-01", copy_bytes_per_s=4.0e12,
                                 matmul_flops_per_s={"float32": 50e12})
    suite = tmp_path / "suite"
    suite.mkdir()
    for k in (1, 2):  # each baseline is a whole evaluation (two processes): two tasks show the spread
        (suite / f"{k}_relu.py").write_text(RELU_TASK.format(k=k))
    (suite / "4_broken.py").write_text("import torch\nclass Model(torch.nn.Module):\n    pass\n")
    workers = LocalWorkers(fake_gpus(2, broken=(1,)), workdir=tmp_path / "work")
    spread = bench.run_bench(suite, ["eager"], tmp_path / "gpus", runs=3, device="cpu", ceilings=ceilings,
                             on_progress=lambda m: None, workers=workers)
    plain = bench.run_bench(suite, ["eager"], tmp_path / "plain", runs=3, device="cpu", ceilings=ceilings,
                            on_progress=lambda m: None)

    def verdicts(r: dict[str, Any]) -> dict[str, Any]:
        return {t: {b: (v.get("ok"), v.get("correct")) for b, v in e["baselines"].items()} for t, e in r["tasks"].items()}

    assert verdicts(spread) == verdicts(plain)
    assert [verdicts(spread)[f"{k}_relu.py"]["eager"] for k in (1, 2)] == [(True, True)] * 2
    assert verdicts(spread)["4_broken.py"]["eager"][0] is False  # the task's own failure, on a healthy GPU
    placed = workers.scheduler.history
    assert {p.device for p in placed if not p.fault} == {0} and any(p.device == 1 and p.fault for p in placed)
    assert spread["workers"]["gpus"][1]["faults"] >= 1


class RecordingWorkers:
    """Workers that record what the evaluator asks and answer like the measure worker would."""

    name = "recording"

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str | None]] = []

    @property
    def gpus(self) -> list[GpuDevice]:
        return fake_gpus(2)

    def run(self, target: str, payload: dict[str, Any], *, kind: str = "cpu", affinity: str | None = None,
            exclusive: bool = False) -> dict[str, Any]:
        self.calls.append((target.rpartition(":")[2], kind, affinity))
        if target.endswith("evaluate_job"):
            return {"ok": True, "verdict": {"accepted": True, "reason": "fine", "failure": None}}
        cands = {k: {"ok": True, "rounds_us": [2.0, 2.0], "median_us": 2.0, "spread": 0.0}
                 for k in payload["candidates"]}
        return {"ok": True, "data": {"ok": True, "candidates": cands}, "error": "", "seconds": 0.1}

    def describe(self) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        pass


def test_evaluator_sends_a_tasks_timings_to_its_gpu_and_checks_anywhere(tmp_path: Path) -> None:
    from kstrata.agents.optimize.evaluation import Evaluator

    task = REPO / "testsuite" / "optimize_tasks" / "01_relu_small.py"
    cand = tmp_path / "c.py"
    cand.write_text(task.read_text())
    rec = RecordingWorkers()
    ev = Evaluator("cuda", "strict", tmp_path / "work", workers=rec)
    assert ev.check(task, cand).ok
    ev.measure(task, {"a": cand, "b": cand}, [], rounds=2)  # the judge's measurement
    ev.measure(task, {"a": cand}, [], rounds=3)  # the guard's re-measurement
    assert rec.calls == [("evaluate_job", "gpu", None), ("worker_job", "gpu", str(task)),
                         ("worker_job", "gpu", str(task))]
    cpu = RecordingWorkers()
    assert Evaluator("cpu", "strict", tmp_path / "work", workers=cpu).check(task, cand).ok
    assert cpu.calls == [("evaluate_job", "cpu", None)]


@pytest.mark.gpu
@pytest.mark.skipif(not has_cuda(), reason="needs an NVIDIA GPU")
def test_the_health_check_passes_on_a_real_gpu_and_fails_without_one() -> None:
    from kstrata.agents.workers import probe_gpu

    assert probe_gpu(None) == ""
    assert "no CUDA-capable device" in probe_gpu({**os.environ, "CUDA_VISIBLE_DEVICES": ""})


def test_gpu_use_keeps_checks_off_a_gpu_while_it_times() -> None:
    from kstrata.agents.workers import GpuUse

    use = GpuUse()
    log: list[str] = []
    check_running, release_check = threading.Event(), threading.Event()

    def check(name: str, hold: threading.Event | None = None) -> None:
        with use.sharing():
            log.append(f"{name}+")
            if hold is not None:
                check_running.set()
                hold.wait(10)
            log.append(f"{name}-")

    def timing() -> None:
        with use.timing():
            log.append("T+")
            assert use.state == (0, True, 0)
            log.append("T-")

    first = threading.Thread(target=check, args=("c1", release_check))
    first.start()
    assert check_running.wait(10)
    timer = threading.Thread(target=timing)
    timer.start()
    for _ in range(500):  # until the timing waits for c1
        if use.state[2]:
            break
        threading.Event().wait(0.01)
    late = threading.Thread(target=check, args=("c2",))
    late.start()  # arrives while a timing waits: waits for it (writer preference)
    threading.Event().wait(0.2)
    assert log == ["c1+"]
    release_check.set()
    for t in (first, timer, late):
        t.join(10)
    assert log == ["c1+", "c1-", "T+", "T-", "c2+", "c2-"], log


def test_gpu_use_a_sharing_thread_times_by_giving_up_its_share() -> None:
    from kstrata.agents.workers import GpuUse

    use = GpuUse()
    other_in, other_out = threading.Event(), threading.Event()
    seen: list[tuple[int, bool, int]] = []

    def other() -> None:
        with use.sharing():
            other_in.set()
            other_out.wait(10)

    t = threading.Thread(target=other)
    t.start()
    assert other_in.wait(10)
    with use.sharing():  # a gated job: its checks share the GPU ...
        assert use.state == (2, False, 0)
        threading.Timer(0.2, other_out.set).start()
        with use.timing():  # ... then it times: only after the other job's share ended, and with its own given up
            seen.append(use.state)
            with use.sharing():  # already has the device to itself
                seen.append(use.state)
        seen.append(use.state)  # its share back
    t.join(10)
    assert seen == [(0, True, 0), (0, True, 0), (1, False, 0)] and use.state == (0, False, 0)


def test_exclusive_jobs_never_overlap_sharing_jobs_on_their_gpu(tmp_path: Path) -> None:
    workers = LocalWorkers(fake_gpus(1), workdir=tmp_path)
    results: list[Any] = [None] * 5

    def one(i: int) -> None:
        results[i] = where(workers, sleep=0.5, exclusive=i == 2, tag=str(i))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(5)]
    for i, t in enumerate(threads):
        t.start()
        if i == 1:
            threading.Event().wait(0.3)  # two checks running when the timing arrives
    for t in threads:
        t.join()
    assert all(r.ok for r in results), [r.reason() for r in results]
    timed = results[2].value
    others = [r.value for i, r in enumerate(results) if i != 2]
    assert all(o["end"] <= timed["start"] or o["start"] >= timed["end"] for o in others), (timed, others)
    shared = sorted(others, key=lambda v: v["start"])
    assert any(a["end"] > b["start"] for a, b in itertools.pairwise(shared)), shared  # checks do overlap
