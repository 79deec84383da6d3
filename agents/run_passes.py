"""`kstrata run-passes`: a pipeline over every kernel of a Triton cache root or dump directory, on the
candidate engine (`agents/engine.py`).

Each kernel becomes a `Candidate` (its entry's content digest, the pipeline); the engine builds it in a
worker process (a compiler crash fails that kernel only), with the lower levels rebuilt by Triton's
stages and the static checks (signature, launch ABI, resources before and after); a TTIR/TTGIR rewrite
is checked by the engine (the CPU interpreter through `kstrata verify`) on the kernel's launch record
when there is one, and one it finds not equivalent writes nothing. Builds and checks are cached by
the engine (`--engine-cache`, default `~/.cache/kstrata/engine`): a rerun over the same kernels, or a
run over another cache holding the same kernels, starts no process for them.

Outputs, never inside the directory read:
- `OUT/<target>/<override key>/` in `TRITON_OVERRIDE_DIR` layout, for kernels whose override key is known
  (a dump directory, a kstrata-built cache, a launch record), with `kstrata-candidate.json` beside;
- `OUT/patched-cache/` when some changed kernel has no usable override key (a plain Triton cache, or
  autotuning variants that share one): a copy of the whole cache, same keys, in which every changed
  kernel's levels, binary and metadata are the rewritten ones and the group files point into the
  copy; run the program with `TRITON_CACHE_DIR=OUT/patched-cache` (Triton then loads the rewritten
  binaries as cache hits, compiling nothing). Triton's group files hold absolute paths: do not move it;
- `OUT/run-passes-report.json` and `.md`; `OUT/.kstrata-run/` the resume state (keyed by entry,
  pipeline and the tool and kstrata versions; a state that does not parse, or whose outputs are missing
  or changed, is redone).

With `launches` (a `kstrata record` directory) each kernel is matched to the record of its binary; with
`measure` too, each changed kernel is timed by `Engine.measure` (interleaved A/B rounds, one GPU at a
time), and the report flags results more than 10x either way or faster than writing the outputs once.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kstrata.ir.errors import KstrataError

from .engine import (
    BuildResult,
    Candidate,
    Engine,
    Measurement,
    PipelineEdit,
    Provenance,
    Verdict,
    measurement_unavailable,
    suspicious_reasons,
    tool_env,
    tool_versions,
)

REPORT_SCHEMA = "kstrata.run-passes/2"
STATE_DIR = ".kstrata-run"
STATE_SCHEMA = "kstrata.run-passes-state/2"
PATCHED_CACHE = "patched-cache"
MeasureFn = Callable[[dict[str, Any], str], dict[str, Any]]
#: Launch options of a kernel that tell autotuning variants of one kernel apart in a report.
LAUNCH_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg", "waves_per_eu", "matrix_instr_nonkdim")

__all__ = ["RunReport", "declared_tolerances", "load_launch_records", "match_record", "measurement_unavailable",
           "run_passes", "suspicious_reasons"]


@dataclass
class KernelOutcome:
    """What happened to one kernel."""

    entry: str
    #: The cache entry's key (its directory name): tells apart kernels of one name.
    key: str = ""
    name: str = "?"
    target: str = "?"
    #: num_warps, num_stages, … of this variant (from its metadata).
    launch_options: dict[str, Any] = field(default_factory=dict)
    status: str = "failed"  # "changed", "unchanged", "failed"
    passes: list[dict[str, Any]] = field(default_factory=list)
    first_changed: str | None = None
    override_entry: str | None = None
    patched_entry: str | None = None
    resources_before: dict[str, Any] = field(default_factory=dict)
    resources_after: dict[str, Any] = field(default_factory=dict)
    checks: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    note: str | None = None
    repro: str | None = None
    seconds: float = 0.0
    #: The engine's build: its key, the rebuilt entry (kept for timing), whether it came from the cache.
    build_key: str | None = None
    candidate_entry: str | None = None
    duplicate_of: str | None = None
    cached: bool = False
    launch_record: str | None = None
    time_before_us: float | None = None
    time_after_us: float | None = None
    speedup: float | None = None
    #: How the times were taken: rounds, runs, spread, device; or why the kernel was not timed.
    timing: dict[str, Any] = field(default_factory=dict)
    suspicious: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def target_slug(target: Any) -> str:
    """The per-target override root's name: `cuda-90`, `hip-gfx942`."""
    return f"{target.backend}-{target.arch}"


def _inside(path: Path, root: Path) -> bool:
    try:
        path.resolve().relative_to(root.resolve())
        return True
    except ValueError:
        return False


def refuse_output_in_cache(src: Path, out: Path) -> None:
    """A `KstrataError` when the output directory is inside the cache being read, or contains it."""
    if _inside(out, src) or _inside(src, out):
        raise KstrataError(f"the output directory {out} must not be inside the cache directory (or contain it): "
                           "kstrata never writes into a cache it reads", path=src)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ---------------------------------------------------------------------------------------------------
# Entries, names and launch records
# ---------------------------------------------------------------------------------------------------
def entry_kernel_name(entry: Path) -> str:
    """The kernel's name from the entry's file names, without parsing anything."""
    group = next(iter(sorted(entry.glob("__grp__*.json"))), None)
    if group is not None:
        return group.name[len("__grp__"):-len(".json")]
    ttgir = next(iter(sorted(entry.glob("*.ttgir"))), None)
    return ttgir.stem if ttgir is not None else entry.name


def _matches(name: str, wanted: str) -> bool:
    """`--only` spelling: the kernel's name, with or without the `_kernel` suffix (as `suite build --only`
    names suite kernels: `layernorm_fwd` for `layernorm_fwd_kernel`)."""
    return name == wanted or name == f"{wanted}_kernel" or name.removesuffix("_kernel") == wanted


def select_entries(entries: list[str], only: Sequence[str], src: Path) -> list[str]:
    """The entries whose kernel `--only` names; an unknown name is an error that suggests close ones."""
    names = {e: entry_kernel_name(Path(e)) for e in entries}
    unknown = [w for w in only if not any(_matches(n, w) for n in names.values())]
    if unknown:
        known = sorted(set(names.values()))
        hints = [h for w in unknown for h in difflib.get_close_matches(w, known, n=3, cutoff=0.5)]
        raise KstrataError(f"no kernel named {', '.join(unknown)} here"
                           + (f"; did you mean {', '.join(dict.fromkeys(hints))}?" if hints else
                              f"; kernels: {', '.join(known[:20])}{' …' if len(known) > 20 else ''}"), path=src)
    return [e for e in entries if any(_matches(names[e], w) for w in only)]


def load_launch_records(launches: str | Path) -> tuple[dict[str, str], list[str]]:
    """Index the launch records under `launches`: key -> record path, where the key is the base32 cache
    key (a cache entry's directory name) and, for records of kernels from a dump, the override key. The
    first record of each key wins (`kstrata record` numbers them in launch order). Also returns the
    records that could not be read, with the reason."""
    from kstrata.ir.launch import LaunchRecord, LaunchRecordError
    from kstrata.ir.triton_layout import base32_key

    root = Path(launches)
    if not root.is_dir():
        raise KstrataError("no such launch record directory", path=root)
    index: dict[str, str] = {}
    unreadable: list[str] = []
    for path in sorted(root.glob("*.json"), key=lambda p: (p.stem.rpartition("-")[0], _record_number(p))):
        try:
            record = LaunchRecord.load(path)
        except LaunchRecordError as exc:
            unreadable.append(str(exc) if exc.path else f"{path}: {exc}")  # the error names the file already
            continue
        if record.cache_key:
            index.setdefault(base32_key(record.cache_key), str(path))
        if record.override_key:
            index.setdefault(f"override:{record.override_key}", str(path))
    return index, unreadable


def _record_number(path: Path) -> int:
    tail = path.stem.rpartition("-")[2]
    return int(tail) if tail.isdigit() else 0


def match_record(entry: str, index: dict[str, str]) -> str | None:
    """The launch record of a cache entry (named by its cache key) or a dump entry (by its override key)."""
    name = Path(entry).name
    return index.get(name) or index.get(f"override:{name}")


def declared_tolerances(pipeline_spec: str) -> str | None:
    """The tolerances the pipeline's passes declare, as one line (None: every pass is bit-exact)."""
    from kstrata.passes.pipeline import parse_pipeline

    declared = []
    for _, kernel_pass in parse_pipeline(pipeline_spec).passes:
        tolerance = kernel_pass.declared_tolerance()
        if tolerance:
            declared.append(f"{kernel_pass.spelling()}: {tolerance.spelling()}")
    return "; ".join(declared) or None


# ---------------------------------------------------------------------------------------------------
# Resume state
# ---------------------------------------------------------------------------------------------------
def _state_file(out: Path, entry: str, pipeline_spec: str) -> Path:
    ident = json.dumps([str(Path(entry).resolve()), pipeline_spec, tool_versions()])
    return out / STATE_DIR / f"{hashlib.sha256(ident.encode()).hexdigest()[:24]}.json"


def _outputs_of(outcome: dict[str, Any]) -> dict[str, str]:
    files: dict[str, str] = {}
    for key in ("override_entry", "patched_entry"):
        if outcome.get(key):
            for f in sorted(Path(outcome[key]).iterdir()):
                if f.is_file():
                    files[str(f)] = _sha(f)
    return files


def _save_state(out: Path, entry: str, pipeline_spec: str, outcome: dict[str, Any]) -> None:
    state = _state_file(out, entry, pipeline_spec)
    tmp = state.with_suffix(f".tmp.{os.getpid()}")
    tmp.write_text(json.dumps({"schema": STATE_SCHEMA, "outcome": outcome, "outputs": _outputs_of(outcome)},
                              default=str))
    tmp.replace(state)


def _resumed(out: Path, entry: str, pipeline_spec: str) -> tuple[dict[str, Any] | None, str | None]:
    """The outcome an earlier run recorded, when its state parses and the outputs it names are intact;
    otherwise None and why it is redone (None when there simply is no state)."""
    state = _state_file(out, entry, pipeline_spec)
    if not state.exists():
        return None, None
    try:
        data = json.loads(state.read_text())
        outcome, outputs = data["outcome"], data["outputs"]
        if data.get("schema") != STATE_SCHEMA or not isinstance(outcome, dict) or not isinstance(outputs, dict):
            raise ValueError("not a run-passes state")
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
        return None, f"resume state {state.name} unreadable ({type(exc).__name__}; truncated?): redone"
    for path, digest in outputs.items():
        p = Path(path)
        if not p.is_file() or _sha(p) != digest:
            return None, f"output {p} is missing or changed since the earlier run (truncated?): redone"
    return outcome, None


# ---------------------------------------------------------------------------------------------------
# Outputs: overrides and the patched cache
# ---------------------------------------------------------------------------------------------------
def _mark_key_collisions(outcomes: list[dict[str, Any]]) -> None:
    """Kernels that share an override entry cannot be overridden separately (Triton keys overrides by the
    source hash, which autotuning variants of one kernel share): drop the entry; they go to the patched
    cache instead (where every variant keeps its own cache key)."""
    by_entry: dict[str, list[dict[str, Any]]] = {}
    for o in outcomes:
        if o.get("override_entry"):
            by_entry.setdefault(o["override_entry"], []).append(o)
    for entry, group in by_entry.items():
        if len(group) < 2:
            continue
        shutil.rmtree(entry, ignore_errors=True)
        for o in group:
            others = [g["entry"] for g in group if g is not o]
            o["note"] = (f"override key collision with {', '.join(others)}: Triton keys overrides by source hash only, "
                         "so variants of one kernel (e.g. autotuning configs) cannot be overridden separately; "
                         f"no override written, the kernel is in {PATCHED_CACHE}/")
            o["override_entry"] = None
            o["needs_patched_cache"] = True


def _write_dir_atomically(final: Path, files: dict[str, bytes]) -> None:
    if final.exists() and {f.name for f in final.iterdir()} == set(files) \
            and all((final / n).read_bytes() == d for n, d in files.items()):
        return
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f".{final.name}.tmp.{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    for name, data in files.items():
        (tmp / name).write_bytes(data)
    if final.exists():
        old = final.with_name(f".{final.name}.old.{os.getpid()}")
        final.rename(old)
        tmp.rename(final)
        shutil.rmtree(old)
    else:
        tmp.rename(final)


def write_patched_cache(src: Path, out: Path, changed: dict[str, str]) -> dict[str, Path]:
    """`out` := a copy of the cache root `src` in which each entry of `changed` (input entry -> the engine's
    rebuilt entry) holds the rewritten kernel under its original key; returns input entry -> patched entry.

    The kernel's files (every level, the binary and the metadata) come from the rebuilt entry, so they agree
    with each other; other files of the entry are kept; each group file lists the copy's own paths (Triton
    loads what the group file names). Subdirectories that are not kernel entries (Triton's compiled
    launcher modules) are copied as they are. The input is only read."""
    patched: dict[str, Path] = {}
    out = out.resolve()
    for item in sorted(src.iterdir()):
        if not item.is_dir():
            continue
        final = out / item.name
        groups = sorted(item.glob("__grp__*.json"))
        if len(groups) != 1:
            if not final.exists():
                shutil.copytree(item, final, symlinks=True)
            continue
        files = {f.name: f.read_bytes() for f in sorted(item.iterdir())
                 if f.is_file() and f.name != "lock" and not f.name.startswith("__grp__")}
        rebuilt = changed.get(str(item))
        if rebuilt is not None:
            name = entry_kernel_name(item)
            files = {n: d for n, d in files.items() if not n.startswith(f"{name}.")}
            files.update({f.name: f.read_bytes() for f in sorted(Path(rebuilt).iterdir())
                          if f.is_file() and f.name.startswith(f"{name}.")})
        files[groups[0].name] = json.dumps({"child_paths": {n: str(final / n) for n in files}}).encode()
        _write_dir_atomically(final, files)
        if rebuilt is not None:
            patched[str(item)] = final
    return patched


# ---------------------------------------------------------------------------------------------------
# Measurement
# ---------------------------------------------------------------------------------------------------
def _attach_timing(outcome: dict[str, Any], timing: dict[str, Any]) -> None:
    outcome["timing"] = timing
    for key in ("time_before_us", "time_after_us", "speedup"):
        outcome[key] = timing.get(key)
    outcome["suspicious"] = suspicious_reasons(timing) if "error" not in timing and "skipped" not in timing else []


def measure_outcomes(outcomes: list[dict[str, Any]], engine: Engine, bases: dict[str, str],
                     builds: dict[str, BuildResult], measure_fn: MeasureFn | None = None, force: bool = False,
                     tolerance: str | None = None) -> dict[str, Any]:
    """Time every changed kernel that has a launch record, one after the other (`Engine.measure`, or
    `measure_fn(outcome, record)` in tests); returns what the report says about measurement as a whole."""
    timed = skipped = failed = 0
    reasons: dict[str, str] = {}
    for o in outcomes:
        if o["status"] != "changed":
            continue
        if not o.get("launch_record"):
            o["timing"] = {"skipped": "no launch record of this binary in --launches"}
            skipped += 1
            continue
        if o.get("time_after_us") is not None and not force:
            timed += 1  # measured by an earlier run of the same pipeline (resumed)
            continue
        if measure_fn is not None:
            timing = measure_fn(o, o["launch_record"])
        else:
            build = builds.get(o["entry"])
            m = engine.measure(bases[o["entry"]], build, [o["launch_record"]]) if build is not None else \
                Measurement("skipped", "the rewritten kernel was not kept (run again with --force)")
            timing = dict(m.detail) if m.status == "timed" else \
                {"skipped" if m.status == "skipped" else "error": m.reason}
            if m.status == "skipped":
                reasons[o["target"]] = m.reason
        if "skipped" in timing:
            o["timing"] = timing
            skipped += 1
            continue
        if tolerance and "error" not in timing:
            timing["declared_tolerance"] = tolerance
        _attach_timing(o, timing)
        if "error" in timing:
            failed += 1
        else:
            timed += 1
    return {"timed": timed, "skipped": skipped, "timing_failed": failed, "reasons": reasons}


# ---------------------------------------------------------------------------------------------------
# The report
# ---------------------------------------------------------------------------------------------------
@dataclass
class RunReport:
    cache_dir: str
    out_dir: str
    pipeline: str
    kernels: list[dict[str, Any]]
    seconds: float
    #: Launch records and timing: where the records came from, how many kernels were timed, or why not.
    measure: dict[str, Any] | None = None
    #: The engine's counters: builds, cache hits, deduplicated binaries, checks.
    engine: dict[str, Any] = field(default_factory=dict)
    patched_cache: str | None = None

    def counts(self) -> dict[str, int]:
        c = {"changed": 0, "unchanged": 0, "failed": 0}
        for k in self.kernels:
            c[k["status"]] = c.get(k["status"], 0) + 1
        return c

    def to_json(self) -> dict[str, Any]:
        return {"schema": REPORT_SCHEMA, "cache_dir": self.cache_dir, "out_dir": self.out_dir, "pipeline": self.pipeline,
                "seconds": round(self.seconds, 2), "counts": self.counts(), "engine": self.engine,
                "patched_cache": self.patched_cache, "measure": self.measure, "kernels": self.kernels}

    def engine_summary(self) -> str:
        e = self.engine
        return (f"Engine: {e.get('builds', 0)} built, {e.get('build_cache_hits', 0)} from the engine cache, "
                f"{e.get('deduplicated', 0)} deduplicated (same binary as another candidate: checked and timed once), "
                f"{e.get('checks', 0)} checks run, {e.get('check_cache_hits', 0)} from the cache")

    def to_markdown(self) -> str:
        c = self.counts()
        lines = [f"# run-passes: `{self.pipeline}`", "",
                 f"{self.cache_dir} → {self.out_dir} · {len(self.kernels)} kernels: {c['changed']} changed, "
                 f"{c['unchanged']} unchanged, {c['failed']} failed · {self.seconds:.1f} s", "",
                 self.engine_summary(), ""]
        if self.patched_cache:
            lines += [f"Patched cache: `TRITON_CACHE_DIR={self.patched_cache} python your_program.py` (the cache's "
                      "keys, the rewritten kernels in place)", ""]
        timed = self.measure is not None and bool(self.measure.get("requested"))
        if self.measure is not None:
            lines += [self.measure_summary(), ""]
        lines += ["| kernel | key | options | target | status | passes that changed it | lines +/- | registers | "
                  "shared | " + ("before µs | after µs | speedup (range over rounds) | " if timed else "")
                  + "checks / error |",
                  "|---|---|---|---|---|---|---|---|---|---|" + ("---|---|---|" if timed else "")]
        for k in self.kernels:
            changed = [p for p in k["passes"] if p["status"] == "changed"]
            names = ", ".join(p["spelling"] for p in changed) or "—"
            diff = " ".join(f"+{p['lines_added']}/-{p['lines_removed']}" for p in changed) or ""
            rb, ra = k["resources_before"], k["resources_after"] or k["resources_before"]
            regs = f"{rb.get('registers', '?')} → {ra.get('registers', '?')}" if rb else ""
            shared = f"{rb.get('triton_shared', '?')} → {ra.get('triton_shared', '?')}" if rb else ""
            detail = k["error"] or "; ".join(f"{a}: {b}" for a, b in k["checks"].items() if not isinstance(b, list))
            if k.get("note"):
                detail = f"{k['note']}; {detail}" if detail else k["note"]
            skipped = [f"{p['spelling']} skipped: {p['reason']}" for p in k["passes"] if p["status"] == "skipped"]
            if skipped and not changed:
                detail = (detail + " " if detail else "") + "; ".join(skipped)
            timing = k.get("timing") or {}
            if timing.get("outputs_equal") is False and not k.get("suspicious"):
                worst = max((v for n, v in (timing.get("max_difference") or {}).items() if not n.endswith(".rel")),
                            default=None)
                detail = (f"outputs not bit-identical (max |diff| {worst:.3g}; declared tolerance "
                          f"{timing.get('declared_tolerance')}); " if worst is not None else
                          "outputs not bit-identical; ") + detail
            if k.get("suspicious"):
                detail = "SUSPICIOUS: " + "; ".join(k["suspicious"]) + (f"; {detail}" if detail else "")
            times = _timing_cells(k) if timed else ""
            options = " ".join(f"{n.removeprefix('num_')}={v}" for n, v in (k.get("launch_options") or {}).items())
            lines.append(f"| {k['name']} | {k.get('key', '')[:12]} | {options} | {k['target']} | {k['status']} | "
                         f"{names} | {diff} | {regs} | {shared} | {times}{detail.replace('|', '/')[:300]} |")
        return "\n".join(lines) + "\n"

    def measure_summary(self) -> str:
        m = self.measure or {}
        parts = [f"launch records: {m['launches']} ({m.get('matched', 0)} kernels matched)" if m.get("launches")
                 else "launch records: none given"]
        if m.get("unreadable"):  # skipped, not silently: as `optimize` notes them
            parts.append(f"{len(m['unreadable'])} launch records unreadable, the first: {m['unreadable'][0]}")
        if m.get("requested"):
            env = next((k["timing"] for k in self.kernels if k.get("timing", {}).get("device")), None)
            where = f" on {env['device']} (torch {env.get('torch')}, triton {env.get('triton')})" if env else ""
            parts.append(f"timed {m.get('timed', 0)} changed kernels{where}, skipped {m.get('skipped', 0)}, "
                         f"timing failed for {m.get('timing_failed', 0)}")
            parts += [f"timing skipped for {t}: {r}" for t, r in (m.get("reasons") or {}).items()]
            if env:
                parts.append(f"each time: median of {env.get('rounds')} rounds (ABBA order) of the median of "
                             f"{env.get('runs_per_round')} runs, L2 flushed before each run")
        return "Measurement: " + " · ".join(parts)


def _timing_cells(k: dict[str, Any]) -> str:
    t = k.get("timing") or {}
    if k.get("time_after_us") is not None:
        lo, hi = t.get("speedup_range", [k["speedup"], k["speedup"]])
        return (f"{k['time_before_us']:.2f} ±{t.get('spread_before_pct', 0):.1f}% | "
                f"{k['time_after_us']:.2f} ±{t.get('spread_after_pct', 0):.1f}% | "
                f"{k['speedup']:.3f}x ({lo:.3f}–{hi:.3f}) | ")
    why = t.get("error") or t.get("skipped") or ""
    return f"— | — | {('not timed: ' + why).replace('|', '/')[:120] if why else '—'} | "


# ---------------------------------------------------------------------------------------------------
# The driver
# ---------------------------------------------------------------------------------------------------
def _outcome_of(entry: str, build: BuildResult, launch_options: dict[str, Any]) -> KernelOutcome:
    o = KernelOutcome(entry, Path(entry).name, build.name, build.target, launch_options,
                      passes=build.passes, first_changed=build.first_changed,
                      resources_before=build.resources_before, resources_after=build.resources_after,
                      checks=dict(build.static_checks), error=build.error, repro=build.repro, seconds=build.seconds,
                      build_key=build.key, candidate_entry=build.entry, duplicate_of=build.duplicate_of,
                      cached=build.cached)
    o.status = "failed" if build.status == "failed" else build.status
    return o


def _launch_options(entry: Path) -> dict[str, Any]:
    name = entry_kernel_name(entry)
    try:
        metadata = json.loads((entry / f"{name}.json").read_text())
    except (OSError, ValueError, RecursionError):  # the entry's own load reports a corrupt file
        return {}
    return {k: metadata[k] for k in LAUNCH_OPTIONS if k in metadata and metadata[k] not in (None, 0, [], "")}


def run_passes(cache_dir: str | Path, pipeline_spec: str, out_dir: str | Path, jobs: int = 1, timeout: float = 600.0,
               force: bool = False, on_kernel: Callable[[dict[str, Any]], None] | None = None,
               kernel_filter: str | None = None, dump_dir: str | Path | None = None,
               launches: str | Path | None = None, measure: bool = False,
               measure_fn: MeasureFn | None = None, only: Sequence[str] = (),
               engine: Engine | None = None, engine_cache: str | Path | None = None,
               on_start: Callable[[int], None] | None = None) -> RunReport:
    """Run `pipeline_spec` over every kernel under `cache_dir` and write overrides (or a patched cache) and
    a report to `out_dir`.

    `only` names kernels (as `--only`); `kernel_filter` keeps entries with a file whose name contains it.
    With `launches` (a `kstrata record` directory), kernels are matched to their launch records; with
    `measure` too, changed kernels with a record are timed before and after (`measure_fn` replaces the
    engine's timing, for tests). `on_start(total)` is called once the kernels are known, `on_kernel(outcome)`
    as each one ends."""
    from kstrata.ir.candidate import CANDIDATE_FILE, CandidateInfo
    from kstrata.ir.files import make_dir
    from kstrata.ir.triton_layout import iter_cache_entries, load_any, override_keys_from_dump, write_override
    from kstrata.passes.pipeline import parse_pipeline

    pipeline = parse_pipeline(pipeline_spec)  # a bad pipeline fails here, before any work
    if measure and launches is None:
        raise KstrataError("--measure times kernels on replays of their recorded launches: give --launches DIR "
                           "(records from `kstrata record`)")
    record_index, unreadable = load_launch_records(launches) if launches is not None else ({}, [])
    src, out = Path(cache_dir).expanduser(), Path(out_dir).expanduser()
    if not src.is_dir():
        raise KstrataError("no such cache or dump directory", path=src)
    refuse_output_in_cache(src, out)
    entries = [str(e) for e in iter_cache_entries(src)]
    is_cache = bool(entries)
    if not entries:  # a dump directory: entries are directories holding a .ttgir
        entries = [str(d) for d in sorted(src.iterdir()) if d.is_dir() and any(d.glob("*.ttgir"))]
    if not entries:
        raise KstrataError("no kernels found (neither Triton cache entries nor dump entries)", path=src)
    if only:
        entries = select_entries(entries, only, src)
    if kernel_filter:
        entries = [e for e in entries if any(kernel_filter in f.name for f in Path(e).iterdir())]
    keys: dict[str, str | None] = {}
    if dump_dir is not None:  # a bad --dump-dir or --out is the one line printed, before the progress starts
        by_binary = override_keys_from_dump(dump_dir)
        for entry in entries:
            binaries = [*Path(entry).glob("*.cubin"), *Path(entry).glob("*.hsaco")]
            keys[entry] = by_binary.get(_sha(binaries[0])) if binaries else None
    make_dir(out, "output directory")
    (out / STATE_DIR).mkdir(exist_ok=True)
    if on_start is not None:
        on_start(len(entries))
    from kstrata.ir.triton_layout import read_index

    index = read_index(src) if is_cache else {}
    for entry in entries:  # a kstrata-built cache records each entry's override key in its index
        known = index.get(Path(entry).name)
        if isinstance(known, dict) and known.get("override_key"):
            keys[entry] = str(known["override_key"])
    matched = {entry: match_record(entry, record_index) for entry in entries}
    for entry, record_path in matched.items():
        if record_path and not keys.get(entry):
            # `kstrata record` saw the source Triton compiled: its hash is the override key, so a plain
            # program run (no TRITON_KERNEL_DUMP) is enough for the kernels it launched
            from kstrata.ir.launch import LaunchRecord

            keys[entry] = LaunchRecord.load(record_path).override_key
    repro_dir = out / "repro"
    start = time.perf_counter()
    results: dict[str, dict[str, Any]] = {}
    todo: list[str] = []
    redo_notes: dict[str, str] = {}
    for entry in entries:
        previous, why = _resumed(out, entry, pipeline_spec) if not force else (None, None)
        if previous is not None:
            results[entry] = previous
            if on_kernel:
                on_kernel(previous)
        else:
            todo.append(entry)
            if why:
                redo_notes[entry] = why

    own_engine = engine is None
    engine = engine or Engine(engine_cache, jobs=jobs, build_timeout=timeout)
    bases = {entry: engine.add_kernel(entry, keys.get(entry)) for entry in entries}
    level = pipeline.stages[0].level
    provenance = Provenance("run-passes", None, "ir")
    tolerance = pipeline.tolerance()
    candidates = {entry: Candidate(bases[entry], level, PipelineEdit(pipeline.spelling()),
                                   tolerance.spelling() if tolerance else None, provenance=provenance)
                  for entry in entries}
    builds: dict[str, BuildResult] = {}

    def finish(entry: str, build: BuildResult) -> None:
        """Check the build, write its override, record the outcome (in a build's worker thread)."""
        o = _outcome_of(entry, build, _launch_options(Path(entry)))
        o.note = redo_notes.get(entry)
        if build.status == "changed":
            if build.first_changed in ("ttir", "ttgir"):
                record = matched[entry]
                if record is None:  # no launch: the engine's symbolic check (kstrata.ir.symbolic) decides
                    o.checks["interpreter"] = ("not run: no launch record for this kernel "
                                               "(run-passes --launches DIR from kstrata record)")
                verdict = engine.check(bases[entry], build, [record] if record else [], device="cpu", seeds=1,
                                       tolerance=tolerance.spelling() if tolerance else None)
                if record is not None:
                    o.checks["interpreter"] = _interpreter_summary(verdict)
                sym = [e for e in verdict.evidence if e.name == "symbolic"]
                if sym:
                    o.checks["symbolic"] = "; ".join(f"{e.level}: {e.verdict}: {e.detail}"[:300] for e in sym)
                if verdict.verdict in (Verdict.DIFFERENT, Verdict.ERROR):
                    o.status, o.error = "failed", (f"kernel {build.name}: the check finds the rewrite "
                                                   f"{verdict.verdict.value}: {verdict.reason}")
                elif verdict.verdict is Verdict.UNPROVEN:  # written, and said: no dynamic evidence
                    o.checks["verdict"] = f"unproven: {verdict.reason}"
            if o.status == "changed" and keys.get(entry):
                bundle = _load_built(engine.built_entry(build), load_any)
                bundle.override_key = keys[entry]
                info = CandidateInfo(build.name, pipeline.spelling(), tolerance.spelling() if tolerance else None,
                                     tolerance.why if tolerance else None, dict(build.metadata_changes))
                levels = bundle.target.levels
                assert build.first_changed is not None
                written = [lv for lv in levels[levels.index(build.first_changed):] if lv in bundle.levels]
                # Triton keys overrides by source only, not by target: one override root per target.
                o.override_entry = str(write_override(bundle, out / target_slug(bundle.target), levels=written,
                                                      overwrite=True, extra_files={CANDIDATE_FILE: info.encode()}))
            elif o.status == "changed":
                if is_cache:
                    o.note = ((o.note + "; ") if o.note else "") + ("Triton's override key is unknown for this "
                                                                    f"plain cache entry: written to {PATCHED_CACHE}/")
                else:
                    o.status, o.error = "failed", (f"kernel {build.name}: Triton's override key is unknown for "
                                                   "this dump entry")
        builds[entry] = build
        results[entry] = o.to_json()
        _save_state(out, entry, pipeline_spec, results[entry])
        if on_kernel:
            on_kernel(results[entry])

    try:
        engine.build_many([candidates[e] for e in todo], repro_dir=repro_dir,
                          env_for=lambda c: tool_env(matched[_entry_of(c, candidates, todo)]),
                          on_built=lambda c, b: finish(_entry_of(c, candidates, todo), b))
        # entries resumed from state still need their builds for the patched cache and timing
        for entry in entries:
            if entry not in builds and results[entry].get("status") == "changed":
                builds[entry] = engine.build(candidates[entry], env=tool_env(matched[entry]))
        ordered = [results[e] for e in entries]
        _mark_key_collisions(ordered)
        patched_root: Path | None = None
        needs_patch = [e for e in entries if results[e]["status"] == "changed"
                       and (results[e].get("needs_patched_cache") or not results[e].get("override_entry"))]
        if needs_patch and is_cache:
            patched_root = out / PATCHED_CACHE
            changed = {e: engine.built_entry(builds[e]) for e in entries if results[e]["status"] == "changed"}
            patched = write_patched_cache(src, patched_root, changed)
            for entry, path in patched.items():
                results[entry]["patched_entry"] = str(path)
        for entry in entries:
            results[entry].pop("needs_patched_cache", None)
        measure_info: dict[str, Any] | None = None
        if launches is not None:
            for entry in entries:
                results[entry]["launch_record"] = matched[entry]
            measure_info = {"launches": str(launches), "records": len(set(record_index.values())),
                            "matched": sum(1 for e in entries if matched[e]),
                            "unreadable": unreadable, "requested": measure}
            if measure:
                measure_info |= measure_outcomes(ordered, engine, bases, builds, measure_fn, force,
                                                 declared_tolerances(pipeline_spec))
        for entry in entries:
            _save_state(out, entry, pipeline_spec, results[entry])
        report = RunReport(str(src), str(out), pipeline_spec, [results[e] for e in entries],
                           time.perf_counter() - start, measure_info, engine.stats.to_json(),
                           str(patched_root) if patched_root else None)
    finally:
        if own_engine:
            engine.close()
    for name, text in (("run-passes-report.json", json.dumps(report.to_json(), indent=2, default=str) + "\n"),
                       ("run-passes-report.md", report.to_markdown())):
        tmp = out / f".{name}.tmp"
        tmp.write_text(text)
        tmp.replace(out / name)
    return report


def _entry_of(c: Candidate, candidates: dict[str, Candidate], todo: list[str]) -> str:
    return next(e for e in todo if candidates[e] is c)


def _load_built(entry: str, load_any: Any) -> Any:
    bundles, errors = load_any(entry)
    if errors:
        raise errors[0]
    return bundles[0]


def _interpreter_summary(verdict: Any) -> str:
    interp = [e for e in verdict.evidence if e.name.startswith("interpreter")]
    passed = sum(1 for e in interp if e.verdict == "pass")
    skipped = [f"{e.name}: {e.detail}" for e in interp if e.verdict == "skipped"]
    return f"{passed} of {len(interp)} input sets equivalent" + (f"; skipped {'; '.join(skipped)}" if skipped else "")
