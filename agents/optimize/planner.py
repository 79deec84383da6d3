"""The planner: orders the implementation spaces by the findings and the headroom to speed of light,
and records why it skips one ("already at 96% of SOL", "no proposer installed for space triton", …).

Pure: findings, the incumbent's SOL fraction and the installed proposers in, a `Plan` out.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from kstrata.agents.optimize.findings import AT_SOL, Finding

#: Prior value of each space before findings (how often it pays off without evidence).
PRIORS = {"library": 0.45, "compiler": 0.5, "graph": 0.4, "triton": 0.6, "ir": 0.3, "asm": 0.2}
#: finding kind -> {space: boost}
BOOSTS: dict[str, dict[str, float]] = {
    "launch-bound": {"library": 0.5, "compiler": 0.3},
    "many-kernels": {"compiler": 0.3, "triton": 0.2, "library": 0.1},
    "conv-heavy": {"library": 0.4, "compiler": 0.1},
    "attention": {"library": 0.4, "triton": 0.1},
    "gemm-epilogue": {"library": 0.3, "compiler": 0.1},
    "fx-identity": {"graph": 0.6},
    "memory-bound-low-bw": {"compiler": 0.3, "triton": 0.4, "ir": 0.1},
    "reduction-heavy": {"compiler": 0.3, "triton": 0.3},
    "simt-fp32-tf32-allowed": {"library": 0.5, "compiler": 0.2},
    "occupancy-registers": {"ir": 0.3, "compiler": 0.1},
    "occupancy-shared": {"ir": 0.3, "compiler": 0.1},
    "tail-effect": {"triton": 0.2, "compiler": 0.2},
    "uncoalesced": {"triton": 0.3, "compiler": 0.1},
    "latency-bound": {"compiler": 0.2, "triton": 0.2},
    "spills": {"ir": 0.3},
}
SEARCHABLE = ("library", "compiler", "graph", "triton", "ir", "asm")


@dataclass(frozen=True)
class SpacePlan:
    space: str
    score: float
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {"space": self.space, "score": round(self.score, 4), "reason": self.reason}


@dataclass(frozen=True)
class Plan:
    order: tuple[SpacePlan, ...]
    skipped: tuple[SpacePlan, ...]
    stop_reason: str = ""

    @property
    def spaces(self) -> list[str]:
        return [s.space for s in self.order]

    def to_json(self) -> dict[str, Any]:
        return {"order": [s.to_json() for s in self.order], "skipped": [s.to_json() for s in self.skipped],
                "stop_reason": self.stop_reason}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Plan:
        return cls(tuple(SpacePlan(**s) for s in d["order"]), tuple(SpacePlan(**s) for s in d["skipped"]),
                   d.get("stop_reason", ""))


def plan(findings: Iterable[Finding], sol_fraction: float | None, spaces_with_proposers: Iterable[str],
         only: Iterable[str] | None = None) -> Plan:
    findings = list(findings)
    installed = set(spaces_with_proposers)
    wanted = set(only) if only is not None else set(SEARCHABLE)
    if sol_fraction is not None and sol_fraction >= AT_SOL:
        why = f"already at {100 * sol_fraction:.0f}% of SOL"
        return Plan((), tuple(SpacePlan(s, 0.0, why) for s in SEARCHABLE), why)
    headroom = 1.0 if sol_fraction is None else max(0.0, 1.0 - sol_fraction)
    strict_bound = any(f.kind == "fp32-gemm-strict-bound" for f in findings)
    order, skipped = [], []
    for space in SEARCHABLE:
        if space not in wanted:
            skipped.append(SpacePlan(space, 0.0, "not asked for (--spaces)"))
            continue
        if space not in installed:
            missing = {"triton": "no proposer installed for space triton (the templates, kstrata.agents.templates, or an "
                             "LLM proposer)", "asm": "no proposer installed for space asm (compiled-kernels issue)"}
            skipped.append(SpacePlan(space, 0.0, missing.get(space, f"no proposer installed for space {space}")))
            continue
        score = PRIORS[space]
        because = []
        for f in findings:
            b = BOOSTS.get(f.kind, {}).get(space, 0.0)
            if b:
                score += b
                because.append(f.kind)
        if strict_bound:
            score *= 0.3
            because.append("fp32 GEMM at the SIMT bound under strict")
        score *= headroom
        reason = (f"headroom {100 * headroom:.0f}% to SOL" if sol_fraction is not None else "SOL not measured") + (
            "; findings: " + ", ".join(because) if because else "; no finding points here")
        order.append(SpacePlan(space, score, reason))
    order.sort(key=lambda s: -s.score)
    return Plan(tuple(order), tuple(skipped))
