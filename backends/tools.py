"""The one wrapper through which every external tool runs, and tool discovery.

Every call has a timeout; a failure becomes a typed `ToolError` carrying the exit code or signal, the
tail of the tool's error output, and the command line to reproduce it.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kstrata.ir.errors import KstrataError, cut_text

DEFAULT_TIMEOUT_S = 120.0


class ToolError(KstrataError):
    """An external tool could not be run or failed."""

    def __init__(self, message: str, *, repro: str | None = None, stderr: str = "", hint: str | None = None) -> None:
        self.repro = repro
        self.stderr = stderr
        super().__init__(message, hint=hint)

    def __str__(self) -> str:
        """One line: what failed, the tool's first error line (cut), and the command that reproduces it."""
        text = super().__str__()
        lines = [ln.strip() for ln in self.stderr.strip().splitlines() if ln.strip()]
        if lines:
            first = next((ln for ln in lines if "error" in ln.lower() or "fatal" in ln.lower()), lines[0])
            more = f" (+{len(lines) - 1} more lines)" if len(lines) > 1 else ""
            text += f": {cut_text(first, 300)}{more}"
        if self.repro:
            text += f"; repro: {cut_text(self.repro, 600)}"
        return text

    def naming(self, files: Mapping[str, str]) -> ToolError:
        """This error with the temporary copies the tool ran on replaced by the user's files they hold.

        `files` maps an extension (`ptx`, `cubin`, …) to the user's file of that level; every temporary path
        with that extension in the tool's output and in the repro command becomes that file, and the error
        names the first one that occurred (a user cannot act on `/tmp/kstrata-ptxas-x/kernel.ptx`).
        """
        named: str | None = None

        def swap(m: re.Match[str]) -> str:
            nonlocal named
            user = files.get(m.group("ext"))
            if user is None:
                return m.group(0)
            named = named or user
            return user

        self.stderr = _TEMP_PATH.sub(swap, self.stderr)
        self.message = _TEMP_PATH.sub(swap, self.message)
        if self.repro:
            self.repro = _TEMP_PATH.sub(swap, self.repro)
        if named and not self.path:
            self.path = named
        return self


#: A temporary file kstrata hands a tool: under the temp directory, named by `tempfile` or `kstrata-*` dirs.
#: (Not an output: `-o PATH` stays, so that a repro never writes over the user's file.)
_TEMP_PATH = re.compile(r"(?<!-o )(?<!-o=)" + re.escape(tempfile.gettempdir()) + r"/[\w.-]+(?:/[\w.-]+)?\.(?P<ext>ptx|cubin|amdgcn|hsaco|llir|o)\b")


def user_files(bundle: Any) -> dict[str, str]:
    """Extension → the user's file that holds a bundle's level (a cache/dump entry's files, or the one IR file)."""
    origin = Path(str(bundle.origin or ""))
    files: dict[str, str] = {}
    if origin.is_dir():
        for level in bundle.levels:
            f = origin / f"{bundle.name}.{level}"
            if f.is_file():
                files[level] = str(f)
    elif origin.is_file():
        files[origin.suffix.lstrip(".")] = str(origin)
    return files


@contextmanager
def naming_user_files(bundle: Any = None, *, files: Mapping[str, str] | None = None,
                      otherwise: str | None = None) -> Iterator[None]:
    """Inside: a `ToolError` names the user's file of the level it failed on (see `ToolError.naming`): a
    bundle's files, or `files` (extension → path); else the error is said to be about `otherwise`."""
    mine = {**(user_files(bundle) if bundle is not None else {}), **(files or {})}
    try:
        yield
    except ToolError as exc:
        exc.naming(mine)
        if not exc.path and otherwise:
            exc.path = otherwise
        raise exc from None
    except KstrataError as exc:
        exc.message = _TEMP_PATH.sub(lambda m: mine.get(m.group("ext"), m.group(0)), exc.message)
        if exc.path is None and bundle is not None:
            # Decoding a binary (an ELF section, a note) names its file; anything else the kernel's entry.
            binary = mine.get(bundle.target.binary_level)
            exc.path = binary if binary and exc.message.startswith(("ELF", "not an ELF")) else str(bundle.origin)
        raise


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
