"""The symbolic checker (`kstrata.ir.symbolic`) as `verify`'s symbolic evidence for TTIR/TTGIR candidates.

`enable()` registers `symbolic_checker` with `backends.verify`; `verify(..., symbolic=True)` then asks
it for each differing TTIR/TTGIR level when the verdict would otherwise be `unproven`. A proof is a
passing `symbolic` check (evidence: `equivalent`), a counterexample the interpreter confirmed is a
failing one (`different`), `undecided` is a skipped one with its reason (the verdict stays `unproven`).
"""

from __future__ import annotations

from typing import Any

from kstrata.ir.bundle import KernelBundle

from .verify import Check, register_symbolic_checker

#: Seconds per solver query (verify's `timeout` is per dynamic run, far longer than a query needs).
QUERY_SECONDS = 10.0


def symbolic_checker(original: KernelBundle, candidate: KernelBundle, level: str, launch: Any | None,
                     timeout: float) -> Check | None:
    """`kstrata.ir.symbolic.check` on one level of the pair, as a `Check` named `symbolic`."""
    from kstrata.ir.errors import KstrataError
    from kstrata.ir.symbolic import check

    if level not in ("ttir", "ttgir") or level not in original.levels or level not in candidate.levels:
        return None
    try:
        result = check(original.text(level), candidate.text(level), level, launch=launch,
                       timeout_s=min(QUERY_SECONDS, timeout))
    except KstrataError as exc:
        return Check("symbolic", level, "skipped", f"undecided: {exc}")
    detail = f"{result.reason} ({result.seconds:.1f} s)"
    if result.status == "proved":
        return Check("symbolic", level, "pass", f"equivalent for every launch: {detail}")
    if result.status == "counterexample" and result.counterexample is not None and result.counterexample.confirmed:
        return Check("symbolic", level, "fail", f"counterexample confirmed by the interpreter: {detail}")
    return Check("symbolic", level, "skipped", f"undecided: {detail}")


def enable() -> None:
    """Register the symbolic checker with `verify` (idempotent)."""
    register_symbolic_checker(symbolic_checker)


def symbolic_checks(original: KernelBundle, candidate: KernelBundle, tolerance: Any | None = None,
                    timeout: float = QUERY_SECONDS) -> list[Check]:
    """The symbolic checks of every TTIR/TTGIR level in which `candidate` differs from `original`, for a
    caller without `verify`'s report (the engine's check of a kernel candidate without a launch record,
    so that run-passes and the optimizer gate IR candidates before any GPU time). A declared tolerance
    (a `Tolerance` or its spelling) that is not exact skips them: the claims are bit-exact."""
    from kstrata.ir.tolerance import Tolerance

    tol = Tolerance.parse(tolerance) if isinstance(tolerance, str) else tolerance
    out: list[Check] = []
    for level in ("ttir", "ttgir"):
        if original.levels.get(level) is None or original.levels.get(level) == candidate.levels.get(level):
            continue
        if tol is not None and not tol.exact:
            out.append(Check("symbolic", level, "skipped", "a tolerance is declared: the symbolic claims are bit-exact"))
            continue
        check = symbolic_checker(original, candidate, level, None, timeout)
        if check is not None:
            out.append(check)
    return out
