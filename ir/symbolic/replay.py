"""Counterexamples made concrete: a launch built from a solver model, replayed in the interpreter.

`concrete_launch(module, counterexample, seed, elements)` gives the grid and the arguments: scalars
from the model, the grid just large enough for the model's program id (or the model's grid when the
kernel reads `tt.get_num_programs`), one buffer per pointer argument filled with seeded random values
and, where the model fixed memory contents (loads read an uninterpreted memory), those values.
`replay` runs the original and the candidate on copies of the same buffers: the counterexample is
confirmed when the candidate faults where the original does not, or when any buffer differs bit for
bit afterwards. Buffers grow (up to `MAX_ELEMENTS`) while the *original* reads out of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from kstrata.ir.dialects.tt import PointerType, pointee_of

#: Buffer sizes tried, in elements: from this many, doubling up to MAX_ELEMENTS.
FIRST_ELEMENTS = 1 << 14
MAX_ELEMENTS = 1 << 22
#: The interpreter runs every program of a grid: a model whose program id is large (a grid of 10^5
#: programs) would take hours, so such a model is not replayed (it stays unconfirmed, never a difference).
MAX_PROGRAMS = 1024


@dataclass
class ReplayOutcome:
    confirmed: bool
    detail: str
    grid: tuple[int, int, int] = (1, 1, 1)
    args: dict[str, Any] | None = None


def _fill(dt: np.dtype[Any], n: int, rng: np.random.Generator) -> np.ndarray[Any, Any]:
    if dt.kind in "iu":
        info = np.iinfo(dt)
        lo, hi = max(int(info.min), -1000), min(int(info.max), 1000)
        return rng.integers(lo, hi + 1, size=n).astype(dt)
    return rng.standard_normal(n).astype(np.float32).astype(dt)


def concrete_launch(module: Any, cex: Any, seed: int, elements: int) -> tuple[tuple[int, int, int], list[Any],
                                                                             list[str]]:
    """The grid, the argument list for `run_kernel` and the parameter names of one concrete launch."""
    from kstrata.ir.interp import Buffer
    from kstrata.ir.interp.types import memory_dtype

    func = _entry(module)
    block = func.regions[0].blocks.first
    rng = np.random.default_rng(seed)
    args: list[Any] = []
    names: list[str] = []
    for i, a in enumerate(block.args):
        name = cex.param_names[i] if i < len(cex.param_names) else f"arg{i}"
        names.append(name)
        if isinstance(a.type, PointerType):
            dt = memory_dtype(pointee_of(a.type))
            data = _fill(dt, elements, rng)
            for (buf, _dtype), entries in cex.memory.items():
                if buf != i:
                    continue
                for offset, bits in entries:
                    if offset % dt.itemsize == 0 and 0 <= offset // dt.itemsize < elements:
                        data[offset // dt.itemsize] = _from_bits(bits, dt)
            args.append(Buffer(data, 0))
        else:
            args.append(cex.args[name])
    pid = cex.program
    grid = tuple(max(p + 1, g) for p, g in zip(pid, cex.grid, strict=True))
    return (grid[0], grid[1], grid[2]), args, names


def _from_bits(bits: int, dt: np.dtype[Any]) -> Any:
    u = np.array([bits], dtype=np.uint64).astype(np.dtype(f"u{dt.itemsize}"))
    return u.view(dt)[0]


def _entry(module: Any) -> Any:
    funcs = [op for op in module.body.ops if op.name == "tt.func"]
    public = [f for f in funcs if "public" in str(getattr(f, "sym_visibility", "") or "")]
    return (public or funcs)[0]


def replay(original: Any, candidate: Any, cex: Any, *, seeds: int = 3, deadline: float | None = None) -> ReplayOutcome:
    """Run both parsed modules on launches built from `cex`; confirmed when they differ. A launch of more
    than `MAX_PROGRAMS` programs is not run; past `deadline` (`time.perf_counter()`) no new launch starts."""
    import time

    from kstrata.ir.interp import Buffer, InterpError, run_kernel

    last = "no launch could be built"
    for seed in range(seeds):
        elements = FIRST_ELEMENTS
        while True:
            if deadline is not None and time.perf_counter() > deadline:
                return ReplayOutcome(False, last + "; the time budget ran out before the next replay")
            grid, args, names = concrete_launch(original, cex, seed, elements)
            if grid[0] * grid[1] * grid[2] > MAX_PROGRAMS:
                return ReplayOutcome(False, f"the model's launch has grid {grid} ({grid[0] * grid[1] * grid[2]} "
                                            f"programs), more than the {MAX_PROGRAMS} the interpreter replays")
            before = [a.storage.copy() if isinstance(a, Buffer) else a for a in args]
            try:
                run_kernel(original, grid, args)
            except InterpError as exc:
                if "address 0x" in str(exc) and elements < MAX_ELEMENTS:
                    elements *= 2
                    continue
                last = f"the original does not run on the launch built from the model: {exc}"
                break
            cand_args = [Buffer(b.copy(), 0) if isinstance(b, np.ndarray) else b for b in before]
            shown = {n: a for n, a in zip(names, before, strict=True) if not isinstance(a, np.ndarray)}
            try:
                run_kernel(candidate, grid, cand_args)
            except InterpError as exc:
                return ReplayOutcome(True, f"the candidate faults where the original does not: {exc}", grid, shown)
            for name, a, b in zip(names, args, cand_args, strict=True):
                if not isinstance(a, Buffer):
                    continue
                x = a.storage.view(np.uint8)
                y = b.storage.view(np.uint8)
                if not np.array_equal(x, y):
                    diff = np.flatnonzero(x != y)[0] // a.storage.dtype.itemsize
                    return ReplayOutcome(True, f"{name}[{diff}] is {a.storage[diff]!r} after the original and "
                                               f"{b.storage[diff]!r} after the candidate (grid {grid}, seed {seed})",
                                         grid, shown)
            last = f"the interpreter found both identical on grid {grid} with {len(names)} arguments"
            break
    return ReplayOutcome(False, last)
