"""Declared tolerances: how far a candidate's floating-point results may move from the original's.

A rewrite is bit-exact unless it declares a `Tolerance`. The spelling is the one `kstrata verify
--tolerance` takes and run-passes records beside an override: comma-separated `ulp=N`, `rtol=X`,
`atol=X`, e.g. `rtol=1e-5,atol=1e-6` or `ulp=2`. An element is within tolerance when its ULP distance is
at most `ulp`, or `|a - b| <= atol + rtol * |b|`. Whatever the tolerance, the two results must agree on
where NaNs are (any NaN matches any NaN: payloads are not part of the contract) and on infinities
(same sign); integer results are always compared bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .errors import KstrataError


class ToleranceError(KstrataError):
    """A tolerance spelling that cannot be read."""


@dataclass(frozen=True)
class Tolerance:
    ulp: int = 0
    rtol: float = 0.0
    atol: float = 0.0
    #: Why the rewrite is not bit-exact, for reports.
    why: str = ""

    @property
    def exact(self) -> bool:
        return not (self.ulp or self.rtol or self.atol)

    def spelling(self) -> str:
        parts = [f"ulp={self.ulp}"] if self.ulp else []
        parts += [f"rtol={self.rtol:g}"] if self.rtol else []
        parts += [f"atol={self.atol:g}"] if self.atol else []
        return ",".join(parts) or "exact"

    @classmethod
    def parse(cls, text: str, why: str = "") -> Tolerance:
        """Read `ulp=N,rtol=X,atol=X` (any subset, any order) or `exact`."""
        values: dict[str, Any] = {}
        if text.strip() in ("", "exact"):
            return cls(why=why)
        for part in text.split(","):
            key, sep, raw = part.partition("=")
            key = key.strip()
            if not sep or key not in ("ulp", "rtol", "atol"):
                raise ToleranceError(f"cannot read tolerance {text!r}: expected ulp=N, rtol=X or atol=X, "
                                     f"comma-separated (got {part.strip()!r})")
            try:
                values[key] = int(raw) if key == "ulp" else float(raw)
            except ValueError:
                raise ToleranceError(f"cannot read tolerance {text!r}: {key}={raw.strip()!r} is not a number") from None
            if values[key] < 0:
                raise ToleranceError(f"cannot read tolerance {text!r}: {key} must not be negative")
        return cls(why=why, **values)

    def combine(self, other: Tolerance | None) -> Tolerance:
        """The looser of two tolerances (a pipeline's passes each declare their own)."""
        if other is None:
            return self
        why = "; ".join(w for w in (self.why, other.why) if w)
        return Tolerance(max(self.ulp, other.ulp), max(self.rtol, other.rtol), max(self.atol, other.atol), why)
