"""Max and average pooling of a contiguous (N, C, *spatial) or unbatched (C, *spatial) tensor over 1, 2 or 3
spatial dims (any kernel, stride, padding, dilation; average with or without the padding counted), with
pointwise ops before (applied to each loaded input, padding after them, as PyTorch pads the op's input)
and after (fused into the store). This module is the `pool2d` template and the kernels `pool1d` and
`pool3d` share: a 1-D pooling is a 2-D one with a (1, k) window over the (planes, L) matrix, so a tile
spans BLOCK_H planes; a 3-D pooling runs the 2-D tiles per output depth, with the depth window unrolled
around them.

Two strategies:
- `direct`: a program computes a BLOCK_H x BLOCK_W tile of one output plane (of one output depth) with
  kd*kh*kw window loads per output (they overlap at small strides and are served from L1/L2, so DRAM sees
  each input about once);
- `rows` (2-D and 3-D, stride 1 and dilation 1 along H): a program walks BLOCK_H + kh - 1 input rows of a
  BLOCK_W wide column strip; per input row it loads the kd*kw shifted vectors once, reduces them to a
  max/sum over depth and width, and keeps the last kh of those in registers (a rolling window), so each
  output costs kd*kw loads instead of kd*kh*kw. Its `AHEAD` (0, 1, 2) software-prefetches: iteration r
  issues the raw loads of input row r + AHEAD, carried in registers, before it reduces row r, so AHEAD + 1
  rows of loads are in flight instead of one (0 is the plain loop). On the H200 (2026-12-04, the gap task's
  max pool, before the maxima became single `max.NaN`) it gained nothing: 607.8 us at AHEAD 1 and 621.2 at 2
  against 591.3 at 0 (BLOCK_H 64, BLOCK_W 128, 2 warps); after it, again nothing (BLOCK_H 32, BLOCK_W 256,
  4 warps: 550.5 us at 0, 565.6 at 1, 584.9 at 2; `templates-bench-2026-12-04-c.log`). pool2d's hints still try
  it, and the tuner decides. Without prefetch (AHEAD 0) the loop is `_rows_unrolled`: UNROLL (1, 2, 4) output
  rows an iteration, the window's first kh - 1 rows reduced before it, the taps' columns computed once, and a
  max pooling's taps clamped into the input where the dilation is 1 (`clamps`: no masks, no pads). Compiled
  for cuda:90 the gap task's loop went from 46 to 32 SASS instructions an output (2 outputs a thread), where
  the H200 had run it at 75% issue (2026-12-04). Fewer instructions did not make it faster: on an H100
  (2026-12-07, BLOCK_H 32, BLOCK_W 256, 4 warps) the kernel ran 727 us at UNROLL 4 and 653 us at AHEAD 1
  (`template-probe-2026-12-07-f.md`), so the hints try the prefetch first.
PyTorch's max pooling also writes an int64 index per output, which this does not.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from kstrata.agents.templates.base import Params
from kstrata.agents.templates.codegen import (
    ExprEmitter,
    Kernel,
    check_shapes,
    head_code,
    index_type,
    launch,
    leaf_kernel_args,
    masked_args,
    root_load,
    tl_dtype,
)
from kstrata.agents.templates.graph import ROOT, Chain, describe

NAME = "pool2d"
#: The tile sizes both strategies take (BLOCK_H: output rows, or planes of a 1-D pooling).
_BLOCKS = (("BLOCK_H", (4, 8, 16, 32, 64)), ("BLOCK_W", (16, 32, 64, 128, 256)), ("num_warps", (2, 4, 8)))
#: Input rows whose loads `rows` issues ahead of the row it reduces (0: none, the loop as it was).
_AHEAD = ("AHEAD", (0, 1, 2))
#: Output rows an iteration of `rows` without prefetch (a static unroll, `_rows_unrolled`).
_UNROLL = ("UNROLL", (1, 2, 4))
#: Carried prefetched values a thread may hold (AHEAD x kd*kw taps x its share of BLOCK_W), fp32-sized: past
#: it the carried loads would spill, and the prefetch would cost what it hides.
_AHEAD_REGS = 64


@dataclass(frozen=True)
class Dim:
    """One spatial dim of the window: input and output sizes, kernel, stride, padding, dilation."""

    size: int
    out: int
    k: int = 1
    s: int = 1
    p: int = 0
    d: int = 1


@dataclass(frozen=True)
class Geometry:
    """The pooling as the kernels see it: `planes` independent (D, H, W) volumes; D is 1 below 3-D and H the
    planes themselves for 1-D (then `planes` is 1)."""

    rank: int
    planes: int
    dd: Dim
    dh: Dim
    dw: Dim
    is_max: bool
    count_include_pad: bool

    @property
    def counted(self) -> tuple[tuple[str, Dim], ...]:
        """The dims the average's divisor counts (the real spatial dims)."""
        return ((("d", self.dd),) if self.rank == 3 else ()) + ((("h", self.dh),) if self.rank >= 2 else ()) + \
            (("w", self.dw),)


def rank_of(chain: Chain) -> int | None:
    core = chain.core
    if core is None or not core.op.startswith(("max_pool", "avg_pool")):
        return None
    return int(core.op[-2])


def applies_rank(chain: Chain, rank: int) -> str | None:
    """None when the chain is a `rank`-D pooling the kernels take, else why not."""
    if rank_of(chain) != rank:
        return f"the graph has no {rank}-D pooling"
    if len(chain.core_shape) not in (rank + 1, rank + 2):
        return f"{rank}-D pooling of a rank-{len(chain.core_shape)} tensor (batched or unbatched channels first only)"
    return None


def for_rank(rank: int, name: str) -> tuple[Callable[..., str | None], Callable[[Chain, Params, str], Kernel]]:
    """(applies, kernel) of the template `name` for `rank`-D pooling (pool1d, pool3d share this module's kernels)."""
    def applies(chain: Chain, policy: str = "strict") -> str | None:
        return applies_rank(chain, rank)

    def kernel(chain: Chain, params: Params, policy: str) -> Kernel:
        return render(chain, params, policy, name)

    return applies, kernel


def applies(chain: Chain, policy: str = "strict") -> str | None:
    return applies_rank(chain, 2)


def geometry(chain: Chain) -> Geometry:
    core = chain.core
    assert core is not None
    a = core.attrs
    r = int(core.op[-2])
    s, o = chain.core_shape, chain.out_shape
    dims = [Dim(s[i - r], o[i - r], a["kernel"][i], a["stride"][i], a["padding"][i], a["dilation"][i]) for i in range(r)]
    planes = math.prod(s[:-r])
    if r == 1:
        return Geometry(1, 1, Dim(1, 1), Dim(planes, planes), dims[0], core.op.startswith("max"),
                        bool(a.get("count_include_pad", True)))
    dd = dims[0] if r == 3 else Dim(1, 1)
    return Geometry(r, planes, dd, dims[-2], dims[-1], core.op.startswith("max"), bool(a.get("count_include_pad", True)))


def _rows_ok(g: Geometry) -> bool:
    """The rolling-window strategy needs consecutive output rows to read consecutive input rows."""
    return g.rank >= 2 and g.dh.s == 1 and g.dh.d == 1


def space(chain: Chain) -> tuple[tuple[tuple[str, tuple[object, ...]], ...], tuple[tuple[str, object], ...]]:
    g = geometry(chain)
    rows = _rows_ok(g)
    sp = (("strategy", ("direct", "rows") if rows else ("direct",)), *_BLOCKS, _AHEAD, _UNROLL if rows else ("UNROLL", (1,)))
    ow = g.dw.out
    bw = 64 if ow >= 64 else (32 if ow >= 32 else 16)
    if _rows_default(g):
        return sp, (("strategy", "rows"), ("BLOCK_H", 32), ("BLOCK_W", 128), ("num_warps", 4), ("AHEAD", 0),
                    ("UNROLL", 4))
    return sp, (("strategy", "direct"), ("BLOCK_H", 8), ("BLOCK_W", bw), ("num_warps", 4), ("AHEAD", 0), ("UNROLL", 1))


def _rows_default(g: Geometry) -> bool:
    return _rows_ok(g) and g.dw.out >= 64


def hints(chain: Chain) -> list[Params]:
    """Where `rows` is the default: it with rows prefetched ahead, also at 2 warps. The plain loop's best on the
    H200 (2026-12-03, k=4 s=1 p=1 fp32 (16, 64, 384, 384): BLOCK_H 32, BLOCK_W 128, 2 warps, 598 us) reached 49%
    of the copy bandwidth; on 2026-12-04 the prefetch did not beat it (the module docstring)."""
    if not _rows_default(geometry(chain)):
        return []
    # the prefetching loop first: on the gap task (H100, 2026-12-07, BLOCK_H 32, BLOCK_W 256, 4 warps) its kernel
    # ran 653 us at AHEAD 1 against 727 for the unrolled loop at UNROLL 4 (fewer instructions, 40 registers
    # against 39: not occupancy); then the unrolled loop at two outputs a thread, and less unrolled
    return [{"AHEAD": 1, "UNROLL": 1, "BLOCK_W": 256}, {"BLOCK_W": 256}, {"UNROLL": 1, "BLOCK_W": 256},
            {"UNROLL": 2, "BLOCK_W": 256}, {"AHEAD": 1, "UNROLL": 1}, {"BLOCK_W": 256, "BLOCK_H": 64},
            {"num_warps": 2}, {"AHEAD": 2, "UNROLL": 1}, {"num_warps": 2, "AHEAD": 1, "UNROLL": 1}]


def valid(chain: Chain, p: Params) -> bool:
    ahead = p.get("AHEAD", 0)
    unroll = p.get("UNROLL", 1)
    if unroll > 1 and (p["strategy"] != "rows" or ahead or p["BLOCK_H"] % unroll):
        return False  # the unrolled loop is `rows` without prefetch
    if p["strategy"] == "rows":
        g = geometry(chain)
        carried = ahead * _taps(g) * max(1, p["BLOCK_W"] // (32 * p["num_warps"]))
        return bool(_rows_ok(g) and p["BLOCK_W"] >= 32 and p["BLOCK_H"] >= 4 and carried <= _AHEAD_REGS)
    return bool(ahead == 0 and 64 <= p["BLOCK_H"] * p["BLOCK_W"] <= 4096)  # AHEAD is a `rows` parameter


def _taps(g: Geometry) -> int:
    """Loads per input row of `rows`: the depth and width window."""
    return (g.dd.k if g.rank == 3 else 1) * g.dw.k


def description(chain: Chain, policy: str = "strict") -> str:
    assert chain.core is not None
    a = chain.core.attrs
    head = f"{chain.head.op} (PyTorch), then " if chain.head else ""
    return (f"{head}{chain.core.op} kernel {a['kernel']} stride {a['stride']} padding {a['padding']} dilation "
            f"{a['dilation']} on {chain.core_shape} (prologue {describe(chain.prologue)}, epilogue "
            f"{describe(chain.epilogue)}) in Triton")


def kernel(chain: Chain, params: Params, policy: str) -> Kernel:
    return render(chain, params, policy, NAME)


def render(chain: Chain, params: Params, policy: str, name: str) -> Kernel:
    """The pooling kernel of either strategy, as template `name` (pool1d, pool2d, pool3d)."""
    if params["strategy"] == "rows":
        return _rows(chain, params, policy, name) if params.get("AHEAD", 0) else _rows_unrolled(chain, params, policy, name)
    return _direct(chain, params, policy, name)


def clamps(g: Geometry) -> tuple[bool, bool, bool]:
    """(depth, rows, columns): the dims along which a max pooling's out-of-range taps read the nearest in-range
    element instead of a masked -inf. With dilation 1 a window is a contiguous range that meets the input
    (PyTorch: padding at most half the kernel; ceil_mode is refused by the graph), so the
    nearest in-range element of an outside tap is one of the window's own and the maximum is the same, NaN
    included; the load needs no mask and no pad value (both strategies, `rows` without prefetch). An average
    counts its pads: never clamped."""
    if not g.is_max:
        return False, False, False
    return g.rank == 3 and g.dd.d == 1, g.dh.d == 1, g.dw.d == 1


def _both(a: str | None, b: str | None) -> str | None:
    return a if b is None else b if a is None else f"{a} & {b}"


def _combine(is_max: bool, a: str, b: str) -> str:
    """Max with PyTorch's NaN propagation (a NaN anywhere in the window wins: one `max.NaN` on the GPU, where a
    compare-and-select took four instructions), or a sum."""
    return f"tl.maximum({a}, {b}, propagate_nan=tl.PropagateNan.ALL)" if is_max else f"{a} + {b}"


def _pad(chain: Chain, g: Geometry) -> str:
    """The `other` of a window load: with no prologue the loaded value is the window's own, so a masked-off
    element loads as the pad itself (-inf for max, 0 for average) and no select follows it; a prologue runs on
    the loaded value first, and the pad is applied after it (`_pad_after`)."""
    return ("float('-inf')" if g.is_max else "0.0") if chain.prologue == ROOT else "0.0"


def _pad_after(chain: Chain, g: Geometry, v: str) -> str:
    """`v` (the prologue's value) padded where masked off, or `v` itself when the load padded it (`_pad`)."""
    if chain.prologue == ROOT:
        return v
    return f"tl.where(m, {v}, float('-inf'))" if g.is_max else f"tl.where(m, {v}, 0.0)"


def _divisor(g: Geometry, outs: dict[str, str]) -> list[str]:
    """Lines dividing `acc` by the window's element count at output coordinates `outs` (per counted dim)."""
    lines, names = [], []
    for name, dim in g.counted:
        st = f"({outs[name]} * {dim.s} - {dim.p})"
        if g.count_include_pad:
            lines.append(f"{name}c = tl.minimum({st} + {dim.k}, {dim.size + dim.p}) - {st}")
        else:
            lines.append(f"{name}c = tl.minimum({st} + {dim.k}, {dim.size}) - tl.maximum({st}, 0)")
        names.append(f"{name}c")
    return [*lines, f"acc = acc / ({' * '.join(names)}).to(tl.float32)"]


def _prefix(name: str) -> str:
    return "_" + name  # _pool2d_kernel, _pool3d_rows_kernel, ...


def _depth_loop(g: Geometry, body: list[str], base: str, mask: str) -> tuple[list[str], str, str]:
    """(lines opening the depth window's loop, the input base and mask inside it) — nothing below 3-D."""
    if g.rank < 3:
        return [], base, mask
    d = g.dd
    return [f"for kd in tl.static_range({d.k}):",
            f"    idp = od * {d.s} + (kd * {d.d} - {d.p})",
            f"    dbase = {base} + idp * {g.dh.size * g.dw.size}",
            f"    dm = {mask} & (idp >= 0) & (idp < {d.size})"], "dbase", "dm"


def _nest(lines: list[str], depth: int) -> list[str]:
    return [" " * (4 * depth) + line for line in lines]


def _program_coords(g: Geometry, it: str) -> list[str]:
    if g.rank < 3:
        return [f"plane = tl.program_id(0).to({it})"]
    return [f"pd = tl.program_id(0).to({it})", f"plane = pd // {g.dd.out}", f"od = pd % {g.dd.out}"]


def _out_index(g: Geometry, oh: str) -> str:
    dpart = f" + od * {g.dh.out * g.dw.out}" if g.rank == 3 else ""
    return f"plane * {g.dd.out * g.dh.out * g.dw.out}{dpart} + {oh} * {g.dw.out} + ow"


def _launch_lines(chain: Chain, g: Geometry, params: Params, kname: str, leaf_vals: list[str]) -> list[str]:
    fwd = check_shapes(chain) + head_code(chain)
    fwd.append(f"out = torch.empty({chain.out_shape!r}, device=h.device, dtype=torch.{chain.out_dtype})")
    grid = (f"({g.planes * g.dd.out}, triton.cdiv({g.dh.out}, {params['BLOCK_H']}), "
            f"triton.cdiv({g.dw.out}, {params['BLOCK_W']}))")
    meta = {"BLOCK_H": params["BLOCK_H"], "BLOCK_W": params["BLOCK_W"], "num_warps": params["num_warps"]}
    fwd.append(launch(kname, grid, ["h", "out", *leaf_vals], meta))
    fwd.append("return out")
    return fwd


def _common(chain: Chain) -> tuple[Geometry, tuple[int, ...], str, str, list[str], str]:
    g = geometry(chain)
    s = chain.core_shape
    leaf_names, leaf_vals = leaf_kernel_args(chain)
    return (g, s, index_type(s, chain.out_shape, chain.root.shape), tl_dtype(chain.out_dtype), leaf_vals,
            "".join(x + ", " for x in leaf_names))


def _tap(g: Geometry, kd: int, kw: int, ih: str, rowm: str, sfx: str) -> list[str]:
    """Lines computing the mask `m{sfx}` and flat index `idx{sfx}` of window tap (kd, kw) on input row `ih`."""
    dw, w = g.dw, g.dw.size
    lines = [f"iw{sfx} = ow * {dw.s} + ({kw * dw.d - dw.p})"]
    base, mask = "in_base", rowm
    if g.rank == 3:
        d = g.dd
        lines += [f"idp{sfx} = od * {d.s} + ({kd * d.d - d.p})",
                  f"dm{sfx} = {rowm} & (idp{sfx} >= 0) & (idp{sfx} < {d.size})"]
        base, mask = f"in_base + idp{sfx} * {g.dh.size * w}", f"dm{sfx}"
    return [*lines, f"m{sfx} = owm & {mask} & (iw{sfx} >= 0) & (iw{sfx} < {w})", f"idx{sfx} = {base} + {ih} * {w} + iw{sfx}"]


def _row_loads(chain: Chain, g: Geometry, ih: str, rowm: str, sfx: str, into: list[str]) -> list[str]:
    """The raw loads of every tap of input row `ih` (tap t into `into[t]`), in the input's dtype: converting
    here would wait for the load, which the prefetch is there to defer."""
    lines: list[str] = []
    for t, var in enumerate(into):
        lines += _tap(g, t // g.dw.k, t % g.dw.k, ih, rowm, sfx)
        load = root_load(chain, chain.core_shape, f"idx{sfx}", f"m{sfx}", var, _pad(chain, g))
        assert load.endswith(".to(tl.float32)"), load
        lines.append(load.removesuffix(".to(tl.float32)"))
    return lines


def _prefetch(chain: Chain, g: Geometry, ahead: int, inner: ExprEmitter) -> tuple[list[str], list[str], list[str]]:
    """(lines before the row loop loading rows 0..ahead-1, lines opening an iteration r with the loads of row
    r + ahead, lines ending it by shifting the carried rows), and `inner` given the reduction of row r from the
    carried values (taps in the order of the plain loop's, so a sum adds in the same order)."""
    h, kh = g.dh.size, g.dh.k
    slot = [[f"x{j}_{t}" for t in range(_taps(g))] for j in range(ahead)]  # slot j: row r + j
    before: list[str] = []
    for j in range(ahead):
        before += [f"ihp = oh0 + ({j - g.dh.p})", f"rowmp = (ihp >= 0) & (ihp < {h})",
                   *_row_loads(chain, g, "ihp", "rowmp", "p", slot[j])]
    # rows past the strip's last are never reduced: not loaded either
    opening = [f"ihn = oh0 + r + ({ahead - g.dh.p})",
               f"rowmn = (ihn >= 0) & (ihn < {h}) & (r + {ahead} < BLOCK_H + {kh - 1})",
               *_row_loads(chain, g, "ihn", "rowmn", "n", [f"xn_{t}" for t in range(_taps(g))])]
    for t, x in enumerate(slot[0]):
        inner.lines += [*_tap(g, t // g.dw.k, t % g.dw.k, "ih", "rowm", ""), f"x = {x}.to(tl.float32)"]
        _reduce(chain, g, inner)
    shift = [f"{a} = {b}" for j in range(ahead - 1) for a, b in zip(slot[j], slot[j + 1], strict=True)]
    return before, opening, [*shift, *(f"{a} = xn_{t}" for t, a in enumerate(slot[-1]))]


def _reduce(chain: Chain, g: Geometry, inner: ExprEmitter) -> None:
    """Lines folding the loaded `x` (masked by `m`, at `idx`) into the row's `hm`, the prologue applied."""
    v = inner.emit(chain.prologue, "x", "idx", chain.core_shape, "m")
    inner.lines += [f"v = {_pad_after(chain, g, v)}", f"hm = {_combine(g.is_max, 'hm', 'v')}"]


def _rows(chain: Chain, params: Params, policy: str, name: str) -> Kernel:
    g, s, it, out_t, leaf_vals, lsig = _common(chain)
    kh, (h, w) = g.dh.k, (g.dh.size, g.dw.size)
    dw, ph = g.dw, g.dh.p
    is_max = g.is_max
    init = "tl.full([BLOCK_W], float('-inf'), tl.float32)" if is_max else "tl.zeros([BLOCK_W], tl.float32)"
    inner = ExprEmitter()
    ahead = int(params.get("AHEAD", 0))
    before: list[str] = []
    opening: list[str] = []
    after: list[str] = []
    if ahead:
        before, opening, after = _prefetch(chain, g, ahead, inner)
        window = inner.lines
    else:
        depth, base, mask = _depth_loop(g, [], "in_base", "rowm")
        inner.lines += [f"iw = ow * {dw.s} + (kw * {dw.d} - {dw.p})",
                        f"m = owm & {mask} & (iw >= 0) & (iw < {w})",
                        f"idx = {base} + ih * {w} + iw",
                        root_load(chain, s, "idx", "m", other=_pad(chain, g))]
        _reduce(chain, g, inner)
        window = [*depth, *_nest([f"for kw in tl.static_range({dw.k}):", *_nest(inner.lines, 1)], 1 if depth else 0)]
    inner_body = "\n".join(_nest(window, 2))
    hist = [f"h{i}" for i in range(kh - 1)]  # the previous kh - 1 horizontal results, oldest first
    acc = "hm"
    for hv in reversed(hist):
        acc = _combine(is_max, acc, hv)
    out = ExprEmitter("o")
    out.lines.append(f"acc = {acc}")
    out.lines.append("ohr = oh0 + r - " + str(kh - 1))
    if not is_max:
        out.lines += _divisor(g, {"d": "od", "h": "ohr", "w": "ow"})
    out.lines.append(f"oidx = {_out_index(g, 'ohr')}")
    out.lines.append(f"om = owm & (r >= {kh - 1}) & (ohr < {g.dh.out})")
    r = out.emit(chain.epilogue, "acc", "oidx", chain.out_shape, "om")
    out.lines.append(f"tl.store(out_ptr + oidx, {r}.to({out_t}), mask=om)")
    out.lines += [f"{hist[i]} = {hist[i + 1]}" for i in range(len(hist) - 1)]
    if hist:
        out.lines.append(f"{hist[-1]} = hm")
    out_body = "\n".join("        " + line for line in [*out.lines, *after])
    hist_init = "\n".join([*(f"    {hv} = {init}" for hv in hist), *_nest(before, 1)])
    prefetch = "".join(line + "\n" for line in _nest(opening, 2))
    kname = f"{_prefix(name)}_rows_kernel"
    src = f'''{_rows_head(g, kname, lsig, it)}
{hist_init}
    for r in range(0, BLOCK_H + {kh - 1}):
{prefetch}        ih = oh0 + r - {ph}
        rowm = (ih >= 0) & (ih < {h})
        hm = {init}
{inner_body}
{out_body}
'''
    return Kernel(name, policy, description(chain), params, [src], _launch_lines(chain, g, params, kname, leaf_vals))


def _rows_head(g: Geometry, kname: str, lsig: str, it: str) -> str:
    """A `rows` kernel's signature and its program's coordinates: plane, first output row, the strip's columns."""
    coords = "\n".join("    " + line for line in _program_coords(g, it))
    return f'''
@triton.jit
def {kname}(h_ptr, out_ptr, {lsig}BLOCK_H: tl.constexpr, BLOCK_W: tl.constexpr):
{coords}
    oh0 = tl.program_id(1).to({it}) * BLOCK_H
    ow = tl.program_id(2).to({it}) * BLOCK_W + tl.arange(0, BLOCK_W).to({it})
    owm = ow < {g.dw.out}
    in_base = plane * {g.dd.size * g.dh.size * g.dw.size}'''


def _direct(chain: Chain, params: Params, policy: str, name: str) -> Kernel:
    g, s, it, out_t, leaf_vals, lsig = _common(chain)
    dh, dw = g.dh, g.dw
    h, w = dh.size, dw.size
    is_max = g.is_max
    cd, ch, cw = clamps(g)
    inner = ExprEmitter()
    if not (cd or ch or cw):
        opening, base, mask = _depth_loop(g, [], "in_base", "omask")
        inner.lines += [f"iw = ow * {dw.s} + (kw * {dw.d} - {dw.p})",
                        f"m = {mask} & (ih >= 0) & (ih < {h}) & (iw >= 0) & (iw < {w})"]
        m: str | None = "m"
        row = [f"ih = oh * {dh.s} + (kh * {dh.d} - {dh.p})"]
    else:  # a max pooling's taps clamped into the input along the dims `clamps` allows, masked along the others
        opening, base, terms = [], "in_base", []
        if g.rank == 3:
            d = g.dd
            opening = [f"for kd in tl.static_range({d.k}):", f"    idp = od * {d.s} + (kd * {d.d} - {d.p})"]
            opening.append(f"    idp = tl.minimum(tl.maximum(idp, 0), {d.size - 1})" if cd else
                           f"    dm = (idp >= 0) & (idp < {d.size})")
            opening.append(f"    dbase = in_base + idp * {h * w}")
            base, terms = "dbase", [] if cd else ["dm"]
        row = [f"ih = oh * {dh.s} + (kh * {dh.d} - {dh.p})"]
        row += [f"ih = tl.minimum(tl.maximum(ih, 0), {h - 1})"] if ch else []
        terms += [] if ch else [f"(ih >= 0) & (ih < {h})"]
        inner.lines.append(f"iw = ow * {dw.s} + (kw * {dw.d} - {dw.p})")
        inner.lines += [f"iw = tl.minimum(tl.maximum(iw, 0), {w - 1})"] if cw else []
        terms += [] if cw else [f"(iw >= 0) & (iw < {w})"]
        m = "m" if terms else None
        inner.lines += [f"m = {' & '.join(terms)}"] if terms else []
    inner.lines += [f"idx = {base} + ih * " + str(w) + " + iw",
                    root_load(chain, s, "idx", m or "None", other=_pad(chain, g))]
    v = inner.emit(chain.prologue, "x", "idx", s, m or "None")
    inner.lines += [f"v = {_pad_after(chain, g, v) if m else v}", f"acc = {_combine(is_max, 'acc', 'v')}"]
    window = [f"for kh in tl.static_range({dh.k}):",
              *_nest(row, 1),
              f"    for kw in tl.static_range({dw.k}):",
              *_nest(inner.lines, 2)]
    window = [*opening, *_nest(window, 1)] if opening else window
    inner_body = "\n".join(_nest(window, 1))
    if is_max:
        init = "acc = tl.full([BLOCK_H, BLOCK_W], float('-inf'), tl.float32)"
        fin: list[str] = []
    else:
        init = "acc = tl.zeros([BLOCK_H, BLOCK_W], tl.float32)"
        fin = _divisor(g, {"d": "od", "h": "oh", "w": "ow"})
    out = ExprEmitter("o")
    out.lines += fin
    out.lines.append(f"oidx = {_out_index(g, 'oh')}")
    r = out.emit(chain.epilogue, "acc", "oidx", chain.out_shape, "omask")
    out.lines.append(f"tl.store(out_ptr + oidx, {r}.to({out_t}), mask=omask)")
    out_body = "\n".join("    " + line for line in out.lines)
    coords = "\n".join("    " + line for line in _program_coords(g, it))
    kname = f"{_prefix(name)}_kernel"
    src = f'''
@triton.jit
def {kname}(h_ptr, out_ptr, {lsig}BLOCK_H: tl.constexpr, BLOCK_W: tl.constexpr):
{coords}
    oh = tl.program_id(1).to({it}) * BLOCK_H + tl.arange(0, BLOCK_H).to({it})[:, None]
    ow = tl.program_id(2).to({it}) * BLOCK_W + tl.arange(0, BLOCK_W).to({it})[None, :]
    omask = (oh < {dh.out}) & (ow < {dw.out})
    in_base = plane * {g.dd.size * h * w}
    {init}
{inner_body}
{out_body}
'''
    assert math.prod(chain.out_shape) > 0
    return Kernel(name, policy, description(chain), params, [src], _launch_lines(chain, g, params, kname, leaf_vals))


def _rows_unrolled(chain: Chain, params: Params, policy: str, name: str) -> Kernel:
    """`rows` without prefetch: the first kh - 1 input rows reduced before the loop, then UNROLL output rows an
    iteration (a static unroll: the rolling window's registers are renamed, not moved, and the loop's bookkeeping
    is paid once for UNROLL rows), the taps' columns and depth planes computed once before the loops, and a max
    pooling's taps clamped into the input where `clamps` allows (no masks, no pads). On the gap task's max pool
    (k4 s1 p1, cuda:90, BLOCK_W 256, 4 warps) the loop went from 46 SASS instructions an output to 32."""
    g, s, it, out_t, leaf_vals, lsig = _common(chain)
    kh, (h, w) = g.dh.k, (g.dh.size, g.dw.size)
    dd, dh, dw = g.dd, g.dh, g.dw
    cd, ch, cw = clamps(g)
    is_max = g.is_max
    init = "tl.full([BLOCK_W], float('-inf'), tl.float32)" if is_max else "tl.zeros([BLOCK_W], tl.float32)"
    pad = _pad(chain, g)
    hoisted: list[str] = []
    for kw in range(dw.k):
        col = f"ow * {dw.s} + ({kw * dw.d - dw.p})"
        if cw:
            hoisted.append(f"iw{kw} = tl.minimum(tl.maximum({col}, 0), {w - 1})")
        else:
            hoisted += [f"iw{kw} = {col}", f"cm{kw} = owm & (iw{kw} >= 0) & (iw{kw} < {w})"]
    planes: list[tuple[str, str | None]] = [("in_base", None)]
    if g.rank == 3:
        planes = []
        for kd in range(dd.k):
            dep = f"od * {dd.s} + ({kd * dd.d - dd.p})"
            if cd:
                hoisted.append(f"idp{kd} = tl.minimum(tl.maximum({dep}, 0), {dd.size - 1})")
                planes.append((f"dbase{kd}", None))
            else:
                hoisted += [f"idp{kd} = {dep}", f"dm{kd} = (idp{kd} >= 0) & (idp{kd} < {dd.size})"]
                planes.append((f"dbase{kd}", f"dm{kd}"))
            hoisted.append(f"dbase{kd} = in_base + idp{kd} * {h * w}")

    def row(first: str) -> list[str]:
        """Lines reducing input row `ih = first` over the depth and width taps into `hm`."""
        lines = [f"ih = {first}"]
        rowm = None
        if ch:
            lines.append(f"ih = tl.minimum(tl.maximum(ih, 0), {h - 1})")
        else:
            lines.append(f"rowm = (ih >= 0) & (ih < {h})")
            rowm = "rowm"
        lines.append(f"hm = {init}")
        for base, dmask in planes:
            # the row's address once (uniform), the taps' columns added to it: an index added first costs an
            # add a tap (its sign extension keeps the two apart)
            lines += [f"rb = {base} + ih * {w}", "rp = h_ptr + rb"]
            for kw in range(dw.k):
                mask = _both(_both(None if cw else f"cm{kw}", rowm), dmask)
                em = ExprEmitter()
                em.lines.append(f"idx = rb + iw{kw}")
                if mask is not None:
                    em.lines.append(f"m = {mask}")
                if tuple(chain.root.shape) == tuple(s):
                    em.lines.append(f"x = tl.load(rp + iw{kw}{masked_args('m' if mask else 'None', pad)}).to(tl.float32)")
                else:  # a broadcast root: its own offsets
                    em.lines.append(root_load(chain, s, "idx", "m" if mask else "None", other=pad))
                v = em.emit(chain.prologue, "x", "idx", s, "m" if mask else "None")
                em.lines += [f"v = {_pad_after(chain, g, v) if mask else v}", f"hm = {_combine(is_max, 'hm', 'v')}"]
                lines += em.lines
        return lines

    hist = [f"h{i}" for i in range(kh - 1)]  # the previous kh - 1 rows' reductions, oldest first
    rotate = [*(f"{hist[i]} = {hist[i + 1]}" for i in range(len(hist) - 1)), *([f"{hist[-1]} = hm"] if hist else [])]
    acc = "hm"
    for hv in reversed(hist):
        acc = _combine(is_max, acc, hv)
    out = ExprEmitter("o")
    out.lines += [f"acc = {acc}", "ohr = oh0 + r0 + u"]
    if not is_max:
        out.lines += _divisor(g, {"d": "od", "h": "ohr", "w": "ow"})
    out.lines += [f"oidx = {_out_index(g, 'ohr')}", f"om = owm & (ohr < {dh.out})"]
    r = out.emit(chain.epilogue, "acc", "oidx", chain.out_shape, "om")
    out.lines.append(f"tl.store(out_ptr + oidx, {r}.to({out_t}), mask=om)")
    prologue = ([f"for u in tl.static_range({kh - 1}):", *_nest([*row(f"oh0 + u - {dh.p}"), *rotate], 1)]
                if hist else [])
    main = [f"for r0 in range(0, BLOCK_H, {params['UNROLL']}):",
            f"    for u in tl.static_range({params['UNROLL']}):",
            *_nest([*row(f"oh0 + r0 + u + {kh - 1 - dh.p}"), *out.lines, *rotate], 2)]
    kname = f"{_prefix(name)}_rows_kernel"
    body = "\n".join(_nest([*hoisted, *(f"{hv} = {init}" for hv in hist), *prologue, *main], 1))
    src = f'''{_rows_head(g, kname, lsig, it)}
{body}
'''
    return Kernel(name, policy, description(chain), params, [src], _launch_lines(chain, g, params, kname, leaf_vals))
