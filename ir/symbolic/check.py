"""The claims that make a candidate program equal to the original one, and their solving with z3.

The two programs' memory operations are paired per buffer and kind, in program order (operations on
distinct buffers commute: pointer arguments are distinct buffers). For each pair, with a free lane
vector inside the shape, a free program id inside a free grid, and free scalar arguments (within
their type, their `tt.divisibility` and, when a launch record is given, its values):

- *same lanes*: the original accesses the lane exactly when the candidate does (loop and `scf.if`
  conditions and the mask);
- *same address*: where it does, at the same byte offset of the same buffer;
- *same value*: a store writes the same value expression.

Since every access of the candidate is then one of the original's, the candidate stays in bounds
wherever the original does. A loop run by induction adds: the same induction values, equal initial
carried values when it runs at all, and equal yielded values from equal carried values (the step).

Each claim is one query (`Not(claim)` under the assumptions) with a time limit. `unsat` proves it;
`sat` gives a model, which is a counterexample only for the abstraction (uninterpreted floats, free
carried values), so it is confirmed by replaying a concrete launch built from it in the interpreter
(`replay.py`); `unknown` is a timeout.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import z3
from xdsl.ir import Operation

from kstrata.ir.dialects.tt import PointerType

from .program import Effect, Elem, LoopInstance, Program, Ptr, SharedSymbols, int_width, ptr_equal

#: Grid limits of CUDA (and HIP): x up to 2**31 - 1 programs, y and z up to 65535.
GRID_LIMITS = (2**31 - 1, 65535, 65535)
#: Bounds for a second, "small" model of a failed claim: concrete launches built from it stay cheap.
SMALL_SCALAR = 2048
SMALL_POSITIVE = 600
#: Models asked for per refuted claim (each one a different launch for the replay).
MODELS = 3
SMALL_GRID = 4


class Structural(Exception):
    """The programs cannot be paired (different memory operations, loops or signatures)."""


@dataclass
class Obligation:
    """One claim: `claim` must hold for all values of its free symbols under `assumptions`."""

    text: str
    claim: z3.BoolRef
    lanes: tuple[z3.BitVecRef, ...]
    bounds: list[z3.BoolRef]
    witnesses: dict[str, Any]
    op: Operation
    buf: int | None = None


@dataclass
class Outcome:
    """What the solver said about one obligation."""

    obligation: Obligation
    status: str  # "proved", "failed", "timeout"
    seconds: float
    model: z3.ModelRef | None = None
    small: bool = False
    models: list[z3.ModelRef] = field(default_factory=list)
    #: Whether the models are of the abstraction (fold operands as free arrays).
    abstract: bool = False


@dataclass
class Pairing:
    obligations: list[Obligation] = field(default_factory=list)


def assumptions(program: Program, launch: Any | None) -> list[z3.BoolRef]:
    """What every launch satisfies: program ids inside the grid, the signature's divisibility, the launch."""
    out: list[z3.BoolRef] = program.shared.distinct_literals()
    for axis in range(3):
        pid, num = SharedSymbols.pid(axis), SharedSymbols.num(axis)
        out += [z3.UGE(num, 1), z3.ULE(num, GRID_LIMITS[axis]), z3.ULT(pid, num)]
        if launch is not None:
            out.append(num == launch.grid[axis])
    for p in program.params:
        if isinstance(p.type, PointerType):
            continue
        w = int_width(p.type)
        arg = program.shared.arg(p.index, p.type)
        if w is not None and w > 1 and p.divisibility:
            out.append(z3.SRem(arg, p.divisibility) == 0)
        if launch is not None:
            value = launch.args[p.index].value
            if w == 1:
                out.append(arg == z3.BoolVal(bool(value)))
            elif w is not None:
                out.append(arg == z3.BitVecVal(int(value), w))
            elif isinstance(value, float) and program.exact:
                out.append(arg == z3.FPVal(value, arg.sort()))
    return out


def small_bounds(program: Program) -> list[list[z3.BoolRef]]:
    """Extra assumptions for replayable models, tried in order: small positive scalars and a small grid
    (sizes, strides: the usual domain), then small scalars of either sign."""
    tiers: list[list[z3.BoolRef]] = []
    for lo in (1, -SMALL_SCALAR):
        out: list[z3.BoolRef] = [z3.ULE(SharedSymbols.num(axis), SMALL_GRID) for axis in range(3)]
        for p in program.params:
            w = int_width(p.type)
            if w is not None and w > 1 and not isinstance(p.type, PointerType):
                arg = program.shared.arg(p.index, p.type)
                out += [arg >= lo, arg <= (SMALL_POSITIVE if lo > 0 else SMALL_SCALAR)]
        tiers.append(out)
    return tiers


def launch_symbols(program: Program) -> list[z3.ExprRef]:
    """The integer symbols a concrete launch fixes: scalar arguments and program ids."""
    out: list[z3.ExprRef] = [SharedSymbols.pid(a) for a in range(3)]
    for p in program.params:
        w = int_width(p.type)
        if w is not None and w > 1 and not isinstance(p.type, PointerType):
            out.append(program.shared.arg(p.index, p.type))
    return out


def _lanes(prefix: str, shape: tuple[int, ...]) -> tuple[tuple[z3.BitVecRef, ...], list[z3.BoolRef]]:
    lanes = tuple(z3.BitVec(f"{prefix}.lane{k}", 32) for k in range(len(shape)))
    return lanes, [z3.ULT(v, n) for v, n in zip(lanes, shape, strict=True)]


def _value_eq(a: Elem, b: Elem) -> z3.BoolRef:
    return ptr_equal(a, b)


def pair(original: Program, candidate: Program, names: Callable[[int], str]) -> Pairing:
    """The obligations that make `candidate` equal to `original`; `Structural` when they do not pair up."""
    if len(original.params) != len(candidate.params) or any(
            str(a.type) != str(b.type) for a, b in zip(original.params, candidate.params, strict=True)):
        raise Structural("the kernels' parameters differ")
    out = Pairing()
    # loops by instance number
    if len(original.loops) != len(candidate.loops):
        raise Structural(f"the original runs {len(original.loops)} loop(s) with symbolic bounds, the candidate "
                         f"{len(candidate.loops)}")
    for lo, lc in zip(original.loops, candidate.loops, strict=True):
        out.obligations += _loop_obligations(lo, lc)
    groups_o: dict[tuple[str, int], list[Effect]] = defaultdict(list)
    groups_c: dict[tuple[str, int], list[Effect]] = defaultdict(list)
    for e in original.effects:
        groups_o[(e.kind, e.buf)].append(e)
    for e in candidate.effects:
        groups_c[(e.kind, e.buf)].append(e)
    for key in sorted(set(groups_o) | set(groups_c)):
        eo, ec = groups_o.get(key, []), groups_c.get(key, [])
        kind, buf = key
        if len(eo) != len(ec):
            raise Structural(f"the original has {len(eo)} {kind}(s) of {names(buf)}, the candidate {len(ec)}")
        for n, (a, b) in enumerate(zip(eo, ec, strict=True)):
            if a.shape != b.shape or a.dtype != b.dtype:
                raise Structural(f"{kind} #{n + 1} of {names(buf)}: shape or type differ "
                                 f"({a.shape} {a.dtype} vs {b.shape} {b.dtype})")
            out.obligations += _effect_obligations(a, b, f"{kind} #{n + 1} of {names(buf)}")
    out.obligations.sort(key=lambda o: _order(o, original))
    return out


def _order(o: Obligation, original: Program) -> int:
    for e in original.effects:
        if e.op is o.op:
            return e.order
    return -1


def _effect_obligations(a: Effect, b: Effect, what: str) -> list[Obligation]:
    lanes, bounds = _lanes(f"e{a.order}", a.shape)
    on_a = z3.And(a.guard, a.mask(lanes))
    on_b = z3.And(b.guard, b.mask(lanes))
    off_a, off_b = a.offset(lanes), b.offset(lanes)
    witness: dict[str, Any] = {"accessed (original)": on_a, "accessed (candidate)": on_b,
                               "byte offset (original)": off_a, "byte offset (candidate)": off_b}
    obligations = [
        Obligation(f"{what}: the same lanes are accessed", on_a == on_b, lanes, bounds, witness, a.op, a.buf),
        Obligation(f"{what}: at the same address", z3.Implies(on_a, off_a == off_b), lanes, bounds, witness, a.op,
                   a.buf)]
    if a.kind == "store" and a.value is not None and b.value is not None:
        va, vb = a.value(lanes), b.value(lanes)
        w = dict(witness, **{"stored value (original)": va, "stored value (candidate)": vb})
        obligations.append(Obligation(f"{what}: the same value is stored", z3.Implies(on_a, _value_eq(va, vb)),
                                      lanes, bounds, w, a.op, a.buf))
    return obligations


def _loop_obligations(lo: LoopInstance, lc: LoopInstance) -> list[Obligation]:
    where = f"loop #{lo.number + 1} (scf.for with symbolic bounds)"
    if lo.signature != lc.signature or lo.iv.size() != lc.iv.size() or len(lo.inits) != len(lc.inits):
        raise Structural(f"{where}: the loops carry different values")
    iv = lo.iv  # the same symbol in both programs (named by instance and signature)
    runs_o = z3.And(lo.guard, lo.member(iv))
    runs_c = z3.And(lc.guard, lc.member(iv))
    out = [Obligation(f"{where}: the same induction values", runs_o == runs_c, (), [],
                      {"iteration (original)": runs_o, "iteration (candidate)": runs_c, "induction value": iv}, lo.op)]
    for j, (io, ic) in enumerate(zip(lo.inits, lc.inits, strict=True)):
        lanes, bounds = _lanes(f"loop{lo.number}.init{j}", io.shape)
        a, b = io.at(lanes), ic.at(lanes)
        out.append(Obligation(f"{where}: carried value #{j + 1} starts equal", z3.Implies(lo.nonempty, _value_eq(a, b)),
                              lanes, bounds, {"initial value (original)": _plain(a), "initial value (candidate)": _plain(b)},
                              lo.op))
    for j, (yo, yc) in enumerate(zip(lo.yields, lc.yields, strict=True)):
        lanes, bounds = _lanes(f"loop{lo.number}.yield{j}", yo.shape)
        a, b = yo.at(lanes), yc.at(lanes)
        out.append(Obligation(f"{where}: carried value #{j + 1} stays equal after an iteration",
                              z3.Implies(runs_o, _value_eq(a, b)), lanes, bounds,
                              {"yielded (original)": _plain(a), "yielded (candidate)": _plain(b), "induction value": iv},
                              lo.op))
    return out


def _plain(x: Elem) -> Any:
    return x.off if isinstance(x, Ptr) else x


def abstract_arrays(term: z3.ExprRef) -> z3.ExprRef:
    """`term` with every array lambda (the operand of a fold, a scan or a dot) replaced by a free array.

    Syntactically equal lambdas are one z3 term, hence one free array. A claim that holds for all
    values of the free arrays holds for the lambdas they replace, so a proof of the abstraction is a
    proof; a refutation may be spurious (two different lambdas can be equal) and is confirmed or not
    by the replay, or retried without the abstraction.
    """
    found: dict[int, z3.ExprRef] = {}
    seen: set[int] = set()
    stack = [term]
    while stack:
        t = stack.pop()
        i = t.get_id()
        if i in seen:
            continue
        seen.add(i)
        if z3.is_quantifier(t):
            if t.is_lambda():
                found[i] = t
            continue
        stack.extend(t.children())
    if not found:
        return term
    pairs = [(lam, z3.Const(f"array{i}", lam.sort())) for i, lam in found.items()]
    return z3.substitute(term, *pairs)


def solve(obligation: Obligation, assumed: list[z3.BoolRef], timeout_s: float,
          small: list[list[z3.BoolRef]] | None = None, *, abstract: bool = True,
          launch: list[z3.ExprRef] | None = None, falsify: bool = True) -> Outcome:
    """Try to refute `obligation`. A refutation comes with up to `MODELS` models for the replay, searched
    within the `small` bounds first, each with other values of the `launch` symbols than the ones before.
    When the unbounded query times out, the small bounds and random fixed launches are tried too (a
    model found there is as good a candidate for the replay; only a proof needs the unbounded query).

    With `abstract`, fold operands are free arrays (`abstract_arrays`): faster, and sound for proofs.
    """
    start = time.perf_counter()
    claim = z3.simplify(obligation.claim)
    if z3.is_true(claim):
        return Outcome(obligation, "proved", time.perf_counter() - start)
    if abstract:
        claim = abstract_arrays(claim)
    solver = z3.Solver()
    solver.set("timeout", max(1, int(timeout_s * 1000)))
    solver.add(*assumed, *obligation.bounds, z3.Not(claim))
    r = solver.check()
    if r == z3.unsat:
        return Outcome(obligation, "proved", time.perf_counter() - start)
    models: list[z3.ModelRef] = []
    symbols = list(launch or []) + list(obligation.lanes)
    solver.set("timeout", max(1, int(timeout_s * 250)))
    deadline = start + 2 * timeout_s
    for bounds in small or []:
        solver.push()
        solver.add(*bounds)
        while len(models) < MODELS and time.perf_counter() < deadline and solver.check() == z3.sat:
            m = solver.model()
            models.append(m)
            fixed = [v == m.eval(v, model_completion=True) for v in symbols]
            if not fixed:
                break
            solver.add(z3.Not(z3.And(*fixed)))
        solver.pop()
        if len(models) >= MODELS:
            break
    if r == z3.sat and not models:
        models.append(solver.model() if solver.check() == z3.sat else None)
        models = [m for m in models if m is not None]
    if r == z3.unknown and not models and falsify:
        models = _random_launches(solver, symbols, obligation, deadline + timeout_s)
    if not models:
        return Outcome(obligation, "timeout", time.perf_counter() - start)
    return Outcome(obligation, "failed", time.perf_counter() - start, models[0], True, models, abstract)


def _random_launches(solver: z3.Solver, symbols: list[z3.ExprRef], obligation: Obligation, deadline: float,
                     tries: int = 6) -> list[z3.ModelRef]:
    """Models with the launch symbols fixed to random small values (cheap queries: no symbolic products)."""
    import random

    rng = random.Random(0)
    lanes = {v.get_id(): n for v, n in zip(obligation.lanes, _shape_of_bounds(obligation), strict=False)}
    found: list[z3.ModelRef] = []
    for _ in range(tries):
        if time.perf_counter() > deadline:
            break
        solver.push()
        for v in symbols:
            n = lanes.get(v.get_id())
            value = rng.randrange(n) if n else rng.randrange(0, 4) if str(v).startswith("pid") else rng.randrange(1, 600)
            solver.add(v == value)
        if solver.check() == z3.sat:
            found.append(solver.model())
        solver.pop()
        if len(found) >= 2:
            break
    return found


def _shape_of_bounds(obligation: Obligation) -> list[int]:
    out = []
    for b in obligation.bounds:
        out.append(int(b.arg(1).as_long()))  # ULT(lane, n)
    return out
