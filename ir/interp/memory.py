"""The interpreter's memories: global memory as typed byte buffers at int64 addresses, and per-program shared memory.

Each kernel pointer argument gets its own buffer, placed at a base address `(i + 1) << 40` so that
buffers are far apart: an offset that walks out of one buffer lands in no buffer and is reported,
instead of silently reading a neighbour. Accesses are checked for bounds and alignment before any
byte is touched; masked-off lanes are never passed here.

Shared memory (`ttg.local_alloc`) is an array `[P, *alloc_shape]` per allocation, one slice per
program. Asynchronous copies into it are tracked per element with the commit group they belong to,
so a read of data whose `ttg.async_wait` has not happened yet is an error rather than a silent
read of data that, on a GPU, may not have arrived.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .types import Arr

_BASE_SHIFT = 40


@dataclass
class GlobalBuffer:
    """One kernel argument's memory."""

    name: str
    base: int
    storage: Arr  # the caller's 1-D array, mutated in place
    raw: Arr  # its bytes
    views: dict[np.dtype[Any], Arr] = field(default_factory=dict)

    @property
    def end(self) -> int:
        return self.base + self.raw.size

    def view(self, dt: np.dtype[Any]) -> Arr:
        v = self.views.get(dt)
        if v is None:
            usable = self.raw.size - self.raw.size % dt.itemsize
            v = self.raw[:usable].view(dt)
            self.views[dt] = v
        return v

    def describe(self) -> str:
        return (f"buffer {self.name!r} [0x{self.base:x}, 0x{self.end:x}) "
                f"({self.storage.size} elements of {self.storage.dtype})")


@dataclass(frozen=True)
class AccessFault:
    """Why an address could not be accessed: the lane (flat index among the accessed lanes) and the reason."""

    lane: int
    address: int
    reason: str
    nearest: str


class GlobalMemory:
    """Buffers at far-apart base addresses; loads, stores and read-modify-writes by address."""

    def __init__(self) -> None:
        self.buffers: list[GlobalBuffer] = []
        self._bases = np.zeros(0, dtype=np.int64)

    def add(self, name: str, storage: Arr) -> GlobalBuffer:
        if storage.ndim != 1 or not storage.flags.c_contiguous:
            raise ValueError(f"buffer {name!r}: storage must be a contiguous 1-D array")
        base = (len(self.buffers) + 1) << _BASE_SHIFT
        buf = GlobalBuffer(name, base, storage, storage.view(np.uint8))
        self.buffers.append(buf)
        self._bases = np.array([b.base for b in self.buffers], dtype=np.int64)
        return buf

    def _nearest(self, address: int) -> str:
        if not self.buffers:
            return "no buffers"
        best = min(self.buffers, key=lambda b: 0 if b.base <= address < b.end else min(abs(address - b.base),
                                                                                      abs(address - b.end)))
        if address < best.base:
            where = f"{best.base - address} bytes before"
        elif address >= best.end:
            where = f"{address - best.end} bytes past the end of"
        else:
            where = f"byte {address - best.base} of"
        return f"{where} {best.describe()}"

    def locate(self, addr: Arr, itemsize: int) -> tuple[list[tuple[GlobalBuffer, Arr | None, Arr]], AccessFault | None]:
        """Split flat addresses into per-buffer groups (buffer, lane indices, element indices), or the first fault.
        Lane indices None: every lane, in order (one buffer holds them all)."""
        if addr.size == 0:
            return [], None
        lo, hi = int(addr.min()), int(addr.max())
        k = int(np.searchsorted(self._bases, lo, side="right")) - 1
        if k >= 0:
            buf = self.buffers[k]
            if buf.base <= lo and hi + itemsize <= buf.end:
                rel = addr - buf.base
                if itemsize & (itemsize - 1) == 0:  # a power of two: masks and shifts (int64 % and // are slow)
                    if itemsize == 1 or not (rel & (itemsize - 1)).any():
                        return [(buf, None, rel >> (itemsize.bit_length() - 1))], None
                elif not (rel % itemsize).any():
                    return [(buf, None, rel // itemsize)], None
        # Slow path: several buffers, or a fault somewhere.
        ks = np.searchsorted(self._bases, addr, side="right") - 1
        ok = ks >= 0
        ends = np.array([b.end for b in self.buffers], dtype=np.int64)
        bases = self._bases
        kc = np.clip(ks, 0, None)
        ok &= (addr >= bases[kc]) & (addr + itemsize <= ends[kc])
        aligned = ((addr - bases[kc]) % itemsize) == 0
        bad = ~(ok & aligned)
        if bad.any():
            lane = int(np.flatnonzero(bad)[0])
            a = int(addr[lane])
            reason = "misaligned" if ok[lane] else "outside every buffer"
            return [], AccessFault(lane, a, reason, self._nearest(a))
        groups: list[tuple[GlobalBuffer, Arr | None, Arr]] = []
        for kk in np.unique(ks):
            lanes = np.flatnonzero(ks == kk)
            buf = self.buffers[int(kk)]
            groups.append((buf, lanes, (addr[lanes] - buf.base) // itemsize))
        return groups, None

    def load(self, addr: Arr, dt: np.dtype[Any], fault: Callable[[AccessFault], Exception]) -> Arr:
        groups, bad = self.locate(addr, dt.itemsize)
        if bad is not None:
            raise fault(bad)
        if len(groups) == 1 and groups[0][1] is None:
            return groups[0][0].view(dt)[groups[0][2]]
        out = np.empty(addr.size, dtype=dt)
        for buf, lanes, idx in groups:
            out[slice(None) if lanes is None else lanes] = buf.view(dt)[idx]
        return out

    def store(self, addr: Arr, values: Arr, fault: Callable[[AccessFault], Exception]) -> None:
        groups, bad = self.locate(addr, values.dtype.itemsize)
        if bad is not None:
            raise fault(bad)
        for buf, lanes, idx in groups:
            # Fancy assignment writes in index order, so of two lanes storing to one address the later
            # program (and the later element) wins, as the program order says.
            buf.view(values.dtype)[idx] = values if lanes is None else values[lanes]


@dataclass
class SharedAlloc:
    """One `ttg.local_alloc`: data and async-copy bookkeeping for every program of the chunk."""

    data: Arr  # [P, *alloc_shape]
    #: Per element, the commit group of the async copy that last wrote it (0: written synchronously).
    pending: Arr
    freed: bool = False


@dataclass(frozen=True)
class MemDesc:
    """A `!ttg.memdesc` value: an allocation, leading indices per program (`ttg.memdesc_index`), a permutation."""

    alloc: SharedAlloc
    indices: tuple[Arr, ...] = ()  # each [L] (per program) int64
    perm: tuple[int, ...] | None = None  # `ttg.memdesc_trans` order over the view's dimensions

    def index(self, i: Arr) -> MemDesc:
        return MemDesc(self.alloc, (*self.indices, i.astype(np.int64)), self.perm)

    def transposed(self, order: tuple[int, ...]) -> MemDesc:
        perm = order if self.perm is None else tuple(self.perm[o] for o in order)
        return MemDesc(self.alloc, self.indices, perm)

    def _select(self, arr: Arr) -> Arr:
        p = arr.shape[0]
        if not self.indices:
            return arr
        progs = np.arange(p)
        idx = tuple(np.broadcast_to(i, (p,)) for i in self.indices)
        return np.asarray(arr[(progs, *idx)])

    def read(self, which: str = "data") -> Arr:
        arr = self._select(self.alloc.data if which == "data" else self.alloc.pending)
        if self.perm is not None:
            arr = arr.transpose(0, *(d + 1 for d in self.perm))
        return arr

    def write(self, values: Arr, active: Arr, group: Arr | None = None) -> None:
        """Write `values` [P or 1, *view shape] for the active programs; `group` marks an async copy."""
        data, pending = self.alloc.data, self.alloc.pending
        p = data.shape[0]
        vals = np.broadcast_to(values, (p, *values.shape[1:]))
        if self.perm is not None:
            inv = np.argsort(self.perm)
            vals = vals.transpose(0, *(int(d) + 1 for d in inv))
        progs = np.flatnonzero(active)
        idx = tuple(np.broadcast_to(i, (p,))[progs] for i in self.indices)
        data[(progs, *idx)] = vals[progs]
        marks = np.zeros(p, dtype=np.int64) if group is None else np.broadcast_to(group, (p,))
        tail = (1,) * (data.ndim - 1 - len(idx))
        pending[(progs, *idx)] = marks[progs].reshape(-1, *tail)
