"""The library space's CUDA-graph configuration (`configs._GRAPH_HELPER`) under CUDA-graph semantics on the CPU.

A fake `torch.cuda` stands in for the GPU: a captured graph, on replay, recomputes its call from the tensors it
captured into the output buffers it captured -- what a real graph does (fixed input and output addresses). The
properties checked are the helper's own: inputs read in place (nothing copied in while addresses repeat),
outputs never overwritten while their holder keeps them, new addresses captured, copy-in after too many, and
replaced parameters a new key. The real thing runs in the GPU tests of the optimizer.
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from kstrata.agents.optimize.configs import render
from kstrata.agents.optimize.state import TaskInfo
from kstrata.agents.tasks import load_task

from .conftest import has_cuda

TASK = Path(__file__).resolve().parents[1] / "optimize_tasks" / "02_linear_sum_small.py"


class _FakeGraph:
    def __init__(self) -> None:
        self.replays = 0
        self.replay_fn: Any = None

    def replay(self) -> None:
        self.replays += 1
        self.replay_fn()


@pytest.fixture
def graph_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    t = load_task(TASK)
    cand = render(TaskInfo(TASK, t.name, TASK.read_text(), t.spec), {"cuda_graph": True}, space="library",
                  proposer="cuda-graphs")
    path = tmp_path / "model_new.py"
    path.write_text(cand.source)
    spec = importlib.util.spec_from_file_location("graph_candidate", path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules["graph_candidate"] = mod
    spec.loader.exec_module(mod)
    graphs: list[_FakeGraph] = []

    def new_graph() -> _FakeGraph:
        graphs.append(_FakeGraph())
        return graphs[-1]

    class _Stream:
        def wait_stream(self, other: Any) -> None:
            pass

    monkeypatch.setattr(torch.cuda, "CUDAGraph", new_graph)
    monkeypatch.setattr(torch.cuda, "Stream", _Stream)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: _Stream())
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "graph", lambda g: contextlib.nullcontext())
    capture = mod._KstrataGraphs._capture

    def recording_capture(self: Any, inputs: Any, copy_in: bool, shape: Any) -> Any:
        graph, static, out, uses = capture(self, inputs, copy_in, shape)
        read = static if static is not None else list(inputs)  # what the graph reads: the captured addresses

        def replay() -> None:
            with torch.no_grad():
                for o, n in zip(self._tensors(out), self._tensors(self.call(*read)), strict=True):
                    o.copy_(n)

        graph.replay_fn = replay
        return graph, static, out, uses

    monkeypatch.setattr(mod._KstrataGraphs, "_capture", recording_capture)
    yield mod, graphs
    sys.modules.pop("graph_candidate", None)


def _pair(mod: Any) -> tuple[Any, Any]:
    torch.manual_seed(0)
    ref = mod.Model(64, 48)
    torch.manual_seed(0)
    new = mod.ModelNew(64, 48)
    return ref, new


def test_replays_read_inputs_in_place_and_never_overwrite_a_held_output(graph_module: Any) -> None:
    mod, graphs = graph_module
    ref, new = _pair(mod)
    x = torch.randn(32, 64)
    with torch.no_grad():
        first = new(x)
        assert torch.allclose(first, ref(x)) and len(graphs) == 1
        kept = first.clone()
        x.copy_(torch.randn(32, 64))  # new contents at the same address: a replay must see them
        second = new(x)  # `first` is still held: another graph, not a replay into `first`
        assert len(graphs) == 2 and torch.equal(first, kept)
        assert torch.allclose(second, ref(x))
        first_ptr = first.data_ptr()
        del first
        x.copy_(torch.randn(32, 64))
        third = new(x)  # the first graph's output is free again: replayed, nothing captured
        assert len(graphs) == 2 and third.data_ptr() == first_ptr and torch.allclose(third, ref(x))
        view = third[3:]  # a view holds the output too
        del third
        second_ptr = second.data_ptr()
        del second
        fourth = new(x)
        assert fourth.data_ptr() == second_ptr and len(graphs) == 2  # the free one, not the one under `view`
        assert torch.allclose(view, ref(x)[3:])


def test_new_addresses_capture_then_copy_in_and_replaced_weights_are_a_new_key(graph_module: Any) -> None:
    mod, graphs = graph_module
    ref, new = _pair(mod)
    limit = mod._KstrataGraphs.MAX_ADDRESSES
    with torch.no_grad():
        xs = [torch.randn(32, 64) for _ in range(limit + 3)]
        for i, x in enumerate(xs):
            out = new(x)
            assert torch.allclose(out, ref(x)), i
            del out
        g = new._state["graphs"]
        copy_keys = [k for k in g.graphs if k[2] is None]
        assert len(copy_keys) == 1 and len(graphs) == limit + 1  # one graph per address, then one copy-in graph
        again = new(xs[-1])  # past the limit: copied in, the copy-in graph replayed
        assert len(graphs) == limit + 1 and torch.allclose(again, ref(xs[-1]))
        del again
        new.model.linear.weight = torch.nn.Parameter(torch.randn(48, 64))  # a new tensor: a new address
        ref.linear.weight = torch.nn.Parameter(new.model.linear.weight.detach().clone())
        out = new(xs[0])
        assert len(graphs) == limit + 2 and torch.allclose(out, ref(xs[0]))
        del out
        for n in range(2, 12):  # new shapes: at most MAX_KEYS keys keep graphs, the least recently used go first
            x = torch.randn(n, 64)
            assert torch.allclose(new(x), ref(x))
        assert len(g.graphs) == mod._KstrataGraphs.MAX_KEYS and (((11, 64), (64, 1), torch.float32,
                                                                  torch.device("cpu")),) in {k[0] for k in g.graphs}


@pytest.mark.gpu
@pytest.mark.skipif(not has_cuda(), reason="needs an NVIDIA GPU")
def test_graph_candidate_passes_the_hardened_evaluator_on_gpu(tmp_path: Path) -> None:
    """On a real GPU: the eager and compiled graph configurations pass every trial's checks (aliasing between
    trials, inputs unchanged, outputs after timing) and are timed."""
    from kstrata.agents.evaluate import evaluate

    t = load_task(TASK)
    info = TaskInfo(TASK, t.name, TASK.read_text(), t.spec)
    # the last: a graphed parent's variant (max-autotune without Inductor's graph trees, inside one graph of ours)
    for i, params in enumerate(({"cuda_graph": True}, {"cuda_graph": True, "compile": {"mode": None, "options": {}}},
                                {"cuda_graph": True, "compile": {"mode": "max-autotune-no-cudagraphs", "options": {}}})):
        path = tmp_path / f"graph_{i}.py"
        path.write_text(render(info, params, space="library", proposer="cuda-graphs").source)
        v = evaluate(TASK, path, device="cuda", timing=True, runs=50, timeout_s=300)
        print(f"GRAPH {params}: accepted={v.accepted} reason={v.reason} candidate={v.candidate_timing} speedup={v.speedup}")
        assert v.candidate_timing is not None, v.timing_note
        assert v.accepted, v.reason
