"""A task-level candidate: one complete standalone `ModelNew` source, where it came from, what it needs.

The engine (`kstrata.agents.engine`, being written) will have its own `Candidate` with `level="task"`;
`TaskCandidate.engine_fields()` gives what that constructor needs, so the switch is one function.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

#: The precision policies a run may ask for. `strict` (default) admits no lower precision; the others
#: admit TF32 / bf16 / fp16 arithmetic and are checked with KernelBench's tolerances (labelled as such).
POLICIES = ("strict", "tf32", "bf16", "fp16")
#: Implementation spaces, in the order of the design; `baseline` holds eager/compile/max-autotune.
SPACES = ("baseline", "library", "compiler", "graph", "triton", "ir", "asm")


def policy_admits(policy: str, needed: str) -> bool:
    """Whether a run under `policy` may accept a candidate that needs `needed`."""
    if needed == "strict":
        return True
    return policy == needed


@dataclass(frozen=True)
class TaskCandidate:
    """One ModelNew source with its provenance. `key` is the content digest of the source."""

    source: str
    space: str
    proposer: str
    description: str  # one line: what the edit is
    params: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    policy: str = "strict"  # the precision policy this candidate needs
    parent: str | None = None  # key of the node it refines

    def __post_init__(self) -> None:
        if self.space not in SPACES:
            raise ValueError(f"candidate from {self.proposer!r}: unknown space {self.space!r}; one of {', '.join(SPACES)}")
        if self.policy not in POLICIES:
            raise ValueError(f"candidate from {self.proposer!r}: unknown policy {self.policy!r}")
        if "class ModelNew" not in self.source:
            raise ValueError(f"candidate from {self.proposer!r} defines no `class ModelNew`")
        try:
            json.dumps(self.params)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"candidate from {self.proposer!r}: parameters are not JSON-safe: {exc}") from None

    @property
    def key(self) -> str:
        return hashlib.sha256(self.source.encode()).hexdigest()[:16]

    def edit_json(self) -> dict[str, Any]:
        return {"description": self.description, "params": self.params, "policy": self.policy}

    def engine_fields(self) -> dict[str, Any]:
        """The fields of the engine's `Candidate` for this task-level candidate."""
        return {"level": "task", "edit": self.source, "policy": self.policy,
                "provenance": {"proposer": self.proposer, "parent": self.parent, "space": self.space}}
