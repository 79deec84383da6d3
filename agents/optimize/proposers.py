"""The proposer interface, its discovery, and the hook for IR passes (see the package docstring).

`discover_proposers()` returns the built-ins (library, compiler, graph) plus what the entry-point group
`kstrata.proposers` offers, plus the optional built-ins (`OPTIONAL_BUILTINS`: proposers of other kstrata
packages, such as the Triton templates of `kstrata.agents.templates`, used by default when that package is
present even where the entry points are not installed; an absent package is skipped quietly, an entry point
of the same name takes precedence; `plugins=False` leaves them out too); a broken plugin is reported (`PluginProblem`) and skipped, never fatal.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from importlib import import_module, metadata
from typing import Any, Protocol, runtime_checkable

from kstrata.agents.optimize.candidate import SPACES, TaskCandidate
from kstrata.agents.optimize.irspace import IrPassProposer
from kstrata.agents.optimize.state import SearchState

ENTRY_POINT_GROUP = "kstrata.proposers"


@runtime_checkable
class Proposer(Protocol):
    """Declares its space; returns complete candidates for a state. Must not evaluate or time anything.

    A proposer that needs evidence only a run can give (the `ir` space: its node's kernels recorded and
    searched at the kernel level) may also define `prepare(state, services) -> dict | None`: the loop calls it
    before `propose`, on the strategy worker's thread and outside the task lock, with `services`
    (`state.LoopServices`: the loop's evaluator, whose workers every GPU job must go through, and the
    deadline); a dict it returns is written to the trajectory (a `prepare` event)."""

    name: str
    space: str

    def propose(self, state: SearchState) -> list[TaskCandidate]: ...


@dataclass(frozen=True)
class PluginProblem:
    entry_point: str
    reason: str


def builtin_proposers() -> list[Proposer]:
    from kstrata.agents.optimize.compiler import compiler_proposers
    from kstrata.agents.optimize.graph import graph_proposers
    from kstrata.agents.optimize.library import library_proposers

    return [*library_proposers(), *compiler_proposers(), *graph_proposers(), IrPassProposer()]


#: (name, "module:attribute") of proposers in other kstrata packages, used when the module exists.
OPTIONAL_BUILTINS: tuple[tuple[str, str], ...] = (("templates", "kstrata.agents.templates.proposer:TemplateProposer"),)


def optional_proposers(have: Iterable[str] = (), specs: Iterable[tuple[str, str]] = OPTIONAL_BUILTINS,
                       ) -> tuple[list[Proposer], list[PluginProblem]]:
    """The optional built-ins not already in `have` (names); a missing package is no problem, a broken one is."""
    found: list[Proposer] = []
    problems: list[PluginProblem] = []
    taken = set(have)
    for name, spec in specs:
        if name in taken:
            continue
        mod, _, attr = spec.partition(":")
        try:
            objs = _as_proposers(getattr(import_module(mod), attr))
        except ModuleNotFoundError as exc:
            if exc.name and (mod == exc.name or mod.startswith(exc.name + ".")):
                continue  # the package is not there (not merged, not installed): nothing to offer
            problems.append(PluginProblem(spec, f"{type(exc).__name__}: {exc}"))
            continue
        except Exception as exc:
            problems.append(PluginProblem(spec, f"{type(exc).__name__}: {exc}"))
            continue
        for obj in objs:
            why = _invalid(obj)
            if why:
                problems.append(PluginProblem(spec, why))
            else:
                found.append(obj)
    return found, problems


def _as_proposers(obj: Any) -> list[Any]:
    if isinstance(obj, type):
        obj = obj()
    elif callable(obj) and not isinstance(obj, Proposer):
        obj = obj()
    return list(obj) if isinstance(obj, (list, tuple)) else [obj]


def plugin_proposers(entry_points: Iterable[Any] | None = None) -> tuple[list[Proposer], list[PluginProblem]]:
    """Proposers from the entry-point group; each bad one becomes a `PluginProblem`."""
    found: list[Proposer] = []
    problems: list[PluginProblem] = []
    eps = entry_points if entry_points is not None else metadata.entry_points(group=ENTRY_POINT_GROUP)
    for ep in eps:
        label = f"{getattr(ep, 'name', ep)} = {getattr(ep, 'value', '?')}"
        try:
            objs = _as_proposers(ep.load())
        except Exception as exc:  # a plugin's import error must not stop the optimizer
            problems.append(PluginProblem(label, f"{type(exc).__name__}: {exc}"))
            continue
        for obj in objs:
            why = _invalid(obj)
            if why:
                problems.append(PluginProblem(label, why))
            else:
                found.append(obj)
    return found, problems


def _invalid(obj: Any) -> str:
    if not isinstance(obj, Proposer):
        return f"{obj!r} is not a proposer (needs name, space and propose(state))"
    if obj.space not in SPACES or obj.space == "baseline":
        return f"proposer {obj.name!r} declares unknown space {obj.space!r}"
    return ""


def discover_proposers(extra: Iterable[Proposer] = (), *, plugins: bool = True) -> tuple[list[Proposer], list[PluginProblem]]:
    """Built-ins, then plugins, then `extra` (API callers and tests); names must be unique."""
    found = builtin_proposers()
    problems: list[PluginProblem] = []
    if plugins:
        more, problems = plugin_proposers()
        found += more
    extra = list(extra)
    if plugins:  # other packages' proposers: off with the plugins (`--no-plugins`: the optimizer's own only)
        opt, opt_problems = optional_proposers({p.name for p in [*found, *extra]})
        found += opt
        problems += opt_problems
    found += extra
    seen: dict[str, Proposer] = {}
    for p in found:
        if p.name in seen:
            problems.append(PluginProblem(p.name, f"a second proposer named {p.name!r} (ignored)"))
            continue
        seen[p.name] = p
    return list(seen.values()), problems
