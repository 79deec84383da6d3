"""Instruction-mix statistics of a disassembled kernel, the same shape for SASS and AMDGCN.

Each vendor module classifies its own opcodes into the categories below; this module only holds the
result type and the counting, so reports and comparisons treat both vendors alike.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

#: Categories every vendor maps its opcodes to.
CATEGORIES = (
    "load.global", "store.global", "load.shared", "store.shared", "load.local", "store.local", "load.const",
    "async_copy", "tma", "atomic", "mma", "wgmma", "branch", "barrier", "wait", "alu", "other",
)


@dataclass
class InstructionMix:
    """Counts of instructions by category, by opcode, and of memory operations by width in bits."""

    vendor: str
    total: int = 0
    by_category: Counter[str] = field(default_factory=Counter)
    by_opcode: Counter[str] = field(default_factory=Counter)
    #: e.g. {"load.global": {128: 12, 32: 3}}: memory instructions by access width in bits.
    widths: dict[str, Counter[int]] = field(default_factory=dict)

    def add(self, opcode: str, category: str, width_bits: int | None = None) -> None:
        if category not in CATEGORIES:
            raise ValueError(f"unknown instruction category {category!r}")
        self.total += 1
        self.by_category[category] += 1
        self.by_opcode[opcode] += 1
        if width_bits is not None:
            self.widths.setdefault(category, Counter())[width_bits] += 1

    def to_json(self) -> dict[str, Any]:
        return {
            "vendor": self.vendor,
            "total": self.total,
            "by_category": dict(sorted(self.by_category.items())),
            "by_opcode": dict(self.by_opcode.most_common()),
            "widths": {k: {str(w): n for w, n in sorted(v.items())} for k, v in sorted(self.widths.items())},
        }
