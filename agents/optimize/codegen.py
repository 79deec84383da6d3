"""Standalone `ModelNew` sources: the shapes the built-in proposers (and plugins, if they like) need.

A generated file is KernelBench format and imports torch (and triton when it has kernels), never kstrata:

    # kstrata optimize: <task>              <- header: policy, space, edit, and (when chosen) the measured speedup
    import torch ...
    <the task file, verbatim but for its `if __name__ == "__main__":` block>
    class ModelNew(nn.Module | Model): ...

`ModelNew(*get_init_inputs())` builds the task's own `Model(*args)` first thing, so under the harness's
seed it draws the same weights as the reference. Two forms:

- `wrapper_source`: `self.model = Model(*args)` and a forward written around it (compile, CUDA graphs,
  library switches);
- `subclass_source`: `class ModelNew(Model)` with a new `forward` (torch.fx rewrites: the generated code
  refers to the model's own submodules as `self.<name>`).
"""

from __future__ import annotations

import ast
import json
from collections.abc import Sequence
from typing import Any

HEADER_FIRST = "# kstrata optimize: "
#: Module-level names a torch.fx-generated forward may use (graph.py refuses code that needs others).
GRAPH_PRELUDE = ["from math import inf, nan", "from torch import device", "import torch.fx._pytree as fx_pytree",
                 "import torch.utils._pytree as pytree", "NoneType = type(None)"]
MEASURED_MARK = "# measured: "
_PRELUDE = ("import torch", "import torch.nn as nn")


def task_body(task_source: str) -> str:
    """The task file's text without its top-level `if __name__ == "__main__":` blocks."""
    try:
        tree = ast.parse(task_source)
    except SyntaxError:
        return task_source
    lines = task_source.splitlines()
    drop: set[int] = set()
    for node in tree.body:
        if isinstance(node, ast.If) and "__name__" in ast.unparse(node.test):
            drop.update(range(node.lineno - 1, (node.end_lineno or node.lineno)))
    return "\n".join(line for i, line in enumerate(lines) if i not in drop).rstrip() + "\n"


def header(task: str, *, policy: str, space: str, proposer: str, description: str, params: dict[str, Any]) -> list[str]:
    return [f"{HEADER_FIRST}{task}",
            f"# precision policy: {policy}" + ("" if policy == "strict" else " (lower precision admitted: asked for)"),
            f"# space: {space}; proposer: {proposer}",
            f"# edit: {description}",
            f"# parameters: {json.dumps(params, sort_keys=True)}",
            f"{MEASURED_MARK}(not yet measured)",
            "# standalone: imports torch and triton only; ModelNew builds the task's Model first, so its weights are the reference's"]


def _indent(lines: Sequence[str], n: int) -> list[str]:
    pad = " " * n
    return [pad + line if line else "" for line in lines]


def wrapper_source(task_name: str, task_source: str, *, policy: str, space: str, proposer: str, description: str,
                   params: dict[str, Any], forward: Sequence[str], init: Sequence[str] = (),
                   prelude: Sequence[str] = (), helpers: Sequence[str] = ()) -> str:
    """`class ModelNew(nn.Module)` holding `self.model = Model(*args)`; `forward` lines see `self` and `inputs`.

    `self._state` is a plain dict (not a submodule) for compiled functions, graphs and static buffers."""
    out = header(task_name, policy=policy, space=space, proposer=proposer, description=description, params=params)
    out += ["", *_PRELUDE, *prelude, "", "# ---- the task, verbatim ----", task_body(task_source).rstrip(),
            "# ---- end of the task ----", ""]
    if helpers:
        out += [*helpers, ""]
    out += ["", "class ModelNew(nn.Module):",
            "    def __init__(self, *args, **kwargs):",
            "        super().__init__()",
            "        self.model = Model(*args, **kwargs)  # first: the same weights as the reference",
            "        self.__dict__['_state'] = {}",
            *_indent(init, 8), "",
            "    def forward(self, *inputs):",
            *_indent(forward, 8), ""]
    return "\n".join(out)


def subclass_source(task_name: str, task_source: str, *, policy: str, space: str, proposer: str, description: str,
                    params: dict[str, Any], forward_code: str, prelude: Sequence[str] = ()) -> str:
    """`class ModelNew(Model)` whose `forward` is `forward_code` (a complete `def forward(self, ...)`)."""
    out = header(task_name, policy=policy, space=space, proposer=proposer, description=description, params=params)
    out += ["", *_PRELUDE, *prelude, "", "# ---- the task, verbatim ----", task_body(task_source).rstrip(),
            "# ---- end of the task ----", "", "",
            "class ModelNew(Model):"]
    body = [line for line in forward_code.strip("\n").splitlines()]
    out += [*_indent(body, 4), ""]
    return "\n".join(out)


def set_measured(source: str, lines: Sequence[str]) -> str:
    """Replace the header's measured line by `lines` (each becomes a `# measured: ...` comment)."""
    new = [f"{MEASURED_MARK}{line}" for line in lines] or [f"{MEASURED_MARK}(nothing measured)"]
    out: list[str] = []
    done = False
    for line in source.splitlines():
        if not done and line.startswith(MEASURED_MARK):
            out.extend(new)
            done = True
        else:
            out.append(line)
    if not done:
        out = out[:1] + new + out[1:]
    return "\n".join(out) + ("\n" if source.endswith("\n") else "")


# The forward bodies of the baselines (and the compiler space, which passes other arguments).
EAGER_FORWARD = ["return self.model(*inputs)"]


def compiled_forward(compile_args: str) -> list[str]:
    """Compile the model on the first call (after the harness moved it to its device)."""
    return ["fn = self._state.get('fn')",
            "if fn is None:",
            f"    fn = self._state['fn'] = torch.compile(self.model{', ' + compile_args if compile_args else ''})",
            "return fn(*inputs)"]
