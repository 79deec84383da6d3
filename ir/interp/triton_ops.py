"""Semantics of the `tt` tensor, memory and compute ops, of `scf`/`cf` control flow, and of the TTGIR ops.

Memory ops touch memory only for active programs and, within those, only for lanes whose mask is on.
Stores of several lanes to one address keep the last in program order (program, then element).

`tt.atomic_rmw` and `tt.atomic_cas` run with sequential semantics in program order: lanes that hit
distinct addresses are done at once; lanes that share an address are applied one after the other
(`np.<ufunc>.at` when the returned old values are unused, an explicit loop when they are used).

`tt.dot` computes products and sums in float64 and rounds once to the accumulator type, after
rounding its inputs as `inputPrecision` says: `tf32` rounds f32 inputs to 10 mantissa bits (nearest
even); `tf32x3` splits each into a tf32 big part and a tf32 small part and adds the three products
big·small + small·big + big·big; `bf16x3`/`bf16x6` do the same with bf16 parts. Integer dots
accumulate exactly and wrap to the accumulator width.

`tt.reduce` folds the reduced axis as a balanced tree of adjacent pairs: level by level, elements
(0,1), (2,3), … are combined (an odd last element is carried to the next level), the combine region
running vectorized over every pair at once. `tt.scan` is an inclusive Hillis–Steele scan: in step
d = 1, 2, 4, … element i becomes combine(x[i-d], x[i]); the combiner must be associative (Triton
requires that too). With `reverse`, the scan runs from the last element.

TTGIR layouts carry no meaning here: `ttg.convert_layout` and `amdg.in_thread_transpose` are the
identity. Shared memory is modelled per program (see `memory.py`); `ttg.async_copy_global_to_local`
writes at once but the data counts as pending until a `ttg.async_wait` covers its commit group, and
reading pending data is an error. Fences and barriers are no-ops: programs run one op at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from xdsl.dialects.builtin import ArrayAttr, IntegerAttr, TensorType
from xdsl.interpreter import (
    Interpreter,
    InterpreterFunctions,
    PythonValues,
    ReturnedValues,
    Successor,
    TerminatorValue,
    impl_terminator,
    register_impls,
)
from xdsl.ir import Operation, Region

from kstrata.ir.dialects.tt import pointee_of

from .arith_ops import OPS, register, result_dtype
from .memory import MemDesc, SharedAlloc
from .state import InterpError, Machine, lead_mask, unsupported
from .types import (
    Arr,
    dtype_of,
    is_float,
    memory_dtype,
    round_mantissa,
    round_to,
    shape_of,
    unsigned,
)


def _has_uses(op: Operation) -> bool:
    return any(True for r in op.results for _ in r.uses)


def _align_leads(xs: Sequence[Arr]) -> list[Arr]:
    lead = max(x.shape[0] for x in xs)
    return [x if x.shape[0] == lead else np.broadcast_to(x, (lead, *x.shape[1:])) for x in xs]


def _pointee_size(t: Any) -> int:
    return memory_dtype(pointee_of(t)).itemsize


def _where_lead(mask: Arr, a: Any, b: Any) -> Any:
    """Per-program merge: `a` where `mask` [P] is set, else `b` (shared-memory views merge their indices)."""
    if isinstance(a, MemDesc) or isinstance(b, MemDesc):
        if not (isinstance(a, MemDesc) and isinstance(b, MemDesc)) or a.alloc is not b.alloc or \
                len(a.indices) != len(b.indices) or a.perm != b.perm:
            raise InterpError("programs diverge onto different shared-memory allocations, which the "
                              "interpreter does not model")
        return MemDesc(a.alloc, tuple(np.where(mask, x, y) for x, y in zip(a.indices, b.indices, strict=True)),
                       a.perm)
    nd = max(a.ndim, b.ndim)
    return np.where(lead_mask(mask, nd), a, b)


def _combine(interp: Interpreter, region: Region, left: list[Arr], right: list[Arr]) -> list[Arr]:
    """Run a reduce/scan combine region over every element of `left` and `right` at once."""
    shape = np.broadcast_shapes(*(x.shape for x in left + right))
    flat = [np.broadcast_to(x, shape).reshape(-1) for x in left + right]
    results = interp.run_ssacfg_region(region, tuple(flat), "combine")
    return [np.broadcast_to(r, (flat[0].size,)).reshape(shape) for r in results]


class TritonFunctions(InterpreterFunctions):
    """Implementations of the non-elementwise ops; they share the launch's `Machine`."""

    def __init__(self, machine: Machine) -> None:
        self.machine = machine

    # -- programs ---------------------------------------------------------------------------------
    def get_program_id(self, interp: Interpreter, op: Operation, args: PythonValues) -> PythonValues:
        axis = "xyz".index(str(op.properties["axis"].data))  # type: ignore[attr-defined]
        return (self.machine.pids[axis],)

    def get_num_programs(self, interp: Interpreter, op: Operation, args: PythonValues) -> PythonValues:
        axis = "xyz".index(str(op.properties["axis"].data))  # type: ignore[attr-defined]
        return (np.full(1, self.machine.grid[axis], dtype=np.int32),)

    # -- shapes -----------------------------------------------------------------------------------
    def make_range(self, interp: Interpreter, op: Operation, args: PythonValues) -> PythonValues:
        start = op.properties["start"].value.data  # type: ignore[attr-defined]
        end = op.properties["end"].value.data  # type: ignore[attr-defined]
        return (np.arange(start, end, dtype=np.int32)[None, :],)

    def splat(self, interp: Interpreter, op: Operation, args: PythonValues) -> PythonValues:
        (x,) = args
        shape = shape_of(op.results[0].type)
        return (np.broadcast_to(x.reshape(x.shape[0], *(1,) * len(shape)), (x.shape[0], *shape)),)

    def broadcast(self, interp: Interpreter, op: Operation, args: PythonValues) -> PythonValues:
        (x,) = args
        return (np.broadcast_to(x, (x.shape[0], *shape_of(op.results[0].type))),)

    def expand_dims(self, interp: Interpreter, op: Operation, args: PythonValues) -> PythonValues:
        axis = op.properties["axis"].value.data  # type: ignore[attr-defined]
        return (np.expand_dims(args[0], axis + 1),)

    def reshape(self, interp: Interpreter, op: Operation, args: PythonValues) -> PythonValues:
        (x,) = args
        return (x.reshape(x.shape[0], *shape_of(op.results[0].type)),)

    def trans(self, interp: Interpreter, op: Operation, args: PythonValues) -> PythonValues:
        order = [int(v) for v in op.properties["order"].get_values()]  # type: ignore[attr-defined]
        return (args[0].transpose(0, *(o + 1 for o in order)),)

    def join(self, interp: Interpreter, op: Operation, args: PythonValues) -> PythonValues:
        a, b = _align_leads(args)
        return (np.stack([a, b], axis=-1),)

    def split(self, interp: Interpreter, op: Operation, args: PythonValues) -> PythonValues:
        (x,) = args
        return (x[..., 0], x[..., 1])

    def cat(self, interp: Interpreter, op: Operation, args: PythonValues) -> PythonValues:
        a, b = _align_leads(args)
        return (np.concatenate([a, b], axis=1),)

    def identity(self, interp: Interpreter, op: Operation, args: PythonValues) -> PythonValues:
        return tuple(args)

    def no_op(self, interp: Interpreter, op: Operation, args: PythonValues) -> PythonValues:
        return ()

    # -- pointers and memory ----------------------------------------------------------------------
    def addptr(self, interp: Interpreter, op: Operation, args: PythonValues) -> PythonValues:
        ptr, off = args
        size = _pointee_size(op.results[0].type)
        return (ptr + off.astype(np.int64) * np.int64(size),)

    def _gather(self, op: Operation, addr: Arr, mask: Arr | None, other: Arr | None, t: Any) -> Arr:
        m = self.machine
        shape = shape_of(t)
        dt = memory_dtype(t)
        lanes = m.active_lanes(shape, mask)
        full = (m.num, *shape)
        if lanes.all():  # every lane: no zero fill and no scatter of the values (a published-size launch)
            vals = m.memory.load(np.broadcast_to(addr, full).reshape(-1), dt, m.fault(op, lanes, shape))
            out = vals.reshape(full)
            return out != 0 if dtype_of(t) == np.bool_ else out
        if other is not None:
            out = np.array(np.broadcast_to(other, full), dtype=dt)
        else:
            out = np.zeros(full, dtype=dt)  # masked-off lanes without `other` are undefined; 0 here
        if lanes.any():
            vals = m.memory.load(np.broadcast_to(addr, full)[lanes], dt, m.fault(op, lanes, shape))
            out[lanes] = vals
        return out != 0 if dtype_of(t) == np.bool_ else out

    def _scatter(self, op: Operation, addr: Arr, value: Arr, mask: Arr | None, t: Any) -> None:
        m = self.machine
        shape = shape_of(t)
        lanes = m.active_lanes(shape, mask)
        if not lanes.any():
            return
        full = (m.num, *shape)
        every = lanes.all()
        vals = np.broadcast_to(value, full).reshape(-1) if every else np.broadcast_to(value, full)[lanes]
        if vals.dtype == np.bool_:
            vals = vals.astype(np.uint8)
        m.memory.store(np.broadcast_to(addr, full).reshape(-1) if every else np.broadcast_to(addr, full)[lanes], vals,
                       m.fault(op, lanes, shape))

    def load(self, interp: Interpreter, op: Operation, args: PythonValues) -> PythonValues:
        if op.properties.get("boundaryCheck") is not None and len(op.properties["boundaryCheck"]) > 0:  # type: ignore[arg-type]
            raise unsupported(op, "block pointers")
        ptr, mask, other = [*args, None, None][:3]
        return (self._gather(op, ptr, mask, other, op.results[0].type),)

    def store(self, interp: Interpreter, op: Operation, args: PythonValues) -> PythonValues:
        ptr, value, mask = [*args, None][:3]
        self._scatter(op, ptr, value, mask, op.operands[1].type)
        return ()

    def buffer_load(self, interp: Interpreter, op: Operation, args: PythonValues) -> PythonValues:
        ptr, offsets, mask, other = [*args, None, None][:4]
        if getattr(op, "stride", None) is not None:
            raise unsupported(op, "buffer ops with a stride operand")
        t = op.results[0].type
        addr = lead_mask(ptr, offsets.ndim) + offsets.astype(np.int64) * np.int64(memory_dtype(t).itemsize)
        return (self._gather(op, addr, mask, other, t),)

    def buffer_store(self, interp: Interpreter, op: Operation, args: PythonValues) -> PythonValues:
        value, ptr, offsets, mask = [*args, None][:4]
        if getattr(op, "stride", None) is not None:
            raise unsupported(op, "buffer ops with a stride operand")
        t = op.operands[0].type
        addr = lead_mask(ptr, offsets.ndim) + offsets.astype(np.int64) * np.int64(memory_dtype(t).itemsize)
        self._scatter(op, addr, value, mask, t)
        return ()

    # -- atomics ----------------------------------------------------------------------------------
    def _rmw(self, op: Operation, kind: str, addr: Arr, val: Arr, mask: Arr | None, t: Any) -> Arr:
        m = self.machine
        shape = shape_of(t)
        dt = memory_dtype(t)
        full = (m.num, *shape)
        lanes = m.active_lanes(shape, mask)
        out = np.zeros(full, dtype=dt)
        if not lanes.any():
            return out
        a = np.broadcast_to(addr, full)[lanes]
        v = np.broadcast_to(val, full)[lanes].astype(dt)
        groups, bad = m.memory.locate(a, dt.itemsize)
        if bad is not None:
            raise m.fault(op, lanes, shape)(bad)
        width = dt.itemsize * 8
        old_all = np.zeros(a.size, dtype=dt)
        for buf, lanes_of, idx in groups:
            lane_idx = slice(None) if lanes_of is None else lanes_of  # None: every lane
            vv = v[lane_idx]
            view = buf.view(dt)
            if kind in ("umax", "umin"):
                vv = unsigned(vv, width)
                view = buf.view(vv.dtype)
            f = _RMW[kind]
            unique = np.unique(idx).size == idx.size
            if unique:
                old = view[idx].copy()
                view[idx] = _rmw_apply(f, old, vv)
            elif not _has_uses(op) and kind in _RMW_UFUNC and (dt.kind in "iu" or dt.kind == "f"):
                _RMW_UFUNC[kind].at(view, idx, vv)
                old = np.zeros(idx.size, dtype=view.dtype)
            else:
                old = np.empty(idx.size, dtype=view.dtype)
                for i in range(idx.size):  # sequential: each lane sees the previous lanes' updates
                    e = idx[i]
                    old[i] = view[e]
                    view[e] = _rmw_apply(f, view[e:e + 1], vv[i:i + 1])[0]
            old_all[lane_idx] = old.view(dt) if old.dtype != dt else old
        out[lanes] = old_all
        return out

    def atomic_rmw(self, interp: Interpreter, op: Operation, args: PythonValues) -> PythonValues:
        ptr, val, mask = [*args, None][:3]
        kind = str(op.properties["atomic_rmw_op"].data)  # type: ignore[attr-defined]
        return (self._rmw(op, kind, ptr, val, mask, op.results[0].type),)

    def buffer_atomic_rmw(self, interp: Interpreter, op: Operation, args: PythonValues) -> PythonValues:
        value, ptr, offsets, mask = [*args, None][:4]
        t = op.results[0].type
        addr = lead_mask(ptr, offsets.ndim) + offsets.astype(np.int64) * np.int64(memory_dtype(t).itemsize)
        kind = str(op.properties["atomic_rmw_op"].data)  # type: ignore[attr-defined]
        return (self._rmw(op, kind, addr, value, mask, t),)

    def atomic_cas(self, interp: Interpreter, op: Operation, args: PythonValues) -> PythonValues:
        ptr, cmp, val = args
        m = self.machine
        t = op.results[0].type
        shape = shape_of(t)
        dt = memory_dtype(t)
        bits = np.dtype(f"u{dt.itemsize}")
        full = (m.num, *shape)
        lanes = m.active_lanes(shape, None)
        out = np.zeros(full, dtype=dt)
        a = np.broadcast_to(ptr, full)[lanes]
        c = np.ascontiguousarray(np.broadcast_to(cmp, full)[lanes].astype(dt)).view(bits)
        v = np.ascontiguousarray(np.broadcast_to(val, full)[lanes].astype(dt)).view(bits)
        groups, bad = m.memory.locate(a, dt.itemsize)
        if bad is not None:
            raise m.fault(op, lanes, shape)(bad)
        old_all = np.zeros(a.size, dtype=bits)
        for buf, lanes_of, idx in groups:
            lane_idx = slice(None) if lanes_of is None else lanes_of  # None: every lane
            view = buf.view(bits)
            cc, vv = c[lane_idx], v[lane_idx]
            if np.unique(idx).size == idx.size:
                old = view[idx].copy()
                view[idx] = np.where(old == cc, vv, old)
            else:
                old = np.empty(idx.size, dtype=bits)
                for i in range(idx.size):  # sequential: a later lane sees an earlier lane's swap
                    e = idx[i]
                    old[i] = view[e]
                    if view[e] == cc[i]:
                        view[e] = vv[i]
            old_all[lane_idx] = old
        out[lanes] = old_all.view(dt)
        return (out,)

    # -- compute ----------------------------------------------------------------------------------
    def dot(self, interp: Interpreter, op: Operation, args: PythonValues) -> PythonValues:
        a, b, c = args[:3]
        a, b = self._operand(op, a), self._operand(op, b)
        use_c = args[3] if len(args) > 3 else None
        attr = op.properties.get("inputPrecision")
        if attr is None:  # (not `or`: an IntegerAttr of value 0, i.e. tf32, is falsy)
            attr = op.attributes.get("inputPrecision")
        precision = _precision_name(attr)
        if use_c is not None:
            c = np.where(lead_mask(use_c, c.ndim), c, np.zeros_like(c))
        return (_dot(a, b, c, precision, result_dtype(op)),)

    def _operand(self, op: Operation, x: Any) -> Arr:
        if isinstance(x, MemDesc):
            return self._read_shared(op, x)
        return np.asarray(x)

    def reduce(self, interp: Interpreter, op: Operation, args: PythonValues) -> PythonValues:
        axis = op.properties["axis"].value.data + 1  # type: ignore[attr-defined]
        xs = [np.moveaxis(x, axis, -1) for x in _align_leads(args)]
        region = op.regions[0]
        while xs[0].shape[-1] > 1:
            n = xs[0].shape[-1]
            h = n // 2
            comb = _combine(interp, region, [x[..., 0:2 * h:2] for x in xs], [x[..., 1:2 * h:2] for x in xs])
            if n % 2:
                comb = [np.concatenate([cb, x[..., -1:]], axis=-1) for cb, x in zip(comb, xs, strict=True)]
            xs = comb
        outs = []
        for x, r in zip(xs, op.results, strict=True):
            v = x[..., 0]
            outs.append(v.astype(dtype_of(r.type)) if v.dtype != dtype_of(r.type) else v)
        return tuple(outs)

    def scan(self, interp: Interpreter, op: Operation, args: PythonValues) -> PythonValues:
        axis = op.properties["axis"].value.data + 1  # type: ignore[attr-defined]
        reverse = bool(op.properties["reverse"].value.data)  # type: ignore[attr-defined]
        xs = [np.moveaxis(x, axis, -1) for x in _align_leads(args)]
        if reverse:
            xs = [x[..., ::-1] for x in xs]
        n = xs[0].shape[-1]
        d = 1
        while d < n:
            comb = _combine(interp, op.regions[0], [x[..., : n - d] for x in xs], [x[..., d:] for x in xs])
            xs = [np.concatenate([x[..., :d], cb.astype(x.dtype)], axis=-1) for x, cb in zip(xs, comb, strict=True)]
            d *= 2
        if reverse:
            xs = [x[..., ::-1] for x in xs]
        return tuple(np.moveaxis(x, -1, axis) for x in xs)

    def histogram(self, interp: Interpreter, op: Operation, args: PythonValues) -> PythonValues:
        (x,) = args
        bins = shape_of(op.results[0].type)[0]
        v = x.reshape(x.shape[0], -1).astype(np.int64)
        rows = v.shape[0]
        valid = (v >= 0) & (v < bins)
        idx = (np.arange(rows)[:, None] * bins + v)[valid]
        counts = np.bincount(idx, minlength=rows * bins).reshape(rows, bins)
        return (counts.astype(result_dtype(op)),)

    # -- debugging ops ----------------------------------------------------------------------------
    def assert_(self, interp: Interpreter, op: Operation, args: PythonValues) -> PythonValues:
        m = self.machine
        cond = args[0]
        failing = lead_mask(m.active, cond.ndim) & ~np.asarray(cond, dtype=np.bool_)
        if failing.any():
            program = int(np.argwhere(np.broadcast_to(failing, (m.num, *cond.shape[1:])))[0][0])
            message = op.properties["message"].data  # type: ignore[attr-defined]
            raise m.error(op, f"device assertion failed: {message}", program)
        return ()

    def print_(self, interp: Interpreter, op: Operation, args: PythonValues) -> PythonValues:
        prefix = op.properties["prefix"].data  # type: ignore[attr-defined]
        self.machine.printed.append(f"{prefix} " + " ".join(str(np.asarray(a).tolist()) for a in args))
        return ()

    def call(self, interp: Interpreter, op: Operation, args: PythonValues) -> PythonValues:
        callee = interp.get_op_for_symbol(op.properties["callee"])  # type: ignore[arg-type]
        return interp.run_ssacfg_region(callee.regions[0], tuple(args), "call")

    # -- control flow -----------------------------------------------------------------------------
    def scf_for(self, interp: Interpreter, op: Operation, args: PythonValues) -> PythonValues:
        m = self.machine
        lb, ub, step, *carried = args
        outer = m.active
        body = op.regions[0]
        uniform = all(np.all(v == v.reshape(-1)[0]) for v in (lb, ub, step))
        try:
            if uniform:
                # Every program iterates alike: no merging needed; inactive programs compute values
                # nobody reads, but their memory ops stay masked.
                lo, hi, st = int(lb.reshape(-1)[0]), int(ub.reshape(-1)[0]), int(step.reshape(-1)[0])
                if st <= 0 and lo < hi and outer.any():
                    raise m.error(op, "the loop step is not positive: the loop would never end")
                iv_dtype = lb.dtype
                for i in range(lo, hi, st):
                    carried = list(interp.run_ssacfg_region(body, (np.full(1, i, dtype=iv_dtype), *carried), "for"))
                return tuple(carried)
            iv = np.broadcast_to(lb, (m.num,)).copy()
            while True:
                running = outer & (iv < ub)
                if not running.any():
                    return tuple(carried)
                stuck = running & (np.broadcast_to(step, (m.num,)) <= 0)
                if stuck.any():
                    raise m.error(op, "the loop step is not positive: the loop would never end",
                                  int(np.flatnonzero(stuck)[0]))
                m.active = running
                new = interp.run_ssacfg_region(body, (iv, *carried), "for")
                carried = [_where_lead(running, n, c) for n, c in zip(new, carried, strict=True)]
                iv = np.where(running, iv + step, iv)
        finally:
            m.active = outer

    def scf_while(self, interp: Interpreter, op: Operation, args: PythonValues) -> PythonValues:
        m = self.machine
        outer = m.active
        running = outer
        values: Sequence[Arr] = args
        results: list[Arr] | None = None
        try:
            while True:
                m.active = running
                cond, *forwarded = interp.run_ssacfg_region(op.regions[0], tuple(values), "while.before")
                c = np.broadcast_to(np.asarray(cond, dtype=np.bool_), (m.num,))
                leaving = running & ~c
                if results is None:
                    results = list(forwarded)
                else:
                    results = [_where_lead(leaving, f, r) for f, r in zip(forwarded, results, strict=True)]
                running = running & c
                if not running.any():
                    return tuple(results)
                m.active = running
                values = interp.run_ssacfg_region(op.regions[1], tuple(forwarded), "while.after")
        finally:
            m.active = outer

    def scf_if(self, interp: Interpreter, op: Operation, args: PythonValues) -> PythonValues:
        m = self.machine
        cond = np.broadcast_to(np.asarray(args[0], dtype=np.bool_), (m.num,))
        outer = m.active
        then_on, else_on = outer & cond, outer & ~cond
        has_else = bool(op.regions[1].blocks)
        then_res: PythonValues | None = None
        else_res: PythonValues | None = None
        try:
            if then_on.any() or not has_else:
                m.active = then_on
                then_res = interp.run_ssacfg_region(op.regions[0], (), "if.then")
            if has_else and (else_on.any() or then_res is None):
                m.active = else_on
                else_res = interp.run_ssacfg_region(op.regions[1], (), "if.else")
        finally:
            m.active = outer
        if then_res is None:
            return tuple(else_res or ())
        if else_res is None:
            return tuple(then_res)
        return tuple(_where_lead(cond, t, e) for t, e in zip(then_res, else_res, strict=True))

    # -- shared memory (TTGIR) --------------------------------------------------------------------
    def _read_shared(self, op: Operation, desc: MemDesc) -> Arr:
        m = self.machine
        if desc.alloc.freed:
            raise m.error(op, "reads shared memory after its ttg.local_dealloc")
        pending = desc.read("pending")
        late = (pending > lead_mask(m.waited, pending.ndim)) & lead_mask(m.active, pending.ndim)
        if late.any():
            program = int(np.argwhere(late)[0][0])
            raise m.error(op, "reads shared memory written by an asynchronous copy that no ttg.async_wait "
                              "has waited for (a missing or too weak wait)", program)
        return desc.read()

    def local_alloc(self, interp: Interpreter, op: Operation, args: PythonValues) -> PythonValues:
        m = self.machine
        t = op.results[0].type
        alloc_shape = getattr(t, "alloc_shape", None)
        shape = tuple(d.data for d in alloc_shape.data) if isinstance(alloc_shape, ArrayAttr) else shape_of(t)
        dt = dtype_of(t)
        data = np.zeros((m.num, *shape), dtype=dt)
        alloc = SharedAlloc(data, np.zeros((m.num, *shape), dtype=np.int64))
        desc = MemDesc(alloc)
        if args:
            desc.write(args[0], m.active)
        return (desc,)

    def local_load(self, interp: Interpreter, op: Operation, args: PythonValues) -> PythonValues:
        return (self._read_shared(op, args[0]),)

    def local_store(self, interp: Interpreter, op: Operation, args: PythonValues) -> PythonValues:
        value, desc = args
        desc.write(value, self.machine.active)
        return ()

    def local_dealloc(self, interp: Interpreter, op: Operation, args: PythonValues) -> PythonValues:
        args[0].alloc.freed = True
        return ()

    def memdesc_index(self, interp: Interpreter, op: Operation, args: PythonValues) -> PythonValues:
        desc, index = args
        return (desc.index(index),)

    def memdesc_trans(self, interp: Interpreter, op: Operation, args: PythonValues) -> PythonValues:
        order = op.properties["order"]
        values = order.get_values() if hasattr(order, "get_values") else ()
        return (args[0].transposed(tuple(int(v) for v in values)),)

    def async_copy(self, interp: Interpreter, op: Operation, args: PythonValues) -> PythonValues:
        m = self.machine
        src, desc, mask, other = [*args, None, None][:4]
        t = TensorType(pointee_of(op.operands[0].type), shape_of(op.operands[0].type))
        values = self._gather(op, src, mask, other, t)
        desc.write(values, m.active, group=m.committed + 1)
        return (np.zeros(1, dtype=np.int32),)

    def async_commit_group(self, interp: Interpreter, op: Operation, args: PythonValues) -> PythonValues:
        m = self.machine
        m.committed = np.where(m.active, m.committed + 1, m.committed)
        return (np.zeros(1, dtype=np.int32),)

    def async_wait(self, interp: Interpreter, op: Operation, args: PythonValues) -> PythonValues:
        m = self.machine
        num = op.properties["num"].value.data  # type: ignore[attr-defined]
        # Waits until at most `num` committed groups are outstanding: all older groups are complete.
        m.waited = np.where(m.active, np.maximum(m.waited, m.committed - num), m.waited)
        return (np.zeros(1, dtype=np.int32),)

    def warp_group_dot_wait(self, interp: Interpreter, op: Operation, args: PythonValues) -> PythonValues:
        return tuple(args)


_RMW: dict[str, Callable[[Arr, Arr], Arr]] = {
    "add": np.add, "fadd": np.add, "max": np.maximum, "min": np.minimum, "umax": np.maximum,
    "umin": np.minimum, "and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor,
    "exch": lambda old, new: new,
}
_RMW_UFUNC: dict[str, np.ufunc] = {
    "add": np.add, "fadd": np.add, "max": np.maximum, "min": np.minimum, "umax": np.maximum, "umin": np.minimum,
    "and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor,
}


def _rmw_apply(f: Callable[[Arr, Arr], Arr], old: Arr, new: Arr) -> Arr:
    if is_float(old.dtype) and old.dtype.kind != "f":  # bf16/fp8: compute in f32, round back
        return np.asarray(f(old.astype(np.float32), new.astype(np.float32))).astype(old.dtype)
    return np.asarray(f(old, new)).astype(old.dtype)


def _split(x: Arr, precision: str) -> list[Arr]:
    """The parts of f32 `x` whose products a multi-pass dot adds up, big part first."""
    import ml_dtypes

    if precision.startswith("tf32"):
        parts = 2 if precision == "tf32x3" else 1

        def rnd(v: Arr) -> Arr:
            return round_mantissa(v, 10)
    else:
        parts = {"bf16x3": 2, "bf16x6": 3}[precision]

        def rnd(v: Arr) -> Arr:
            return v.astype(ml_dtypes.bfloat16).astype(np.float32)
    out, rest = [], x.astype(np.float32)
    for _ in range(parts):
        p = rnd(rest)
        out.append(p)
        rest = (rest - p).astype(np.float32)
    return out


#: Triton's InputPrecision enum by value, as generic-form ops (`ttng.warp_group_dot {inputPrecision = 0 : i32}`)
#: print it (values read from Triton 3.6's `ir.INPUT_PRECISION`).
_PRECISION_BY_VALUE = {0: "tf32", 1: "tf32x3", 2: "ieee", 3: "bf16x3", 4: "bf16x6"}


def _precision_name(attr: Any) -> str:
    """The input precision a dot's attribute names; MLIR omits the default, IEEE."""
    if attr is None:
        return "ieee"
    if isinstance(attr, IntegerAttr):
        value = attr.value.data
        if value not in _PRECISION_BY_VALUE:
            raise InterpError(f"unknown tt.dot input precision value {value}")
        return _PRECISION_BY_VALUE[value]
    data = getattr(attr, "data", None)
    return str(getattr(data, "value", data))


def _dot(a: Arr, b: Arr, c: Arr, precision: str, out: np.dtype[Any]) -> Arr:
    if not is_float(a.dtype):
        prod = np.matmul(a.astype(np.int64), b.astype(np.int64)) + c.astype(np.int64)
        return np.asarray(prod.astype(out))
    if precision in ("tf32", "tf32x3", "bf16x3", "bf16x6") and a.dtype == np.float32 and b.dtype == np.float32:
        pa, pb = _split(a, precision), _split(b, precision)
        if precision == "tf32":
            terms = [(pa[0], pb[0])]
        elif precision == "bf16x6":
            terms = [(pa[i], pb[j]) for i in range(3) for j in range(3) if i + j <= 2][::-1]
        else:
            terms = [(pa[0], pb[1]), (pa[1], pb[0]), (pa[0], pb[0])]
        acc = c.astype(np.float64)
        for x, y in terms:
            acc = acc + np.matmul(x.astype(np.float64), y.astype(np.float64))
        return round_to(acc, out)
    acc = np.matmul(a.astype(np.float64), b.astype(np.float64)) + c.astype(np.float64)
    return round_to(acc, out)


def _term(fn: Callable[..., tuple[Any, ...]]) -> Callable[..., tuple[TerminatorValue, PythonValues]]:
    def run(self: Any, interp: Interpreter, op: Operation, args: PythonValues) -> tuple[TerminatorValue, PythonValues]:
        return fn(self, interp, op, args)

    return run


def _returned(self: Any, interp: Interpreter, op: Operation, args: PythonValues) -> tuple[TerminatorValue, PythonValues]:
    return ReturnedValues(args), ()


def _branch(self: Any, interp: Interpreter, op: Operation, args: PythonValues) -> tuple[TerminatorValue, PythonValues]:
    return Successor(op.successors[0], args), ()


def _cond_branch(self: TritonFunctions, interp: Interpreter, op: Operation,
                 args: PythonValues) -> tuple[TerminatorValue, PythonValues]:
    m = self.machine
    cond = np.broadcast_to(np.asarray(args[0], dtype=np.bool_), (m.num,))[m.active]
    if cond.size and not (cond.all() or not cond.any()):
        raise unsupported(op, "a branch whose condition differs between programs (use scf.if)")
    n_true = len(op.operands) - 1 - (len(op.successors[1].args) if len(op.successors) > 1 else 0)
    taken = bool(cond.all()) if cond.size else True
    if taken:
        return Successor(op.successors[0], args[1:1 + n_true]), ()
    return Successor(op.successors[1], args[1 + n_true:]), ()


_METHODS: dict[str, str] = {
    "tt.get_program_id": "get_program_id", "tt.get_num_programs": "get_num_programs",
    "tt.make_range": "make_range", "tt.splat": "splat", "tt.broadcast": "broadcast",
    "tt.expand_dims": "expand_dims", "tt.reshape": "reshape", "tt.trans": "trans", "tt.join": "join",
    "tt.split": "split", "tt.cat": "cat", "tt.addptr": "addptr", "tt.load": "load", "tt.store": "store",
    "tt.atomic_rmw": "atomic_rmw", "tt.atomic_cas": "atomic_cas", "tt.dot": "dot", "tt.reduce": "reduce",
    "tt.scan": "scan", "tt.histogram": "histogram", "tt.assert": "assert_", "tt.print": "print_",
    "tt.call": "call", "scf.for": "scf_for", "scf.while": "scf_while", "scf.if": "scf_if",
    "ttg.convert_layout": "identity", "amdg.in_thread_transpose": "identity",
    "ttg.local_alloc": "local_alloc", "ttg.local_load": "local_load", "ttg.local_store": "local_store",
    "ttg.local_dealloc": "local_dealloc", "ttg.memdesc_index": "memdesc_index",
    "ttg.memdesc_trans": "memdesc_trans", "ttg.async_copy_global_to_local": "async_copy",
    "ttg.async_commit_group": "async_commit_group", "ttg.async_wait": "async_wait",
    "ttng.warp_group_dot": "dot", "ttng.warp_group_dot_wait": "warp_group_dot_wait",
    "amdg.buffer_load": "buffer_load", "amdg.buffer_store": "buffer_store",
    "amdg.buffer_atomic_rmw": "buffer_atomic_rmw",
    # Fences, barriers, scheduling hints and assumptions: programs run one op at a time here.
    "ttng.fence_async_shared": "no_op", "gpu.barrier": "no_op", "rocdl.s.setprio": "no_op",
    "rocdl.sched.barrier": "no_op", "rocdl.s.barrier": "no_op", "llvm.intr.assume": "no_op",
}
_TERMINATORS: dict[str, Callable[..., tuple[TerminatorValue, PythonValues]]] = {
    "tt.return": _returned, "tt.reduce.return": _returned, "tt.scan.return": _returned,
    "scf.yield": _returned, "scf.condition": _returned, "cf.br": _branch, "cf.cond_br": _cond_branch,
}


def _method(name: str) -> Callable[..., PythonValues]:
    def run(self: TritonFunctions, interp: Interpreter, op: Operation, args: PythonValues) -> PythonValues:
        result: PythonValues = getattr(self, name)(interp, op, args)
        return result

    return run


def _install() -> None:
    for op_name, method in _METHODS.items():
        if op_name in OPS:
            register(TritonFunctions, op_name, _method(method))
    for op_name, fn in _TERMINATORS.items():
        if op_name in OPS:
            setattr(TritonFunctions, "run_" + op_name.replace(".", "_"), impl_terminator(OPS[op_name])(_term(fn)))


_install()
register_impls(TritonFunctions)

__all__ = ["InterpError", "TritonFunctions"]
