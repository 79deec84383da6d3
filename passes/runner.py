"""`kstrata run-passes`: a pipeline over every kernel of a Triton cache root or dump directory.

For each kernel: load it, run the pipeline (the lower levels are rebuilt with Triton's stages), run the
static checks (signature and launch ABI unchanged; resources before and after), and write the changed
levels in `TRITON_OVERRIDE_DIR` layout. Each kernel runs in its own child process with a timeout, so a
crash in a compiler (LLVM aborts the process on some bad input) is that kernel's failure, not the run's.
The run never writes into the directory it reads; it records each kernel's result under
`OUT/.kstrata-run/` and skips kernels already done when started again (resumable); at the end it
writes `OUT/run-passes-report.json` and `.md`.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kstrata.ir.errors import KstrataError

REPORT_SCHEMA = "kstrata.run-passes/1"
STATE_DIR = ".kstrata-run"


@dataclass
class KernelOutcome:
    """What happened to one kernel."""

    entry: str
    name: str = "?"
    target: str = "?"
    status: str = "failed"  # "changed", "unchanged", "failed"
    passes: list[dict[str, Any]] = field(default_factory=list)
    first_changed: str | None = None
    override_entry: str | None = None
    resources_before: dict[str, Any] = field(default_factory=dict)
    resources_after: dict[str, Any] = field(default_factory=dict)
    checks: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    repro: str | None = None
    seconds: float = 0.0

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


def _resources(bundle: Any) -> dict[str, Any]:
    from kstrata.backends.resources import resource_usage

    usage = resource_usage(bundle).to_json()
    keep = ("registers", "sgprs", "agprs", "shared_bytes", "local_bytes", "stack_bytes", "vgpr_spills", "sgpr_spills")
    out = {k: usage[k] for k in keep if usage.get(k) is not None}
    out["triton_shared"] = bundle.shared
    out["num_warps"] = bundle.num_warps
    return out


def _static_checks(before: Any, after: Any) -> dict[str, Any]:
    """What must not change for a launcher, checked; raises `KstrataError` on a violation."""
    checks: dict[str, Any] = {}
    if before.signature != after.signature:
        raise KstrataError(f"kernel {before.name}: the signature changed {before.signature} -> {after.signature}")
    checks["signature"] = "unchanged"
    from kstrata.backends import checks as shared

    if before.target.backend == "cuda":
        # option passes may change the block size on purpose: launch bounds are reported, not refused
        changed = shared.ptx_entry_changes(before.text("ptx"), after.text("ptx"), launch_bounds=False)
        if changed:
            raise KstrataError(f"kernel {before.name}: the PTX entry changed: {'; '.join(changed)}")
        checks["ptx_entry"] = "name and parameters unchanged"
        bounds = shared.ptx_entry_changes(before.text("ptx"), after.text("ptx"))
        checks["block_threads"] = "; ".join(bounds) or "unchanged"
    else:
        abi, other = shared.amd_metadata_changes(shared.binary(before.level("hsaco")),
                                                 shared.binary(after.level("hsaco")), workgroup=False)
        if abi:
            raise KstrataError(f"kernel {before.name}: the code object's ABI changed: {'; '.join(abi)}")
        checks["code_object_abi"] = "kernarg layout and wave size unchanged"
        checks["resource_changes"] = other
    return checks


def process_kernel(entry: str, pipeline_spec: str, out_dir: str, repro_dir: str,
                   override_key: str | None = None) -> dict[str, Any]:
    """Run the pipeline on one kernel (in this process); returns a `KernelOutcome` as JSON."""
    from kstrata.ir.triton_layout import load_any, write_override

    from .pipeline import PassFailure, parse_pipeline, run_pipeline

    start = time.perf_counter()
    outcome = KernelOutcome(entry)
    try:
        bundles, errors = load_any(entry)
        if errors:
            raise errors[0]
        bundle = bundles[0]
        bundle.override_key = bundle.override_key or override_key
        outcome.name, outcome.target = bundle.name, str(bundle.target)
        result = run_pipeline(bundle, parse_pipeline(pipeline_spec), repro_dir)
        outcome.passes = [r.__dict__ for r in result.records]
        outcome.resources_before = _resources(bundle)
        if not result.changed:
            outcome.status = "unchanged"
        else:
            outcome.first_changed = result.first_changed
            outcome.checks = _static_checks(bundle, result.bundle)
            outcome.resources_after = _resources(result.bundle)
            levels = bundle.target.levels
            assert result.first_changed is not None
            written = [lv for lv in levels[levels.index(result.first_changed):] if lv in result.bundle.levels]
            if bundle.override_key is None:
                raise KstrataError(f"kernel {bundle.name}: Triton's override key is unknown for this cache entry; run "
                                   "the program with TRITON_KERNEL_DUMP=1 too and pass its dump directory "
                                   "(--dump-dir), or use a cache built through kstrata", path=entry)
            # Triton keys overrides by source only, not by target: one override root per target.
            target_dir = Path(out_dir) / target_slug(bundle.target)
            outcome.override_entry = str(write_override(result.bundle, target_dir, levels=written, overwrite=True))
            outcome.status = "changed"
    except PassFailure as exc:
        outcome.error, outcome.repro = str(exc), exc.repro
    except Exception as exc:  # every other failure is this kernel's, reported with its reason
        outcome.error = f"{type(exc).__name__}: {exc}"
    outcome.seconds = time.perf_counter() - start
    return outcome.to_json()


def _mark_key_collisions(outcomes: list[dict[str, Any]]) -> None:
    """Kernels that share an override entry cannot be overridden separately (Triton keys overrides by the
    source hash, which autotuning variants of one kernel share): fail all of them and drop the entry."""
    import shutil

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
            o["status"] = "failed"
            o["error"] = (f"override key collision with {', '.join(others)}: Triton keys overrides by source hash only, "
                          "so variants of one kernel (e.g. autotuning configs) cannot be overridden separately")
            o["override_entry"] = None


def _state_file(out: Path, entry: str, pipeline_spec: str) -> Path:
    digest = hashlib.sha256(f"{Path(entry).resolve()}|{pipeline_spec}".encode()).hexdigest()[:24]
    return out / STATE_DIR / f"{digest}.json"


def _run_child(entry: str, pipeline_spec: str, out_dir: str, repro_dir: str, timeout: float,
               override_key: str | None) -> dict[str, Any]:
    args = json.dumps([entry, pipeline_spec, out_dir, repro_dir, override_key])
    try:
        proc = subprocess.run([sys.executable, "-m", "kstrata.passes.runner", args], capture_output=True, text=True,
                              timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return KernelOutcome(entry, error=f"timed out after {timeout:g} s").to_json()
    if proc.returncode != 0:
        reason = f"killed by signal {-proc.returncode}" if proc.returncode < 0 else f"exit code {proc.returncode}"
        tail = "\n".join(proc.stderr.strip().splitlines()[-5:])
        return KernelOutcome(entry, error=f"the kernel's worker process died ({reason}): {tail}").to_json()
    last = proc.stdout.strip().splitlines()[-1]
    return dict(json.loads(last))


@dataclass
class RunReport:
    cache_dir: str
    out_dir: str
    pipeline: str
    kernels: list[dict[str, Any]]
    seconds: float

    def counts(self) -> dict[str, int]:
        c = {"changed": 0, "unchanged": 0, "failed": 0}
        for k in self.kernels:
            c[k["status"]] = c.get(k["status"], 0) + 1
        return c

    def to_json(self) -> dict[str, Any]:
        return {"schema": REPORT_SCHEMA, "cache_dir": self.cache_dir, "out_dir": self.out_dir, "pipeline": self.pipeline,
                "seconds": round(self.seconds, 2), "counts": self.counts(), "kernels": self.kernels}

    def to_markdown(self) -> str:
        c = self.counts()
        lines = [f"# run-passes: `{self.pipeline}`", "",
                 f"{self.cache_dir} → {self.out_dir} · {len(self.kernels)} kernels: {c['changed']} changed, "
                 f"{c['unchanged']} unchanged, {c['failed']} failed · {self.seconds:.1f} s", "",
                 "| kernel | target | status | passes that changed it | lines +/- | registers | shared | checks / error |",
                 "|---|---|---|---|---|---|---|---|"]
        for k in self.kernels:
            changed = [p for p in k["passes"] if p["status"] == "changed"]
            names = ", ".join(p["spelling"] for p in changed) or "—"
            diff = " ".join(f"+{p['lines_added']}/-{p['lines_removed']}" for p in changed) or ""
            rb, ra = k["resources_before"], k["resources_after"] or k["resources_before"]
            regs = f"{rb.get('registers', '?')} → {ra.get('registers', '?')}" if rb else ""
            shared = f"{rb.get('triton_shared', '?')} → {ra.get('triton_shared', '?')}" if rb else ""
            detail = k["error"] or "; ".join(f"{a}: {b}" for a, b in k["checks"].items() if not isinstance(b, list))
            skipped = [f"{p['spelling']} skipped: {p['reason']}" for p in k["passes"] if p["status"] == "skipped"]
            if skipped and not changed:
                detail = (detail + " " if detail else "") + "; ".join(skipped)
            lines.append(f"| {k['name']} | {k['target']} | {k['status']} | {names} | {diff} | {regs} | {shared} | "
                         f"{detail.replace('|', '/')[:300]} |")
        return "\n".join(lines) + "\n"


def run_passes(cache_dir: str | Path, pipeline_spec: str, out_dir: str | Path, jobs: int = 1, timeout: float = 600.0,
               force: bool = False, on_kernel: Callable[[dict[str, Any]], None] | None = None,
               kernel_filter: str | None = None, dump_dir: str | Path | None = None) -> RunReport:
    """Run `pipeline_spec` over every kernel under `cache_dir` and write overrides and a report to `out_dir`."""
    from kstrata.ir.triton_layout import iter_cache_entries, override_keys_from_dump

    from .pipeline import parse_pipeline

    parse_pipeline(pipeline_spec)  # a bad pipeline fails here, before any work
    src, out = Path(cache_dir), Path(out_dir)
    if not src.is_dir():
        raise KstrataError("no such cache or dump directory", path=src)
    if _inside(out, src) or _inside(src, out):
        raise KstrataError(f"the output directory {out} must not be inside the cache directory (or contain it): "
                           "kstrata never writes into a cache it reads", path=src)
    entries = [str(e) for e in iter_cache_entries(src)]
    if not entries:  # a dump directory: entries are directories holding a .ttgir
        entries = [str(d) for d in sorted(src.iterdir()) if d.is_dir() and any(d.glob("*.ttgir"))]
    if not entries:
        raise KstrataError("no kernels found (neither Triton cache entries nor dump entries)", path=src)
    if kernel_filter:
        entries = [e for e in entries if any(kernel_filter in f.name for f in Path(e).iterdir())]
    keys: dict[str, str | None] = {}
    if dump_dir is not None:
        by_binary = override_keys_from_dump(dump_dir)
        for entry in entries:
            binaries = [*Path(entry).glob("*.cubin"), *Path(entry).glob("*.hsaco")]
            digest = hashlib.sha256(binaries[0].read_bytes()).hexdigest() if binaries else ""
            keys[entry] = by_binary.get(digest)
    (out / STATE_DIR).mkdir(parents=True, exist_ok=True)
    repro_dir = str(out / "repro")
    start = time.perf_counter()
    results: dict[str, dict[str, Any]] = {}
    todo = []
    for entry in entries:
        state = _state_file(out, entry, pipeline_spec)
        if state.exists() and not force:
            results[entry] = json.loads(state.read_text())
            if on_kernel:
                on_kernel(results[entry])
        else:
            todo.append(entry)

    def work(entry: str) -> dict[str, Any]:
        outcome = _run_child(entry, pipeline_spec, str(out), repro_dir, timeout, keys.get(entry))
        state = _state_file(out, entry, pipeline_spec)
        tmp = state.with_suffix(f".tmp.{os.getpid()}.{id(entry)}")
        tmp.write_text(json.dumps(outcome, default=str))
        tmp.replace(state)
        return outcome

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        for entry, outcome in zip(todo, pool.map(work, todo), strict=True):
            results[entry] = outcome
            if on_kernel:
                on_kernel(outcome)
    _mark_key_collisions([results[e] for e in entries])
    report = RunReport(str(src), str(out), pipeline_spec, [results[e] for e in entries], time.perf_counter() - start)
    for name, text in (("run-passes-report.json", json.dumps(report.to_json(), indent=2, default=str) + "\n"),
                       ("run-passes-report.md", report.to_markdown())):
        tmp = out / f".{name}.tmp"
        tmp.write_text(text)
        tmp.replace(out / name)
    return report


if __name__ == "__main__":  # the per-kernel worker: python -m kstrata.passes.runner '[entry, pipeline, out, repro]'
    entry_arg, spec_arg, out_arg, repro_arg, key_arg = json.loads(sys.argv[1])
    print(json.dumps(process_kernel(entry_arg, spec_arg, out_arg, repro_arg, key_arg), default=str))
