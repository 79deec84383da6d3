"""Configuration candidates: one renderer from a parameter dict to a standalone ModelNew source.

The baselines, the library space, the compiler space and the graph space all describe a candidate as a
*configuration* of the task's own model, so refinements compose (a graph rewrite, compiled with some
Inductor options, under cudnn.benchmark, replayed through a CUDA graph). Parameters (all optional):

- `compile`: None (eager) or {"mode": str | None, "options": {inductor option: value}}
- `graph_forward`: a rewritten `def forward(self, ...)` (torch.fx code; see graph.py), `graph_rewrites`: names
- `cudnn_benchmark`, `channels_last`, `cuda_graph`, `tf32`: bool
- `torch_defaults`: bool: leave PyTorch's precision switches as they are (TF32 cuDNN convolutions by
  default) instead of IEEE fp32: `kstrata bench` reports the baselines as PyTorch users run them
- `sdpa`: None or an SDPBackend name (FLASH_ATTENTION, EFFICIENT_ATTENTION, CUDNN_ATTENTION, MATH)
- `autocast`: None, "bfloat16" or "float16" (outputs cast back to the reference's dtypes)
"""

from __future__ import annotations

import json
from typing import Any

from kstrata.agents.cuda_graphs import GRAPH_HELPER as _GRAPH_HELPER
from kstrata.agents.cuda_graphs import MAP_HELPER as _HELPERS
from kstrata.agents.optimize.candidate import TaskCandidate
from kstrata.agents.optimize.codegen import GRAPH_PRELUDE, wrapper_source
from kstrata.agents.optimize.state import TaskInfo
from kstrata.agents.tasks import TensorSpec


def baseline_params(name: str) -> dict[str, Any]:
    if name == "eager":
        return {}
    if name == "compile":
        return {"compile": {"mode": None, "options": {}}}
    if name == "compile-max-autotune":
        return {"compile": {"mode": "max-autotune", "options": {}}}
    raise ValueError(f"unknown baseline {name!r}")


#: torch.compile modes that run the compiled graph under Inductor's CUDA graph trees.
GRAPHED_MODES = ("reduce-overhead", "max-autotune")
#: each graphed mode's twin without the graph trees (the same kernels, launched one by one)
UNGRAPHED_MODE = {"reduce-overhead": None, "max-autotune": "max-autotune-no-cudagraphs"}


def without_inductor_graphs(params: dict[str, Any]) -> dict[str, Any]:
    """The configuration with Inductor's CUDA graph trees turned off and everything else kept (the mode's
    ungraphed twin, `triton.cudagraphs` dropped); the same configuration when it has none."""
    c = params.get("compile")
    if not c or not inductor_graphs(params):
        return dict(params)
    options = {k: v for k, v in (c.get("options") or {}).items() if k != "triton.cudagraphs"}
    mode = UNGRAPHED_MODE.get(c.get("mode"), c.get("mode"))
    return {**params, "compile": {**c, "mode": mode, "options": options}}


def inductor_graphs(params: dict[str, Any]) -> str:
    """Why the configuration already runs under Inductor's CUDA graph trees ('' when it does not): a CUDA graph
    around it cannot be captured (on the H200, 2026-12-03: "Cannot prepare for replay during capturing stage"),
    and turning `triton.cudagraphs` on again changes nothing."""
    c = params.get("compile")
    if not c:
        return ""
    if c.get("mode") in GRAPHED_MODES:
        return f"it runs under Inductor's CUDA graphs already (torch.compile mode={c['mode']})"
    if c.get("options", {}).get("triton.cudagraphs"):
        return "it runs under Inductor's CUDA graphs already (triton.cudagraphs=True)"
    return ""


_MODE_OPTIONS_HELPER = '''
def _kstrata_compile_options(mode, options):
    """torch.compile takes a mode or an options dict, never both: the mode's own options, then these."""
    from torch._inductor import list_mode_options

    return {**list_mode_options(mode), **options}
'''.strip("\n").splitlines()


def _py(value: Any) -> str:
    return json.dumps(value, sort_keys=True).replace("true", "True").replace("false", "False")


def _compile_args(c: dict[str, Any]) -> str:
    """The keyword arguments of `torch.compile` for a `compile` parameter: a mode alone, options alone, or
    (both given) the options dict that the mode stands for, updated with the options (torch.compile raises
    "Either mode or options can be specified" for both; `torch._inductor.list_mode_options(mode)` is what
    the mode applies, read by the candidate's own torch when it compiles)."""
    mode, options = c.get("mode"), c.get("options")
    if mode and options:
        return f"options=_kstrata_compile_options({mode!r}, {_py(options)})"
    if mode:
        return f"mode={mode!r}"
    if options:
        return f"options={_py(options)}"
    return ""


def describe(params: dict[str, Any]) -> str:
    parts = []
    if params.get("graph_rewrites"):
        parts.append("fx: " + "+".join(params["graph_rewrites"]))
    c = params.get("compile")
    if c is None:
        parts.append("eager")
    else:
        s = "torch.compile"
        if c.get("mode"):
            s += f" mode={c['mode']}"
        if c.get("options"):
            s += " " + ",".join(f"{k}={v}" for k, v in sorted(c["options"].items()))
        parts.append(s)
    for flag in ("cudnn_benchmark", "channels_last", "cuda_graph", "tf32", "torch_defaults"):
        if params.get(flag):
            parts.append(flag.replace("_", "-"))
    if params.get("sdpa"):
        parts.append(f"sdpa={params['sdpa']}")
    if params.get("autocast"):
        parts.append(f"autocast={params['autocast']}")
    return "; ".join(parts)


def render(task: TaskInfo, params: dict[str, Any], *, space: str, proposer: str, policy: str = "strict",
           description: str | None = None, parent: str | None = None) -> TaskCandidate:
    init: list[str] = []
    helpers: list[str] = list(_HELPERS)
    if params.get("graph_forward"):
        helpers = [*GRAPH_PRELUDE, "", *helpers]
        helpers += ["", "", "class _Rewritten(Model):", *["    " + ln if ln else "" for ln in
                                                          params["graph_forward"].strip("\n").splitlines()]]
        init.append("self.model.__class__ = _Rewritten  # the same module, with the rewritten forward")
    if params.get("cudnn_benchmark"):
        init.append("torch.backends.cudnn.benchmark = True")
    if params.get("torch_defaults"):
        pass  # PyTorch's own precision defaults, whatever this process has
    elif params.get("tf32"):
        init += ["torch.backends.cuda.matmul.allow_tf32 = True", "torch.backends.cudnn.allow_tf32 = True"]
    else:
        # IEEE fp32, as the strict policy's reference runs: PyTorch's default makes fp32 convolutions TF32.
        init += ["torch.backends.cuda.matmul.allow_tf32 = False", "torch.backends.cudnn.allow_tf32 = False"]
    if params.get("channels_last"):
        init.append("self.model = self.model.to(memory_format=torch.channels_last)")
    fwd: list[str] = []
    if params.get("channels_last"):
        fwd.append("inputs = tuple(x.contiguous(memory_format=torch.channels_last) if isinstance(x, torch.Tensor) "
                   "and x.dim() == 4 else x for x in inputs)")
    c = params.get("compile")
    if c is not None and c.get("mode") and c.get("options"):
        helpers += ["", "", *_MODE_OPTIONS_HELPER]
    if c is None:
        fwd.append("call = self.model")
    else:
        fwd += ["call = self._state.get('fn')", "if call is None:",
                f"    call = self._state['fn'] = torch.compile(self.model{', ' + _compile_args(c) if _compile_args(c) else ''})"]
    wrap: list[str] = []  # context managers around the call
    if params.get("sdpa"):
        helpers = ["from torch.nn.attention import SDPBackend, sdpa_kernel", "", *helpers]
        wrap.append(f"sdpa_kernel(SDPBackend.{params['sdpa']})")
    if params.get("autocast"):
        wrap.append(f"torch.autocast(device_type=self._state.setdefault('dev', next((x.device.type for x in inputs "
                    f"if isinstance(x, torch.Tensor)), 'cuda')), dtype=torch.{params['autocast']})")
    body: list[str]
    if params.get("cuda_graph"):
        helpers += ["", "", *_GRAPH_HELPER]
        body = ["graphs = self._state.get('graphs')",
                "if graphs is None or graphs.call is not call:",
                "    graphs = self._state['graphs'] = _KstrataGraphs(call, self.model)",
                "out = graphs(*inputs)"]
    else:
        body = ["out = call(*inputs)"]
    if wrap:
        fwd.append(f"with {', '.join(wrap)}:")
        fwd += ["    " + ln for ln in body]
    else:
        fwd += body
    if params.get("autocast"):
        dtype = next((o.dtype for o in task.spec.outputs if isinstance(o, TensorSpec)), "float32")
        fwd.append(f"out = _kstrata_map(out, lambda t: t.to(torch.{dtype}) if t.is_floating_point() else t)")
    if params.get("channels_last"):
        fwd.append("out = _kstrata_map(out, lambda t: t.contiguous())  # the reference's layout")
    if inductor_graphs(params):
        fwd.append("out = _kstrata_map(out, lambda t: t.clone())  # cudagraph trees reuse output buffers")
    fwd.append("return out")
    desc = description or describe(params)
    src = wrapper_source(task.name, task.source, policy=policy, space=space, proposer=proposer, description=desc,
                         params={k: v for k, v in params.items() if k != "graph_forward"}, forward=fwd, init=init,
                         helpers=helpers)
    return TaskCandidate(src, space, proposer, desc, dict(params), policy, parent)
