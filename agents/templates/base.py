"""A template instance on one task: `TemplateMatch` (its schedule space and `render(params)`), and `Rejection`."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kstrata.agents.templates.graph import Chain

#: A schedule: template parameter name -> value (block sizes, warps, stages, split factors, strategies).
Params = dict[str, Any]


@dataclass(frozen=True)
class Rejection:
    """A template that does not apply to a task, and why (one line)."""

    template: str
    reason: str


@dataclass(frozen=True)
class TemplateMatch:
    """A template bound to a task's graph: what it covers, its schedule space, and its source for a schedule.

    `space` maps each parameter to the values worth trying on this task's shapes; `valid(params)` drops
    combinations that cannot run (a block smaller than a fused row, a split above the row's tiles).
    `render(params)` returns a complete standalone ModelNew source under `policy`.
    """

    template: str
    task_path: Path
    description: str  # what the instance computes and how, one line
    space: tuple[tuple[str, tuple[Any, ...]], ...]
    default: tuple[tuple[str, Any], ...]
    policy: str
    shape_key: str  # shapes and dtypes of the inputs and the output: the autotuning cache key's task part
    chain: Chain = field(repr=False, compare=False, hash=False)
    _render: Callable[[Params, str], str] = field(repr=False, compare=False, hash=False)
    _valid: Callable[[Params], bool] = field(repr=False, compare=False, hash=False, default=lambda p: True)
    #: schedules worth timing besides the default, changing several parameters at once (a split factor with
    #: a row grouping) where a search that changes one parameter at a time would not get to them
    hints: tuple[tuple[tuple[str, Any], ...], ...] = field(default=(), compare=False, hash=False)

    def hint_params(self) -> list[Params]:
        out = []
        for h in self.hints:
            p = {**self.default_params(), **dict(h)}
            if self._valid(p) and p not in out:
                out.append(p)
        return out

    def schedule_space(self) -> dict[str, tuple[Any, ...]]:
        return dict(self.space)

    def default_params(self) -> Params:
        return dict(self.default)

    def configs(self) -> list[Params]:
        """Every valid schedule of the space, the default first."""
        names = [n for n, _ in self.space]
        out = [self.default_params()]
        for values in itertools.product(*(v for _, v in self.space)):
            p = dict(zip(names, values, strict=True))
            if p != out[0] and self._valid(p):
                out.append(p)
        return out

    def check(self, params: Params) -> Params:
        """`params` completed with the defaults and validated against the space (ValueError: why not)."""
        full = {**self.default_params(), **params}
        space = self.schedule_space()
        for k, v in full.items():
            if k not in space:
                raise ValueError(f"template {self.template}: unknown parameter {k!r} (known: {', '.join(space)})")
            if v not in space[k]:
                raise ValueError(f"template {self.template}: {k}={v!r} is not in its space {space[k]}")
        if not self._valid(full):
            raise ValueError(f"template {self.template}: schedule {json.dumps(full, sort_keys=True)} is not valid here")
        return full

    def render(self, params: Params | None = None, policy: str | None = None) -> str:
        """The standalone ModelNew source for a schedule (defaults for what `params` leaves out)."""
        return self._render(self.check(params or {}), policy or self.policy)


def nearest_valid(space: tuple[tuple[str, tuple[Any, ...]], ...], default: Params,
                  valid: Callable[[Params], bool]) -> Params | None:
    """`default` if it is valid, else the valid schedule of `space` closest to it (fewest parameters changed,
    then the smallest steps along each parameter's values); None when no schedule of the space is valid."""
    if valid(default):
        return dict(default)
    names = [n for n, _ in space]
    best: tuple[tuple[int, int], Params] | None = None
    for values in itertools.product(*(v for _, v in space)):
        p = dict(zip(names, values, strict=True))
        changed = [(n, vs) for n, vs in space if p[n] != default.get(n)]
        cost = (len(changed), sum(abs(vs.index(p[n]) - (vs.index(default[n]) if default.get(n) in vs else 0))
                                  for n, vs in changed))
        if (best is None or cost < best[0]) and valid(p):
            best = (cost, p)
    return None if best is None else best[1]


def next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def cdiv(a: int, b: int) -> int:
    return -(-a // b)
