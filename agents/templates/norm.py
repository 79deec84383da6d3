"""Normalizations over contiguous segments: LayerNorm over any number of trailing dims and GroupNorm on a
contiguous (N, C, *spatial) tensor, with the pointwise ops before (fused into the loads) and after (fused
into the store), after at most one library op.

Strategies (`strategy` in the schedule):
- `fused`: a segment fits in registers; a program normalizes BLOCK_M whole segments, reading the input once
  (mean, then the centered variance, from registers: exact two-pass statistics).
- `split`: few, wide segments (LayerNorm over (64, 256, 256) with 16 rows: 16 segments of 4M elements) are
  split across SPLIT programs each. A first kernel computes per-chunk Welford partials (count, mean, M2)
  lane-wise (one reciprocal a step for all lanes, not a division a value); a second kernel, one program per chunk again, combines its row's partials (Chan's formula)
  and normalizes its chunk. The input is read twice and written once, by all SMs, where one program per
  row would leave most of the GPU idle; with GROUP_ROWS > 0 both kernels run per group of rows, so the
  second read of a group that fits in L2 does not go to DRAM.
- `pipe`: `split` with row groups (GROUP_ROWS), one launch a group: the group's normalization and the next
  group's statistics in one grid (its first programs normalize, the others take the next rows' partials), so
  a group is read from DRAM once for its statistics and again, one launch later, from L2 while it is still
  there; 1 + m / GROUP_ROWS launches instead of `split`'s 2 m / GROUP_ROWS (a host that launches slower than
  a 16 MB row streams would otherwise leave the GPU waiting).
- `resident` (GPU only): one persistent kernel; teams of SPLIT = ceil(segment / BLOCK) programs take a segment
  at a time, each holding its chunk of BLOCK elements in registers (at most 64 values a thread): the chunk's
  exact two-pass (count, mean, M2) published, the team's combined by Chan's formula in a fixed order (the
  same result every run), the chunk normalized from registers and stored. The input is read once and written
  once; teams are as many as the compiled kernel's occupancy keeps resident (`codegen.RESIDENT_HELPER`).
  Where not even one team fits (and on the CPU) the `split` kernels run with the same chunks. On LayerNorm's
  4M-element rows (gap task 01) no team fits an H100 or H200: ptxas gives the kernel 128 registers a thread at
  8192 values a program (16 or 8 warps; 16384 at 16 warps too), one or two programs an SM, 132-264 resident
  against teams of 256-512 (compiled for cuda:90 on the CPU, 2026-12-08), and Nsight Compute's run on an H100
  (2026-12-08, `template-probe-2026-12-08-ncu01.md`) shows `split`'s two kernels where the resident schedules
  were asked for. The `resident` figures on that task in this docstring and the results are `split`'s at the
  resident schedule's chunk (on the H200 by inference: the same cubin, SM count and register file).
- `stream` (GPU only): one persistent kernel; teams of SPLIT programs take a segment at a time, at most
  GROUP_ROWS teams (rows in flight; 0: as many as stay resident). A member streams its chunk (any size, in
  BLOCK pieces) for `split`'s lane-wise partials, the team exchanges them as `resident` does, and the member
  streams its chunk again to normalize it, from L2 where it was just read: one launch, DRAM read about once,
  where `resident` is limited to 64 values a thread in registers (on the H200, 2026-12-04, LayerNorm's 4M-element
  rows: `resident` 241 us, 59% of SOL, where no team fitted and `split`'s kernels ran (above); pipe 434 us with 17 launches, which
  a host launching slower than a 16 MB row streams would bound; not measured). Measured on that task (H200,
  2026-12-04, `templates-bench-2026-12-04-c`): 316-442 us against `split`'s 241 us (SPLIT 256), so it loses
  there. Whether the second read missed L2 or the teams waited on their exchange was not profiled.
  On the CPU the `split` kernels run with the same chunks.

`GRAPH` = 1 (`split` and `pipe` with row groups): the forward's launches are captured once into a CUDA graph and
replayed (`agents.cuda_graphs`: keyed by the inputs' addresses, read in place, a held output never overwritten).
It was built on the guess that a row group's short launches (a 16 MB row of LayerNorm's task) were bound by
the host launching them (`pipe`, 17 launches: 434 us, H200 2026-12-04). Measured, they are not (H100,
2026-12-07, `template-probe-2026-12-07-f.md`, one row a group, SPLIT 256, 8 warps): `pipe` 552 us without the
graph and 533 with it, its kernels alone 485-487 us; `split` from the graph 613 us (statistics 210, normalization
362), where `split` over all rows at once (GROUP_ROWS 0, SPLIT 128, 16 warps) ran 321 (100 + 197). The row
groups' kernels are slow themselves, so the graphed hints come last. Under the interpreter the launches run
directly.

`EVICT` = 1 (`resident`, and `split` over all rows at once): the input's loads and the output's stores carry
L2 evict-first priority and the weights' loads evict-last. A resident team reads its row's weight and bias
(32 MB on task 01) after the exchange, every row; a weight is read again after 64 MB of other traffic (the
rest of the weights, the row's input and output), more than an H100/H200's 50 MB L2 keeps by recency, so
without priorities the weights come from DRAM every row (reasoned from the sizes, not profiled). The hints change
nothing but cache priority. `PREFETCH` (`resident`, NVIDIA): a member asks the L2 for its chunk of the team's
next row and of the row's weights (PTX `prefetch.global.L2`, no registers held) before it waits for its team (1)
or first in the row's turn (2), so the DRAM streams while the team exchanges (built on the reading that a team
of 512 was in flight on task 01 at 241 us on the H200; no team fitted there, see `resident` above). Timed on task 01 (H100, 2026-12-07, `template-probe-2026-12-07-evict*.md`): EVICT made
the team of 8192-value chunks faster (355.5 us against 469.9 in one call; 432.7 in the next) and the team of
32768 slower (606.0 against 560.9); PREFETCH was slower in every form timed. The 16-warp teams of chunks up to
16384 are hinted with EVICT first; PREFETCH stays in the space, unhinted. `split` over all rows (382-395 us
in those calls) stayed as fast as the best team on the H100.
"""

from __future__ import annotations

import math

from kstrata.agents.templates.base import Params, cdiv, next_pow2
from kstrata.agents.templates.codegen import (
    PTX_HELPER,
    RESIDENT_HELPER,
    ExprEmitter,
    Kernel,
    broadcast_offset,
    check_shapes,
    head_code,
    index_type,
    l2_prefetch,
    launch,
    leaf_kernel_args,
    resident_launch,
    resident_schedules,
    root_load,
    team_exchange,
    tl_dtype,
)
from kstrata.agents.templates.graph import Chain, Node, describe

NAME = "norm"
#: Largest segment the fused strategy keeps in registers.
FUSED_MAX = 16384
#: The most programs a `resident` team may have (its partials are loaded as one vector).
MAX_TEAM = 1024

def combine_lines(n: str, mean: str, m2: str, out: str) -> list[str]:
    """Kernel lines combining per-lane (count, mean, M2) vectors into the totals `{out}n, {out}mean, {out}m2`.

    Chan's parallel formula over all lanes at once: M2 = sum(M2_i) + sum(n_i (mean_i - mean)^2), with
    three plain sums (tree reductions on the GPU, vectorized in the interpreter) instead of a custom
    pairwise `tl.reduce`.
    """
    return [f"{out}n = tl.sum({n}, axis=0)",
            f"{out}mean = tl.sum({n} * {mean}, axis=0) / tl.maximum({out}n, 1.0)",
            f"{out}dm = tl.where({n} > 0, {mean} - {out}mean, 0.0)",
            f"{out}m2 = tl.sum({m2}, axis=0) + tl.sum({n} * {out}dm * {out}dm, axis=0)"]




def geometry(chain: Chain) -> tuple[int, int, str]:
    """(rows, segment length, how a parameter is indexed) of the chain's norm."""
    core = chain.core
    assert core is not None
    s = chain.core_shape
    if core.op == "layer_norm":
        d = math.prod(core.attrs["normalized_shape"])
        return math.prod(s) // d, d, "col"
    g = core.attrs["num_groups"]
    c = s[1]
    hw = math.prod(s[2:])
    return s[0] * g, (c // g) * hw, f"(row % {g}) * {c // g} + col // {hw}" if hw > 1 else f"(row % {g}) * {c // g} + col"


def applies(chain: Chain, policy: str = "strict") -> str | None:
    core = chain.core
    if core is None or core.op not in ("layer_norm", "group_norm"):
        return "the graph has no LayerNorm or GroupNorm"
    if chain.core_shape != chain.out_shape:
        return "the output's shape differs from the norm's"
    s = chain.core_shape
    if core.op == "layer_norm":
        ns = tuple(core.attrs["normalized_shape"])
        if tuple(s[len(s) - len(ns):]) != ns:
            return f"normalized_shape {ns} is not the trailing dims of {s}"
    else:
        if len(s) < 2 or s[1] % core.attrs["num_groups"]:
            return f"GroupNorm of {core.attrs['num_groups']} groups on shape {s}"
    for w in core.args[1:3]:
        if w is not None and not isinstance(w, Node):
            return "a norm weight that is not a tensor"
    return None


def space(chain: Chain) -> tuple[tuple[tuple[str, tuple[object, ...]], ...], tuple[tuple[str, object], ...]]:
    m, d, _ = geometry(chain)
    fused = d <= FUSED_MAX
    strategies = ("fused", "split") if fused else ("split", "resident", "pipe", "stream")
    sp: list[tuple[str, tuple[object, ...]]] = [("strategy", strategies)]
    sp.append(("BLOCK_M", (1, 2, 4, 8, 16, 32, 64) if fused else (1,)))
    sp.append(("BLOCK", (1024, 2048, 4096) if fused else (1024, 2048, 4096, 8192, 16384, 32768)))
    sp.append(("SPLIT", (1, 2, 4, 8, 16, 32, 64, 128, 256)))
    sp.append(("GROUP_ROWS", (0, 1, 2, 4, 8) if m > 1 else (0,)))
    sp.append(("num_warps", (4, 8, 16)))
    # the launches replayed through a CUDA graph: row groups launch twice a group (`pipe` once), 16 to 32
    # short launches that a host launching slower than a 16 MB row streams would leave the GPU waiting on
    sp.append(("GRAPH", (0, 1) if m > 1 and not fused else (0,)))
    # L2 eviction priorities where the input is read once a pass (`resident`, `split` over all rows): its loads
    # and the output's stores evicted first, the weights' loads last, so the weights a row reads again stay in
    # L2 (the resident kernel reads a row's 32 MB of weight and bias after its team's exchange, every row)
    sp.append(("EVICT", (0,) if fused else (0, 1)))
    # a resident team asks the L2 for its next row's chunk and this row's weights (NVIDIA: PTX prefetches), before
    # it waits for its team (1) or first in the row's turn (2), so the DRAM streams while the team exchanges its
    # statistics
    sp.append(("PREFETCH", (0,) if fused else (0, 1, 2)))
    if fused:
        default = {"strategy": "fused", "BLOCK_M": max(1, min(16, 2048 // next_pow2(d))), "BLOCK": 1024, "SPLIT": 1,
                   "GROUP_ROWS": 0, "GRAPH": 0, "EVICT": 0, "PREFETCH": 0,
                   "num_warps": 4 if d <= 1024 else 8}
    else:
        split = max(1, min(256, next_pow2(cdiv(4 * 132, m))))
        default = {"strategy": "split", "BLOCK_M": 1, "BLOCK": 2048, "SPLIT": split, "GROUP_ROWS": 0, "GRAPH": 0,
                   "EVICT": 0, "PREFETCH": 0, "num_warps": 8}
    return tuple(sp), tuple(default.items())


def hints(chain: Chain) -> list[Params]:
    """Row groups of wide segments that fit in L2, each split over enough programs to fill the GPU."""
    m, d, _ = geometry(chain)
    if d <= FUSED_MAX:
        return []
    # a chunk in registers first (the segment read once; the teams as many as stay resident)
    out: list[Params] = [{"strategy": "resident", "BLOCK_M": 1, "GROUP_ROWS": 0, "SPLIT": 1, "BLOCK": b, "num_warps": w}
                         for b, w in resident_schedules(d, MAX_TEAM)]
    if m <= 1:
        return out
    # first, the teams of smaller chunks with L2 priorities, where rows share weights (EVICT, module docstring):
    # on task 01 (H100, 2026-12-07, `template-probe-2026-12-07-evict*.md`) BLOCK 8192 at 16 warps ran 355.5 us
    # with EVICT against 469.9 without in one call (432.7 in the next), 16384 466.3; at 32768 EVICT was slower
    # (606.0 against 560.9). PREFETCH (L2 prefetches of the next row) was slower at every size it was timed
    # (32768: 659-719 us; 8192 with EVICT: 435.6-516.0 against 432.7) and is left to the space, not hinted.
    out[:0] = [{**p, "EVICT": 1} for p in out if p["BLOCK"] <= 16384 and p["num_warps"] == 16][::-1]
    graphed: list[Params] = []  # a row group's statistics, then its normalization, launched from a CUDA graph
    for g in (1, 2):
        if g < m and 2 * g * 4 * d <= 48 << 20:
            for strategy in ("pipe", "split"):
                graphed.append({"strategy": strategy, "BLOCK_M": 1, "GROUP_ROWS": g, "SPLIT": 256, "BLOCK": 2048,
                                "num_warps": 8, "GRAPH": 1})
    # a persistent team a row, its chunks read again from L2 right after the team's statistics
    for g, split in ((1, 256), (2, 256), (2, 128)):
        if g < m and g * 4 * d <= 40 << 20 and split <= cdiv(d, 2048):  # the rows in flight fit in L2
            out.append({"strategy": "stream", "BLOCK_M": 1, "GROUP_ROWS": g, "SPLIT": split, "BLOCK": 2048,
                        "num_warps": 8})
    for g in (1, 2, 4, 8):
        if g < m and 2 * g * 4 * d <= 48 << 20:
            out.append({"strategy": "split", "BLOCK_M": 1, "GROUP_ROWS": g, "SPLIT": max(1, min(256, next_pow2(cdiv(512, g)))),
                        "BLOCK": 2048, "num_warps": 8})
            out.append({**out[-1], "strategy": "pipe"})
    # last: on task 01 (16 rows of 4M, H100 2026-12-07) the graph took `pipe` from 552 to 533 us only, where
    # one launch over every row (`split`, GROUP_ROWS 0) ran 321: the row groups' kernels are slow themselves
    # (256 programs a row), not their host launches
    return out + graphed


def valid(chain: Chain, p: Params) -> bool:
    m, d, _ = geometry(chain)
    if p.get("GRAPH") and not (p["strategy"] in ("split", "pipe") and p["GROUP_ROWS"] >= 1):
        return False  # a graph only where a forward launches a kernel or two a row group
    if p.get("EVICT") and not (p["strategy"] == "resident" or (p["strategy"] == "split" and p["GROUP_ROWS"] == 0)):
        return False  # the input evicted first only where nothing reads it again from L2
    if p.get("PREFETCH") and (p["strategy"] != "resident" or d < 64):
        return False  # the prefetch runs while a resident team waits for its members (256 bytes at a time)
    if p["strategy"] == "fused":
        return bool(d <= FUSED_MAX and p["SPLIT"] == 1 and p["BLOCK"] == 1024 and p["GROUP_ROWS"] == 0
                    and next_pow2(d) * p["BLOCK_M"] <= 32768)
    if p["strategy"] == "resident":  # the chunk is BLOCK (SPLIT follows), at most 64 values a thread
        return bool(p["BLOCK_M"] == 1 and p["GROUP_ROWS"] == 0 and p["SPLIT"] == 1
                    and 2 <= cdiv(d, p["BLOCK"]) <= MAX_TEAM and p["BLOCK"] <= 64 * 32 * p["num_warps"])
    if p["strategy"] == "stream" and p["SPLIT"] < 2:  # a team of one would stream a whole segment alone
        return False
    if p["strategy"] == "pipe" and not 1 <= p["GROUP_ROWS"]:  # a launch per group: groups it must have
        return False
    return bool(p["BLOCK_M"] == 1 and p["SPLIT"] <= cdiv(d, p["BLOCK"]) and p["GROUP_ROWS"] < m and p["BLOCK"] <= 4096)


def description(chain: Chain, policy: str = "strict") -> str:
    assert chain.core is not None
    m, d, _ = geometry(chain)
    head = f"{chain.head.op} (PyTorch), then " if chain.head else ""
    return (f"{head}{chain.core.op} over {m} segments of {d} (prologue {describe(chain.prologue)}, epilogue "
            f"{describe(chain.epilogue)}) in Triton")


def _affine(chain: Chain, em: ExprEmitter, y: str, widx: str, mask: str, evict: str = "") -> str:
    core = chain.core
    assert core is not None
    w, b = core.args[1], core.args[2]
    hint = f", eviction_policy={evict!r}" if evict else ""
    if w is not None:
        em.lines.append(f"aw = tl.load(w_ptr + ({widx}), mask={mask}, other=0.0{hint}).to(tl.float32)")
        em.lines.append(f"{y} = {y} * aw")
    if b is not None:
        em.lines.append(f"ab = tl.load(b_ptr + ({widx}), mask={mask}, other=0.0{hint}).to(tl.float32)")
        em.lines.append(f"{y} = {y} + ab")
    return y


def norm_args(chain: Chain, absent: str = "h") -> tuple[list[str], list[str]]:
    """(kernel parameter names, forward values) of the norm's weight and bias; an absent one is passed as
    `absent` (a tensor the kernel never reads then)."""
    core = chain.core
    assert core is not None
    vals = []
    for a in core.args[1:3]:
        vals.append(absent if a is None else (f"self.{a.target}.contiguous()" if a.op == "param" else f"{a.name}.contiguous()"))
    return ["w_ptr", "b_ptr"], vals


def _shift(chain: Chain, s: tuple[int, ...]) -> str:
    """Kernel lines giving `x0`, the segment's first value after the prologue (the statistics' shift)."""
    em = ExprEmitter("s")
    em.lines.append(root_load(chain, s, "base", "None", var="xs"))
    v = em.emit(chain.prologue, "xs", "base", s, "None")
    em.lines.append(f"x0 = {v}")
    return "\n".join("    " + line for line in em.lines)


def kernel(chain: Chain, params: Params, policy: str) -> Kernel:
    core = chain.core
    assert core is not None
    m, d, widx = geometry(chain)
    eps = float(core.attrs["eps"])
    s = chain.core_shape
    it = index_type(s, chain.root.shape)
    out_t = tl_dtype(chain.out_dtype)
    leaf_names, leaf_vals = leaf_kernel_args(chain)
    norm_names, norm_vals = norm_args(chain)
    sig = ", ".join(["h_ptr", "out_ptr", *norm_names, *leaf_names])
    srcs: list[str] = []
    fwd = check_shapes(chain) + head_code(chain)
    fwd.append(f"out = torch.empty({chain.out_shape!r}, device=h.device, dtype=torch.{chain.out_dtype})")
    meta_common = {"num_warps": params["num_warps"]}
    if params["strategy"] == "fused":
        bm, bd = params["BLOCK_M"], next_pow2(d)
        em = ExprEmitter()
        lines = [f"    row = tl.program_id(0).to({it}) * BLOCK_M + tl.arange(0, BLOCK_M).to({it})[:, None]",
                 f"    col = tl.arange(0, BLOCK_D).to({it})[None, :]",
                 f"    mask = (row < {m}) & (col < {d})",
                 f"    idx = row * {d} + col",
                 "    " + root_load(chain, s, "idx", "mask")]
        v = em.emit(chain.prologue, "x", "idx", s, "mask")
        # shifted by the segment's first value: the mean of the shifted values is small, so its rounding is
        # an ULP of the deviations rather than of the mean (GroupNorm of near-constant sigmoid outputs)
        em.lines += [f"x0 = tl.sum(tl.where(col == 0, {v}, 0.0), axis=1)",
                     f"v = tl.where(mask, {v} - x0[:, None], 0.0)",
                     f"mean = tl.sum(v, axis=1) / {d}",
                     "dv = tl.where(mask, v - mean[:, None], 0.0)",
                     f"var = tl.sum(dv * dv, axis=1) / {d}",
                     f"rstd = 1.0 / tl.sqrt_rn(var + {eps!r})",
                     "y = dv * rstd[:, None]"]
        y = _affine(chain, em, "y", widx, "mask")
        r = em.emit(chain.epilogue, y, "idx", chain.out_shape, "mask")
        em.lines.append(f"tl.store(out_ptr + idx, {r}.to({out_t}), mask=mask)")
        lines += ["    " + line for line in em.lines]
        srcs.append("\n".join(["", "@triton.jit", f"def _norm_fused_kernel({sig}, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):",
                               *lines]))
        fwd.append(launch("_norm_fused_kernel", f"(triton.cdiv({m}, {bm}),)", ["h", "out", *norm_vals, *leaf_vals],
                          {"BLOCK_M": bm, "BLOCK_D": bd, **meta_common}))
    else:
        block = params["BLOCK"]
        split = params["SPLIT"]
        # EVICT: the input and output streamed once, evicted from L2 first, the weights kept (`valid`)
        first, last = ("evict_first", "evict_last") if params.get("EVICT") else ("", "")
        store_hint = f", eviction_policy={first!r}" if first else ""
        if params["strategy"] == "resident":  # the chunk is BLOCK; the two-kernel path takes it in 4096 pieces
            split, block = cdiv(d, block), min(block, 4096)
        chunk = cdiv(cdiv(d, split), block) * block
        split = cdiv(d, chunk)
        sp2 = next_pow2(split)
        # kernel 1: lane-wise Welford partials of one chunk of one segment
        shift = _shift(chain, s)
        em = ExprEmitter()
        em.lines += ["cols = start + tl.arange(0, BLOCK).to(ITYPE)", f"mask = cols < {d}", "idx = base + cols",
                     root_load(chain, s, "idx", "mask", evict=first)]
        v = em.emit(chain.prologue, "x", "idx", s, "mask")
        # a lane is masked only past the segment's end, and then in every later step: an unmasked lane has
        # been unmasked in every step before, so its count is the step's number, one reciprocal a step for
        # all lanes (a division per value kept the statistics kernel issue-bound: 96.7 us at 86% issue,
        # math-pipe throttled, H200 2026-12-04, `template-probe-2026-12-04`)
        em.lines += [f"inv = 1.0 / ((start - c * {chunk}) // BLOCK + 1).to(tl.float32)", f"delta = ({v} - x0) - mean",
                     "mean = mean + tl.where(mask, delta * inv, 0.0)",
                     f"m2 = m2 + tl.where(mask, delta * (({v} - x0) - mean), 0.0)"]
        stats_lines = [line.replace("ITYPE", it) for line in em.lines]
        count_lines = [f"rem = {d} - c * {chunk} - tl.arange(0, BLOCK).to({it})",
                       f"n = tl.where(rem > 0, tl.minimum((rem - 1) // BLOCK + 1, {chunk} // BLOCK), 0).to(tl.float32)"]
        body = "\n".join("        " + line for line in stats_lines)
        stats = "\n".join("    " + line for line in count_lines + combine_lines("n", "mean", "m2", "t"))
        combine = "\n".join("    " + line for line in combine_lines("pn", "pmean", "pm2", "t"))
        leaf_sig = "".join(a + ", " for a in leaf_names)
        stats_rest = f'''    base = row * {d}
{shift}
    mean = tl.zeros([BLOCK], tl.float32)
    m2 = tl.zeros([BLOCK], tl.float32)
    for start in range(c * {chunk}, c * {chunk} + {chunk}, BLOCK):
{body}
{stats}
    p = part_ptr + (row * {split} + c) * 3
    tl.store(p, tn)
    tl.store(p + 1, tmean)
    tl.store(p + 2, tm2)
'''
        srcs.append(f'''
@triton.jit
def _norm_stats_kernel(h_ptr, part_ptr, {leaf_sig}row0, BLOCK: tl.constexpr):
    row = row0 + tl.program_id(0).to({it})
    c = tl.program_id(1).to({it})
{stats_rest}''')
        if params["strategy"] == "pipe":
            srcs.append(f'''
@triton.jit
def _norm_stats_chunk(h_ptr, part_ptr, {leaf_sig}row, c, BLOCK: tl.constexpr):
{stats_rest}''')
        # kernel 2: combine the row's partials, normalize this chunk
        em = ExprEmitter()
        em.lines += ["cols = start + tl.arange(0, BLOCK).to(ITYPE)", f"mask = cols < {d}", "idx = base + cols",
                     "col = cols", root_load(chain, s, "idx", "mask", evict=first)]
        v = em.emit(chain.prologue, "x", "idx", s, "mask")
        em.lines += [f"y = (({v} - x0) - tmean) * rstd"]
        y = _affine(chain, em, "y", widx, "mask", last)
        r = em.emit(chain.epilogue, y, "idx", chain.out_shape, "mask")
        em.lines.append(f"tl.store(out_ptr + idx, {r}.to({out_t}), mask=mask{store_hint})")
        apply_lines = [line.replace("ITYPE", it) for line in em.lines]
        body = "\n".join("        " + line for line in apply_lines)
        apply_rest = f'''    base = row * {d}
    j = tl.arange(0, {sp2})
    pm = j < {split}
    pp = part_ptr + row * {split * 3} + j * 3
    pn = tl.load(pp, mask=pm, other=0.0)
    pmean = tl.load(pp + 1, mask=pm, other=0.0)
    pm2 = tl.load(pp + 2, mask=pm, other=0.0)
{combine}
    rstd = 1.0 / tl.sqrt_rn(tm2 / {d} + {eps!r})
{shift}
    for start in range(c * {chunk}, c * {chunk} + {chunk}, BLOCK):
{body}
'''
        if params["strategy"] != "pipe":  # pipe normalizes inside `_norm_pipe_kernel` only
            srcs.append(f'''
@triton.jit
def _norm_apply_kernel({sig}, part_ptr, row0, BLOCK: tl.constexpr):
    row = row0 + tl.program_id(0).to({it})
    c = tl.program_id(1).to({it})
{apply_rest}''')
        else:
            args = ", ".join(["h_ptr", "out_ptr", *norm_names, *leaf_names])
            srcs.append(f'''
@triton.jit
def _norm_apply_chunk({sig}, part_ptr, row, c, BLOCK: tl.constexpr):
{apply_rest}

@triton.jit
def _norm_pipe_kernel({sig}, part_ptr, row_apply, n_apply, row_stats, BLOCK: tl.constexpr):
    # the first n_apply * {split} programs normalize rows row_apply.. (their partials from the launch before);
    # the others compute the partials of rows row_stats.. (the next group, normalized by the next launch)
    pid = tl.program_id(0).to({it})
    if pid < n_apply * {split}:
        _norm_apply_chunk({args}, part_ptr, row_apply + pid // {split}, pid % {split}, BLOCK)
    else:
        q = pid - n_apply * {split}
        _norm_stats_chunk(h_ptr, part_ptr, {leaf_sig}row_stats + q // {split}, q % {split}, BLOCK)
''')
        if params["strategy"] == "resident":
            srcs += [RESIDENT_HELPER, *([PTX_HELPER] if params.get("PREFETCH") else []),
                     _resident_kernel(chain, sig, it, m, d, widx, eps, split, next_pow2(split),
                                      bool(params.get("EVICT")), int(params.get("PREFETCH", 0)))]
            fwd.append("if h.is_cuda:")
            fwd.append(f"    part = torch.empty(({m * split * 3},), device=h.device, dtype=torch.float32)")
            fwd.append(f"    cnt = torch.zeros(({m},), device=h.device, dtype=torch.int32)")
            fwd += ["    " + ln for ln in resident_launch("_norm_resident_kernel", ["h", "out", *norm_vals, *leaf_vals,
                                                                                     "part", "cnt"],
                                                          split, m, {"BLOCK": params["BLOCK"], **meta_common})]
            fwd.append("# the interpreter runs programs one after another (and no team fits: too few registers): the "
                       "same chunks, two kernels")
        if params["strategy"] == "stream":
            srcs += [RESIDENT_HELPER, _stream_kernel(chain, sig, it, m, d, eps, split, chunk, stats_lines,
                                                     count_lines, apply_lines)]
            fwd.append("if h.is_cuda:")
            fwd.append(f"    part = torch.empty(({m * split * 3},), device=h.device, dtype=torch.float32)")
            fwd.append(f"    cnt = torch.zeros(({m},), device=h.device, dtype=torch.int32)")
            # GROUP_ROWS caps the teams, the rows in flight (their chunks must still be in L2 when read again)
            fwd += ["    " + ln for ln in resident_launch("_norm_stream_kernel", ["h", "out", *norm_vals, *leaf_vals,
                                                                                   "part", "cnt"],
                                                          split, min(m, params["GROUP_ROWS"] or m),
                                                          {"BLOCK": block, **meta_common})]
            fwd.append("# under the interpreter (programs one after another) or without room for a team: the same "
                       "chunks, two kernels")
        fwd.append(f"part = torch.empty(({m * split * 3},), device=h.device, dtype=torch.float32)")
        # GROUP_ROWS > 0: statistics then normalization per group of rows, so that the second read of a
        # group can come from L2 (a group must fit in it: LayerNorm's 16 MB rows, one or two at a time)
        g = params["GROUP_ROWS"] or m
        if params["strategy"] == "pipe":  # the first group's partials, then a launch a group (module docstring)
            fwd.append(launch("_norm_stats_kernel", f"({min(g, m)}, {split})", ["h", "part", *leaf_vals, "0"],
                              {"BLOCK": block, **meta_common}))
            fwd.append(f"for row0 in range(0, {m}, {g}):")
            fwd.append(f"    n_apply = min({g}, {m} - row0)")
            fwd.append(f"    n_stats = max(0, min({g}, {m} - row0 - {g}))")
            fwd.append("    " + launch("_norm_pipe_kernel", f"((n_apply + n_stats) * {split},)",
                                        ["h", "out", *norm_vals, *leaf_vals, "part", "row0", "n_apply", f"row0 + {g}"],
                                        {"BLOCK": block, **meta_common}))
            fwd.append("return out")
            return Kernel(NAME, policy, description(chain), params, srcs, fwd)
        fwd.append(f"for row0 in range(0, {m}, {g}):")
        fwd.append(f"    rows = min({g}, {m} - row0)")
        fwd.append("    " + launch("_norm_stats_kernel", f"(rows, {split})", ["h", "part", *leaf_vals, "row0"],
                                    {"BLOCK": block, **meta_common}))
        fwd.append("    " + launch("_norm_apply_kernel", f"(rows, {split})",
                                    ["h", "out", *norm_vals, *leaf_vals, "part", "row0"], {"BLOCK": block, **meta_common}))
    fwd.append("return out")
    return Kernel(NAME, policy, description(chain), params, srcs, fwd)


def _stream_kernel(chain: Chain, sig: str, it: str, m: int, d: int, eps: float, split: int, chunk: int,
                   stats_lines: list[str], count_lines: list[str], apply_lines: list[str]) -> str:
    """A persistent kernel (GPU only) of teams of `split` programs a row: each member streams its chunk for the
    lane-wise Welford partials (the `split` statistics kernel's loop), the team's partials are exchanged and
    combined in a fixed order, and the member streams its chunk again to normalize it, read from L2 where it
    was just read (the `split` normalize kernel's loop). One launch, the input read from DRAM about once, with
    chunks of any size (`resident` holds at most 64 values a thread in registers)."""
    def block(lines: list[str], depth: int) -> str:
        return "\n".join(" " * (4 * depth) + line for line in lines)

    shift = [ln.strip() for ln in _shift(chain, chain.core_shape).splitlines()]
    exchange = team_exchange(["tn", "tmean", "tm2"], [("pn", "0.0"), ("pmean", "0.0"), ("pm2", "0.0")], split,
                             next_pow2(split))
    return _persistent("_norm_stream_kernel", sig, it, split, m) + f'''        base = row * {d}
{block(shift, 2)}
        mean = tl.zeros([BLOCK], tl.float32)
        m2 = tl.zeros([BLOCK], tl.float32)
        for start in range(c * {chunk}, c * {chunk} + {chunk}, BLOCK):
{block(stats_lines, 3)}
{block(count_lines + combine_lines("n", "mean", "m2", "t"), 2)}
{block(exchange, 2)}
{block(combine_lines("pn", "pmean", "pm2", "t"), 2)}
        rstd = 1.0 / tl.sqrt_rn(tm2 / {d} + {eps!r})
        for start in range(c * {chunk}, c * {chunk} + {chunk}, BLOCK):
{block(apply_lines, 3)}
'''


def _resident_kernel(chain: Chain, sig: str, it: str, m: int, d: int, widx: str, eps: float, split: int,
                     sp2: int, evict: bool = False, prefetch: int = 0) -> str:
    """A persistent kernel (GPU only) of teams of `split` programs, each holding its chunk of BLOCK elements of a
    segment in registers (see the module docstring); `evict`: the input's loads and the output's stores are
    evicted from L2 first and the weights' loads last (the `EVICT` schedule); `prefetch` 1 (before the team's
    wait) or 2 (first in the row's turn): the L2 is asked for this member's chunk of the team's next row and of
    the weights this row reads (the `PREFETCH` schedule)."""
    first, last = ("evict_first", "evict_last") if evict else ("", "")
    s = chain.core_shape
    out_t = tl_dtype(chain.out_dtype)
    em = ExprEmitter()
    if prefetch == 2:  # first thing in the row's turn, while the registers are free
        em.lines += _prefetch_lines(chain, s, it, m, d, widx)
    em.lines += [f"base = row * {d}"] + [ln.strip() for ln in _shift(chain, s).splitlines()]
    em.lines += [f"cols = c * BLOCK + tl.arange(0, BLOCK).to({it})", f"mask = cols < {d}", "idx = base + cols",
                 "col = cols", root_load(chain, s, "idx", "mask", evict=first)]
    v = em.emit(chain.prologue, "x", "idx", s, "mask")
    # the chunk's exact two-pass statistics from registers, shifted by the segment's first value (as `fused`)
    em.lines += [f"vs = tl.where(mask, {v} - x0, 0.0)", "cn = tl.sum(mask.to(tl.float32), axis=0)",
                 "cmean = tl.sum(vs, axis=0) / tl.maximum(cn, 1.0)", "dv = tl.where(mask, vs - cmean, 0.0)",
                 "cm2 = tl.sum(dv * dv, axis=0)"]
    if prefetch == 1:  # before the team's wait
        em.lines += _prefetch_lines(chain, s, it, m, d, widx)
    em.lines += team_exchange(["cn", "cmean", "cm2"], [("pn", "0.0"), ("pmean", "0.0"), ("pm2", "0.0")], split, sp2)
    em.lines += combine_lines("pn", "pmean", "pm2", "t")
    em.lines += [f"rstd = 1.0 / tl.sqrt_rn(tm2 / {d} + {eps!r})", "y = (vs - tmean) * rstd"]
    y = _affine(chain, em, "y", widx, "mask", last)
    r = em.emit(chain.epilogue, y, "idx", chain.out_shape, "mask")
    hint = f", eviction_policy={first!r}" if first else ""
    em.lines.append(f"tl.store(out_ptr + idx, {r}.to({out_t}), mask=mask{hint})")
    body = "\n".join("        " + line for line in em.lines)
    return _persistent("_norm_resident_kernel", sig, it, split, m) + body + "\n"


def _prefetch_lines(chain: Chain, s: tuple[int, ...], it: str, m: int, d: int, widx: str) -> list[str]:
    """Kernel lines (`PREFETCH`, NVIDIA) asking the L2 for this member's chunk of the team's next row (when it has
    one) and, for a LayerNorm (weights shaped like the row), of the weights this row reads: one address each 256
    bytes, clamped into the row, so every prefetched byte is inside its tensor."""
    core = chain.core
    assert core is not None
    pcol = f"tl.minimum(c * BLOCK + tl.arange(0, BLOCK // 64).to({it}) * 64, {d - 64})"
    lines = ["if _KSTRATA_PTX:", f"    pcol = {pcol}", f"    if row + teams < {m}:",
             f"        pidx = (row + teams) * {d} + pcol",
             "        " + l2_prefetch("h_ptr", broadcast_offset(chain.root.shape, s, "pidx"))]
    if widx != "col":  # GroupNorm's weights are a channel each: a few bytes, and 256 from one would overrun them
        return lines
    return lines + [f"    {l2_prefetch(ptr, 'pcol')}" for ptr, a in (("w_ptr", core.args[1]), ("b_ptr", core.args[2]))
                    if a is not None]


def _persistent(name: str, sig: str, it: str, split: int, m: int) -> str:
    """The opening of a persistent kernel of teams of `split` programs (`resident`, `stream`): member `c` of the
    team that takes rows `pid // split`, then every `teams`-th row of the `m`, up to the loop body."""
    return f'''
@triton.jit(do_not_specialize=["teams"])
def {name}({sig}, part_ptr, cnt_ptr, teams, BLOCK: tl.constexpr):
    pid = tl.program_id(0).to({it})
    c = pid % {split}
    for row in range(pid // {split}, {m}, teams):
'''
