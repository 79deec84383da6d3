"""Trial files between eval's worker processes and the evaluator: large tensors as raw bytes, the rest as
`torch.save` data.

A trial of a KernelBench problem at its published size holds 19 GB (outputs and their float64 copies).
`torch.save` writes that through one zip stream (about 0.7 s per GiB on a tmpfs here); a tensor of at least
`RAW_BYTES` is instead written beside the file as raw bytes, by several threads at their own offsets
(`os.pwrite`: 0.45 s per GiB on one thread on the 2-core development machine, 0.38 s with four; what
threads give on a 16-core GPU host is not measured yet), and replaced in the
saved structure by a marker. Loading maps the raw files (`torch.from_file`, copy-on-write: nothing is read
until it is compared) and removes them.

The evaluator reads files the candidate's process wrote, so loading stays safe: the structure is read
with `torch.load(weights_only=True)`, a marker names a file beside it by a plain name and a dtype from a
fixed list, and the raw file must have exactly the bytes the shape needs. The writer's functions are bound
when this module is imported, before any candidate code runs (eval's worker imports it first), so a
candidate that patches `os.pwrite` or `torch.save` afterwards does not change what is written.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

#: Tensors of at least this many bytes are written raw (`KSTRATA_RAW_TRIAL_BYTES` overrides it: tests).
RAW_BYTES = int(os.environ.get("KSTRATA_RAW_TRIAL_BYTES", 1 << 26))
#: Bytes per write call (Linux writes at most about 2 GiB per call).
_CHUNK = 1 << 28
_THREADS = max(1, min(8, (os.cpu_count() or 1)))
_MARK = "__kstrata_raw__"
_NAME = re.compile(r"^[A-Za-z0-9_.-]+\.raw$")
_DTYPES = {str(d).removeprefix("torch."): d for d in (
    torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16, torch.int8,
    torch.uint8, torch.bool, torch.complex64, torch.complex128)}

_save: Callable[..., None] = torch.save
_load = torch.load
_pwrite = os.pwrite
_open = os.open
_close = os.close
_ftruncate = os.ftruncate
_from_file = torch.from_file


class TrialFileError(Exception):
    """A trial file that does not hold what it says (a missing or short raw file, an unknown dtype)."""


def _write_raw(t: torch.Tensor, path: Path) -> None:
    data = memoryview(t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().data)
    fd = _open(str(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        def write(lo: int) -> None:
            hi = min(lo + _CHUNK, len(data))
            while lo < hi:  # a write may be short
                lo += _pwrite(fd, data[lo:hi], lo)

        starts = range(0, len(data), _CHUNK)
        if len(starts) > 1 and _THREADS > 1:
            with ThreadPoolExecutor(min(_THREADS, len(starts))) as pool:
                list(pool.map(write, starts))
        else:
            for lo in starts:
                write(lo)
    finally:
        _close(fd)


def _write_raw_from_device(t: torch.Tensor, path: Path) -> None:
    """A device tensor copied straight into the mapped file: one pass through host memory instead of a copy
    to fresh host pages (about 1.3 GB/s on the H200 host, page faults) and then a write of that copy."""
    flat = t.detach().contiguous().reshape(-1)
    fd = _open(str(path), os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        _ftruncate(fd, flat.numel() * flat.element_size())
    finally:
        _close(fd)
    if flat.numel() == 0:
        return
    dst = _from_file(str(path), shared=True, size=flat.numel(), dtype=flat.dtype)
    step = max(1, _CHUNK // flat.element_size())
    for lo in range(0, flat.numel(), step):
        dst[lo:lo + step].copy_(flat[lo:lo + step])
    del dst


def save_trial(obj: Any, path: str | Path) -> None:
    """`torch.save(obj, path)` with every tensor of at least `RAW_BYTES` written raw beside it (a device
    tensor is copied into the raw file directly); smaller device tensors are saved as they are and load
    onto the CPU."""
    path = Path(path)
    count = [0]

    def strip(x: Any) -> Any:
        if isinstance(x, torch.Tensor) and x.numel() * x.element_size() >= RAW_BYTES \
                and str(x.dtype).removeprefix("torch.") in _DTYPES:
            name = f"{path.name}.{count[0]}.raw"
            count[0] += 1
            if x.device.type == "cpu":
                _write_raw(x, path.parent / name)
            else:
                _write_raw_from_device(x, path.parent / name)
            return {_MARK: name, "dtype": str(x.dtype).removeprefix("torch."), "shape": list(x.shape)}
        if isinstance(x, list):
            return [strip(v) for v in x]
        if isinstance(x, tuple):
            return tuple(strip(v) for v in x)
        if isinstance(x, dict):
            return {k: strip(v) for k, v in x.items()}
        return x

    _save(strip(obj), path)


def load_trial(path: str | Path, *, remove: bool = True) -> Any:
    """What `save_trial` saved, its raw tensors mapped; with `remove`, the files are deleted (the mappings
    stay valid). Raises `TrialFileError` when a raw file is missing, short or of an unknown dtype."""
    path = Path(path)
    data = _load(path, map_location="cpu", weights_only=True, mmap=True)
    used: list[Path] = []

    def restore(x: Any) -> Any:
        if isinstance(x, dict) and _MARK in x:
            name, dtype, shape = x.get(_MARK), x.get("dtype"), x.get("shape")
            if not isinstance(name, str) or not _NAME.match(name) or dtype not in _DTYPES or \
                    not isinstance(shape, list) or not all(isinstance(s, int) and s >= 0 for s in shape):
                raise TrialFileError(f"{path.name}: a malformed raw tensor marker")
            raw = path.parent / name
            numel = 1
            for s in shape:
                numel *= s
            dt = _DTYPES[dtype]
            need = numel * torch.empty((), dtype=dt).element_size()
            try:
                size = raw.stat().st_size
            except OSError:
                raise TrialFileError(f"{path.name}: its raw tensor {name} is missing") from None
            if size != need:
                raise TrialFileError(f"{path.name}: its raw tensor {name} has {size} bytes, its shape needs {need}")
            used.append(raw)
            return _from_file(str(raw), shared=False, size=numel, dtype=dt).reshape(shape)
        if isinstance(x, list):
            return [restore(v) for v in x]
        if isinstance(x, tuple):
            return tuple(restore(v) for v in x)
        if isinstance(x, dict):
            return {k: restore(v) for k, v in x.items()}
        return x

    try:
        return restore(data)
    finally:
        if remove:
            for p in [path, *used]:
                p.unlink(missing_ok=True)
            for p in path.parent.glob(f"{path.name}.*.raw"):  # any the structure did not name
                p.unlink(missing_ok=True)
