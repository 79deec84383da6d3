"""Atomic read-modify-write kernels.

Owns: an int32 histogram built with `tl.atomic_add` (out-of-range values are skipped by the mask) and
a segmented max with `tl.atomic_max` on int32. Both accumulate into outputs the caller initialises
(`inout`), many lanes of one block hit the same address, and integer atomics make the result exact
whatever order the hardware applies them in.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import triton
import triton.language as tl

from .spec import KernelArgs, SuiteKernel


@triton.jit
def histogram_kernel(data_ptr, bins_ptr, n, n_bins, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    in_range = offs < n
    v = tl.load(data_ptr + offs, mask=in_range, other=0)
    # Values outside [0, n_bins) are dropped rather than clamped into the edge bins.
    mask = in_range & (v >= 0) & (v < n_bins)
    tl.atomic_add(bins_ptr + v, tl.full([BLOCK], 1, tl.int32), mask=mask, sem="relaxed")


def _histogram_args(gen: torch.Generator) -> KernelArgs:
    n, n_bins = 5003, 50
    return {
        "data_ptr": torch.randint(-5, n_bins + 5, (n,), generator=gen, dtype=torch.int32),
        "bins_ptr": torch.zeros(n_bins, dtype=torch.int32),
        "n": n,
        "n_bins": n_bins,
    }


def _histogram_ref(a: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    d = a["data_ptr"].long()
    d = d[(d >= 0) & (d < a["n_bins"])]
    counts = torch.bincount(d, minlength=a["n_bins"]).to(torch.int32)
    return {"bins_ptr": a["bins_ptr"] + counts}


@triton.jit
def segment_max_kernel(seg_ptr, val_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    seg = tl.load(seg_ptr + offs, mask=mask, other=0)
    v = tl.load(val_ptr + offs, mask=mask, other=0)
    tl.atomic_max(out_ptr + seg, v, mask=mask)


def _segment_max_args(gen: torch.Generator) -> KernelArgs:
    n, n_seg = 3001, 37
    seg = torch.randint(0, n_seg, (n,), generator=gen, dtype=torch.int32)
    # Segment 7 receives nothing and must keep its initial value.
    seg[seg == 7] = 8
    return {
        "seg_ptr": seg,
        "val_ptr": torch.randint(-(2**30), 2**30, (n,), generator=gen, dtype=torch.int32),
        "out_ptr": torch.full((n_seg,), torch.iinfo(torch.int32).min, dtype=torch.int32),
        "n": n,
    }


def _segment_max_ref(a: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    out = a["out_ptr"].clone()
    out.scatter_reduce_(0, a["seg_ptr"].long(), a["val_ptr"], reduce="amax", include_self=True)
    return {"out_ptr": out}


KERNELS = [
    SuiteKernel(
        name="histogram_atomic",
        fn=histogram_kernel,
        make_args=_histogram_args,
        grid=lambda a: (triton.cdiv(a["n"], 1024),),
        reference=_histogram_ref,
        outputs=("bins_ptr",),
        inout=("bins_ptr",),
        constexprs={"BLOCK": 1024},
        tags=("atomic", "atomic_add", "histogram", "masked-tail", "int32"),
        description="50-bin int32 histogram with relaxed tl.atomic_add; out-of-range values skipped",
    ),
    SuiteKernel(
        name="segment_max_atomic",
        fn=segment_max_kernel,
        make_args=_segment_max_args,
        grid=lambda a: (triton.cdiv(a["n"], 512),),
        reference=_segment_max_ref,
        outputs=("out_ptr",),
        inout=("out_ptr",),
        constexprs={"BLOCK": 512},
        tags=("atomic", "atomic_max", "scatter", "segmented-reduction", "masked-tail", "int32"),
        description="per-segment max of int32 values with tl.atomic_max into INT32_MIN-initialised slots",
    ),
]
