"""The one child-process protocol: run work in a fresh process with a timeout, and turn whatever happens
to it (an exit code, a signal, a hang) into a value, never an exception in the caller.

Three ways in, one mechanism underneath (`spawn`: a new session, so a timeout kills the child and
everything it started; stdin closed; output to files, so a chatty child cannot block on a full pipe):

- `run_child(argv, timeout=...)`: a command, waited for; a `ChildResult` (status, exit code or signal,
  the tail of its output, how long it ran).
- `call_in_child("module:function", payload, timeout=...)`: a Python function called in a fresh
  interpreter with a JSON payload; its JSON-able return value comes back in a `ChildResult` (`value`),
  or the exception it raised (`error`), or how the process died. The result travels in a file, not on
  stdout, so what the function prints cannot corrupt it.
- `ChildStream(argv)`: a child whose stdout is read line by line as it runs, with a deadline per line
  (`next_line`); for children that run a list of jobs and report progress (the verifier's dynamic runs,
  `bench`'s workers), so a hang is attributed to the job that was running.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol

from kstrata.backends import zygote

#: How much of a child's stdout/stderr a result keeps (the end, where the reason usually is).
TAIL_CHARS = 8000


@dataclass(frozen=True)
class ChildResult:
    """What happened to one child process.

    `status`: "ok" (exit 0; for `call_in_child`, the function returned), "error" (`call_in_child` only: the
    function raised; `error` holds the exception), "failed" (a non-zero exit code), "crashed" (killed by
    a signal), "timeout" (ran past its timeout and was killed, with everything it started)."""

    status: str
    returncode: int | None
    stdout: str
    stderr: str
    seconds: float
    timeout: float
    value: Any = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def reason(self) -> str:
        """One line saying why the child did not succeed (empty when it did)."""
        if self.status == "ok":
            return ""
        if self.status == "timeout":
            return f"timed out after {self.timeout:g} s (killed)"
        if self.status == "error":
            return self.error or "the function raised"
        if self.status == "crashed" and self.returncode is not None:
            try:
                name = signal.Signals(-self.returncode).name
            except ValueError:
                name = "?"
            return f"killed by signal {-self.returncode} ({name})" + _last_lines(self.stderr)
        return f"exit code {self.returncode}" + _last_lines(self.stderr)


def host_available_memory() -> int:
    """MemAvailable from /proc/meminfo, in bytes (0 when unknown): what the children started here may use."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _last_lines(text: str, n: int = 3) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return (": " + " | ".join(ln.strip()[:300] for ln in lines[-n:])) if lines else ""


def _tail(path: Path) -> str:
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - TAIL_CHARS))
            return f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


class ChildProcess(Protocol):
    """What callers use of a started child: a `subprocess.Popen`, or a worker forked by a zygote
    (`backends.zygote.ZygoteChild`)."""

    pid: int
    returncode: int | Any
    stdin: IO[Any] | None
    stdout: IO[Any] | None

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def kill(self) -> None: ...


def spawn(argv: Sequence[str], *, stdout: IO[Any] | int, stderr: IO[Any] | int, env: Mapping[str, str] | None = None,
          cwd: str | Path | None = None, text: bool = False, stdin: int = subprocess.DEVNULL) -> ChildProcess:
    """The one way a child starts: in a new session (so `kill_tree` ends it and all it started), stdin closed
    unless `stdin=subprocess.PIPE` (a parent that drives the child step by step).

    With `KSTRATA_ZYGOTE=1`, kstrata's Python workers (`backends.zygote.MODULES`) are forked from a process
    that has torch imported already, when one is ready for this environment (`backends/zygote.py`)."""
    if zygote.enabled():
        forked = zygote.spawn(argv, stdout=stdout, stderr=stderr, env=env, cwd=cwd, text=text, stdin=stdin)
        if forked is not None:
            return forked
    return subprocess.Popen(list(argv), stdout=stdout, stderr=stderr, stdin=stdin,
                            env=dict(env) if env is not None else None, cwd=cwd, start_new_session=True, text=text)


def kill_tree(proc: ChildProcess) -> None:
    """Kill a child started by this module and every process in its session, and reap it."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        proc.kill()
    proc.wait()


def _status(code: int) -> str:
    return "ok" if code == 0 else "crashed" if code < 0 else "failed"


def run_child(argv: Sequence[str], *, timeout: float, env: Mapping[str, str] | None = None,
              cwd: str | Path | None = None, log: Path | None = None) -> ChildResult:
    """Run `argv` to completion or until `timeout` seconds have passed (then it and its children are killed).
    With `log`, stdout and stderr both go to that file, interleaved (the result's `stdout` is its end)."""
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kstrata-child-") as tmp:
        out_path, err_path = log or Path(tmp) / "stdout", Path(tmp) / "stderr"
        with out_path.open("wb") as out, err_path.open("wb") as err:
            proc = spawn(argv, stdout=out, stderr=out if log is not None else err, env=env, cwd=cwd)
            try:
                code: int | None = proc.wait(timeout=timeout)
                status = _status(code or 0)
            except subprocess.TimeoutExpired:
                kill_tree(proc)
                code, status = None, "timeout"
            # a child may leave grandchildren in its session behind after exiting: they go too
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        return ChildResult(status, code, _tail(out_path), _tail(err_path), time.monotonic() - start, timeout)


def call_in_child(target: str, payload: Any, *, timeout: float, env: Mapping[str, str] | None = None,
                  cwd: str | Path | None = None, python: str | None = None) -> ChildResult:
    """Call `target` ("package.module:function") with the JSON `payload` in a fresh interpreter.

    The function's return value must be JSON-able; it is `value` of an "ok" result. An exception it raises
    is an "error" result (`error`: the exception's type and message; the traceback's end is in `stderr`).
    """
    with tempfile.TemporaryDirectory(prefix="kstrata-call-") as tmp:
        job, result = Path(tmp) / "job.json", Path(tmp) / "result.json"
        job.write_text(json.dumps({"target": target, "payload": payload}))
        run = run_child([python or sys.executable, "-m", "kstrata.backends.child", str(job), str(result)],
                        timeout=timeout, env=env, cwd=cwd)
        if run.status != "ok":
            return run
        try:
            data = json.loads(result.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            return ChildResult("failed", run.returncode, run.stdout, run.stderr, run.seconds, timeout,
                               error=f"the child exited 0 but left no readable result ({exc})")
    if "error" in data:
        return ChildResult("error", run.returncode, run.stdout, run.stderr + data.get("traceback", ""), run.seconds,
                           timeout, error=data["error"])
    return ChildResult("ok", run.returncode, run.stdout, run.stderr, run.seconds, timeout, value=data["value"])


class ChildTimeout(Exception):
    """`ChildStream.next_line` waited past its deadline; the child is still running (kill it)."""


class ChildStream:
    """A child whose stdout is read line by line while it runs (stderr goes to a file: `stderr_tail`)."""

    def __init__(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
                 cwd: str | Path | None = None) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="kstrata-stream-")
        self._err_path = Path(self._tmp.name) / "stderr"
        self._err = self._err_path.open("wb")
        self.proc = spawn(argv, stdout=subprocess.PIPE, stderr=self._err, env=env, cwd=cwd, text=True)
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._pump = threading.Thread(target=self._read, daemon=True)
        self._pump.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def next_line(self, timeout: float) -> str | None:
        """The next line of stdout (with its newline), None at the end (the child exited), or
        `ChildTimeout` when none came within `timeout` seconds."""
        try:
            return self._lines.get(timeout=max(timeout, 0.0))
        except queue.Empty:
            raise ChildTimeout from None

    def kill(self) -> None:
        kill_tree(self.proc)

    def wait(self) -> int:
        """Wait for the exit (after `next_line` returned None) and return the exit code."""
        return self.proc.wait()

    def stderr_tail(self) -> str:
        self._err.flush()
        return _tail(self._err_path)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.kill()
        self._pump.join(timeout=10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._err.close()
        self._tmp.cleanup()

    def __enter__(self) -> ChildStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _child_main(job_path: str, result_path: str) -> None:
    job = json.loads(Path(job_path).read_text())
    module, _, name = job["target"].partition(":")
    try:
        fn = getattr(importlib.import_module(module), name)
        data: dict[str, Any] = {"value": fn(job["payload"])}
        text = json.dumps(data, default=str)
    except Exception as exc:  # the function's failure is the caller's value, with the traceback
        text = json.dumps({"error": f"{type(exc).__name__}: {exc}",
                           "traceback": "".join(traceback.format_exception(exc))[-TAIL_CHARS:]})
    tmp = Path(result_path + ".tmp")
    tmp.write_text(text)
    tmp.replace(result_path)


if __name__ == "__main__":
    _child_main(sys.argv[1], sys.argv[2])
