"""2-D convolution + epilogue as an implicit GEMM in Triton: the chain's convolution computed by a Triton kernel
instead of cuDNN, with the pointwise ops after it (bias, scalings, activations, clamps, residuals, with
broadcasting) fused into its store, and optionally a following GroupNorm:

    out = epilogue(conv2d(x, W) (+ bias))                                       no core
    out = epilogue(group_norm(prologue(conv2d(x, W) (+ bias))))                 a GroupNorm after it

The GEMM: M = the output pixels of one image (H_out * W_out; the batch is grid axis 1), N = C_out,
K = C_in * KH * KW (PyTorch's weight order: W viewed as (C_out, K) is B transposed). A's tile is gathered
from the NCHW input through its strides (any stride, padding, dilation; a non-contiguous input needs no
copy): row m, column k = (ci, kh, kw) reads x[n, ci, oh * s - p + kh * d, ow * s - p + kw * d], zero
outside the image. The output is written once, in the task's contiguous NCHW layout (consecutive pixels
of one channel are consecutive addresses, so the store is coalesced along M); the input is read as it is,
not converted to channels-last (that would be one more pass over it, for a layout only the loads prefer).

The ways to compute the product (`strategy`):
- `dot`: `tl.dot` over BLOCK_K-deep steps (the K tail masked). fp16/bf16 operands on the tensor cores
  (fp32 accumulation); fp32 operands under `strict` with `input_precision="ieee"` (Triton's FMA dot: IEEE
  fp32 products and sums, as cuDNN's under TF32 off), under `tf32` with TF32 inputs (labelled, lower precision).
- `tf32x3`, `bf16x6`: `dot` with fp32 operands split over the tensor cores (Triton's `input_precision`: three
  TF32 products, or six products of bf16 parts; `tensorcore`'s docstring), admitted under `strict` by their
  measured error like any kernel. Measured on the H200 (2026-12-04, `template-probe-2026-12-04-split`,
  `-split2`): on 05 both within strict (relative L2 against float64 1.2-2.3e-7 and 0.8-0.9e-7, eager's 1.9e-7)
  but slower than `fmat`'s 676 us conv kernel (tf32x3 885-1613 us over BLOCK_K 16-128, bf16x6 946-1064 us:
  the K of 72 is 5 steps of 16, each three or six products waited on in turn); on 04, tf32x3 128x32 4 warps won
  the templates run (`templates-bench-2026-12-04-d`: 1428 us against `norm`'s 1795). Rendered for `tf32` they
  are `dot` with TF32 inputs.
- `fma`: a loop over input channels with the KH x KW taps unrolled, one outer product (BLOCK_M pixels x
  BLOCK_N channels, fp32 FMAs) per tap: no padding of a small K (72 = 8 x 9 here pads to 80 in 16-deep
  dot steps), no operand staging in shared memory. IEEE fp32 under every policy.
- `fmat`: the same products with the tile held as BLOCK_N channels x BLOCK_M pixels and the weight as (K, C_out),
  transposed back once for the epilogue. Triton's default layout puts a warp's lanes along the last dim: in
  `fma` that is the channels, so each thread needs every pixel of the tile and the compiled loop (cuda:90,
  the 256x32 2-warp schedule) converts the gathered pixels through shared memory at every tap (a barrier, 128
  shared loads a thread for 128 FMAs); in `fmat` the lanes run along pixels, the gather lands where the
  product needs it, and a tap costs a thread 4 pixel loads and 8 vector loads of one weight row for 128 FMAs
  (no shared memory in the loop; the epilogue's transpose converts once per tile).

GroupNorm (`group_norm` core, groups over channels of one image): the conv kernel writes the prologue's
value y into `out` and, per (image, pixel tile, channel tile, group the channel tile touches), the tile's
count, mean and M2 of y (`GroupTiles`): per channel a corrected two-pass over the tile's registers
(mean0 = sum/n, then d = y - mean0, mean = mean0 + sum(d)/n, M2 = sum(d^2) - sum(d)^2/n), the channels of
one group combined by Chan's formula in registers. No atomics: every slot has one writer. A second kernel
combines a group's partials with Chan's formula into mean and rstd per (image, group), in a fixed order (the
same bits every run); a third normalizes `out` in place (affine, epilogue), NORM_BLOCK pixels of one
plane a program (a schedule parameter of these instances). Traffic: the input once,
y written and read once, the output written once (1.75 GB on the 64 x 32 x 254 x 254 gap task) against
cuDNN then the `norm` template's split strategy (y written, read twice, output written: 2.28 GB), so the
partials are fused rather than composing with `norm`; recomputing the convolution instead of storing y
would cut the traffic to 0.8 GB but double the 19 GFLOP of FMA work that already bounds the kernel under
strict. Both this and `norm` are proposed; the tuner picks by measurement. Two variants were built and
measured on the H200 and not kept (2026-12-04, `template-probe-2026-12-04-b`). The first was one persistent
launch that took an image's normalized blocks 2-4 images after its conv tiles, so that y was read back from L2.
It ran 1438-1762 us against 1423-1541 us for the three launches: the conv tiles' issue rate fell from 55% to 41%.
The second computed the epilogue in `fmat`'s channels x pixels orientation, with no transposition, and was 5-6%
slower on both conv tasks (05: 722 against 681 us).

Overlapping the GroupNorm's passes with the convolution (`OVERLAP`, a schedule parameter of the instances with
a GroupNorm): the conv kernel is compute-bound under strict (04's at 820 us on an H100, the FMA work), the apply
pass memory-bound (y read and the output written: 1.06 GB on 04, about 275 us at the H200's copy bandwidth, an
estimate from sizes), and in sequence their times add. With OVERLAP = C the batch runs in C chunks of images: each
chunk's conv kernel on the caller's stream, then its statistics and apply kernels on a side stream of higher
priority, which waits for that chunk's convolution only, so that they can run while the next chunk's convolution
does (the priority asks the block scheduler to start the side stream's programs first as conv programs retire).
The caller's stream waits for the side stream before the forward returns, so what the evaluator's timer records
includes every pass, and the buffers the side stream uses (`out`, the partials, the statistics, all allocated on
the caller's stream) are freed only after it. Each chunk's kernels take views from the chunk's first image (every
offset inside them is relative). It needs the pointwise operands not to vary along the batch (`_overlap_refusal`).
On the CPU the chunks run one after another, and the results are the same bits as OVERLAP 1 (tested). Timed on
04 (H100, 2026-12-08, `template-probe-2026-12-08-overlap.md`, the first hint, forward medians with L2 flushed):
in sequence 1311 us (conv kernel 814, apply 378), in 2 chunks 1389, 4 chunks 1456, 8 chunks 1846. The apply
pass is not hidden: its kernels took as long (383-393 us) and the conv kernels more (1031-1141 us summed over the
chunks, their smaller grids ending in tails), so it stays in the space, unhinted.

Does not apply (the reason is reported): 1-D / 3-D and transposed convolutions, groups > 1 (a grouped
convolution is `groups` block-diagonal GEMMs, each K = C_in / groups deep: another grid axis and weight
indexing this kernel does not have), an asymmetric `padding='same'`, a batch above a grid axis' 65535,
other cores after the convolution (pooling, softmax, LayerNorm: their templates take PyTorch's
convolution output).

On a CPU tensor bf16 tiles are converted to fp32 before the dot (`UPCAST`: `tensorcore`'s docstring).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import nn

from kstrata.agents.templates.base import Params, cdiv, next_pow2
from kstrata.agents.templates.codegen import (
    ExprEmitter,
    Kernel,
    check_shapes,
    index_type,
    launch,
    leaf_kernel_args,
    tl_dtype,
)
from kstrata.agents.templates.graph import Chain, GraphError, Node, describe
from kstrata.agents.templates.norm import combine_lines
from kstrata.agents.templates.tensorcore import (
    ACC_PER_THREAD,
    MAX_BATCH,
    SMEM_BYTES,
    dtype_bytes,
    operand,
    ref,
    upcast,
)

NAME = "conv"
#: The strategies that compute fp32 products as sums of tensor-core products of split operands (Triton's
#: `input_precision`; the module docstring): IEEE fp32 is what `strict` admits, these are admitted by its
#: measured error against float64 like any other kernel.
SPLIT_STRATEGIES = ("tf32x3", "bf16x6")
SPACE: tuple[tuple[str, tuple[object, ...]], ...] = (
    ("strategy", ("dot", "fma", "fmat", *SPLIT_STRATEGIES)), ("BLOCK_M", (32, 64, 128, 256)), ("BLOCK_N", (16, 32, 64, 128)),
    ("BLOCK_K", (16, 32, 64, 128)), ("num_warps", (2, 4, 8)), ("num_stages", (1, 2, 3)), ("MAXNREG", (0, 128, 168)),
    ("PREFETCH", (0, 1)))
#: `PREFETCH` 1 (FMA strategies, at most PREFETCH_TAPS taps): the next input channel's taps are loaded before this
#: channel's products. Triton's pipeliner leaves these loads alone (num_stages 3 compiles to the same SASS), and
#: ptxas issues a channel's first loads at the loop's head, where the warp waits on them. What it costs depends on
#: how the kernel is specialized: 05's kernel for cuda:90 had 189 registers against 168 and 710 SASS a channel
#: against 668 in one compile (2026-12-07); compiled with the tests' launch record (every i32 argument divisible
#: by 16) the loop was the same with and without it (619 SASS, 576 FFMA; 04 at MAXNREG 168: 622). On an H100
#: (2026-12-07) 04's conv kernel ran 858 us with it and 817 without: the last hint.
PREFETCH_TAPS = 9
#: `MAXNREG` (0: ptxas chooses) caps an FMA strategy's registers a thread (Triton's `maxnreg`): a 64-thread program
#: at 255 registers leaves 4 programs an SM (2 warps a scheduler), at 168 six, at 128 eight. The loop needs about
#: 168 at 64 accumulators a thread; an epilogue heavier than the loop (04's GroupNorm statistics: 204) sets the
#: whole kernel's count. 04's conv kernel at 256x16, 2 warps: 878 us at 204 registers, 820 us capped at 168 (H100,
#: 2026-12-07, `template-probe-2026-12-07-conv-e`). Compiled here for cuda:90 the cap spilled 32 bytes (4 reloads a
#: channel) in one compile, and nothing with the tests' launch record (227 registers uncapped there, 204 on the H100).
#: Fewest fp32 accumulators a thread of the `fma` strategy may keep: ptxas -v for cuda:90 (Triton 3.6) on the gap
#: tasks' kernels gave 16 a thread (64x32 tiles, 4 warps; 32x32, 2 warps) 255 registers and 64-80 bytes of
#: spills, 32 or more a thread 71-225 registers and none (the dot strategy spilled at neither).
FMA_MIN_ACC = 32
#: The strategies that compute the product as FMA outer products (`fmat`: the tile held channels x pixels).
FMA_STRATEGIES = ("fma", "fmat")
#: The GroupNorm apply kernel's blocks (`NORM_BLOCK`, a schedule parameter of the instances with a GroupNorm: a
#: program normalizes one block of one image plane, 8 values a thread), the smallest first; the statistics
#: kernel takes the smallest.
NORM_BLOCKS = (1024, 2048, 4096)
NORM_BLOCK = NORM_BLOCKS[0]
#: `OVERLAP` (instances with a GroupNorm; 1: off) splits the batch into that many chunks of images: the conv kernel
#: runs chunk after chunk on the caller's stream, and each chunk's statistics and apply kernels run on a side
#: stream of higher priority once its convolution is done, beside the next chunk's (the module docstring).
OVERLAPS = (1, 2, 4, 8)

OVERLAP_HELPER = '''
import contextlib

_KSTRATA_SIDE = {}


def _kstrata_side(t):
    """The side stream a chunk's GroupNorm passes run on while the next chunk's convolution runs: of higher
    priority than the caller's, so that the SMs take its programs as the convolution's retire. None on the CPU,
    where the chunks run one after another."""
    if not t.is_cuda:
        return None
    s = _KSTRATA_SIDE.get(t.device)
    if s is None:
        s = _KSTRATA_SIDE[t.device] = torch.cuda.Stream(t.device, priority=-1)
    return s


@contextlib.contextmanager
def _kstrata_after(side):
    """Launch on `side`, after everything the caller's stream has queued so far (nothing changes on the CPU)."""
    if side is None:
        yield
        return
    side.wait_stream(torch.cuda.current_stream(side.device))
    with torch.cuda.stream(side):
        yield
'''


@dataclass(frozen=True)
class Conv:
    """The convolution as the kernel computes it."""

    n: int
    ci: int
    h: int
    w: int
    co: int
    kh: int
    kw: int
    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int]
    ho: int
    wo: int
    dtype: str
    x: str  # forward expression of the input
    weight: str  # ... of the (C_out, C_in, KH, KW) weight
    bias: str | None  # ... of the (C_out,) bias

    @property
    def k(self) -> int:
        return self.ci * self.kh * self.kw

    @property
    def hw(self) -> int:
        return self.ho * self.wo


def _pair(v: Any, what: str) -> tuple[int, int]:
    if isinstance(v, int):
        return (v, v)
    t = tuple(int(x) for x in v)
    if len(t) == 1:
        return (t[0], t[0])
    if len(t) != 2:
        raise GraphError(f"a 2-D convolution with a {len(t)}-element {what} {t}")
    return (t[0], t[1])


def _padding(p: Any, kernel: tuple[int, int], dilation: tuple[int, int]) -> tuple[int, int]:
    if p == "valid":
        return (0, 0)
    if p == "same":
        total = [d * (k - 1) for k, d in zip(kernel, dilation, strict=True)]
        if any(t % 2 for t in total):
            raise GraphError(f"padding='same' with kernel {kernel}, dilation {dilation}: asymmetric padding")
        return (total[0] // 2, total[1] // 2)
    return _pair(p, "padding")


def conv_of(chain: Chain) -> Conv:
    """The chain's head read as a 2-D convolution (GraphError: why this template does not compute it)."""
    h = chain.head
    if h is None or h.op != "conv":
        raise GraphError("the graph has no convolution" if h is None or h.op != "conv_transpose" else
                         "a transposed convolution: the template computes forward convolutions")
    if "module" in h.attrs:
        mod = chain.graph.model.get_submodule(h.attrs["module"])
        if not isinstance(mod, nn.Conv2d):
            raise GraphError(f"{h.attrs['module']}: a {type(mod).__name__}; the template computes 2-D convolutions")
        x = operand(h.args[0], "convolution's input")
        groups, stride, pad, dil = int(mod.groups), mod.stride, mod.padding, mod.dilation
        weight = f"self.{h.attrs['module']}.weight"
        wshape, wdtype = tuple(int(d) for d in mod.weight.shape), str(mod.weight.dtype).removeprefix("torch.")
        bias = None if mod.bias is None else f"self.{h.attrs['module']}.bias"
    else:
        if h.attrs["fn"] != "F.conv2d":
            raise GraphError(f"{h.name}: {h.attrs['fn']}; the template computes 2-D convolutions")
        names = ("input", "weight", "bias", "stride", "padding", "dilation", "groups")
        opts: dict[str, Any] = {"bias": None, "stride": 1, "padding": 0, "dilation": 1, "groups": 1}
        opts.update(zip(names, h.args, strict=False))
        opts.update(h.attrs["kwargs"])
        x = operand(opts["input"], "convolution's input")
        wn = operand(opts["weight"], "convolution's weight")
        groups, stride, pad, dil = int(opts["groups"]), opts["stride"], opts["padding"], opts["dilation"]
        weight, wshape, wdtype = ref(wn), wn.shape, wn.dtype
        bias = None
        if opts["bias"] is not None:
            bn = operand(opts["bias"], "convolution's bias")
            if bn.dtype != x.dtype or tuple(bn.shape) != (wshape[0],):
                raise GraphError(f"a convolution with a {bn.dtype} bias of shape {bn.shape}")
            bias = ref(bn)
    if groups != 1:
        raise GraphError(f"groups={groups}: a grouped convolution is {groups} block-diagonal GEMMs of K = C_in/groups; "
                         "the implicit GEMM here is one GEMM over all input channels (groups=1)")
    if len(x.shape) != 4:
        raise GraphError(f"a convolution of a rank-{len(x.shape)} input (the template takes batched NCHW)")
    if x.dtype != wdtype:
        raise GraphError(f"a convolution of a {x.dtype} input with a {wdtype} weight")
    n, ci, hh, ww = x.shape
    co, wci, kh, kw = wshape
    if wci != ci:
        raise GraphError(f"a convolution of {x.shape} with a weight of {wshape}")
    st, dl = _pair(stride, "stride"), _pair(dil, "dilation")
    pd = _padding(pad, (kh, kw), dl)
    ho = (hh + 2 * pd[0] - dl[0] * (kh - 1) - 1) // st[0] + 1
    wo = (ww + 2 * pd[1] - dl[1] * (kw - 1) - 1) // st[1] + 1
    if (n, co, ho, wo) != tuple(h.shape):
        raise GraphError(f"{h.name}: output {h.shape}, the template's geometry gives {(n, co, ho, wo)}")
    if n > MAX_BATCH:
        raise GraphError(f"a convolution over a batch of {n} (a grid axis takes {MAX_BATCH})")
    return Conv(n, ci, hh, ww, co, kh, kw, st, pd, dl, ho, wo, x.dtype, ref(x), weight, bias)


def _norm_of(chain: Chain, cv: Conv) -> int | None:
    """The GroupNorm's group count, None without a core (GraphError: a core the template does not fuse)."""
    core = chain.core
    if core is None:
        if chain.out_shape != chain.root.shape:
            raise GraphError(f"the epilogue broadcasts the convolution's output {chain.root.shape} to {chain.out_shape}")
        return None
    if core.op != "group_norm":
        raise GraphError(f"the graph has a {core.op} after the convolution; the template fuses pointwise ops and a GroupNorm")
    g = int(core.attrs["num_groups"])
    if chain.core_shape != chain.root.shape or chain.out_shape != chain.core_shape:
        raise GraphError("the pointwise ops around the GroupNorm broadcast the convolution's output")
    if cv.co % g:
        raise GraphError(f"GroupNorm of {g} groups over {cv.co} channels")
    for a in core.args[1:3]:
        if a is not None and (not isinstance(a, Node) or a.op != "param"):
            raise GraphError("a GroupNorm weight or bias that is not a parameter")
    if cv.n * cv.co * cdiv(cv.hw, NORM_BLOCK) > 2**31 - 1:
        raise GraphError(f"{cv.n * cv.co} image planes of {cdiv(cv.hw, NORM_BLOCK)} blocks: more programs than grid "
                         "axis 0 takes (2**31 - 1)")
    return g


def _overlap_refusal(chain: Chain) -> str | None:
    """Why the batch cannot be split into chunks of images (`OVERLAP`), None when it can: a GroupNorm to overlap,
    and no operand of the pointwise ops that varies along the batch (a chunk's kernels index its operands from
    the chunk's first image)."""
    if chain.core is None:
        return "no GroupNorm: nothing to overlap the convolution with"
    rank = len(chain.out_shape)
    for leaf in chain.leaves:
        if len(leaf.shape) == rank and leaf.shape[0] != 1:
            return f"{leaf.name} varies along the batch"
    return None


def _dot_precision(dtype: str, policy: str, strategy: str = "dot") -> str:
    if dtype != "float32":
        return ""
    if policy == "tf32":
        return ', input_precision="tf32"'  # a split strategy rendered for tf32 is the dot strategy with TF32 inputs
    return f', input_precision="{strategy}"' if strategy in SPLIT_STRATEGIES else ', input_precision="ieee"'


def applies(chain: Chain, policy: str = "strict") -> str | None:
    try:
        _norm_of(chain, conv_of(chain))
    except GraphError as e:
        return str(e)
    return None


def _k_blocks(k: int) -> int:
    """The BLOCK_K of (16, 32, 64) padding K least (the deepest of equals)."""
    return min((16, 32, 64), key=lambda b: (cdiv(k, b) * b, -b))


def space(chain: Chain) -> tuple[tuple[tuple[str, tuple[object, ...]], ...], tuple[tuple[str, object], ...]]:
    """128-pixel tiles, every output channel in one tile up to 64 (the input gathered once per pixel tile),
    the BLOCK_K padding K least; the dot strategy."""
    cv = conv_of(chain)
    bn = min(64, max(16, next_pow2(cv.co)))
    bm = min(128, max(32, next_pow2(cv.hw)))
    default: tuple[tuple[str, object], ...] = (("strategy", "dot"), ("BLOCK_M", bm), ("BLOCK_N", bn),
                                               ("BLOCK_K", _k_blocks(cv.k)), ("num_warps", 4), ("num_stages", 2),
                                               ("MAXNREG", 0), ("PREFETCH", 0))
    if _norm_of(chain, cv) is None:
        return SPACE, default
    return ((*SPACE, ("NORM_BLOCK", NORM_BLOCKS), ("OVERLAP", OVERLAPS)),
            (*default, ("NORM_BLOCK", NORM_BLOCK), ("OVERLAP", 1)))


def valid(chain: Chain, p: Params) -> bool:
    """Blocks no larger than their dim's power of two, the accumulator within registers, the dot's pipelined
    tiles within shared memory; `fma` has no BLOCK_K (its default stands) and no pipelining, and keeps at least
    FMA_MIN_ACC accumulators a thread."""
    cv = conv_of(chain)
    bm, bn, bk = p["BLOCK_M"], p["BLOCK_N"], p["BLOCK_K"]
    if bm > max(32, next_pow2(cv.hw)) or bn > max(16, next_pow2(cv.co)):
        return False
    if bm * bn > ACC_PER_THREAD * 32 * p["num_warps"]:
        return False
    if p.get("NORM_BLOCK", NORM_BLOCK) > max(NORM_BLOCK, next_pow2(cv.hw)):  # a block past the plane's power of two
        return False
    if p.get("OVERLAP", 1) > 1 and (p["OVERLAP"] > cv.n or _overlap_refusal(chain) is not None):
        return False
    if p["strategy"] in SPLIT_STRATEGIES and cv.dtype != "float32":
        return False  # a split of fp32 operands; fp16/bf16 ones go to the tensor cores as they are (`dot`)
    if p["MAXNREG"] and p["strategy"] not in FMA_STRATEGIES:  # the dot strategies' registers are ptxas's
        return False
    if p["PREFETCH"] and (p["strategy"] not in FMA_STRATEGIES or cv.kh * cv.kw > PREFETCH_TAPS):
        return False
    if p["strategy"] in FMA_STRATEGIES:
        return bool(bk == _k_blocks(cv.k) and p["num_stages"] == 1 and bm * bn >= FMA_MIN_ACC * 32 * p["num_warps"])
    if bk > max(16, next_pow2(cv.k)):
        return False
    return bool(p["num_stages"] * (bm * bk + bk * bn) * dtype_bytes(cv.dtype) <= SMEM_BYTES)


def hints(chain: Chain) -> list[Params]:
    """The FMA strategies at a few tile sizes (64 and 128 accumulators a thread, and the most warps that keep
    FMA_MIN_ACC a thread), and a wider dot tile. The `fma` 256x32 2-warp schedule won task 05 on the H200
    (2026-12-02: 1126 us against compile's 1517; 2026-12-03: 986 us against the 128x32 4-warp hint's 1210 and the
    dot default's 1859); `fmat`, whose loop has no layout conversion (the module docstring), comes first: it won
    both conv gap tasks on 2026-12-04 (05: 256x16, 2 warps, 726 us; 04 with its GroupNorm: 256x16, 4 warps,
    1515 us), found from these hints by the tuner's descent. 256x16 with 2 warps, 05's winner in
    `templates-bench-2026-12-04-d`, is the first hint now; with a GroupNorm it is capped at 168 registers
    (`MAXNREG`: 04's conv kernel 820 us there against 878 uncapped, H100, 2026-12-07). The last is the first
    with `PREFETCH`: on 04 (H100, 2026-12-07) its conv kernel ran 858 us against 817 without (torch.profiler, 5
    calls), while the forward's median was 1302 us against 1320: within the noise, not a win."""
    cv = conv_of(chain)
    bn = min(64, max(16, next_pow2(cv.co)))

    def warps(bm: int, acc: int) -> int:
        return max([w for w in (2, 4, 8) if bm * bn >= acc * 32 * w], default=2)

    groups = _norm_of(chain, cv)
    first = {"strategy": "fmat", "BLOCK_M": 256, "BLOCK_N": 16, "num_warps": 2, "num_stages": 1,
             "MAXNREG": 168 if groups else 0}
    # (`OVERLAP`, the batch in chunks whose passes run beside the next chunk's convolution, is not hinted: slower
    # at 2, 4 and 8 chunks on 04, H100 2026-12-08)
    return [first,
            {"strategy": "fmat", "BLOCK_M": 256, "BLOCK_N": bn, "num_warps": warps(256, 64), "num_stages": 1},
            {"strategy": "fma", "BLOCK_M": 256, "BLOCK_N": bn, "num_warps": warps(256, 128), "num_stages": 1},
            {"strategy": "fmat", "BLOCK_M": 128, "BLOCK_N": bn, "num_warps": warps(128, FMA_MIN_ACC), "num_stages": 1},
            {"strategy": "fmat", "BLOCK_M": 256, "BLOCK_N": bn, "num_warps": warps(256, 128), "num_stages": 1},
            {"strategy": "fma", "BLOCK_M": 128, "BLOCK_N": bn, "num_warps": warps(128, FMA_MIN_ACC), "num_stages": 1},
            {"strategy": "dot", "BLOCK_M": 256, "BLOCK_N": bn, "num_warps": 8, "num_stages": 2},
            {**first, "PREFETCH": 1}]  # the first with the next channel's taps loaded ahead (dropped where not valid)


def description(chain: Chain, policy: str = "strict") -> str:
    cv = conv_of(chain)
    g = _norm_of(chain, cv)
    geo = (f"conv2d {cv.n}x{cv.ci}x{cv.h}x{cv.w} -> {cv.co} channels, {cv.kh}x{cv.kw} kernel, stride {cv.stride}, "
           f"padding {cv.padding}, dilation {cv.dilation} {cv.dtype}")
    gemm = f"implicit GEMM {cv.n}x{cv.hw}x{cv.co}x{cv.k} (BxMxNxK) in Triton{' + bias' if cv.bias else ''}"
    if g is None:
        return f"{geo}: {gemm}, epilogue {describe(chain.epilogue)} fused into its store"
    return (f"{geo}: {gemm}, prologue {describe(chain.prologue)} and group_norm ({g} groups) partial statistics "
            f"per tile and group fused into its store; combined per (image, group) by a small kernel, normalized in "
            f"place by a second pass, epilogue {describe(chain.epilogue)}")


def _gather_mask(cv: Conv, ih: str, iw: str, k_tail: str) -> str:
    """The mask of an input gather: inside the image where padding can put a tap outside, the K tail."""
    terms = []
    if cv.padding[0] or (cv.ho - 1) * cv.stride[0] + (cv.kh - 1) * cv.dilation[0] >= cv.h:
        terms.append(f"({ih} >= 0) & ({ih} < {cv.h})")
    if cv.padding[1] or (cv.wo - 1) * cv.stride[1] + (cv.kw - 1) * cv.dilation[1] >= cv.w:
        terms.append(f"({iw} >= 0) & ({iw} < {cv.w})")
    if k_tail:
        terms.append(k_tail)
    return " & ".join(terms)


def _product(cv: Conv, p: Params, policy: str, it: str, chans_first: bool = False) -> list[str]:
    """Kernel lines computing `acc`, the fp32 BLOCK_M x BLOCK_N tile (pixels `pix` of image `nb`, channels
    `rb`, wrapped into range), from `x_ptr`, its strides and the (C_out, K) weight `w_ptr`; with `chans_first`
    (`fmat` only) the tile is left BLOCK_N x BLOCK_M, as the loop computed it."""
    (sh, sw), (ph, pw), (dh, dw) = cv.stride, cv.padding, cv.dilation
    taps = cv.kh * cv.kw
    lines = [f"oh = pix // {cv.wo}", f"ow = pix % {cv.wo}", f"ih0 = oh * {sh} - {ph}", f"iw0 = ow * {sw} - {pw}",
             "x_img = x_ptr + nb * sxn", "acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)"]
    if p["strategy"] in FMA_STRATEGIES:
        mask = _gather_mask(cv, "ih", "iw", "")
        product = ("acc += a.to(tl.float32)[:, None] * b.to(tl.float32)[None, :]" if p["strategy"] == "fma" else
                   "acc += b.to(tl.float32)[:, None] * a.to(tl.float32)[None, :]")
        if p["strategy"] == "fmat":  # channels x pixels: Triton's default layout puts a warp's lanes along pixels
            lines[-1] = "acc = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)"
        def wload(t: str) -> str:  # (C_out, K) for `fma`; (K, C_out) for `fmat`: one tap's row
            return (f"b = tl.load(w_ptr + rb * {cv.k} + ci * {taps} + {t})" if p["strategy"] == "fma" else
                    f"b = tl.load(w_ptr + (ci * {taps} + {t}) * {cv.co} + rb)")

        if p.get("PREFETCH"):
            # the next channel's taps are loaded before this channel's products (named per tap, carried by the
            # loop); the last channel loads itself again (L1 hits) rather than branch
            def gather(ptr: str, t: int) -> str:
                ih, iw = f"(ih0 + {t // cv.kw * dh})", f"(iw0 + {t % cv.kw * dw})"
                m = _gather_mask(cv, ih, iw, "")
                return f"tl.load({ptr} + {ih} * sxh + {iw} * sxw{f', mask={m}, other=0.0' if m else ''})"

            lines += [f"p{t} = {gather('x_img', t)}" for t in range(taps)]
            lines += [f"for ci in range(0, {cv.ci}):", *[f"    a{t} = p{t}" for t in range(taps)],
                      f"    x_nx = x_img + tl.cast(tl.minimum(ci + 1, {cv.ci - 1}), {it}) * sxc"]
            lines += [f"    p{t} = {gather('x_nx', t)}" for t in range(taps)]
            for t in range(taps):
                lines += [f"    a = a{t}", f"    {wload(str(t))}", f"    {product}"]
        else:
            lines += [f"for ci in range(0, {cv.ci}):",
                      f"    x_ch = x_img + tl.cast(ci, {it}) * sxc",  # the counter is int32 (an int interpreted): cast first
                      f"    for t in tl.static_range({taps}):",
                      f"        ih = ih0 + (t // {cv.kw}) * {dh}",
                      f"        iw = iw0 + (t % {cv.kw}) * {dw}",
                      f"        a = tl.load(x_ch + ih * sxh + iw * sxw{f', mask={mask}, other=0.0' if mask else ''})",
                      f"        {wload('t')}",
                      f"        {product}"]
        if p["strategy"] == "fmat" and not chans_first:
            lines.append("acc = tl.trans(acc)")
        return lines
    k = cv.k
    tail = k % p["BLOCK_K"] != 0
    mask = _gather_mask(cv, "ih", "iw", f"(rk < {k})[None, :]" if tail else "")
    lines += [f"for k0 in range(0, {k}, BLOCK_K):",
              f"    rk = k0 + tl.arange(0, BLOCK_K).to({it})",
              f"    ci = rk // {taps}",
              f"    r = rk % {taps}",
              f"    ih = ih0[:, None] + ((r // {cv.kw}) * {dh})[None, :]",
              f"    iw = iw0[:, None] + ((r % {cv.kw}) * {dw})[None, :]",
              f"    a = tl.load(x_img + ci[None, :] * sxc + ih * sxh + iw * sxw{f', mask={mask}, other=0.0' if mask else ''})",
              f"    b = tl.load(w_ptr + rb[None, :] * {k} + rk[:, None]{f', mask=rk[:, None] < {k}, other=0.0' if tail else ''})",
              "    if UPCAST:",
              "        a = a.to(tl.float32)",
              "        b = b.to(tl.float32)"]
    if p["strategy"] in SPLIT_STRATEGIES and cv.dtype == "float32":
        # Triton's interpreter has no bf16x6 (and computes tf32x3 as plain fp32): on a CPU tensor the split
        # product is the IEEE one, so the CPU tests check the gather and epilogue, the GPU twins the split.
        lines += [f"        acc = tl.dot(a, b, acc{_dot_precision(cv.dtype, policy)})",
                  "    else:",
                  f"        acc = tl.dot(a, b, acc{_dot_precision(cv.dtype, policy, p['strategy'])})"]
    else:
        lines.append(f"    acc = tl.dot(a, b, acc{_dot_precision(cv.dtype, policy)})")
    return lines


@dataclass(frozen=True)
class GroupTiles:
    """Where the conv kernel's GroupNorm partials go: one (count, mean, M2) slot per (image, pixel tile,
    channel tile, group the channel tile touches); `slots` a tile (the most groups one channel tile touches:
    a group may straddle two tiles, a tile may hold several groups), `spans` the most channel tiles one
    group touches."""

    groups: int
    cpg: int  # channels a group
    block_n: int
    tiles_m: int
    tiles_n: int
    slots: int
    spans: int

    @classmethod
    def of(cls, co: int, groups: int, block_n: int, tiles_m: int) -> GroupTiles:
        cpg, tiles_n = co // groups, cdiv(co, block_n)
        slots = max((min(co, (t + 1) * block_n) - 1) // cpg - t * block_n // cpg + 1 for t in range(tiles_n))
        spans = max(((g + 1) * cpg - 1) // block_n - g * cpg // block_n + 1 for g in range(groups))
        return cls(groups, cpg, block_n, tiles_m, tiles_n, slots, spans)

    def size(self, n: int) -> int:
        """Slots of one statistic over `n` images."""
        return n * self.tiles_m * self.tiles_n * self.slots


def _aligned(gt: GroupTiles) -> bool:
    """Every channel tile holds whole groups, or lies inside one, and a group's channels are a power of two: a
    tile's values reshape to (groups of the tile, channels of a group, pixels) in registers."""
    return gt.cpg & (gt.cpg - 1) == 0 and (gt.block_n % gt.cpg == 0 or gt.cpg % gt.block_n == 0)


def _tile_stats(v: str, hw: int, co: int, gt: GroupTiles, part: int, chans_first: bool) -> list[str]:
    """Kernel lines storing, for each group the tile's channels touch, the tile's count, mean and M2 of `v` (the
    tile, BLOCK_N x BLOCK_M with `chans_first`, else BLOCK_M x BLOCK_N) to `part_ptr` (laid out (3, N, tiles of
    M, tiles of N, slots)).

    Where the tile holds whole groups (`_aligned`): a corrected two-pass over each group's values in the tile
    (mean0 = sum / n, d = v - mean0, mean = mean0 + sum(d) / n, M2 = sum(d^2) - sum(d)^2 / n), the values
    reshaped to (groups, channels of a group, pixels): a thread sums its own channels of a group first, so the
    reductions across lanes are one a group, not one a channel (the 04 gap task's epilogue, 16 channels a tile
    in groups of 4: 69 shuffles against 261, and 1852 SASS instructions outside the loop against 2380, cuda:90).
    Otherwise a channel's statistics by the same two-pass, the channels of one group combined by Chan's formula
    (a one-hot channel x slot selection; the slot of channel c is its group less the tile's first group)."""
    px = 1 if chans_first else 0  # the tile's pixel axis
    if _aligned(gt):
        c = min(gt.cpg, gt.block_n)
        g = gt.block_n // c  # a tile past the last channel has more group-sized pieces than slots
        if chans_first:
            shape3, red, bcast = f"({g}, {c}, BLOCK_M)", "tl.sum(tl.sum({}, axis=1), axis=1)", "[:, None, None]"
            mask3 = f"(rn3 < {co})[:, :, None] & (rm < {hw})[None, None, :]"
        else:
            shape3, red, bcast = f"(BLOCK_M, {g}, {c})", "tl.sum(tl.sum({}, axis=2), axis=0)", "[None, :, None]"
            mask3 = f"(rm < {hw})[:, None, None] & (rn3 < {co})[None, :, :]"
        lines = [f"rn3 = tl.reshape(rn, ({g}, {c}))",
                 f"mask3 = {mask3}",
                 f"v3 = tl.where(mask3, tl.reshape({v}, {shape3}), 0.0)",
                 f"gn = tl.sum((rm < {hw}).to(tl.float32), axis=0) * tl.sum((rn3 < {co}).to(tl.float32), axis=1)",
                 "gq = tl.maximum(gn, 1.0)",
                 f"gm0 = {red.format('v3')} / gq",
                 f"d3 = tl.where(mask3, v3 - gm0{bcast}, 0.0)",
                 f"sd = {red.format('d3')}",
                 "gmean = gm0 + sd / gq",
                 f"gm2 = tl.maximum({red.format('d3 * d3')} - sd * sd / gq, 0.0)",
                 f"slot = tl.arange(0, {g})"]
    else:
        m0_col = "m0[:, None]" if chans_first else "m0[None, :]"  # a channel's mean along its pixels
        lines = [f"vs = tl.where({'maskt' if chans_first else 'mask'}, {v}, 0.0)",
                 f"cnt = tl.sum((rm < {hw}).to(tl.float32), axis=0)",
                 f"m0 = tl.sum(vs, axis={px}) / cnt",
                 f"dv = tl.where({'maskt' if chans_first else 'mask'}, vs - {m0_col}, 0.0)",
                 f"sd = tl.sum(dv, axis={px})",
                 "cmean = m0 + sd / cnt",
                 f"cm2 = tl.maximum(tl.sum(dv * dv, axis={px}) - sd * sd / cnt, 0.0)",
                 f"slot = tl.arange(0, {next_pow2(gt.slots)})",
                 f"sel = ((rn // {gt.cpg} - (pid_n * BLOCK_N) // {gt.cpg})[:, None] == slot[None, :]) & (rn < {co})[:, None]",
                 "gn = tl.sum(tl.where(sel, cnt[:, None], 0.0), axis=0)",
                 "gmean = tl.sum(tl.where(sel, (cnt * cmean)[:, None], 0.0), axis=0) / tl.maximum(gn, 1.0)",
                 "gd = cmean[:, None] - gmean[None, :]",
                 "gm2 = tl.sum(tl.where(sel, cm2[:, None] + cnt[:, None] * gd * gd, 0.0), axis=0)"]
    return [*lines,
            f"pidx = ((nb * {gt.tiles_m} + pid_m) * {gt.tiles_n} + pid_n) * {gt.slots} + slot",
            f"pmask = slot < {gt.slots}",
            "tl.store(part_ptr + pidx, gn, mask=pmask)",
            f"tl.store(part_ptr + {part} + pidx, gmean, mask=pmask)",
            f"tl.store(part_ptr + {2 * part} + pidx, gm2, mask=pmask)"]


def kernel(chain: Chain, params: Params, policy: str) -> Kernel:
    cv = conv_of(chain)
    groups = _norm_of(chain, cv)
    bm, bn = params["BLOCK_M"], params["BLOCK_N"]
    hw, co = cv.hw, cv.co
    tiles_m, tiles_n = cdiv(hw, bm), cdiv(co, bn)
    shape = chain.root.shape
    it = index_type(shape, (cv.n, cv.ci, cv.h, cv.w))
    out_t = tl_dtype(chain.out_dtype)
    leaf_names, leaf_vals = leaf_kernel_args(chain)
    lsig = "".join(x + ", " for x in leaf_names)
    bias_sig = "bias_ptr, " if cv.bias else ""
    part_sig = "part_ptr, " if groups else ""
    # `fmat` with a GroupNorm computes its epilogue channels x pixels, as its loop left the tile: transposed
    # first, Triton's layout pass computed the prologue (a sigmoid) twice, once in the store's layout and once in
    # the reductions', and the kernel took 255 registers (2 warps a scheduler); here once, in 168 (04 gap task,
    # 256x16, cuda:90). Without a GroupNorm the transposed epilogue measured faster (the module docstring).
    chans_first = bool(groups) and params["strategy"] == "fmat"
    t_idx, t_mask, col = ("idxt", "maskt", "[:, None]") if chans_first else ("idx", "mask", "[None, :]")
    em = ExprEmitter("e", along=(1, f"rb{col}"))  # per-channel operands (a (C, 1, 1) scale): one load per channel
    if chans_first:
        em.lines += [f"maskt = (rn[:, None] < {co}) & (rm[None, :] < {hw})",
                     f"idxt = nb * {co * hw} + rn[:, None] * {hw} + rm[None, :]"]
    em.lines.append("x = acc" + (f" + tl.load(bias_ptr + rb).to(tl.float32){col}" if cv.bias else ""))
    res = em.emit(chain.prologue if groups else chain.epilogue, "x", t_idx, shape, t_mask)
    em.lines.append(f"y = {res}.to({out_t})")
    em.lines.append(f"tl.store(out_ptr + {t_idx}, y, mask={t_mask})")
    if groups:
        gt = GroupTiles.of(co, groups, bn, tiles_m)
        # the statistics of y as stored (eager's GroupNorm input)
        em.lines += _tile_stats("y.to(tl.float32)", hw, co, gt, gt.size(cv.n), chans_first)
    body = "\n".join("    " + line for line in [*_product(cv, params, policy, it, chans_first), *em.lines])
    src = [f'''
@triton.jit
def _conv_kernel(x_ptr, w_ptr, out_ptr, {bias_sig}{part_sig}{lsig}sxn: tl.constexpr, sxc: tl.constexpr,
                 sxh: tl.constexpr, sxw: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, UPCAST: tl.constexpr):
    pid = tl.program_id(0)
    pid_n = pid % {tiles_n}
    pid_m = pid // {tiles_n}
    nb = tl.program_id(1).to({it})
    rm = pid_m.to({it}) * BLOCK_M + tl.arange(0, BLOCK_M).to({it})
    rn = pid_n.to({it}) * BLOCK_N + tl.arange(0, BLOCK_N).to({it})
    pix = {'rm' if hw % bm == 0 else f'rm % {hw}'}
    rb = {'rn' if co % bn == 0 else f'rn % {co}'}
    mask = (rm[:, None] < {hw}) & (rn[None, :] < {co})
    idx = nb * {co * hw} + rn[None, :] * {hw} + rm[:, None]
{body}
''']
    fwd = check_shapes(chain)
    fwd.append(f"w = {cv.weight}.reshape({co}, {cv.k})" + (".t().contiguous()" if params["strategy"] == "fmat" else ""))
    fwd.append(f"x_in = {cv.x}")
    fwd.append(f"out = torch.empty({chain.out_shape!r}, device=x_in.device, dtype=torch.{chain.out_dtype})")
    args = ["x_in", "w", "out", *([cv.bias] if cv.bias else [])]
    if groups:
        fwd.append(f"part = torch.empty((3, {cv.n}, {tiles_m}, {tiles_n}, {gt.slots}), device=x_in.device, "
                   "dtype=torch.float32)")
        args.append("part")
    args += [*leaf_vals, "x_in.stride(0), x_in.stride(1), x_in.stride(2), x_in.stride(3)",
             "UPCAST=x_in.device.type == 'cpu'" if params["strategy"] in SPLIT_STRATEGIES else upcast("x_in", cv.dtype)]
    meta = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": params["BLOCK_K"], "num_warps": params["num_warps"],
            "num_stages": params["num_stages"], **({"maxnreg": params["MAXNREG"]} if params["MAXNREG"] else {})}
    chunks = params.get("OVERLAP", 1)
    if not groups or chunks == 1:
        fwd.append(launch("_conv_kernel", f"({tiles_m * tiles_n}, {cv.n})", args, meta))
    if groups:
        src += _norm_kernels(chain, cv, gt, params["NORM_BLOCK"], lsig, out_t, it)
        core = chain.core
        assert core is not None
        affine = [f"self.{a.target}" for a in core.args[1:3] if a is not None]
        nblock = params["NORM_BLOCK"]
        stats_meta = {"BLOCK": min(NORM_BLOCK, next_pow2(tiles_m * gt.spans)), "num_warps": 4}
        apply_meta = {"BLOCK": nblock, "num_warps": nblock // 256}
        fwd.append(f"stats = torch.empty(({cv.n * groups * 2},), device=x_in.device, dtype=torch.float32)")
        if chunks == 1:
            fwd.append(launch("_conv_gn_stats_kernel", f"({cv.n * groups},)", ["part", "stats"], stats_meta))
            fwd.append(launch("_conv_gn_apply_kernel", f"({cv.n * co * cdiv(hw, nblock)},)",
                              ["out", "stats", *affine, *leaf_vals], apply_meta))
        else:
            # a chunk's kernels see its images only: views from the chunk's first image (every offset in the
            # kernels is relative to their bases; `part`'s statistic stride stays the whole batch's). Unrolled, so
            # that every launch has a literal grid.
            src.append(OVERLAP_HELPER)
            fwd.append("side = _kstrata_side(x_in)")
            for i in range(chunks):
                i0, i1 = i * cv.n // chunks, (i + 1) * cv.n // chunks
                view = {"x_in": f"x_in[{i0}:{i1}]", "out": f"out[{i0}:{i1}]", "part": f"part[:, {i0}:{i1}]"}
                st = f"stats[{i0 * 2 * groups}:{i1 * 2 * groups}]"
                fwd.append(launch("_conv_kernel", f"({tiles_m * tiles_n}, {i1 - i0})", [view.get(a, a) for a in args],
                                  meta))
                fwd.append("with _kstrata_after(side):  # this chunk's passes, beside the next chunk's convolution")
                fwd.append("    " + launch("_conv_gn_stats_kernel", f"({(i1 - i0) * groups},)", [view["part"], st],
                                           stats_meta))
                fwd.append("    " + launch("_conv_gn_apply_kernel", f"({(i1 - i0) * co * cdiv(hw, nblock)},)",
                                           [view["out"], st, *affine, *leaf_vals], apply_meta))
            fwd.append("if side is not None:  # the caller's stream waits for the last chunk's passes")
            fwd.append("    torch.cuda.current_stream(x_in.device).wait_stream(side)")
    fwd.append("return out")
    return Kernel(NAME, policy, description(chain), params, src, fwd)


def _norm_kernels(chain: Chain, cv: Conv, gt: GroupTiles, nblock: int, lsig: str, out_t: str, it: str) -> list[str]:
    """The GroupNorm's statistics kernel (per (image, group): Chan's combination of the conv kernel's partials of
    that group, every pixel tile of each channel tile the group touches, lane-wise then across lanes, in a fixed
    order: the same result every run) and its in-place apply kernel (one program per image plane and pixel
    block, on grid axis 0)."""
    core = chain.core
    assert core is not None
    co, hw, groups, cpg, bn = cv.co, cv.hw, gt.groups, gt.cpg, gt.block_n
    entries = gt.tiles_m * gt.spans
    eps = float(core.attrs["eps"])
    part = gt.size(cv.n)
    combine = "\n".join("    " + line for line in combine_lines("n", "mean", "m2", "t"))
    if gt.spans == 1:  # the group inside one channel tile: an entry is a pixel tile
        where = [f"t = g * {cpg} // {bn}", "em = e < " + str(entries), "mt = e"]
    else:  # entry = (pixel tile, k-th channel tile of the group); a group may touch fewer than `spans`
        where = [f"t = g * {cpg} // {bn} + e % {gt.spans}",
                 f"em = (e < {entries}) & (t <= ((g + 1) * {cpg} - 1) // {bn})", f"mt = e // {gt.spans}"]
    body = "\n".join("        " + line for line in [
        *where, f"off = ((nb * {gt.tiles_m} + mt) * {gt.tiles_n} + t) * {gt.slots} + g - t * {bn} // {cpg}"])
    stats = f'''
@triton.jit
def _conv_gn_stats_kernel(part_ptr, stats_ptr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to({it})
    nb = row // {groups}
    g = row % {groups}
    n = tl.zeros([BLOCK], tl.float32)
    mean = tl.zeros([BLOCK], tl.float32)
    m2 = tl.zeros([BLOCK], tl.float32)
    for e0 in range(0, {entries}, BLOCK):
        e = e0 + tl.arange(0, BLOCK).to({it})
{body}
        pn = tl.load(part_ptr + off, mask=em, other=0.0)
        pmean = tl.load(part_ptr + {part} + off, mask=em, other=0.0)
        pm2 = tl.load(part_ptr + {2 * part} + off, mask=em, other=0.0)
        tot = n + pn
        frac = pn / tl.maximum(tot, 1.0)
        delta = pmean - mean
        mean = mean + delta * frac
        m2 = m2 + pm2 + delta * delta * n * frac
        n = tot
{combine}
    tl.store(stats_ptr + row * 2, tmean)
    tl.store(stats_ptr + row * 2 + 1, 1.0 / tl.sqrt_rn(tm2 / {float(cpg * hw)!r} + {eps!r}))
'''
    w, b = core.args[1], core.args[2]
    em = ExprEmitter("a", along=(1, "c"))  # a program's plane is one channel: its per-channel operands are scalars
    em.lines += ["v = tl.load(out_ptr + idx, mask=mask, other=0.0).to(tl.float32)",
                 "y = (v - tl.load(stats_ptr + row * 2)) * tl.load(stats_ptr + row * 2 + 1)"]
    if w is not None:
        em.lines.append("y = y * tl.load(gw_ptr + c).to(tl.float32)")
    if b is not None:
        em.lines.append("y = y + tl.load(gb_ptr + c).to(tl.float32)")
    res = em.emit(chain.epilogue, "y", "idx", chain.out_shape, "mask")
    em.lines.append(f"tl.store(out_ptr + idx, {res}.to({out_t}), mask=mask)")
    body = "\n".join("    " + line for line in em.lines)
    wsig = ("gw_ptr, " if w is not None else "") + ("gb_ptr, " if b is not None else "")
    apply = f'''
@triton.jit
def _conv_gn_apply_kernel(out_ptr, stats_ptr, {wsig}{lsig}BLOCK: tl.constexpr):
    pid = tl.program_id(0).to({it})  # one axis: grid axes 1 and 2 take 65535 programs, an image's blocks may be more
    plane = pid // {cdiv(hw, nblock)}
    p = (pid % {cdiv(hw, nblock)}) * BLOCK + tl.arange(0, BLOCK).to({it})
    mask = p < {hw}
    c = plane % {co}
    row = (plane // {co}) * {groups} + c // {cpg}
    idx = plane * {hw} + p
{body}
'''
    return [stats, apply]
