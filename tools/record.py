"""`kstrata record -- CMD ...`: record the Triton kernel launches of a real program as launch records.

The program runs in a child process whose Python loads a small start-up module (through a
`sitecustomize.py` on `PYTHONPATH`) that wraps `JITFunction.run` (and the interpreter's
`InterpretedFunction.run`): the first launches of each kernel (`--max-per-kernel`) are written to
`OUT/<kernel>-<n>.json` as `kstrata.launch/1` records, with which tensors the launch changed and,
with `--snapshots`, the input contents before the launch (`.npy`, raw bytes for dtypes numpy lacks).

`TRITON_INTERPRET=1` must be set in the environment of `kstrata record` itself to record interpreted
launches. Limits: a program that installs its own `sitecustomize` shadows ours (it is then not recorded);
recording synchronizes the device around the recorded launches, so it slows the program down.
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
from pathlib import Path
from typing import Any

ENV_DIR = "KSTRATA_RECORD_DIR"
ENV_MAX = "KSTRATA_RECORD_MAX"
ENV_SNAPSHOTS = "KSTRATA_RECORD_SNAPSHOTS"

_SITECUSTOMIZE = """# written by kstrata record: install the launch recorder in this interpreter
try:
    from kstrata.tools.record import install_from_env as _kstrata_install
    _kstrata_install()
except Exception as _exc:  # never break the program being recorded
    import sys
    print(f"kstrata record: recorder not installed: {_exc}", file=sys.stderr)
"""


class LaunchRecorder:
    def __init__(self, out_dir: Path, max_per_kernel: int = 1, snapshots: bool = False) -> None:
        self.out_dir = out_dir
        self.max_per_kernel = max_per_kernel
        self.snapshots = snapshots
        self.counts: Counter[str] = Counter()
        self.lock = threading.Lock()

    def _take(self, name: str) -> int | None:
        with self.lock:
            if self.counts[name] >= self.max_per_kernel:
                return None
            self.counts[name] += 1
            return self.counts[name]

    def install(self) -> None:
        """Wrap the launch of compiled kernels, or, under `TRITON_INTERPRET=1`, of interpreted ones (wrapping
        both breaks the interpreter, which runs nested `@jit` helpers through its own path)."""
        from triton import knobs

        if knobs.runtime.interpret:
            from triton.runtime import interpreter

            interpreter.InterpretedFunction.run = self._wrap(interpreter.InterpretedFunction.run, interpreted=True)
        else:
            from triton.runtime import jit

            jit.JITFunction.run = self._wrap(jit.JITFunction.run, interpreted=False)

    def _wrap(self, run: Any, interpreted: bool) -> Any:
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
                recorder._write(fn, name, number, bound, before, grid, result, interpreted, kwargs)
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

    def _before(self, bound: dict[str, Any]) -> dict[str, Any]:
        import torch

        if any(isinstance(v, torch.Tensor) and v.is_cuda for v in bound.values()):
            torch.cuda.synchronize()
        return {k: v.detach().clone() for k, v in bound.items() if isinstance(v, torch.Tensor)}

    def _write(self, fn: Any, name: str, number: int, bound: dict[str, Any], before: dict[str, Any], grid: Any,
               compiled: Any, interpreted: bool, kwargs: dict[str, Any]) -> None:
        import numpy as np
        import torch

        from kstrata.ir.launch import LaunchRecord, ScalarArg, TensorArg
        from kstrata.ir.triton_layout import base32_key

        if any(t.is_cuda for t in before.values()):
            torch.cuda.synchronize()
        grid_value = grid(bound | {k: v for k, v in kwargs.items() if k not in bound}) if callable(grid) else grid
        grid3 = tuple(int(g) for g in grid_value) + (1,) * (3 - len(tuple(grid_value)))
        constexpr: set[str] = set()
        target = "interpreter"
        meta: dict[str, Any] = {}
        if not interpreted and compiled is not None:
            signature = getattr(compiled.src, "signature", {})
            constexpr = {k for k, v in signature.items() if v == "constexpr"}
            md = compiled.metadata
            target = f"{md.target.backend}:{md.target.arch}"
            meta = {"num_warps": md.num_warps, "num_stages": md.num_stages, "cache_key": md.hash,
                    "override_key": base32_key(compiled.src.hash()) if hasattr(compiled.src, "hash") else None}
        else:
            constexpr = _constexpr_names(fn)
        records: list[TensorArg | ScalarArg] = []
        for pname, value in bound.items():
            if pname in constexpr:
                continue
            if isinstance(value, torch.Tensor):
                after = value.detach()
                written = not torch.equal(before[pname].view(torch.uint8) if before[pname].dim() else before[pname],
                                          after.view(torch.uint8) if after.dim() else after)
                snapshot = None
                if self.snapshots:
                    snapshot = f"{name}-{number}.{pname}.npy"
                    data = before[pname].cpu().contiguous()
                    array = data.view(torch.uint8).numpy() if data.dtype in (torch.bfloat16,) or \
                        (data.dtype.itemsize == 1 and data.dtype.is_floating_point) else data.numpy()
                    np.save(self.out_dir / snapshot, array)
                records.append(TensorArg(pname, str(value.dtype).removeprefix("torch."), tuple(value.shape),
                                         tuple(value.stride()), int(value.storage_offset()),
                                         value.untyped_storage().nbytes() // max(value.element_size(), 1), written,
                                         snapshot))
            elif isinstance(value, bool | int | float):
                from triton.runtime.jit import mangle_type

                records.append(ScalarArg(pname, mangle_type(value), value))
            elif value is None:
                continue
            else:
                raise TypeError(f"argument {pname} of type {type(value).__name__} cannot be recorded")
        record = LaunchRecord(name, target, (grid3[0], grid3[1], grid3[2]), tuple(records), **meta)
        record.save(self.out_dir / f"{name}-{number}.json")


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
    """Install the recorder when `KSTRATA_RECORD_DIR` is set (called from the generated sitecustomize)."""
    out = os.environ.get(ENV_DIR)
    if not out:
        return
    Path(out).mkdir(parents=True, exist_ok=True)
    LaunchRecorder(Path(out), int(os.environ.get(ENV_MAX, "1")), os.environ.get(ENV_SNAPSHOTS) == "1").install()


def record_command(command: list[str], out_dir: Path, max_per_kernel: int = 1, snapshots: bool = False,
                   timeout: float | None = None) -> tuple[int, list[Path]]:
    """Run `command` with the recorder installed; returns its exit code and the records written."""
    if not command:
        raise ValueError("no command to record")
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="kstrata-record-") as shim:
        (Path(shim) / "sitecustomize.py").write_text(_SITECUSTOMIZE)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(x for x in (shim, env.get("PYTHONPATH", "")) if x)
        env.update({ENV_DIR: str(out_dir.resolve()), ENV_MAX: str(max_per_kernel), ENV_SNAPSHOTS: "1" if snapshots else "0"})
        proc = subprocess.run(command, env=env, timeout=timeout, check=False)
    return proc.returncode, sorted(out_dir.glob("*.json"))


def summarize(records: list[Path]) -> list[dict[str, Any]]:
    rows = []
    for path in records:
        data = json.loads(path.read_text())
        rows.append({"file": str(path), "kernel": data["kernel"], "target": data["target"], "grid": data["grid"],
                     "args": len(data["args"]), "written": [a["name"] for a in data["args"] if a.get("written")]})
    return rows
