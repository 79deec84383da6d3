"""Built-in proposer of the `compiler` space: Inductor configuration.

A fresh draft compiles the parent's configuration with one option set from `OPTION_SETS`; a refinement
of a compiler node adds one more option to the parent's (those whose own trial was not slower come first,
from the search memory). Which sets come first depends on the findings (reductions → reduction
strategies; launch-bound → cudagraphs; GEMM-heavy → max-autotune's GEMM backends).
"""

from __future__ import annotations

from typing import Any

from kstrata.agents.optimize.candidate import TaskCandidate
from kstrata.agents.optimize.configs import describe, inductor_graphs, render
from kstrata.agents.optimize.library import base_params
from kstrata.agents.optimize.state import SearchState

#: name -> (mode, inductor options)
OPTION_SETS: dict[str, tuple[str | None, dict[str, Any]]] = {
    "coordinate-descent": (None, {"coordinate_descent_tuning": True}),
    "max-autotune-no-cudagraphs": ("max-autotune-no-cudagraphs", {}),
    "max-autotune+coordinate-descent": ("max-autotune-no-cudagraphs", {"coordinate_descent_tuning": True}),
    "no-split-reductions": (None, {"split_reductions": False}),
    "no-persistent-reductions": (None, {"triton.persistent_reductions": False}),
    "cooperative-reductions": (None, {"triton.cooperative_reductions": True}),
    "aggressive-fusion": (None, {"aggressive_fusion": True}),
    "no-epilogue-fusion": (None, {"epilogue_fusion": False}),
    "freezing": (None, {"freezing": True}),
    "cudagraphs": (None, {"triton.cudagraphs": True}),
    "no-shape-padding": (None, {"shape_padding": False}),
}


def _order(state: SearchState) -> list[str]:
    first: list[str] = []
    if state.finding("reduction-heavy"):
        first += ["no-split-reductions", "no-persistent-reductions", "cooperative-reductions"]
    if state.finding("launch-bound") or state.finding("many-kernels"):
        first += ["cudagraphs", "aggressive-fusion"]
    if state.finding("conv-heavy") or state.finding("gemm-epilogue"):
        first += ["freezing", "max-autotune-no-cudagraphs"]
    first += ["coordinate-descent", "freezing", "max-autotune-no-cudagraphs", "max-autotune+coordinate-descent"]
    rest = [n for n in OPTION_SETS if n not in first]
    names = list(dict.fromkeys(first + rest))
    if state.device != "cuda":  # CUDA graphs and Triton-only strategies mean nothing on the CPU
        names = [n for n in names if n not in ("cudagraphs", "cooperative-reductions")]
    return names


class InductorOptions:
    name = "inductor-options"
    space = "compiler"

    def propose(self, state: SearchState) -> list[TaskCandidate]:
        base = base_params(state)
        if base is None:
            state.note(self.name, "the parent is not a configuration of the task's model")
            return []
        parent = state.parent or state.incumbent
        current = base.get("compile") or {"mode": None, "options": {}}
        slower = {c.what for c in state.memory.about("compiler") if c.outcome in ("slower", "failed")}
        out = []
        for name in _order(state):
            mode, opts = OPTION_SETS[name]
            if any(name in w for w in slower):
                continue
            merged = {**current.get("options", {}), **opts}
            new_mode = mode or current.get("mode")
            if merged == current.get("options", {}) and new_mode == current.get("mode"):
                continue
            if name == "cudagraphs" and (inductor_graphs(base) or base.get("cuda_graph")):
                continue  # graphed already (Inductor's trees, or the library space's graph around the call)
            params = {**base, "compile": {"mode": new_mode, "options": merged}}
            params["compiler_sets"] = [*base.get("compiler_sets", []), name]
            out.append(render(state.task, params, space=self.space, proposer=self.name, parent=parent.key,
                              description=f"{name} on ({describe(base)})"))
        return out


def compiler_proposers() -> list[Any]:
    return [InductorOptions()]
