"""The one poisoning helper, and the first element where an output differs from its reference.

A tensor a kernel writes is filled beforehand with values a correct kernel never leaves behind: NaN (the
byte 0x7F for 1-byte floats, some of which have no NaN), 0x5A in every byte of an integer, True for
booleans. An element the kernel fails to write then differs from any reference. Used by the suite's
runner, the verifier's replays and the GPU scripts under `tools/`.
"""

from __future__ import annotations

from typing import Any

#: The byte every element of a poisoned integer tensor holds.
POISON_BYTE = 0x5A


def poison_(t: Any) -> None:
    """Overwrite the torch tensor `t` in place with values a correct kernel never leaves in an output."""
    import torch

    if t.dtype.is_floating_point:
        if t.dtype.itemsize == 1:  # fp8 types may lack NaN (e4m3fn has it, fnuz types use 0x80)
            t.view(torch.uint8).fill_(0x7F)
        else:
            t.fill_(float("nan"))
    elif t.dtype == torch.bool:
        t.fill_(True)
    else:
        t.view(torch.uint8).fill_(POISON_BYTE)


def first_mismatch(name: str, got: Any, want: Any, atol: float, rtol: float) -> dict[str, Any] | None:
    """The first element of output `name` where `got` differs from `want` beyond `atol + rtol*|want|` (NaN
    matches NaN), with how many differ; None when all agree."""
    import torch

    g = got.detach().cpu()
    w = want.detach().cpu()
    if g.shape != w.shape:
        return {"output": name, "reason": f"shape {tuple(g.shape)} != expected {tuple(w.shape)}"}
    if g.dtype.is_floating_point or w.dtype.is_floating_point:
        g64, w64 = g.to(torch.float64), w.to(torch.float64)
        both_nan = torch.isnan(g64) & torch.isnan(w64)
        close = (g64 == w64) | both_nan
        if atol or rtol:
            close |= (g64 - w64).abs() <= atol + rtol * w64.abs()
    else:
        close = g == w.to(g.dtype)
    if bool(close.all()):
        return None
    flat = int((~close).flatten().nonzero()[0, 0])
    index = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), g.shape))
    return {
        "output": name,
        "index": list(index),
        "got": g[index].item(),
        "expected": w[index].item(),
        "mismatched": int((~close).sum()),
        "of": g.numel(),
    }
