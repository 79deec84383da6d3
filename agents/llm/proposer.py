"""Multi-turn refinement with a model, and the LLM proposer for the optimizer's proposer interface.

A `Conversation` is one line of work with the model in one space for one task: the opening prompt
(`prompts.initial_messages`), then per turn the model's answer and the feedback on it. `refine` drives
it end to end: ask, parse strictly (`parse.parse_response`), check the edit with a `Checker`, and on a
failure send the reason back, up to `max_turns` turns. Nothing here raises for a bad answer: an empty,
truncated, malformed or off-format response, a client failure (timeouts, 429/5xx after the retries),
an import error, a wrong result or an integrity violation are all recorded as a failed `Attempt` with
its reason. Only a spent budget ends the conversation early (`stopped="budget"`), cleanly.

`EvalChecker` is the checker for task-level edits (a ModelNew file): the hardened evaluator
(`kstrata.agents.evaluate.evaluate`), with both worker processes in the sandboxed environment of
`sandbox.sandbox_env` (no network, limits, no API keys, scratch HOME), on the CPU or the GPU.
`run_generated_pass` runs a model's xDSL pass on an IR file in a sandboxed child.

`LLMProposer` implements `kstrata.agents.optimize.proposers.Proposer` (issue 13: `name`, `space`,
`propose(state) -> list[TaskCandidate]`; it must not evaluate). Format failures are refined inside
`propose` (no execution needed: the parser's reason goes straight back); execution failures come back
through `observe(candidate, check)` — which the loop calls after judging a candidate of this proposer —
or through `state.parent` when the search refines one of this proposer's nodes.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from .client import BudgetExhausted, ChatResult, LLMClient, LLMError
from .parse import Edit, ModelNewEdit, ParseFailure, PassSourceEdit, parse_response
from .prompts import Feedback, PromptContext, conversation
from .sandbox import SandboxLimits, run_python, sandbox_env


@dataclass(frozen=True)
class CheckOutcome:
    """A checker's judgement of one edit: accepted, or the feedback for the model."""

    accepted: bool
    feedback: Feedback
    verdict: dict[str, Any] | None = None  # JSON of the evaluator's verdict, when one ran
    speedup: float | None = None


class Checker(Protocol):
    def __call__(self, edit: Edit, turn: int) -> CheckOutcome: ...


@dataclass(frozen=True)
class Attempt:
    """One turn: what was asked of whom, what came back, and what became of it."""

    turn: int
    outcome: str  # accepted | rejected | unparsable | llm-error | budget
    stage: str  # llm | parse | compile | correctness | integrity | sandbox | timing | engine | accepted
    reason: str
    format: str | None = None
    response_sha256: str | None = None
    chat: dict[str, Any] | None = None
    verdict: dict[str, Any] | None = None
    speedup: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {"turn": self.turn, "outcome": self.outcome, "stage": self.stage, "reason": self.reason,
                "format": self.format, "response_sha256": self.response_sha256, "chat": self.chat,
                "verdict": self.verdict, "speedup": self.speedup}


@dataclass
class Conversation:
    """The prompt context and the (answer, feedback) turns so far."""

    ctx: PromptContext
    turns: list[tuple[str, Feedback]] = field(default_factory=list)

    def messages(self) -> list[dict[str, str]]:
        return conversation(self.ctx, self.turns)

    def add(self, answer: str, fb: Feedback) -> None:
        self.turns.append((answer, fb))


@dataclass
class RefineResult:
    space: str
    attempts: list[Attempt]
    accepted: Edit | None
    stopped: str  # accepted | turns | budget
    usage: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        acc = None
        if self.accepted is not None:
            acc = {"format": self.accepted.format,
                   "sha256": hashlib.sha256(_edit_text(self.accepted).encode()).hexdigest()}
        return {"space": self.space, "stopped": self.stopped, "accepted": acc,
                "attempts": [a.to_json() for a in self.attempts], "usage": self.usage}


def _edit_text(edit: Edit) -> str:
    if isinstance(edit, ModelNewEdit | PassSourceEdit):
        return edit.source
    return str(getattr(edit, "text", None) or getattr(edit, "spec", ""))


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def ask(client: LLMClient, conv: Conversation, *, incumbent: str | None = None,
        asm_text: str | None = None) -> tuple[ChatResult | None, Edit | ParseFailure]:
    """One request on `conv`; a client failure other than the budget becomes a `ParseFailure` of kind llm."""
    try:
        result = client.chat(conv.messages())
    except BudgetExhausted:
        raise
    except LLMError as exc:
        return None, ParseFailure(str(exc), "llm")
    parsed = parse_response(result.text, conv.ctx.space, incumbent=incumbent, asm_text=asm_text,
                            truncated=result.truncated)
    return result, parsed


def refine(client: LLMClient, ctx: PromptContext, checker: Checker, *, max_turns: int | None = None,
           incumbent: str | None = None, asm_text: str | None = None,
           on_attempt: Callable[[Attempt], None] | None = None) -> RefineResult:
    """Ask, parse, check, and feed failures back, until an edit is accepted or the turns run out."""
    turns = max_turns or client.config.max_turns
    conv = Conversation(ctx)
    attempts: list[Attempt] = []
    accepted: Edit | None = None
    stopped = "turns"

    def record(a: Attempt) -> None:
        attempts.append(a)
        if on_attempt:
            on_attempt(a)

    for turn in range(1, turns + 1):
        try:
            chat, parsed = ask(client, conv, incumbent=incumbent or ctx.incumbent, asm_text=asm_text)
        except BudgetExhausted as exc:
            record(Attempt(turn, "budget", "llm", str(exc)))
            stopped = "budget"
            break
        if chat is None:  # the endpoint failed: nothing to feed back, the next turn asks again
            assert isinstance(parsed, ParseFailure)
            record(Attempt(turn, "llm-error", "llm", parsed.reason))
            continue
        chat_json = chat.to_json() | {"text": None}
        sha = _sha(chat.text)
        if isinstance(parsed, ParseFailure):
            record(Attempt(turn, "unparsable", "parse", parsed.reason, None, sha, chat_json))
            conv.add(chat.text, Feedback("parse", parsed.reason))
            continue
        outcome = checker(parsed, turn)
        record(Attempt(turn, "accepted" if outcome.accepted else "rejected",
                       "accepted" if outcome.accepted else outcome.feedback.stage, outcome.feedback.text,
                       parsed.format, sha, chat_json, outcome.verdict, outcome.speedup))
        if outcome.accepted:
            accepted, stopped = parsed, "accepted"
            break
        conv.add(chat.text, outcome.feedback)
    return RefineResult(ctx.space, attempts, accepted, stopped, client.ledger.to_json())


# -- checking task-level edits ------------------------------------------------------------------------
_STAGE_BY_FAILURE = {"import": "compile", "mismatch": "correctness", "shape": "correctness",
                     "integrity": "integrity", "crash": "sandbox", "timeout": "sandbox", "flagged": "timing"}


def feedback_from_verdict(verdict: Any) -> Feedback:
    """The model's feedback from an `EvalVerdict`: the reason (with the first differing element, the
    compiler or import error), the log's last lines for crashes, and the timing when there was one."""
    stage = _STAGE_BY_FAILURE.get(verdict.failure or "", "engine")
    lines = [verdict.reason]
    if verdict.failure in ("import", "crash", "timeout") and verdict.log_tail:
        tail = [ln for ln in verdict.log_tail.strip().splitlines() if ln.strip()][-12:]
        lines.append("Last lines of the log:\n" + "\n".join(tail))
    if verdict.candidate_timing is not None and verdict.reference_timing is not None:
        lines.append(f"Timing: candidate {verdict.candidate_timing.median_us:.1f} us, reference "
                     f"{verdict.reference_timing.median_us:.1f} us (speedup {verdict.speedup or 0:.3f}x)")
    return Feedback(stage, "\n".join(lines), {"failure": verdict.failure})


@dataclass
class EvalChecker:
    """Judges ModelNew edits with the hardened evaluator, in sandboxed worker processes.

    On the CPU the evaluator checks correctness and integrity only (nothing is timed); an accepted edit
    there is correct, not known to be faster. With `min_speedup` on a GPU, a correct but slower edit is
    fed back as a timing failure.
    """

    task: Path
    workdir: Path
    device: str = "cpu"
    policy: str = "strict"
    trials: int = 5
    timeout_s: float = 120.0
    timing: bool | None = None
    min_speedup: float | None = None
    limits: SandboxLimits | None = None
    written: list[Path] = field(default_factory=list)

    def __call__(self, edit: Edit, turn: int) -> CheckOutcome:
        from kstrata.agents.evaluate import EvalError, evaluate

        if not isinstance(edit, ModelNewEdit):
            return CheckOutcome(False, Feedback("engine", f"a {edit.format} edit is not a ModelNew file; this "
                                                          "checker judges task-level candidates only"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        path = self.workdir / f"candidate-turn{turn}-{_sha(edit.source)[:12]}.py"
        path.write_text(edit.source)
        self.written.append(path)
        scratch = Path(tempfile.mkdtemp(prefix="kstrata-llm-sandbox-"))
        try:
            env = sandbox_env(scratch, self.limits or SandboxLimits.for_device(self.device, self.timeout_s),
                              device=self.device)
            verdict = evaluate(self.task, path, policy=self.policy, trials=self.trials, device=self.device,
                               timeout_s=self.timeout_s, timing=self.timing, env=env)
        except EvalError as exc:
            return CheckOutcome(False, Feedback("engine", f"the evaluator could not judge it: {exc}"))
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        vj = verdict.to_json()
        vj.pop("log_tail", None)
        if not verdict.accepted:
            return CheckOutcome(False, feedback_from_verdict(verdict), vj, verdict.speedup)
        if self.min_speedup is not None and verdict.speedup is not None and verdict.speedup < self.min_speedup:
            fb = feedback_from_verdict(verdict)
            return CheckOutcome(False, Feedback("timing", f"correct but not faster: {fb.text}"), vj, verdict.speedup)
        timing = (f"; speedup {verdict.speedup:.3f}x" if verdict.speedup is not None
                  else "; not timed (correctness only on this device)")
        return CheckOutcome(True, Feedback("accepted", verdict.reason + timing), vj, verdict.speedup)


# -- generated passes -------------------------------------------------------------------------------
_PASS_RUNNER = r'''
import dataclasses, json, os, sys, traceback
result_path = os.environ["KSTRATA_SANDBOX_RESULT"]

def done(**kw):
    with open(result_path, "w") as f:
        json.dump(kw, f)
    sys.exit(0)

try:
    from kstrata.ir.bundle import KernelBundle
    from kstrata.ir.target import Target
    from kstrata.passes.base import KernelPass, PassContext
    ns = {"__name__": "kstrata_generated_pass"}
    code = open("generated_pass.py").read()
    exec(compile(code, "generated_pass.py", "exec"), ns)
    classes = [v for v in ns.values() if isinstance(v, type) and issubclass(v, KernelPass) and v is not KernelPass]
    if len(classes) != 1:
        done(ok=False, stage="load", error="expected one KernelPass subclass, found %d" % len(classes))
    cls = classes[0]
    level = getattr(cls, "level", None)
    if level not in ("ttir", "ttgir"):
        done(ok=False, stage="load", error="pass level must be ttir or ttgir, not %r" % (level,))
    text = open("input." + level).read()
    target = Target.parse(sys.argv[1])
    bundle = KernelBundle(name=sys.argv[2], target=target, levels={level: text}, metadata={})
    p = cls()
    why = p.precondition(PassContext(bundle, level))
    if why:
        done(ok=False, stage="precondition", error=str(why))
    res = p.apply(PassContext(bundle, level))
    new = res.text if hasattr(res, "text") else res
    if not isinstance(new, str):
        done(ok=False, stage="apply", error="apply returned %s, not a PassResult" % type(res).__name__)
    if new == text:
        done(ok=False, stage="apply", error="the pass changed nothing")
    try:
        from kstrata.ir.triton_ir import parse_triton
        parse_triton(new)
    except Exception as exc:
        done(ok=False, stage="verify", error="the rewritten %s does not parse: %s" % (level, str(exc).splitlines()[0][:300]))
    with open("output." + level, "w") as f:
        f.write(new)
    done(ok=True, level=level, name=getattr(cls, "name", cls.__name__))
except SystemExit:
    raise
except BaseException as exc:
    tb = traceback.format_exc().strip().splitlines()
    done(ok=False, stage="run", error="%s: %s" % (type(exc).__name__, str(exc).splitlines()[0][:300] if str(exc) else ""),
         traceback=tb[-8:])
'''


@dataclass(frozen=True)
class PassRun:
    ok: bool
    reason: str
    level: str | None = None
    text: str | None = None


def run_generated_pass(edit: PassSourceEdit, ir_text: str, level: str, *, kernel: str, target: str = "cuda:90",
                       timeout_s: float = 120.0) -> PassRun:
    """Apply a model's pass to `ir_text` in a sandboxed child; the rewritten text parses with our dialects.

    Equivalence of the result is the engine's job (verify with the interpreter or on the GPU)."""
    with tempfile.TemporaryDirectory(prefix="kstrata-llm-pass-") as d:
        work = Path(d)
        (work / "generated_pass.py").write_text(edit.source)
        (work / f"input.{level}").write_text(ir_text)
        run = run_python(_PASS_RUNNER, work, args=(target, kernel), limits=SandboxLimits(timeout_s=timeout_s))
        res = run.result
        if res is None:
            return PassRun(False, f"the generated pass did not finish: {run.failure() or 'no result'}")
        if not res.get("ok"):
            detail = "\n".join(res.get("traceback", [])[-4:])
            return PassRun(False, f"{res.get('stage')}: {res.get('error')}" + (f"\n{detail}" if detail else ""))
        out = work / f"output.{res['level']}"
        return PassRun(True, f"pass {res.get('name')} rewrote the {res['level']}", res["level"], out.read_text())


# -- the optimizer's proposer interface (issue 13) -----------------------------------------------------
def context_from_state(state: Any, space: str, *, skills: Sequence[str] = ()) -> PromptContext:
    """A prompt context from the optimizer's `SearchState` (read duck-typed: the fields issue 13 documents)."""
    from .prompts import contract_text

    task = state.task
    incumbent = getattr(getattr(state, "incumbent", None), "candidate", None)
    parent = getattr(state, "parent", None)
    base = getattr(getattr(parent, "candidate", None), "source", None) or getattr(incumbent, "source", None)
    findings = tuple(getattr(f, "text", str(f)) for f in getattr(state, "findings", []) or [])
    memory = tuple(c.text() if hasattr(c, "text") else str(c)
                   for c in getattr(getattr(state, "memory", None), "conclusions", []) or [])
    return PromptContext(space=space, task_name=task.name, contract=contract_text(task.spec, task.source, state.policy),
                         incumbent=base, findings=findings, skills=tuple(skills), memory=memory,
                         policy=state.policy, device=state.device)


@dataclass
class _Pending:
    conv: Conversation
    answer: str
    feedback: Feedback | None = None


class LLMProposer:
    """A proposer for one space that asks the model (see the module docstring for the turn protocol)."""

    def __init__(self, client: LLMClient, space: str, *, library: Any = None, skills_k: int = 3,
                 max_turns: int | None = None, candidate_factory: Callable[..., Any] | None = None) -> None:
        #: Builds the loop's candidate type from keyword fields (default: issue 13's TaskCandidate).
        self.candidate_factory = candidate_factory
        self.client = client
        self.space = space
        self.name = f"llm-{space}"
        self.library = library
        self.skills_k = skills_k
        self.max_turns = max_turns or client.config.max_turns
        #: candidate key -> the conversation, the answer that produced the candidate, and (once judged
        #: and rejected) the feedback to send with the next turn.
        self._pending: dict[str, _Pending] = {}
        self.attempts: list[Attempt] = []
        self.exhausted: str | None = None

    def _skills(self, state: Any) -> list[str]:
        if self.library is None:
            return []
        from kstrata.agents.skills import skill_query

        spec = getattr(state.task, "spec", None)
        findings = getattr(state, "findings", []) or []
        query = skill_query(state.task.name, [op for op, _ in getattr(spec, "flops_by_op", ())],
                            getattr(spec, "dtypes", ()),
                            [f"{getattr(f, 'kind', '')} {getattr(f, 'text', str(f))}" for f in findings])
        return [s.render() for s in self.library.search(query, k=self.skills_k, space=self.space)]

    def observe(self, candidate: Any, check: Any, *, speedup: float | None = None, note: str = "") -> None:
        """The loop's verdict on one of this proposer's candidates: a failure (or, when timed, a correct
        candidate that is not faster, or one the loop rejected after the check) is fed back next time."""
        entry = self._pending.get(getattr(candidate, "key", ""))
        if entry is None:
            return
        if getattr(check, "ok", False):
            if note:
                entry.feedback = Feedback("engine", f"correct, but rejected by the loop: {note}")
            elif speedup is not None and speedup <= 1.0:
                entry.feedback = Feedback("timing", f"correct, but not faster: {speedup:.3f}x against the best "
                                                    "baseline; make it faster")
            else:
                del self._pending[candidate.key]
            return
        stage = _STAGE_BY_FAILURE.get(getattr(check, "failure", None) or "", "engine")
        entry.feedback = Feedback(stage, str(getattr(check, "reason", check)))

    def _continue(self, state: Any) -> Conversation | None:
        parent = getattr(state, "parent", None)
        key = getattr(parent, "key", None)
        if key in self._pending and self._pending[key].feedback is None:
            check = getattr(parent, "check", None)
            if parent is not None and check is not None and not getattr(check, "ok", True):
                self.observe(parent.candidate, check)
        ready = [k for k, e in self._pending.items() if e.feedback is not None]
        if key in ready:
            ready = [key]
        if not ready:
            return None
        entry = self._pending.pop(ready[0])
        assert entry.feedback is not None
        entry.conv.add(entry.answer, entry.feedback)
        return entry.conv

    def _factory(self) -> Callable[..., Any]:
        if self.candidate_factory is not None:
            return self.candidate_factory
        from kstrata.agents.optimize.candidate import TaskCandidate  # issue 13's type

        factory: Callable[..., Any] = TaskCandidate
        return factory

    def propose(self, state: Any) -> list[Any]:
        make = self._factory()
        if self.exhausted:
            state.note(self.name, self.exhausted)
            return []
        conv = self._continue(state)
        parent_key = getattr(getattr(state, "parent", None), "key", None)
        if conv is None:
            conv = Conversation(context_from_state(state, self.space, skills=self._skills(state)))
        if len(conv.turns) >= self.max_turns:
            state.note(self.name, f"conversation ended after {self.max_turns} turns without an accepted candidate")
            return []
        incumbent = conv.ctx.incumbent
        while len(conv.turns) < self.max_turns:
            try:
                chat, parsed = ask(self.client, conv, incumbent=incumbent)
            except BudgetExhausted as exc:
                self.exhausted = str(exc)
                state.note(self.name, str(exc))
                return []
            turn = len(conv.turns) + 1
            if chat is None:
                assert isinstance(parsed, ParseFailure)
                self.attempts.append(Attempt(turn, "llm-error", "llm", parsed.reason))
                state.note(self.name, parsed.reason)
                return []
            if isinstance(parsed, ParseFailure):
                self.attempts.append(Attempt(turn, "unparsable", "parse", parsed.reason, None, _sha(chat.text)))
                conv.add(chat.text, Feedback("parse", parsed.reason))
                continue
            if not isinstance(parsed, ModelNewEdit):
                # IR and assembly edits are engine candidates, not task-level sources (issue 12's engine).
                state.note(self.name, f"a {parsed.format} edit needs the engine's build/check; not a task candidate")
                return []
            cand = make(source=parsed.source, space=self.space, proposer=self.name,
                                 description=f"LLM {parsed.format} (turn {turn})",
                                 params={"format": parsed.format, "turn": turn, "model": self.client.config.model,
                                         "kernel": parsed.kernel, "sandbox": True},
                                 policy=getattr(state, "policy", "strict"), parent=parent_key)
            self._pending[cand.key] = _Pending(conv, chat.text)
            self.attempts.append(Attempt(turn, "proposed", "engine", "sent to the loop", parsed.format, _sha(chat.text)))
            return [cand]
        state.note(self.name, f"no usable answer in {self.max_turns} turns")
        return []


def attempts_json(attempts: Sequence[Attempt]) -> str:
    return json.dumps([a.to_json() for a in attempts], indent=2)


#: Spaces whose answers are task-level candidates (whole ModelNew files or kernels of one); the `ir` and `asm`
#: answers are kernel edits, judged by the compiled-kernel search (`kernel.KernelLLM`).
TASK_SPACES = ("graph", "triton", "library", "compiler")
