"""`kstrata record -- CMD ...`: record the Triton kernel launches of a real program as launch records.

The program runs in a child process whose Python loads a small start-up module (through a
`sitecustomize.py` on `PYTHONPATH`) that installs the recorder. Compiled launches are caught where every
launcher of a Triton `CompiledKernel` meets: `CompiledKernel.launch_metadata(grid, stream, *args)`,
which Triton's JIT (`JITFunction.run`) and Inductor's generated launchers (`CachingAutotuner` →
`TritonCompileResult.make_launcher`) both call right before the launch with the grid and every argument
by position, plus a Triton launch-exit hook that runs after the launch. So one hook records plain
`@triton.jit` programs and `torch.compile` (Inductor) programs alike, and each record carries the
kernel's cache key (`metadata.hash`) and override key (the source hash), which `run-passes --launches`
matches to cache entries. Inductor's static CUDA launcher bypasses Triton's launcher (and with it the
hook); it refuses to run while a launch hook is installed, and `record_command` also turns it off with
`TORCHINDUCTOR_USE_STATIC_CUDA_LAUNCHER=0`. Under `TRITON_INTERPRET=1` (which must be set in the
environment of `kstrata record` itself) the interpreter's `InterpretedFunction.run` is wrapped instead.

The first launches of each binary (`--max-per-kernel`; a kernel name with several binaries, e.g.
autotuning configs, gets that many per binary) are written to `OUT/<kernel>-<n>.json` as
`kstrata.launch/1` records, with which tensors the launch changed and, with `--snapshots`, the input
contents before the launch (`.npy`, raw bytes for dtypes numpy lacks).

Limits: a program that installs its own `sitecustomize` shadows ours (it is then not recorded);
recording synchronizes the device around the recorded launches, so it slows the program down; launches
during CUDA-graph capture are not recorded (a synchronize would break the capture).
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import subprocess
import sys
import tempfile
import threading
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ENV_DIR = "KSTRATA_RECORD_DIR"
ENV_MAX = "KSTRATA_RECORD_MAX"
ENV_SNAPSHOTS = "KSTRATA_RECORD_SNAPSHOTS"
ENV_VERBOSE = "KSTRATA_RECORD_VERBOSE"
#: Inductor's launcher that bypasses Triton's (and so the launch hook); off while recording.
ENV_STATIC_LAUNCHER = "TORCHINDUCTOR_USE_STATIC_CUDA_LAUNCHER"
#: The ptxas Triton used in the recorded program, kept in a record's `extra` when the program set it.
PTXAS_ENV = "TRITON_PTXAS_PATH"

_SITECUSTOMIZE = """# written by kstrata record: install the launch recorder in this interpreter
try:
    from kstrata.tools.record import install_from_env as _kstrata_install
    _kstrata_install()
except Exception as _exc:  # never break the program being recorded
    import sys
    print(f"kstrata record: recorder not installed: {_exc}", file=sys.stderr)
"""


@dataclass
class _PendingLaunch:
    """A launch seen before it ran: what is needed to write its record once it has run."""

    name: str
    number: int
    target: str
    grid: tuple[int, int, int]
    bound: dict[str, Any]
    before: dict[str, Any]
    constexpr: set[str]
    types: dict[str, str]
    meta: dict[str, Any]


class LaunchRecorder:
    def __init__(self, out_dir: Path, max_per_kernel: int = 1, snapshots: bool = False) -> None:
        self.out_dir = out_dir
        self.max_per_kernel = max_per_kernel
        self.snapshots = snapshots
        self.counts: Counter[tuple[str, str]] = Counter()
        self.numbers: Counter[str] = Counter()
        self.lock = threading.Lock()
        self.pending: dict[int, _PendingLaunch] = {}
        #: every launch per (kernel, Triton cache key), recorded or not: the optimizer's time shares
        self.launches: Counter[tuple[str, str]] = Counter()
        #: launches made by Inductor's autotuner benchmarking its configs (`_in_autotuning`): not the program's
        #: work (the configs it rejects are launched only there, the faster ones most often)
        self.benchmark_launches: Counter[tuple[str, str]] = Counter()
        #: what `write_counts` has already added to the file
        self.written: Counter[tuple[str, str]] = Counter()
        self.written_benchmark: Counter[tuple[str, str]] = Counter()
        #: `KSTRATA_RECORD_VERBOSE=1`: say where the recorder is installed and each binary's first launch
        self.verbose = os.environ.get(ENV_VERBOSE) == "1"
        self.noted: set[str] = set()

    def write_counts(self) -> None:
        """`.kstrata/launch-counts.json` (a subdirectory: the records are every `*.json` of the directory): how
        often the program launched each binary (written at exit, or by `kstrata.agents.leave.leave` before an `os._exit`). Every process of the
        program that imports Triton has a recorder (Inductor's compile workers too): each adds what it counted
        since its last write to the file, under a lock, so a process that launched nothing changes nothing
        and none overwrites another's counts."""
        import fcntl

        from kstrata.ir.triton_layout import base32_key

        with self.lock:
            launches, benchmark = self.launches - self.written, self.benchmark_launches - self.written_benchmark
            self.written, self.written_benchmark = Counter(self.launches), Counter(self.benchmark_launches)
        path = self.out_dir / ".kstrata" / "launch-counts.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path.with_name(".launch-counts.lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            rows: dict[tuple[str, str], dict[str, Any]] = {}
            if path.is_file():
                try:
                    for row in json.loads(path.read_text()).get("kernels", []):
                        rows[str(row["kernel"]), str(row["cache_key"])] = row
                except (OSError, ValueError, KeyError, TypeError, AttributeError):
                    rows = {}  # unreadable: this process's counts replace it
            if not launches and not benchmark and path.is_file():
                return
            for (n, b) in sorted({*launches, *benchmark}):
                row = rows.setdefault((n, base32_key(b) if b else ""), {
                    "kernel": n, "cache_key": base32_key(b) if b else "", "launches": 0, "benchmark_launches": 0})
                row["launches"] = int(row.get("launches", 0)) + launches[n, b]
                row["benchmark_launches"] = int(row.get("benchmark_launches", 0)) + benchmark[n, b]
            tmp = path.with_name(f".{path.name}.tmp.{os.getpid()}")
            tmp.write_text(json.dumps({"schema": "kstrata.launch-counts/1",
                                       "kernels": [rows[k] for k in sorted(rows)]}, indent=1) + "\n")
            tmp.replace(path)

    def _take_note(self, key: str) -> bool:
        """True the first time `key` is seen (a verbose line said once)."""
        with self.lock:
            seen = key in self.noted
            self.noted.add(key)
            return not seen

    def _take(self, name: str, binary: str = "", benchmark: bool = False) -> int | None:
        """The record number for the next launch of `name` (per binary `binary`), or None when enough were taken;
        `benchmark`: the launch is Inductor's autotuning, counted apart (its arguments are the program's, so it
        may still give the record)."""
        with self.lock:
            (self.benchmark_launches if benchmark else self.launches)[name, binary] += 1
            if self.counts[name, binary] >= self.max_per_kernel:
                return None
            self.counts[name, binary] += 1
            self.numbers[name] += 1
            return self.numbers[name]

    def say(self, text: str) -> None:
        if self.verbose:
            print(f"kstrata record: [pid {os.getpid()}] {text}", file=sys.stderr, flush=True)

    def install(self) -> None:
        """Record compiled launches through Triton's launch path or, under `TRITON_INTERPRET=1`, interpreted
        ones (wrapping both breaks the interpreter, which runs nested `@jit` helpers through its own path)."""
        from triton import knobs

        if knobs.runtime.interpret:
            from triton.runtime import interpreter

            interpreter.InterpretedFunction.run = self._wrap_interpreted(interpreter.InterpretedFunction.run)
            self.say("installed for interpreted launches (TRITON_INTERPRET=1)")
            return
        from triton.compiler.compiler import CompiledKernel

        CompiledKernel.launch_metadata = self._wrap_launch_metadata(CompiledKernel.launch_metadata)
        exit_hook = knobs.runtime.launch_exit_hook
        if hasattr(exit_hook, "add"):  # Triton >= 3.5: a chain of hooks, shared with profilers
            exit_hook.add(self._after_launch)
        elif exit_hook is None:
            knobs.runtime.launch_exit_hook = self._after_launch
        else:
            raise RuntimeError("another launch exit hook is installed; kstrata record cannot share it")
        self.say(f"installed for compiled launches (argv {sys.argv[:3]})")

    # -- compiled launches ------------------------------------------------------------------------
    def _wrap_launch_metadata(self, launch_metadata: Any) -> Any:
        recorder = self

        @functools.wraps(launch_metadata)
        def wrapper(kernel: Any, grid: Any, stream: Any, *args: Any) -> Any:
            result = launch_metadata(kernel, grid, stream, *args)
            if result is None:  # no hook chain reaches the launcher: nothing would finish the record
                if recorder.verbose and recorder._take_note(f"none:{kernel.name}"):
                    recorder.say(f"launch of {kernel.name}: Triton gave no launch metadata (launch_enter_hook is None)"
                                 ": not recorded")
                return result
            try:
                pending = recorder._before_compiled(kernel, grid, args)
            except Exception as exc:  # recording must never break the program
                print(f"kstrata record: launch of {getattr(kernel, 'name', '?')} not recorded: "
                      f"{type(exc).__name__}: {exc}", file=sys.stderr)
                pending = None
            if pending is not None:
                with recorder.lock:
                    recorder.pending[id(result)] = pending
            return result

        return wrapper

    def _before_compiled(self, kernel: Any, grid: Any, args: tuple[Any, ...]) -> _PendingLaunch | None:
        import torch

        from kstrata.ir.triton_layout import base32_key

        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            return None  # a synchronize (below) would invalidate the graph being captured
        md = kernel.metadata
        benchmark = _in_autotuning()
        number = self._take(kernel.name, str(md.hash), benchmark)
        if number is None:
            return None
        self.say(f"launch of {kernel.name} ({str(md.hash)[:12]}{', autotuning' if benchmark else ''}): record {number}")
        src = kernel.src
        fn = getattr(src, "fn", None)
        names = list(getattr(fn, "arg_names", []))
        if len(names) != len(args):
            raise TypeError(f"{len(args)} launch arguments for the {len(names)} parameters {names}")
        signature = {str(k): str(v) for k, v in dict(getattr(src, "signature", {})).items()}
        constexpr = {k for k, v in signature.items() if v == "constexpr"}
        constexpr |= {names[i] for i in getattr(fn, "constexprs", []) if isinstance(i, int) and i < len(names)}
        bound = dict(zip(names, args, strict=True))
        grid3 = tuple(int(g) for g in grid) + (1,) * (3 - len(tuple(grid)))
        meta: dict[str, Any] = {"num_warps": md.num_warps, "num_stages": md.num_stages, "cache_key": md.hash,
                                "override_key": base32_key(src.hash()) if hasattr(src, "hash") else None}
        if os.environ.get(PTXAS_ENV):
            # Inductor points Triton at torch's own (newer) ptxas; PTX written for it may be refused by the
            # one Triton bundles, so whoever rebuilds this kernel's PTX must use the same one
            meta["extra"] = {PTXAS_ENV: os.environ[PTXAS_ENV]}
        return _PendingLaunch(kernel.name, number, f"{md.target.backend}:{md.target.arch}",
                              (grid3[0], grid3[1], grid3[2]), bound, self._before(bound), constexpr, signature, meta)

    def _after_launch(self, launch_metadata: Any) -> None:
        with self.lock:
            pending = self.pending.pop(id(launch_metadata), None)
        if pending is None:
            return
        try:
            self._write(pending)
        except Exception as exc:  # recording must never break the program
            print(f"kstrata record: launch of {pending.name} not recorded: {type(exc).__name__}: {exc}",
                  file=sys.stderr)

    # -- interpreted launches ---------------------------------------------------------------------
    def _wrap_interpreted(self, run: Any) -> Any:
        recorder = self

        @functools.wraps(run)
        def wrapper(fn: Any, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
            name = getattr(fn, "__name__", None) or fn.fn.__name__
            if warmup:
                return run(fn, *args, grid=grid, warmup=warmup, **kwargs)
            number = recorder._take(name)
            if number is None:
                return run(fn, *args, grid=grid, warmup=warmup, **kwargs)
            bound = recorder._bind(fn, args, kwargs)
            before = recorder._before(bound)
            result = run(fn, *args, grid=grid, warmup=warmup, **kwargs)
            try:
                grid_value = grid(bound | {k: v for k, v in kwargs.items() if k not in bound}) if callable(grid) else grid
                grid3 = tuple(int(g) for g in grid_value) + (1,) * (3 - len(tuple(grid_value)))
                recorder._write(_PendingLaunch(name, number, "interpreter", (grid3[0], grid3[1], grid3[2]), bound,
                                               before, _constexpr_names(fn), {}, {}))
            except Exception as exc:  # recording must never break the program
                print(f"kstrata record: launch of {name} not recorded: {type(exc).__name__}: {exc}", file=sys.stderr)
            return result

        return wrapper

    @staticmethod
    def _bind(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        py = getattr(fn, "fn", fn)
        params = {k: v for k, v in kwargs.items() if k in fn.arg_names}
        bound = inspect.signature(py).bind(*args, **params)
        bound.apply_defaults()
        return dict(bound.arguments)

    # -- shared -----------------------------------------------------------------------------------
    def _before(self, bound: dict[str, Any]) -> dict[str, Any]:
        import torch

        if any(isinstance(v, torch.Tensor) and v.is_cuda for v in bound.values()):
            torch.cuda.synchronize()
        return {k: v.detach().clone() for k, v in bound.items() if isinstance(v, torch.Tensor)}

    def _write(self, launch: _PendingLaunch) -> None:
        import numpy as np
        import torch

        from kstrata.ir.launch import LaunchRecord, ScalarArg, TensorArg

        before, name, number = launch.before, launch.name, launch.number
        if any(t.is_cuda for t in before.values()):
            torch.cuda.synchronize()
        records: list[TensorArg | ScalarArg] = []
        #: where each tensor's storage lay (address, bytes): lets the optimizer prove that no written buffer
        #: overlaps another argument on the recorded launches (noalias-args, ld-nc)
        storage: dict[str, list[int]] = {}
        for pname, value in launch.bound.items():
            if pname in launch.constexpr:
                continue
            if isinstance(value, torch.Tensor):
                after = value.detach()
                written = not torch.equal(_as_bytes(before[pname]), _as_bytes(after))
                snapshot = None
                if self.snapshots:
                    snapshot = f"{name}-{number}.{pname}.npy"
                    data = before[pname].cpu().clone(memory_format=torch.contiguous_format)  # standard strides
                    array = data.view(torch.uint8).numpy() if data.dtype in (torch.bfloat16,) or \
                        (data.dtype.itemsize == 1 and data.dtype.is_floating_point) else data.numpy()
                    np.save(self.out_dir / snapshot, array)
                storage[pname] = [int(value.untyped_storage().data_ptr()), int(value.untyped_storage().nbytes())]
                records.append(TensorArg(pname, str(value.dtype).removeprefix("torch."), tuple(value.shape),
                                         tuple(value.stride()), int(value.storage_offset()),
                                         value.untyped_storage().nbytes() // max(value.element_size(), 1), written,
                                         snapshot))
            elif isinstance(value, bool | int | float):
                from triton.runtime.jit import mangle_type

                # the compiled signature's type when known (Inductor declares i64 where Python would say i32)
                records.append(ScalarArg(pname, launch.types.get(pname) or mangle_type(value), value))
            elif value is None:
                continue
            else:
                raise TypeError(f"argument {pname} of type {type(value).__name__} cannot be recorded")
        meta = dict(launch.meta)
        meta["extra"] = {**meta.get("extra", {}), "storage": storage}
        record = LaunchRecord(name, launch.target, launch.grid, tuple(records), **meta)
        record.save(self.out_dir / f"{name}-{number}.json")


#: Inductor's autotuner: the functions whose launches benchmark configs (`CachingAutotuner.bench`, called for every
#: config by `benchmark_all_configs` and by coordinate descent).
_AUTOTUNE_MODULE = "torch._inductor.runtime.triton_heuristics"
_AUTOTUNE_FUNCTIONS = frozenset({"bench", "benchmark_all_configs", "coordinate_descent_tuning", "benchmark_one_config"})


def _in_autotuning(depth: int = 40) -> bool:
    """Whether this launch comes from Inductor's autotuner benchmarking a config (a caller's frame is one of its
    benchmarking functions), not from the program."""
    frame: Any = sys._getframe(2)
    for _ in range(depth):
        if frame is None:
            return False
        if frame.f_code.co_name in _AUTOTUNE_FUNCTIONS and frame.f_globals.get("__name__") == _AUTOTUNE_MODULE:
            return True
        frame = frame.f_back
    return False


def _as_bytes(t: Any) -> Any:
    """A tensor's elements as bytes, in logical order, for a bitwise comparison (NaNs compare equal), as one
    flat view. Viewing as bytes needs a last stride of 1: a channels-last tensor is copied into a contiguous
    one first, and a contiguous one is flattened, since PyTorch calls a tensor contiguous whatever the stride
    of a size-1 dimension (Inductor's GroupNorm statistics, shape (N, G, 1) with last stride 1024 on the
    H200: every launch of both GroupNorm kernels went unrecorded)."""
    import torch

    return t.contiguous().reshape(-1).view(torch.uint8)


def _constexpr_names(fn: Any) -> set[str]:
    """Parameters annotated `tl.constexpr` (also when annotations are strings)."""
    import triton.language as tl

    py = getattr(fn, "fn", fn)
    names = set()
    for name, param in inspect.signature(py).parameters.items():
        ann = param.annotation
        if ann is tl.constexpr or (isinstance(ann, str) and ann.split(".")[-1] == "constexpr"):
            names.add(name)
    return names


def install_from_env() -> None:
    """Install the recorder when `KSTRATA_RECORD_DIR` is set (called from the generated sitecustomize).

    It is installed when the program imports `triton`, not before: importing Triton at start-up would
    change what the program does. A program that sets `TRITON_INTERPRET=1` itself before importing Triton
    (as `python -m kstrata.testsuite.kernels.run --device cpu` does) gets Triton's `@jit` library
    functions (`tl.sum`, …) decorated as interpreted only if Triton is first imported after that; when
    sitecustomize imported it, 35 of the 47 suite kernels failed with "Cannot call @triton.jit'd outside
    of the scope of a kernel"."""
    out = os.environ.get(ENV_DIR)
    if not out:
        return
    Path(out).mkdir(parents=True, exist_ok=True)
    recorder = LaunchRecorder(Path(out), int(os.environ.get(ENV_MAX, "1")), os.environ.get(ENV_SNAPSHOTS) == "1")
    import atexit

    from kstrata.agents.leave import before_leaving

    atexit.register(recorder.write_counts)
    before_leaving(recorder.write_counts)  # kstrata's job runners end with os._exit, which skips atexit
    if "triton" in sys.modules:
        recorder.install()
    else:
        sys.meta_path.insert(0, _AfterImport("triton", recorder.install))


class _AfterImport:
    """A meta-path finder that runs `callback` once, right after the module `name` has been executed."""

    def __init__(self, name: str, callback: Any) -> None:
        self.name = name
        self.callback = callback

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != self.name:
            return None
        import importlib.util

        sys.meta_path.remove(self)  # once, and so that finding the real spec does not come back here
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader, callback = spec.loader, self.callback
        real_exec = loader.exec_module

        def exec_module(module: Any) -> None:
            real_exec(module)
            try:
                callback()
            except Exception as exc:  # never break the program being recorded
                print(f"kstrata record: recorder not installed: {exc}", file=sys.stderr)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def record_command(command: list[str], out_dir: Path, max_per_kernel: int = 1, snapshots: bool = False,
                   timeout: float | None = None, env: dict[str, str] | None = None) -> tuple[int, list[Path]]:
    """Run `command` with the recorder installed (and `env` added to its environment); returns its exit
    code and the records written."""
    if not command:
        raise ValueError("no command to record")
    from kstrata.ir.files import make_dir

    make_dir(out_dir, "--out directory")
    # the program's processes add their counts to this file: one left by an earlier recording would be added to
    (out_dir / ".kstrata" / "launch-counts.json").unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="kstrata-record-") as shim:
        (Path(shim) / "sitecustomize.py").write_text(_SITECUSTOMIZE)
        child_env = {**os.environ, **(env or {})}
        child_env["PYTHONPATH"] = os.pathsep.join(x for x in (shim, child_env.get("PYTHONPATH", "")) if x)
        child_env.update({ENV_DIR: str(out_dir.resolve()), ENV_MAX: str(max_per_kernel),
                          ENV_SNAPSHOTS: "1" if snapshots else "0"})
        child_env.setdefault(ENV_STATIC_LAUNCHER, "0")
        proc = subprocess.run(command, env=child_env, timeout=timeout, check=False)
    return proc.returncode, sorted(out_dir.glob("*.json"))


def summarize(records: list[Path]) -> list[dict[str, Any]]:
    rows = []
    for path in records:
        data = json.loads(path.read_text())
        rows.append({"file": str(path), "kernel": data["kernel"], "target": data["target"], "grid": data["grid"],
                     "args": len(data["args"]), "written": [a["name"] for a in data["args"] if a.get("written")]})
    return rows
