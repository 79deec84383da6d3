"""Replay a recorded launch: fresh arguments shaped like the record, and a differential run of two binaries.

`replay_args(record, device, seed)` allocates every tensor argument with the recorded dtype, shape,
strides and storage size, fills it from `seed` (normal values for floating types, a small range for
integers, so that index arguments usually stay in bounds). `differential(a, b, record)` launches two bundles'
binaries on identical copies of those arguments and compares what they wrote, byte for byte, then times
both with `time_gpu`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kstrata.ir.bundle import KernelBundle
from kstrata.ir.launch import LaunchRecord, ScalarArg, TensorArg


def _dtype(name: str) -> Any:
    import torch

    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r} in the launch record")
    return dtype


def _fill(arg: TensorArg, gen: Any, device: str) -> Any:
    import torch

    dtype = _dtype(arg.dtype)
    numel = max(arg.storage_numel or 0, arg.needed_numel)
    if dtype.is_floating_point:
        flat = torch.randn(numel, generator=gen).to(dtype)
    elif dtype == torch.bool:
        flat = torch.rand(numel, generator=gen) > 0.5
    else:
        # Small non-negative integers: most integer inputs of kernels are indices or counts.
        flat = torch.randint(0, 8, (numel,), generator=gen).to(dtype)
    flat = flat.to(device)
    return flat.as_strided(arg.shape, arg.stride, arg.storage_offset)


def replay_args(record: LaunchRecord, device: str = "cuda", seed: int = 0) -> dict[str, Any]:
    """Arguments for one replay of `record`, by parameter name.

    Written tensors are filled like the others rather than poisoned: the record cannot tell an output
    from an in-out buffer, and a differential run starts both binaries from identical contents, so an
    element one of them fails to write still shows as a difference.
    """
    import torch

    gen = torch.Generator().manual_seed(seed)
    args: dict[str, Any] = {}
    for arg in record.args:
        args[arg.name] = arg.value if isinstance(arg, ScalarArg) else _fill(arg, gen, device)
    return args


@dataclass
class Differential:
    kernel: str
    equal: bool
    first_difference: dict[str, Any] | None = None
    timing_a: dict[str, Any] = field(default_factory=dict)
    timing_b: dict[str, Any] = field(default_factory=dict)

    @property
    def speedup(self) -> float:
        return float(self.timing_a["median_us"]) / float(self.timing_b["median_us"])


def differential(a: KernelBundle, b: KernelBundle, record: LaunchRecord, seed: int = 0, runs: int = 100) -> Differential:
    """Launch `a` and `b` on identical replays of `record`; compare the written tensors bytewise; time both."""
    import torch

    from .launch import LoadedKernel, time_gpu

    record.check_against(a.params)
    record.check_against(b.params)
    outputs = []
    timings = []
    for bundle in (a, b):
        loaded = LoadedKernel(bundle)
        args = replay_args(record, "cuda", seed)
        loaded.call_by_name(record.grid, args)
        torch.cuda.synchronize()
        outputs.append({t.name: args[t.name].clone() for t in record.args if isinstance(t, TensorArg)})

        def once(loaded: LoadedKernel = loaded, args: dict[str, Any] = args) -> None:
            loaded.call_by_name(record.grid, args)

        timings.append(time_gpu(once, runs=runs).to_json())
    first = None
    for name, x in outputs[0].items():
        y = outputs[1][name]
        xb, yb = x.contiguous().view(torch.uint8).flatten(), y.contiguous().view(torch.uint8).flatten()
        if not torch.equal(xb, yb):
            index = int((xb != yb).nonzero()[0, 0]) // max(x.element_size(), 1)
            first = {"argument": name, "element": index, "a": x.flatten()[index].item(), "b": y.flatten()[index].item()}
            break
    return Differential(a.name, first is None, first, timings[0], timings[1])
