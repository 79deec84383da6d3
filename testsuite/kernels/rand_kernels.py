"""Counter-based random number kernels (named so as not to shadow the stdlib `random`).

Owns: dropout driven by `tl.rand(seed, offsets)` (fp32, also writing the keep mask), and raw
`tl.randint` with 64-bit offsets and a seed above 2**32, so both words of Philox's key and both low
counter words are used. The references re-implement Triton's Philox-4x32-10 and its uint32 -> float
conversion in numpy (from triton/language/random.py), so the random streams must agree bit for bit.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
import triton
import triton.language as tl

from .spec import KernelArgs, SuiteKernel

# Philox-4x32 constants as in triton/language/random.py (32-bit counters).
_KEY_A = np.uint64(0x9E3779B9)
_KEY_B = np.uint64(0xBB67AE85)
_ROUND_A = np.uint64(0xD2511F53)
_ROUND_B = np.uint64(0xCD9E8D57)
_MASK32 = np.uint64(0xFFFFFFFF)
_SHIFT32 = np.uint64(32)
#: The largest float32 scale with (2**31 - 1) * scale < 1 after rounding, as Triton uses.
_UNIFORM_SCALE = np.float32(4.6566127342e-10)


def philox_randint(seed: int, offsets: np.ndarray, n_rounds: int = 10) -> np.ndarray:
    """Triton's `tl.randint(seed, offsets)` on the host: the first Philox output word, as uint32.

    The counter is (offset low word, offset high word, 0, 0) and the key is (seed low, seed high); the
    high offset word is 0 for nonnegative int32 offsets, so one formula serves both offset widths.
    """
    off = offsets.astype(np.int64)
    # uint64 lanes hold 32-bit words, so a 32x32 product keeps its high half for umulhi.
    c0 = (off & 0xFFFFFFFF).astype(np.uint64)
    c1 = ((off >> 32) & 0xFFFFFFFF).astype(np.uint64)
    c2 = np.zeros_like(c0)
    c3 = np.zeros_like(c0)
    k0 = np.uint64(seed & 0xFFFFFFFF)
    k1 = np.uint64((seed >> 32) & 0xFFFFFFFF)
    for _ in range(n_rounds):
        prod_b = _ROUND_B * c2
        prod_a = _ROUND_A * c0
        c0 = (prod_b >> _SHIFT32) ^ c1 ^ k0
        c2 = (prod_a >> _SHIFT32) ^ c3 ^ k1
        c1 = prod_b & _MASK32
        c3 = prod_a & _MASK32
        k0 = (k0 + _KEY_A) & _MASK32
        k1 = (k1 + _KEY_B) & _MASK32
    return c0.astype(np.uint32)


def uint32_to_uniform(bits: np.ndarray) -> np.ndarray:
    """Triton's `uint_to_uniform_float` for 32-bit words: float32 in [0, 1)."""
    x = bits.view(np.int32).astype(np.int64)
    x = np.where(x < 0, -x - 1, x)
    # int32 -> float32 rounds to nearest, then one float32 multiply, exactly as the kernel does.
    return x.astype(np.float32) * _UNIFORM_SCALE


# ---------------------------------------------------------------------------------------------------
# Dropout
# ---------------------------------------------------------------------------------------------------


@triton.jit
def dropout_kernel(x_ptr, out_ptr, keep_ptr, n, p, seed, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    # The element's global offset is its Philox counter: the mask does not depend on the launch grid.
    keep = tl.rand(seed, offs) > p
    tl.store(out_ptr + offs, tl.where(keep, x / (1.0 - p), 0.0), mask=mask)
    tl.store(keep_ptr + offs, keep.to(tl.int8), mask=mask)


def _dropout_args(gen: torch.Generator) -> KernelArgs:
    n = 5003
    return {
        "x_ptr": torch.randn(n, generator=gen),
        "out_ptr": torch.empty(n),
        "keep_ptr": torch.empty(n, dtype=torch.int8),
        "n": n,
        "p": 0.3,
        "seed": int(torch.randint(2, 2**31 - 1, (1,), generator=gen)),
    }


def _dropout_ref(a: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    n = a["n"]
    u = uint32_to_uniform(philox_randint(a["seed"], np.arange(n, dtype=np.int64)))
    p = np.float32(a["p"])
    keep = torch.from_numpy(u > p)
    scale = torch.tensor(np.float32(1.0) - p)
    out = torch.where(keep, a["x_ptr"] / scale, torch.zeros(()))
    return {"out_ptr": out, "keep_ptr": keep.to(torch.int8)}


# ---------------------------------------------------------------------------------------------------
# Raw Philox words with 64-bit offsets and a 64-bit seed
# ---------------------------------------------------------------------------------------------------


@triton.jit
def philox_randint_kernel(out_ptr, n, seed, base, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    # base is an int64 beyond 2**32, so the counter's second word is nonzero.
    bits = tl.randint(seed, base + offs)
    tl.store(out_ptr + offs, bits.to(tl.int32, bitcast=True), mask=mask)


def _randint_args(gen: torch.Generator) -> KernelArgs:
    n = 3001
    return {
        "out_ptr": torch.empty(n, dtype=torch.int32),
        "n": n,
        "seed": 2**32 * 5 + int(torch.randint(2, 2**31 - 1, (1,), generator=gen)),
        "base": 2**32 * 3 + int(torch.randint(0, 2**20, (1,), generator=gen)),
    }


def _randint_ref(a: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    offsets = a["base"] + np.arange(a["n"], dtype=np.int64)
    bits = philox_randint(a["seed"], offsets)
    return {"out_ptr": torch.from_numpy(bits.view(np.int32).copy())}


KERNELS = [
    SuiteKernel(
        name="dropout_philox",
        fn=dropout_kernel,
        make_args=_dropout_args,
        grid=lambda a: (triton.cdiv(a["n"], 1024),),
        reference=_dropout_ref,
        outputs=("out_ptr", "keep_ptr"),
        constexprs={"BLOCK": 1024},
        # The keep mask is exact; out is x / (1 - p), and NVIDIA's fp32 division may be off by 2 ulp.
        rtol=1e-6,
        tags=("random", "dropout", "philox", "tl.rand", "masked-tail", "fp32", "int8"),
        description="dropout with p=0.3 from tl.rand(seed, offsets); also writes the int8 keep mask",
    ),
    SuiteKernel(
        name="philox_randint_i64",
        fn=philox_randint_kernel,
        make_args=_randint_args,
        grid=lambda a: (triton.cdiv(a["n"], 512),),
        reference=_randint_ref,
        outputs=("out_ptr",),
        constexprs={"BLOCK": 512},
        tags=("random", "philox", "tl.randint", "int64-offset", "masked-tail", "int32"),
        description="raw tl.randint words for int64 offsets past 2**32 and a seed past 2**32",
    ),
]
