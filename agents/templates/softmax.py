"""Softmax and log-softmax over the last dim, with pointwise ops before (fused into the loads) and after.

- `fused`: a row fits in registers; a program takes BLOCK_M rows, reads them once, writes them once.
- `split`: very wide rows (4096 x 393216) are split across SPLIT programs per row. A first kernel computes
  per-chunk online (max, sum of exp) partials lane-wise; a second kernel combines its row's partials and
  normalizes its chunk. `GROUP_ROWS` > 0 runs both kernels on groups of rows in turn, so that a group's
  second read can hit L2 (a group of GROUP_ROWS rows must fit in it); 0 runs all rows at once. With `GRAPH` 1
  the groups' launches are captured once into a CUDA graph and replayed (`agents.cuda_graphs`): the gap task's
  4096 rows in groups of 8 are 1024 launches of a few microseconds each, more than a host launching Triton
  kernels one by one keeps up with. Not yet timed on a GPU.
- `team` (GPU only): one persistent kernel of RESIDENT x SM-count programs; teams of SPLIT programs take a
  row at a time, exchange their partials through a per-row counter (all programs resident, so the wait
  ends; a bounded spin turns a scheduling surprise into a wrong result the checks reject, not a hang) and
  re-read their chunk from L2. On the CPU (the interpreter runs programs one by one) the same source runs
  the `split` kernels with the same SPLIT.
- `resident` (GPU only): as `team`, but each program holds its whole chunk of BLOCK elements in registers
  (one load of the chunk, at most 64 values a thread), so the row is read from DRAM once and never again;
  teams are as many as the compiled kernel's occupancy keeps resident (`codegen.RESIDENT_HELPER`). Where not
  even one team fits (and on the CPU) the `split` kernels run with the same chunks.
"""

from __future__ import annotations

import math

from kstrata.agents.templates.base import Params, cdiv, next_pow2
from kstrata.agents.templates.codegen import (
    RESIDENT_HELPER,
    ExprEmitter,
    Kernel,
    check_shapes,
    head_code,
    index_type,
    launch,
    leaf_kernel_args,
    resident_launch,
    resident_schedules,
    root_load,
    team_exchange,
    tl_dtype,
)
from kstrata.agents.templates.graph import Chain, describe

NAME = "softmax"
FUSED_MAX = 16384
#: The most programs a `resident` team may have (its partials are loaded as one vector).
MAX_TEAM = 1024

def _combine_lines(m: str, sm: str) -> list[str]:
    """Kernel lines combining per-lane (max, sum of exp(x - max)) into the row totals `tm`, `ts` (plain
    reductions; lanes that saw nothing have max -inf and sum 0)."""
    return [f"tm = tl.max({m}, axis=0)", "safe = tl.where(tm == float('-inf'), 0.0, tm)",
            f"ts = tl.sum(tl.where({m} == float('-inf'), 0.0, {sm} * tl.exp({m} - safe)), axis=0)"]




def geometry(chain: Chain) -> tuple[int, int]:
    s = chain.core_shape
    return math.prod(s[:-1]), s[-1]


def applies(chain: Chain, policy: str = "strict") -> str | None:
    core = chain.core
    if core is None or core.op not in ("softmax", "log_softmax"):
        return "the graph has no softmax or log_softmax"
    s = chain.core_shape
    dim = core.attrs.get("dim")
    if dim is None or dim not in (-1, len(s) - 1):
        return f"{core.op} over dim {dim} of a rank-{len(s)} tensor (only the last dim)"
    return None


def space(chain: Chain) -> tuple[tuple[tuple[str, tuple[object, ...]], ...], tuple[tuple[str, object], ...]]:
    m, n = geometry(chain)
    fused = n <= FUSED_MAX
    sp: list[tuple[str, tuple[object, ...]]] = [
        ("strategy", ("fused", "split", "team") if fused else ("split", "team", "resident")),
        ("BLOCK_M", (1, 2, 4, 8, 16, 32, 64) if fused else (1,)),
        ("BLOCK", (1024, 2048, 4096, 8192) if fused else (1024, 2048, 4096, 8192, 16384, 32768)),
        ("SPLIT", (1, 2, 4, 8, 16, 32, 64)),
        ("GROUP_ROWS", (0, 8, 16, 32) if m > 8 else (0,)),
        ("num_warps", (4, 8, 16)),
        ("RESIDENT", (1, 2, 3, 4)),
        # row groups launched from a CUDA graph (`norm`'s GRAPH): 4096 rows in groups of 8 are 1024 launches of
        # a few microseconds each, which a host launching Triton kernels one by one cannot keep up with
        ("GRAPH", (0, 1) if m > 8 else (0,)),
    ]
    if fused:
        default = {"strategy": "fused", "BLOCK_M": max(1, min(16, 2048 // next_pow2(n))), "BLOCK": 1024, "SPLIT": 1,
                   "GROUP_ROWS": 0, "num_warps": 4 if n <= 1024 else 8, "RESIDENT": 1, "GRAPH": 0}
    else:
        split = max(1, min(64, next_pow2(cdiv(4 * 132, m))))
        default = {"strategy": "split", "BLOCK_M": 1, "BLOCK": 4096, "SPLIT": split, "GROUP_ROWS": 0, "num_warps": 8,
                   "RESIDENT": 1, "GRAPH": 0}
    return tuple(sp), tuple(default.items())


def hints(chain: Chain) -> list[Params]:
    """Row groups that fit in L2 (50 MB on an H100/H200) with enough programs per group to fill the GPU."""
    m, n = geometry(chain)
    if n <= FUSED_MAX or m <= 8:
        return []
    row_bytes = 4 * n
    # a chunk in registers first (a row read once; the teams as many as stay resident), 32 or 64 values a thread
    out: list[Params] = [{"strategy": "resident", "BLOCK_M": 1, "GROUP_ROWS": 0, "SPLIT": 1, "BLOCK": b, "num_warps": w,
                          "RESIDENT": 1} for b, w in resident_schedules(n, MAX_TEAM)]
    # persistent teams (the H200 run: RESIDENT 2 beat 1, 6080 us against 9161 us at SPLIT 16)
    for k in (4, 8, 16, 32):
        for resident in (2, 3, 4):
            out.append({"strategy": "team", "BLOCK_M": 1, "GROUP_ROWS": 0, "SPLIT": k, "BLOCK": 4096, "num_warps": 8,
                        "RESIDENT": resident})
    # last, the row groups (a group and its output in L2) from a CUDA graph, then launched by the host: on task 03
    # (H100, 2026-12-07) groups of 8 from a graph ran 9241 us against 5048 for a resident team (BLOCK 16384)
    groups = [g for g in (8, 16, 32) if g < m and 2 * g * row_bytes <= 48 << 20]
    graphed = [{"strategy": "split", "BLOCK_M": 1, "GROUP_ROWS": g, "SPLIT": max(1, min(64, next_pow2(cdiv(256, g)))),
                "BLOCK": 4096, "num_warps": 8, "GRAPH": 1} for g in groups]
    return out + graphed + [{**h, "GRAPH": 0} for h in graphed]


def valid(chain: Chain, p: Params) -> bool:
    m, n = geometry(chain)
    if p.get("GRAPH") and not (p["strategy"] == "split" and p["GROUP_ROWS"] >= 1):
        return False  # a graph only where the forward launches two kernels a row group
    if p["strategy"] == "fused":
        return bool(n <= FUSED_MAX and p["SPLIT"] == 1 and p["BLOCK"] == 1024 and p["GROUP_ROWS"] == 0
                    and next_pow2(n) * p["BLOCK_M"] <= 32768 and p["RESIDENT"] == 1)
    if p["strategy"] == "team":
        return bool(p["BLOCK_M"] == 1 and p["GROUP_ROWS"] == 0 and 2 <= p["SPLIT"] <= cdiv(n, p["BLOCK"])
                    and p["BLOCK"] <= 8192)
    if p["strategy"] == "resident":  # the chunk is BLOCK (SPLIT follows), at most 64 values a thread
        return bool(p["BLOCK_M"] == 1 and p["GROUP_ROWS"] == 0 and p["SPLIT"] == 1 and p["RESIDENT"] == 1
                    and 2 <= cdiv(n, p["BLOCK"]) <= MAX_TEAM and p["BLOCK"] <= 64 * 32 * p["num_warps"])
    return bool(p["BLOCK_M"] == 1 and p["SPLIT"] <= cdiv(n, p["BLOCK"]) and (p["GROUP_ROWS"] == 0 or p["GROUP_ROWS"] < m)
                and p["RESIDENT"] == 1 and p["BLOCK"] <= 8192)


def description(chain: Chain, policy: str = "strict") -> str:
    assert chain.core is not None
    m, n = geometry(chain)
    head = f"{chain.head.op} (PyTorch), then " if chain.head else ""
    return (f"{head}{chain.core.op} over {m} rows of {n} (prologue {describe(chain.prologue)}, epilogue "
            f"{describe(chain.epilogue)}) in Triton")


def kernel(chain: Chain, params: Params, policy: str) -> Kernel:
    core = chain.core
    assert core is not None
    log = core.op == "log_softmax"
    m, n = geometry(chain)
    s = chain.core_shape
    it = index_type(s, chain.root.shape)
    out_t = tl_dtype(chain.out_dtype)
    leaf_names, leaf_vals = leaf_kernel_args(chain)
    lsig = "".join(a + ", " for a in leaf_names)
    fwd = check_shapes(chain) + head_code(chain)
    fwd.append(f"out = torch.empty({chain.out_shape!r}, device=h.device, dtype=torch.{chain.out_dtype})")
    srcs: list[str] = []
    nw = {"num_warps": params["num_warps"]}
    if params["strategy"] == "fused":
        bm, bn = params["BLOCK_M"], next_pow2(n)
        em = ExprEmitter()
        em.lines += [f"row = tl.program_id(0).to({it}) * BLOCK_M + tl.arange(0, BLOCK_M).to({it})[:, None]",
                     f"col = tl.arange(0, BLOCK_N).to({it})[None, :]", f"mask = (row < {m}) & (col < {n})",
                     f"idx = row * {n} + col", root_load(chain, s, "idx", "mask")]
        v = em.emit(chain.prologue, "x", "idx", s, "mask")
        em.lines += [f"v = tl.where(mask, {v}, float('-inf'))", "mx = tl.max(v, axis=1)",
                     "mx = tl.where(mx == float('-inf'), 0.0, mx)", "e = tl.where(mask, tl.exp(v - mx[:, None]), 0.0)",
                     "sm = tl.sum(e, axis=1)"]
        em.lines.append("y = v - mx[:, None] - tl.log(sm)[:, None]" if log else "y = e / sm[:, None]")
        r = em.emit(chain.epilogue, "y", "idx", chain.out_shape, "mask")
        em.lines.append(f"tl.store(out_ptr + idx, {r}.to({out_t}), mask=mask)")
        body = "\n".join("    " + line for line in em.lines)
        srcs.append(f'''
@triton.jit
def _softmax_fused_kernel(h_ptr, out_ptr, {lsig}BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
{body}
''')
        fwd.append(launch("_softmax_fused_kernel", f"(triton.cdiv({m}, {bm}),)", ["h", "out", *leaf_vals],
                          {"BLOCK_M": bm, "BLOCK_N": bn, **nw}))
    else:
        block, split = params["BLOCK"], params["SPLIT"]
        if params["strategy"] == "resident":  # the chunk is BLOCK; the two-kernel path takes it in 4096 pieces
            split, block = cdiv(n, block), min(block, 4096)
        chunk = cdiv(cdiv(n, split), block) * block
        split = cdiv(n, chunk)
        sp2 = next_pow2(split)
        em = ExprEmitter()
        em.lines += [f"cols = start + tl.arange(0, BLOCK).to({it})", f"mask = cols < {n}", "idx = base + cols",
                     root_load(chain, s, "idx", "mask")]
        v = em.emit(chain.prologue, "x", "idx", s, "mask")
        em.lines += [f"v = tl.where(mask, {v}, float('-inf'))", "nm = tl.maximum(m, v)",
                     "safe = tl.where(nm == float('-inf'), 0.0, nm)",
                     "sm = sm * tl.exp(m - safe) + tl.where(mask, tl.exp(v - safe), 0.0)", "m = nm"]
        body = "\n".join("        " + line for line in em.lines)
        stats_body = body
        stats = "\n".join("    " + line for line in _combine_lines("m", "sm"))
        combine = "\n".join("    " + line for line in _combine_lines("pmax", "psum"))
        srcs.append(f'''
@triton.jit
def _softmax_stats_kernel(h_ptr, part_ptr, {lsig}row0, BLOCK: tl.constexpr):
    row = row0 + tl.program_id(0).to({it})
    c = tl.program_id(1).to({it})
    base = row * {n}
    m = tl.full([BLOCK], float('-inf'), tl.float32)
    sm = tl.zeros([BLOCK], tl.float32)
    for start in range(c * {chunk}, c * {chunk} + {chunk}, BLOCK):
{body}
{stats}
    p = part_ptr + (row * {split} + c) * 2
    tl.store(p, tm)
    tl.store(p + 1, ts)
''')
        em = ExprEmitter()
        em.lines += [f"cols = start + tl.arange(0, BLOCK).to({it})", f"mask = cols < {n}", "idx = base + cols",
                     root_load(chain, s, "idx", "mask")]
        v = em.emit(chain.prologue, "x", "idx", s, "mask")
        em.lines.append(f"y = {v} - tm - lse" if log else f"y = tl.exp({v} - tm) * inv")
        r = em.emit(chain.epilogue, "y", "idx", chain.out_shape, "mask")
        em.lines.append(f"tl.store(out_ptr + idx, {r}.to({out_t}), mask=mask)")
        body = "\n".join("        " + line for line in em.lines)
        apply_body = body
        srcs.append(f'''
@triton.jit
def _softmax_apply_kernel(h_ptr, out_ptr, part_ptr, {lsig}row0, BLOCK: tl.constexpr):
    row = row0 + tl.program_id(0).to({it})
    c = tl.program_id(1).to({it})
    base = row * {n}
    j = tl.arange(0, {sp2})
    pp = part_ptr + row * {split * 2} + j * 2
    pmax = tl.load(pp, mask=j < {split}, other=float('-inf'))
    psum = tl.load(pp + 1, mask=j < {split}, other=0.0)
{combine}
    inv = 1.0 / ts
    lse = tl.log(ts)
    for start in range(c * {chunk}, c * {chunk} + {chunk}, BLOCK):
{body}
''')
        if params["strategy"] == "team":
            srcs.append(_team_kernel(stats_body, stats, apply_body, combine, lsig, it, n, m, split, sp2, chunk))
            fwd.append("if h.is_cuda:")
            fwd.append(f"    part = torch.empty(({m * split * 2},), device=h.device, dtype=torch.float32)")
            fwd.append(f"    cnt = torch.zeros(({m},), device=h.device, dtype=torch.int32)")
            fwd.append(f"    teams = max(1, {params['RESIDENT']} * torch.cuda.get_device_properties(h.device).multi_processor_count // {split})")
            fwd.append("    " + launch("_softmax_team_kernel", f"(teams * {split},)", ["h", "out", "part", "cnt", *leaf_vals, "teams"],
                                        {"BLOCK": block, **nw}))
            fwd.append("    return out")
            fwd.append("# the interpreter runs programs one after another: a team would wait for itself; same split, two kernels")
        if params["strategy"] == "resident":
            srcs += [RESIDENT_HELPER, _resident_kernel(chain, log, lsig, it, n, m, split, sp2)]
            fwd.append("if h.is_cuda:")
            fwd.append(f"    part = torch.empty(({m * split * 2},), device=h.device, dtype=torch.float32)")
            fwd.append(f"    cnt = torch.zeros(({m},), device=h.device, dtype=torch.int32)")
            fwd += ["    " + ln for ln in resident_launch("_softmax_resident_kernel", ["h", "out", "part", "cnt", *leaf_vals],
                                                          split, m, {"BLOCK": params["BLOCK"], **nw})]
            fwd.append("# the interpreter runs programs one after another (and no team fits: too few registers): the "
                       "same chunks, two kernels")
        fwd.append(f"part = torch.empty(({m * split * 2},), device=h.device, dtype=torch.float32)")
        g = params["GROUP_ROWS"] or m
        fwd.append(f"for row0 in range(0, {m}, {g}):")
        fwd.append(f"    rows = min({g}, {m} - row0)")
        fwd.append("    " + launch("_softmax_stats_kernel", f"(rows, {split})", ["h", "part", *leaf_vals, "row0"],
                                    {"BLOCK": block, **nw}))
        fwd.append("    " + launch("_softmax_apply_kernel", f"(rows, {split})", ["h", "out", "part", *leaf_vals, "row0"],
                                    {"BLOCK": block, **nw}))
    fwd.append("return out")
    return Kernel(NAME, policy, description(chain), params, srcs, fwd)


def _team_kernel(stats_body: str, stats: str, apply_body: str, combine: str, lsig: str, it: str, n: int, m: int,
                 split: int, sp2: int, chunk: int) -> str:
    """A persistent kernel (GPU only): `teams * split` programs, all resident, a team of `split` programs per row.

    Each member computes its chunk's (max, sum), publishes it, waits on the row's counter for its siblings,
    combines the row's partials and normalizes its chunk: the second read of the chunk comes from L2 (a team
    has one 1.5 MB row in flight; all teams together far less than the 50 MB L2), so DRAM sees the input once.
    """
    def indent(text: str) -> str:
        return "\n".join("    " + line if line else line for line in text.splitlines())

    exchange = "\n".join("        " + ln for ln in team_exchange(["tm", "ts"], [("pmax", "float('-inf')"), ("psum", "0.0")],
                                                                 split, sp2))

    return f'''
@triton.jit
def _softmax_team_kernel(h_ptr, out_ptr, part_ptr, cnt_ptr, {lsig}teams, BLOCK: tl.constexpr):
    pid = tl.program_id(0).to({it})
    c = pid % {split}
    for row in range(pid // {split}, {m}, teams):
        base = row * {n}
        m = tl.full([BLOCK], float('-inf'), tl.float32)
        sm = tl.zeros([BLOCK], tl.float32)
        for start in range(c * {chunk}, c * {chunk} + {chunk}, BLOCK):
{indent(stats_body)}
{indent(stats)}
{exchange}
{indent(combine)}
        inv = 1.0 / ts
        lse = tl.log(ts)
        for start in range(c * {chunk}, c * {chunk} + {chunk}, BLOCK):
{indent(apply_body)}
'''


def _resident_kernel(chain: Chain, log: bool, lsig: str, it: str, n: int, m: int, split: int, sp2: int) -> str:
    """A persistent kernel (GPU only) of teams of `split` programs, each holding its chunk of BLOCK elements of a
    row in registers: the chunk's (max, sum of exp) published, the team's combined, the chunk normalized from
    registers and stored; the row is read once."""
    s = chain.core_shape
    out_t = tl_dtype(chain.out_dtype)
    em = ExprEmitter()
    em.lines += [f"base = row * {n}", f"cols = c * BLOCK + tl.arange(0, BLOCK).to({it})", f"mask = cols < {n}",
                 "idx = base + cols", root_load(chain, s, "idx", "mask")]
    v = em.emit(chain.prologue, "x", "idx", s, "mask")
    em.lines += [f"v = tl.where(mask, {v}, float('-inf'))", "cm = tl.max(v, axis=0)",
                 "csafe = tl.where(cm == float('-inf'), 0.0, cm)",
                 "cs = tl.sum(tl.where(mask, tl.exp(v - csafe), 0.0), axis=0)"]
    em.lines += team_exchange(["cm", "cs"], [("pmax", "float('-inf')"), ("psum", "0.0")], split, sp2)
    em.lines += _combine_lines("pmax", "psum")
    em.lines.append("y = v - tm - tl.log(ts)" if log else "y = tl.exp(v - tm) / ts")
    r = em.emit(chain.epilogue, "y", "idx", chain.out_shape, "mask")
    em.lines.append(f"tl.store(out_ptr + idx, {r}.to({out_t}), mask=mask)")
    body = "\n".join("        " + line for line in em.lines)
    return f'''
@triton.jit(do_not_specialize=["teams"])
def _softmax_resident_kernel(h_ptr, out_ptr, part_ptr, cnt_ptr, {lsig}teams, BLOCK: tl.constexpr):
    pid = tl.program_id(0).to({it})
    c = pid % {split}
    for row in range(pid // {split}, {m}, teams):
{body}
'''
