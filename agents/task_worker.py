"""The child process that imports and describes task files for `kstrata.agents.tasks.describe_tasks`.

`python -m kstrata.agents.task_worker RESULTS PATH...` describes each task file in turn and appends one
JSON line per event to RESULTS: `{"start": PATH}` before a file, then `{"spec": ...}` or `{"error": ...}`.
The parent reads RESULTS to know which file was running when this process died, hung or exited; a task
file can do anything (exit, fork, loop, crash), so nothing here is trusted to finish.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

_WARM_UP = """import torch
class Model(torch.nn.Module):
    def forward(self, x):
        return torch.softmax(x @ x.T, dim=-1).sum()
def get_inputs():
    return [torch.randn(4, 4)]
def get_init_inputs():
    return []
"""


def _emit(results: Any, event: dict[str, Any]) -> None:
    results.write(json.dumps(event) + "\n")
    results.flush()


def _die_with_parent() -> None:
    """End this process group when the process that started it goes away.

    The loader runs in a session of its own (so that a timeout kills the task's forks with it); that
    also means nothing kills it when the CLI itself is killed (a SIGKILL, a fuzzer's timeout), and a task
    that loops would run on. The kernel's parent-death signal covers this process; a watchdog thread
    covers what the task forked (and a parent that died before the signal was armed).
    """
    import signal
    import threading
    import time

    parent = os.getppid()
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG (Linux)
    except (OSError, AttributeError):
        pass

    def watch() -> None:
        while True:
            if os.getppid() != parent:
                os.killpg(0, signal.SIGKILL)
            time.sleep(0.5)

    threading.Thread(target=watch, name="kstrata-parent-watch", daemon=True).start()


def main(argv: list[str]) -> None:
    _die_with_parent()
    results_path, *paths = argv
    import tempfile
    from pathlib import Path

    from kstrata.agents.tasks import load_task
    from kstrata.ir.errors import KstrataError

    # Describing the first task pays for torch's lazy set-up (fake tensors, decomposition tables): done
    # here on a trivial task, so a task file's deadline measures the task.
    with tempfile.TemporaryDirectory() as tmp:
        warm = Path(tmp) / "warm_up_task.py"
        warm.write_text(_WARM_UP)
        load_task(warm)

    with open(results_path, "a", encoding="utf-8") as results:
        for path in paths:
            _emit(results, {"start": path})
            try:
                spec = load_task(path).spec.to_json()
            except KstrataError as exc:
                _emit(results, {"error": str(exc)})
            except BaseException as exc:  # a KeyboardInterrupt or GeneratorExit a task raised: still its error
                first = (str(exc).strip().splitlines() or [""])[0][:300]
                _emit(results, {"error": f"{path}: loading the task raised {type(exc).__name__}"
                                         + (f": {first}" if first else "")})
            else:
                from kstrata.agents.reference_cache import local_files

                # what a kept copy of the description depends on besides the task (a superset: every
                # local file imported so far in this process)
                _emit(results, {"spec": spec, "local_files": local_files(path)})
    # Threads a task left running must not keep this process (and the CLI waiting on it) alive.
    from kstrata.agents.leave import leave

    leave(0)


if __name__ == "__main__":
    main(sys.argv[1:])
