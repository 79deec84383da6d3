"""`kstrata optimize CACHE_DIR --launches RECORDS`: optimize the kernels of a Triton cache that a recorded
program launched, largest share of its GPU time first, until the time budget. Each kernel's search gets
its share of the time left among the kernels left (`kernel_deadline`), and tries first the edits that won
on the kernels before it (`search.SearchPrior`).

Per kernel: on a GPU its other autotuning configs (`program.Program.siblings`) timed against the recorded one
and the search started from the fastest (`kernel_start`), its spaces (`spaces.py`), the search (`search.py`; a
winner must also beat the kernel's other configs, each timed on its own launch record), and then

- on an NVIDIA GPU, a **winner** (measured, guarded) is written as a Triton override entry
  (`OUT/<target>/<override key>/`, with `kstrata-candidate.json`) when the override key is known, and into
  `OUT/patched-cache/` (the cache's copy, same keys, `TRITON_CACHE_DIR=OUT/patched-cache`) when it is not,
  and added to the tuned database `OUT/tuned/` (`agents/tuned.py`) that the torch.compile backend deploys;
  a winner of a faster config than the recorded one replaces that config's kernel, and with no winning edit
  that config itself, when it beat every other, is a tuned record with the edit `config(KEY)` (no override:
  the binary is Inductor's own; the backend restricts Inductor's autotuner to it);
- for AMD kernels (no AMD GPU here) the best `write_top` surrogate-ranked candidates that passed the gate
  and the hazard check are written under `OUT/unmeasured/<target>/<kernel>-<key>/<rank>/` (a cache entry
  each, with `kstrata-candidate.json` and `surrogate.json`), marked `unmeasured` with the reason; they are
  never put in the tuned database or an override directory: their differential checks and timing run when
  an AMD GPU is present (`--device cuda` does not apply to them; see the README);
- on the CPU for NVIDIA kernels the candidates are gated but not timed, and are listed `unmeasured`.

Always: `OUT/optimize-compiled.json` and `.md` (the report), `OUT/trajectory.jsonl` (every trial). The input
cache is only read (its bytes are unchanged afterwards).

The hot window (`hot_window`) is taken before a kernel's search: on an NVIDIA GPU, Nsight Compute's samples
of the largest kernels give it, and the passes with a window option search it (`spaces.py`: `scope=lines:A-B@
DIGEST`); otherwise the static loop-weighted window (`scope=hot`), and the report says why. Each trial and
each report row says which window an edit used and where it came from (sampled or static).
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kstrata.agents.engine import Engine, measurement_unavailable, tool_env
from kstrata.ir.errors import KstrataError
from kstrata.ir.files import make_dir

from .program import Program, ProgramKernel, assign_shares, load_program
from .search import ConfigTiming, KernelSearch, SearchConfig, SearchPrior, Sibling, pipeline_spec, search_kernel
from .spaces import SampledWindow, kernel_spaces

if TYPE_CHECKING:
    from kstrata.backends.hotwindow import HotWindow

REPORT_SCHEMA = "kstrata.optimize-compiled/1"
SPACES = ("options", "ttir", "ttgir", "llir", "ptx", "amdgcn")
#: Kernels (the largest shares) whose hot window Nsight Compute samples on a GPU.
NCU_KERNELS = 3


@dataclass(frozen=True)
class CompiledOptions:
    budget: int = 24
    minutes: float = 20.0
    #: "cuda", "cpu", or "" (cuda when an NVIDIA GPU is visible).
    device: str = ""
    exact: bool = False
    spaces: tuple[str, ...] | None = None
    seed: int = 0
    jobs: int = 1
    engine_cache: str | None = None
    only: tuple[str, ...] = ()
    max_edits: int = 3
    write_top: int = 3
    timeout_s: float = 900.0
    progress: Callable[[str], None] | None = None
    #: The winners of earlier runs to try first (`search.SearchPrior`; this run adds its own): a benchmark over
    #: several programs passes one to all of them. None: a fresh one per run.
    prior: SearchPrior | None = None
    #: The model's kernel-level answers (`kstrata.agents.llm.kernel.KernelLLM`, `--llm`): each kernel's search
    #: hands it the kernel after the passes' singletons. None: no model.
    llm: Any = None
    #: What the model is told the profile found (the task optimizer passes its findings).
    llm_findings: tuple[str, ...] = ()
    #: On a GPU, start each kernel's search from the fastest of its compiled configs (`kernel_start`); False:
    #: from the recorded one (the task optimizer's `ir` space, whose deployment replaces that config's kernel).
    best_config: bool = True
    #: The device's copy bandwidth (bytes/s) for each kernel's memory speed of light (`kernel_sol`): a kernel
    #: near it gets less of the run's time (`headroom_weights`). None: the roofline's cached measurement is
    #: read (or taken) under `ceilings_dir`, when that is set; otherwise no kernel's headroom is known.
    bandwidth: float | None = None
    ceilings_dir: str | None = None


@dataclass
class CompiledReport:
    cache_dir: str
    launches: str | None
    out: str
    device: str
    timed: bool
    share_source: str
    share_note: str
    kernels: list[dict[str, Any]] = field(default_factory=list)
    outputs: dict[str, Any] = field(default_factory=dict)
    engine: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"schema": REPORT_SCHEMA, **self.__dict__}

    def to_markdown(self) -> str:
        lines = [f"# kstrata optimize: {self.cache_dir}", "",
                 f"- launches: {self.launches or 'none given'}; device: {self.device}; "
                 f"{'timed on the GPU' if self.timed else 'nothing timed here'}",
                 f"- shares: {self.share_source} ({self.share_note})",
                 f"- engine: {self.engine}", f"- {self.seconds:.1f} s", ""]
        lines += [f"- note: {n}" for n in self.notes]
        lines += ["", "| kernel | target | share | mode | trials | equivalent / unproven / different / failed | result |",
                  "|---|---|---|---|---|---|---|"]
        for k in self.kernels:
            if k.get("skip"):
                lines.append(f"| {k['name']} | {k['target']} | {_pct(k.get('share'))} | skipped | 0 | | {k['skip']} |")
                continue
            s = k["search"]
            counts = {st: sum(1 for t in s["trials"] if t["status"] == st)
                      for st in ("equivalent", "unproven", "different", "failed")}
            share = _pct(k.get('share')) + (f" (memory SOL {_pct(k['sol'])})" if k.get("sol") is not None else "")
            lines.append(f"| {k['name']} | {k['target']} | {share} | {s['mode']} | {len(s['trials'])} | "
                         f"{counts['equivalent']} / {counts['unproven']} / {counts['different']} / {counts['failed']} | "
                         f"{k['result']} |")
        lines += ["", "## Trials", ""]
        for k in self.kernels:
            if k.get("skip"):
                continue
            w = k.get("hot_window") or {}
            window = (f"hot window ({w.get('origin')}): {w.get('level')} lines {w.get('first_line')}-{w.get('last_line')} "
                      f"({w.get('instructions')} instructions; {w.get('source')}"
                      + (f"; {w['why_static']}" if w.get("why_static") else "") + ")") if "level" in w else \
                f"hot window: {w.get('error', 'none')}"
            lines += [f"### {k['name']} ({k['target']}, {k['key'][:12]})", "", f"{k['search']['mode_note']}", "",
                      window, "", *_config_lines(k["search"]),
                      "| # | phase | edit | window | status | score | speedup | why / unmeasured |",
                      "|---|---|---|---|---|---|---|---|"]
            for i, t in enumerate(k["search"]["trials"]):
                sp = f"{t['speedup']:.3f}x" if t.get("speedup") else ""
                sc = f"{t['score']:+.3f}" if t.get("score") is not None else ""
                why = (t.get("unmeasured") or t.get("reason") or "").replace("|", "/").replace("\n", " ")[:160]
                used = "; ".join(f"{u['level']} {u['lines']} ({u['origin']})" for u in t.get("windows") or ()) or "kernel-wide"
                lines.append(f"| {i} | {t['phase']} | `{t['pipeline']}` | {used} | {t['status']} | {sc} | {sp} | {why} |")
            lines.append("")
        return "\n".join(lines) + "\n"


def _pct(x: float | None) -> str:
    return f"{x:.1%}" if x is not None else "?"


def _config_lines(s: dict[str, Any]) -> list[str]:
    """The config the candidates were timed against, and the best one against each sibling config."""
    base = s.get("baseline")
    if not base:
        return []
    lines = [f"baseline: the recorded config {base.get('words')}"]
    lines += [f"- not another config of it: {n}" for n in base.get("not_configs") or ()]
    for t in s.get("configs") or ():  # each other config's original against the recorded one, before the search
        lines.append(f"- before the search, {t['config'].get('words')}: " + (
            f"{t['speedup']:.3f}x the recorded config's speed ({t['time_us']:.2f} us against {t['recorded_us']:.2f} "
            f"us), {t['status']}" if t.get("speedup") and t.get("time_us") and t.get("recorded_us")
            else f"unmeasured: {t.get('reason')}"))
    if s.get("started_from"):
        lines.append(f"- the search started from the faster config {s['started_from'].get('words')}: every candidate "
                     "edits its binary and runs on its launch record")
    for t in s.get("siblings") or ():
        figure = (f"{t['speedup']:.3f}x ({t['speedup_range'][0]:.3f}-{t['speedup_range'][1]:.3f}; its original "
                  f"{t['time_us']:.2f} us, the winner {t['winner_us']:.2f} us)"
                  if t.get("speedup") and t.get("speedup_range") else f"unmeasured: {t.get('reason')}")
        lines.append(f"- against {t['config'].get('words')}: {figure}, {t['status']}")
    for t in (s.get("choice") or {}).get("siblings") or ():
        lines.append(f"- the config started from, as it is, against {t['config'].get('words')}: "
                     + (f"{t['speedup']:.3f}x, {t['status']}" if t.get("speedup") else f"unmeasured: {t.get('reason')}"))
    if s.get("sibling_verdict"):
        lines.append(f"- {s['sibling_verdict']}")
    return [*lines, ""]


def time_original_job(p: dict[str, Any]) -> dict[str, Any]:
    """Worker (on one GPU): the original kernel's time per launch on its launch record."""
    from kstrata.agents.engine import _load_one
    from kstrata.backends.launch import LoadedKernel
    from kstrata.backends.replay import replay_args
    from kstrata.backends.timing import device_and_versions, time_gpu
    from kstrata.ir.launch import LaunchRecord

    record = LaunchRecord.load(p["launch"])
    bundle = _load_one(p["entry"])
    record.check_against(bundle.params)
    kernel = LoadedKernel(bundle)
    args = replay_args(record, "cuda", 0)
    timing = time_gpu(functools.partial(kernel.call_by_name, record.grid, args), runs=p.get("runs", 50),
                      span="device")
    return {**timing.to_json(), **device_and_versions()}


def _shares(program: Program, engine: Engine, device: str) -> None:
    kept = [k for k in program.kernels if k.skip is None]
    reasons = sorted({r for k in kept if (r := measurement_unavailable(k.target)) is not None})
    if device != "cuda" or reasons or any(k.record is None for k in kept):
        why = "; ".join(reasons) if reasons else ("--device cpu" if device != "cuda" else
                                                  "some kernels have no launch record to time")
        assign_shares(program, None, f"no timing possible here ({why}): equal shares, in the cache's order")
        return
    times: dict[str, float] = {}
    for k in kept:
        run = engine.pool.run("kstrata.agents.compiled.run:time_original_job", {"entry": k.entry, "launch": k.record},
                              timeout=300, kind="gpu")
        if run.ok:
            times[k.entry] = float(run.value["median_us"])
    assign_shares(program, times, "some kernels could not be timed on their launch records: equal shares")


#: A kernel's time is weighted by what it could still save: its share times the part of its time above its
#: memory speed of light, at least this much (the bound is an estimate from buffer sizes, not measured traffic,
#: and says nothing of compute, so a kernel at it still gets a little). The time is the recorded config's: the
#: faster config a search starts from (`kernel_start`) is a gain found before the search.
MIN_HEADROOM = 0.1


def kernel_sol(k: ProgramKernel, bandwidth: float | None) -> float | None:
    """The bytes of `k`'s launch record's buffers at `bandwidth`, over its measured time per launch: the
    fraction of its memory speed of light it reaches (None when a figure is missing or unreadable)."""
    from kstrata.ir.launch import LaunchRecord, LaunchRecordError

    if not bandwidth or not k.time_us or k.record is None:
        return None
    try:
        nbytes = LaunchRecord.load(k.record).buffer_bytes()
    except (LaunchRecordError, OSError):
        return None
    return nbytes / bandwidth * 1e6 / k.time_us


def headroom_weights(kernels: Sequence[ProgramKernel]) -> list[float | None]:
    """Each kernel's weight in `kernel_deadline`: its share, times what lies above its memory speed of light
    (`1 - sol`, at least `MIN_HEADROOM`) where that is known. On the H200 (2026-12-04) a transformer block's
    twelve kernels each got 1 of their 8 edits with the time split by share alone."""
    return [None if k.share is None else k.share * (1.0 if k.sol is None else max(MIN_HEADROOM, 1.0 - min(1.0, k.sol)))
            for k in kernels]


def _headroom(program: Program, opts: CompiledOptions, device: str) -> str:
    """Each measured kernel's `sol` (`kernel_sol`); what the bandwidth was, or why there is none."""
    bandwidth, where = opts.bandwidth, "given"
    if bandwidth is None and device == "cuda" and opts.ceilings_dir:
        from kstrata.agents.roofline import copy_bandwidth

        if opts.progress is not None:
            opts.progress(f"the device's copy bandwidth: cached under {opts.ceilings_dir}, or measured once (seconds)")
        bandwidth, where = copy_bandwidth(opts.ceilings_dir)
        if bandwidth is None:  # the time is split by share alone
            return f"no headroom: {where}"
    if not bandwidth:
        return "no headroom: no bandwidth (kernels' time split by share alone)"
    for k in program.kernels:
        if k.skip is None:
            k.sol = kernel_sol(k, bandwidth)
    return (f"headroom: each kernel's buffers over {bandwidth / 1e12:.2f} TB/s ({where}); a kernel's time is its share "
            f"times the part above that bound (at least {MIN_HEADROOM:.0%})")


def kernel_deadline(now: float, deadline: float, shares: Sequence[float | None]) -> float:
    """When the search of the first of the kernels left (shares largest first, this one first) stops starting
    candidates: its share of the time left, among the kernels left (equal parts without shares). What a kernel
    leaves unused (its budget spent early) goes to the ones after it, and a trial started before its deadline
    finishes, so every kernel reached gets at least one. One kernel used to take the whole run: on the H200 the
    transformer's first kernel searched while the six others, 78% of its kernel time, got nothing."""
    left = max(0.0, deadline - now)
    known = [s for s in shares if s]
    if len(known) != len(shares) or not known:
        return now + left / max(1, len(shares))
    return now + left * float(known[0]) / sum(known)


def optimize_cache(cache_dir: str | Path, launches: str | Path | None, out_dir: str | Path,
                   opts: CompiledOptions) -> CompiledReport:
    """Optimize the kernels of `cache_dir`; see the module docstring."""
    from kstrata.agents.run_passes import refuse_output_in_cache
    from kstrata.ir.triton_layout import load_any

    src, out = Path(cache_dir).expanduser(), Path(out_dir).expanduser()
    refuse_output_in_cache(src, out)
    if opts.spaces:
        bad = [s for s in opts.spaces if s not in SPACES]
        if bad:
            raise KstrataError(f"--spaces: unknown {', '.join(bad)}; spaces of compiled kernels: {', '.join(SPACES)}")
    if opts.budget < 1 or opts.minutes <= 0:
        raise KstrataError("--budget must be >= 1 and --minutes > 0")
    if launches is not None and not Path(launches).is_dir():
        raise KstrataError("no such launch record directory", path=launches)
    say = opts.progress or (lambda _m: None)
    start = time.perf_counter()
    program = load_program(src, launches, opts.only)
    device = opts.device or ("cuda" if measurement_unavailable("cuda:90") is None else "cpu")
    make_dir(out, "--out directory")
    report = CompiledReport(str(src), str(launches) if launches else None, str(out), device, False, "equal", "")
    with Engine(opts.engine_cache, jobs=opts.jobs, build_timeout=opts.timeout_s) as engine:
        _shares(program, engine, device)
        report.share_source, report.share_note = program.share_source, program.share_note
        if program.share_source == "measured":
            report.notes.append(_headroom(program, opts, device))
        if program.unreadable_records:
            report.notes.append(f"{len(program.unreadable_records)} launch records unreadable: "
                                + "; ".join(program.unreadable_records[:3]))
        deadline = start + opts.minutes * 60
        searches: dict[str, KernelSearch] = {}
        windows: dict[str, KernelWindow] = {}
        trajectory = out / "trajectory.jsonl"
        tmp_traj = out / ".trajectory.jsonl.tmp"
        prior = opts.prior if opts.prior is not None else SearchPrior()
        ranked = list(program.ranked())
        ncu_failed: str | None = None  # why ncu gave no hot window on an earlier kernel of this run
        with tmp_traj.open("w") as traj:
            for i, k in enumerate(ranked):  # largest first: ncu profiles the NCU_KERNELS largest ones
                now = time.perf_counter()
                if now > deadline:
                    k.skip = f"the time budget ({opts.minutes:g} min) ran out before this kernel"
                    continue
                until = kernel_deadline(now, deadline, headroom_weights(ranked[i:]))
                try:
                    start_at = kernel_start(engine, k, device, opts, program, say)
                    windows[k.entry] = hot_window(start_at.kernel, device, profile=len(windows) < NCU_KERNELS,
                                                  ncu_failed=ncu_failed)
                    why_static = windows[k.entry].why_static or ""
                    if ncu_failed is None and why_static.startswith("ncu "):
                        # a profile costs tens of seconds: one that gave nothing is not tried on the next kernels
                        ncu_failed = f"{why_static} on {k.name}"
                    say(f"{k.name} ({k.target}, share {_pct(k.share)}): searching ({windows[k.entry].words()}; "
                        f"{until - time.perf_counter():.0f} s of the run's {deadline - now:.0f} s left)")
                    searches[k.entry] = search_one(engine, k, device, opts, say, deadline=until,
                                                   window=windows[k.entry], prior=prior.for_kernel(k.name),
                                                   program=program,
                                                   start=start_at)
                except KstrataError as exc:
                    k.skip = f"could not be searched: {exc}"
                    continue
                prior.learn(searches[k.entry])
                for t in searches[k.entry].trials:
                    traj.write(json.dumps({"kernel": k.name, "key": k.key, **t.to_json()}, default=str) + "\n")
        tmp_traj.replace(trajectory)
        report.timed = any(t.measured for s in searches.values() for t in s.trials)
        report.outputs = _write_outputs(src, out, program, searches, engine, opts, load_any)
        report.engine = engine.stats.to_json()
    for k in sorted(program.kernels, key=lambda x: -(x.share or 0.0)):
        row: dict[str, Any] = k.to_json()
        s = searches.get(k.entry)
        if s is not None:
            row["search"] = s.to_json()
            row["result"] = _result_line(s)
            row["hot_window"] = windows[k.entry].to_json()
        report.kernels.append(row)
    if device != "cuda":
        report.notes.append("nothing was timed: no NVIDIA GPU here (or --device cpu). Candidates that passed the "
                            "gate are listed unmeasured; run the same command on a GPU machine to time them.")
    if any(k.target.startswith("hip") for k in program.kernels):
        report.notes.append("AMD kernels are ranked by a static surrogate (llvm-mca throughput of the hot window, "
                            "static loop-weighted window) and are unmeasured: no AMD GPU is available.")
    if any(k.target.startswith("cuda") for k in program.kernels):
        sampled = sum(1 for k in program.kernels if k.entry in searches and windows[k.entry].sampled)
        report.notes.append("hot windows on NVIDIA come from Nsight Compute sampling on a GPU "
                            f"({sampled} of the kernels searched here had one: their reorder and predication edits "
                            "were confined to its lines); otherwise the static loop-weighted window is used. "
                            "cache-hints, ld-nc and redundant-cvt apply kernel-wide either way.")
    report.seconds = time.perf_counter() - start
    for name, text in (("optimize-compiled.json", json.dumps(report.to_json(), indent=1, default=str) + "\n"),
                       ("optimize-compiled.md", report.to_markdown())):
        tmp = out / f".{name}.tmp"
        tmp.write_text(text)
        tmp.replace(out / name)
    return report


@dataclass(frozen=True)
class KernelWindow:
    """A kernel's hot window (`backends/hotwindow.py`), whether a profile gave it, and why not when not."""

    window: HotWindow | None
    sampled: bool = False
    #: Why the window is the static one (None when sampled).
    why_static: str | None = None
    #: Why there is no window at all (no assembly text).
    error: str | None = None
    #: The assembly text the window's lines are of.
    text: str = field(default="", repr=False, compare=False)

    def for_spaces(self) -> SampledWindow | None:
        """The sampled window the search confines its windowed edits to (None: the static one stays)."""
        from kstrata.passes.window import LineWindow

        w = self.window
        if not self.sampled or w is None:
            return None
        return SampledWindow(w.level, LineWindow.of_text(self.text, w.first_line, w.last_line), w.source)

    def words(self) -> str:
        w = self.window
        if w is None:
            return f"no hot window: {self.error}"
        return f"{'sampled' if self.sampled else 'static'} hot window {w.level} {w.first_line}-{w.last_line}"

    def to_json(self) -> dict[str, Any]:
        if self.window is None:
            return {"error": self.error}
        out: dict[str, Any] = {**self.window.to_json(), "origin": "sampled" if self.sampled else "static"}
        sw = self.for_spaces()
        if sw is not None:
            out["scope"] = sw.lines.spelling()  # what the windowed atoms were given
        if self.why_static is not None:
            out["why_static"] = self.why_static
        return out


def hot_window(k: ProgramKernel, device: str, profile: bool = True, ncu_failed: str | None = None) -> KernelWindow:
    """The kernel's hot window and where it came from: Nsight Compute's warp-stall samples mapped to PTX lines
    on an NVIDIA GPU (when ncu runs, for the `NCU_KERNELS` largest kernels: a profile takes tens of
    seconds), else the static loop-weighted window, with the reason. `ncu_failed`: why ncu gave nothing on an
    earlier kernel of the run (then it is not run again: on the H200, 2026-12-03, it gave no source-level
    samples on each of the 7 kernels it profiled in three models, each profile time lost to the kernels' searches)."""
    import sys

    from kstrata.backends.hotwindow import profile_ptx_samples, static_hot_window, window_from_samples
    from kstrata.backends.tools import ToolError

    level = "amdgcn" if k.target.startswith("hip") else "ptx"
    text_file = Path(k.entry) / f"{k.name}.{level}"
    if not text_file.is_file():
        return KernelWindow(None, error=f"the entry has no {level}")
    text = text_file.read_text()
    why = "no NVIDIA GPU here" if level == "ptx" else "no AMD profile (no AMD GPU)"
    if level == "ptx" and device == "cuda" and not k.record:
        why = "no launch record to profile"
    elif level == "ptx" and device == "cuda" and not profile:
        why = f"ncu profiles the {NCU_KERNELS} largest kernels only"
    elif level == "ptx" and device == "cuda" and ncu_failed:
        why = f"not profiled: {ncu_failed}"
    elif level == "ptx" and device == "cuda":
        from kstrata.agents.optimize.profile import find_ncu

        ncu = find_ncu()
        if ncu is None:
            why = "Nsight Compute (ncu) not found"
        else:
            try:
                samples = profile_ptx_samples(ncu, [sys.executable, "-m", "kstrata.agents.compiled.replay", k.entry,
                                                    str(k.record)], k.name, timeout=120)
                window = window_from_samples(text, samples) if samples else None
                if window is not None and window.source.startswith("ncu"):
                    return KernelWindow(window, sampled=True, text=text)
                why = "ncu gave no source-level samples"
            except ToolError as exc:
                why = f"ncu could not profile it: {exc.message}"
    return KernelWindow(static_hot_window(text, level), why_static=why, text=text)


@dataclass(frozen=True)
class KernelStart:
    """Where a kernel's search starts: `kernel`, the recorded kernel or the faster config in its place (its
    entry, key, record and override key); `siblings`, the configs a winner must beat too (the recorded one
    among them when the search starts elsewhere); `baseline`, the recorded config; `started_from`, the
    faster config when there is one; `timings`, every other config against the recorded one."""

    kernel: ProgramKernel
    siblings: list[Sibling]
    baseline: dict[str, Any] | None
    started_from: Sibling | None = None
    timings: list[ConfigTiming] = field(default_factory=list)


def _timed_here(k: ProgramKernel, device: str) -> bool:
    return device == "cuda" and measurement_unavailable(k.target) is None and k.record is not None


def kernel_start(engine: Engine, k: ProgramKernel, device: str, opts: CompiledOptions, program: Program | None,
                 say: Callable[[str], None] = lambda _m: None) -> KernelStart:
    """The kernel's sibling configs (`Program.siblings`), registered with the engine; on a GPU (with
    `opts.best_config`) each one's original timed once against the recorded config's (`search.best_config`),
    and the search moved to the fastest when it beat the recorded one beyond the noise: its edits then apply to
    that config's binary and launch (grid, num_warps, block constants)."""
    import dataclasses

    from kstrata.ir.launch import LaunchRecord

    from .program import KernelConfig
    from .search import best_config

    configs, not_configs = program.siblings(k) if program is not None else ([], [])
    baseline = None
    if k.record:
        baseline = {**KernelConfig.of(k, LaunchRecord.load(k.record)).to_json(), "not_configs": not_configs}
    siblings = [Sibling(engine.add_kernel(c.entry, c.override_key), c.record, c.to_json()) for c in configs if c.record]
    if not siblings or not opts.best_config or not _timed_here(k, device) or k.record is None:
        return KernelStart(k, siblings, baseline)
    base = engine.add_kernel(k.entry, k.override_key)
    chosen, timings = best_config(engine, base, k.record, siblings)
    for t in timings:
        say(f"  {k.name}: other config {t.config.get('words', '?')}: "
            + (f"{t.speedup:.3f}x the recorded config's speed, {t.status}" if t.speedup else f"unmeasured ({t.reason})"))
    if chosen is None:
        return KernelStart(k, siblings, baseline, None, timings)
    c = chosen.config
    moved = dataclasses.replace(k, entry=str(c["entry"]), key=str(c["key"]), record=chosen.record,
                                override_key=c.get("override_key"))
    say(f"  {k.name}: searching from the faster config {c.get('words', '?')}")
    return KernelStart(moved, [Sibling(base, k.record, baseline or {}), *(s for s in siblings if s is not chosen)],
                       baseline, chosen, timings)


def search_one(engine: Engine, k: ProgramKernel, device: str, opts: CompiledOptions,
               say: Callable[[str], None], deadline: float | None = None,
               window: KernelWindow | None = None, prior: Mapping[str, float] | None = None,
               program: Program | None = None, start: KernelStart | None = None) -> KernelSearch:
    """One kernel's spaces and search (`deadline`: a `time.perf_counter()` after which no candidate starts;
    `window`: its hot window, sampled or static; without one the passes' own static window is used; `prior`:
    the run's winners so far, tried first; `program`: where its sibling configs are found, which a winner must
    beat too; `start`: `kernel_start`'s answer, made here when not given)."""
    from kstrata.agents.engine import _load_one

    if start is None:
        start = kernel_start(engine, k, device, opts, program, say)
    k = start.kernel  # the recorded kernel, or the faster config in its place
    bundle = _load_one(k.entry, k.override_key)
    records = [k.record] if k.record else []
    sampled = window.for_spaces() if window is not None else None
    spaces = kernel_spaces(bundle, records, exact=opts.exact, only=opts.spaces, window=sampled)
    base = engine.add_kernel(k.entry, k.override_key)
    unavailable = measurement_unavailable(k.target)
    surrogate = None
    if k.target.startswith("hip"):
        from .surrogate import amd_surrogate

        mode, note, surrogate = "surrogate", ("ranked by the static surrogate (llvm-mca throughput of the hot "
                                              "window + the s_waitcnt hazard check); unmeasured: no AMD GPU"), amd_surrogate
        reason = "unmeasured: no AMD GPU here; ranked by the static surrogate only"
    elif _timed_here(k, device):
        mode, note, reason = "measured", "gated on the GPU, then timed against the original on its launch record", None
        if start.started_from is not None:
            note += f" (the config started from, faster than the recorded one: {start.started_from.config.get('words')})"
    else:
        why = unavailable if unavailable else ("--device cpu" if device != "cuda" else "no launch record to time on")
        mode, note, reason = "unranked", f"gated on the CPU only; nothing ranks the candidates here ({why})", \
            f"unmeasured: {why}"
    hot = window.window if window is not None else None
    cfg = SearchConfig(opts.budget, opts.seed, opts.max_edits, device="cuda" if mode == "measured" else "cpu",
                       check_timeout=opts.timeout_s, unmeasured_reason=reason, jobs=opts.jobs, deadline=deadline,
                       llm=opts.llm, llm_findings=tuple(opts.llm_findings),
                       llm_window=(hot.first_line, hot.last_line) if hot is not None else None)
    if start.siblings:
        say(f"  {k.name}: {len(start.siblings)} other autotuning configs recorded; a winner is timed against each")
    return search_kernel(engine, base, k.name, k.entry, k.target, k.record, spaces, cfg, mode=mode, mode_note=note,
                         surrogate=surrogate, progress=say, env=tool_env(k.record), prior=prior,
                         siblings=start.siblings, baseline=start.baseline, started_from=start.started_from,
                         config_timings=start.timings)


def _result_line(s: KernelSearch) -> str:
    best = s.best
    recorded = s.against_recorded()
    over_recorded = (f"; {recorded.speedup:.3f}x over the recorded config ({(s.baseline or {}).get('words', '?')})"
                     if recorded is not None and recorded.speedup else "")
    if best is not None and best.speedup is not None:
        lo, hi = best.speedup_range or [best.speedup, best.speedup]
        started = (f" on the faster config {s.started_from.get('words', '?')} (over it, the best config)"
                   if s.started_from is not None else "")
        return (f"{best.speedup:.3f}x ({lo:.3f}-{hi:.3f} over rounds) with `{best.pipeline}` [{','.join(best.spaces)}]"
                + started + over_recorded + (f"; {s.sibling_verdict}" if s.sibling_verdict else ""))
    if s.choice is not None:
        c = s.choice
        lo, hi = c.speedup_range or [c.speedup, c.speedup]
        return (f"config choice `{c.edit}`: {c.config.get('words', '?')} as Inductor compiled it, {c.speedup:.3f}x "
                f"({lo:.3f}-{hi:.3f} over rounds) over the recorded config (1.000x over the best config: it is the "
                "best); no edit of it beat it" + (f" ({s.sibling_verdict})" if s.sibling_verdict else ""))
    if s.sibling_verdict:  # the best beat its own config, not every config Inductor's autotuner chooses among
        return s.sibling_verdict
    ranked = s.ranked_unmeasured()
    if s.mode == "surrogate" and ranked:
        return (f"unmeasured; surrogate best `{ranked[0].pipeline}` (cost {(ranked[0].surrogate or {}).get('cost', 0):.1f} vs "
                f"{(s.base_surrogate or {}).get('cost', 0):.1f} original, static)")
    passed = sum(1 for t in s.trials if t.status in ("equivalent", "unproven"))
    stopped = f"; {s.stopped}" if s.stopped else ""
    if s.mode == "measured":
        return f"no candidate beat the original beyond the noise ({passed} passed the gate{stopped})"
    return f"unmeasured: {passed} candidates passed the gate, none timed{stopped}"


def _write_outputs(src: Path, out: Path, program: Program, searches: dict[str, KernelSearch], engine: Engine,
                   opts: CompiledOptions, load_any: Any) -> dict[str, Any]:
    from kstrata.agents.run_passes import PATCHED_CACHE, target_slug, write_patched_cache
    from kstrata.agents.tuned import TunedDB
    from kstrata.ir.candidate import CANDIDATE_FILE, CandidateInfo
    from kstrata.ir.triton_layout import write_override

    outputs: dict[str, Any] = {"overrides": [], "patched_cache": None, "tuned": [], "unmeasured": []}
    needs_patch: dict[str, str] = {}
    for k in program.kernels:
        s = searches.get(k.entry)
        if s is None:
            continue
        best = s.best
        # the config searched: the recorded one, or the faster config the search started from (its own entry,
        # override key and launch record; a variant of it replaces that config's kernel, never the recorded one's)
        searched = s.started_from or {}
        override_key = searched.get("override_key") if s.started_from is not None else k.override_key
        recorded = s.against_recorded()
        over_recorded: dict[str, Any] = {"recorded_config": s.baseline, "speedup_vs_recorded": recorded.speedup} \
            if s.started_from is not None and recorded is not None else {}
        ptxas = (tool_env(s.record) or os.environ).get("TRITON_PTXAS_PATH")
        if best is not None and best.entry:
            built = best.entry
            info = CandidateInfo(k.name, pipeline_spec(best), best.tolerance, None, {})
            if override_key:
                bundles, errors = load_any(built)
                if errors:
                    raise errors[0]
                bundle = bundles[0]
                bundle.override_key = override_key
                outputs["overrides"].append(str(write_override(bundle, out / target_slug(bundle.target), overwrite=True,
                                                               extra_files={CANDIDATE_FILE: info.encode()})))
            else:
                needs_patch[s.entry] = built
            rec = TunedDB(out / "tuned").add(s.entry, built, edit=best.pipeline, tolerance=best.tolerance,
                                             spaces=best.spaces, verdict=f"{best.verdict}: {best.reason}"[:500],
                                             speedup=float(best.speedup or 0), speedup_range=best.speedup_range,
                                             time_before_us=best.time_before_us, time_after_us=best.time_after_us,
                                             device=str(opts.device or "cuda"), source=str(s.record), ptxas=ptxas,
                                             config=s.started_from or s.baseline,
                                             siblings=[t.to_json() for t in s.siblings], **over_recorded)
            outputs["tuned"].append(rec.slug)
        elif s.choice is not None:
            # no edit won, and the faster config beat every other: the tuned database names that config as it is
            # (nothing to override: Inductor compiles that binary itself), so the backend restricts the autotuner
            c = s.choice
            rec = TunedDB(out / "tuned").add(s.entry, s.entry, edit=c.edit, tolerance=None, spaces=["config"],
                                             verdict=("a config Inductor compiled and its autotuner benchmarked, as it "
                                                      "is (no edit): " + str(c.config.get("words", "?")))[:500],
                                             speedup=c.speedup, speedup_range=c.speedup_range,
                                             time_before_us=c.time_before_us, time_after_us=c.time_after_us,
                                             device=str(opts.device or "cuda"), source=str(s.record), ptxas=ptxas,
                                             config=c.config, siblings=[t.to_json() for t in c.siblings],
                                             recorded_config=s.baseline, speedup_vs_recorded=c.speedup)
            outputs["tuned"].append(rec.slug)
        elif s.mode == "surrogate":
            for rank, t in enumerate(s.ranked_unmeasured()[: opts.write_top], start=1):
                if not t.entry:
                    continue
                dest = out / "unmeasured" / k.target.replace(":", "-") / f"{k.name}-{k.key[:12]}" / f"{rank}"
                tmp = dest.with_name(f".{rank}.tmp.{os.getpid()}")
                shutil.rmtree(tmp, ignore_errors=True)
                shutil.copytree(t.entry, tmp)
                for group in tmp.glob("__grp__*.json"):  # the copy's group file names the copy's own files
                    group.write_text(json.dumps({"child_paths": {f.name: str(dest / f.name) for f in sorted(tmp.iterdir())
                                                                 if f.is_file() and not f.name.startswith("__grp__")
                                                                 and f.name not in (CANDIDATE_FILE, "surrogate.json")}}))
                (tmp / CANDIDATE_FILE).write_bytes(CandidateInfo(k.name, pipeline_spec(t), t.tolerance, None, {}).encode())
                (tmp / "surrogate.json").write_text(json.dumps(
                    {"status": "unmeasured", "reason": t.unmeasured, "verdict": t.verdict, "gate": t.reason,
                     "candidate": t.surrogate, "original": s.base_surrogate, "score": t.score}, indent=1) + "\n")
                shutil.rmtree(dest, ignore_errors=True)
                tmp.rename(dest)
                outputs["unmeasured"].append(str(dest))
    if needs_patch:
        patched = write_patched_cache(src, out / PATCHED_CACHE, needs_patch)
        outputs["patched_cache"] = str(out / PATCHED_CACHE)
        outputs["patched_entries"] = [str(p) for p in patched.values()]
    return outputs
