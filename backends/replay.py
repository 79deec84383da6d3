"""Replay a recorded launch: fresh and edge-value arguments shaped like the record, output comparison,
and a differential run of two binaries.

Inputs come in *input sets* (`input_sets`): the recorded snapshot when the record has one, random data
for each seed (normal values for floating types, small non-negative integers — most integer inputs of
kernels are indices or counts, so they usually stay in bounds — and the written tensors poisoned), and
two edge sets: floating tensors
salted with NaN, ±Inf, ±0.0, denormals and the extreme finite values, and integer tensors salted with
their type's extremes, 0 and -1. Integers are often addresses, so the original kernel may legitimately
fault on the integer edge set; such a set "does not apply" rather than failing the candidate.

Every tensor gets its own allocation with *redzones*: `REDZONE_BYTES` before and after the buffer, filled
with `REDZONE_BYTE`, checked after every launch (`redzone_violations`): a write outside a buffer is
caught even where a neighbour's program overwrites the stray element afterwards, or where nobody
compares the memory past the end. (Reads outside are compute-sanitizer's job, on a launch whose
buffers have no redzones and no shared pool.)

`compare_outputs` is the one comparison every dynamic check uses: bytes for integers; for floating
types bytes too, except that any NaN matches any NaN, unless a `Tolerance` is declared (ULPs or
relative/absolute error; NaN positions and infinities must still agree).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kstrata.ir.bundle import KernelBundle
from kstrata.ir.launch import LaunchRecord, ScalarArg, TensorArg
from kstrata.ir.tolerance import Tolerance

from .poison import poison_

#: The fraction of elements of an edge set that get a special value (the rest stay random).
EDGE_FRACTION = 0.25
#: Guard bytes before and after every buffer of a replay (a multiple of 256, so the buffer keeps the
#: alignment Triton's divisibility specialization assumes), and the byte they are filled with (as an
#: fp32 word 0xA5A5A5A5 is -2.9e-16, a value no kernel is likely to write by accident).
REDZONE_BYTES = 4096
REDZONE_BYTE = 0xA5
#: Buffers at least this large are filled on the device they are replayed on.
DEVICE_FILL_NUMEL = 1 << 24


@dataclass(frozen=True)
class InputSet:
    """One way of filling a replay's tensors."""

    label: str
    mode: str  # "random" | "edge-float" | "edge-int" | "snapshot"
    seed: int = 0

    @property
    def may_not_apply(self) -> bool:
        """Whether the original itself may fault on it (then the set is skipped, not failed)."""
        return self.mode == "edge-int"


def input_sets(record: LaunchRecord, seeds: int, base_dir: Path | None = None) -> list[InputSet]:
    """The input sets a dynamic check runs: snapshot (if recorded), `seeds` random seeds, the edge sets
    that apply to the record's tensor types."""
    sets: list[InputSet] = []
    tensors = [a for a in record.args if isinstance(a, TensorArg)]
    # Snapshot names are relative to the record's directory (kstrata record) or absolute.
    if tensors and all(a.snapshot and (base_dir is not None or Path(a.snapshot).is_absolute()) for a in tensors):
        sets.append(InputSet("recorded snapshot", "snapshot"))
    sets += [InputSet(f"random seed {s}", "random", s) for s in range(seeds)]
    if any(_dtype(a.dtype).is_floating_point for a in tensors):
        sets.append(InputSet("edge floats (NaN, ±Inf, ±0, denormals, extremes)", "edge-float", 1000))
    if any(not _dtype(a.dtype).is_floating_point and a.dtype != "bool" for a in tensors):
        sets.append(InputSet("edge integers (min, max, 0, -1)", "edge-int", 2000))
    return sets


def _dtype(name: str) -> Any:
    import torch

    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r} in the launch record")
    return dtype


def _float_specials(dtype: Any) -> Any:
    import torch

    info = torch.finfo(dtype)
    values = [float("nan"), float("inf"), float("-inf"), 0.0, -0.0, info.tiny, -info.tiny, info.max, -info.max,
              info.tiny * info.eps, -(info.tiny * info.eps), info.tiny / 2]
    # fp8 e4m3fn has no infinity: converting one gives NaN, which is still a special value worth having.
    return torch.tensor(values, dtype=torch.float64).to(dtype)


def _int_specials(dtype: Any) -> Any:
    import torch

    info = torch.iinfo(dtype)
    return torch.tensor([info.min, info.max, 0, -1 if info.min < 0 else 1, info.min + 1, info.max - 1], dtype=dtype)


def _fill(arg: TensorArg, gen: Any, device: str, mode: str, base_dir: Path | None, redzone: bool = False) -> Any:
    import numpy as np
    import torch

    dtype = _dtype(arg.dtype)
    numel = buffer_numel(arg)
    if device != "cpu" and numel >= DEVICE_FILL_NUMEL:
        # Large launches (past 2^31 elements) are filled where they run: on the host they would cost
        # tens of GB and seconds per input set. The device generator is seeded from the host one, so a
        # seed still gives the same inputs every time.
        gen = torch.Generator(device).manual_seed(int(torch.randint(0, 2**62, (1,), generator=gen)))
    where_: dict[str, Any] = {"device": device} if device != "cpu" and numel >= DEVICE_FILL_NUMEL else {}
    if dtype.is_floating_point:
        flat = torch.randn(numel, generator=gen, **where_).to(dtype)
    elif dtype == torch.bool:
        flat = torch.rand(numel, generator=gen, **where_) > 0.5
    else:
        flat = torch.randint(0, 8, (numel,), generator=gen, dtype=dtype, **where_)
    salted = (mode == "edge-float" and dtype.is_floating_point) or \
             (mode == "edge-int" and not dtype.is_floating_point and dtype != torch.bool)
    if salted and numel:
        specials = _float_specials(dtype) if dtype.is_floating_point else _int_specials(dtype)
        where = torch.rand(numel, generator=gen, **where_) < EDGE_FRACTION
        pick = torch.randint(0, len(specials), (numel,), generator=gen, dtype=torch.int32, **where_)
        flat = torch.where(where, specials.to(flat.device)[pick], flat)
    view = flat.as_strided(arg.shape, arg.stride, arg.storage_offset)
    if mode == "random" and arg.written:
        poison_(view)
    if mode == "snapshot" and arg.snapshot:
        data = torch.from_numpy(np.load((base_dir or Path()) / arg.snapshot))
        if data.dtype != dtype:  # dtypes numpy lacks are stored as raw bytes
            data = data.view(dtype)
        view.copy_(data.reshape(arg.shape))
    if not redzone:
        flat = flat.to(device)
        return flat.as_strided(arg.shape, arg.stride, arg.storage_offset)
    guard = REDZONE_BYTES // dtype.itemsize
    guarded = torch.empty(guard + numel + guard, dtype=dtype, device=device)
    guarded.view(torch.uint8).fill_(REDZONE_BYTE)
    guarded[guard:guard + numel].copy_(flat.to(device))
    return guarded.as_strided(arg.shape, arg.stride, arg.storage_offset + guard)


def buffer_numel(arg: TensorArg) -> int:
    """The elements of the buffer a record's tensor lives in (its storage, or what its view reaches)."""
    return max(arg.storage_numel or 0, arg.needed_numel)


def redzone_violations(args: dict[str, Any], record: LaunchRecord, launch: str) -> list[dict[str, Any]]:
    """The guard regions of `args` (made with `redzone=True`) that a launch wrote into: per buffer, the
    first and last byte offset written relative to the buffer's start (negative: before it), the number
    of bytes changed and `launch` (which launch it was)."""
    import torch

    found: list[dict[str, Any]] = []
    for arg in record.args:
        if not isinstance(arg, TensorArg):
            continue
        t = args[arg.name]
        raw = torch.empty(0, dtype=t.dtype, device=t.device).set_(t.untyped_storage()).view(torch.uint8)
        size = buffer_numel(arg) * t.element_size()
        if raw.numel() != 2 * REDZONE_BYTES + size:
            raise ValueError(f"argument {arg.name} has no redzones (made without redzone=True)")
        before, after = raw[:REDZONE_BYTES], raw[REDZONE_BYTES + size:]
        bad_before = (before != REDZONE_BYTE).nonzero().flatten().cpu()
        bad_after = (after != REDZONE_BYTE).nonzero().flatten().cpu()
        if not bad_before.numel() and not bad_after.numel():
            continue
        offsets = [int(i) - REDZONE_BYTES for i in bad_before.tolist()] + [size + int(i) for i in bad_after.tolist()]
        found.append({"buffer": arg.name, "buffer_bytes": size, "first_offset": min(offsets),
                      "last_offset": max(offsets), "bytes_changed": len(offsets), "launch": launch})
    return found


def describe_violation(v: dict[str, Any]) -> str:
    """One line for a redzone violation: buffer, offset, launch."""
    first, size = v["first_offset"], v["buffer_bytes"]
    where = (f"{-first} bytes before its start" if first < 0 else "the first byte past its end" if first == size
             else f"{first - size} bytes past its end")
    return (f"wrote outside buffer {v['buffer']} ({size} bytes): {v['bytes_changed']} guard bytes changed, the "
            f"first at {where} (launch: {v['launch']})")


def replay_args(record: LaunchRecord, device: str = "cuda", seed: int = 0, *, mode: str = "random",
                base_dir: Path | None = None, redzone: bool = False) -> dict[str, Any]:
    """Arguments for one replay of `record`, by parameter name.

    In the random sets, the tensors the record marks as written are poisoned beforehand, so an element a
    kernel fails to write keeps a value no computation leaves (the record cannot tell an output from an
    in-out buffer, but both kernels of a comparison start from the same poison, so the comparison stays
    fair). The snapshot and edge sets keep their contents there: in-out buffers get meaningful data too.
    With `redzone`, every tensor sits in its own allocation between two guard regions (`redzone_violations`).
    """
    import torch

    gen = torch.Generator().manual_seed(seed)
    args: dict[str, Any] = {}
    for arg in record.args:
        args[arg.name] = arg.value if isinstance(arg, ScalarArg) else _fill(arg, gen, device, mode, base_dir, redzone)
    return args


def clone_args(args: dict[str, Any]) -> dict[str, Any]:
    """A deep copy that keeps each tensor's storage layout (views of a larger storage stay views)."""
    import torch

    copies: dict[str, Any] = {}
    for name, value in args.items():
        if isinstance(value, torch.Tensor):
            storage = torch.empty(0, dtype=value.dtype, device=value.device).set_(value.untyped_storage())
            copies[name] = storage.clone().as_strided(value.shape, value.stride(), value.storage_offset())
        else:
            copies[name] = value
    return copies


def _storage(t: Any) -> Any:
    """The whole storage behind `t`, on its device (a launch past 2^31 elements is compared on the GPU)."""
    import torch

    return torch.empty(0, dtype=t.dtype, device=t.device).set_(t.untyped_storage()).detach()


def _ordered(bits: Any, width: int) -> Any:
    """Sign-magnitude float bits as integers ordered like the floats (so ULP distance is a difference)."""
    import torch

    b = bits.to(torch.int64) & ((1 << width) - 1)
    magnitude = b & ((1 << (width - 1)) - 1)
    return torch.where((b >> (width - 1)) != 0, -magnitude, magnitude)


#: Elements compared at a time: a float64 copy of a chunk and its masks are a few hundred MB, where whole
#: storages of a published-size launch (6.4 GB of fp32, task gaps/03) took 12 GB a float64 copy and ran the
#: differential run out of GPU memory (H100, 2026-12-07).
COMPARE_CHUNK = 1 << 25


def _same_chunk(x: Any, y: Any, xb: Any, yb: Any, width: int, tolerance: Tolerance | None) -> Any:
    """Per element of one chunk: equal bits, both NaN, or within `tolerance` (finite)."""
    import torch

    same = xb == yb
    if x.dtype.is_floating_point:
        xf, yf = x.to(torch.float64), y.to(torch.float64)
        same |= torch.isnan(xf) & torch.isnan(yf)
        if tolerance is not None and not tolerance.exact:
            finite = torch.isfinite(xf) & torch.isfinite(yf)
            close = (xf - yf).abs() <= tolerance.atol + tolerance.rtol * yf.abs()
            if tolerance.ulp:
                close |= (_ordered(xb, width) - _ordered(yb, width)).abs() <= tolerance.ulp
            same |= finite & close
    return same


def compare_outputs(a: dict[str, Any], b: dict[str, Any], names: list[str],
                    tolerance: Tolerance | None = None, redzone: bool = False,
                    chunk: int = COMPARE_CHUNK) -> dict[str, Any] | None:
    """The first element where `a` and `b` differ among the tensors `names` (whole storages are
    compared, so a write outside a view counts), or None. Compared `chunk` elements at a time, so the
    comparison's own memory does not grow with the tensors."""
    import torch

    for name in names:
        x, y = _storage(a[name]), _storage(b[name])
        guard = REDZONE_BYTES // x.element_size()
        if redzone:  # the guards are checked by `redzone_violations`; offsets count from the buffer's start
            x, y = x[guard:x.numel() - guard], y[guard:y.numel() - guard]
        if x.dtype != y.dtype or x.numel() != y.numel():
            return {"argument": name, "reason": f"{x.dtype}[{x.numel()}] vs {y.dtype}[{y.numel()}]"}
        width = x.element_size() * 8
        int_view = {8: torch.uint8, 16: torch.int16, 32: torch.int32, 64: torch.int64}[width]
        xb, yb = x.view(int_view), y.view(int_view)
        first, mismatches = -1, 0
        for start in range(0, x.numel(), chunk):
            end = min(start + chunk, x.numel())
            same = _same_chunk(x[start:end], y[start:end], xb[start:end], yb[start:end], width, tolerance)
            bad = int((~same).sum())
            if bad and first < 0:  # argmax takes the first maximum: the chunk's first mismatch
                first = start + int(torch.argmax((~same).to(torch.uint8)))
            mismatches += bad
        if first >= 0:
            diff: dict[str, Any] = {"argument": name, "element": first, "a": x[first].item(), "b": y[first].item()}
            if x.dtype.is_floating_point:
                diff["a_bits"], diff["b_bits"] = hex(int(xb[first]) & ((1 << width) - 1)), \
                    hex(int(yb[first]) & ((1 << width) - 1))
            diff["mismatches"] = mismatches
            return diff
    return None


@dataclass
class Differential:
    kernel: str
    equal: bool
    first_difference: dict[str, Any] | None = None
    timing_a: dict[str, Any] = field(default_factory=dict)
    timing_b: dict[str, Any] = field(default_factory=dict)
    #: Whether the outputs are bit-identical (they may be equal only within a tolerance).
    exact: bool = True
    #: Writes outside a buffer (`redzone_violations`), and whose launch made them ("original"/"candidate").
    out_of_bounds: list[dict[str, Any]] = field(default_factory=list)
    out_of_bounds_by: str | None = None

    @property
    def speedup(self) -> float:
        return float(self.timing_a["median_us"]) / float(self.timing_b["median_us"])


def differential(a: KernelBundle, b: KernelBundle, record: LaunchRecord, seed: int = 0, runs: int = 100, *,
                 mode: str = "random", base_dir: Path | None = None, tolerance: Tolerance | None = None,
                 on_stage: Any = None) -> Differential:
    """Launch `a` and `b` on identical replays of `record`; compare the tensors (bytes, or within
    `tolerance`); time both when `runs` > 0. `on_stage(name)` is called before each kernel runs, so a
    caller watching a child process knows which one crashed."""
    import torch

    from .launch import LoadedKernel
    from .timing import time_gpu

    record.check_against(a.params)
    record.check_against(b.params)
    inputs = replay_args(record, "cuda", seed, mode=mode, base_dir=base_dir, redzone=True)
    outputs = []
    timings = []
    for which, bundle in (("original", a), ("candidate", b)):
        if on_stage is not None:
            on_stage(which)
        loaded = LoadedKernel(bundle)
        args = clone_args(inputs)
        loaded.call_by_name(record.grid, args)
        torch.cuda.synchronize()
        stray = redzone_violations(args, record, f"{which}, {mode} seed {seed}")
        if stray:
            return Differential(a.name, False, None, out_of_bounds=stray, out_of_bounds_by=which)
        outputs.append(args)
        if runs > 0:
            scratch = clone_args(inputs)

            def once(loaded: LoadedKernel = loaded, scratch: dict[str, Any] = scratch) -> None:
                loaded.call_by_name(record.grid, scratch)

            timings.append(time_gpu(once, runs=runs, span="device").to_json())
            stray = redzone_violations(scratch, record, f"{which}, one of the {runs} timed launches")
            if stray:
                return Differential(a.name, False, None, out_of_bounds=stray, out_of_bounds_by=which)
            # at a published size each copy is gigabytes (task gaps/03: 12.9 GB of arguments): the timing's
            # scratch goes before the next copy is made, and the inputs before the comparison
            del scratch, once
    del inputs
    if on_stage is not None:
        on_stage("compare")
    names = [t.name for t in record.args if isinstance(t, TensorArg)]
    first = compare_outputs(outputs[0], outputs[1], names, tolerance, redzone=True)
    exact = first is None and (tolerance is None or
                               compare_outputs(outputs[0], outputs[1], names, redzone=True) is None)
    timing_a, timing_b = timings if timings else ({}, {})
    return Differential(a.name, first is None, first, timing_a, timing_b, exact)
