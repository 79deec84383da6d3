"""Prompts per implementation space, built from what the optimizer knows.

A conversation starts with a system message (the role, the rules every candidate obeys, the format
the space accepts: see `parse.FORMATS_BY_SPACE`) and one user message holding, in this order: the
contract (the task's source, inputs, outputs, FLOPs, bytes, the precision policy), the incumbent's code
(a ModelNew file) or the IR/assembly hot window, the profiler's findings as text, the retrieved skills,
and the search memory's conclusions. Each refinement turn appends the model's answer and one user
message with the last attempt's failure: the parse error, the compiler error, the first differing
element, or the timing, and asks for a corrected answer in the same format.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .parse import FORMATS_BY_SPACE

Message = dict[str, str]

#: How much of a long text (incumbent, hot window) goes into a prompt.
MAX_SECTION_CHARS = 24_000

_FORMAT_RULES = {
    "model_new": ("A whole Python file in ONE ```python block defining `class ModelNew(torch.nn.Module)` with the "
                  "same constructor arguments and forward signature as the task's `Model`. It imports only torch, "
                  "triton (triton.language as tl) and the standard modules math, functools, typing; never kstrata, "
                  "os, sys, subprocess or network modules; it does not read or write files."),
    "triton_kernel": ("Or: ONE ```python block holding exactly one `@triton.jit` function with the same name and "
                      "parameters as a kernel of the incumbent; it replaces that kernel, the rest of the file stays."),
    "xdsl_pass": ("ONE ```xdsl-pass block: Python source of one class deriving from "
                  "`kstrata.passes.base.KernelPass`, a frozen dataclass with `name`, `level` ('ttir' or 'ttgir') and "
                  "`apply(self, ctx) -> PassResult` returning the new text of the level (ctx.text is the current "
                  "text); it may use xdsl and kstrata.ir; the result must still be accepted by Triton's parser."),
    "asm_patch": ("ONE ```asm-patch block in kstrata's anchored patch format: first line `# kstrata asm patch v1`, "
                  "then `level: ptx` (or amdgcn), `kernel: NAME`, `description: ...`, then hunks starting with "
                  "`@@ LABEL` whose lines start with ' ' (context), '-' (removed) or '+' (added); context and "
                  "removed lines must match the hot window exactly once. The kernel's parameters, launch bounds and "
                  "shared memory must not change."),
    "pipeline": ("ONE ```pipeline block with one line: a kstrata pass pipeline such as "
                 "`ttgir(num-stages{n=4})` or `ttir(load-eviction{policy=evict_last}),llir(noalias-args{assume=true})`; "
                 "only passes from the catalogue below."),
}

_SPACE_GOALS = {
    "library": "Make the task faster through library and runtime choices (cuDNN/cuBLAS forms, channels-last, "
               "SDPA backends, CUDA graphs) in PyTorch code.",
    "compiler": "Make the task faster through torch.compile / Inductor configuration in the ModelNew file.",
    "graph": "Make the task faster by an exact rewrite of its computation graph (algebraic identities, folded "
             "constants, fused ops) in PyTorch code.",
    "triton": "Make the task faster with custom Triton kernels (fused, tiled, vectorised) called from ModelNew.",
    "ir": "Make the incumbent's Triton kernel faster by rewriting its TTIR/TTGIR with kstrata passes.",
    "asm": "Make the incumbent's kernel faster with a small, reviewable assembly patch of its hot window.",
}


@dataclass(frozen=True)
class PromptContext:
    """What one proposal request knows; every field but `space` and `task_name` may be empty."""

    space: str
    task_name: str
    contract: str = ""
    incumbent: str | None = None  # the incumbent ModelNew (or the task's Model) source
    hot_window: str | None = None  # IR or assembly text of the hot region
    hot_level: str | None = None
    findings: tuple[str, ...] = ()
    skills: tuple[str, ...] = ()  # rendered skills, best first
    memory: tuple[str, ...] = ()  # the search memory's conclusions ("split-K 4 on this GEMM: 1.3x")
    catalogue: tuple[str, ...] = ()  # pass names and one-line descriptions, for the ir space
    policy: str = "strict"
    device: str = "cuda"


@dataclass(frozen=True)
class Feedback:
    """Why the last attempt failed (or how fast it was), fed back as the next user turn."""

    stage: str  # parse | sandbox | compile | correctness | integrity | timing | engine
    text: str
    details: dict[str, Any] = field(default_factory=dict)


def _clip(text: str, limit: int = MAX_SECTION_CHARS) -> str:
    if len(text) <= limit:
        return text
    head = limit * 2 // 3
    return text[:head] + f"\n... [{len(text) - limit} characters omitted] ...\n" + text[-(limit - head):]


def system_prompt(space: str) -> str:
    formats = FORMATS_BY_SPACE[space]
    rules = "\n".join(f"- {_FORMAT_RULES[f]}" for f in formats)
    return (
        "You are a GPU performance engineer working inside kstrata, which verifies every candidate "
        "(hardened correctness checks on fresh inputs, integrity checks) before it is timed.\n"
        f"Goal: {_SPACE_GOALS[space]}\n"
        "Rules: compute exactly what the task computes for every input (no caching by pointer or shape, no "
        "constant outputs, no work left on another stream or thread, no writes to the inputs, no lower "
        "precision than the policy allows). Say in at most three sentences what you changed and why, then "
        "give the answer in exactly this form:\n" + rules
    )


def user_prompt(ctx: PromptContext) -> str:
    parts = [f"# Task `{ctx.task_name}` (space: {ctx.space}, precision policy: {ctx.policy}, device: {ctx.device})"]
    if ctx.contract:
        parts.append("## Contract\n" + _clip(ctx.contract))
    if ctx.incumbent:
        parts.append("## Incumbent (the code to beat)\n```python\n" + _clip(ctx.incumbent).rstrip() + "\n```")
    if ctx.hot_window:
        parts.append(f"## Hot window ({ctx.hot_level or 'ir'})\n```\n" + _clip(ctx.hot_window).rstrip() + "\n```")
    if ctx.catalogue:
        parts.append("## Pass catalogue\n" + "\n".join(f"- {c}" for c in ctx.catalogue))
    parts.append("## Profiler findings\n" + ("\n".join(f"- {f}" for f in ctx.findings) if ctx.findings
                                             else "- none (no profile available)"))
    if ctx.skills:
        parts.append("## Skills that worked before (verified)\n" + "\n\n".join(ctx.skills))
    if ctx.memory:
        parts.append("## What this search already learned\n" + "\n".join(f"- {m}" for m in ctx.memory))
    parts.append("Answer with one candidate in the required format.")
    return "\n\n".join(parts)


def initial_messages(ctx: PromptContext) -> list[Message]:
    return [{"role": "system", "content": system_prompt(ctx.space)}, {"role": "user", "content": user_prompt(ctx)}]


def feedback_message(fb: Feedback, space: str) -> Message:
    head = {"parse": "Your answer could not be used", "sandbox": "Your code failed before it could be checked",
            "compile": "Your code failed to import or compile", "correctness": "Your candidate computes a different result",
            "integrity": "Your candidate was rejected by an integrity check", "timing": "Your candidate is correct; its timing",
            "engine": "Your candidate was rejected"}.get(fb.stage, "Your candidate was rejected")
    return {"role": "user", "content": f"{head}:\n{_clip(fb.text, 6000)}\n\nFix it and answer again in the same "
                                       f"format (one {', '.join(FORMATS_BY_SPACE[space])} answer)."}


def conversation(ctx: PromptContext, turns: Sequence[tuple[str, Feedback]]) -> list[Message]:
    """The whole conversation so far: the opening, then each (assistant answer, feedback) pair."""
    msgs = initial_messages(ctx)
    for answer, fb in turns:
        msgs.append({"role": "assistant", "content": answer})
        msgs.append(feedback_message(fb, ctx.space))
    return msgs


def contract_text(spec: Any, task_source: str | None = None, policy: str = "strict") -> str:
    """The contract as a model reads it, from a `kstrata.agents.tasks.TaskSpec` (duck-typed) and the source."""
    lines: list[str] = []
    if task_source:
        lines.append("Task file:\n```python\n" + _clip(task_source, 12_000).rstrip() + "\n```")
    if spec is not None:
        def arg(a: Any) -> str:
            if getattr(a, "kind", "") == "tensor":
                return (f"{a.name}: {a.dtype}{list(a.shape)}" + ("" if a.contiguous else " (non-contiguous)"))
            return f"{a.name}: {getattr(a, 'type', '?')} = {getattr(a, 'value', '?')!r}"
        lines.append("Inputs: " + "; ".join(arg(a) for a in spec.inputs))
        lines.append("Outputs (shapes, dtypes and contiguity must stay): " + "; ".join(arg(a) for a in spec.outputs))
        lines.append(f"FLOPs {spec.flops:,}; minimum bytes moved {spec.min_bytes:,}; arithmetic intensity "
                     f"{spec.arithmetic_intensity:.2f} FLOP/byte")
    lines.append(f"Precision policy: {policy} " + ("(fp32 stays IEEE fp32: no TF32, no bf16/fp16 downcasts)"
                                                  if policy == "strict" else f"({policy} arithmetic allowed)"))
    lines.append("Outputs must not alias the inputs; results must be deterministic.")
    return "\n".join(lines)
