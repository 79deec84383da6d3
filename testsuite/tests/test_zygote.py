"""Workers forked from a zygote (backends/zygote.py) start as `python -m MODULE` would, end as it would,
and anything the zygote cannot serve starts the plain way."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kstrata.backends import child, zygote

PROBE = "kstrata.testsuite.zygote_probe"


@pytest.fixture
def probe_env(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> Iterator[dict[str, str]]:
    """An environment of the test's own (a `TORCH*` variable nothing reads, so its own zygote), the probe
    forkable, and the test's zygote closed after it."""
    monkeypatch.setenv("KSTRATA_ZYGOTE", "1")
    monkeypatch.setattr(zygote, "MODULES", zygote.MODULES | {PROBE})
    monkeypatch.setattr(zygote, "_MAX_ZYGOTES", 1000)
    env = {**os.environ, "TORCH_KSTRATA_ZYGOTE_TEST": request.node.name}
    yield env
    key = zygote.env_key(env)
    with zygote._lock:
        z = zygote._zygotes.pop(key, None)
        zygote._requests.pop(key, None)
    if z is not None:
        z.close()


def _start(tmp: Path, spec: dict[str, Any], env: dict[str, str], **kw: Any) -> tuple[Any, Path]:
    report = tmp / f"report-{time.monotonic_ns()}.json"
    out = (tmp / "out").open("wb")
    err = (tmp / "err").open("wb")
    try:
        proc = child.spawn([sys.executable, "-m", PROBE, json.dumps({"report": str(report), **spec})], stdout=out,
                           stderr=err, env=env, **kw)
    finally:
        out.close()
        err.close()
    return proc, report


def _warm(tmp: Path, env: dict[str, str]) -> None:
    """Two requests start the environment's zygote; wait until it serves."""
    for _ in range(2):
        proc, _ = _start(tmp, {}, env)
        assert proc.wait(60) == 0
    z = zygote._zygotes[zygote.env_key(env)]
    deadline = time.monotonic() + 90
    while not z.ready():
        assert not z.dead and time.monotonic() < deadline, (z.log.read_text() if z.log.exists() else "")
        time.sleep(0.05)


def test_a_forked_worker_starts_and_ends_like_python_dash_m(tmp_path: Path, probe_env: dict[str, str]) -> None:
    work = tmp_path / "work"
    work.mkdir()
    spec = {"exit": 3, "out": "to stdout", "err": "to stderr", "env": ["FOO", "TORCH_KSTRATA_ZYGOTE_TEST"]}
    env = {**probe_env, "FOO": "bar"}
    plain, plain_report = _start(tmp_path, spec, env, cwd=work)  # the first request: the plain way
    assert isinstance(plain, subprocess.Popen) and plain.wait(60) == 3
    _warm(tmp_path, env)
    forked, forked_report = _start(tmp_path, spec, env, cwd=work)
    assert isinstance(forked, zygote.ZygoteChild)
    assert forked.wait(60) == 3 and forked.returncode == 3 and forked.poll() == 3
    assert (tmp_path / "out").read_text() == "to stdout\n" and (tmp_path / "err").read_text() == "to stderr\n"
    a, b = json.loads(plain_report.read_text()), json.loads(forked_report.read_text())
    assert (a["preloaded"], b["preloaded"]) == (False, True)  # torch was there before the module ran
    assert b["sid"] == b["pid"] == forked.pid  # its own session: kill_tree's killpg finds it
    for k in ("cwd", "path0", "main", "env", "stdin"):
        assert a[k] == b[k], k
    assert a["argv"][0] == b["argv"][0] and json.loads(b["argv"][1])["exit"] == 3
    assert b["cwd"] == str(work) and b["env"]["FOO"] == "bar"


def test_signals_pipes_timeouts_and_kill_tree(tmp_path: Path, probe_env: dict[str, str]) -> None:
    _warm(tmp_path, probe_env)
    proc, _ = _start(tmp_path, {"signal": "SIGABRT"}, probe_env)
    assert isinstance(proc, zygote.ZygoteChild) and proc.wait(60) == -signal.SIGABRT

    proc, report = _start(tmp_path, {"read": 2}, probe_env, stdin=subprocess.PIPE)
    assert isinstance(proc, zygote.ZygoteChild) and proc.stdin is not None
    proc.stdin.write(b"go\n")
    proc.stdin.flush()
    proc.stdin.write(b"again\n")
    proc.stdin.close()
    assert proc.wait(60) == 0 and json.loads(report.read_text())["stdin"] == ["go", "again"]

    proc, report = _start(tmp_path, {"grandchild": True, "sleep": 600}, probe_env)
    assert isinstance(proc, zygote.ZygoteChild)
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(timeout=0.3)
    deadline = time.monotonic() + 60
    while not report.exists():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    grandchild = json.loads(report.read_text())["grandchild"]
    child.kill_tree(proc)
    assert proc.returncode == -signal.SIGKILL
    for _ in range(100):
        if not zygote._alive(grandchild):
            break
        time.sleep(0.05)
    else:
        os.kill(grandchild, signal.SIGKILL)
        raise AssertionError("kill_tree left the worker's own child running")


def test_what_a_zygote_cannot_serve_starts_the_plain_way(tmp_path: Path, probe_env: dict[str, str]) -> None:
    _warm(tmp_path, probe_env)
    other = {**probe_env, "OMP_NUM_THREADS": "3"}  # read when OpenMP loads: not this zygote's to serve
    proc, _ = _start(tmp_path, {}, other)
    assert isinstance(proc, subprocess.Popen) and proc.wait(60) == 0
    with (tmp_path / "o").open("wb") as out:  # not a forkable module
        proc = child.spawn([sys.executable, "-c", "pass"], stdout=out, stderr=subprocess.STDOUT, env=probe_env)
    assert isinstance(proc, subprocess.Popen) and proc.wait(60) == 0
    # a sandboxed worker (generated code): its guard installs itself at start-up, in a fresh process
    proc, _ = _start(tmp_path, {}, {**probe_env, "KSTRATA_SANDBOX": "pending"})
    assert isinstance(proc, subprocess.Popen) and proc.wait(60) == 0
    os.environ["KSTRATA_ZYGOTE"] = "0"  # turned off (monkeypatch restores it)
    proc, _ = _start(tmp_path, {}, probe_env)
    assert isinstance(proc, subprocess.Popen) and proc.wait(60) == 0
    zygote._requests.pop(zygote.env_key(other), None)


def test_a_killed_zygote_never_reports_success(tmp_path: Path, probe_env: dict[str, str]) -> None:
    _warm(tmp_path, probe_env)
    proc, _ = _start(tmp_path, {"sleep": 0.5}, probe_env)
    assert isinstance(proc, zygote.ZygoteChild)
    zygote._zygotes[zygote.env_key(probe_env)].proc.kill()
    assert proc.wait(60) == -signal.SIGKILL  # it exited 0 under another parent: that status is lost
    again, _ = _start(tmp_path, {}, probe_env)
    assert isinstance(again, subprocess.Popen) and again.wait(60) == 0


def test_the_zygote_ends_with_the_process_that_started_it(tmp_path: Path) -> None:
    script = f"""
import json, os, sys, time
sys.path.insert(0, {str(Path(__file__).parent)!r})
os.environ["KSTRATA_ZYGOTE"] = "1"
from kstrata.backends import zygote
import test_zygote as t
zygote.MODULES = zygote.MODULES | {{t.PROBE}}
from pathlib import Path
t._warm(Path({str(tmp_path)!r}), dict(os.environ))
print(zygote._zygotes[zygote.env_key(os.environ)].proc.pid, flush=True)
time.sleep(600)
"""
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "TORCH_KSTRATA_ZYGOTE_TEST": "parent"})
    assert parent.stdout is not None
    line = parent.stdout.readline()
    assert line.strip().isdigit(), line
    pid = int(line)
    parent.kill()
    parent.wait()
    parent.stdout.close()
    for _ in range(100):
        if not zygote._alive(pid):
            return
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    raise AssertionError("the zygote outlived the process that started it")
