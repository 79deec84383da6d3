"""Translation validation of TTIR/TTGIR rewrites without launches: prove equal for all inputs, or a counterexample.

    result = check(original_text, candidate_text, "ttir", timeout_s=5)
    result.status        # "proved" | "counterexample" | "undecided"
    result.reason        # why undecided (the unsupported op, a timeout, an unconfirmed model), or what differs
    result.counterexample  # arguments, grid, program id, lane, the claim and the differing address/value

One program of each kernel is executed symbolically (`program.py`: program ids, scalar arguments and
the memory free, tensors as functions of a symbolic lane), the two are paired and the claims of
`check.py` are solved with z3, one query per claim with `timeout_s`. Floats are first uninterpreted
functions; claims that fail then are retried with exact IEEE semantics for the operations that have
them. A failed claim gives a model, which is turned into a concrete launch and replayed in the
interpreter (`replay.py`): only a confirmed difference is a `counterexample`. Anything else is
`undecided` with its reason — the checker never guesses.

Assumptions, stated: distinct pointer arguments are distinct buffers (a launch record that shows
storage is not recorded by launch records, so they cannot show aliasing), programs do not communicate through memory (atomics are
refused), and a program reads no buffer after writing it (refused otherwise).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import z3

from kstrata.ir.dialects.tt import PointerType
from kstrata.ir.errors import KstrataError
from kstrata.ir.interp.state import op_location
from kstrata.ir.interp.types import dtype_of

from .check import (
    Obligation,
    Outcome,
    Structural,
    abstract_arrays,
    assumptions,
    launch_symbols,
    pair,
    small_bounds,
    solve,
)
from .program import UNROLL_LIMIT, Program, SharedSymbols, Unsupported, int_width, is_float_type
from .replay import ReplayOutcome, concrete_launch, replay

STATUSES = ("proved", "counterexample", "undecided")
#: Concrete launches replayed in the interpreter per check, at most (each runs both kernels, twice).
REPLAY_BUDGET = 6


@dataclass
class Counterexample:
    """A launch on which the claim `claim` fails: the solver's values, and the interpreter's confirmation."""

    claim: str
    location: str | None
    args: dict[str, int | float | bool]
    grid: tuple[int, int, int]
    program: tuple[int, int, int]
    lane: tuple[int, ...]
    #: What differs, from the model: byte offsets, values, whether each side accesses the lane.
    values: dict[str, str]
    param_names: list[str]
    #: Memory contents the model fixed: (buffer index, dtype) -> [(byte offset, bits)].
    memory: dict[tuple[int, str], list[tuple[int, int]]] = field(default_factory=dict)
    confirmed: bool | None = None
    replay: str | None = None

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["memory"] = {f"{k[0]}:{k[1]}": v for k, v in self.memory.items()}
        return d

    def summary(self) -> str:
        args = ", ".join(f"{k}={v}" for k, v in self.args.items())
        vals = "; ".join(f"{k} {v}" for k, v in self.values.items())
        return (f"{self.claim} fails for {args or 'any arguments'}, program {self.program}, lane {self.lane}"
                f" ({vals})")


@dataclass
class SymbolicResult:
    status: str
    reason: str
    counterexample: Counterexample | None = None
    seconds: float = 0.0
    #: Seconds per solver query (every claim of every tier tried).
    query_seconds: list[float] = field(default_factory=list)
    claims: int = 0
    #: "uninterpreted" or "exact": the float semantics under which the result was reached.
    floats: str = "uninterpreted"

    def to_json(self) -> dict[str, Any]:
        return {"status": self.status, "reason": self.reason, "seconds": round(self.seconds, 4),
                "claims": self.claims, "floats": self.floats,
                "query_seconds": [round(s, 4) for s in self.query_seconds],
                "counterexample": self.counterexample.to_json() if self.counterexample else None}


class SymbolicInputError(KstrataError):
    """A module the symbolic checker cannot read."""


def _parse(text: str, what: str) -> Any:
    from kstrata.ir.triton_ir import parse_triton

    try:
        return parse_triton(text, what)
    except KstrataError as exc:
        raise SymbolicInputError(f"{what}: {exc}") from None


def _entry(module: Any) -> Any:
    funcs = [op for op in module.body.ops if op.name == "tt.func"]
    public = [f for f in funcs if "public" in str(getattr(f, "sym_visibility", "") or "")]
    chosen = public or funcs
    if not chosen:
        raise Unsupported(None, "the module has no tt.func")
    return chosen[0]


def _has_floats(func: Any) -> bool:
    for op in func.walk():
        for r in op.results:
            t = getattr(r.type, "element_type", r.type)
            if is_float_type(t):
                return True
    return False


def check(original_text: str, candidate_text: str, level: str, *, launch: Any | None = None,
          timeout_s: float = 5.0, confirm: bool = True, budget_s: float | None = None) -> SymbolicResult:
    """Whether `candidate_text` computes what `original_text` computes, for every launch (see the module doc).

    `level` is `ttir` or `ttgir`; `launch` (a `LaunchRecord`) fixes the grid and scalar arguments;
    `timeout_s` bounds each solver query. With `confirm=False` a failed claim is reported as a
    counterexample without the interpreter's replay (its `confirmed` is then None). `budget_s` bounds
    the whole check (default: 6 query limits); when it runs out the result is `undecided`.
    """
    budget = budget_s if budget_s is not None else 6 * timeout_s
    start = time.perf_counter()
    if level not in ("ttir", "ttgir"):
        return SymbolicResult("undecided", f"the symbolic checker reads TTIR or TTGIR, not {level}")
    parsed_o = _parse(original_text, "original")
    parsed_c = _parse(candidate_text, "candidate")
    func_o, func_c = _entry(parsed_o.module), _entry(parsed_c.module)
    block = func_o.regions[0].blocks.first
    param_names = [parsed_o.value_names.get(a, f"arg{i}") for i, a in enumerate(block.args)]
    result = SymbolicResult("undecided", "")
    tiers = ["uninterpreted"] + (["exact"] if _has_floats(func_o) or _has_floats(func_c) else [])
    unconfirmed: list[str] = []
    timeouts: list[Outcome] = []
    replays = 0
    #: Claims proved with uninterpreted floats hold for every meaning of the float operations: the
    #: exact tier only re-solves the others (claims come in the same order from both tiers).
    proved: set[int] = set()
    for tier in tiers:
        exact = tier == "exact"
        shared = SharedSymbols(exact=exact)
        shared.combiners.timeout_ms = max(1, int(timeout_s * 1000))
        po = Program(func_o, shared, exact=exact)
        pc = Program(func_c, shared, exact=exact)
        try:
            po.run()
            pc.run()
            _check_read_after_write(po)
            _check_read_after_write(pc)
            pairing = pair(po, pc, lambda b: param_names[b] if b < len(param_names) else f"arg{b}")
        except Unsupported as exc:
            return _done(result, "undecided", f"unsupported: {exc}", start)
        except Structural as exc:
            return _done(result, "undecided", f"the programs do not pair up: {exc}", start)
        except z3.Z3Exception as exc:
            return _done(result, "undecided", f"the solver refused a term: {exc}", start)
        assumed = assumptions(po, launch)
        # Models for the replay are searched in the first tier; the exact tier is there for proofs.
        small = small_bounds(po) if launch is None and not exact else None
        result.claims = len(pairing.obligations)
        result.floats = tier
        timeouts = []
        refuted = False
        symbols = launch_symbols(po)
        for k, ob in enumerate(pairing.obligations):
            if k in proved:
                continue
            if time.perf_counter() - start > budget:
                return _done(result, "undecided", f"the time budget of {budget:g} s ran out with claims unproved"
                             + (f" ({unconfirmed[-1]})" if unconfirmed else ""), start)
            for abstract in (True, False) if not exact else (True,):  # lambdas and exact floats: too slow
                outcome = solve(ob, assumed, timeout_s, small, abstract=abstract, launch=symbols, falsify=not exact)
                result.query_seconds.append(outcome.seconds)
                if outcome.status == "proved":
                    proved.add(k)
                    break
                if outcome.status == "timeout":
                    if abstract and not exact and _has_arrays(ob.claim):
                        continue
                    timeouts.append(outcome)
                    break
                details: list[str] = []
                for model in outcome.models[:max(0, REPLAY_BUDGET - replays)]:
                    if time.perf_counter() - start > budget:
                        break
                    replays += 1
                    cex = _counterexample(outcome, model, po, param_names)
                    if not confirm:
                        result.counterexample = cex
                        return _done(result, "counterexample", cex.summary(), start)
                    rep = replay(parsed_o.module, parsed_c.module, cex, seeds=2, deadline=start + budget)
                    cex.confirmed, cex.replay = rep.confirmed, rep.detail
                    if rep.confirmed:
                        result.counterexample = cex
                        return _done(result, "counterexample",
                                     f"{cex.summary()}; the interpreter confirms: {rep.detail}", start)
                    details.append(rep.detail)
                if not abstract or exact or not _has_arrays(ob.claim):
                    unconfirmed.append(f"{ob.text} [{tier} floats] ({len(details)} launch(es) replayed: "
                                       f"{details[0] if details else 'none'})")
                    refuted = True
                    break
            if refuted:
                break  # the next tier, with exact floats, re-solves what is not proved
        if not refuted and not timeouts:
            return _done(result, "proved", f"{len(pairing.obligations)} claims proved"
                         + (" (some with exact IEEE floats)" if exact else ""), start)
        if not refuted:
            break  # only timeouts: exact floats are harder still
    if unconfirmed:
        return _done(result, "undecided", "the solver refuted a claim under the abstraction but the interpreter did "
                     "not confirm a difference: " + "; ".join(unconfirmed[-1:]), start)
    return _done(result, "undecided", "timeout after "
                 f"{timeout_s:g} s on: " + "; ".join(o.obligation.text for o in timeouts[:3]), start)


def _has_arrays(term: Any) -> bool:
    return abstract_arrays(term) is not term


def _done(result: SymbolicResult, status: str, reason: str, start: float) -> SymbolicResult:
    result.status = status
    result.reason = reason
    result.seconds = time.perf_counter() - start
    return result


def _check_read_after_write(program: Program) -> None:
    stores: dict[int, list[Any]] = {}
    for e in program.effects:
        if e.kind == "store":
            stores.setdefault(e.buf, []).append(e)
    for e in program.effects:
        if e.kind != "load":
            continue
        for s in stores.get(e.buf, []):
            if s.order < e.order or set(s.loops) & set(e.loops):
                raise Unsupported(e.op, "the program reads a buffer after (or in a loop with) a store to it")


def _model_value(model: z3.ModelRef, term: Any) -> str:
    v = model.eval(term, model_completion=True)
    if z3.is_fp_value(v):
        return _fp_text(v)
    if z3.is_bv_value(v):
        return str(v.as_signed_long())
    if z3.is_true(v) or z3.is_false(v):
        return str(v)
    if z3.is_app(v) and v.num_args() == 0:
        return str(v).replace("!val!", "#")  # an element of an uninterpreted float sort
    return "(a term of the abstraction)"


def _fp_text(v: Any) -> str:
    if v.isNaN():
        return "nan"
    if v.isInf():
        return "-inf" if v.isNegative() else "inf"
    if v.isZero():
        return "-0.0" if v.isNegative() else "0.0"
    try:
        return repr(float(v.as_decimal(17).rstrip("?")))
    except (ValueError, AttributeError):
        return str(v)


def _fp_bits(model: z3.ModelRef, v: Any) -> int:
    bits = model.eval(z3.fpToIEEEBV(v), model_completion=True)
    return int(bits.as_long())


def _counterexample(outcome: Outcome, model: z3.ModelRef, program: Program, names: list[str]) -> Counterexample:
    ob: Obligation = outcome.obligation
    args: dict[str, int | float | bool] = {}
    for p in program.params:
        if isinstance(p.type, PointerType):
            continue
        w = int_width(p.type)
        sym = program.shared.arg(p.index, p.type)
        v = model.eval(sym, model_completion=True)
        name = names[p.index]
        if w == 1:
            args[name] = bool(z3.is_true(v))
        elif w is not None:
            args[name] = int(v.as_signed_long())
        elif not z3.is_fp(v):
            args[name] = 0.5  # free in the abstraction: any value shows the difference
        else:
            dt = dtype_of(p.type)
            bits = np.array([_fp_bits(model, v)], dtype=np.uint64).astype(np.dtype(f"u{dt.itemsize}"))
            args[name] = float(bits.view(dt)[0])
    pid = tuple(int(model.eval(SharedSymbols.pid(a), model_completion=True).as_long()) for a in range(3))
    grid = tuple(int(model.eval(SharedSymbols.num(a), model_completion=True).as_long()) if program.uses_num_programs
                 else 1 for a in range(3))
    lane = tuple(int(model.eval(v, model_completion=True).as_long()) for v in ob.lanes)
    values = {k: _model_value(model, abstract_arrays(t) if outcome.abstract else t) for k, t in ob.witnesses.items()}
    memory: dict[tuple[int, str], list[tuple[int, int]]] = {}
    for d in model.decls():
        name = d.name()
        if not name.startswith("mem") or d.arity() != 1:
            continue
        buf_text, _, dtype = name[3:].partition(":")
        interp = model[d]
        entries: list[tuple[int, int]] = []
        for entry in interp.as_list()[:-1]:
            offset = model.eval(entry[0], model_completion=True)
            value = entry[1]
            if not (z3.is_fp(value) or z3.is_bv(value)):
                continue  # a value of an uninterpreted float sort: no bits to write
            pattern = _fp_bits(model, value) if z3.is_fp(value) else \
                int(model.eval(value, model_completion=True).as_long())
            entries.append((int(offset.as_signed_long()), pattern))
        memory[(int(buf_text), dtype)] = entries
    return Counterexample(ob.text, op_location(ob.op), args, (grid[0], grid[1], grid[2]), (pid[0], pid[1], pid[2]), lane,
                          values, names, memory)


__all__ = ["STATUSES", "UNROLL_LIMIT", "Counterexample", "ReplayOutcome", "SymbolicInputError", "SymbolicResult",
           "check", "concrete_launch", "replay"]
