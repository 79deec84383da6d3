"""Ray workers (kstrata.agents.workers.RayWorkers) on a local cluster on this machine (Ray binds it to the
machine's address, not the loopback one, on Linux; its token authentication is on) with CPU workers and two
declared GPUs (their jobs do CPU work; Ray pins each GPU actor with CUDA_VISIBLE_DEVICES): pinning, quarantine
and retry, a Ray worker killed mid-job, and `optimize`'s CPU path over small tasks giving the same results as
the in-process run. Skipped without Ray (`pip install "kstrata[ray]"`)."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray")

from kstrata.agents.workers import RayWorkers, child_result  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "testsuite" / "optimize_tasks"
CALL = "kstrata.agents.workers:call_job"
WHERE = "kstrata.testsuite.jobs:where"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster() -> Iterator[RayWorkers]:
    workers = RayWorkers(local_cpus=2, local_gpus=2)
    yield workers
    workers.close()


class RayWorkerKiller:
    """Kills, once, a Ray worker process while it runs a task named `task` (its process title is
    `ray::<task>`), after it has run `after` seconds: a worker lost mid-job."""

    def __init__(self, task: str, after: float = 1.0) -> None:
        self.task, self.after = task, after
        self.killed: list[tuple[int, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _running(self) -> list[int]:
        pids = []
        for d in Path("/proc").iterdir():
            if not d.name.isdigit():
                continue
            try:
                cmd = (d / "cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
            except OSError:
                continue
            if cmd.startswith(f"ray::{self.task}"):
                pids.append(int(d.name))
        return pids

    def _run(self) -> None:
        seen: dict[int, float] = {}
        while not self._stop.is_set() and not self.killed:
            now = time.monotonic()
            for pid in self._running():
                seen.setdefault(pid, now)
                if now - seen[pid] >= self.after:
                    os.kill(pid, signal.SIGKILL)
                    self.killed.append((pid, time.time()))
                    break
            time.sleep(0.05)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def test_ray_gpu_actors_are_pinned_and_a_faulting_gpu_is_quarantined(cluster: RayWorkers) -> None:
    def where(affinity: str) -> Any:
        return child_result(cluster.run(CALL, {"target": WHERE, "payload": {"die_on": ["1"]}, "timeout": 60},
                                        kind="gpu", affinity=affinity))

    labels = {d.index: d.label for d in cluster.gpus}
    assert sorted(labels) == [0, 1] and labels[0].endswith("gpu0") and labels[1].endswith("gpu1")
    assert where("a").value["cuda_visible_devices"] == "0"
    for _ in range(2):  # bound to the actor on GPU 1, whose job processes die: retried on GPU 0
        r = where("b")
        assert r.ok and r.value["cuda_visible_devices"] == "0"
    assert list(cluster.scheduler.quarantined() if cluster.scheduler else {}) == [1]


def test_a_ray_worker_killed_mid_job_is_retried(cluster: RayWorkers) -> None:
    killer = RayWorkerKiller("ray_run_job", after=1.0)
    try:
        r = child_result(cluster.run(CALL, {"target": WHERE, "payload": {"sleep": 4.0, "tag": "k"}, "timeout": 60}))
    finally:
        killer.stop()
    assert killer.killed, "no Ray worker was seen running the job"
    assert r.ok and r.value["tag"] == "k"
    assert r.value["start"] > killer.killed[0][1]  # this result is the retry's, started after the kill


def test_optimize_cpu_path_on_ray_matches_the_in_process_run(cluster: RayWorkers, tmp_path: Path) -> None:
    """Two small tasks optimized at once on the Ray cluster, one Ray worker killed in the middle of a job, then
    the same in process: the same candidates, verdicts, incumbents, final verdicts and model_new.py files."""
    from kstrata.agents.optimize.compare import compare_runs, run_digest
    from kstrata.agents.optimize.search import Options, optimize

    tasks = tmp_path / "tasks"
    tasks.mkdir()
    for name in ("01_relu_small.py", "02_linear_sum_small.py"):
        (tasks / name).write_text((TINY / name).read_text())

    def options(pool: Any) -> Options:
        return Options(budget=1, device="cpu", spaces=("graph",), baselines=("eager",), ncu=False, plugins=False,
                       trials=5, timeout_s=300, progress=lambda m: None, pool=pool)

    killer = RayWorkerKiller("ray_run_job", after=2.0)
    try:
        on_ray = optimize(tasks, tmp_path / "ray", options(cluster), parallel_tasks=2)
    finally:
        killer.stop()
    assert killer.killed, "no Ray worker was seen running a job"
    local = optimize(tasks, tmp_path / "local", options(None), parallel_tasks=2)
    assert [(r.task, r.status, r.final_ok) for r in on_ray] == [(r.task, r.status, r.final_ok) for r in local]
    assert all(r.status == "done" and r.final_ok for r in on_ray)
    a, b = run_digest(tmp_path / "ray"), run_digest(tmp_path / "local")
    assert a == b
    assert compare_runs(tmp_path / "ray", tmp_path / "local")["verdicts_agree"]
    graph = [c for c in a["02_linear_sum_small"]["candidates"] if c[1] == "graph"]
    assert graph and graph[0][3] == "correct"  # the run judged a real candidate, not only the baseline


def test_bench_on_ray_gpu_actors(cluster: RayWorkers, tmp_path: Path) -> None:
    """`bench --workers ray`: each task a job on a GPU actor (CPU work here), rows as the plain run's."""
    from kstrata.agents import bench, roofline

    ceilings = roofline.Ceilings(device="Test GPU", date="2026-12-01", copy_bytes_per_s=4.0e12,
                                 matmul_flops_per_s={"float32": 50e12})
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "1_relu.py").write_text((TINY / "01_relu_small.py").read_text())
    on_ray = bench.run_bench(suite, ["eager"], tmp_path / "ray", runs=3, device="cpu", ceilings=ceilings,
                             on_progress=lambda m: None, workers=cluster)
    row = on_ray["tasks"]["1_relu.py"]["baselines"]["eager"]
    assert row["ok"] and row["correct"], row
    assert on_ray["workers"]["workers"] == "ray" and sum(g["jobs"] for g in on_ray["workers"]["gpus"]) >= 1
