"""Built-in proposers of the `library` space: library and runtime configuration of the task's model.

Each changes one switch of its parent's configuration (`configs.py`), so they compose with the compiler
and graph spaces: cuDNN benchmark mode (convolutions), channels-last (4-D convolution inputs), the SDPA
backend (attention), CUDA graphs (launch-bound work), and — only under the policy that admits them —
TF32 math or bf16/fp16 autocast. The addmm + activation epilogue lives in graph.py (an fx rewrite).
"""

from __future__ import annotations

from typing import Any

from kstrata.agents.optimize.candidate import TaskCandidate
from kstrata.agents.optimize.configs import describe, inductor_graphs, render, without_inductor_graphs
from kstrata.agents.optimize.state import SearchState
from kstrata.agents.tasks import TensorSpec

CONFIG_SPACES = ("baseline", "library", "compiler", "graph")


def base_params(state: SearchState) -> dict[str, Any] | None:
    """The configuration a config proposer refines: the parent's, else the incumbent's; None for a parent
    that is not a configuration (a template's kernel)."""
    node = state.parent or state.incumbent
    if node.space not in CONFIG_SPACES:
        return None
    return {k: v for k, v in node.candidate.params.items()}


def _has_op(state: SearchState, *needles: str) -> bool:
    return any(any(n in op for n in needles) for op, _ in state.task.spec.flops_by_op)


class _Switch:
    space = "library"
    name = "library"
    needs = "strict"

    def applies(self, state: SearchState) -> str:
        """'' when it applies, else why not."""
        return ""

    def refuses(self, base: dict[str, Any]) -> str:
        """'' when the switch can be set on this parent configuration, else why not."""
        return ""

    def variants(self, state: SearchState, base: dict[str, Any]) -> list[dict[str, Any]]:
        return []

    def propose(self, state: SearchState) -> list[TaskCandidate]:
        base = base_params(state)
        if base is None:
            state.note(self.name, "the parent is not a configuration of the task's model")
            return []
        why = self.applies(state) or self.refuses(base)
        if why:
            state.note(self.name, why)
            return []
        out = []
        for params in self.variants(state, base):
            if params == base:
                continue
            out.append(render(state.task, params, space=self.space, proposer=self.name, policy=self.needs,
                              description=describe(params),
                              parent=(state.parent or state.incumbent).key))
        return out


class CudnnBenchmark(_Switch):
    name = "cudnn-benchmark"

    def applies(self, state: SearchState) -> str:
        if state.device != "cuda":
            return "cuDNN needs a GPU"
        return "" if _has_op(state, "convolution") else "no convolution in the task"

    def variants(self, state: SearchState, base: dict[str, Any]) -> list[dict[str, Any]]:
        return [{**base, "cudnn_benchmark": True}]


class ChannelsLast(_Switch):
    name = "channels-last"

    def applies(self, state: SearchState) -> str:
        four_d = any(isinstance(a, TensorSpec) and len(a.shape) == 4 for a in state.task.spec.inputs)
        if not _has_op(state, "convolution"):
            return "no convolution in the task"
        return "" if four_d else "no 4-D input to lay out channels-last"

    def variants(self, state: SearchState, base: dict[str, Any]) -> list[dict[str, Any]]:
        return [{**base, "channels_last": True}]


class SdpaBackend(_Switch):
    name = "sdpa-backend"
    BACKENDS = ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION")

    def applies(self, state: SearchState) -> str:
        if state.device != "cuda":
            return "the fused SDPA backends need a GPU"
        return "" if _has_op(state, "scaled_dot_product", "attention") else "no scaled_dot_product_attention in the task"

    def variants(self, state: SearchState, base: dict[str, Any]) -> list[dict[str, Any]]:
        return [{**base, "sdpa": b} for b in self.BACKENDS]


class CudaGraphs(_Switch):
    name = "cuda-graphs"

    def applies(self, state: SearchState) -> str:
        if state.device != "cuda":
            return "CUDA graphs need a GPU"
        if not (state.finding("launch-bound") or state.finding("many-kernels")):
            return "the profile finds no launch-bound work"
        return ""

    def variants(self, state: SearchState, base: dict[str, Any]) -> list[dict[str, Any]]:
        """One graph of the whole call around the parent. A parent under Inductor's CUDA graph trees cannot be
        wrapped as it is (on the H200, 2026-12-03: "Cannot prepare for replay during capturing stage"); its
        variant is the same compile without the trees, in one graph of ours: the same kernels, one replay
        per call, without the trees' per-call bookkeeping. (level3/02, a batch-1 MLP of 11 kernels that keep
        the GPU busy 20 us per call, measured 78 us under max-autotune's trees, the rest host time.)"""
        if base.get("cuda_graph"):
            return []
        why = inductor_graphs(base)
        if why:
            state.note(self.name, f"the parent {why}: its variant turns the trees off inside one graph of ours")
        return [{**without_inductor_graphs(base), "cuda_graph": True}]


class Tf32(_Switch):
    name = "tf32-math"
    needs = "tf32"

    def applies(self, state: SearchState) -> str:
        if state.policy != "tf32":
            return "TF32 is not admitted under the policy (ask for --precision tf32)"
        return "" if "float32" in state.task.spec.dtypes else "no fp32 work"

    def variants(self, state: SearchState, base: dict[str, Any]) -> list[dict[str, Any]]:
        return [{**base, "tf32": True}]


class Autocast(_Switch):
    name = "autocast"

    def applies(self, state: SearchState) -> str:
        if state.policy not in ("bf16", "fp16"):
            return "lower-precision autocast is not admitted under the policy (ask for --precision bf16|fp16)"
        return "" if "float32" in state.task.spec.dtypes else "no fp32 work to downcast"

    def variants(self, state: SearchState, base: dict[str, Any]) -> list[dict[str, Any]]:
        self.needs = state.policy
        return [{**base, "autocast": {"bf16": "bfloat16", "fp16": "float16"}[state.policy]}]


def library_proposers() -> list[Any]:
    return [CudnnBenchmark(), ChannelsLast(), SdpaBackend(), CudaGraphs(), Tf32(), Autocast()]
