"""Built-in proposers of the `graph` space (and the library space's addmm + activation epilogue):
exact rewrites of the task's `torch.fx` graph, emitted as a new `forward` (see configs.py).

The task's `Model` is built on the `meta` device and traced with `torch.fx.symbolic_trace` (a model whose
control flow depends on values does not trace: the space says so and is skipped); shapes come from
`ShapeProp` on meta inputs. Rewrites (each an algebraic identity; rounding may differ, so every one is
checked numerically by the hardened evaluator under the policy before it is timed):

- `linear-sum`: `linear(x).sum(-1)` = `x @ W.sum(0) + b.sum()` (a GEMM becomes a matrix-vector product);
- `linear-scale`: `linear(x) * s` (or `/ s`) with a Python scalar `s` = `linear(x, W * s, b * s)`;
- `scalar-chain`: `(t * a) * b` = `t * (a * b)`, `(t * a) / b` = `t * (a / b)`, `(t / a) / b` = `t / (a * b)`;
- `addmm-epilogue` (library space): `relu(linear(x))` = `torch._addmm_activation(b, x, W.t())`
  (cuBLASLt's fused bias + ReLU epilogue), for 2-D and flattened N-D inputs.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any

from kstrata.agents.optimize.candidate import TaskCandidate
from kstrata.agents.optimize.configs import describe, render
from kstrata.agents.optimize.library import base_params
from kstrata.agents.optimize.state import SearchState

#: Names the generated forward may use at module level (`codegen.GRAPH_PRELUDE` defines them).
ALLOWED_GLOBALS = frozenset({"inf", "nan", "NoneType", "torch", "device", "fx_pytree", "pytree"})


class GraphUnavailable(Exception):
    pass


@lru_cache(maxsize=16)
def _trace(path: str, digest: str) -> tuple[Any, tuple[str, ...]]:
    """The traced GraphModule (meta weights) of a task, and the op sequence; raises GraphUnavailable."""
    import torch
    import torch.fx as fx
    from torch.fx.passes.shape_prop import ShapeProp

    from kstrata.agents.tasks import load_task

    task = load_task(Path(path))
    try:
        model, inputs = task.instantiate("meta")
    except Exception as exc:
        raise GraphUnavailable(f"the model does not build on the meta device: {exc}") from None
    try:
        gm = fx.symbolic_trace(model)
    except Exception as exc:
        raise GraphUnavailable(f"torch.fx cannot trace the model: {type(exc).__name__}: {str(exc)[:160]}") from None
    try:
        with torch.no_grad():
            ShapeProp(gm).propagate(*inputs)
    except Exception as exc:
        raise GraphUnavailable(f"shape propagation failed: {type(exc).__name__}: {str(exc)[:160]}") from None
    return gm, op_sequence(gm)


def op_sequence(gm: Any) -> tuple[str, ...]:
    mods = dict(gm.named_modules())
    out = []
    for n in gm.graph.nodes:
        if n.op == "call_module":
            out.append(type(mods[n.target]).__name__.lower())
        elif n.op in ("call_function", "call_method"):
            out.append(getattr(n.target, "__name__", str(n.target)).lower())
    return tuple(out)


def graph_ops(path: Path, digest: str) -> tuple[str, ...]:
    try:
        return _trace(str(path), digest)[1]
    except GraphUnavailable:
        return ()


def applicable_rewrites(path: Path, digest: str) -> tuple[str, ...]:
    """The rewrites that change the task's graph (each alone), for the findings."""
    try:
        gm, _ = _trace(str(path), digest)
    except GraphUnavailable:
        return ()
    out = []
    for name in REWRITES:
        try:
            if name in apply_rewrites(gm, [name])[1]:
                out.append(name)
        except Exception:
            continue
    return tuple(out)


def _copy(gm: Any) -> Any:
    import copy

    return copy.deepcopy(gm)


def _shape(node: Any) -> tuple[int, ...] | None:
    tm = node.meta.get("tensor_meta")
    return tuple(tm.shape) if tm is not None and hasattr(tm, "shape") else None


def _is_linear(gm: Any, node: Any) -> bool:
    import torch

    return node.op == "call_module" and isinstance(dict(gm.named_modules()).get(node.target), torch.nn.Linear)


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def rewrite_linear_sum(gm: Any) -> int:
    import torch

    g = gm.graph
    n_done = 0
    for node in list(g.nodes):
        is_sum = (node.op == "call_method" and node.target == "sum") or (node.op == "call_function" and node.target is torch.sum)
        if not is_sum or not node.args or not _is_linear(gm, node.args[0]):
            continue
        lin = node.args[0]
        if len(lin.users) != 1:
            continue
        shape = _shape(lin)
        dim = node.kwargs.get("dim", node.args[1] if len(node.args) > 1 else None)
        keepdim = bool(node.kwargs.get("keepdim", node.args[2] if len(node.args) > 2 else False))
        if shape is None or dim is None or "dtype" in node.kwargs:
            continue
        dims = dim if isinstance(dim, (list, tuple)) else [dim]
        if len(dims) != 1 or dims[0] not in (-1, len(shape) - 1):
            continue
        mod = dict(gm.named_modules())[lin.target]
        with g.inserting_before(node):
            w = g.get_attr(f"{lin.target}.weight")
            ws = g.call_method("sum", (w, 0))
            y = g.call_function(torch.matmul, (lin.args[0], ws))
            if mod.bias is not None:
                b = g.get_attr(f"{lin.target}.bias")
                y = g.call_function(operator.add, (y, g.call_method("sum", (b,))))
            if keepdim:
                y = g.call_method("unsqueeze", (y, -1))
        node.replace_all_uses_with(y)
        g.erase_node(node)
        g.erase_node(lin)
        n_done += 1
    return n_done


def rewrite_linear_scale(gm: Any) -> int:
    import torch

    g = gm.graph
    n_done = 0
    for node in list(g.nodes):
        if node.op != "call_function" or node.target not in (operator.mul, operator.truediv) or len(node.args) != 2:
            continue
        a, s = node.args
        if node.target is operator.mul and _number(a) and not _number(s):
            a, s = s, a
        if not (_number(s) and hasattr(a, "op") and _is_linear(gm, a) and len(a.users) == 1):
            continue
        mod = dict(gm.named_modules())[a.target]
        op = node.target
        with g.inserting_before(node):
            w = g.call_function(op, (g.get_attr(f"{a.target}.weight"), s))
            b = g.call_function(op, (g.get_attr(f"{a.target}.bias"), s)) if mod.bias is not None else None
            y = g.call_function(torch.nn.functional.linear, (a.args[0], w, b))
        node.replace_all_uses_with(y)
        g.erase_node(node)
        g.erase_node(a)
        n_done += 1
    return n_done


def rewrite_scalar_chain(gm: Any) -> int:
    g = gm.graph
    n_done = 0
    for node in list(g.nodes):
        if node.op != "call_function" or node.target not in (operator.mul, operator.truediv) or len(node.args) != 2:
            continue
        inner, b = node.args
        if not (_number(b) and hasattr(inner, "op") and inner.op == "call_function" and len(inner.users) == 1
                and inner.target in (operator.mul, operator.truediv) and len(inner.args) == 2 and _number(inner.args[1])):
            continue
        t, a = inner.args
        if inner.target is operator.mul:
            new_op, k = (operator.mul, a * b) if node.target is operator.mul else (operator.mul, a / b)
        else:
            if node.target is not operator.truediv:
                continue
            new_op, k = operator.truediv, a * b
        with g.inserting_before(node):
            y = g.call_function(new_op, (t, k))
        node.replace_all_uses_with(y)
        g.erase_node(node)
        g.erase_node(inner)
        n_done += 1
    return n_done


def rewrite_addmm_relu(gm: Any) -> int:
    import torch

    g = gm.graph
    n_done = 0
    for node in list(g.nodes):
        is_relu = (node.op == "call_function" and node.target in (torch.relu, torch.nn.functional.relu)) or (
            node.op == "call_method" and node.target == "relu") or (
            node.op == "call_module" and isinstance(dict(gm.named_modules()).get(node.target), torch.nn.ReLU))
        if not is_relu or not node.args or not hasattr(node.args[0], "op") or not _is_linear(gm, node.args[0]):
            continue
        lin = node.args[0]
        mod = dict(gm.named_modules())[lin.target]
        if len(lin.users) != 1 or mod.bias is None or node.kwargs.get("inplace"):
            continue
        shape = _shape(lin.args[0]) if hasattr(lin.args[0], "meta") else None
        if shape is None:
            continue
        with g.inserting_before(node):
            x = lin.args[0]
            flat = g.call_method("reshape", (x, -1, shape[-1])) if len(shape) != 2 else x
            wt = g.call_method("t", (g.get_attr(f"{lin.target}.weight"),))
            y = g.call_function(torch._addmm_activation, (g.get_attr(f"{lin.target}.bias"), flat, wt))
            if len(shape) != 2:
                y = g.call_method("reshape", (y, *shape[:-1], mod.out_features))
        node.replace_all_uses_with(y)
        g.erase_node(node)
        g.erase_node(lin)
        n_done += 1
    return n_done


REWRITES: dict[str, tuple[str, Callable[[Any], int]]] = {
    "linear-sum": ("graph", rewrite_linear_sum),
    "linear-scale": ("graph", rewrite_linear_scale),
    "scalar-chain": ("graph", rewrite_scalar_chain),
    "addmm-epilogue": ("library", rewrite_addmm_relu),
}


def apply_rewrites(gm: Any, names: list[str]) -> tuple[Any, list[str]]:
    """A rewritten copy of `gm` and the names of the rewrites that changed it."""
    out = _copy(gm)
    done = []
    for name in names:
        if REWRITES[name][1](out) > 0:
            done.append(name)
    out.graph.lint()
    out.recompile()
    return out, done


def forward_code(gm: Any) -> str:
    """The rewritten forward as source; refuses code that needs globals a standalone file lacks."""
    pc = gm.graph.python_code(root_module="self")
    extra = set(pc.globals) - ALLOWED_GLOBALS
    if extra:
        raise GraphUnavailable(f"the rewritten forward needs globals {sorted(extra)}")
    return str(pc.src).strip("\n") + "\n"


class FxRewrites:
    """One proposer per space: `graph` (the algebraic identities) and `library` (the epilogue form)."""

    def __init__(self, space: str, name: str) -> None:
        self.space, self.name = space, name
        self.rewrites = [n for n, (s, _) in REWRITES.items() if s == space]

    def propose(self, state: SearchState) -> list[TaskCandidate]:
        base = base_params(state)
        if base is None:
            state.note(self.name, "the parent is not a configuration of the task's model")
            return []
        try:
            gm, _ = _trace(str(state.task.path), state.task.spec.sha256)
        except GraphUnavailable as exc:
            state.note(self.name, str(exc))
            return []
        already = list(base.get("graph_rewrites", []))
        todo = [r for r in self.rewrites if r not in already]
        applicable = []
        for r in todo:
            _, done = apply_rewrites(gm, [*already, r])
            if r in done:
                applicable.append(r)
        if not applicable:
            state.note(self.name, f"no {'/'.join(self.rewrites)} pattern in the task's graph")
            return []
        combos = [[r] for r in applicable] + ([applicable] if len(applicable) > 1 else [])
        out = []
        parent = state.parent or state.incumbent
        for combo in combos:
            names = [*already, *combo]
            new, done = apply_rewrites(gm, names)
            try:
                code = forward_code(new)
            except GraphUnavailable as exc:
                state.note(self.name, str(exc))
                continue
            params = {**base, "graph_rewrites": done, "graph_forward": code}
            out.append(render(state.task, params, space=self.space, proposer=self.name, parent=parent.key,
                              description=describe(params)))
        return out


def graph_proposers() -> list[Any]:
    return [FxRewrites("graph", "fx-identities"), FxRewrites("library", "addmm-epilogue")]
