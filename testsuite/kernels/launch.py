"""Launch records for suite kernels: the launch a kernel's own `make_args` and `grid` describe, as a
`kstrata.launch/1` record, so that verification can replay a suite kernel without running a program.

The record's arguments are the kernel's runtime parameters exactly as its compiled bundle has them
(`KernelBundle.params`): constexprs and the integers Triton's launch-time specialization turns into
constexprs (a value of 1) are left out, using the same rule `build.specialization` applies when the
suite is compiled. With `snapshot_dir`, the inputs `make_args` produced are written there as `.npy`
files (raw bytes for dtypes NumPy lacks, as `kstrata record` does) and named by absolute path in
`TensorArg.snapshot`, so a replay can use the suite's meaningful inputs (valid indices, sorted segment
ids) instead of random ones.

Importing this module registers the suite's launches with `kstrata verify` (`register_launch_source`),
so that a suite kernel verifies without a launch record.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from kstrata.backends.verify import register_launch_source
from kstrata.ir.launch import Arg, LaunchRecord, ScalarArg, TensorArg

from .build import specialization
from .spec import SuiteKernel


def _snapshot(tensor: torch.Tensor, path: Path) -> None:
    import numpy as np

    data = tensor.detach().cpu().contiguous()
    # NumPy has no bfloat16 or fp8: their bytes are stored, as `kstrata record` stores them.
    raw = data.dtype == torch.bfloat16 or (data.dtype.itemsize == 1 and data.dtype.is_floating_point)
    np.save(path, data.view(torch.uint8).numpy() if raw else data.numpy())


def suite_launch_record(kernel: SuiteKernel, target: str, seed: int = 0,
                        snapshot_dir: Path | None = None) -> LaunchRecord:
    """The launch of `kernel` on the arguments `make_args` gives for `seed`, for `target` (`cuda:90`, …).

    The specialization (which parameters are runtime arguments, and their Triton types) is always the
    one of the seed the suite is compiled with, so the record fits the suite's bundle for any `seed`.
    """
    signature, constexprs, _ = specialization(kernel)
    args = kernel.make_args(torch.Generator().manual_seed(seed))
    grid = tuple(int(g) for g in kernel.grid(args))
    grid3 = grid + (1,) * (3 - len(grid))
    if snapshot_dir is not None:
        snapshot_dir.mkdir(parents=True, exist_ok=True)
    records: list[Arg] = []
    for name in kernel.param_names:
        if name in constexprs:
            continue
        value: Any = args[name]
        if isinstance(value, torch.Tensor):
            snapshot = None
            if snapshot_dir is not None:
                path = (snapshot_dir / f"{kernel.name}-{seed}.{name}.npy").resolve()
                _snapshot(value, path)
                snapshot = str(path)
            records.append(TensorArg(name, str(value.dtype).removeprefix("torch."), tuple(value.shape),
                                     tuple(value.stride()), int(value.storage_offset()),
                                     value.untyped_storage().nbytes() // max(value.element_size(), 1),
                                     written=name in kernel.outputs or name in kernel.inout, snapshot=snapshot))
        elif isinstance(value, bool | int | float):
            records.append(ScalarArg(name, signature[name], value))
        else:
            raise TypeError(f"suite kernel {kernel.name}: argument {name} of type {type(value).__name__} "
                            "cannot be put in a launch record")
    return LaunchRecord(kernel.fn_name, target, (grid3[0], grid3[1], grid3[2]), tuple(records),
                        num_warps=kernel.num_warps, num_stages=kernel.num_stages,
                        extra={"suite_kernel": kernel.name, "seed": seed})


def _known_suite_launch(bundle: Any) -> tuple[LaunchRecord, str] | None:
    """The launch of the suite kernel `bundle` is (same function name, parameters that fit), if any."""
    from kstrata.ir.launch import LaunchRecordError

    from . import all_kernels

    for kernel in all_kernels():
        if kernel.fn_name != bundle.name or bundle.target.backend in kernel.unsupported_backends:
            continue
        record = suite_launch_record(kernel, str(bundle.target))
        try:
            record.check_against(bundle.params)
        except LaunchRecordError:
            continue
        return record, f"the suite kernel {kernel.name}'s own launch (kstrata.testsuite.kernels)"
    return None


register_launch_source(_known_suite_launch)
