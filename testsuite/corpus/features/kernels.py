"""Triton kernels for the features the suite and the corpus lack (see build.py); their IR is in cuda_90/ and hip_gfx942/."""

import triton
import triton.language as tl
from triton.language.extra import libdevice


@triton.jit
def k_block_ptr(a_ptr, b_ptr, M, N, sm, sn, BM: tl.constexpr, BN: tl.constexpr):
    pid = tl.program_id(0)
    a = tl.make_block_ptr(a_ptr, (M, N), (sm, sn), (pid * BM, 0), (BM, BN), (1, 0))
    b = tl.make_block_ptr(b_ptr, (M, N), (sm, sn), (pid * BM, 0), (BM, BN), (1, 0))
    for i in range(0, N, BN):  # noqa: B007 (the loop counter names the scf.for induction variable)
        x = tl.load(a, boundary_check=(0, 1), padding_option="zero")
        tl.store(b, x * 2, boundary_check=(0, 1))
        a = tl.advance(a, (0, BN))
        b = tl.advance(b, (0, BN))


@triton.jit
def k_misc(x_ptr, y_ptr, z_ptr, lock, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(x_ptr + offs, mask=m, other=1.0, cache_modifier=".cg", eviction_policy="evict_last")
    y = tl.sqrt_rn(x) + tl.div_rn(x, x + 1.0) + libdevice.tanh(x) + tl.clamp(x, -1.0, 1.0)
    h = tl.histogram(offs % 8, 8)
    j = tl.join(x, y)
    a, b = tl.split(j)
    c = tl.cat(a, b, can_reorder=True)
    r = tl.reshape(c, (BLOCK, 2), can_reorder=True)
    s = tl.sum(r, axis=1)
    tl.store(y_ptr + offs, s + tl.sum(h).to(tl.float32), mask=m, cache_modifier=".wt")
    old = tl.atomic_cas(lock, 0, 1)
    tl.atomic_xchg(z_ptr + offs, old.to(tl.float32), mask=m)
    tl.device_assert(n > 0, "n must be positive")
    tl.device_print("n", n)
    ip = tl.cast(x_ptr, tl.int64)
    tl.store(z_ptr + offs, tl.cast(ip, tl.pointer_type(tl.float32)).to(tl.int64, bitcast=True).to(tl.float32), mask=m)


@triton.jit
def k_dot(a_ptr, b_ptr, c_ptr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    rm = tl.arange(0, BM)
    rn = tl.arange(0, BN)
    rk = tl.arange(0, BK)
    a = tl.load(a_ptr + rm[:, None] * BK + rk[None, :])
    b = tl.load(b_ptr + rk[:, None] * BN + rn[None, :])
    acc = tl.dot(a, b, input_precision="tf32x3")
    acc += tl.dot(tl.trans(tl.trans(a)), b, input_precision="ieee")
    tl.store(c_ptr + rm[:, None] * BN + rn[None, :], acc)


@triton.jit
def k_desc(a_ptr, c_ptr, M, N, BM: tl.constexpr, BN: tl.constexpr):
    desc = tl.make_tensor_descriptor(a_ptr, shape=[M, N], strides=[N, 1], block_shape=[BM, BN])
    out = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[N, 1], block_shape=[BM, BN])
    pid = tl.program_id(0)
    x = desc.load([pid * BM, 0])
    out.store([pid * BM, 0], x + 1)


@triton.jit
def k_mma_pipe(a_ptr, b_ptr, c_ptr, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    rm = tl.arange(0, BM)
    rn = tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), tl.float32)
    for k in tl.range(0, K, BK, num_stages=3):
        a = tl.load(a_ptr + rm[:, None] * K + (k + rk)[None, :])
        b = tl.load(b_ptr + (k + rk)[:, None] * BN + rn[None, :])
        acc = tl.dot(a, b, acc)
    tl.store(c_ptr + rm[:, None] * BN + rn[None, :], acc.to(tl.float16))
