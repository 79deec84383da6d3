"""The reference's untimed trials and the task's description are reused only when nothing they depend on
changed (kstrata.agents.reference_cache), and a damaged or refused entry is never a reference."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kstrata.agents import reference_cache
from kstrata.agents.evaluate import evaluate

TASK = '''import torch
import rc_helper
with open({marker!r}, "a") as _f:
    _f.write("import\\n")

class Model(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x) * rc_helper.SCALE

def get_inputs():
    return [torch.randn(8, 16)]

def get_init_inputs():
    return []
'''

CANDIDATE = '''import torch
import rc_helper

class ModelNew(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x) * rc_helper.SCALE
'''


@pytest.fixture()
def task(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path, Path, Path]:
    helper_dir = tmp_path / "helpers"
    helper_dir.mkdir()
    (helper_dir / "rc_helper.py").write_text("SCALE = 2.0\n")
    monkeypatch.setenv("PYTHONPATH", str(helper_dir))
    monkeypatch.setenv("KSTRATA_REFERENCE_CACHE", str(tmp_path / "refcache"))
    marker = tmp_path / "imports.txt"
    task = tmp_path / "task.py"
    task.write_text(TASK.format(marker=str(marker)))
    cand = tmp_path / "cand.py"
    cand.write_text(CANDIDATE)
    return task, cand, marker, helper_dir


def _imports(marker: Path) -> int:
    return len(marker.read_text().splitlines()) if marker.exists() else 0


def _eval(task: Path, cand: Path) -> object:
    return evaluate(task, cand, device="cpu", trials=5, timeout_s=120)


def test_a_second_evaluation_reuses_the_reference_and_the_description(task: tuple[Path, Path, Path, Path]) -> None:
    t, cand, marker, helper_dir = task
    v1 = _eval(t, cand)
    assert v1.accepted and v1.reference_source == "run", v1.reason  # type: ignore[attr-defined]
    first = _imports(marker)
    assert first == 3  # the description, the reference and the candidate each imported the task
    v2 = _eval(t, cand)
    assert v2.accepted and v2.reference_source.startswith("cache "), v2.reason  # type: ignore[attr-defined]
    assert _imports(marker) == first + 1  # only the candidate ran the task's code again
    assert [tr.to_json() for tr in v1.trials] == [tr.to_json() for tr in v2.trials]  # type: ignore[attr-defined]
    assert v2.to_json()["reference_source"] == v2.reference_source  # type: ignore[attr-defined]

    # a helper module the task imports changed: both are computed again, and the new truth is used
    (helper_dir / "rc_helper.py").write_text("SCALE = 3.0\n")
    v3 = _eval(t, cand)
    assert v3.reference_source == "run" and _imports(marker) == first + 4  # type: ignore[attr-defined]
    assert v3.accepted  # type: ignore[attr-defined]
    # the kept reference is now the new one: a candidate still computing the old answer is rejected
    cand.write_text(CANDIDATE.replace("* rc_helper.SCALE", "* 2.0"))
    v4 = _eval(t, cand)
    assert v4.reference_source.startswith("cache ") and not v4.accepted, v4.reason  # type: ignore[attr-defined]


def test_other_seeds_trials_policies_task_bytes_and_environments_are_other_keys(
        task: tuple[Path, Path, Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    t, _, _, _ = task
    base = {"device": "cpu", "trials": 5, "seed": 42, "policy": "strict", "env": None}

    def key(**kw: object) -> str:
        k = reference_cache.reference_key(t, **{**base, **kw})  # type: ignore[arg-type]
        assert k is not None
        return k.digest

    first = key()
    assert key() == first
    others = {key(trials=6), key(seed=7), key(policy="kernelbench"), key(env={"OMP_NUM_THREADS": "1"})}
    assert first not in others and len(others) == 4
    # a cache or scratch location is not part of what the reference computes
    assert key(env={**dict(__import__("os").environ), "TRITON_CACHE_DIR": "/elsewhere"}) == key(env=None)
    t.write_text(t.read_text() + "\n# an edit\n")
    assert key() != first


def test_a_cache_turned_off_keeps_nothing(task: tuple[Path, Path, Path, Path], tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    t, cand, marker, _ = task
    monkeypatch.setenv("KSTRATA_REFERENCE_CACHE", "off")
    assert reference_cache.cache_root() is None
    assert _eval(t, cand).reference_source == "run"  # type: ignore[attr-defined]
    assert _imports(marker) == 3 and not (tmp_path / "refcache").exists()  # nothing kept: the next one runs too


def test_a_damaged_entry_is_a_miss_and_is_removed(task: tuple[Path, Path, Path, Path], tmp_path: Path) -> None:
    t, cand, _, _ = task
    _eval(t, cand)
    entries = [e for e in (tmp_path / "refcache").iterdir() if e.is_dir() and e.name != "specs"]
    assert len(entries) == 1
    key = reference_cache.reference_key(t, device="cpu", trials=5, seed=42, policy="strict", env=None)
    assert key is not None and key.digest == entries[0].name
    assert reference_cache.lookup(key, tmp_path / "ok") is not None
    trial = entries[0] / "trial0.pt"
    trial.write_bytes(trial.read_bytes()[:-7] + b"damaged")
    assert reference_cache.lookup(key, tmp_path / "dest") is None
    assert not entries[0].exists() and not (tmp_path / "dest").exists()


def test_timed_failed_and_oversized_references_are_not_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KSTRATA_REFERENCE_CACHE", str(tmp_path / "c"))
    key = reference_cache.ReferenceKey({"schema": reference_cache.SCHEMA, "task": "x"})
    work = tmp_path / "w"
    work.mkdir()
    (work / "report.json").write_text(json.dumps({"ok": True}))
    (work / "trial0.pt").write_bytes(b"0" * 1000)
    assert not reference_cache.store(key, work, {"ok": True, "timing": {"median_us": 1.0}})
    assert not reference_cache.store(key, work, {"ok": False, "error": "boom"})
    monkeypatch.setenv("KSTRATA_REFERENCE_CACHE_MAX_BYTES", "100")
    assert not reference_cache.store(key, work, {"ok": True})
    monkeypatch.delenv("KSTRATA_REFERENCE_CACHE_MAX_BYTES")
    assert reference_cache.store(key, work, {"ok": True})
    got = reference_cache.lookup(key, tmp_path / "dest")
    assert got is not None and (tmp_path / "dest" / "trial0.pt").read_bytes() == b"0" * 1000


def test_the_least_recently_used_entries_go_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os
    import time

    monkeypatch.setenv("KSTRATA_REFERENCE_CACHE", str(tmp_path / "c"))
    work = tmp_path / "w"
    work.mkdir()
    (work / "report.json").write_text(json.dumps({"ok": True}))
    (work / "trial0.pt").write_bytes(b"1" * 4000)
    keys = [reference_cache.ReferenceKey({"n": i}) for i in range(3)]
    for i, k in enumerate(keys):
        assert reference_cache.store(k, work, {"ok": True})
        os.utime(tmp_path / "c" / k.digest, (time.time() - 100 + i, time.time() - 100 + i))
    assert reference_cache.lookup(keys[0], tmp_path / "d0") is not None  # now the most recently used
    size = reference_cache._entry_bytes(tmp_path / "c" / keys[0].digest)
    reference_cache.prune(tmp_path / "c", limit=2 * size + 10)  # room for two of the three
    left = {e.name for e in (tmp_path / "c").iterdir() if not e.name.startswith(".")}
    assert left == {keys[0].digest, keys[2].digest}


def test_a_task_that_fails_to_load_is_described_afresh_every_time(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from kstrata.agents.tasks import TaskError, describe_task

    monkeypatch.setenv("KSTRATA_REFERENCE_CACHE", str(tmp_path / "c"))
    marker = tmp_path / "m.txt"
    bad = tmp_path / "bad.py"
    bad.write_text(f"with open({str(marker)!r}, 'a') as f:\n    f.write('x\\n')\nraise RuntimeError('no')\n")
    for n in (1, 2):
        with pytest.raises(TaskError):
            describe_task(bad)
        assert len(marker.read_text().splitlines()) == n
    assert not (tmp_path / "c" / "specs").exists() or not list((tmp_path / "c" / "specs").iterdir())
