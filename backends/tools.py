"""The one wrapper through which every external tool runs, and tool discovery.

Every call has a timeout; a failure becomes a typed `ToolError` carrying the exit code or signal, the
tail of the tool's error output, and the command line to reproduce it.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from kstrata.ir.errors import KstrataError

DEFAULT_TIMEOUT_S = 120.0


class ToolError(KstrataError):
    """An external tool could not be run or failed."""

    def __init__(self, message: str, *, repro: str | None = None, stderr: str = "", hint: str | None = None) -> None:
        self.repro = repro
        self.stderr = stderr
        super().__init__(message, hint=hint)

    def __str__(self) -> str:
        text = super().__str__()
        if self.stderr.strip():
            tail = "\n".join(self.stderr.strip().splitlines()[-8:])
            text += f"\n{tail}"
        if self.repro:
            text += f"\nrepro: {self.repro}"
        return text


class ToolNotFound(ToolError):
    """No usable binary for a tool was found."""


class ToolFailed(ToolError):
    """The tool exited with a non-zero status."""

    def __init__(self, message: str, *, returncode: int, **kwargs: str | None) -> None:
        self.returncode = returncode
        super().__init__(message, **kwargs)  # type: ignore[arg-type]


class ToolCrashed(ToolError):
    """The tool was killed by a signal."""

    def __init__(self, message: str, *, signal_name: str, **kwargs: str | None) -> None:
        self.signal_name = signal_name
        super().__init__(message, **kwargs)  # type: ignore[arg-type]


class ToolTimeout(ToolError):
    """The tool ran past its timeout and was killed."""


@dataclass(frozen=True)
class ToolResult:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str

    @property
    def repro(self) -> str:
        return shlex.join(self.argv)


def run_tool(argv: Sequence[str | os.PathLike[str]], *, timeout: float = DEFAULT_TIMEOUT_S, input: bytes | None = None,
             cwd: str | os.PathLike[str] | None = None, check: bool = True) -> ToolResult:
    """Run `argv`; with `check`, a non-zero exit, a signal or a timeout raises a `ToolError`."""
    args = tuple(str(a) for a in argv)
    repro = shlex.join(args)
    tool = Path(args[0]).name
    try:
        proc = subprocess.run(args, input=input, capture_output=True, timeout=timeout, cwd=cwd, check=False)
    except FileNotFoundError:
        raise ToolNotFound(f"{tool}: executable not found", repro=repro) from None
    except PermissionError:
        raise ToolNotFound(f"{tool}: not executable", repro=repro) from None
    except subprocess.TimeoutExpired as exc:
        stderr = (exc.stderr or b"").decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        raise ToolTimeout(f"{tool} ran past its {timeout:g} s timeout", repro=repro, stderr=stderr) from None
    result = ToolResult(args, proc.returncode, proc.stdout.decode(errors="replace"), proc.stderr.decode(errors="replace"))
    if check and proc.returncode != 0:
        if proc.returncode < 0:
            name = signal.Signals(-proc.returncode).name
            raise ToolCrashed(f"{tool} was killed by {name}", signal_name=name, repro=repro, stderr=result.stderr)
        raise ToolFailed(f"{tool} failed with exit code {proc.returncode}", returncode=proc.returncode, repro=repro,
                         stderr=result.stderr or result.stdout)
    return result


@dataclass(frozen=True)
class FoundTool:
    """A tool binary and where it came from (`env`, `triton`, `system`)."""

    name: str
    path: Path
    origin: str

    def version(self) -> str:
        """The first line of the tool's version that names a version number."""
        try:
            out = run_tool([self.path, "--version"], timeout=20)
        except ToolError as exc:
            return f"unknown ({exc.message})"
        lines = [ln.strip() for ln in (out.stdout + out.stderr).splitlines() if ln.strip()]
        for ln in lines:
            if any(ch.isdigit() for ch in ln) and ("version" in ln.lower() or "release" in ln.lower()):
                return ln
        return lines[0] if lines else "unknown"


def find_tool(name: str, *, env_var: str, candidates: Sequence[tuple[str, str | os.PathLike[str]]]) -> FoundTool:
    """First of: the environment override `env_var`, then each `(origin, path or command)` candidate."""
    override = os.environ.get(env_var)
    if override:
        path = Path(override)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise ToolNotFound(f"{env_var}={override} is not an executable file")
        return FoundTool(name, path, "env")
    tried = []
    for origin, cand in candidates:
        cand_str = str(cand)
        resolved = cand_str if os.sep in cand_str else shutil.which(cand_str)
        tried.append(cand_str)
        if resolved and Path(resolved).is_file() and os.access(resolved, os.X_OK):
            return FoundTool(name, Path(resolved), origin)
    raise ToolNotFound(f"{name}: not found (tried {', '.join(tried)})", hint=f"install it or set {env_var}")
