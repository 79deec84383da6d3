"""Evidence about the incumbent: torch.profiler kernel table, Nsight Compute metrics, SASS statistics.

Each source that cannot run says why in its note (no GPU; `ncu` not found or not permitted; a kernel
whose binary cannot be disassembled), and the loop goes on without it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from kstrata.agents.optimize.findings import Evidence

NCU_TOP_KERNELS = 8


def find_ncu() -> str | None:
    env = os.environ.get("KSTRATA_NCU")
    if env:
        return env
    found = shutil.which("ncu")
    if found:
        return found
    for cand in ("/usr/local/cuda/bin/ncu", "/opt/nvidia/nsight-compute/ncu"):
        if Path(cand).exists():
            return cand
    return None


def sass_summary(cache_dir: Path) -> tuple[list[dict[str, Any]], str]:
    """Per Triton kernel compiled into `cache_dir`: registers, local (spill) bytes, tensor-core ops, load widths."""
    try:
        from kstrata.backends.nvidia import cubin_resource_usage, sass, sass_instruction_mix
        from kstrata.ir.triton_layout import load_any
    except Exception as exc:
        return [], f"SASS statistics unavailable: {exc}"
    try:
        bundles, errors = load_any(cache_dir)
    except Exception as exc:
        return [], f"no Triton kernels to disassemble ({type(exc).__name__}: {exc})"
    rows: list[dict[str, Any]] = []
    for b in bundles:
        cubin = b.levels.get("cubin")
        if not isinstance(cubin, bytes):
            continue
        try:
            mix = sass_instruction_mix(sass(cubin))
            res = cubin_resource_usage(cubin, b.name)
        except Exception as exc:
            rows.append({"name": b.name, "error": f"{type(exc).__name__}: {exc}"})
            continue
        widths: dict[int, int] = dict(mix.widths.get("load.global", {}))
        row: dict[str, Any] = {"name": b.name, "registers": res.registers, "local_bytes": res.local_bytes,
                     "shared_bytes": res.shared_bytes, "instructions": mix.total,
                     "mma": mix.by_category.get("mma", 0) + mix.by_category.get("wgmma", 0),
                     "wide_global_loads": sum(n for w, n in widths.items() if w >= 128),
                     "narrow_global_loads": sum(n for w, n in widths.items() if w < 128)}
        rows.append(row)
    note = "" if rows else ("the incumbent compiled no Triton kernels (eager or library code): no SASS statistics"
                            if not errors else f"Triton cache unreadable: {errors[:1]}")
    return rows, note


def collect_evidence(ev: Evidence, search: Any, candidate: Path) -> None:
    evaluator = search.ev
    if not evaluator.timed:
        ev.profile_note = "no GPU: no profile (torch.profiler, Nsight Compute, SASS) — findings from the task's operators only"
        return
    cache = Path(tempfile.mkdtemp(prefix="triton-cache-", dir=evaluator.workdir))
    try:
        r = evaluator.profile(search.info.path, candidate, triton_cache=cache)
        if r.ok:
            ev.profile = {k: v for k, v in r.data.items() if not k.startswith("_")}
        else:
            ev.profile_note = f"torch.profiler did not run: {r.error}"
        rows, note = sass_summary(cache)
        ev.sass, ev.sass_note = (rows or None), note
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    if not search.opts.ncu:
        ev.ncu_note = "Nsight Compute not asked for (--no-ncu)"
        return
    ncu = find_ncu()
    if ncu is None:
        ev.ncu_note = "Nsight Compute (ncu) not found: no hardware metrics; the loop runs without them"
        return
    n = evaluator.ncu(search.info.path, candidate, ncu, launch_count=NCU_TOP_KERNELS, timeout_s=90.0)
    if not n.ok:
        ev.ncu_note = f"Nsight Compute did not run ({n.error}); the loop runs without its metrics"
        return
    kernels = sorted(n.data["kernels"], key=lambda k: -(k.get("gpu__time_duration.sum") or 0))
    ev.ncu = kernels[:NCU_TOP_KERNELS]
