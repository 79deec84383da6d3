"""Start kstrata's Python workers by forking a process that has already imported torch (opt-in).

Every evaluation runs its reference and its candidate in fresh processes (`python -m
kstrata.agents.eval_worker`), every task description in another (`kstrata.agents.task_worker`), and each
of them imports torch first: 1.7-2.2 s of CPU on a 2-core machine, more than most of the work the process
then does on small tasks. With `KSTRATA_ZYGOTE=1` in the environment of the process that starts them,
`backends.child.spawn` forks such workers from a *zygote*: a server process started once per calling
process (and per import-relevant environment, below) that has imported torch, numpy and Triton and then
waits. The forked process then becomes the worker exactly as `python -m MODULE ARGS` would: a new session
(`kill_tree` ends it and everything it starts), its own stdin/stdout/stderr (passed as file descriptors),
working directory, environment, `sys.argv`, `sys.path[0]` and a fresh `__main__`; the module is run by
runpy as `-m` runs it; its exit status comes back to the caller's handle (`ZygoteChild`, which has the
parts of `subprocess.Popen` the callers use: `pid`, `poll`, `wait`, `kill`, `returncode`, `stdin`,
`stdout`).

What a fork cannot give a worker is what was decided when the zygote imported its modules: the
interpreter's start-up settings and what torch, numpy, OpenMP/MKL, CUDA and Triton read from the
environment at import. So a zygote serves only requests whose environment agrees with its own on every
variable of those families (`_IMPORT_TIME_PREFIXES`: `PYTHON*` except `PYTHONUNBUFFERED`, which is
re-applied, `LD_*`, `OMP_*`, `MKL_*`, `TORCH*`, `TRITON_*`, `CUDA_*`, ...); another environment gets a
zygote of its own (at most `_MAX_ZYGOTES` per caller), or the plain way. The zygote imports modules and
runs nothing: no torch operation, no thread, no CUDA initialisation happens before the fork.

Never a sandboxed worker (`KSTRATA_SANDBOX` in its environment): generated code, whose guard is installed
at interpreter start-up by `agents/llm/sandbox.py`, and which must not inherit the zygote's memory (earlier
requests' environments). Only the modules in `MODULES` are forked (workers written to start fresh);
anything else, and anything while the zygote is still importing (the request is then started the plain way; the zygote for an
environment is started at its second request), starts the plain way. A zygote ends when the process that
started it ends (it watches its parent); its running workers are not killed by that, as plain children
are not.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

#: The variable that turns this on (in the environment of the process that starts workers).
ENV_FLAG = "KSTRATA_ZYGOTE"

#: The worker modules that may be forked from a zygote.
MODULES = frozenset({"kstrata.agents.eval_worker", "kstrata.agents.task_worker", "kstrata.agents.optimize.worker",
                     "kstrata.backends.dynamic_worker"})

#: Imported by the zygote before it serves (what those workers import first, third-party only). The
#: interpreter's (a dynamic worker's `kind: interp` jobs): ml_dtypes 0.75 s and xDSL 0.15 s per worker here.
PRELOAD = ("torch", "torch.export", "torch.utils.flop_counter", "torch._decomp", "torch.utils._pytree",
           "numpy", "triton", "triton.language", "ml_dtypes", "xdsl.dialects.builtin", "xdsl.dialects.arith",
           "xdsl.dialects.scf", "xdsl.dialects.cf", "xdsl.dialects.math", "xdsl.interpreter", "xdsl.parser",
           "xdsl.printer", "xdsl.pattern_rewriter")

#: Environment variables read at interpreter start-up or at the import of what the zygote preloads: a
#: request is served only by a zygote whose environment has the same values for all of them.
_IMPORT_TIME_PREFIXES = ("PYTHON", "LD_", "OMP_", "GOMP_", "KMP_", "MKL_", "OPENBLAS_", "BLIS_", "NUMEXPR_",
                         "NPY_", "NUMPY_", "TORCH", "PYTORCH_", "CUDA_", "CUBLAS", "CUDNN", "NCCL_", "NVIDIA_",
                         "HIP_", "ROCM_", "HSA_", "TRITON_", "MALLOC_", "LC_", "LANG", "TZ")
#: ... except these, which the forked worker applies itself.
_REAPPLIED = frozenset({"PYTHONUNBUFFERED"})

_MAX_ZYGOTES = 3
_START_TIMEOUT_S = 120.0


def enabled() -> bool:
    return os.environ.get(ENV_FLAG, "") == "1"


def env_key(env: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """The part of `env` a zygote must share with a worker it forks."""
    return tuple(sorted((k, v) for k, v in env.items() if k.startswith(_IMPORT_TIME_PREFIXES) and k not in _REAPPLIED))


def forkable(argv: Sequence[str]) -> str | None:
    """The module of `argv` when it is `[sys.executable, "-m", MODULE, ...]` with MODULE in `MODULES`."""
    if len(argv) >= 3 and argv[0] == sys.executable and argv[1] == "-m" and argv[2] in MODULES:
        return argv[2]
    return None


# ---------------------------------------------------------------------------------------------------
# The caller's side
# ---------------------------------------------------------------------------------------------------
class ZygoteChild:
    """A worker forked by a zygote, as the caller sees it (the parts of `subprocess.Popen` callers use).

    Its exit status arrives on the connection the request was made on; when the zygote itself is gone
    (killed), the status is lost: once the process is gone too, `returncode` is -SIGKILL, never 0."""

    def __init__(self, conn: socket.socket, pid: int, args: list[str], stdin: IO[Any] | None,
                 stdout: IO[Any] | None) -> None:
        self._conn: socket.socket | None = conn
        self.pid = pid
        self.args = args
        self.stdin = stdin
        self.stdout = stdout
        self.stderr: IO[Any] | None = None
        self.returncode: int | None = None
        self._lock = threading.Lock()

    def _receive(self, timeout: float | None) -> None:
        with self._lock:
            if self.returncode is not None:
                return
            if self._conn is None:  # the zygote went away: wait for the process itself to go
                if not _alive(self.pid):
                    self.returncode = -signal.SIGKILL
                elif timeout:
                    time.sleep(min(timeout, 0.05))
                return
            ready, _, _ = select.select([self._conn], [], [], timeout)
            if not ready:
                return
            try:
                data = self._conn.recv(4096)
            except OSError:
                data = b""
            if not data:
                self._conn.close()
                self._conn = None
                return
            self.returncode = os.waitstatus_to_exitcode(int(json.loads(data)["status"]))
            self._conn.close()
            self._conn = None

    def poll(self) -> int | None:
        self._receive(0.0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        end = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = None if end is None else end - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            self._receive(left if left is not None else 1.0)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie not yet reaped by whoever inherited it is gone for our purposes
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][:1] != "Z"
    except (OSError, IndexError):
        return False


class _Zygote:
    """One zygote process started by this process, for one import-relevant environment."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="kstrata-zygote-"))
        self.path = self.dir / "sock"
        self.log = self.dir / "log.txt"
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "kstrata.backends.zygote", str(self.path)],
                                         stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         env=dict(env), cwd=str(self.dir), start_new_session=True)
        self.started = time.monotonic()
        self.dead = False

    def ready(self) -> bool:
        if self.dead:
            return False
        if self.path.with_suffix(".ready").exists() and self.proc.poll() is None:
            return True
        if self.proc.poll() is not None:
            self.close(f"it exited with {self.proc.returncode}")
        elif time.monotonic() - self.started > _START_TIMEOUT_S:
            self.close(f"it was not ready after {_START_TIMEOUT_S:g} s")
        return False

    def fork(self, module: str, argv: Sequence[str], *, stdin: int, stdout: IO[Any] | int, stderr: IO[Any] | int,
             env: Mapping[str, str], cwd: str | Path | None, text: bool) -> ZygoteChild:
        mine: list[int] = []  # descriptors opened here for the request, closed once the zygote has them
        keep_in: IO[Any] | None = None
        keep_out: IO[Any] | None = None
        try:
            if stdin == subprocess.PIPE:
                fd_in, keep_in = _pipe(text, mine, child_reads=True)
            else:
                fd_in = _fd(stdin, mine)
            if stdout == subprocess.PIPE:
                fd_out, keep_out = _pipe(text, mine, child_reads=False)
            else:
                fd_out = _fd(stdout, mine)
            fd_err = fd_out if stderr == subprocess.STDOUT else _fd(stderr, mine)
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            try:
                conn.connect(str(self.path))
                request = {"module": module, "argv": list(argv[3:]), "env": dict(env),
                           "cwd": os.path.abspath(cwd if cwd is not None else os.getcwd())}
                socket.send_fds(conn, [json.dumps(request).encode()], [fd_in, fd_out, fd_err])
                ready, _, _ = select.select([conn], [], [], 30.0)
                reply = json.loads(conn.recv(65536) or b"{}") if ready else {}
            except BaseException:
                conn.close()
                raise
            if "pid" not in reply:
                conn.close()
                raise OSError(f"the zygote did not fork: {reply.get('error', 'no answer')}")
        except BaseException:
            for f in (keep_in, keep_out):
                if f is not None:
                    f.close()
            raise
        finally:
            for fd in mine:
                with contextlib.suppress(OSError):
                    os.close(fd)
        return ZygoteChild(conn, int(reply["pid"]), list(argv), keep_in, keep_out)

    def close(self, why: str = "") -> None:
        """End it. With `why` (it failed, not this process's exit), say so once on stderr with the end of
        its log: the workers it would have forked start the plain way from now on."""
        if self.dead:
            return
        self.dead = True
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            self.proc.wait()
        if why:
            try:
                tail = [ln for ln in self.log.read_text(errors="replace").splitlines() if ln.strip()][-1:]
            except OSError:
                tail = []
            print(f"kstrata: the worker zygote stopped: {why}" + (f" ({tail[0][:300]})" if tail else "")
                  + "; workers start the plain way", file=sys.stderr)
        shutil.rmtree(self.dir, ignore_errors=True)


def _pipe(text: bool, mine: list[int], *, child_reads: bool) -> tuple[int, IO[Any]]:
    """A pipe between the caller and the worker: the worker's end (closed here once passed) and the
    caller's end as a file, as `subprocess.PIPE` gives it."""
    r, w = os.pipe()
    theirs, ours, mode = (r, w, "w") if child_reads else (w, r, "r")
    mine.append(theirs)
    return theirs, open(ours, mode if text else mode + "b", closefd=True)


def _fd(spec: IO[Any] | int, mine: list[int]) -> int:
    if spec == subprocess.DEVNULL:
        fd = os.open(os.devnull, os.O_RDWR)
        mine.append(fd)
        return fd
    if isinstance(spec, int):
        if spec < 0:
            raise ValueError(f"unsupported stream {spec}")
        return spec
    return spec.fileno()


_zygotes: dict[tuple[tuple[str, str], ...], _Zygote] = {}
_requests: dict[tuple[tuple[str, str], ...], int] = {}
_lock = threading.Lock()


def spawn(argv: Sequence[str], *, stdout: IO[Any] | int, stderr: IO[Any] | int, env: Mapping[str, str] | None,
          cwd: str | Path | None, text: bool, stdin: int) -> ZygoteChild | None:
    """`argv` forked from this process's zygote for its environment, or None: start it the plain way (not a
    forkable module, the zygote still importing or gone, too many environments, a stream it cannot pass)."""
    module = forkable(argv)
    if module is None or stdin not in (subprocess.DEVNULL, subprocess.PIPE) or stdout is None or stderr is None:
        return None
    full = dict(os.environ if env is None else env)
    if "KSTRATA_SANDBOX" in full:  # generated code: its guard runs at start-up, in its own fresh process
        return None
    key = env_key(full)
    with _lock:
        zygote = _zygotes.get(key)
        if zygote is None:
            _requests[key] = _requests.get(key, 0) + 1
            if _requests[key] >= 2 and len(_zygotes) < _MAX_ZYGOTES:
                _zygotes[key] = _Zygote(full)
            return None
    if not zygote.ready():
        return None
    try:
        return zygote.fork(module, argv, stdin=stdin, stdout=stdout, stderr=stderr, env=full, cwd=cwd, text=text)
    except (OSError, ValueError) as exc:
        zygote.close(f"a fork request failed ({type(exc).__name__}: {exc})")
        return None


@atexit.register
def _close_all() -> None:
    with _lock:
        for z in _zygotes.values():
            z.close()
        _zygotes.clear()


# ---------------------------------------------------------------------------------------------------
# The zygote's side
# ---------------------------------------------------------------------------------------------------
class _Forked(BaseException):
    """Unwinds the serving loop in a freshly forked worker (never seen by the zygote itself)."""

    def __init__(self, request: dict[str, Any], fds: list[int]) -> None:
        super().__init__()
        self.request, self.fds = request, fds


def _serve(path: str) -> None:
    import importlib

    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception as exc:  # a missing module: the workers import what they need themselves
            print(f"zygote: not preloaded: {name}: {type(exc).__name__}: {exc}", flush=True)
    if threading.active_count() != 1:  # a fork from a process with threads may copy a held lock
        raise SystemExit(f"zygote: the preloads started {threading.active_count() - 1} thread(s); not serving")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(64)
    parent = os.getppid()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    children: dict[int, socket.socket] = {}
    Path(path).with_suffix(".ready").write_text(str(os.getpid()))
    while os.getppid() == parent:
        try:
            ready, _, _ = select.select([listener.fileno(), wake_r], [], [], 0.2)
        except InterruptedError:
            ready = []
        if wake_r in ready:
            with contextlib.suppress(BlockingIOError):
                os.read(wake_r, 4096)
        if listener.fileno() in ready:
            conn, _ = listener.accept()
            _answer(conn, children, listener, (wake_r, wake_w))
        for pid in list(children):
            try:
                done, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done, status = pid, 9  # reaped elsewhere: say killed, never a success
            if done:
                conn = children.pop(pid)
                with contextlib.suppress(OSError):
                    conn.send(json.dumps({"status": status}).encode())
                conn.close()


def _answer(conn: socket.socket, children: dict[int, socket.socket], listener: socket.socket,
            wake: tuple[int, int]) -> None:
    try:
        msg, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
        request = json.loads(msg)
    except (OSError, ValueError) as exc:
        with contextlib.suppress(OSError):
            conn.send(json.dumps({"error": f"bad request: {exc}"}).encode())
        conn.close()
        return
    if len(fds) != 3:
        for fd in fds:
            os.close(fd)
        conn.send(json.dumps({"error": f"expected 3 descriptors, got {len(fds)}"}).encode())
        conn.close()
        return
    sync_r, sync_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(sync_r)
        os.setsid()  # before the caller learns the pid: kill_tree's killpg must find the group
        os.close(sync_w)
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for c in children.values():
            c.close()
        conn.close()
        listener.close()
        for fd in wake:
            os.close(fd)
        raise _Forked(request, list(fds))
    os.close(sync_w)
    os.read(sync_r, 1)  # EOF once the worker has its own session
    os.close(sync_r)
    for fd in fds:
        os.close(fd)
    try:
        conn.send(json.dumps({"pid": pid}).encode())
    except OSError:  # the caller gave up: the worker runs on, its status goes nowhere
        pass
    children[pid] = conn


def _become(request: dict[str, Any], fds: list[int]) -> None:
    """In the forked process: become `python -m MODULE ARGS` as the request describes, and run it."""
    import runpy
    import types

    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in set(fds):
        if fd > 2:
            os.close(fd)
    env: dict[str, str] = request["env"]
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(env)
    tempfile.tempdir = None  # computed again from this environment's TMPDIR
    unbuffered = bool(env.get("PYTHONUNBUFFERED"))
    enc = sys.stdout.encoding if sys.stdout is not None else "utf-8"
    sys.stdin = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)), encoding=enc)
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False) if unbuffered
                                  else io.BufferedWriter(io.FileIO(1, "w", closefd=False)),
                                  encoding=enc, write_through=unbuffered, line_buffering=os.isatty(1))
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False) if unbuffered
                                  else io.BufferedWriter(io.FileIO(2, "w", closefd=False)),
                                  encoding=enc, errors="backslashreplace", write_through=unbuffered,
                                  line_buffering=True)
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr  # type: ignore[misc]
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    np = sys.modules.get("numpy")
    if np is not None:  # a fresh process would have drawn its own global seed
        np.random.seed()
    sys.path[0] = request["cwd"]
    sys.argv = ["-m", *request["argv"]]
    sys.modules["__main__"] = types.ModuleType("__main__")
    code = 0
    try:
        runpy._run_module_as_main(request["module"], alter_argv=True)  # type: ignore[attr-defined]
    except SystemExit as exc:
        code = _exit_code(exc.code)
    except BaseException:  # as the interpreter does with an uncaught exception: the traceback, status 1
        import traceback

        traceback.print_exc()
        code = 1
    _finish(code)


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)  # sys.exit("message"): the message on stderr, status 1
    return 1


def _finish(code: int) -> None:
    """Exit as the interpreter would, without tearing down the preloaded modules (torch's teardown is
    most of a plain worker's exit time): non-daemon threads are joined, atexit functions run, the streams
    are flushed, then the process ends with `code`."""
    try:
        shutdown = getattr(threading, "_shutdown", None)
        if shutdown is not None:
            shutdown()
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)


def main(argv: list[str]) -> None:
    try:
        _serve(argv[0])
    except _Forked as forked:
        _become(forked.request, forked.fds)


if __name__ == "__main__":
    main(sys.argv[1:])
