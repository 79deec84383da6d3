"""The optimizer loop: `kstrata optimize TASK.py|DIR` makes a KernelBench task faster, and proves it.

One task goes through::

    contract ─► baselines ─► profile ─► findings ─► planner ─► spaces ─► proposers ─► candidates
    (contract.py) (eager, compile,  (worker.py:    (findings.py:   (planner.py)   (proposers.py and the
                   max-autotune)     torch.profiler, analyzers)                    built-ins below)
                                     ncu, SASS)
    candidates ─► check (hardened eval) ─► measure (one timing queue) ─► benchmark guard ─► incumbent
                  (evaluation.py: the one seam to agents/evaluate.py; moves to the engine in one place)
    search.py: a tree with progressive widening, log-scaled rewards, pruning of failing spaces, per-task
    memory, strategy workers that share conclusions only; report.py: model_new.py, report.md, plots,
    trajectory.jsonl, summary.md.

The proposer interface (for templates, the LLM and third-party plugins)
-----------------------------------------------------------------------
A proposer is any object with::

    class Proposer(Protocol):
        name: str    # unique, e.g. "inductor-options"
        space: str   # one of SPACES: "library", "compiler", "graph", "triton", "ir", "asm"
        def propose(self, state: SearchState) -> list[TaskCandidate]: ...

`state` (`kstrata.agents.optimize.state.SearchState`) is read-only for a proposer: the task (path,
source text, `TaskSpec`), the contract (`Contract`: output shapes/dtypes/strides, policy, degenerate
verdict), the device, the precision policy, the findings (`Finding`: analyzer, kind, structured data,
one line of text), the incumbent and the baselines (`Node`s with their candidate, verdict and timing),
the node being refined (`state.parent`, None for a fresh draft), the keys already tried, and the search
memory's conclusions (`state.memory.conclusions`: "compiler: coordinate_descent_tuning: 1.04x").

A proposer returns complete candidates (`kstrata.agents.optimize.candidate.TaskCandidate`): a standalone
KernelBench `ModelNew` source that imports torch and triton only (never kstrata), the space, the
proposer's name, its parameters (JSON-safe), a one-line description of the edit, and the precision
policy it needs. `kstrata.agents.optimize.codegen` has helpers for the common shapes (a wrapper around
the task's own `Model`; a rewritten `forward`), but a proposer may render its source any way it likes
(the templates render their own Triton kernels). It returns `[]` when it has nothing (better: it also
sets `state.note(self.name, "why")`, which the report shows). It must not evaluate or time anything:
the loop checks every candidate with the hardened evaluator, under the policy, before it is timed, and
never knows which proposer made one beyond the name it records.

Discovery: the built-ins (`proposers.BUILTIN_PROPOSERS`) plus every entry point of the group
`kstrata.proposers` (an entry point names a Proposer class, a zero-argument factory, or an instance; a
factory may return a list). Analyzers plug in the same way under `kstrata.analyzers`
(`findings.Analyzer`: `name`, `analyze(evidence) -> list[Finding]`).

Spaces and their proposers in this package: `library` (cudnn.benchmark, channels-last, SDPA backend,
addmm + activation epilogue, CUDA graphs for launch-bound tasks, TF32/bf16 only under those policies),
`compiler` (Inductor options), `graph` (exact torch.fx rewrites, checked numerically under the policy).
`triton` comes from `kstrata.agents.templates`; `ir` (`irspace.IrPassProposer`) records the node's Triton
kernels on the GPU, searches the largest ones with the compiled-kernel search (passes' `schedule_space`), and
proposes the node's source plus a standalone deployer of the winners (`deployer.py`); `asm` is reserved.

A proposer may also define `prepare(state, services)` (`state.LoopServices`): the loop calls it before
`propose`, outside the task lock, and it is the one place a proposer may build, check or time, through the
loop's evaluator and its workers (the `ir` space's recording and kernel-level search run there).
"""

from __future__ import annotations

from kstrata.agents.optimize.candidate import POLICIES, SPACES, TaskCandidate
from kstrata.agents.optimize.proposers import Proposer, discover_proposers
from kstrata.agents.optimize.state import Node, SearchMemory, SearchState

__all__ = ["POLICIES", "SPACES", "Node", "Proposer", "SearchMemory", "SearchState", "TaskCandidate",
           "discover_proposers"]
