"""Symbolic execution of one program of a TTIR/TTGIR kernel into z3 terms: its memory effects and loops.

A value of tensor type is a *function of a symbolic lane index*: `Sym.at((i, j))` gives the z3 term of
element `(i, j)` for any index terms, so `tt.make_range` is `start + i`, a broadcast ignores the index
of a broadcast dimension, `tt.expand_dims` drops one, `tt.reshape` relinearizes it, and elementwise ops
compose. Nothing is enumerated: an obligation about "every lane" is one query with a free lane vector.

Meaning of values (the same decisions as the interpreter in `kstrata.ir.interp`, which is the
reference; see its modules):
- integers and `index` are bit-vectors of their width (`i1` a Boolean), with the interpreter's wrapping
  and its choices for undefined cases (division by zero gives 0, `rem` by zero the dividend, shifts by
  the width or more give 0 or the sign fill);
- pointers are a buffer (which pointer argument they derive from, statically) and a 64-bit byte
  offset; distinct pointer arguments are distinct buffers;
- floats are z3 floating-point values, and float operations are *uninterpreted functions* named by the
  op, its types and its attributes (so an unchanged float computation is equal to itself, and any
  change is a difference until shown otherwise). In `exact` mode, the IEEE operations whose meaning the
  interpreter and the GPU agree on (add, sub, mul, neg, abs, fma, comparisons, exact widening, rounding
  conversions) use z3's floating-point theory; division stays uninterpreted because Triton lowers
  `arith.divf` to an approximate division on NVIDIA, and so do transcendentals and min/max;
- a masked load reads an uninterpreted memory function of the buffer and the byte offset (`other`, or
  0 as the interpreter does, where the mask is off);
- `tt.reduce` and `tt.scan` are uninterpreted folds of the operand (a z3 array over the reduced axis),
  shared by reductions whose combiner regions are proved equal (and, for floats, that reduce in the
  same layout, since the order of a float reduction follows the layout); `tt.dot` likewise, keyed by
  its input precision and layouts;
- `scf.for` with a constant trip count (at most `UNROLL_LIMIT`) is unrolled; otherwise its body runs
  once with a symbolic induction variable and symbolic carried values (one instance of the loop,
  numbered in execution order), the claims of `check.py` then being the induction step;
- `scf.if` runs both branches under their conditions; `tt.call` is inlined.

Ops outside this (atomics, `scf.while`, `cf` branches, shared memory and asynchronous copies, block
pointers, asserts and prints, inline assembly, …) raise `Unsupported` with the op and the reason.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import z3
from xdsl.dialects.builtin import (
    DenseIntOrFPElementsAttr,
    FloatAttr,
    IndexType,
    IntegerAttr,
    IntegerType,
    TensorType,
)
from xdsl.ir import Attribute, Block, Operation, Region, SSAValue

from kstrata.ir.dialects.tt import PointerType, pointee_of

#: Loops with a constant trip count up to this many iterations are unrolled; longer ones use induction.
UNROLL_LIMIT = 64

Idx = tuple[z3.BitVecRef, ...]
_ZERO32 = z3.BitVecVal(0, 32)


class Unsupported(Exception):
    """An op or a form the symbolic semantics does not model (the check is then `undecided`)."""

    def __init__(self, op: Operation | None, reason: str) -> None:
        where = f"{op.name}: " if op is not None else ""
        super().__init__(f"{where}{reason}")


@dataclass(frozen=True)
class Ptr:
    """A pointer element: the buffer (pointer argument index) it points into and a byte offset."""

    buf: int
    off: z3.BitVecRef


Elem = Any  # z3.ExprRef | Ptr


class Sym:
    """A value: its shape and element type, and a function from lane index terms to element terms."""

    def __init__(self, shape: tuple[int, ...], etype: Attribute, fn: Callable[[Idx], Elem]) -> None:
        self.shape = shape
        self.etype = etype
        self._fn = fn
        self._cache: dict[tuple[int, ...], Elem] = {}

    def at(self, idx: Idx) -> Elem:
        key = tuple(i.get_id() for i in idx)
        hit = self._cache.get(key)
        if hit is None:
            hit = self._fn(idx)
            self._cache[key] = hit
        return hit

    def scalar(self) -> Elem:
        return self.at(())

    @staticmethod
    def const(etype: Attribute, value: Elem) -> Sym:
        return Sym((), etype, lambda idx: value)


# ---------------------------------------------------------------------------------------------------
# types and sorts
# ---------------------------------------------------------------------------------------------------
_FP_SORTS: dict[str, tuple[int, int]] = {
    "f16": (5, 11), "bf16": (8, 8), "f32": (8, 24), "f64": (11, 53),
    "f8E4M3FN": (4, 4), "f8E5M2": (5, 3), "f8E4M3FNUZ": (4, 4), "f8E5M2FNUZ": (5, 3),
}
#: Float types with IEEE-754 semantics (the fp8 formats' special values differ: only uninterpreted there).
_IEEE = ("f16", "bf16", "f32", "f64")


def element_type(t: Attribute) -> Attribute:
    return t.element_type if isinstance(t, TensorType) else t


def shape_of(t: Attribute) -> tuple[int, ...]:
    return tuple(t.get_shape()) if isinstance(t, TensorType) else ()


def encoding_of(t: Attribute) -> str:
    enc = getattr(t, "encoding", None) if isinstance(t, TensorType) else None
    return "" if enc is None or str(enc) in ("", "none", "NoneAttr()") else str(enc)


def is_float_type(e: Attribute) -> bool:
    return str(e) in _FP_SORTS


def int_width(e: Attribute) -> int | None:
    if isinstance(e, IntegerType):
        return int(e.width.data)
    if isinstance(e, IndexType):
        return 64
    return None


def sort_of(e: Attribute, exact: bool = True) -> z3.SortRef:
    """The z3 sort of elements of type `e` (pointers are not a sort: they are `Ptr` values).

    Floats are z3 floating-point sorts when `exact`, else an uninterpreted sort per float type (values
    are then only equal or not, which keeps the solver in the theory of uninterpreted functions).
    """
    e = element_type(e)
    w = int_width(e)
    if w == 1:
        return z3.BoolSort()
    if w is not None:
        return z3.BitVecSort(w)
    fp = _FP_SORTS.get(str(e))
    if fp is not None:
        return z3.FPSort(*fp) if exact else z3.DeclareSort(f"float.{e}")
    raise Unsupported(None, f"type {e} is not modelled")


def sort_name(s: z3.SortRef) -> str:
    return str(s).replace(" ", "").replace("(", "").replace(")", "")


def default_of(s: z3.SortRef) -> z3.ExprRef:
    """A fixed value of sort `s`: what a lane outside a tensor's shape holds in a fold's array."""
    if s == z3.BoolSort():
        return z3.BoolVal(False)
    if isinstance(s, z3.BitVecSortRef):
        return z3.BitVecVal(0, s.size())
    if isinstance(s, z3.FPSortRef):
        return z3.FPVal(0.0, s)
    if str(s).startswith("float."):
        return z3.Const(f"lit.{str(s)[6:]}.0", s)  # the literal 0.0 (see `_literal`)
    raise Unsupported(None, f"sort {s}")


def memory_sort(e: Attribute, exact: bool = True) -> tuple[str, z3.SortRef]:
    """How an element of type `e` sits in memory: `i1` is a byte (as the interpreter and Triton store it)."""
    e = element_type(e)
    if int_width(e) == 1:
        return "i8", z3.BitVecSort(8)
    return str(e), sort_of(e, exact)


def _as_bool(x: z3.ExprRef) -> z3.BoolRef:
    return x if z3.is_bool(x) else x != 0


def _to_bv(x: z3.ExprRef, width: int) -> z3.BitVecRef:
    """A Boolean as an integer of `width` bits: 1 for true (unsigned view of i1)."""
    return z3.If(x, z3.BitVecVal(1, width), z3.BitVecVal(0, width))


def ptr_equal(a: Elem, b: Elem) -> z3.BoolRef:
    """Equality of two elements of the same type (pointers: same buffer and offset)."""
    if isinstance(a, Ptr) or isinstance(b, Ptr):
        if not (isinstance(a, Ptr) and isinstance(b, Ptr)):
            return z3.BoolVal(False)
        if a.buf != b.buf:
            return z3.BoolVal(False)
        return a.off == b.off
    if a.sort() != b.sort():
        return z3.BoolVal(False)
    return a == b


def elem_if(c: z3.BoolRef, a: Elem, b: Elem, op: Operation | None = None) -> Elem:
    if isinstance(a, Ptr) or isinstance(b, Ptr):
        if not (isinstance(a, Ptr) and isinstance(b, Ptr)) or a.buf != b.buf:
            raise Unsupported(op, "a pointer that selects between different buffers")
        return Ptr(a.buf, z3.If(c, a.off, b.off))
    return z3.If(c, a, b)


# ---------------------------------------------------------------------------------------------------
# effects and loops: what one program does, for check.py to compare
# ---------------------------------------------------------------------------------------------------
@dataclass
class Effect:
    """One memory operation: `kind` load/store, at every lane of `shape` where `guard` and `mask` hold."""

    kind: str
    buf: int
    shape: tuple[int, ...]
    dtype: str
    guard: z3.BoolRef
    mask: Callable[[Idx], z3.BoolRef]
    offset: Callable[[Idx], z3.BitVecRef]
    value: Callable[[Idx], Elem] | None
    op: Operation
    order: int
    loops: tuple[int, ...]


@dataclass
class LoopInstance:
    """One symbolic-bound `scf.for` run by induction: instance `number` in execution order."""

    number: int
    op: Operation
    guard: z3.BoolRef
    iv: z3.BitVecRef
    lb: z3.BitVecRef
    ub: z3.BitVecRef
    step: z3.BitVecRef
    inits: list[Sym]
    yields: list[Sym]
    signature: tuple[str, ...]

    def member(self, iv: z3.BitVecRef) -> z3.BoolRef:
        """Whether `iv` is one of the loop's induction values."""
        return z3.And(self.lb <= iv, iv < self.ub, z3.URem(iv - self.lb, self.step) == 0)

    @property
    def nonempty(self) -> z3.BoolRef:
        return z3.And(self.guard, self.lb < self.ub)


@dataclass
class Param:
    index: int
    type: Attribute
    divisibility: int | None


@dataclass
class Combiners:
    """Reduction and scan combiners met so far (shared by both programs): equal combiners share a fold."""

    entries: list[tuple[tuple[str, ...], list[z3.ExprRef], list[z3.ExprRef]]] = field(default_factory=list)
    timeout_ms: int = 2000

    def key(self, sorts: tuple[str, ...], formals: list[z3.ExprRef], results: list[z3.ExprRef]) -> int:
        for number, (s, f, r) in enumerate(self.entries):
            if s != sorts or len(r) != len(results):
                continue
            renamed = [z3.substitute(x, *zip(formals, f, strict=True)) for x in results]
            solver = z3.Solver()
            solver.set("timeout", self.timeout_ms)
            solver.add(z3.Not(z3.And(*[a == b for a, b in zip(renamed, r, strict=True)])))
            if solver.check() == z3.unsat:
                return number
        self.entries.append((sorts, formals, results))
        return len(self.entries) - 1


@dataclass
class SharedSymbols:
    """What the two programs share: argument symbols and program ids are named alike in both."""

    combiners: Combiners = field(default_factory=Combiners)
    exact: bool = False
    #: Float literals met, per uninterpreted float sort (they are distinct values).
    literals: dict[str, dict[int, z3.ExprRef]] = field(default_factory=dict)

    def literal(self, e: Attribute, value: float) -> z3.ExprRef:
        s = sort_of(e, self.exact)
        if self.exact:
            return z3.FPVal(float(value), s)
        from kstrata.ir.interp.types import dtype_of

        dt = dtype_of(e)
        import numpy as np

        bits = int(np.array([value], dtype=np.float64).astype(dt).view(np.dtype(f"u{dt.itemsize}"))[0])
        if value == 0 and not np.signbit(value):
            bits = 0
        key = str(e)
        c = z3.Const(f"lit.{key}.{bits}" if bits else f"lit.{key}.0", s)
        self.literals.setdefault(key, {})[bits] = c
        return c

    def distinct_literals(self) -> list[z3.BoolRef]:
        return [z3.Distinct(*lits.values()) for lits in self.literals.values() if len(lits) > 1]

    @staticmethod
    def pid(axis: int) -> z3.BitVecRef:
        return z3.BitVec(f"pid.{'xyz'[axis]}", 32)

    @staticmethod
    def num(axis: int) -> z3.BitVecRef:
        return z3.BitVec(f"num_programs.{'xyz'[axis]}", 32)

    def arg(self, index: int, t: Attribute) -> Elem:
        if isinstance(t, PointerType):
            return Ptr(index, z3.BitVecVal(0, 64))
        return z3.Const(f"arg{index}", sort_of(t, self.exact))


def _uf(name: str, *sorts: z3.SortRef) -> z3.FuncDeclRef:
    return z3.Function(name, *sorts)


def _attr_text(op: Operation, *names: str) -> str:
    parts = []
    for n in names:
        v = op.properties.get(n) or op.attributes.get(n)
        if v is not None:
            parts.append(f"{n}={v}")
    return ",".join(parts)


_RNE = z3.RNE()


# ---------------------------------------------------------------------------------------------------
# the executor
# ---------------------------------------------------------------------------------------------------
class Program:
    """Symbolically executes the entry function of a module: `effects` and `loops` after `run()`."""

    def __init__(self, func: Operation, shared: SharedSymbols, *, exact: bool = False) -> None:
        self.func = func
        self.shared = shared
        self.exact = exact
        self.effects: list[Effect] = []
        self.loops: list[LoopInstance] = []
        self.uses_num_programs = False
        self._loop_stack: list[int] = []
        self._fresh = 0
        block = func.regions[0].blocks.first
        assert block is not None
        self.params = [Param(i, a.type, _divisibility(func, i)) for i, a in enumerate(block.args)]

    def sort(self, e: Attribute) -> z3.SortRef:
        return sort_of(e, self.exact)

    def literal(self, e: Attribute, value: Any) -> z3.ExprRef:
        if is_float_type(e):
            return self.shared.literal(e, float(value))
        return _literal(e, value)

    def zero(self, e: Attribute) -> z3.ExprRef:
        return self.literal(e, 0) if is_float_type(element_type(e)) else default_of(self.sort(e))

    # -- driver -------------------------------------------------------------------------------------
    def run(self) -> None:
        region = self.func.regions[0]
        args = [Sym((), p.type, (lambda v: lambda idx: v)(self.shared.arg(p.index, p.type))) for p in self.params]
        self._region(region, args, z3.BoolVal(True), {})

    def _region(self, region: Region, args: Sequence[Sym], guard: z3.BoolRef,
                outer: dict[SSAValue, Any]) -> list[Sym]:
        if len(region.blocks) != 1:
            raise Unsupported(region.parent_op(), "control flow between blocks (cf branches)")
        block = region.blocks.first
        assert block is not None
        return self._block(block, args, guard, outer)

    def _block(self, block: Block, args: Sequence[Sym], guard: z3.BoolRef, outer: dict[SSAValue, Any]) -> list[Sym]:
        env = dict(outer)
        for a, v in zip(block.args, args, strict=True):
            env[a] = v
        for op in block.ops:
            if op.name in ("tt.return", "scf.yield", "tt.reduce.return", "tt.scan.return"):
                return [env[o] for o in op.operands]
            results = self._op(op, [env[o] for o in op.operands], guard, env)
            if len(results) != len(op.results):
                raise Unsupported(op, "internal: result count")
            for r, v in zip(op.results, results, strict=True):
                env[r] = v
        return []

    def fresh(self, prefix: str) -> int:
        self._fresh += 1
        return self._fresh

    # -- one op -------------------------------------------------------------------------------------
    def _op(self, op: Operation, args: list[Any], guard: z3.BoolRef, env: dict[SSAValue, Any]) -> list[Any]:
        name = op.name
        handler = _HANDLERS.get(name)
        if handler is not None:
            return handler(self, op, args, guard, env)
        if name in _ELEMENTWISE_INT or name in _FLOAT_OPS or name in _CASTS:
            return [self._elementwise(op, args)]
        raise Unsupported(op, _REFUSED.get(name, "not modelled by the symbolic checker"))

    def _elementwise(self, op: Operation, args: list[Sym]) -> Sym:
        rt = op.results[0].type
        shape = shape_of(rt)
        f = self._scalar_fn(op)
        ranks = [len(a.shape) for a in args]
        for a in args:
            if a.shape and a.shape != shape:
                raise Unsupported(op, "operands of different shapes")

        def fn(idx: Idx) -> Elem:
            return f(*[a.at(idx if r else ()) for a, r in zip(args, ranks, strict=True)])

        return Sym(shape, element_type(rt), fn)

    def _scalar_fn(self, op: Operation) -> Callable[..., Elem]:
        name = op.name
        if name in _ELEMENTWISE_INT:
            return _int_semantics(op)
        if name in _CASTS:
            return self._cast(op)
        return self._float(op)

    # -- floats -------------------------------------------------------------------------------------
    def _float(self, op: Operation) -> Callable[..., Elem]:
        name = op.name
        in_types = [element_type(o.type) for o in op.operands]
        out = element_type(op.results[0].type)
        flags = _attr_text(op, "fastmath", "predicate", "rounding", "propagateNan", "symbol", "pure")
        pred = None
        if name == "arith.cmpf":
            pred = op.MNEMONICS[op.properties["predicate"].value.data]  # type: ignore[attr-defined]
            flags = f"{pred},{_attr_text(op, 'fastmath')}"
        plain = "fastmath" not in flags or "fastmath=#arith.fastmath<none>" in flags
        ieee = all(str(t) in _IEEE for t in in_types if is_float_type(t)) and \
            (not is_float_type(out) or str(out) in _IEEE)
        if self.exact and plain and ieee:
            exact = _exact_float(name, pred, sort_of(out))
            if exact is not None:
                return exact
        sorts = [self.sort(t) for t in in_types] + [self.sort(out)]
        f = _uf(f"{name}[{','.join(str(t) for t in in_types)}->{out}]{{{flags}}}", *sorts)
        return lambda *xs: f(*xs)

    def _cast(self, op: Operation) -> Callable[..., Elem]:
        name = op.name
        src = element_type(op.operands[0].type)
        dst = element_type(op.results[0].type)
        ws, wd = int_width(src), int_width(dst)
        if name in ("arith.extsi", "arith.extui", "arith.trunci", "arith.index_cast", "arith.index_castui") \
                and ws is not None and wd is not None:
            signed = name in ("arith.extsi", "arith.index_cast")

            def cast(x: z3.ExprRef) -> z3.ExprRef:
                if ws == 1:
                    if wd == 1:
                        return x
                    return z3.If(x, z3.BitVecVal(-1 if signed else 1, wd), z3.BitVecVal(0, wd))
                if wd == 1:
                    return z3.Extract(0, 0, x) == 1
                if wd > ws:
                    return z3.SignExt(wd - ws, x) if signed else z3.ZeroExt(wd - ws, x)
                if wd < ws:
                    return z3.Extract(wd - 1, 0, x)
                return x

            return cast
        if name in ("arith.bitcast", "tt.bitcast") and ws is not None and wd is not None and ws == wd:
            return lambda x: x
        if isinstance(element_type(op.operands[0].type), PointerType) or isinstance(dst, PointerType):
            raise Unsupported(op, "conversions between pointers and integers")
        return self._float(op)

    # -- shapes -------------------------------------------------------------------------------------
    def constant(self, op: Operation, args: list[Any], guard: z3.BoolRef, env: dict[SSAValue, Any]) -> list[Any]:
        value = op.properties.get("value")
        if value is None:
            value = op.attributes.get("value")
        t = op.results[0].type
        e = element_type(t)
        shape = shape_of(t)
        if isinstance(value, IntegerAttr | FloatAttr):
            scalar = self.literal(e, value.value.data)
            return [Sym(shape, e, lambda idx: scalar)]
        if isinstance(value, DenseIntOrFPElementsAttr):
            vals = list(value.get_values())
            if len(set(vals)) == 1:
                v = self.literal(e, vals[0])
                return [Sym(shape, e, lambda idx: v)]
            if len(vals) > 256:
                raise Unsupported(op, "a dense constant of more than 256 distinct elements")
            lits = [self.literal(e, x) for x in vals]

            def fn(idx: Idx) -> Elem:
                lin = _linear(idx, shape)
                out = lits[-1]
                for k in range(len(lits) - 2, -1, -1):
                    out = z3.If(lin == k, lits[k], out)
                return out

            return [Sym(shape, e, fn)]
        raise Unsupported(op, f"constant {value}")

    def poison(self, op: Operation, args: list[Any], guard: z3.BoolRef, env: dict[SSAValue, Any]) -> list[Any]:
        t = op.results[0].type
        e = element_type(t)
        zero = self.zero(e)  # the interpreter's poison is 0
        return [Sym(shape_of(t), e, lambda idx: zero)]

    def make_range(self, op: Operation, args: list[Any], guard: z3.BoolRef, env: dict[SSAValue, Any]) -> list[Any]:
        start = op.properties["start"].value.data  # type: ignore[attr-defined]
        t = op.results[0].type
        return [Sym(shape_of(t), element_type(t), lambda idx: idx[0] + z3.BitVecVal(start, 32))]

    def splat(self, op: Operation, args: list[Any], guard: z3.BoolRef, env: dict[SSAValue, Any]) -> list[Any]:
        (x,) = args
        t = op.results[0].type
        return [Sym(shape_of(t), element_type(t), lambda idx: x.scalar())]

    def broadcast(self, op: Operation, args: list[Any], guard: z3.BoolRef, env: dict[SSAValue, Any]) -> list[Any]:
        (x,) = args
        t = op.results[0].type
        shape = shape_of(t)
        src = x.shape
        if len(src) != len(shape):
            raise Unsupported(op, "a broadcast that changes the rank")
        return [Sym(shape, element_type(t),
                    lambda idx: x.at(tuple(_ZERO32 if s == 1 and d != 1 else i
                                           for i, s, d in zip(idx, src, shape, strict=True))))]

    def expand_dims(self, op: Operation, args: list[Any], guard: z3.BoolRef, env: dict[SSAValue, Any]) -> list[Any]:
        (x,) = args
        axis = op.properties["axis"].value.data  # type: ignore[attr-defined]
        t = op.results[0].type
        return [Sym(shape_of(t), element_type(t), lambda idx: x.at(idx[:axis] + idx[axis + 1:]))]

    def reshape(self, op: Operation, args: list[Any], guard: z3.BoolRef, env: dict[SSAValue, Any]) -> list[Any]:
        (x,) = args
        t = op.results[0].type
        shape = shape_of(t)
        if op.properties.get("allow_reorder") is not None:
            raise Unsupported(op, "a reshape that may reorder elements")
        src = x.shape
        return [Sym(shape, element_type(t), lambda idx: x.at(_unlinear(_linear(idx, shape), src)))]

    def trans(self, op: Operation, args: list[Any], guard: z3.BoolRef, env: dict[SSAValue, Any]) -> list[Any]:
        (x,) = args
        order = [int(v) for v in op.properties["order"].get_values()]  # type: ignore[attr-defined]
        t = op.results[0].type

        def fn(idx: Idx) -> Elem:
            src: list[z3.BitVecRef] = [_ZERO32] * len(order)
            for i, o in enumerate(order):
                src[o] = idx[i]
            return x.at(tuple(src))

        return [Sym(shape_of(t), element_type(t), fn)]

    def join(self, op: Operation, args: list[Any], guard: z3.BoolRef, env: dict[SSAValue, Any]) -> list[Any]:
        a, b = args
        t = op.results[0].type
        return [Sym(shape_of(t), element_type(t),
                    lambda idx: elem_if(idx[-1] == 0, a.at(idx[:-1]), b.at(idx[:-1]), op))]

    def split(self, op: Operation, args: list[Any], guard: z3.BoolRef, env: dict[SSAValue, Any]) -> list[Any]:
        (x,) = args
        t = op.results[0].type
        one = z3.BitVecVal(1, 32)
        return [Sym(shape_of(t), element_type(t), lambda idx: x.at((*idx, _ZERO32))),
                Sym(shape_of(t), element_type(t), lambda idx: x.at((*idx, one)))]

    def cat(self, op: Operation, args: list[Any], guard: z3.BoolRef, env: dict[SSAValue, Any]) -> list[Any]:
        a, b = args
        t = op.results[0].type
        n = z3.BitVecVal(a.shape[0], 32)
        return [Sym(shape_of(t), element_type(t),
                    lambda idx: elem_if(z3.ULT(idx[0], n), a.at(idx), b.at((idx[0] - n, *idx[1:])), op))]

    def identity(self, op: Operation, args: list[Any], guard: z3.BoolRef, env: dict[SSAValue, Any]) -> list[Any]:
        return list(args)

    def no_op(self, op: Operation, args: list[Any], guard: z3.BoolRef, env: dict[SSAValue, Any]) -> list[Any]:
        return []

    def select(self, op: Operation, args: list[Any], guard: z3.BoolRef, env: dict[SSAValue, Any]) -> list[Any]:
        c, a, b = args
        t = op.results[0].type
        shape = shape_of(t)

        def fn(idx: Idx) -> Elem:
            return elem_if(c.at(idx if c.shape else ()), a.at(idx if a.shape else ()), b.at(idx if b.shape else ()), op)

        return [Sym(shape, element_type(t), fn)]

    # -- programs -----------------------------------------------------------------------------------
    def program_id(self, op: Operation, args: list[Any], guard: z3.BoolRef, env: dict[SSAValue, Any]) -> list[Any]:
        axis = "xyz".index(str(op.properties["axis"].data))  # type: ignore[attr-defined]
        pid = SharedSymbols.pid(axis)
        return [Sym.const(op.results[0].type, pid)]

    def num_programs(self, op: Operation, args: list[Any], guard: z3.BoolRef, env: dict[SSAValue, Any]) -> list[Any]:
        axis = "xyz".index(str(op.properties["axis"].data))  # type: ignore[attr-defined]
        self.uses_num_programs = True
        return [Sym.const(op.results[0].type, SharedSymbols.num(axis))]

    # -- pointers and memory ------------------------------------------------------------------------
    def addptr(self, op: Operation, args: list[Any], guard: z3.BoolRef, env: dict[SSAValue, Any]) -> list[Any]:
        p, off = args
        t = op.results[0].type
        shape = shape_of(t)
        size = _pointee_bytes(t)
        w = int_width(element_type(op.operands[1].type)) or 64

        def fn(idx: Idx) -> Elem:
            base = p.at(idx if p.shape else ())
            o = off.at(idx if off.shape else ())
            if w == 1:
                o = _to_bv(o, 64)
            elif w < 64:
                o = z3.SignExt(64 - w, o)
            if not isinstance(base, Ptr):
                raise Unsupported(op, "pointer arithmetic on a value that is not a pointer")
            return Ptr(base.buf, base.off + o * z3.BitVecVal(size, 64))

        return [Sym(shape, element_type(t), fn)]

    def _buf_of(self, op: Operation, ptrs: Sym) -> int:
        probe = ptrs.at(tuple(z3.BitVec(f"probe{k}", 32) for k in range(len(ptrs.shape))))
        if not isinstance(probe, Ptr):
            raise Unsupported(op, "a pointer that does not derive from a pointer argument")
        return probe.buf

    def load(self, op: Operation, args: list[Any], guard: z3.BoolRef, env: dict[SSAValue, Any]) -> list[Any]:
        bc = op.properties.get("boundaryCheck")
        if bc is not None and len(bc) > 0:  # type: ignore[arg-type]
            raise Unsupported(op, "block pointers")
        ptrs = args[0]
        mask = args[1] if len(args) > 1 else None
        other = args[2] if len(args) > 2 else None
        t = op.results[0].type
        if isinstance(element_type(t), PointerType):
            raise Unsupported(op, "loads of pointers")
        shape = shape_of(t)
        e = element_type(t)
        buf = self._buf_of(op, ptrs)
        mname, msort = memory_sort(e, self.exact)
        memory = _uf(f"mem{buf}:{mname}", z3.BitVecSort(64), msort)
        is_bool = int_width(e) == 1
        zero = self.zero(e)

        def on(idx: Idx) -> z3.BoolRef:
            return z3.BoolVal(True) if mask is None else mask.at(idx if mask.shape else ())

        def off(idx: Idx) -> z3.BitVecRef:
            return ptrs.at(idx if ptrs.shape else ()).off

        def value(idx: Idx) -> Elem:
            raw = memory(off(idx))
            v = raw != 0 if is_bool else raw
            alt = zero if other is None else other.at(idx if other.shape else ())
            return z3.If(on(idx), v, alt)

        self._effect("load", buf, shape, mname, guard, on, off, None, op)
        return [Sym(shape, e, value)]

    def store(self, op: Operation, args: list[Any], guard: z3.BoolRef, env: dict[SSAValue, Any]) -> list[Any]:
        bc = op.properties.get("boundaryCheck")
        if bc is not None and len(bc) > 0:  # type: ignore[arg-type]
            raise Unsupported(op, "block pointers")
        ptrs, val = args[0], args[1]
        mask = args[2] if len(args) > 2 else None
        t = op.operands[1].type
        e = element_type(t)
        if isinstance(e, PointerType):
            raise Unsupported(op, "stores of pointers")
        shape = shape_of(t)
        buf = self._buf_of(op, ptrs)
        mname, _ = memory_sort(e, self.exact)
        is_bool = int_width(e) == 1

        def on(idx: Idx) -> z3.BoolRef:
            return z3.BoolVal(True) if mask is None else mask.at(idx if mask.shape else ())

        def off(idx: Idx) -> z3.BitVecRef:
            return ptrs.at(idx if ptrs.shape else ()).off

        def value(idx: Idx) -> Elem:
            v = val.at(idx if val.shape else ())
            return _to_bv(v, 8) if is_bool else v

        self._effect("store", buf, shape, mname, guard, on, off, value, op)
        return []

    def _effect(self, kind: str, buf: int, shape: tuple[int, ...], dtype: str, guard: z3.BoolRef,
                mask: Callable[[Idx], z3.BoolRef], offset: Callable[[Idx], z3.BitVecRef],
                value: Callable[[Idx], Elem] | None, op: Operation) -> None:
        self.effects.append(Effect(kind, buf, shape, dtype, guard, mask, offset, value, op, len(self.effects),
                                   tuple(self._loop_stack)))

    # -- compute ------------------------------------------------------------------------------------
    def _combiner(self, op: Operation, elems: list[Attribute]) -> int:
        sorts = [self.sort(e) for e in elems]
        n = len(sorts)
        formals = [z3.Const(f"comb.{k}.{sort_name(s)}", s) for k, s in enumerate(sorts + sorts)]
        region = op.regions[0]
        args = [Sym.const(e, f) for e, f in zip(elems + elems, formals, strict=True)]
        results = self._region(region, args, z3.BoolVal(True), {})
        if len(results) != n:
            raise Unsupported(op, "a combiner whose results do not match its operands")
        terms = [r.scalar() for r in results]
        if any(isinstance(x, Ptr) for x in terms):
            raise Unsupported(op, "reductions of pointers")
        key = tuple(sort_name(s) for s in sorts) + (("exact",) if self.exact else ())
        return self.shared.combiners.key(key, formals, terms)

    def _axis_array(self, x: Sym, idx: Idx, axis: int, j: z3.BitVecRef, default: z3.ExprRef) -> z3.ExprRef:
        n = z3.BitVecVal(x.shape[axis], 32)
        full = (*idx[:axis], j, *idx[axis:])
        element = x.at(full)
        if isinstance(element, Ptr):
            raise Unsupported(None, "reductions of pointers")
        return z3.Lambda([j], z3.If(z3.ULT(j, n), element, default))

    def reduce(self, op: Operation, args: list[Any], guard: z3.BoolRef, env: dict[SSAValue, Any]) -> list[Any]:
        axis = op.properties["axis"].value.data  # type: ignore[attr-defined]
        elems = [element_type(o.type) for o in op.operands]
        key = self._combiner(op, elems)
        layout = "|".join(encoding_of(o.type) for o in op.operands) if any(is_float_type(e) for e in elems) else ""
        n = args[0].shape[axis]
        sorts = [self.sort(e) for e in elems]
        arrays = [z3.ArraySort(z3.BitVecSort(32), s) for s in sorts]
        out: list[Sym] = []
        number = self.fresh("reduce")
        for r, (res, s) in enumerate(zip(op.results, sorts, strict=True)):
            fold = _uf(f"fold{key}.{r}[{n}]{{{layout}}}", *arrays, s)
            j = z3.BitVec(f"red{number}.j", 32)

            def fn(idx: Idx, fold: z3.FuncDeclRef = fold, j: z3.BitVecRef = j) -> Elem:
                return fold(*[self._axis_array(a, idx, axis, j, default_of(so)) for a, so in zip(args, sorts, strict=True)])

            out.append(Sym(shape_of(res.type), element_type(res.type), fn))
        return out

    def scan(self, op: Operation, args: list[Any], guard: z3.BoolRef, env: dict[SSAValue, Any]) -> list[Any]:
        axis = op.properties["axis"].value.data  # type: ignore[attr-defined]
        reverse = "true" in str(op.properties.get("reverse"))
        elems = [element_type(o.type) for o in op.operands]
        key = self._combiner(op, elems)
        layout = "|".join(encoding_of(o.type) for o in op.operands) if any(is_float_type(e) for e in elems) else ""
        n = args[0].shape[axis]
        sorts = [self.sort(e) for e in elems]
        arrays = [z3.ArraySort(z3.BitVecSort(32), s) for s in sorts]
        out: list[Sym] = []
        number = self.fresh("scan")
        for r, (res, s) in enumerate(zip(op.results, sorts, strict=True)):
            f = _uf(f"scan{key}.{r}[{n}]{{{layout}}}{'rev' if reverse else ''}", *arrays, z3.BitVecSort(32), s)
            j = z3.BitVec(f"scan{number}.j", 32)

            def fn(idx: Idx, f: z3.FuncDeclRef = f, j: z3.BitVecRef = j) -> Elem:
                rest = idx[:axis] + idx[axis + 1:]
                arrs = [self._axis_array(a, rest, axis, j, default_of(so)) for a, so in zip(args, sorts, strict=True)]
                return f(*arrs, idx[axis])

            out.append(Sym(shape_of(res.type), element_type(res.type), fn))
        return out

    def dot(self, op: Operation, args: list[Any], guard: z3.BoolRef, env: dict[SSAValue, Any]) -> list[Any]:
        a, b, c = args[:3]
        if len(args) > 3:
            raise Unsupported(op, "a dot with a use-accumulator operand")
        t = op.results[0].type
        if isinstance(a, MemValue) or isinstance(b, MemValue):
            a = a.value if isinstance(a, MemValue) else a
            b = b.value if isinstance(b, MemValue) else b
        rank = len(a.shape)
        if rank not in (2, 3):
            raise Unsupported(op, f"a dot of rank {rank}")
        k = a.shape[-1]
        ea, eb, ec = element_type(op.operands[0].type), element_type(op.operands[1].type), element_type(t)
        sa, sb, sc = self.sort(ea), self.sort(eb), self.sort(ec)
        layout = "|".join(encoding_of(o.type) for o in op.operands) + "|" + encoding_of(t)
        attrs = _attr_text(op, "inputPrecision", "maxNumImpreciseAcc")
        f = _uf(f"dot[{ea},{eb}->{ec}][{k}]{{{attrs}}}{{{layout}}}{{{op.name}}}",
                z3.ArraySort(z3.BitVecSort(32), sa), z3.ArraySort(z3.BitVecSort(32), sb), sc, sc)
        number = self.fresh("dot")
        kk = z3.BitVec(f"dot{number}.k", 32)
        kn = z3.BitVecVal(k, 32)

        def fn(idx: Idx) -> Elem:
            lead, i, j = idx[:-2], idx[-2], idx[-1]
            row = z3.Lambda([kk], z3.If(z3.ULT(kk, kn), a.at((*lead, i, kk)), default_of(sa)))
            col = z3.Lambda([kk], z3.If(z3.ULT(kk, kn), b.at((*lead, kk, j)), default_of(sb)))
            return f(row, col, c.at(idx))

        return [Sym(shape_of(t), ec, fn)]

    def call(self, op: Operation, args: list[Any], guard: z3.BoolRef, env: dict[SSAValue, Any]) -> list[Any]:
        callee = str(op.properties["callee"]).lstrip("@")
        module = self.func.parent_op()
        target = None
        if module is not None:
            for f in module.regions[0].blocks.first.ops:  # type: ignore[union-attr]
                if f.name == "tt.func" and str(f.properties["sym_name"].data) == callee:
                    target = f
        if target is None:
            raise Unsupported(op, f"call of an unknown function @{callee}")
        return self._region(target.regions[0], args, guard, {})

    # -- control flow -------------------------------------------------------------------------------
    def scf_if(self, op: Operation, args: list[Any], guard: z3.BoolRef, env: dict[SSAValue, Any]) -> list[Any]:
        cond = args[0].scalar()
        then = self._region(op.regions[0], [], z3.And(guard, cond), env)
        if not op.regions[1].blocks:
            return []
        other = self._region(op.regions[1], [], z3.And(guard, z3.Not(cond)), env)
        out: list[Any] = []
        for r, t, e in zip(op.results, then, other, strict=True):
            if isinstance(t, MemValue) or isinstance(e, MemValue):
                raise Unsupported(op, "shared memory chosen by a condition")
            out.append(_merge(r.type, cond, t, e, op))
        return out

    def scf_for(self, op: Operation, args: list[Any], guard: z3.BoolRef, env: dict[SSAValue, Any]) -> list[Any]:
        if op.properties.get("unsignedCmp") is not None or op.attributes.get("unsignedCmp") is not None:
            raise Unsupported(op, "loops with unsigned bounds")
        lb, ub, step, *carried = args
        if any(isinstance(c, MemValue) for c in carried):
            raise Unsupported(op, "shared memory carried by a loop")
        body = op.regions[0]
        lo, hi, st = (z3.simplify(x.scalar()) for x in (lb, ub, step))
        if all(z3.is_bv_value(v) for v in (lo, hi, st)):
            lo_i, hi_i, st_i = (v.as_signed_long() for v in (lo, hi, st))
            if st_i <= 0 and lo_i < hi_i:
                raise Unsupported(op, "a loop whose step is not positive")
            trips = len(range(lo_i, hi_i, st_i)) if st_i > 0 else 0
            if trips <= UNROLL_LIMIT:
                iv_t = op.operands[0].type
                w = int_width(iv_t) or 64
                for i in range(lo_i, hi_i, st_i) if st_i > 0 else ():
                    carried = self._region(body, [Sym.const(iv_t, z3.BitVecVal(i, w)), *carried], guard, env)
                return list(carried)
        return self._induction(op, lo, hi, st, carried, guard, env)

    def _induction(self, op: Operation, lo: z3.BitVecRef, hi: z3.BitVecRef, st: z3.BitVecRef, inits: list[Sym],
                   guard: z3.BoolRef, env: dict[SSAValue, Any]) -> list[Any]:
        number = len(self.loops)
        iv_t = op.operands[0].type
        w = int_width(iv_t) or 64
        signature = tuple(_type_key(r.type) for r in op.results)
        tag = f"loop{number}[{','.join(signature)}]"
        iv = z3.BitVec(f"{tag}.iv", w)
        starts = [self._fresh_value(f"{tag}.carry{j}", init) for j, init in enumerate(inits)]
        record = LoopInstance(number, op, guard, iv, lo, hi, st, inits, [], signature)
        self.loops.append(record)
        self._loop_stack.append(number)
        try:
            yields = self._region(op.regions[0], [Sym.const(iv_t, iv), *starts], z3.And(guard, record.member(iv)), env)
        finally:
            self._loop_stack.pop()
        record.yields = yields
        nonempty = lo < hi
        out: list[Any] = []
        for j, init in enumerate(inits):
            final = self._fresh_value(f"{tag}.result{j}", init)
            out.append(Sym(init.shape, init.etype,
                           (lambda f, i: lambda idx: elem_if(nonempty, f.at(idx), i.at(idx), op))(final, init)))
        return out

    def _fresh_value(self, name: str, like: Sym) -> Sym:
        """An arbitrary value of `like`'s type: a function of the lane (a pointer keeps its buffer)."""
        probe = like.at(tuple(z3.BitVec(f"probe{k}", 32) for k in range(len(like.shape))))
        lanes = [z3.BitVecSort(32)] * len(like.shape)
        if isinstance(probe, Ptr):
            f = _uf(f"{name}.off", *lanes, z3.BitVecSort(64))
            buf = probe.buf
            if not like.shape:
                c = z3.Const(f"{name}.off", z3.BitVecSort(64))
                return Sym((), like.etype, lambda idx: Ptr(buf, c))
            return Sym(like.shape, like.etype, lambda idx: Ptr(buf, f(*idx)))
        s = probe.sort()
        if not like.shape:
            c = z3.Const(name, s)
            return Sym((), like.etype, lambda idx: c)
        g = _uf(name, *lanes, s)
        return Sym(like.shape, like.etype, lambda idx: g(*idx))

    # -- shared memory: a value, when nothing asynchronous is involved -------------------------------
    def local_alloc(self, op: Operation, args: list[Any], guard: z3.BoolRef, env: dict[SSAValue, Any]) -> list[Any]:
        if not args:
            raise Unsupported(op, "shared memory allocated without a value (written later)")
        return [MemValue(args[0])]

    def local_load(self, op: Operation, args: list[Any], guard: z3.BoolRef, env: dict[SSAValue, Any]) -> list[Any]:
        (m,) = args
        if not isinstance(m, MemValue):
            raise Unsupported(op, "shared memory that is not a local_alloc of a value")
        t = op.results[0].type
        v = m.value
        return [Sym(shape_of(t), element_type(t), v.at)]


def _merge(t: Attribute, cond: z3.BoolRef, then: Sym, other: Sym, op: Operation) -> Sym:
    return Sym(shape_of(t), element_type(t), lambda idx: elem_if(cond, then.at(idx), other.at(idx), op))


@dataclass
class MemValue:
    """A `ttg.local_alloc` of a value, never written again: reads give the value."""

    value: Sym


def _type_key(t: Attribute) -> str:
    return f"{'x'.join(str(d) for d in shape_of(t))}{element_type(t)}"


def _divisibility(func: Operation, index: int) -> int | None:
    attrs = func.properties.get("arg_attrs")
    if attrs is None:
        return None
    try:
        d = attrs.data[index].data.get("tt.divisibility")  # type: ignore[attr-defined]
    except (AttributeError, IndexError):
        return None
    return int(d.value.data) if isinstance(d, IntegerAttr) else None


def _pointee_bytes(t: Attribute) -> int:
    e = pointee_of(t)
    s = str(e)
    w = int_width(e)
    if w is not None:
        return max(1, w // 8)
    sizes = {"f16": 2, "bf16": 2, "f32": 4, "f64": 8}
    if s.startswith("f8"):
        return 1
    if s in sizes:
        return sizes[s]
    if isinstance(e, PointerType):
        return 8
    raise Unsupported(None, f"pointers to {e}")


def _literal(e: Attribute, value: Any) -> z3.ExprRef:
    w = int_width(e)
    if w == 1:
        return z3.BoolVal(bool(int(value) & 1))
    if w is not None:
        return z3.BitVecVal(int(value), w)
    if is_float_type(e):
        return z3.FPVal(float(value), sort_of(e))
    raise Unsupported(None, f"constants of type {e}")


def _linear(idx: Idx, shape: tuple[int, ...]) -> z3.BitVecRef:
    lin: z3.BitVecRef = _ZERO32
    for i, n in zip(idx, shape, strict=True):
        lin = lin * z3.BitVecVal(n, 32) + i
    return lin


def _unlinear(lin: z3.BitVecRef, shape: tuple[int, ...]) -> Idx:
    out: list[z3.BitVecRef] = []
    for n in reversed(shape):
        out.append(z3.URem(lin, z3.BitVecVal(n, 32)))
        lin = z3.UDiv(lin, z3.BitVecVal(n, 32))
    return tuple(reversed(out))


# ---------------------------------------------------------------------------------------------------
# integer semantics (as in ir/interp/arith_ops.py)
# ---------------------------------------------------------------------------------------------------
def _bool_or_bv(f_bool: Callable[..., z3.ExprRef], f_bv: Callable[..., z3.ExprRef]) -> Callable[..., z3.ExprRef]:
    def run(a: z3.ExprRef, b: z3.ExprRef) -> z3.ExprRef:
        return f_bool(a, b) if z3.is_bool(a) else f_bv(a, b)

    return run


def _i1_as_signed(f: Callable[..., z3.ExprRef]) -> Callable[..., z3.ExprRef]:
    """Arithmetic on i1 through its one-bit integer view, back to a Boolean."""

    def run(a: z3.ExprRef, b: z3.ExprRef) -> z3.ExprRef:
        if z3.is_bool(a):
            r = f(_to_bv(a, 1), _to_bv(b, 1))
            return r == 1 if not z3.is_bool(r) else r
        return f(a, b)

    return run


def _divsi(a: z3.BitVecRef, b: z3.BitVecRef) -> z3.BitVecRef:
    return z3.If(b == 0, z3.BitVecVal(0, a.size()), a / b)


def _remsi(a: z3.BitVecRef, b: z3.BitVecRef) -> z3.BitVecRef:
    return z3.If(b == 0, a, z3.SRem(a, b))


def _divui(a: z3.BitVecRef, b: z3.BitVecRef) -> z3.BitVecRef:
    return z3.If(b == 0, z3.BitVecVal(0, a.size()), z3.UDiv(a, b))


def _remui(a: z3.BitVecRef, b: z3.BitVecRef) -> z3.BitVecRef:
    return z3.If(b == 0, a, z3.URem(a, b))


def _floordivsi(a: z3.BitVecRef, b: z3.BitVecRef) -> z3.BitVecRef:
    q = a / b
    fix = z3.And(z3.SRem(a, b) != 0, (a < 0) != (b < 0))
    return z3.If(b == 0, z3.BitVecVal(0, a.size()), z3.If(fix, q - 1, q))


def _shift(kind: str) -> Callable[..., z3.ExprRef]:
    def run(a: z3.ExprRef, b: z3.ExprRef) -> z3.ExprRef:
        if z3.is_bool(a):
            return z3.If(z3.Not(b), a, a if kind == "shrsi" else z3.BoolVal(False))
        w = a.size()
        big = z3.UGE(b, z3.BitVecVal(w, w))
        if kind == "shli":
            return z3.If(big, z3.BitVecVal(0, w), a << b)
        if kind == "shrui":
            return z3.If(big, z3.BitVecVal(0, w), z3.LShR(a, b))
        return z3.If(big, z3.If(a < 0, z3.BitVecVal(-1, w), z3.BitVecVal(0, w)), a >> b)

    return run


def _mulhiui(a: z3.BitVecRef, b: z3.BitVecRef) -> z3.BitVecRef:
    w = a.size()
    return z3.Extract(2 * w - 1, w, z3.ZeroExt(w, a) * z3.ZeroExt(w, b))


def _cmpi_fn(pred: str) -> Callable[..., z3.ExprRef]:
    table: dict[str, Callable[[z3.BitVecRef, z3.BitVecRef], z3.BoolRef]] = {
        "eq": lambda a, b: a == b, "ne": lambda a, b: a != b, "slt": lambda a, b: a < b, "sle": lambda a, b: a <= b,
        "sgt": lambda a, b: a > b, "sge": lambda a, b: a >= b, "ult": z3.ULT, "ule": z3.ULE, "ugt": z3.UGT,
        "uge": z3.UGE}
    f = table[pred]

    def run(a: z3.ExprRef, b: z3.ExprRef) -> z3.ExprRef:
        if z3.is_bool(a):
            if pred in ("eq", "ne"):
                return a == b if pred == "eq" else a != b
            a, b = _to_bv(a, 1), _to_bv(b, 1)  # signed i1: true is -1, which the 1-bit view gives
        return f(a, b)

    return run


_INT_BINARY: dict[str, Callable[..., z3.ExprRef]] = {
    "arith.addi": _i1_as_signed(lambda a, b: a + b), "arith.subi": _i1_as_signed(lambda a, b: a - b),
    "arith.muli": _i1_as_signed(lambda a, b: a * b), "arith.divsi": _i1_as_signed(_divsi),
    "arith.remsi": _i1_as_signed(_remsi), "arith.divui": _i1_as_signed(_divui), "arith.remui": _i1_as_signed(_remui),
    "arith.floordivsi": _i1_as_signed(_floordivsi),
    "arith.ceildivsi": _i1_as_signed(lambda a, b: -_divsi(-a, b)),
    "arith.ceildivui": _i1_as_signed(lambda a, b: _divui(a + b - 1, b)),
    "arith.minsi": _i1_as_signed(lambda a, b: z3.If(a < b, a, b)),
    "arith.maxsi": _i1_as_signed(lambda a, b: z3.If(a > b, a, b)),
    "arith.minui": _i1_as_signed(lambda a, b: z3.If(z3.ULT(a, b), a, b)),
    "arith.maxui": _i1_as_signed(lambda a, b: z3.If(z3.UGT(a, b), a, b)),
    "arith.andi": _bool_or_bv(z3.And, lambda a, b: a & b), "arith.ori": _bool_or_bv(z3.Or, lambda a, b: a | b),
    "arith.xori": _bool_or_bv(z3.Xor, lambda a, b: a ^ b),
    "arith.shli": _shift("shli"), "arith.shrui": _shift("shrui"), "arith.shrsi": _shift("shrsi"),
    "tt.mulhiui": _mulhiui,
}
_ELEMENTWISE_INT = frozenset({*_INT_BINARY, "arith.cmpi", "math.absi"})


def _int_semantics(op: Operation) -> Callable[..., z3.ExprRef]:
    if op.name == "arith.cmpi":
        return _cmpi_fn(op.MNEMONICS[op.properties["predicate"].value.data])  # type: ignore[attr-defined]
    if op.name == "math.absi":
        return lambda a: z3.If(a < 0, -a, a)
    for o in op.operands:
        if isinstance(element_type(o.type), PointerType):
            raise Unsupported(op, "integer arithmetic on pointers")
    return _INT_BINARY[op.name]


# ---------------------------------------------------------------------------------------------------
# floats
# ---------------------------------------------------------------------------------------------------
_FLOAT_OPS = frozenset({
    "arith.addf", "arith.subf", "arith.mulf", "arith.divf", "arith.remf", "arith.maximumf", "arith.minimumf",
    "arith.maxnumf", "arith.minnumf", "arith.negf", "arith.cmpf", "math.fma", "math.powf", "math.atan2",
    "math.copysign", "math.fpowi", "tt.precise_sqrt", "tt.precise_divf", "tt.clampf", "tt.extern_elementwise",
    *(f"math.{n}" for n in ("exp", "exp2", "log", "log2", "log10", "log1p", "expm1", "sqrt", "rsqrt", "sin", "cos",
                            "tan", "tanh", "sinh", "cosh", "asin", "acos", "atan", "asinh", "acosh", "atanh", "erf",
                            "floor", "ceil", "trunc", "round", "roundeven", "absf", "cbrt")),
})
_CASTS = frozenset({
    "arith.extsi", "arith.extui", "arith.trunci", "arith.index_cast", "arith.index_castui", "arith.extf",
    "arith.truncf", "arith.sitofp", "arith.uitofp", "arith.fptosi", "arith.fptoui", "arith.bitcast", "tt.bitcast",
    "tt.fp_to_fp",
})


def _exact_float(name: str, pred: str | None, out: z3.SortRef) -> Callable[..., Elem] | None:
    """IEEE semantics of `name` where the interpreter's and the GPU's meaning is the correctly rounded one."""
    if name == "arith.addf":
        return lambda a, b: z3.fpAdd(_RNE, a, b)
    if name == "arith.subf":
        return lambda a, b: z3.fpSub(_RNE, a, b)
    if name == "arith.mulf":
        return lambda a, b: z3.fpMul(_RNE, a, b)
    if name == "arith.negf":
        return lambda a: z3.fpNeg(a)
    if name == "math.absf":
        return lambda a: z3.fpAbs(a)
    if name == "math.fma":
        return lambda a, b, c: z3.fpFMA(_RNE, a, b, c)
    if name in ("arith.extf", "arith.truncf"):
        return lambda a: z3.fpFPToFP(_RNE, a, out)
    if name == "arith.sitofp":
        return lambda a: z3.fpSignedToFP(_RNE, a, out)
    if name == "arith.uitofp":
        return lambda a: z3.fpUnsignedToFP(_RNE, a, out)
    if name == "arith.cmpf" and pred is not None:
        ordered: dict[str, Callable[[Any, Any], z3.BoolRef]] = {
            "eq": z3.fpEQ, "gt": z3.fpGT, "ge": z3.fpGEQ, "lt": z3.fpLT, "le": z3.fpLEQ,
            "ne": lambda a, b: z3.Not(z3.fpEQ(a, b))}
        if pred == "false":
            return lambda a, b: z3.BoolVal(False)
        if pred == "true":
            return lambda a, b: z3.BoolVal(True)
        if pred == "ord":
            return lambda a, b: z3.Not(z3.Or(z3.fpIsNaN(a), z3.fpIsNaN(b)))
        if pred == "uno":
            return lambda a, b: z3.Or(z3.fpIsNaN(a), z3.fpIsNaN(b))
        f = ordered[pred[1:]]
        if pred.startswith("o"):
            return lambda a, b: z3.And(f(a, b), z3.Not(z3.fpIsNaN(a)), z3.Not(z3.fpIsNaN(b)))
        return lambda a, b: z3.Or(f(a, b), z3.fpIsNaN(a), z3.fpIsNaN(b))
    return None


_REFUSED: dict[str, str] = {
    "tt.atomic_rmw": "atomics (programs communicate through memory)",
    "tt.atomic_cas": "atomics (programs communicate through memory)",
    "tt.histogram": "histograms", "scf.while": "loops with a data-dependent trip count (scf.while)",
    "cf.br": "control flow between blocks", "cf.cond_br": "control flow between blocks",
    "tt.make_tensor_ptr": "block pointers", "tt.advance": "block pointers",
    "tt.assert": "device assertions", "tt.print": "device prints",
    "tt.elementwise_inline_asm": "inline assembly",
    "ttg.async_copy_global_to_local": "asynchronous copies into shared memory",
    "ttg.async_commit_group": "asynchronous copies into shared memory",
    "ttg.async_wait": "asynchronous copies into shared memory",
    "ttg.memdesc_index": "multi-buffered shared memory", "ttg.local_store": "shared memory written after allocation",
    "ttg.local_dealloc": "shared memory (deallocation)", "tt.int_to_ptr": "integers converted to pointers",
    "tt.ptr_to_int": "pointers converted to integers",
}

_HANDLERS: dict[str, Callable[..., list[Any]]] = {
    "arith.constant": Program.constant, "ub.poison": Program.poison, "arith.select": Program.select,
    "tt.make_range": Program.make_range, "tt.splat": Program.splat, "tt.broadcast": Program.broadcast,
    "tt.expand_dims": Program.expand_dims, "tt.reshape": Program.reshape, "tt.trans": Program.trans,
    "tt.join": Program.join, "tt.split": Program.split, "tt.cat": Program.cat,
    "tt.get_program_id": Program.program_id, "tt.get_num_programs": Program.num_programs,
    "tt.addptr": Program.addptr, "tt.load": Program.load, "tt.store": Program.store,
    "tt.reduce": Program.reduce, "tt.scan": Program.scan, "tt.dot": Program.dot, "ttng.warp_group_dot": Program.dot,
    "tt.call": Program.call, "scf.for": Program.scf_for, "scf.if": Program.scf_if,
    "ttg.convert_layout": Program.identity, "amdg.in_thread_transpose": Program.identity,
    "ttng.warp_group_dot_wait": Program.identity,
    "ttg.local_alloc": Program.local_alloc, "ttg.local_load": Program.local_load,
    "ttng.fence_async_shared": Program.no_op, "gpu.barrier": Program.no_op, "rocdl.s.setprio": Program.no_op,
    "rocdl.sched.barrier": Program.no_op, "rocdl.s.barrier": Program.no_op, "llvm.intr.assume": Program.no_op,
}
