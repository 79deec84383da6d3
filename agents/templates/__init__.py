"""Custom Triton kernel templates for the optimizer: pattern matching on a task's graph, schedule spaces, and
standalone `ModelNew` sources.

    from kstrata.agents.templates import match, analyse
    for m in match(task):                      # task: kstrata.agents.tasks.Task (load_task(path))
        m.schedule_space()                     # {"BLOCK": (512, 1024, ...), "num_warps": (4, 8), ...}
        source = m.render({"BLOCK": 2048})     # a complete KernelBench ModelNew file: imports torch and triton
    analyse(task).rejected                     # the templates that do not apply, each with its reason

The graph is the task's `Model` traced by `torch.fx` on the meta device (`graph.trace`) and read as
`epilogue(core(prologue(head(inputs))))` (`graph.chain`): at most one library op (convolution, linear,
matmul, scaled_dot_product_attention) left to PyTorch — cuDNN/cuBLAS, with TF32 off under the default `strict` policy —, then one
template kernel or kernel pair for the rest; `gemm`, `attention` and `conv` instead compute the library op
themselves, its epilogue fused into their store:

| template   | covers                                                                          | module        |
|------------|---------------------------------------------------------------------------------|---------------|
| pointwise  | chains of elementwise ops with broadcasting (activations, scalings, residuals)  | `pointwise`   |
| norm       | LayerNorm over trailing dims, GroupNorm; fused rows or split rows (Welford)     | `norm`        |
| softmax    | softmax / log-softmax over the last dim; fused rows or split rows (online)      | `softmax`     |
| pool2d     | 2-D max / average pooling (stride, padding, dilation, count_include_pad)        | `pool`        |
| pool1d     | 1-D max / average pooling: pool2d's kernel over (planes, L) with a (1, k) window | `pool1d`      |
| pool3d     | 3-D max / average pooling: pool2d's kernels per output depth, depth window unrolled | `pool3d`   |
| reduce     | sum / mean / amax / logsumexp over one run of consecutive dims                  | `reduce`      |
| gemm       | linear / matmul / bmm (batch dims, shared operands) + pointwise epilogue; fp16/bf16, fp32 under tf32 | `gemm` |
| gemm_reduce | linear / 2-D matmul + pointwise + sum/mean/amax/logsumexp over the output features + pointwise; the product never written | `gemm_reduce` |
| attention  | flash forward of scaled_dot_product_attention (causal or not, any scale, GQA read in place, bool/additive attn_mask) + epilogue; same dtypes | `attention` |
| conv       | conv2d (NCHW, any stride/padding/dilation, groups=1) as an implicit GEMM + epilogue, or + GroupNorm (partials fused); fp32 IEEE under strict | `conv` |

Each accepts pointwise ops before and after its core, fused into its loads and stores. Autotuning on a
GPU (`tune.autotune`) times a match's schedules and caches the best by template, shapes, dtypes, policy,
device and Triton version; on a CPU the templates are checked for correctness only (the Triton
interpreter). `proposer.TemplateProposer` offers the tuned sources to the optimizer.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from kstrata.agents.tasks import Task
from kstrata.agents.templates import (
    attention,
    conv,
    gemm,
    gemm_norm,
    gemm_reduce,
    norm,
    pointwise,
    pool,
    pool1d,
    pool3d,
    reduce,
    softmax,
)
from kstrata.agents.templates.base import Params, Rejection, TemplateMatch, nearest_valid
from kstrata.agents.templates.codegen import FLOAT_DTYPES, POLICIES, render_source
from kstrata.agents.templates.graph import Chain, GraphError, Node, chain, sdpa_options, trace

__all__ = ["TEMPLATES", "Analysis", "Params", "Rejection", "TemplateMatch", "analyse", "match"]

#: The template families, in the order a proposer tries them.
TEMPLATES: tuple[ModuleType, ...] = (norm, softmax, pool, pool1d, pool3d, reduce, gemm, gemm_reduce, gemm_norm, attention, conv,
                                     pointwise)


@dataclass(frozen=True)
class Analysis:
    """What the templates make of one task: the instances that apply and, for the others, why not."""

    task: str
    matches: tuple[TemplateMatch, ...]
    rejected: tuple[Rejection, ...]


def _shape_key(c: Chain, policy: str) -> str:
    ins = ",".join(f"{n.name}:{n.dtype}{list(n.shape)}" for n in c.graph.inputs)
    return f"{ins}->{c.out_dtype}{list(c.out_shape)}|{policy}"


def _space_of(mod: ModuleType, c: Chain) -> tuple[tuple[tuple[str, tuple[object, ...]], ...], tuple[tuple[str, object], ...]]:
    if hasattr(mod, "space"):
        return mod.space(c)  # type: ignore[no-any-return]
    return mod.SPACE, mod.DEFAULT


def analyse(task: Task, policy: str = "strict") -> Analysis:
    """Match every template against the task's graph."""
    if policy not in POLICIES:
        raise ValueError(f"templates render for policies {POLICIES}, not {policy!r}")
    names = [m.NAME for m in TEMPLATES]
    try:
        c = chain(trace(task))
    except GraphError as e:
        return Analysis(task.name, (), tuple(Rejection(n, str(e)) for n in names))
    # a boolean input is admitted as the attention's attn_mask only (the attention template reads it)
    mask = sdpa_options(c.head)["attn_mask"] if c.head is not None and c.head.op == "attention" else None
    if isinstance(mask, Node) and mask.op == "transpose":
        mask = mask.args[0]
    dtypes = {n.dtype for n in c.graph.inputs if not (n is mask and n.dtype == "bool")} | {c.out_dtype}
    if not dtypes <= set(FLOAT_DTYPES):
        why = f"dtypes {sorted(dtypes)}: templates take float32/float16/bfloat16 tensors"
        return Analysis(task.name, (), tuple(Rejection(n, why) for n in names))
    matches: list[TemplateMatch] = []
    rejected: list[Rejection] = []
    path = Path(task.path)
    for mod in TEMPLATES:
        why = mod.applies(c, policy)
        if why is not None:
            rejected.append(Rejection(mod.NAME, why))
            continue
        try:
            sp, default = _space_of(mod, c)
            def render(params: Params, pol: str, mod: ModuleType = mod) -> str:
                return render_source(c, mod.kernel(c, params, pol), path)

            def valid(params: Params, mod: ModuleType = mod) -> bool:
                return bool(mod.valid(c, params)) if hasattr(mod, "valid") else True

            hints = tuple(tuple(h.items()) for h in mod.hints(c)) if hasattr(mod, "hints") else ()
            start = nearest_valid(sp, dict(default), valid)  # a default the shapes rule out: the closest valid one
            if start is None:
                raise GraphError(f"no schedule of its space is valid for {c.core_shape}")
            default = tuple(start.items())
            m = TemplateMatch(mod.NAME, path, mod.description(c, policy), sp, default, policy, _shape_key(c, policy), c,
                              render, valid, hints)
            m.render()  # a match whose default schedule does not render is a rejection, with the reason
        except GraphError as e:
            rejected.append(Rejection(mod.NAME, str(e)))
            continue
        matches.append(m)
    return Analysis(task.name, tuple(matches), tuple(rejected))


def match(task: Task, policy: str = "strict") -> list[TemplateMatch]:
    """The template instances that cover the task's graph (empty when none does: see `analyse`)."""
    return list(analyse(task, policy).matches)
