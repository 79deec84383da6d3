"""2-D max and average pooling of a contiguous (N, C, H, W) tensor (any kernel, stride, padding, dilation;
average with or without the padding counted), with pointwise ops before (applied to each loaded input,
padding after them, as PyTorch pads the op's input) and after (fused into the store).

A program computes a BLOCK_H x BLOCK_W tile of one output plane; the kh x kw window loads of a tile overlap
(stride 1: each input is read by up to kh*kw outputs), and are served from L1/L2 rather than DRAM, so DRAM
sees each input about once. PyTorch's max_pool2d also writes an int64 index per output, which this does not.
"""

from __future__ import annotations

import math

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


def applies(chain: Chain) -> str | None:
    core = chain.core
    if core is None or core.op not in ("max_pool2d", "avg_pool2d"):
        return "the graph has no 2-D pooling"
    if len(chain.core_shape) != 4:
        return f"pooling of a rank-{len(chain.core_shape)} tensor (only batched NCHW)"
    return None


def space(chain: Chain) -> tuple[tuple[tuple[str, tuple[object, ...]], ...], tuple[tuple[str, object], ...]]:
    sp = (("BLOCK_H", (4, 8, 16, 32)), ("BLOCK_W", (16, 32, 64, 128)), ("num_warps", (2, 4, 8)))
    ow = chain.out_shape[3]
    bw = 64 if ow >= 64 else (32 if ow >= 32 else 16)
    return sp, (("BLOCK_H", 8), ("BLOCK_W", bw), ("num_warps", 4))


def valid(chain: Chain, p: Params) -> bool:
    return bool(64 <= p["BLOCK_H"] * p["BLOCK_W"] <= 4096)


def description(chain: Chain) -> str:
    assert chain.core is not None
    a = chain.core.attrs
    head = f"{chain.head.op} (PyTorch), then " if chain.head else ""
    return (f"{head}{chain.core.op} kernel {a['kernel']} stride {a['stride']} padding {a['padding']} dilation "
            f"{a['dilation']} on {chain.core_shape} (prologue {describe(chain.prologue)}, epilogue "
            f"{describe(chain.epilogue)}) in Triton")


def kernel(chain: Chain, params: Params, policy: str) -> Kernel:
    core = chain.core
    assert core is not None
    a = core.attrs
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = a["kernel"], a["stride"], a["padding"], a["dilation"]
    n, c, h, w = chain.core_shape
    oh, ow = chain.out_shape[2], chain.out_shape[3]
    is_max = core.op == "max_pool2d"
    s = chain.core_shape
    it = index_type(s, chain.out_shape, chain.root.shape)
    out_t = tl_dtype(chain.out_dtype)
    leaf_names, leaf_vals = leaf_kernel_args(chain)
    lsig = "".join(x + ", " for x in leaf_names)
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
        hs, ws = f"(oh * {sh} - {ph})", f"(ow * {sw} - {pw})"
        if a["count_include_pad"]:
            fin = [f"hc = tl.minimum({hs} + {kh}, {h + ph}) - {hs}", f"wc = tl.minimum({ws} + {kw}, {w + pw}) - {ws}"]
        else:
            fin = [f"hc = tl.minimum({hs} + {kh}, {h}) - tl.maximum({hs}, 0)",
                   f"wc = tl.minimum({ws} + {kw}, {w}) - tl.maximum({ws}, 0)"]
        fin.append("acc = acc / (hc * wc).to(tl.float32)")
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
    fwd.append(launch("_pool2d_kernel", grid, ["h", "out", *leaf_vals], params))
    fwd.append("return out")
    assert math.prod(chain.out_shape) > 0
    return Kernel(NAME, policy, description(chain), params, [src], fwd)
