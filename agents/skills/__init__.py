"""The skill library: verified optimization knowledge, retrieved by BM25 for the proposers.

A skill is one JSON file (`kstrata.skill/1`): a title; when it applies (operator patterns, roofline
class, dtypes, architectures, spaces); how (text); an example (code, a patch, a pipeline or template
parameters); and its evidence (verified speedups: task, device, versions, the numbers, and the
reproduction that admitted it). `SkillLibrary` reads a writable user directory (`KSTRATA_SKILLS_DIR`,
else `~/.local/share/kstrata/skills`) and the skills shipped in `agents/skills/seed/`; retrieval is
BM25 (`bm25s`) over title, applicability, how and example, optionally reranked by the model.

**Admission.** A skill enters the library only through `admit`: the optimizer hands it a
re-measurement callback, which must re-run the winning candidate against its baseline in a fresh
process on inputs other than the ones the win was found on (other seeds); the skill is written only
when every re-measurement is correct and the reproduced speedup clears `min_speedup`. `kstrata skills
add FILE` accepts only a file whose evidence carries such a reproduction.

**Summaries.** A winning trajectory becomes a skill through the model when one is configured
(`summarize_with_model`), otherwise through `summarize_win`, built from the winning candidate's space,
proposer, parameters and the task's contract and findings.

**Seeds.** `seed/` holds only skills whose wins were measured and reproduced by this gate on a GPU: two so
far, from `kstrata optimize --learn-skills` on an H200 (2026-12-03; see `seed/README.md`).

**Retrieval** reads a task by its name, operators, dtypes and findings (`skill_query`), not by its code, and
leaves the words every PyTorch model's code shares out of the index (`CODE_STOPWORDS`).
"""

from __future__ import annotations

import json
import os
import re
import statistics
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from kstrata.ir.errors import KstrataError
from kstrata.ir.files import make_dir, read_json

SKILL_SCHEMA = "kstrata.skill/1"
SKILLS_ENV = "KSTRATA_SKILLS_DIR"
DEFAULT_SKILLS_DIR = Path("~/.local/share/kstrata/skills")
SEED_DIR = Path(__file__).resolve().parent / "seed"
#: A reproduced speedup must clear this to admit a skill (2%: above the timer's usual spread).
MIN_SPEEDUP = 1.02
_SLUG = re.compile(r"[^a-z0-9]+")


class SkillError(KstrataError):
    """A skill file that cannot be read, or a library operation that cannot be done."""


@dataclass(frozen=True)
class Applicability:
    operators: tuple[str, ...] = ()  # aten ops or patterns: "aten.mm", "softmax", "elementwise chain"
    roofline: tuple[str, ...] = ()  # memory-bound, compute-bound, launch-bound, latency-bound
    dtypes: tuple[str, ...] = ()
    architectures: tuple[str, ...] = ()  # cuda:90, hip:gfx942, ...
    spaces: tuple[str, ...] = ()  # library, compiler, graph, triton, ir, asm

    def text(self) -> str:
        parts = [("operators", self.operators), ("roofline", self.roofline), ("dtypes", self.dtypes),
                 ("architectures", self.architectures), ("spaces", self.spaces)]
        return "; ".join(f"{k}: {', '.join(v)}" for k, v in parts if v)


@dataclass(frozen=True)
class Reproduction:
    """One re-measurement in a fresh process on other inputs."""

    seed: int
    correct: bool
    speedup: float | None
    fresh_process: bool
    detail: str = ""


@dataclass(frozen=True)
class Evidence:
    task: str
    device: str
    versions: dict[str, str]
    speedup: float
    baseline: str  # what it was faster than (eager, compile, the incumbent)
    baseline_us: float | None = None
    candidate_us: float | None = None
    date: str = ""
    reproductions: tuple[Reproduction, ...] = ()

    @property
    def reproduced(self) -> bool:
        return bool(self.reproductions) and all(r.correct and r.fresh_process for r in self.reproductions)


@dataclass(frozen=True)
class Skill:
    id: str
    title: str
    applies: Applicability
    how: str
    example: dict[str, Any] = field(default_factory=dict)  # {"kind": code|patch|pipeline|params, "content": ...}
    evidence: tuple[Evidence, ...] = ()
    source: str = "user"  # builtin-summarizer | model | user | seed
    schema: str = SKILL_SCHEMA

    def search_text(self) -> str:
        ex = self.example.get("content", "")
        ex_text = ex if isinstance(ex, str) else json.dumps(ex, sort_keys=True)
        return " ".join([self.title, self.applies.text(), self.how, ex_text[:4000]])

    def best_speedup(self) -> float | None:
        return max((e.speedup for e in self.evidence), default=None)

    def render(self) -> str:
        """The skill as a prompt shows it."""
        lines = [f"### {self.title}", f"When: {self.applies.text() or 'unspecified'}", f"How: {self.how}"]
        if self.example:
            content = self.example.get("content", "")
            text = content if isinstance(content, str) else json.dumps(content, sort_keys=True)
            lines.append(f"Example ({self.example.get('kind', 'code')}):\n{text[:2000]}")
        for e in self.evidence[:3]:
            lines.append(f"Evidence: {e.task} on {e.device}: {e.speedup:.3f}x over {e.baseline}"
                         + (" (reproduced)" if e.reproduced else ""))
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["applies"] = {k: list(v) for k, v in d["applies"].items()}
        return d

    @classmethod
    def from_json(cls, data: Any, origin: str = "<skill>") -> Skill:
        if not isinstance(data, dict):
            raise SkillError("a skill file is a JSON object", path=origin)
        if data.get("schema") != SKILL_SCHEMA:
            raise SkillError(f"schema {data.get('schema')!r} is not {SKILL_SCHEMA!r}", path=origin)
        from kstrata.ir.schema import validate_dataclass

        missing = [k for k in ("id", "title", "how") if k not in data]
        if missing:
            raise SkillError(f"missing field {missing[0]!r}", path=origin)
        # every field's type checked here: a skill of the wrong shape is this file's error, not a crash in
        # whatever lists, renders or ranks it later
        skill = validate_dataclass(cls, {**data, "applies": data.get("applies") or {}}, path=origin, what="skill",
                                   error=SkillError)
        if not _SLUG.sub("-", skill.id.lower()).strip("-") == skill.id:
            raise SkillError(f"skill id {skill.id!r} must be lower-case words joined by '-'", path=origin)
        return skill


def read_skill(path: str | Path) -> Skill:
    """The skill in the file `path`; a file that cannot be read or is not a skill is a `SkillError` naming it."""
    return Skill.from_json(read_json(path, "skill file", error=SkillError), str(path))


def slug(text: str) -> str:
    return _SLUG.sub("-", text.lower()).strip("-")[:80] or "skill"


def _write_atomic(path: Path, text: str) -> None:
    if path.is_dir():
        raise SkillError("is a directory; give a file to write", path=path)
    make_dir(path.parent, "skill library", error=SkillError)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def default_dir() -> Path:
    return Path(os.environ.get(SKILLS_ENV) or DEFAULT_SKILLS_DIR).expanduser()


@dataclass(frozen=True)
class Hit:
    skill: Skill
    score: float
    origin: str  # "user" or "seed"


class SkillLibrary:
    """Skills in a writable directory plus the shipped seeds (read-only)."""

    def __init__(self, root: str | Path | None = None, *, seeds: bool = True) -> None:
        self.root = Path(root).expanduser() if root is not None else default_dir()
        self.seed_dir = SEED_DIR if seeds else None

    def _files(self) -> list[tuple[Path, str]]:
        out: list[tuple[Path, str]] = []
        if self.seed_dir is not None and self.seed_dir.is_dir():
            out += [(p, "seed") for p in sorted(self.seed_dir.glob("*.json"))]
        if self.root.is_dir():
            out += [(p, "user") for p in sorted(self.root.glob("*.json"))]
        elif self.root.exists():
            raise SkillError("a skill library is a directory, not a file", path=self.root)
        return out

    def load(self) -> list[tuple[Skill, str]]:
        """Every skill (a user skill with a seed's id replaces it); a corrupt file is a `SkillError`."""
        found: dict[str, tuple[Skill, str]] = {}
        for path, origin in self._files():
            skill = read_skill(path)
            found[skill.id] = (skill, origin)
        return list(found.values())

    def skills(self) -> list[Skill]:
        return [s for s, _ in self.load()]

    def get(self, skill_id: str) -> Skill:
        for s in self.skills():
            if s.id == skill_id:
                return s
        known = ", ".join(sorted(s.id for s in self.skills())) or "none"
        raise SkillError(f"no skill {skill_id!r} (skills: {known})")

    def _write(self, skill: Skill) -> Path:
        path = self.root / f"{skill.id}.json"
        _write_atomic(path, json.dumps(skill.to_json(), indent=2) + "\n")
        return path

    def add(self, skill: Skill) -> Path:
        """Store a skill whose evidence carries a reproduction (see `admit`); refuses anything else."""
        if not any(e.reproduced for e in skill.evidence):
            raise SkillError(f"skill {skill.id!r} has no reproduced evidence: a skill is added only after its "
                             "speedup reproduces in a fresh process on other inputs")
        return self._write(skill)

    def remove(self, skill_id: str) -> Path:
        path = self.root / f"{skill_id}.json"
        if not path.is_file():
            if any(s.id == skill_id for s, o in self.load() if o == "seed"):
                raise SkillError(f"skill {skill_id!r} is a shipped seed; it cannot be removed")
            raise SkillError(f"no skill {skill_id!r} in {self.root}")
        path.unlink()
        return path

    def export(self, out: str | Path) -> int:
        skills = [s.to_json() for s in self.skills()]
        _write_atomic(Path(out), json.dumps({"schema": "kstrata.skills-export/1", "skills": skills}, indent=2) + "\n")
        return len(skills)

    def search(self, query: str, k: int = 3, *, space: str | None = None) -> list[Skill]:
        return [h.skill for h in self.search_hits(query, k, space=space)]

    def search_hits(self, query: str, k: int = 3, *, space: str | None = None) -> list[Hit]:
        """BM25 over the skills (those for `space`, when given); only hits that share a term with `query`."""
        entries = [(s, o) for s, o in self.load() if space is None or not s.applies.spaces or space in s.applies.spaces]
        return bm25_rank(query, entries, k)


#: Words every PyTorch model's code shares: left out of the index and the query, so a skill whose example is
#: code does not match every task by its `def forward(self, x: torch.Tensor)` (with the first two seeds, the
#: addmm-epilogue skill, whose example is an fx forward, ranked first for a softmax task).
CODE_STOPWORDS = ("def", "self", "return", "torch", "tensor", "nn", "module", "forward", "import", "class", "none",
                  "true", "false", "model", "super", "init", "get", "inputs", "init_inputs", "x", "y", "out", "args",
                  "kwargs", "float", "int", "bool", "list", "dict", "tuple", "str", "functional", "f", "t", "aten",
                  "default", "params", "skill", "space", "applied", "won", "task", "findings", "time")


def _stopwords() -> list[str]:
    import bm25s.stopwords as sw

    return [*sw.STOPWORDS_EN, *CODE_STOPWORDS]


def skill_query(name: str, operators: Iterable[str] = (), dtypes: Iterable[str] = (), findings: Iterable[str] = (),
                extra: str = "") -> str:
    """The words a task is looked up by: its name, its operators (`aten.addmm` also as `addmm`), dtypes and the
    profile's findings; not its source code (see `CODE_STOPWORDS`)."""
    ops = [w for op in operators for w in (op, op.split(".")[-1].lstrip("_"))]
    return " ".join([name.replace("_", " "), *ops, *dtypes, *findings, extra]).strip()


def bm25_rank(query: str, entries: Sequence[tuple[Skill, str]], k: int) -> list[Hit]:
    import bm25s

    if not entries or not query.strip() or k < 1:
        return []
    corpus = [s.search_text() for s, _ in entries]
    stop = _stopwords()
    tokens = bm25s.tokenize(corpus, stopwords=stop, show_progress=False)
    retriever = bm25s.BM25()
    retriever.index(tokens, show_progress=False)
    q = bm25s.tokenize([query], stopwords=stop, show_progress=False)
    if not len(q.ids[0]) or not any(t in tokens.vocab for t in q.vocab):
        return []
    idx, scores = retriever.retrieve(q, k=min(k, len(entries)), show_progress=False)
    hits = []
    for i, sc in zip(idx[0], scores[0], strict=True):
        if float(sc) > 0:
            s, o = entries[int(i)]
            hits.append(Hit(s, float(sc), o))
    return hits


def rerank_with_model(client: Any, query: str, hits: Sequence[Hit]) -> tuple[list[Hit], str]:
    """The hits reordered by the model (it answers a JSON list of ids); on any failure the BM25 order,
    with the reason as the second value (never silent)."""
    if len(hits) < 2:
        return list(hits), "nothing to rerank"
    listing = "\n".join(f"- {h.skill.id}: {h.skill.title} ({h.skill.applies.text()})" for h in hits)
    msgs = [{"role": "system", "content": "Rank optimization skills by how well they fit a task. Answer with a JSON "
                                          "list of skill ids, best first, and nothing else."},
            {"role": "user", "content": f"Task and findings:\n{query[:6000]}\n\nSkills:\n{listing}"}]
    try:
        text = client.chat(msgs, max_tokens=400).text.strip()
        text = re.sub(r"^```(?:json)?\s*|\s*```$", "", text)
        order = json.loads(text)
        if not isinstance(order, list) or not all(isinstance(x, str) for x in order):
            raise ValueError("not a list of ids")
    except Exception as exc:  # the model's answer is advisory: BM25's order stands, and we say why
        return list(hits), f"rerank failed ({type(exc).__name__}: {str(exc)[:120]}); BM25 order kept"
    by_id = {h.skill.id: h for h in hits}
    ranked = [by_id[i] for i in dict.fromkeys(order) if i in by_id]
    ranked += [h for h in hits if h not in ranked]
    return ranked, "reranked by the model"


# -- admission ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GateResult:
    admitted: bool
    reason: str
    reproductions: tuple[Reproduction, ...]
    path: Path | None = None


Remeasure = Callable[[int], Reproduction]


def admit(skill: Skill, claimed: Evidence, remeasure: Remeasure, library: SkillLibrary, *,
          seeds: Iterable[int] = (1001, 2002, 3003), original_seed: int | None = 42,
          min_speedup: float = MIN_SPEEDUP) -> GateResult:
    """Re-measure the win on other inputs in fresh processes; store the skill only if it reproduces.

    `remeasure(seed)` re-runs the winning candidate against the baseline in a fresh process with inputs
    drawn under `seed`, and returns whether the candidate was correct there and its speedup.
    """
    seeds = [s for s in seeds if s != original_seed]
    if not seeds:
        return GateResult(False, "no seeds other than the original inputs' to reproduce on", ())
    reps: list[Reproduction] = []
    for seed in seeds:
        try:
            rep = remeasure(seed)
        except Exception as exc:  # a failed re-measurement is a failed reproduction, reported
            rep = Reproduction(seed, False, None, True, f"re-measurement failed: {type(exc).__name__}: {exc}")
        reps.append(rep)
    bad = [r for r in reps if not r.correct]
    if bad:
        return GateResult(False, f"not correct on the inputs of seed {bad[0].seed}: {bad[0].detail or 'mismatch'}",
                          tuple(reps))
    stale = [r for r in reps if not r.fresh_process]
    if stale:
        return GateResult(False, f"seed {stale[0].seed} was not re-measured in a fresh process", tuple(reps))
    speeds = [r.speedup for r in reps if r.speedup is not None]
    if len(speeds) != len(reps):
        return GateResult(False, "a re-measurement returned no timing (nothing to reproduce on this device)",
                          tuple(reps))
    med = statistics.median(speeds)
    if med < min_speedup:
        return GateResult(False, f"the speedup did not reproduce: median {med:.3f}x over seeds "
                                 f"{', '.join(str(r.seed) for r in reps)} (claimed {claimed.speedup:.3f}x, "
                                 f"needed {min_speedup:.3f}x)", tuple(reps))
    ev = Evidence(claimed.task, claimed.device, claimed.versions, claimed.speedup, claimed.baseline,
                  claimed.baseline_us, claimed.candidate_us,
                  claimed.date or datetime.now(timezone.utc).isoformat(timespec="seconds"), tuple(reps))
    stored = Skill(skill.id, skill.title, skill.applies, skill.how, skill.example, (*skill.evidence, ev), skill.source)
    path = library.add(stored)
    return GateResult(True, f"reproduced: median {med:.3f}x over {len(reps)} fresh runs on other inputs", tuple(reps),
                      path)


# -- summaries of winning trajectories ------------------------------------------------------------------
@dataclass(frozen=True)
class Win:
    """What the optimizer knows about a win: enough to write a skill."""

    task: str
    space: str
    proposer: str
    description: str
    params: dict[str, Any]
    speedup: float
    baseline: str
    device: str
    versions: dict[str, str]
    operators: tuple[str, ...] = ()
    roofline: str = ""  # the classes that fired, comma-separated: memory-bound, launch-bound, ...
    dtypes: tuple[str, ...] = ()
    architecture: str = ""
    findings: tuple[str, ...] = ()
    source: str = ""  # the winning ModelNew (or patch, pipeline)
    baseline_us: float | None = None
    candidate_us: float | None = None


def summarize_win(win: Win) -> Skill:
    """The built-in summarizer: a skill from the winning candidate's space, proposer and parameters."""
    # code parameters (an fx forward) are in the example, not in the text a search reads
    params = ", ".join(f"{k}={v}" if not (isinstance(v, str) and "\n" in v) else f"{k}=<code: see the example>"
                       for k, v in sorted(win.params.items())) or "no parameters"
    title = f"{win.space}: {win.description}"
    how = (f"In the {win.space} space, {win.proposer} applied: {win.description} ({params}). "
           f"It won {win.speedup:.3f}x over {win.baseline} on {win.task}"
           + (f" ({win.roofline})" if win.roofline else "") + "."
           + (f" Findings at the time: {'; '.join(win.findings[:4])}." if win.findings else ""))
    example: dict[str, Any] = {"kind": "params", "content": {"proposer": win.proposer, "params": win.params}}
    return Skill(slug(f"{win.space}-{win.proposer}-{win.description}"), title,
                 Applicability(win.operators, tuple(r for r in win.roofline.split(",") if r), win.dtypes,
                               (win.architecture,) if win.architecture else (), (win.space,)),
                 how, example, (), "builtin-summarizer")


def claimed_evidence(win: Win) -> Evidence:
    return Evidence(win.task, win.device, win.versions, win.speedup, win.baseline, win.baseline_us, win.candidate_us,
                    datetime.now(timezone.utc).isoformat(timespec="seconds"))


def summarize_with_model(client: Any, win: Win) -> tuple[Skill, str]:
    """A skill written by the model from the win (title, how, operators); the built-in summary when the
    model's answer is unusable, with the reason as the second value."""
    base = summarize_win(win)
    msgs = [{"role": "system", "content": "You write short, reusable GPU optimization skills. Answer with one JSON "
                                          'object {"title": str, "how": str, "operators": [str]} and nothing else.'},
            {"role": "user", "content": f"A verified win: {json.dumps(asdict(win), default=str)[:8000]}"}]
    try:
        text = client.chat(msgs, max_tokens=800).text.strip()
        text = re.sub(r"^```(?:json)?\s*|\s*```$", "", text)
        data = json.loads(text)
        title, how = str(data["title"]).strip(), str(data["how"]).strip()
        ops = tuple(str(o) for o in data.get("operators", []))[:12]
        if not title or not how:
            raise ValueError("empty title or how")
    except Exception as exc:  # the built-in summary stands, and we say why
        return base, f"model summary unusable ({type(exc).__name__}: {str(exc)[:120]}); built-in summary used"
    applies = Applicability(ops or base.applies.operators, base.applies.roofline, base.applies.dtypes,
                            base.applies.architectures, base.applies.spaces)
    return Skill(slug(title), title[:200], applies, how[:4000], base.example, (), "model"), "summarized by the model"


def learn_from_win(library: SkillLibrary, win: Win, remeasure: Remeasure, *, client: Any = None,
                   seeds: Iterable[int] = (1001, 2002, 3003), original_seed: int | None = None,
                   min_speedup: float = MIN_SPEEDUP) -> tuple[GateResult, str]:
    """Summarize a win into a skill (by the model when `client` is given, else built in) and admit it
    through the gate; returns the gate's result and how the summary was written."""
    if client is not None:
        skill, how = summarize_with_model(client, win)
    else:
        skill, how = summarize_win(win), "built-in summary"
    return admit(skill, claimed_evidence(win), remeasure, library, seeds=seeds, original_seed=original_seed,
                 min_speedup=min_speedup), how
