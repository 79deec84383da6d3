"""How a differential job's outcome becomes a check's verdict when the check itself fails: out of GPU memory
in its own copies, or dying while it compares (both kernels had run), is no verdict on the candidate."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import pytest
import torch

from kstrata.backends import dynamic
from kstrata.backends.dynamic import Outcome, verdict
from kstrata.backends.replay import InputSet

SEED0 = InputSet("random seed 0", "random", 0)


def test_the_check_running_out_of_memory_is_skipped_not_failed() -> None:
    got = verdict("differential", "cubin", SEED0, Outcome("harness-error", "candidate",
                  {"error": "the check ran out of GPU memory: CUDA out of memory"}), 60.0, "k")
    assert got[0] == "skipped" and "ran out of GPU memory" in got[1] and "random seed 0" in got[1]


@pytest.mark.parametrize("status", ["crashed", "timeout"])
def test_dying_while_comparing_is_skipped_while_dying_in_the_candidate_fails(status: str) -> None:
    at_compare = verdict("differential", "cubin", SEED0, Outcome(status, "compare", {"returncode": 1}, "Killed"),
                         60.0, "k")
    assert at_compare[0] == "skipped" and "comparison" in at_compare[1]
    in_candidate = verdict("differential", "cubin", SEED0, Outcome(status, "candidate", {"returncode": 1}, "Killed"),
                           60.0, "k")
    assert in_candidate[0] == "fail"


def test_a_child_reports_out_of_memory_as_its_own_error_and_goes_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """The first job's copies do not fit; the child says so as the job's result and runs the next job."""
    calls: list[int] = []

    def run_job(job: dict[str, Any], stage: Any) -> dict[str, Any]:
        calls.append(job["n"])
        stage("candidate")
        if job["n"] == 0:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 12.00 GiB.")
        return {"status": "equal", "difference": None, "exact": True}

    monkeypatch.setattr(dynamic, "_run_job", run_job)
    jobs = tmp_path / "jobs.pkl"
    jobs.write_bytes(pickle.dumps([{"n": 0}, {"n": 1}]))
    dynamic.child_main(str(jobs))
    results = [json.loads(line.split(" ", 1)[1]) for line in capsys.readouterr().out.splitlines()
               if line.startswith("RESULT ")]
    assert calls == [0, 1]
    assert results[0]["status"] == "harness-error" and "Tried to allocate 12.00 GiB" in results[0]["error"]
    assert results[1]["status"] == "equal"


def test_another_exception_in_a_job_still_kills_the_child(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only running out of memory is the check's own failure; any other exception ends the child (the parent
    judges the job from the stage it died in)."""
    def run_job(job: dict[str, Any], stage: Any) -> dict[str, Any]:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(dynamic, "_run_job", run_job)
    jobs = tmp_path / "jobs.pkl"
    jobs.write_bytes(pickle.dumps([{"n": 0}]))
    with pytest.raises(RuntimeError, match="illegal memory access"):
        dynamic.child_main(str(jobs))
