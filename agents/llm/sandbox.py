"""Where generated Python runs: a child process with no network, limits, and nothing of kstrata's state.

Generated code (a model's `ModelNew` file, a generated pass) never runs in the kstrata process. It runs
in a child whose environment `sandbox_env` builds:

- **An allowlisted environment**: PATH, locale, the Python/torch/Triton/CUDA variables a worker needs;
  no API keys (`OPENAI_API_KEY`, `KSTRATA_LLM_*`, anything named like a key, token or secret), no proxy
  variables; `HOME`, `TMPDIR` and the Triton cache point into the child's own scratch directory, so it
  sees none of the optimizer's caches, search state or config.
- **A guard that runs before any other code**: a `sitecustomize.py` first on `PYTHONPATH` (Python imports
  it at start-up, before the worker or the candidate). It sets `resource.setrlimit` limits (address
  space, CPU seconds, file size), optionally moves the process into a new user + network namespace
  (`unshare(CLONE_NEWUSER | CLONE_NEWNET)`: only a downed loopback exists there, for the process and
  everything it starts; used when the kernel allows it, and off by default for CUDA devices until it
  is checked on the GPU machine), and installs an audit hook (`sys.addaudithook`, which cannot be
  removed) that refuses IPv4/IPv6 sockets, DNS look-ups, and connect/bind/send to non-Unix addresses.
- A wall-clock timeout enforced by the parent (kills the process group).

`sandbox_env` is what `kstrata.agents.evaluate.evaluate(..., env=...)` receives for LLM candidates;
`run_python` runs a script (a generated pass on an IR file) in the same kind of child.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kstrata.backends.child import run_child

#: Variables copied into the child when set (everything else is dropped).
ENV_ALLOW = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "PYTHONHASHSEED", "PYTHONUNBUFFERED", "PYTHONPATH",
             "VIRTUAL_ENV", "LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES", "CUDA_HOME", "CUDA_PATH",
             "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
             "TRITON_INTERPRET", "TRITON_PTXAS_PATH", "TORCH_CUDA_ARCH_LIST")
#: ... and every variable with one of these prefixes (GPU runtimes, Triton, torch), secrets excepted.
ENV_ALLOW_PREFIXES = ("CUDA_", "NVIDIA_", "TRITON_", "TORCH_", "TORCHINDUCTOR_", "HIP_", "ROCM_", "HSA_", "ROCR_")
#: Patterns never copied even if allowlisted above (defence in depth).
_SECRET_WORDS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "CREDENTIAL", "PROXY")

GUARD_SOURCE = r'''
"""kstrata sandbox guard: runs before any other code in this process (sitecustomize)."""
import os as _os
import sys as _sys


def _kstrata_guard():
    import resource

    def limit(var, res, scale):
        value = _os.environ.get(var)
        if value:
            n = int(value) * scale
            soft, hard = resource.getrlimit(res)
            if hard != resource.RLIM_INFINITY:
                n = min(n, hard)
            resource.setrlimit(res, (n, n))

    limit("KSTRATA_SANDBOX_AS_MB", resource.RLIMIT_AS, 1 << 20)
    limit("KSTRATA_SANDBOX_CPU_S", resource.RLIMIT_CPU, 1)
    limit("KSTRATA_SANDBOX_FSIZE_MB", resource.RLIMIT_FSIZE, 1 << 20)
    netns = "off"
    if _os.environ.get("KSTRATA_SANDBOX_NETNS") == "1":
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            if libc.unshare(0x10000000 | 0x40000000) == 0:  # CLONE_NEWUSER | CLONE_NEWNET
                netns = "on"
            else:
                netns = "unavailable (errno %d)" % ctypes.get_errno()
        except Exception as exc:  # no ctypes, no libc: the audit hook still holds
            netns = "unavailable (%s)" % type(exc).__name__
    _os.environ["KSTRATA_SANDBOX"] = "netns=" + netns
    import socket as _socket

    inet = {-1, int(_socket.AF_INET), int(_socket.AF_INET6)}
    unix = int(_socket.AF_UNIX)
    lookups = {"socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyaddr", "socket.gethostbyname_ex",
               "socket.getnameinfo"}
    addressed = {"socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg"}

    def hook(event, args):
        if not event.startswith("socket."):
            return
        if event == "socket.__new__":
            if args[1] in inet or args[1] not in (unix,):
                raise PermissionError("kstrata sandbox: network sockets are not allowed here")
        elif event in lookups:
            raise PermissionError("kstrata sandbox: name look-ups are not allowed here")
        elif event in addressed:
            sock = args[0]
            if getattr(sock, "family", None) != unix:
                raise PermissionError("kstrata sandbox: network access is not allowed here")

    _sys.addaudithook(hook)


_kstrata_guard()
del _kstrata_guard
'''


@dataclass(frozen=True)
class SandboxLimits:
    """Limits of one sandboxed child. `memory_mb` limits the address space: leave it None on CUDA, whose
    driver reserves far more virtual memory than it uses."""

    timeout_s: float = 120.0
    memory_mb: int | None = 8192
    cpu_s: int | None = 600
    file_mb: int | None = 16384  # the eval worker writes each trial's outputs to disk
    #: New user + network namespace: "auto" (on for CPU children), "on", "off".
    netns: str = "auto"

    @classmethod
    def for_device(cls, device: str, timeout_s: float = 120.0) -> SandboxLimits:
        if device == "cpu":
            return cls(timeout_s=timeout_s)
        return cls(timeout_s=timeout_s, memory_mb=None, netns="off")


def _is_secret(name: str) -> bool:
    up = name.upper()
    return up.startswith(("OPENAI_", "KSTRATA_LLM")) or any(w in up for w in _SECRET_WORDS)


def sandbox_env(workdir: Path, limits: SandboxLimits | None = None, *, device: str = "cpu",
                base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for a sandboxed child with scratch space under `workdir` (created).

    Writes the guard (`workdir/site/sitecustomize.py`) and puts it first on PYTHONPATH.
    """
    limits = limits or SandboxLimits.for_device(device)
    src = dict(os.environ) if base is None else base
    workdir = Path(workdir)
    site = workdir / "site"
    home = workdir / "home"
    tmp = workdir / "tmp"
    for d in (site, home, tmp):
        d.mkdir(parents=True, exist_ok=True)
    (site / "sitecustomize.py").write_text(GUARD_SOURCE)
    env = {k: v for k, v in src.items() if (k in ENV_ALLOW or k.startswith(ENV_ALLOW_PREFIXES)) and not _is_secret(k)}
    env["PYTHONPATH"] = os.pathsep.join([str(site)] + [p for p in src.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.update({"HOME": str(home), "TMPDIR": str(tmp), "TRITON_CACHE_DIR": str(workdir / "triton-cache"),
                "TORCHINDUCTOR_CACHE_DIR": str(workdir / "inductor-cache"),
                "XDG_CACHE_HOME": str(workdir / "cache"), "PYTHONDONTWRITEBYTECODE": "1",
                "PYTHONNOUSERSITE": "1", "PYTHONUNBUFFERED": "1", "KSTRATA_SANDBOX": "pending"})
    if limits.memory_mb:
        env["KSTRATA_SANDBOX_AS_MB"] = str(limits.memory_mb)
    if limits.cpu_s:
        env["KSTRATA_SANDBOX_CPU_S"] = str(limits.cpu_s)
    if limits.file_mb:
        env["KSTRATA_SANDBOX_FSIZE_MB"] = str(limits.file_mb)
    netns = limits.netns if limits.netns != "auto" else ("on" if device == "cpu" else "off")
    env["KSTRATA_SANDBOX_NETNS"] = "1" if netns == "on" else "0"
    return env


@dataclass(frozen=True)
class SandboxRun:
    returncode: int | None
    timed_out: bool
    stdout: str
    stderr: str
    elapsed_s: float
    result: dict[str, Any] | None  # the JSON the script wrote to $KSTRATA_SANDBOX_RESULT, if any

    def failure(self) -> str | None:
        if self.timed_out:
            return f"timed out after {self.elapsed_s:.0f} s (killed)"
        if self.returncode and self.returncode < 0:
            try:
                name = signal.Signals(-self.returncode).name
            except ValueError:
                name = str(-self.returncode)
            return f"killed by signal {name}" + (" (a resource limit?)" if name in ("SIGKILL", "SIGXCPU") else "")
        if self.returncode:
            lines = [ln for ln in self.stderr.strip().splitlines() if ln.strip()]
            return f"exit code {self.returncode}" + (f": {lines[-1][:300]}" if lines else "")
        return None


def run_python(script: str, workdir: Path, *, args: tuple[str, ...] = (), limits: SandboxLimits | None = None,
               device: str = "cpu") -> SandboxRun:
    """Run `script` (Python source written to `workdir/main.py`) in a sandboxed child, cwd `workdir`."""
    limits = limits or SandboxLimits.for_device(device)
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    env = sandbox_env(workdir, limits, device=device)
    result_path = workdir / "result.json"
    env["KSTRATA_SANDBOX_RESULT"] = str(result_path)
    main = workdir / "main.py"
    main.write_text(script)
    # the one child protocol (backends/child.py): a new session, killed with everything it started on a
    # timeout, and its grandchildren after it exits; output to files, so a chatty script cannot block
    run = run_child([sys.executable, str(main), *args], timeout=limits.timeout_s, env=env, cwd=workdir)
    timed_out = run.status == "timeout"
    result = None
    if result_path.is_file() and not timed_out:
        try:
            loaded = json.loads(result_path.read_text())
            result = loaded if isinstance(loaded, dict) else None
        except (OSError, json.JSONDecodeError):
            result = None
    return SandboxRun(run.returncode, timed_out, run.stdout, run.stderr, run.seconds, result)
