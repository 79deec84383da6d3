"""The state one interpreted launch carries between ops: programs of the chunk, the active mask, memories, errors.

Divergent control flow is run predicated: `Machine.active` says, per program of the chunk, whether
the program is executing the current op. Ops that touch memory only touch it for active programs;
pure ops compute for every program and the results of inactive ones are discarded when `scf.if`,
`scf.for` and `scf.while` merge their results with `np.where`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from xdsl.ir import Operation

from kstrata.ir.errors import KstrataError

from .memory import AccessFault, GlobalMemory
from .types import Arr


class InterpError(KstrataError):
    """A kernel the interpreter cannot run or that misbehaves: out-of-bounds access, unsupported op, failed assert."""


_LOC = re.compile(r'"([^"]+)":(\d+):(\d+)')


def op_location(op: Operation) -> str | None:
    """`file:line:col` of the first file location in the op's `loc(...)`, if it has one."""
    loc = getattr(op, "location", None)
    if loc is None:
        return None
    m = _LOC.search(str(loc))
    return f"{m.group(1)}:{m.group(2)}:{m.group(3)}" if m else None


def unsupported(op: Operation, what: str = "") -> InterpError:
    detail = f" ({what})" if what else ""
    return InterpError(f"op {op.name} is not supported by the interpreter{detail}")


def lead_mask(mask: Arr, ndim: int) -> Arr:
    """A per-program mask `[L]` reshaped to broadcast against a value with `ndim` dimensions."""
    return mask.reshape(mask.shape + (1,) * (ndim - mask.ndim))


@dataclass
class Machine:
    """Everything the op implementations share for one chunk of programs."""

    memory: GlobalMemory
    grid: tuple[int, int, int]
    first_program: int
    num: int  # programs in this chunk
    origin: str | None = None
    active: Arr = field(default_factory=lambda: np.ones(0, dtype=np.bool_))
    pids: tuple[Arr, Arr, Arr] = field(default_factory=lambda: (np.zeros(0, np.int32),) * 3)
    #: Async copy bookkeeping per program: commit groups closed so far, and the newest group waited for.
    committed: Arr = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    waited: Arr = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    current: Operation | None = None
    printed: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        linear = np.arange(self.first_program, self.first_program + self.num, dtype=np.int64)
        gx, gy, _ = self.grid
        self.pids = ((linear % gx).astype(np.int32), ((linear // gx) % gy).astype(np.int32),
                     (linear // (gx * gy)).astype(np.int32))
        self.active = np.ones(self.num, dtype=np.bool_)
        self.committed = np.zeros(self.num, dtype=np.int64)
        self.waited = np.zeros(self.num, dtype=np.int64)

    def program(self, index: int) -> tuple[int, int, int]:
        return (int(self.pids[0][index]), int(self.pids[1][index]), int(self.pids[2][index]))

    def error(self, op: Operation, message: str, program: int | None = None) -> InterpError:
        where = op_location(op)
        parts = [f"{op.name}"]
        if where:
            parts.append(f"at {where}")
        if program is not None:
            parts.append(f"in program {self.program(program)}")
        return InterpError(f"{' '.join(parts)}: {message}", path=self.origin)

    def active_lanes(self, shape: tuple[int, ...], mask: Arr | None) -> Arr:
        """The lanes `[P, *shape]` an access touches: active programs, and `mask` where given."""
        act = lead_mask(self.active, 1 + len(shape))
        eff = act if mask is None else act & mask
        return np.broadcast_to(eff, (self.num, *shape))

    def fault(self, op: Operation, lanes: Arr, shape: tuple[int, ...]) -> Any:
        """An InterpError factory for `GlobalMemory`, mapping a faulting lane back to its program."""
        per_program = int(np.prod(shape)) if shape else 1

        def make(f: AccessFault) -> InterpError:
            # Only on a fault: which of the touched lanes it was, hence which program.
            program = int(np.flatnonzero(lanes.reshape(-1))[f.lane]) // per_program
            return self.error(op, f"address 0x{f.address:x} is {f.reason}; nearest: {f.nearest}", program)

        return make
