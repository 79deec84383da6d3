"""2-D max and average pooling of a contiguous (N, C, H, W) tensor (any kernel, stride, padding, dilation;
average with or without the padding counted), with pointwise ops before (applied to each loaded input,
padding after them, as PyTorch pads the op's input) and after (fused into the store).

Two strategies:
- `direct`: a program computes a BLOCK_H x BLOCK_W tile of one output plane with kh*kw window loads per
  output (they overlap at small strides and are served from L1/L2, so DRAM sees each input about once);
- `rows` (stride 1 and dilation 1 along H): a program walks BLOCK_H + kh - 1 input rows of a BLOCK_W wide
  column strip; per input row it loads the kw shifted vectors once, reduces them to a horizontal
  max/sum, and keeps the last kh of those in registers (a rolling window), so each output costs kw
  loads instead of kh*kw.
PyTorch's max_pool2d also writes an int64 index per output, which this does not.
"""

from __future__ import annotations

import math
from typing import Any

from kstrata.agents.templates.base import Params
from kstrata.agents.templates.codegen import (
    ExprEmitter,
    Kernel,
    check_shapes,
    head_code,
    index_type,
    launch,
    leaf_kernel_args,
    root_load,
    tl_dtype,
)
from kstrata.agents.templates.graph import Chain, describe

NAME = "pool2d"


def applies(chain: Chain, policy: str = "strict") -> str | None:
    core = chain.core
    if core is None or core.op not in ("max_pool2d", "avg_pool2d"):
        return "the graph has no 2-D pooling"
    if len(chain.core_shape) != 4:
        return f"pooling of a rank-{len(chain.core_shape)} tensor (only batched NCHW)"
    return None


def _rows_ok(chain: Chain) -> bool:
    """The rolling-window strategy needs consecutive output rows to read consecutive input rows."""
    assert chain.core is not None
    a = chain.core.attrs
    return bool(a["stride"][0] == 1 and a["dilation"][0] == 1)


def space(chain: Chain) -> tuple[tuple[tuple[str, tuple[object, ...]], ...], tuple[tuple[str, object], ...]]:
    rows = _rows_ok(chain)
    sp = (("strategy", ("direct", "rows") if rows else ("direct",)), ("BLOCK_H", (4, 8, 16, 32, 64)),
          ("BLOCK_W", (16, 32, 64, 128, 256)), ("num_warps", (2, 4, 8)))
    ow = chain.out_shape[3]
    bw = 64 if ow >= 64 else (32 if ow >= 32 else 16)
    if rows and ow >= 64:
        return sp, (("strategy", "rows"), ("BLOCK_H", 32), ("BLOCK_W", 128), ("num_warps", 4))
    return sp, (("strategy", "direct"), ("BLOCK_H", 8), ("BLOCK_W", bw), ("num_warps", 4))


def valid(chain: Chain, p: Params) -> bool:
    if p["strategy"] == "rows":
        return bool(_rows_ok(chain) and p["BLOCK_W"] >= 32 and p["BLOCK_H"] >= 4)
    return bool(64 <= p["BLOCK_H"] * p["BLOCK_W"] <= 4096)


def description(chain: Chain) -> str:
    assert chain.core is not None
    a = chain.core.attrs
    head = f"{chain.head.op} (PyTorch), then " if chain.head else ""
    return (f"{head}{chain.core.op} kernel {a['kernel']} stride {a['stride']} padding {a['padding']} dilation "
            f"{a['dilation']} on {chain.core_shape} (prologue {describe(chain.prologue)}, epilogue "
            f"{describe(chain.epilogue)}) in Triton")


def kernel(chain: Chain, params: Params, policy: str) -> Kernel:
    return _rows(chain, params, policy) if params["strategy"] == "rows" else _direct(chain, params, policy)


def _combine(is_max: bool, a: str, b: str) -> str:
    """Max with PyTorch's NaN propagation (a NaN anywhere in the window wins), or a sum."""
    return f"tl.where(({b} > {a}) | ({b} != {b}), {b}, {a})" if is_max else f"{a} + {b}"


def _divisor(chain: Chain, oh: str, ow: str) -> list[str]:
    assert chain.core is not None
    a = chain.core.attrs
    (kh, kw), (sh, sw), (ph, pw) = a["kernel"], a["stride"], a["padding"]
    h, w = chain.core_shape[2], chain.core_shape[3]
    hs, ws = f"({oh} * {sh} - {ph})", f"({ow} * {sw} - {pw})"
    if a["count_include_pad"]:
        lines = [f"hc = tl.minimum({hs} + {kh}, {h + ph}) - {hs}", f"wc = tl.minimum({ws} + {kw}, {w + pw}) - {ws}"]
    else:
        lines = [f"hc = tl.minimum({hs} + {kh}, {h}) - tl.maximum({hs}, 0)",
                 f"wc = tl.minimum({ws} + {kw}, {w}) - tl.maximum({ws}, 0)"]
    return [*lines, "acc = acc / (hc * wc).to(tl.float32)"]


def _geometry(chain: Chain) -> tuple[Any, ...]:
    """What both pooling kernels read from the chain: window, stride, padding, dilation, shapes, the index
    and output types, and the extra (leaf) kernel arguments with their signature text."""
    core = chain.core
    assert core is not None
    a = core.attrs
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = a["kernel"], a["stride"], a["padding"], a["dilation"]
    n, c, h, w = chain.core_shape
    oh, ow = chain.out_shape[2], chain.out_shape[3]
    s = chain.core_shape
    leaf_names, leaf_vals = leaf_kernel_args(chain)
    return (kh, kw, sh, sw, ph, pw, dh, dw, n, c, h, w, oh, ow, core.op == "max_pool2d", s,
            index_type(s, chain.out_shape, chain.root.shape), tl_dtype(chain.out_dtype), leaf_names, leaf_vals,
            "".join(x + ", " for x in leaf_names))


def _rows(chain: Chain, params: Params, policy: str) -> Kernel:
    (kh, kw, _sh, sw, ph, pw, _dh, dw, n, c, h, w, oh, ow, is_max, s, it, out_t, _names, leaf_vals,
     lsig) = _geometry(chain)
    init = "tl.full([BLOCK_W], float('-inf'), tl.float32)" if is_max else "tl.zeros([BLOCK_W], tl.float32)"
    inner = ExprEmitter()
    inner.lines += [f"iw = ow * {sw} + (kw * {dw} - {pw})",
                    f"m = owm & rowm & (iw >= 0) & (iw < {w})",
                    f"idx = in_base + ih * {w} + iw",
                    root_load(chain, s, "idx", "m")]
    v = inner.emit(chain.prologue, "x", "idx", s, "m")
    if is_max:
        inner.lines += [f"v = tl.where(m, {v}, float('-inf'))", f"hm = {_combine(True, 'hm', 'v')}"]
    else:
        inner.lines += [f"hm = hm + tl.where(m, {v}, 0.0)"]
    inner_body = "\n".join("            " + line for line in inner.lines)
    hist = [f"h{i}" for i in range(kh - 1)]  # the previous kh - 1 horizontal results, oldest first
    acc = "hm"
    for hv in reversed(hist):
        acc = _combine(is_max, acc, hv)
    out = ExprEmitter("o")
    out.lines.append(f"acc = {acc}")
    out.lines.append("ohr = oh0 + r - " + str(kh - 1))
    if not is_max:
        out.lines += _divisor(chain, "ohr", "ow")
    out.lines.append(f"oidx = plane * {oh * ow} + ohr * {ow} + ow")
    out.lines.append(f"om = owm & (r >= {kh - 1}) & (ohr < {oh})")
    r = out.emit(chain.epilogue, "acc", "oidx", chain.out_shape, "om")
    out.lines.append(f"tl.store(out_ptr + oidx, {r}.to({out_t}), mask=om)")
    out.lines += [f"{hist[i]} = {hist[i + 1]}" for i in range(len(hist) - 1)]
    if hist:
        out.lines.append(f"{hist[-1]} = hm")
    out_body = "\n".join("        " + line for line in out.lines)
    hist_init = "\n".join(f"    {hv} = {init}" for hv in hist)
    src = f'''
@triton.jit
def _pool2d_rows_kernel(h_ptr, out_ptr, {lsig}BLOCK_H: tl.constexpr, BLOCK_W: tl.constexpr):
    plane = tl.program_id(0).to({it})
    oh0 = tl.program_id(1).to({it}) * BLOCK_H
    ow = tl.program_id(2).to({it}) * BLOCK_W + tl.arange(0, BLOCK_W).to({it})
    owm = ow < {ow}
    in_base = plane * {h * w}
{hist_init}
    for r in range(0, BLOCK_H + {kh - 1}):
        ih = oh0 + r - {ph}
        rowm = (ih >= 0) & (ih < {h})
        hm = {init}
        for kw in tl.static_range({kw}):
{inner_body}
{out_body}
'''
    fwd = check_shapes(chain) + head_code(chain)
    fwd.append(f"out = torch.empty({chain.out_shape!r}, device=h.device, dtype=torch.{chain.out_dtype})")
    grid = f"({n * c}, triton.cdiv({oh}, {params['BLOCK_H']}), triton.cdiv({ow}, {params['BLOCK_W']}))"
    meta = {"BLOCK_H": params["BLOCK_H"], "BLOCK_W": params["BLOCK_W"], "num_warps": params["num_warps"]}
    fwd.append(launch("_pool2d_rows_kernel", grid, ["h", "out", *leaf_vals], meta))
    fwd.append("return out")
    return Kernel(NAME, policy, description(chain), params, [src], fwd)


def _direct(chain: Chain, params: Params, policy: str) -> Kernel:
    (kh, kw, sh, sw, ph, pw, dh, dw, n, c, h, w, oh, ow, is_max, s, it, out_t, _names, leaf_vals,
     lsig) = _geometry(chain)
    inner = ExprEmitter()
    inner.lines += [f"iw = ow * {sw} + (kw * {dw} - {pw})",
                    f"m = omask & (ih >= 0) & (ih < {h}) & (iw >= 0) & (iw < {w})",
                    "idx = in_base + ih * " + str(w) + " + iw",
                    root_load(chain, s, "idx", "m")]
    v = inner.emit(chain.prologue, "x", "idx", s, "m")
    if is_max:
        inner.lines += [f"v = tl.where(m, {v}, float('-inf'))", "acc = tl.where((v > acc) | (v != v), v, acc)"]
    else:
        inner.lines += [f"acc += tl.where(m, {v}, 0.0)"]
    inner_body = "\n".join("            " + line for line in inner.lines)
    if is_max:
        init = "acc = tl.full([BLOCK_H, BLOCK_W], float('-inf'), tl.float32)"
        fin: list[str] = []
    else:
        init = "acc = tl.zeros([BLOCK_H, BLOCK_W], tl.float32)"
        fin = _divisor(chain, "oh", "ow")
    out = ExprEmitter("o")
    out.lines += fin
    out.lines.append(f"oidx = plane * {oh * ow} + oh * {ow} + ow")
    r = out.emit(chain.epilogue, "acc", "oidx", chain.out_shape, "omask")
    out.lines.append(f"tl.store(out_ptr + oidx, {r}.to({out_t}), mask=omask)")
    out_body = "\n".join("    " + line for line in out.lines)
    src = f'''
@triton.jit
def _pool2d_kernel(h_ptr, out_ptr, {lsig}BLOCK_H: tl.constexpr, BLOCK_W: tl.constexpr):
    plane = tl.program_id(0).to({it})
    oh = tl.program_id(1).to({it}) * BLOCK_H + tl.arange(0, BLOCK_H).to({it})[:, None]
    ow = tl.program_id(2).to({it}) * BLOCK_W + tl.arange(0, BLOCK_W).to({it})[None, :]
    omask = (oh < {oh}) & (ow < {ow})
    in_base = plane * {h * w}
    {init}
    for kh in tl.static_range({kh}):
        ih = oh * {sh} + (kh * {dh} - {ph})
        for kw in tl.static_range({kw}):
{inner_body}
{out_body}
'''
    fwd = check_shapes(chain) + head_code(chain)
    fwd.append(f"out = torch.empty({chain.out_shape!r}, device=h.device, dtype=torch.{chain.out_dtype})")
    grid = f"({n * c}, triton.cdiv({oh}, {params['BLOCK_H']}), triton.cdiv({ow}, {params['BLOCK_W']}))"
    meta = {"BLOCK_H": params["BLOCK_H"], "BLOCK_W": params["BLOCK_W"], "num_warps": params["num_warps"]}
    fwd.append(launch("_pool2d_kernel", grid, ["h", "out", *leaf_vals], meta))
    fwd.append("return out")
    assert math.prod(chain.out_shape) > 0
    return Kernel(NAME, policy, description(chain), params, [src], fwd)
