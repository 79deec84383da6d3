"""The reference's untimed trials and the task's description, kept between evaluations of the same task.

Every `evaluate` runs the task's `Model` in a process of its own for each trial (its outputs and their
float64 copies are the truth the candidate is judged against). The optimizer checks dozens of candidates
of one task with the same seed and trials, and each check ran that same reference again: a process, an
import of torch, the model built and run in float32 and float64. Nothing in it depends on the candidate,
so an untimed reference run is kept here and reused when everything it depends on is the same:

- the task file's bytes, and the bytes of every other local Python file the reference imported (files
  outside the interpreter's prefixes and outside kstrata: a helper module beside the task); those are
  checked again on every use, so an edited helper is a miss;
- the seed, the number of trials, the device (on a GPU: its name and CUDA version) and the policy (strict
  turns TF32 off in the reference);
- the versions of Python, torch, Triton and kstrata, and the source of the worker and trial-file code
  that produced it;
- the environment variables the workers get that can change a computation (`TORCH*`, `PYTORCH*`, `CUDA*`,
  `CUBLAS*`, `CUDNN*`, `NVIDIA*`, `OMP*`, `MKL*`, `TRITON*`, `KSTRATA*`, `PYTHONPATH`, `LD_PRELOAD`,
  `LD_LIBRARY_PATH`), less the ones that only name a cache or a scratch directory.

What is never kept: a timed reference (its timing must be measured beside the candidate's), a reference
that failed, one whose trials take more than `max_entry_bytes()` (published-size tasks are judged trial by
trial and never reach here), and anything when the cache is off (`KSTRATA_REFERENCE_CACHE=off`). A task
whose reference reads data files or the clock may give different outputs on another run; such a task
gives different outputs between any two runs, and the cache does not hide that from the candidate's
checks: the candidate still runs every trial on its own inputs and its input digests must match.

A task's description (`kstrata.agents.tasks.describe_task`: its shapes, dtypes and operation counts,
computed in a child process that imports the task) is kept the same way, under `specs/`, keyed by the
task's path and bytes, the versions and the environment, with the local files its loader imported checked on
every use. A task that fails to load is never kept: its error comes from a fresh run every time.

Where: `KSTRATA_REFERENCE_CACHE`, else `references/` in the candidate engine's cache
(`KSTRATA_ENGINE_CACHE` or `~/.cache/kstrata/engine`). Entries are written whole (a temporary directory
renamed into place), used least recently are removed beyond `max_total_bytes()`.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SCHEMA = "kstrata.reference-trials/1"
#: An entry larger than this (all trial files together) is not kept (`KSTRATA_REFERENCE_CACHE_MAX_BYTES`).
MAX_ENTRY_BYTES = 256 << 20
#: The cache is pruned, least recently used first, beyond this (`KSTRATA_REFERENCE_CACHE_TOTAL_BYTES`).
MAX_TOTAL_BYTES = 4 << 30

_ENV_PREFIXES = ("TORCH", "PYTORCH", "CUDA", "CUBLAS", "CUDNN", "NVIDIA", "OMP", "MKL", "TRITON", "KSTRATA")
_ENV_NAMES = ("PYTHONPATH", "LD_PRELOAD", "LD_LIBRARY_PATH")
#: Names that only say where a cache, a scratch directory or a log goes.
_ENV_IGNORED_PARTS = ("CACHE", "TMP", "TEMP", "HOME", "DUMP", "LOG")
#: The code that produces a reference's trials (its source is part of the key).
_PRODUCERS = ("eval_worker.py", "trial_io.py", "tasks.py", "evaluate.py")


def _int_env(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


def max_entry_bytes() -> int:
    return _int_env("KSTRATA_REFERENCE_CACHE_MAX_BYTES", MAX_ENTRY_BYTES)


def max_total_bytes() -> int:
    return _int_env("KSTRATA_REFERENCE_CACHE_TOTAL_BYTES", MAX_TOTAL_BYTES)


def cache_root() -> Path | None:
    """The cache directory, or None when it is turned off."""
    value = os.environ.get("KSTRATA_REFERENCE_CACHE", "")
    if value.lower() in ("off", "0", "no", "none", "false"):
        return None
    if value:
        return Path(value)
    engine = os.environ.get("KSTRATA_ENGINE_CACHE")
    base = Path(engine) if engine else Path.home() / ".cache" / "kstrata" / "engine"
    return base / "references"


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _file_sha(path: Path) -> str | None:
    try:
        return _sha(path.read_bytes())
    except OSError:
        return None


def relevant_env(env: dict[str, str] | None) -> dict[str, str]:
    """The part of the workers' environment that can change what the reference computes."""
    source = os.environ if env is None else env
    out = {}
    for k, v in source.items():
        if not (k.startswith(_ENV_PREFIXES) or k in _ENV_NAMES):
            continue
        if k.startswith(("KSTRATA_REFERENCE_CACHE", "KSTRATA_ENGINE_CACHE")) or any(p in k for p in _ENV_IGNORED_PARTS):
            continue
        out[k] = v
    return dict(sorted(out.items()))


def _device_identity(device: str) -> str:
    if not device.startswith("cuda"):
        return f"{device} ({platform.machine()})"
    import torch

    # The evaluator compares outputs on this GPU anyway (CUDA is initialized here either way).
    return f"{torch.cuda.get_device_name()} CUDA {torch.version.cuda}"


def _versions() -> dict[str, str]:
    import torch

    try:
        import triton

        tv = str(triton.__version__)
    except Exception:  # Triton missing: part of the key as such
        tv = "none"
    from kstrata import __version__

    here = Path(__file__).parent
    code = _sha(b"".join((here / name).read_bytes() for name in _PRODUCERS if (here / name).exists()))
    return {"python": platform.python_version(), "torch": str(torch.__version__), "triton": tv,
            "kstrata": __version__, "code": code}


@dataclass(frozen=True)
class ReferenceKey:
    """What an untimed reference run depends on; `digest` names its entry."""

    parts: dict[str, Any]

    @property
    def digest(self) -> str:
        return _sha(json.dumps(self.parts, sort_keys=True).encode())[:32]


def reference_key(task: Path, *, device: str, trials: int, seed: int, policy: str,
                  env: dict[str, str] | None) -> ReferenceKey | None:
    """The key of `task`'s untimed reference run under these options, or None when it cannot be read."""
    sha = _file_sha(task)
    if sha is None:
        return None
    return ReferenceKey({"schema": SCHEMA, "task_sha256": sha, "device": _device_identity(device),
                         "trials": trials, "seed": seed, "policy": policy, "versions": _versions(),
                         "env": relevant_env(env)})


def _entry_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _deps_ok(meta: dict[str, Any]) -> bool:
    return all(_file_sha(Path(f)) == sha for f, sha in (meta.get("local_files") or {}).items())


def lookup(key: ReferenceKey, dest: Path) -> tuple[dict[str, Any], str] | None:
    """Copy the entry's trial files into `dest` and return (the reference's report, its log tail), or None.

    An entry whose local files changed, or that cannot be read whole, is a miss (and removed)."""
    root = cache_root()
    if root is None:
        return None
    entry = root / key.digest
    try:
        meta = json.loads((entry / "meta.json").read_text())
        if meta.get("key") != key.parts or not _deps_ok(meta):
            raise ValueError("stale")
        files = meta.get("files") or {}
        present = {f.name for f in entry.iterdir() if f.name != "meta.json"}
        if present != set(files) or "report.json" not in files:
            raise ValueError("incomplete")
        dest.mkdir(parents=True, exist_ok=True)
        for name, sha in files.items():
            data = (entry / name).read_bytes()
            if _sha(data) != sha:  # a damaged entry is a miss, never a reference
                raise ValueError(f"{name} changed")
            (dest / name).write_bytes(data)
        report = json.loads((dest / "report.json").read_text())
        log = (dest / "log.txt").read_text(errors="replace") if (dest / "log.txt").exists() else ""
        os.utime(entry)  # least recently used goes first
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        shutil.rmtree(entry, ignore_errors=True)
        if dest.exists():
            shutil.rmtree(dest, ignore_errors=True)
        return None
    return report, log


def store(key: ReferenceKey, workdir: Path, report: dict[str, Any]) -> bool:
    """Keep a successful untimed reference run (its workdir: report.json, log.txt, trial files).
    False when it is not kept (too large, the cache off or not writable)."""
    root = cache_root()
    if root is None or not report.get("ok") or report.get("timing"):
        return False
    try:
        size = _entry_bytes(workdir)
        if size > max_entry_bytes():
            return False
        local = {f: sha for f in report.get("local_files") or [] if (sha := _file_sha(Path(f))) is not None}
        root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=root))
        try:
            files = {}
            for f in workdir.iterdir():
                if f.is_file():
                    data = f.read_bytes()
                    (tmp / f.name).write_bytes(data)
                    files[f.name] = _sha(data)
            meta = {"key": key.parts, "local_files": local, "files": files, "bytes": size, "created": time.time()}
            (tmp / "meta.json").write_text(json.dumps(meta, sort_keys=True))
            try:
                tmp.rename(root / key.digest)
            except OSError:  # another evaluation stored it first
                shutil.rmtree(tmp, ignore_errors=True)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
        prune(root)
    except OSError:
        return False
    return True


def prune(root: Path, limit: int | None = None) -> None:
    """Remove entries, least recently used first, until the cache holds at most `limit` bytes."""
    limit = max_total_bytes() if limit is None else limit
    entries = []
    for e in root.iterdir():
        if e.is_dir() and not e.name.startswith(".tmp-"):
            try:
                entries.append((e.stat().st_mtime, _entry_bytes(e), e))
            except OSError:
                continue
    total = sum(b for _, b, _ in entries)
    for _, b, e in sorted(entries, key=lambda x: x[0]):
        if total <= limit:
            break
        shutil.rmtree(e, ignore_errors=True)
        total -= b


def local_files(task: str) -> list[str]:
    """The Python files a (reference) process imported that are neither the interpreter's, an installed
    package's nor kstrata's own: the task and any helper module it brought in. Run in the worker."""
    import sysconfig

    roots = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix)}
    roots |= {os.path.realpath(p) for p in sysconfig.get_paths().values()}
    found = {os.path.realpath(task)}
    for name, m in list(sys.modules.items()):
        f = getattr(m, "__file__", None)
        if not f or name == "kstrata" or name.startswith("kstrata."):  # kstrata's code is in the key
            continue
        real = os.path.realpath(f)
        if not any(real.startswith(r.rstrip(os.sep) + os.sep) for r in roots):
            found.add(real)
    return sorted(found)


# ---------------------------------------------------------------------------------------------------
# Task descriptions
# ---------------------------------------------------------------------------------------------------
SPEC_SCHEMA = "kstrata.task-spec-cache/1"


def _spec_key(task: Path) -> str | None:
    sha = _file_sha(task)
    if sha is None:
        return None
    # the path too: a description names its file
    parts = {"schema": SPEC_SCHEMA, "task": os.path.realpath(task), "task_sha256": sha, "versions": _versions(),
             "env": relevant_env(None)}
    return _sha(json.dumps(parts, sort_keys=True).encode())[:32]


def spec_lookup(task: Path) -> dict[str, Any] | None:
    """The kept description (`TaskSpec.to_json()`) of `task`, or None."""
    root = cache_root()
    key = _spec_key(task) if root is not None else None
    if root is None or key is None:
        return None
    path = root / "specs" / f"{key}.json"
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        path.unlink(missing_ok=True)
        return None
    if not _deps_ok(data) or not isinstance(data.get("spec"), dict):
        path.unlink(missing_ok=True)
        return None
    spec: dict[str, Any] = data["spec"]
    return spec


def spec_store(task: Path, spec: dict[str, Any], files: list[str]) -> None:
    """Keep `task`'s description; `files`: the local files the loader had imported by then."""
    root = cache_root()
    key = _spec_key(task) if root is not None else None
    if root is None or key is None:
        return
    local = {f: sha for f in files if (sha := _file_sha(Path(f))) is not None}
    try:
        (root / "specs").mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=root / "specs")
        with os.fdopen(fd, "w") as f:
            json.dump({"spec": spec, "local_files": local}, f)
        os.replace(tmp, root / "specs" / f"{key}.json")
    except OSError:
        pass
