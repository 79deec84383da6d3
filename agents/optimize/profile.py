"""Evidence about the incumbent: torch.profiler kernel table, Nsight Compute metrics, SASS statistics.

Each source that cannot run says why in its note (no GPU; `ncu` not found or not permitted; a kernel
whose binary cannot be disassembled), and the loop goes on without it.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

from kstrata.agents.optimize.findings import Evidence

#: Nsight Compute profiles only the incumbent's top kernels (by torch.profiler time), one launch each, in one
#: ncu process per task bounded by `NCU_TIMEOUT_S` (less when the profiling share of the time limit is short).
NCU_TOP_KERNELS = 2
NCU_TIMEOUT_S = 40.0
NCU_MIN_S = 8.0  # less time left than this before the search must start: ncu is skipped
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def kernel_base_name(name: str) -> str | None:
    """The function name ncu matches by default (no return type, namespaces, template arguments or parameters).

    `void at::native::(anonymous namespace)::RowwiseMomentsCUDAKernel<float>(long, float)` ->
    `RowwiseMomentsCUDAKernel`; `triton_red_fused_0` stays; None when no plain identifier comes out."""
    s = name.strip()
    depth, cut = 0, len(s)
    for i in range(len(s) - 1, -1, -1):  # drop the parameter list: the last top-level parenthesized group
        ch = s[i]
        if ch == ")":
            depth += 1
        elif ch == "(":
            depth -= 1
            if depth == 0:
                cut = i
                break
    if s.endswith(")"):
        s = s[:cut]
    out, depth = [], 0
    for ch in s:  # drop template arguments
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(0, depth - 1)
        elif depth == 0:
            out.append(ch)
    qual = "".join(out).strip().replace("(anonymous namespace)", "anon")
    qual = qual[5:].strip() if qual.startswith("void ") else qual
    if not qual or " " in qual:  # not a kernel signature (a memcpy or memset row)
        return None
    base = qual.split("::")[-1]
    return base if _IDENT.fullmatch(base) else None


def top_kernel_names(profile: dict[str, Any] | None, n: int = NCU_TOP_KERNELS) -> list[str]:
    """Base names of the profile's `n` most time-consuming kernels (distinct, plain identifiers only)."""
    names: list[str] = []
    rows = sorted((profile or {}).get("kernels", []), key=lambda r: -float(r.get("time_us_per_call") or 0))
    for r in rows:
        b = kernel_base_name(str(r.get("name", "")))
        if b and b not in names:
            names.append(b)
        if len(names) >= n:
            break
    return names


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
    except Exception:  # no cache entries: eager or library code compiles no Triton kernel
        return [], "the incumbent runs no Triton kernels: no SASS statistics"
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


def collect_evidence(ev: Evidence, search: Any, candidate: Path, time_left: Any = None) -> None:
    """Fill `ev` from the sources that run; `time_left()` (seconds until the search must start) bounds them."""
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
    left = float(time_left()) if time_left is not None else NCU_TIMEOUT_S
    if left < NCU_MIN_S:
        ev.ncu_note = (f"Nsight Compute skipped: {max(0.0, left):.0f} s left before the search must start "
                       f"(the search gets its guaranteed share of the time limit)")
        return
    names = top_kernel_names(ev.profile)
    n = evaluator.ncu(search.info.path, candidate, ncu, launch_count=max(1, len(names)) if names else 1,
                      timeout_s=min(NCU_TIMEOUT_S, left), kernels=names)
    if not n.ok and names and time_left is not None and float(time_left()) >= NCU_MIN_S:
        # the name filter matched nothing (names ncu spells otherwise): the call's first launches instead
        n = evaluator.ncu(search.info.path, candidate, ncu, launch_count=NCU_TOP_KERNELS,
                          timeout_s=min(NCU_TIMEOUT_S, float(time_left())))
    if not n.ok:
        ev.ncu_note = f"Nsight Compute did not run ({n.error}); the loop runs without its metrics"
        return
    kernels = sorted(n.data["kernels"], key=lambda k: -(k.get("gpu__time_duration.sum") or 0))
    ev.ncu = kernels[:NCU_TOP_KERNELS]
