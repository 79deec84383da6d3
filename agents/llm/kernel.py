"""Kernel-level answers from a model: a pass pipeline, a generated xDSL pass or an assembly patch for one
compiled Triton kernel, judged by the compiled-kernel search like its own candidates.

The task-level proposers (`proposer.py`) ask for whole `ModelNew` files. The `ir` and `asm` spaces rewrite the
incumbent's *compiled* kernels, so their answers are engine candidates of one kernel: `KernelLLM` runs one
conversation per space for a kernel (`prompts` with the kernel's TTGIR or its PTX/AMDGCN hot window, the pass
catalogue, the findings, the skills, and what the search already tried), turns each parsed answer into an
engine edit, and hands it to the search's `evaluate` (`kstrata.agents.compiled.search`: the engine's build, the
gate on the kernel's launch record, the timing against the original), which makes it a `Trial` beside the
passes' own. Each failure goes back to the model as the next turn: the parse error, the build or rebuild
error, the first differing element, or "correct, 0.97x: not faster". Nothing here raises for a bad answer;
only a spent token budget ends the run early, and says so.

| format | engine edit |
|---|---|
| `pipeline` | `PipelineEdit(spec)` at its first stage's level |
| `xdsl_pass` | the pass is applied in a sandboxed child (`run_generated_pass`) to the kernel's TTIR or TTGIR; its output text becomes an `IrTextEdit` at that level |
| `asm_patch` | `AsmPatchEdit(text)` at `ptx` or `amdgcn` (checked to apply to the kernel's assembly when parsed) |

Where this runs: `kstrata optimize CACHE_DIR --launches RECORDS --llm` (the compiled-kernel optimizer) and
`kstrata optimize TASK --llm --llm-spaces ir,asm` (the task optimizer's `ir` space, on a GPU: it records the
incumbent's kernels and deploys the winners in `model_new.py`).
"""

from __future__ import annotations

import ast
import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .client import BudgetExhausted, LLMClient
from .parse import AsmPatchEdit, Edit, ParseFailure, PassSourceEdit, PipelineEdit
from .prompts import Feedback, PromptContext
from .proposer import Attempt, Conversation, ask, run_generated_pass

#: The prefix of a trial named after a model's answer that is not a pipeline.
LLM_LABEL = "llm:"
#: The spaces whose answers are kernel edits, and the levels of the kernel each shows the model.
KERNEL_SPACES = ("ir", "asm")
_SHOWN_LEVEL = {"ir": ("ttgir", "ttir"), "asm": ("ptx", "amdgcn")}


@dataclass(frozen=True)
class KernelView:
    """What the model is shown of one compiled kernel."""

    name: str
    target: str  # cuda:90, hip:gfx942
    entry: str  # its Triton cache entry (a file per level)
    share: float | None = None  # of the program's device time
    findings: tuple[str, ...] = ()
    #: (first line, last line) of the hot window in the assembly, 1-based, when one is known
    window: tuple[int, int] | None = None
    #: what the search learned on this kernel already ("ttgir(num-warps{n=2}): equivalent 1.215x")
    tried: tuple[str, ...] = ()

    def level_text(self, level: str) -> str | None:
        path = next((p for p in Path(self.entry).glob(f"*.{level}") if not p.name.startswith("__grp__")), None)
        return path.read_text() if path is not None else None


@dataclass
class KernelTry:
    """One answer's fate: the attempt (for the report) and the search's trial, when it got that far."""

    attempt: Attempt
    trial: Any = None


#: evaluate(edit, level, label, tolerance) -> the search's Trial for that engine candidate
Evaluate = Callable[[Any, str, str, "str | None"], Any]


def pass_catalogue(levels: Sequence[str], backend: str) -> tuple[str, ...]:
    """One line per registered pass at `levels` for `backend`: name, level, options, summary."""
    from kstrata.passes.registry import available_passes, get_pass

    lines = []
    for name in sorted(available_passes()):
        try:
            info = get_pass(name).describe()
        except Exception:  # a broken plugin pass is not offered
            continue
        if info["level"] not in levels or backend not in info.get("backends", (backend,)):
            continue
        opts = ", ".join(f"{k}: {v['type']} = {v['default']!r}" for k, v in info.get("options", {}).items())
        exact = "exact" if info.get("tolerance") is None else f"tolerance {info['tolerance']}"
        lines.append(f"{name} ({info['level']}; {exact}; options: {opts or 'none'}): {info.get('summary', '')}")
    return tuple(lines)


def _window_text(text: str, window: tuple[int, int] | None, margin: int = 20) -> str:
    if window is None:
        return text
    lines = text.splitlines()
    a, b = max(1, window[0] - margin), min(len(lines), window[1] + margin)
    return (f"(lines {a}-{b} of {len(lines)}; the hot window is {window[0]}-{window[1]})\n"
            + "\n".join(lines[a - 1:b]))


def kernel_context(space: str, k: KernelView, *, skills: Sequence[str] = (), policy: str = "strict",
                   device: str = "cuda") -> tuple[PromptContext, str | None]:
    """The prompt context for `space` on kernel `k`, and the assembly a patch must apply to (asm only)."""
    backend = k.target.split(":")[0]
    shown_level = next((lv for lv in _SHOWN_LEVEL[space] if k.level_text(lv) is not None), _SHOWN_LEVEL[space][0])
    text = k.level_text(shown_level) or ""
    asm_text = text if space == "asm" else None
    shown = _window_text(text, k.window) if space == "asm" else text
    contract = (f"Kernel `{k.name}` compiled by Triton for {k.target}"
                + (f", {k.share:.0%} of the program's GPU time" if k.share is not None else "") + ". "
                "Its launch ABI stays: the same parameters in the same order, the same grid, num_warps, "
                "shared memory and launch bounds unless a pass changes them itself. Your edit is rebuilt "
                "down to the binary, then run against the original on the kernel's recorded launch "
                "(fresh random and edge inputs, outputs poisoned, redzones, a determinism re-run); it must "
                "write the same bits (or stay within the tolerance a pass declares), then it is timed "
                "against the original.")
    levels = ("ttir", "ttgir", "llir") if space == "ir" else (("ptx",) if backend == "cuda" else ("amdgcn",))
    ctx = PromptContext(space=space, task_name=k.name, contract=contract, hot_window=shown, hot_level=shown_level,
                        findings=tuple(k.findings), skills=tuple(skills), memory=tuple(k.tried),
                        catalogue=pass_catalogue(levels, backend) if space == "ir" else (), policy=policy,
                        device=device)
    return ctx, asm_text


def _pass_level(source: str) -> str | None:
    """The `level = "..."` a generated pass class declares (read from its AST; nothing runs)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "level" for t in targets) and isinstance(node.value, ast.Constant):
                return str(node.value.value)
    return None


def _label(edit: Edit) -> str:
    """How the search names the answer's trial: a pipeline by its spec (the same trial as the passes' own
    candidate of that spec), anything else `llm:FORMAT:DIGEST` (no pipeline rebuilds it: see
    `compiled.search.pipeline_spec`)."""
    if isinstance(edit, PipelineEdit):
        return edit.spec
    body = getattr(edit, "text", None) or getattr(edit, "source", "")
    return f"{LLM_LABEL}{edit.format}:{hashlib.sha256(str(body).encode()).hexdigest()[:10]}"


def to_engine_edit(edit: Edit, k: KernelView, *, timeout_s: float = 120.0) -> tuple[Any, str, str | None] | Feedback:
    """The engine edit, its level and its tolerance for a parsed answer; or the feedback why there is none."""
    from kstrata.agents import engine as eng

    if isinstance(edit, PipelineEdit):
        from kstrata.passes.pipeline import parse_pipeline

        pipeline = parse_pipeline(edit.spec)
        tol = pipeline.tolerance()
        return eng.PipelineEdit(edit.spec), pipeline.stages[0].level, tol.spelling() if tol else None
    if isinstance(edit, AsmPatchEdit):
        return eng.AsmPatchEdit(edit.text), edit.level, None
    if isinstance(edit, PassSourceEdit):
        level = _pass_level(edit.source)
        if level not in ("ttir", "ttgir"):
            return Feedback("engine", f"the pass declares level {level!r}; a generated pass rewrites ttir or ttgir")
        text = k.level_text(level)
        if text is None:
            return Feedback("engine", f"kernel {k.name} has no {level} to rewrite")
        run = run_generated_pass(edit, text, level, kernel=k.name, target=k.target, timeout_s=timeout_s)
        if not run.ok or run.text is None:
            return Feedback("sandbox", f"the generated pass failed: {run.reason}")
        return eng.IrTextEdit(run.text), level, None
    return Feedback("parse", f"a {edit.format} answer is not a kernel edit in this space")


def trial_feedback(trial: Any, won: bool) -> tuple[str, Feedback]:
    """(outcome, feedback) of the search's trial for one answer: accepted, or why not in the model's terms."""
    status, reason = str(getattr(trial, "status", "")), str(getattr(trial, "reason", "") or "")
    speedup = getattr(trial, "speedup", None)
    if won:
        return "accepted", Feedback("accepted", f"equivalent and {speedup:.3f}x faster than the original on its launch")
    if status == "failed":
        return "rejected", Feedback("compile", f"the edit did not build: {reason}")
    if status in ("unchanged", "duplicate"):
        return "rejected", Feedback("engine", f"the edit changed nothing that matters: {reason or status}; change the "
                                              "kernel's code, not only its text")
    if status == "different":
        return "rejected", Feedback("correctness", f"the rewritten kernel computes a different result: {reason}")
    if status in ("error", "unproven"):
        return "rejected", Feedback("engine", f"the rewritten kernel could not be proven equivalent: {reason}")
    if status == "equivalent" and getattr(trial, "measured", False) and speedup is not None:
        return "rejected", Feedback("timing", f"equivalent, but {speedup:.3f}x the original's speed: not faster "
                                              "beyond the measured noise")
    if status == "equivalent":  # nothing can time it here (the CPU): correct is as far as it goes
        return "accepted", Feedback("accepted", "equivalent on its launch record; "
                                                + (getattr(trial, "unmeasured", None) or "not timed here"))
    return "rejected", Feedback("engine", f"{status}: {reason}")


@dataclass
class KernelLLM:
    """Kernel-level conversations for the spaces in `spaces` (see the module docstring)."""

    client: LLMClient
    spaces: tuple[str, ...] = ("ir",)
    max_turns: int | None = None
    library: Any = None  # a SkillLibrary
    skills_k: int = 3
    policy: str = "strict"
    #: every attempt of every kernel, for the trajectory and the report
    attempts: list[dict[str, Any]] = field(default_factory=list)
    exhausted: str | None = None

    def _skills(self, k: KernelView, space: str) -> list[str]:
        if self.library is None:
            return []
        from kstrata.agents.skills import skill_query

        q = skill_query(k.name, (), (), (*k.findings, space, k.target))
        return [s.render() for s in self.library.search(q, k=self.skills_k, space=space)]

    def __call__(self, k: KernelView, evaluate: Evaluate, wins: Callable[[Any], bool], *,
                 device: str = "cuda", out_of_time: Callable[[], bool] = lambda: False,
                 say: Callable[[str], None] = lambda s: None) -> list[KernelTry]:
        """Converse about kernel `k` in each space until an answer wins (or is proven equivalent where nothing
        is timed), the turns run out, the budget is spent or `out_of_time()`."""
        out: list[KernelTry] = []
        backend = k.target.split(":")[0]
        for space in self.spaces:
            if self.exhausted:
                break
            if space == "asm" and k.level_text("ptx" if backend == "cuda" else "amdgcn") is None:
                continue
            ctx, asm_text = kernel_context(space, k, skills=self._skills(k, space), policy=self.policy, device=device)
            conv = Conversation(ctx)
            turns = self.max_turns or self.client.config.max_turns
            for turn in range(1, turns + 1):
                if out_of_time():
                    break
                try:
                    chat, parsed = ask(self.client, conv, asm_text=asm_text)
                except BudgetExhausted as exc:
                    self.exhausted = str(exc)
                    out.append(self._note(k, space, Attempt(turn, "budget", "llm", str(exc))))
                    break
                if chat is None:
                    assert isinstance(parsed, ParseFailure)
                    out.append(self._note(k, space, Attempt(turn, "llm-error", "llm", parsed.reason)))
                    continue
                sha = hashlib.sha256(chat.text.encode()).hexdigest()
                if isinstance(parsed, ParseFailure):
                    out.append(self._note(k, space, Attempt(turn, "unparsable", "parse", parsed.reason, None, sha)))
                    conv.add(chat.text, Feedback("parse", parsed.reason))
                    continue
                made = to_engine_edit(parsed, k)
                if isinstance(made, Feedback):
                    out.append(self._note(k, space, Attempt(turn, "rejected", made.stage, made.text, parsed.format, sha)))
                    conv.add(chat.text, made)
                    continue
                edit, level, tolerance = made
                label = _label(parsed)
                trial = evaluate(edit, level, label, tolerance)
                outcome, fb = trial_feedback(trial, wins(trial))
                say(f"  {k.name}: LLM {space} turn {turn} ({parsed.format}): {outcome}: {fb.text[:160]}")
                out.append(self._note(k, space, Attempt(turn, outcome, fb.stage, fb.text, parsed.format, sha,
                                                        speedup=getattr(trial, "speedup", None)), trial))
                if outcome == "accepted":
                    break
                conv.add(chat.text, fb)
        return out

    def _note(self, k: KernelView, space: str, a: Attempt, trial: Any = None) -> KernelTry:
        self.attempts.append({"kernel": k.name, "space": space, **a.to_json(),
                              "trial": getattr(trial, "pipeline", None)})
        return KernelTry(a, trial)
