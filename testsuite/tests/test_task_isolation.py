"""Task code runs in a child process with a timeout (issue 21, item 8): whatever a task file does at import,
in `Model()`, `get_inputs()` or `forward()` — exit, crash, loop, fork, leave a thread — is that file's
error, never the CLI's exit or hang, and one such file does not abort `task list`."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kstrata.agents.tasks import TaskError, describe_task, describe_tasks

GOOD = '''import torch
from torch import nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    return [torch.randn(8, 4)]


def get_init_inputs():
    return []
'''


def _task(tmp: Path, name: str, prelude: str = "", get_inputs: str | None = None) -> Path:
    body = GOOD if get_inputs is None else GOOD.replace("    return [torch.randn(8, 4)]", get_inputs)
    p = tmp / name
    p.write_text(prelude + body)
    return p


@pytest.mark.slow  # four loader processes (each imports torch): about 30 s on 2 busy cores
def test_bad_task_files_are_their_own_errors(tmp_path: Path) -> None:
    good = _task(tmp_path, "0_good.py")
    cases = {
        _task(tmp_path, "1_os_exit.py", "import os\nos._exit(3)\n"): "exit status 3",
        _task(tmp_path, "3_segv.py", "import ctypes\nctypes.string_at(0)\n"): "SIGSEGV",
        _task(tmp_path, "4_sysexit.py", "raise SystemExit(0)\n"): "4_sysexit.py:1: importing the task raised SystemExit",
        _task(tmp_path, "5_kbint.py", "raise KeyboardInterrupt\n"): "5_kbint.py:1: importing the task raised Keyboard",
        _task(tmp_path, "6_loop.py", get_inputs="    while True:\n        pass"): "did not finish loading in 4 s",
        _task(tmp_path, "7_exit_in_fn.py", get_inputs="    raise SystemExit(5)"): "7_exit_in_fn.py:11: get_inputs() raised",
    }
    thread = _task(tmp_path, "8_thread.py", "import threading, time\nthreading.Thread(target=time.sleep, args=(600,)).start()\n")
    fork = _task(tmp_path, "9_fork.py", "import os, time\nif os.fork() == 0:\n    time.sleep(600)\n    os._exit(0)\n")
    start = time.monotonic()
    results = dict(describe_tasks([good, *cases, thread, fork], timeout_s=4))
    assert time.monotonic() - start < 120
    assert not isinstance(results[good], TaskError) and results[good].outputs[0].shape == (8, 4)
    for path, needle in cases.items():
        err = results[path]
        assert isinstance(err, TaskError) and needle in str(err) and str(path) in str(err), (path, err)
    # A thread or a forked child left behind does not hold the loader (or the caller) up.
    assert not isinstance(results[thread], TaskError) and not isinstance(results[fork], TaskError)


def test_describe_task_raises_the_files_error(tmp_path: Path) -> None:
    bad = _task(tmp_path, "t.py", "import os\nos._exit(0)\n")
    with pytest.raises(TaskError, match="ended the process"):
        describe_task(bad, timeout_s=30)


def test_cli_task_show_and_list_survive_task_code(tmp_path: Path) -> None:
    _task(tmp_path, "1_good.py")
    bad = _task(tmp_path, "2_exit.py", "raise SystemExit(0)\n")
    show = subprocess.run([sys.executable, "-m", "kstrata.tools.cli", "task", "show", str(bad)], capture_output=True,
                          text=True, timeout=120, check=False)
    assert show.returncode == 2 and "Traceback" not in show.stderr
    assert show.stderr.strip().splitlines() == [show.stderr.strip()] and f"{bad}:1" in show.stderr
    listed = subprocess.run([sys.executable, "-m", "kstrata.tools.cli", "task", "list", str(tmp_path), "--json"],
                            capture_output=True, text=True, timeout=120, check=False)
    assert listed.returncode == 1, listed.stderr
    payload = json.loads(listed.stdout)
    assert [Path(t["path"]).name for t in payload["tasks"]] == ["1_good.py"]
    assert [Path(e["path"]).name for e in payload["errors"]] == ["2_exit.py"]


def test_the_loader_dies_with_the_cli(tmp_path: Path) -> None:
    """The loader has a session of its own; when the CLI is killed (SIGKILL), a looping task must not run on."""
    import os
    import signal

    loop = _task(tmp_path, "loop.py", "import os, time\nopen('started', 'w').write(str(os.getpid()))\n"
                                      "while True:\n    time.sleep(0.01)\n")
    cli = subprocess.Popen([sys.executable, "-m", "kstrata.tools.cli", "task", "show", str(loop)], cwd=tmp_path,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    started = tmp_path / "started"
    deadline = time.monotonic() + 120
    while not started.exists() or not started.read_text():
        assert time.monotonic() < deadline and cli.poll() is None
        time.sleep(0.2)
    loader = int(started.read_text())
    cli.send_signal(signal.SIGKILL)
    cli.wait()
    for _ in range(50):
        try:
            os.kill(loader, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    os.kill(loader, signal.SIGKILL)
    raise AssertionError("the task loader outlived the CLI that started it")
