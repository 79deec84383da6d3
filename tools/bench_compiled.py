"""On an NVIDIA GPU (H200): the compiled-kernel optimizer over the Inductor kernels of the project's models
and tasks, and the tuned torch.compile backend end to end against plain Inductor.

    python -m kstrata.tools.bench_compiled --results testsuite/results [--minutes 20] [--budget 16]
                                           [--models mlp_fp16,...] [--all-tasks] [--work DIR] [--tag T] [--tuned DB]

Per model (the MLP, transformer block and conv block of `gpu_torch_backend`, and three of the project's
tasks, or every task with `--all-tasks`):

1. **record**: the model compiled by Inductor and run in a child process under `kstrata record` with its
   own `TRITON_CACHE_DIR` and Inductor cache, so the cache holds exactly the kernels the program compiled
   and the records (with launch counts and buffer addresses) the ones it launched;
2. **optimize**: `kstrata optimize CACHE --launches RECORDS` (kstrata.agents.compiled) on the GPU: shares
   measured, every candidate gated by the differential run before it is timed, winners guarded; the
   model's slice of `--minutes` is what is left after its recording, less its own re-check and end to end
   and the other steps of each later model (the largest measured on the models before, at first 1.2
   minutes, and at least 6 times this model's recording), divided by the models left (`_search_minutes`);
3. **re-check**: every winner verified again with fresh seeds (3 input sets, the GPU differential run):
   a failure counts as a wrong result;
4. **end to end**: plain `torch.compile(model)` against `torch.compile(model, backend="kstrata",
   options={"tuned": OUT/tuned})`, outputs compared, each timed (CUDA events, L2 flushed, median of 50);
   then both profiled (`backends/device_profile.py`: torch.profiler, a few calls, L2 flushed before each):
   each kernel's device time per call inside each program, and the device-busy time per call beside the
   wall time per call. The end-to-end figure the kernels predict (`expected_end_to_end`) comes from isolated,
   L2-flushed kernel timings; the in-program device times are its check.

`--tuned DB` skips steps 1-3 for the one model of `--models`: the database (a search's `OUT/tuned`, from this
machine or another of the same target and versions) is measured end to end, its kernels' figures as the search
that made it measured them. The end to end's steps are timed into its JSON (`seconds`).

Writes `compiled-bench-<date>.json` and `.md` under `--results` (after every model's search, its row marked
as waiting for its re-check and end to end, and again when those end, so a run cut short keeps what it measured): per kernel the space and edit that won, speedup with its range over A/B rounds,
trials and verdict counts, and its %SOL before and after (the bytes of its launch record's buffers over the
peak bandwidth: an estimate, `buffer_sol`); per model the tuned backend's speedup over Inductor, how many
kernels it replaced, and each tuned kernel's in-program device time beside its isolated A/B; the geomean
over changed kernels, wrong results, and the wall time of the whole run. Exit 0 when the run completed with
zero wrong results, 1 otherwise, 2 without an NVIDIA GPU.
"""

from __future__ import annotations

import datetime as _dt
import functools
import json
import math
import platform
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Any

import typer

from kstrata.agents.roofline import copy_bandwidth
from kstrata.backends.device_profile import PROFILE_CALLS, DeviceProfile, profile_calls
from kstrata.backends.timing import L2_FLUSH_BYTES, CudaClock
from kstrata.tools.gpu_torch_backend import MODELS

ROOT = Path(__file__).resolve().parents[1]


def _model(name: str, all_tasks: bool) -> tuple[Any, tuple[Any, ...]]:
    from kstrata.tools.gpu_torch_backend import _models

    if name.startswith("task:"):  # the named task alone (instantiating every task at its published size is GBs)
        path = _task_path(name)
        if not path.is_file():
            raise ValueError(f"{name}: no task {path.relative_to(ROOT)}")
        from kstrata.agents.tasks import load_task

        model, inputs = load_task(path).instantiate("cuda")
        return model, tuple(inputs)
    return _models()[name]


def _task_path(name: str) -> Path:
    """The task file a `task:<folder>/<task>` name stands for."""
    return ROOT / "testsuite" / "tasks" / (name[len("task:"):] + ".py")


def _unknown_model(names: list[str]) -> str | None:
    """Why a name of `--models` names nothing (None when each names a model or a task file)."""
    for name in names:
        if name.startswith("task:"):
            path = _task_path(name)
            if not path.is_file():
                return f"{name}: no task {path.relative_to(ROOT)}"
        elif name not in MODELS:
            return f"{name}: not a model ({', '.join(MODELS)}) or task:<folder>/<task> under testsuite/tasks"
    return None


def _names(all_tasks: bool) -> list[str]:
    from kstrata.tools.gpu_torch_backend import TASKS

    names = list(MODELS)
    if all_tasks:
        from kstrata.agents.tasks import find_tasks

        paths = [Path(p).relative_to(ROOT / "testsuite" / "tasks") for p in find_tasks(ROOT / "testsuite" / "tasks")]
    else:
        paths = [Path(t) for t in TASKS]
    return names + [f"task:{p.parent.name}/{p.stem}" for p in paths]


def _child(name: str, all_tasks: bool) -> int:
    """In the recorded process: compile the model with Inductor and run it a few times."""
    import torch

    torch.manual_seed(0)
    model, inputs = _model(name, all_tasks)
    with torch.no_grad():
        compiled: Any = torch.compile(model)
        for _ in range(3):
            compiled(*inputs)
        torch.cuda.synchronize()
    return 0


def _flat(value: Any) -> list[Any]:
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _flat(v)]
    return [value]


def _call(model: Any, inputs: tuple[Any, ...]) -> None:
    model(*inputs)


def _record(name: str, work: Path, all_tasks: bool) -> tuple[Path, Path]:
    from kstrata.tools.record import record_command

    cache, records = work / "triton-cache", work / "records"
    env_keys = {"TRITON_CACHE_DIR": str(cache), "TORCHINDUCTOR_CACHE_DIR": str(work / "inductor-cache")}
    cmd = [sys.executable, "-m", "kstrata.tools.bench_compiled", "--child", name, "--results", str(work)]
    if all_tasks:
        cmd.append("--all-tasks")
    code, _ = record_command(cmd, records, max_per_kernel=1, timeout=900, env=env_keys)
    if code != 0:
        raise RuntimeError(f"the recorded run of {name} exited with {code}")
    return cache, records


def _recheck(report: Any, seeds: int = 3) -> list[dict[str, Any]]:
    """Every winner verified again on the GPU on `seeds` random seeds, 0 to seeds - 1 (the gate ran seed 0; the
    others are new to it), and the edge inputs (redzones, the differential run, determinism); a failure is a
    wrong result. compute-sanitizer and the CPU interpreter ran on each winner when the search accepted it: at a
    published size that check took 194 s on gap task 01 (H100, 2026-12-07), and three seeds of it would be
    minutes more."""
    from kstrata.agents.engine import Candidate, Engine, PipelineEdit, VerifyOptions, tool_env

    rows = []
    with Engine(tempfile.mkdtemp(prefix="kstrata-recheck-")) as engine:
        for k in report.kernels:
            s = k.get("search")
            if not s or s.get("winner") is None:
                continue
            t = s["trials"][s["winner"]]
            # the config searched: the recorded one, or the faster config the search started from
            started = s.get("started_from") or {}
            entry, record = s.get("entry") or k["entry"], s.get("record") or k["record"]
            base = engine.add_kernel(entry, started.get("override_key") if started else k.get("override_key"))
            # the ptxas the recorded program used (Inductor points Triton at torch's own): as the search built it
            built = engine.build(Candidate(base, t["level"], PipelineEdit(t["pipeline"]), t["tolerance"]),
                                 env=tool_env(record))
            v = engine.check(base, built, [record], device="cuda", seeds=seeds, tolerance=t["tolerance"],
                             verify=VerifyOptions(seeds=seeds, device="cuda", sanitizer="none", interpreter=False))
            rows.append({"kernel": k["name"], "key": k["key"], "pipeline": t["pipeline"], "verdict": v.verdict.value,
                         "reason": v.reason, "build": built.status, "same_binary": built.binary_digest == t["binary_digest"],
                         "seconds": round(v.seconds, 1), "seeds": seeds})
    return rows


def _end_to_end(name: str, all_tasks: bool, tuned: Path, work: Path,
                on_timed: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """`on_timed(partial)`: called with the outputs' comparison and the A/B before the launch census and the
    profiles, so a run cut during those keeps its end-to-end figure."""
    import torch

    import kstrata.tools.torch_backend as tb
    from kstrata.agents.tuned import LaunchCensus, TunedDB
    from kstrata.backends.timing import interleaved_ab
    from kstrata.tools.gpu_torch_backend import redrawn

    TunedDB(tuned).create()  # no winner: an empty database, and the backend leaves every kernel as it is
    phases: dict[str, float] = {}  # seconds per step: at a published size the compiles and profiles take minutes
    clock = [time.perf_counter()]

    def lap(step: str) -> None:
        now = time.perf_counter()
        phases[step] = round(now - clock[0], 1)
        clock[0] = now
        print(f"  {name}: end to end: {step} {phases[step]:.1f} s", flush=True)

    torch.manual_seed(0)
    model, inputs = _model(name, all_tasks)
    fresh = redrawn(inputs)
    lap("model and inputs")
    with torch.no_grad():
        torch._dynamo.reset()
        inductor: Any = torch.compile(model)
        inductor(*inputs)
        lap("Inductor's compile")
        before = len(tb.report())
        ours: Any = torch.compile(model, backend="kstrata", options={"tuned": str(tuned), "cache_dir": str(work / "tb")})
        ours(*inputs)
        lap("the tuned backend's compile")
        # compared on other inputs, ours first: the caching allocator hands ours the blocks Inductor's run just
        # freed, holding its (correct) values for `inputs`, so a tuned kernel that leaves elements unwritten
        # would still match there; for `fresh` those values are wrong
        out = ours(*fresh)
        ref = inductor(*fresh)
        # both compiled first, then timed in alternating rounds (ABBA): a drift of the host or the GPU's clocks
        # falls on both (timed one after the other, identical code measured 1.33x apart on the H200)
        ab = interleaved_ab(functools.partial(_call, inductor, inputs), functools.partial(_call, ours, inputs),
                            rounds=6, runs=20, margin=1e9)
        lap("outputs compared, A/B timed")
        if on_timed is not None:
            on_timed(_compared(tb.report()[before:], ref, out, ab, phases)
                     | {"partial": "its launch census and in-program profiles had not ended"})
        # which binaries the tuned model ran: Inductor's autotuner chooses among the configs it compiled, tuned
        # or not, so a deployed variant need not be the one that runs
        with LaunchCensus(tuned) as census:
            for _ in range(CENSUS_CALLS):
                ours(*inputs)
            torch.cuda.synchronize()
        # and which configs plain Inductor's autotuner chose in its build: the baseline's own lottery (on
        # 2026-12-04 the MLP's silu ran its 1.7x slower config in one build and its faster one in another)
        with LaunchCensus(tuned) as base_census:
            for _ in range(CENSUS_CALLS):
                inductor(*inputs)
            torch.cuda.synchronize()
        lap("launch census")
        # the check of the prediction: each kernel's device time inside the program, as the A/B ran it (L2
        # flushed before each call); the kernel-level A/B ran each kernel alone with the L2 flushed before it
        allocate = CudaClock.cuda().scratch
        scratch = allocate(L2_FLUSH_BYTES) if allocate is not None else None
        profiles = {side: _profile(functools.partial(_call, model_, inputs), scratch)
                    for side, model_ in (("inductor", inductor), ("tuned", ours))}
        lap("in-program profiles")
    launched = census.rows(CENSUS_CALLS)
    return _compared(tb.report()[before:], ref, out, ab, phases) | {
        "launched": launched, "inductor_launched": base_census.rows(CENSUS_CALLS),
        "in_program": in_program(profiles["inductor"], profiles["tuned"],
                                 {r["kernel"]: r["edit"] for r in launched if r["tuned"]},
                                 {"inductor": ab.median_a_us, "tuned": ab.median_b_us})}


def _compared(records: list[dict[str, Any]], ref: Any, out: Any, ab: Any, phases: dict[str, float]) -> dict[str, Any]:
    """The end to end's outputs compared and its A/B: what the tuned backend did with each kernel (`records`, its
    report), the outputs' difference, both medians and the speedup."""
    import torch

    kernels = [k for k in records if k["status"] != "autotune"]  # one per compiled kernel
    tuned_n = sum(k["status"] == "tuned" for k in kernels)
    pairs = list(zip(_flat(ref), _flat(out), strict=True))
    return {"bitwise_equal": all(torch.equal(a, b) for a, b in pairs),
            "max_abs_diff": max((float((a.double() - b.double()).abs().max()) if a.numel() else 0.0 for a, b in pairs),
                                default=0.0),
            "tuned_kernels": tuned_n,
            "kernels": [{"name": k["name"], "status": k["status"], "reason": k.get("reason", "")[:300]} for k in kernels],
            "untouched_kernels": sum(k["status"] != "tuned" for k in kernels),
            # whether Inductor's autotuner was made to use each tuned config, or chose freely and why
            "autotune": [{"name": k["name"], "reason": k.get("reason", "")[:400]} for k in records
                         if k["status"] == "autotune"],
            "inductor_us": ab.median_a_us, "tuned_us": ab.median_b_us, "timing": ab.to_json(),
            # with no kernel tuned the two run the same code: the ratio is the timing's own spread, no speedup
            "speedup": ab.speedup if tuned_n else None, "same_code_ratio": None if tuned_n else ab.speedup,
            "seconds": dict(phases)}


#: Calls of the tuned model whose launches are counted (`LaunchCensus`) after its timing.
CENSUS_CALLS = 3


def _profile(fn: Any, scratch: Any) -> DeviceProfile:
    """`profile_calls` with the timer's L2 flush before each call; a failure is a reason, never the bench's end."""
    try:
        return profile_calls(fn, PROFILE_CALLS, before=scratch.zero_ if scratch is not None else None)
    except Exception as exc:  # the profiler is a check of the timing, not part of it
        return DeviceProfile(PROFILE_CALLS, reason=f"profiling failed: {type(exc).__name__}: {str(exc)[:300]}")


def in_program(inductor: DeviceProfile, tuned: DeviceProfile, tuned_edits: dict[str, str | None],
               wall_us: dict[str, float]) -> dict[str, Any]:
    """The end-to-end JSON's in-program figures: per kernel name its device time per call in plain Inductor's
    program and in the tuned one (`inductor_us`, `tuned_us`; a name launched several times a call sums), and for
    the kernels whose tuned binary ran (`tuned_edits`: name to edit, from the census) their ratio; per side the
    device-busy time per call beside the wall time per call (the A/B's median: CUDA events around one call,
    L2 flushed), so a reader sees whether the model is launch-bound. `reason` says why figures are missing."""
    a, b = inductor.by_name(), tuned.by_name()
    kernels = []
    for name in sorted(a.keys() | b.keys(), key=lambda n: -max(k.us_per_call for k in (a.get(n), b.get(n)) if k)):
        ka, kb = a.get(name), b.get(name)
        row: dict[str, Any] = {"kernel": name, "inductor_us": ka.us_per_call if ka else None,
                               "tuned_us": kb.us_per_call if kb else None,
                               "inductor_launches": ka.launches_per_call if ka else None,
                               "tuned_launches": kb.launches_per_call if kb else None, "tuned": name in tuned_edits}
        if name in tuned_edits:
            row["edit"] = tuned_edits[name]
            row["in_program_ratio"] = ka.us_per_call / kb.us_per_call if ka and kb and kb.us_per_call else None
        kernels.append(row)
    reasons = [f"{side}: {p.reason}" for side, p in (("inductor", inductor), ("tuned", tuned)) if p.reason]
    return {"method": f"torch.profiler (CUDA activity), device time per call by kernel name over {inductor.calls} "
                      "calls of each compiled model, L2 flushed before each call as in the A/B",
            "calls": inductor.calls, "reason": "; ".join(reasons) or None,
            "busy_us": {"inductor": inductor.busy_us, "tuned": tuned.busy_us},
            "span_us": {"inductor": inductor.span_us, "tuned": tuned.span_us},
            "wall_us": wall_us, "kernels": kernels}


def attach_isolated(row: dict[str, Any]) -> None:
    """Beside each tuned kernel's in-program figures, the isolated kernel-level A/B of the same edit (the search's
    time before and after, each kernel alone on its launch record, L2 flushed)."""
    isolated = {(k["kernel"], k.get("edit")): k for k in row.get("kernels", [])
                if k.get("time_before_us") and k.get("time_after_us")}
    for k in (row.get("end_to_end", {}).get("in_program") or {}).get("kernels", []):
        m = isolated.get((k["kernel"], k.get("edit"))) if k.get("tuned") else None
        if m:
            k["isolated_before_us"], k["isolated_after_us"] = m["time_before_us"], m["time_after_us"]
            k["isolated_ratio"] = m["time_before_us"] / m["time_after_us"]


def buffer_sol(record_path: str | None, bytes_per_s: float | None, before_us: float | None,
               after_us: float | None, bandwidth_reason: str = "no bandwidth") -> dict[str, Any]:
    """A kernel's fraction of speed of light from its launch record: the bytes of its buffers
    (`LaunchRecord.buffer_bytes`: each tensor argument once, Inductor's in-place `in_out_ptr` twice) over the
    peak bandwidth, against its measured time before and after. An estimate from buffer sizes, not measured
    traffic (a read served by the L2 counts all the same); a missing figure carries its reason."""
    from kstrata.ir.launch import LaunchRecord

    if not record_path:
        return {"reason": "no launch record"}
    try:
        nbytes = LaunchRecord.load(record_path).buffer_bytes()
    except Exception as exc:  # an unreadable record or an unknown size: the figure is left out
        return {"reason": str(exc)[:300]}
    if not bytes_per_s:
        return {"bytes": nbytes, "reason": bandwidth_reason}
    sol_us = nbytes / bytes_per_s * 1e6
    return {"bytes": nbytes, "bytes_per_s": bytes_per_s, "sol_us": sol_us,
            "before": sol_us / before_us if before_us else None, "after": sol_us / after_us if after_us else None}


def expected_end_to_end(row: dict[str, Any]) -> float | None:
    """What the kernels' own measurements predict end to end: Inductor's time per call less, for every tuned
    binary that ran, its launches per call times the time it saved per launch in the kernel-level A/B. Those
    timings are isolated and L2-flushed: each kernel alone on its launch record, the L2 flushed before each run,
    the device span (`backends/timing.py`: the end event right after the launch, no host synchronize between);
    inside the model a kernel may find its inputs in L2 (the preceding kernel's output), and save more or less
    there. The check is the end-to-end JSON's `in_program` figures: each kernel's device time inside both
    programs (torch.profiler). A kernel autotuned over several configs saves at most what it saved against the
    fastest of them (plain Inductor's autotuner may run any). None without a tuned binary that ran."""
    e = row.get("end_to_end") or {}
    saved = {(k["kernel"], k.get("edit")): min([k["time_before_us"] - k["time_after_us"]]
                                               + [t["time_us"] - t["winner_us"] for t in k.get("siblings") or ()
                                                  if t.get("time_us") and t.get("winner_us")])
             for k in row.get("kernels", []) if k.get("time_before_us") and k.get("time_after_us")}
    total = float(sum(r["launches_per_call"] * saved.get((r["kernel"], r["edit"]), 0.0) for r in e.get("launched", [])
                      if r.get("tuned")))
    if not total or not e.get("inductor_us"):
        return None
    return float(e["inductor_us"]) / max(1e-9, float(e["inductor_us"]) - total)


#: What the kernel table's %SOL is, in its header: so nobody reads it as exact.
SOL_LABEL = "%SOL (bytes of its buffers / peak bandwidth)"


def _sol_cell(sol: dict[str, Any] | None) -> str:
    if not sol:
        return ""
    fractions = [f"{100 * sol[w]:.3g}%" for w in ("before", "after") if sol.get(w)]
    if fractions:
        return " -> ".join(fractions)
    return f"? ({sol['reason'][:100]})" if sol.get("reason") else ""


def _us(x: float | None) -> str:
    return f"{x:.1f}" if x is not None else "?"


def launch_config(row: dict[str, Any]) -> str:
    """` (num_warps 8, num_stages 1, grid [65536, 1, 1])` of a census row, or "" without it."""
    parts = [f"{k} {row[k]}" for k in ("num_warps", "num_stages", "grid") if row.get(k) is not None]
    return f" ({', '.join(parts)})" if parts else ""


def in_program_lines(model: str, ip: dict[str, Any]) -> list[str]:
    """The markdown's in-program check of one model: per tuned kernel its isolated A/B beside its device time in
    the program, and the device-busy time per call beside the wall time per call."""
    if ip.get("reason") and not ip.get("kernels"):
        return [f"- {model} in the program: no figures: {ip['reason']}"]
    lines = []
    for k in ip.get("kernels", []):
        if not k.get("tuned"):
            continue
        iso = (f"isolated A/B {k['isolated_before_us']:.1f} -> {k['isolated_after_us']:.1f} us "
               f"({k['isolated_ratio']:.3f}x)" if k.get("isolated_ratio") else "no isolated A/B of this edit")
        ratio = f" ({k['in_program_ratio']:.3f}x)" if k.get("in_program_ratio") else ""
        lines.append(f"- {model} `{k['kernel']}` ({k.get('edit')}): {iso}; in the program "
                     f"{_us(k['inductor_us'])} -> {_us(k['tuned_us'])} us{ratio} "
                     f"(device time per call, torch.profiler over {ip.get('calls')} calls)")
    busy, wall = ip.get("busy_us") or {}, ip.get("wall_us") or {}
    sides = []
    for side, label in (("inductor", "Inductor"), ("tuned", "tuned")):
        b, w = busy.get(side), wall.get(side)
        share = f" ({100 * b / w:.0f}%)" if b is not None and w else ""
        sides.append(f"{label} {_us(b)} us of {_us(w)} us{share}")
    lines.append(f"- {model} device busy per call of the wall time per call: " + ", ".join(sides)
                 + " (busy: the union of its device events' intervals; wall: the A/B's median per call)"
                 + (f"; {ip['reason']}" if ip.get("reason") else ""))
    return lines


def _geomean(xs: list[float]) -> float | None:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


#: The compiled-kernel issue's targets: the geomean of the changed kernels, end to end on the models whose
#: kernels have headroom, and the whole run's minutes (this call and the other benchmark call of the whole run
#: together). Headroom, where the end-to-end profile measured the kernels inside the program: the target is
#: within reach of the kernels (`end_to_end_bound`: every searched kernel at its memory bound would make the call
#: at least TARGET_END_TO_END faster). Without that profile: a searched kernel below HEADROOM_SOL of its memory
#: bound before the search.
TARGET_CHANGED, TARGET_END_TO_END, HEADROOM_SOL, TARGET_MINUTES = 1.15, 1.05, 0.8, 20.0


def in_program_sol(row: dict[str, Any]) -> dict[str, float]:
    """Each searched kernel's fraction of its memory bound inside the program: its buffers' bytes over the peak
    bandwidth (the `sol` estimate) against its device time per launch in Inductor's build, as the end-to-end
    profile measured it (empty without that profile). Inside the program is what the end to end sees: which of
    its configs Inductor's autotuner ran in that build, and inputs a previous kernel may have left in L2 (on
    2026-12-04 the MLP's silu ran at 59% in one build, its slower config, and about 100% in another)."""
    prof = ((row.get("end_to_end") or {}).get("in_program") or {}).get("kernels") or []
    per_launch = {p["kernel"]: p["inductor_us"] / p["inductor_launches"] for p in prof
                  if p.get("inductor_us") and p.get("inductor_launches")}
    out: dict[str, float] = {}
    for k in row.get("kernels", []):
        sol_us = (k.get("sol") or {}).get("sol_us")
        if sol_us and per_launch.get(k["kernel"]):
            out[k["kernel"]] = sol_us / per_launch[k["kernel"]]
    return out


def end_to_end_bound(row: dict[str, Any]) -> dict[str, float] | None:
    """The most the compiled-kernel optimizer could make this model faster end to end (Amdahl over the in-program
    profile): every searched kernel brought to its memory bound inside the program (its `sol` estimate a launch
    times its launches a call) and nothing else changed (library kernels, the host's time). `saved_us` is what
    that takes off Inductor's wall time a call (the A/B's median; the profile's without it), `bound` the
    resulting speedup. None without the end-to-end profile or a kernel with an estimate. A kernel already at or
    past its bound (its input left in L2 by the kernel before it) saves nothing. On 2026-12-04 (H200) the
    transformer block's Triton kernels could save at most 9.6 us of a 403.4 us call: its 1.05x target was out
    of reach of any kernel edit."""
    e = row.get("end_to_end") or {}
    prof = (e.get("in_program") or {}).get("kernels") or []
    wall = ((e.get("timing") or {}).get("time_before_us")
            or ((e.get("in_program") or {}).get("wall_us") or {}).get("inductor"))
    sol = {k["kernel"]: (k.get("sol") or {}).get("sol_us") for k in row.get("kernels", [])
           if (k.get("sol") or {}).get("sol_us")}
    if not wall or not prof:
        return None
    saved, counted = 0.0, 0
    for p in prof:
        if p["kernel"] in sol and p.get("inductor_us") and p.get("inductor_launches"):
            saved += max(0.0, p["inductor_us"] - sol[p["kernel"]] * p["inductor_launches"])
            counted += 1
    if not counted or saved >= wall:
        return None
    return {"bound": wall / (wall - saved), "saved_us": saved, "wall_us": wall, "kernels": counted}


#: What a model's row says when it was written after its search, before its re-check and end to end ended.
PENDING = ("written after its search; its re-check with fresh seeds and its end to end had not ended then, and "
           "this row is replaced when they end: a file that still says this is from a run cut short")
#: The same after its re-check, before its end to end ended.
PENDING_END_TO_END = ("written after its re-check; its end to end had not ended then, and this row is replaced "
                      "when it ends: a file that still says this is from a run cut short")


def target_lines(rows: list[dict[str, Any]], summary: dict[str, Any]) -> list[str]:
    """The targets met or not for this call's models (lines of the results file)."""
    def met(ok: bool) -> str:
        return "met" if ok else "**not met**"

    lines = ["", f"Targets for this call's models (the whole run is this call and the other benchmark call of it, "
             f"{TARGET_MINUTES:g} minutes together):", ""]
    g = summary["geomean_changed"]
    lines.append(f"- geomean of the changed kernels {g:.3f}x, target {TARGET_CHANGED}x: {met(g >= TARGET_CHANGED)}" if g
                 else "- geomean of the changed kernels: no kernel changed (**not met**)")
    if not any(r.get("recheck_skipped") for r in rows):
        lines.append(f"- wrong results {summary['wrong_results']}, target 0: {met(summary['wrong_results'] == 0)}")
    for r in rows:
        if r.get("pending"):
            lines.append(f"- {r['model']}: end to end not measured ({r['pending']})")
            continue
        sols = [k["sol"]["before"] for k in r.get("kernels", []) if (k.get("sol") or {}).get("before") is not None]
        if not sols:
            continue
        low = min(sols)
        inside = in_program_sol(r)
        speedup = (r.get("end_to_end") or {}).get("speedup")
        bound = end_to_end_bound(r)
        if inside:  # measured inside the program: that decides (an input the previous kernel left in L2 is cheap)
            low_in = min(inside.values())
            where = (f"{low_in:.0%} of its memory bound inside the program (Inductor's build, torch.profiler), "
                     f"{low:.0%} isolated")
            if bound and bound["bound"] < TARGET_END_TO_END:
                lines.append(f"- {r['model']}: no headroom for the end-to-end target: with every searched kernel at its "
                             f"memory bound inside the program a call would save at most {bound['saved_us']:.1f} us of "
                             f"its {bound['wall_us']:.1f} us, at most {bound['bound']:.3f}x end to end, under "
                             f"{TARGET_END_TO_END}x (lowest kernel {where}); end to end "
                             + (f"{speedup:.3f}x" if speedup else "no tuned kernel ran")
                             + (f" (not a measured gain: {why})" if speedup and speedup > 1.0
                                and (why := unattributed(r)) else ""))
                continue
            if low_in >= HEADROOM_SOL and not bound:
                lines.append(f"- {r['model']}: every searched kernel it launches at {HEADROOM_SOL:.0%} or more of its "
                             f"memory bound inside the program (lowest {where}): no headroom there; end to end "
                             + (f"{speedup:.3f}x" if speedup else "no tuned kernel ran")
                             + (f" (not a measured gain: {why})" if speedup and speedup > 1.0
                                and (why := unattributed(r)) else ""))
                continue
        else:
            where = f"{low:.0%} of its memory bound"
            if low >= HEADROOM_SOL:
                lines.append(f"- {r['model']}: every searched kernel at {HEADROOM_SOL:.0%} or more of its memory bound "
                             f"before the search (lowest {low:.0%}): no headroom by that estimate")
                continue
        unproven = unattributed(r) if speedup and speedup >= TARGET_END_TO_END else None
        reach = (f"; at most {bound['bound']:.3f}x with every searched kernel at its memory bound inside the program"
                 if bound else "")
        if bound and speedup and speedup > bound["bound"]:  # faster than the kernels can make it: say why
            reach += (f"; the A/B's {speedup:.3f}x is above that: its wall time moved more than the searched "
                      "kernels can take off it (the host's time or the rounds' spread; the device's busy time is "
                      "the kernels' share)")
        lines.append(f"- {r['model']} (a kernel at {where}{reach}): end to end "
                     + (f"{speedup:.3f}x, not a measured gain: {unproven} (**not met**)" if unproven else
                        f"{speedup:.3f}x, target {TARGET_END_TO_END}x: {met(speedup >= TARGET_END_TO_END)}"
                        if speedup else "no tuned kernel ran (**not met**)") + config_lottery(r))
    lines.append(f"- this call's minutes: {summary['seconds'] / 60:.1f}")
    return lines


def _measured_line(rows: list[dict[str, Any]]) -> str:
    """How many of the end-to-end speedups above 1 are gains the tuned kernels measurably made (`unattributed`)."""
    up = [r for r in rows if ((r.get("end_to_end") or {}).get("speedup") or 0) > 1.0]
    real = [r["model"] for r in up if unattributed(r) is None]
    return (f"{len(real)} of the {len(up)} above 1.0 a measured gain" + (f" ({', '.join(real)})" if real else "")
            + " (the A/B's range excludes no change and the device's busy time dropped with the wall time)")


def unattributed(row: dict[str, Any]) -> str | None:
    """Why a model's end-to-end gain is not one the tuned kernels measurably made (None: it is). Two tests, on
    what the A/B and the end-to-end profile measured: the speedup's range over the A/B rounds must exclude no
    change, and the device's busy time per call must have dropped by at least half the wall time's drop (a
    launch-bound model's wall time moves with the host: on 2026-12-04 conv_block read 1.132x, range 0.906-1.218,
    with its device busy 129.0 -> 128.4 us a call and its wall 390 -> 345 us)."""
    e = row.get("end_to_end") or {}
    rng = (e.get("timing") or {}).get("speedup_range")
    if rng and rng[0] <= 1.0:
        return f"its range over the A/B rounds ({rng[0]:.3f}-{rng[1]:.3f}) includes no change"
    ip = e.get("in_program") or {}
    busy, wall = ip.get("busy_us") or {}, ip.get("wall_us") or {}
    if all(isinstance(d.get(k), (int, float)) for d in (busy, wall) for k in ("inductor", "tuned")):
        db, dw = busy["inductor"] - busy["tuned"], wall["inductor"] - wall["tuned"]
        if dw > 0 and db < dw / 2:
            return (f"the device's busy time a call moved {busy['inductor']:.1f} -> {busy['tuned']:.1f} us, under half "
                    f"the wall time's {wall['inductor']:.1f} -> {wall['tuned']:.1f} us: the host's time, not the kernels'")
    return None


def config_lottery(row: dict[str, Any]) -> str:
    """What a config choice's end to end rests on: for each tuned kernel whose edit is a config choice
    (`config(KEY)`), whether plain Inductor's build ran that same launch configuration (then the choice gained
    nothing there) or another (then the gain is the config its autotuner did not choose this time, which it may
    choose on another build: the MLP's silu on 2026-12-04, 1.175x end to end in one build, 1.010x in another)."""
    e = row.get("end_to_end") or {}
    base = {x["kernel"]: x for x in e.get("inductor_launched", [])}
    notes = []
    for x in e.get("launched", []):
        if not x.get("tuned") or not str(x.get("edit") or "").startswith("config(") or x["kernel"] not in base:
            continue
        same = all(x.get(k) == base[x["kernel"]].get(k) for k in ("num_warps", "num_stages", "grid"))
        notes.append(f"`{x['kernel']}`'s config choice: plain Inductor's autotuner "
                     + ("ran the same configuration in this build" if same else
                        f"ran another in this build{launch_config(base[x['kernel']])}, and may choose the tuned one "
                        "on another"))
    return f" ({'; '.join(notes)})" if notes else ""


def _write(results: Path, env: dict[str, Any], rows: list[dict[str, Any]], final: bool, seconds: float,
           tag: str = "") -> dict[str, Any]:
    results.mkdir(parents=True, exist_ok=True)
    changed = [k for r in rows for k in r.get("kernels", []) if k.get("speedup")]
    wrong = [c for r in rows for c in r.get("recheck", []) if c["verdict"] == "different"]
    undecided = [c for r in rows for c in r.get("recheck", []) if c["verdict"] not in ("equivalent", "different")]
    e2e = [r["end_to_end"]["speedup"] for r in rows if r.get("end_to_end", {}).get("speedup")]
    # a config choice picks one of the configs Inductor's autotuner compiled (its own choice may differ by build);
    # a code edit changes a kernel's code (IR, PTX, launch options)
    chosen = [k for k in changed if str(k.get("edit") or "").startswith("config(")]
    edited = [k for k in changed if k not in chosen]
    summary = {"changed_kernels": len(changed), "geomean_changed": _geomean([k["speedup"] for k in changed]),
               "config_choices": len(chosen), "code_edits": len(edited),
               "geomean_code_edits": _geomean([k["speedup"] for k in edited]),
               "wrong_results": len(wrong), "recheck_undecided": len(undecided), "geomean_end_to_end": _geomean(e2e), "seconds": seconds,
               "complete": final}
    stem = f"compiled-bench-{env['date'][:10]}" + (f"-{tag}" if tag else "")
    (results / f"{stem}.json").write_text(json.dumps({"schema": "kstrata.compiled-bench/1", "environment": env,
                                                      "summary": summary, "models": rows}, indent=1, default=str) + "\n")
    g = summary["geomean_changed"]
    lines = [f"# Compiled-kernel optimizer on {env['device']}", "",
             f"{env['date']} · torch {env['torch']} · triton {env['triton']} · CUDA {env['cuda']} · "
             f"{seconds / 60:.1f} min", "",
             "" if final else f"**Incomplete run: {len(rows)} models before it stopped.**", "",
             (f"- changed kernels: {len(changed)}, geomean speedup {g:.3f}x; of them {len(chosen)} a config choice (one "
              f"of the configs Inductor's autotuner compiled) and {len(edited)} a code edit"
              + (f" (geomean {summary['geomean_code_edits']:.3f}x)" if edited else "")) if g
             else "- no kernel changed",
             (f"- kernels and their speedups from the tuned database {env['tuned_db']}; wrong results: none "
              f"re-checked here ({TUNED_RECHECK_NOTE}); this run measured the end to end" if env.get("tuned_db") else
              f"- wrong results (winners re-verified with fresh seeds): {len(wrong)}"
              + (f"; {len(undecided)} re-checks could not decide (see the JSON)" if undecided else "")),
             f"- end to end (tuned backend vs Inductor, models with a tuned kernel), geomean: "
             f"{summary['geomean_end_to_end']:.3f}x; " + _measured_line(rows) if summary["geomean_end_to_end"]
             else "- end to end: no model ran a tuned kernel", *target_lines(rows, summary), "",
             "| model | kernel | share | space | edit | speedup (range) | trials | end to end "
             f"| {SOL_LABEL} before -> after |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | error: {r['error'][:160]} | | | | | | | |")
            continue
        e = r.get("end_to_end", {})
        diff = '' if e.get('bitwise_equal', True) else ', max diff ' + format(e['max_abs_diff'], '.3g')
        if e.get("partial"):  # written after its A/B, before its census and profiles
            diff += f"; partial: {e['partial']}"
        if e.get("speedup"):
            lo, hi = e["timing"]["speedup_range"]
            e2e_cell = (f"{e['speedup']:.3f}x ({lo:.3f}-{hi:.3f}; {e['tuned_kernels']} tuned / {e['untouched_kernels']} "
                        f"as Inductor made them{diff})")
        elif e.get("same_code_ratio"):
            e2e_cell = (f"no kernel tuned: identical code, timed {e['same_code_ratio']:.3f}x (the timing's spread; "
                        f"{e['untouched_kernels']} kernels as Inductor made them{diff})")
        else:
            e2e_cell = ""
        if not r.get("kernels"):
            lines.append(f"| {r['model']} | (no kernel searched) | | | | | 0 | {e2e_cell} | |")
        for i, k in enumerate(r.get("kernels", [])):
            sp = f"{k['speedup']:.3f}x ({k['range'][0]:.3f}-{k['range'][1]:.3f})" if k.get("speedup") else k.get("result", "")
            lines.append(f"| {r['model'] if i == 0 else ''} | {k['kernel']} | {k['share']} | {k.get('space', '')} | "
                         f"`{k.get('edit', '')}` | {sp} | {k['trials']} | {e2e_cell if i == 0 else ''} | "
                         f"{_sol_cell(k.get('sol'))} |")
    if any(k.get("sol") for r in rows for k in r.get("kernels", [])):
        bw = env.get("bandwidth") or {}
        peak = (f"{bw['bytes_per_s'] / 1e12:.2f} TB/s, {bw.get('source', '')}" if bw.get("bytes_per_s")
                else bw.get("reason", "unknown"))
        lines.append(f"- {SOL_LABEL}: the bytes of the kernel's buffers (each tensor argument of its launch record "
                     f"once, read or written; twice for Inductor's in-place `in_out_ptr`) / peak bandwidth ({peak}), over its "
                     "measured time before -> after the search: an estimate from buffer sizes, not measured traffic")
    for r in rows:  # which binaries of the tuned kernels ran end to end, and what their kernel A/B predicts
        e = r.get("end_to_end", {})
        names = {x["kernel"] for x in e.get("launched", []) if x.get("tuned")} | \
            {k["kernel"] for k in r.get("kernels", []) if k.get("edit")}
        ran = [f"`{x['kernel']}` {'tuned (' + str(x['edit']) + ')' if x['tuned'] else 'as Inductor made it'} "
               f"{x['launches_per_call']:g}/call{launch_config(x)}" for x in e.get("launched", []) if x["kernel"] in names]
        if ran:
            lines.append(f"- {r['model']} end to end ran: " + "; ".join(ran)
                         + (f"; the kernels' own A/B predicts {e['expected']:.3f}x (from isolated, L2-flushed kernel "
                            "timings, device span; the in-program device times are the check)" if e.get("expected") else ""))
        elif names and "launched" in e:
            lines.append(f"- {r['model']} end to end ran no binary of the searched kernels {sorted(names)}")
        base = [f"`{x['kernel']}`{launch_config(x)} {x['launches_per_call']:g}/call"
                for x in e.get("inductor_launched", []) if x["kernel"] in names]
        if base:
            lines.append(f"- {r['model']} plain Inductor's build ran (its autotuner's choice in this build): "
                         + "; ".join(base))
        if e.get("in_program"):
            lines += in_program_lines(r["model"], e["in_program"])
        if e.get("seconds"):
            lines.append(f"- {r['model']} end to end took: "
                         + "; ".join(f"{k} {v:g} s" for k, v in e["seconds"].items()))
    for r in rows:  # where each model's minutes went: what the next run's split of its time is estimated from
        if r.get("minutes"):
            m = r["minutes"]
            lines.append(f"- {r['model']} took {m['record']:g} min to record, {m['search']:g} min to optimize (a "
                         f"slice of {m['search_slice']:g}), {m['outside_search']:g} min outside the search in all")
    for r in rows:  # where each search's time went, and the re-check's
        for k in r.get("kernels", []):
            if k.get("acceptance_seconds"):
                parts = {n.removeprefix("sanitize/"): v for n, v in k["acceptance_seconds"].items() if "/" in n}
                lines.append(f"- {r['model']} `{k['kernel']}`: its search took {k.get('search_seconds')} s, of which "
                             f"the winner's acceptance check {k['acceptance_seconds'].get('sanitize', 0):g} s"
                             + (" (" + ", ".join(f"{n} {v:g} s" for n, v in parts.items()) + ")" if parts else ""))
        for c in r.get("recheck", []):
            if c.get("seconds") is not None:
                n = c.get("seeds", 3)
                lines.append(f"- {r['model']} `{c['kernel']}`: re-check on {n} random seeds, {n - 1} new to the gate "
                             f"(GPU differential) {c['seconds']:g} s, {c['verdict']}")
    for r in rows:  # which config each searched kernel was timed against, and its best against the other configs
        for k in r.get("kernels", []):
            if k.get("configs"):
                lines.append(f"- {r['model']} `{k['kernel']}`: before the search, against the recorded config: " + "; ".join(
                    f"{t['config']}: " + (f"{t['speedup']:.3f}x " if t.get("speedup") else "") + t["status"]
                    for t in k["configs"])
                    + (f"; the search started from {k['started_from']}" if k.get("started_from") else "")
                    + (f"; its result over the recorded config: {k['speedup_vs_recorded']:.3f}x"
                       if k.get("speedup_vs_recorded") else ""))
            if k.get("siblings"):
                lines.append(f"- {r['model']} `{k['kernel']}`: timed against {k.get('baseline')}; the best against "
                             "the other configs: " + "; ".join(
                                 f"{t['config']}: " + (f"{t['speedup']:.3f}x ({t['range'][0]:.3f}-{t['range'][1]:.3f}) "
                                                       if t.get("speedup") and t.get("range") else "")
                                 + t["status"] for t in k["siblings"]))
    for r in rows:  # why the tuned backend left a kernel as Inductor made it (a winner it did not deploy shows here)
        for k in r.get("end_to_end", {}).get("kernels", []):
            if k["status"] != "tuned":
                lines.append(f"- {r['model']} end to end: `{k['name']}` {k['status']}: {k['reason']}")
        for a in r.get("end_to_end", {}).get("autotune", []):
            lines.append(f"- {r['model']} end to end: `{a['name']}` Inductor's autotuning: {a['reason']}")
    (results / f"{stem}.md").write_text("\n".join(lines) + "\n")
    return summary


def command(
    results: Annotated[Path, typer.Option("--results", help="Where the dated results files go.")],
    minutes: Annotated[float, typer.Option("--minutes", help="Time for the whole run (the issue: 20 on one H200).")] = 20.0,
    budget: Annotated[int, typer.Option("--budget", help="Candidates per kernel.")] = 16,
    models: Annotated[str, typer.Option("--models", help="Comma-separated model names (default: all).")] = "",
    all_tasks: Annotated[bool, typer.Option("--all-tasks", help="Every task under testsuite/tasks, not three.")] = False,
    work: Annotated[Path | None, typer.Option("--work", help="Where caches, records and outputs go (default: a "
                                              "temporary directory).")] = None,
    tag: Annotated[str, typer.Option("--tag", help="Appended to the results' file names (one call per group of "
                                                   "models: a call may run 600 s).")] = "",
    tuned: Annotated[Path | None, typer.Option("--tuned", help="A tuned database (`kstrata optimize`'s OUT/tuned) "
                                               "to measure end to end on the one model of --models: no recording, "
                                               "no search; its kernels' figures are those of the search that made "
                                               "it. Copied into the work directory first, never changed.")] = None,
    child: Annotated[str | None, typer.Option("--child", hidden=True)] = None,
    rerender: Annotated[Path | None, typer.Option("--rerender", help="Write the Markdown (and JSON summary) of a "
                                                  "results JSON again with this version's report, into --results; "
                                                  "needs no GPU.")] = None,
) -> int:
    if rerender is not None:
        return _results_dir(results) or _rerender(rerender, results)
    import torch
    import triton

    if child is not None:
        return _child(child, all_tasks)
    bad = _unknown_model([n.strip() for n in models.split(",") if n.strip()])
    if bad:
        print(f"error: --models: {bad}", file=sys.stderr)
        return 2
    if tuned is not None:
        bad = _tuned_problem(tuned, [n.strip() for n in models.split(",") if n.strip()])
        if bad:
            print(f"error: --tuned {tuned}: {bad}", file=sys.stderr)
            return 2
    if not torch.cuda.is_available() or torch.version.hip is not None:
        print("error: needs an NVIDIA GPU (this benchmark records, optimizes and times Inductor's CUDA kernels)",
              file=sys.stderr)
        return 2
    if _results_dir(results):
        return 2
    from kstrata.agents.compiled.run import CompiledOptions, optimize_cache
    from kstrata.agents.compiled.search import SearchPrior

    start = time.perf_counter()
    root = work or Path(tempfile.mkdtemp(prefix="kstrata-compiled-bench-"))
    names = [n.strip() for n in models.split(",") if n.strip()] or _names(all_tasks)
    env = {"date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
           "device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "cuda": torch.version.cuda, "python": platform.python_version(), "budget": budget, "minutes": minutes}
    bytes_per_s, bandwidth_source = copy_bandwidth(root / "ceilings")
    env["bandwidth"] = {"bytes_per_s": bytes_per_s, "source": bandwidth_source} if bytes_per_s else \
        {"reason": bandwidth_source}
    rows: list[dict[str, Any]] = []
    overheads: list[float] = []  # minutes per model outside the search: record, re-check, end to end
    prior = SearchPrior()  # what won on one model's kernels is tried first on the next model's
    if tuned is not None:
        env["tuned_db"] = str(tuned)
    for i, name in enumerate(names):
        row: dict[str, Any] = {"model": name}
        safe = name.replace(":", "_").replace("/", "_")
        t_model = time.perf_counter()
        search_min = 0.0
        record_min: float | None = None
        slice_min = 0.0
        if tuned is not None:  # the end to end of a database made before: no recording, no search, no re-check
            db = root / safe / "out" / "tuned"
            shutil.copytree(tuned, db)
            row["kernels"] = tuned_rows(db, bytes_per_s, bandwidth_source)
            row["recheck_skipped"] = TUNED_RECHECK_NOTE
            try:
                _measure_end_to_end(row, name, all_tasks, db, root / safe, partial_writer(results, env, rows, row,
                                                                                           start, tag))
            except Exception as exc:
                row["error"] = f"{type(exc).__name__}: {exc}"
            rows.append(row)
            break
        try:
            left = minutes - (time.perf_counter() - start) / 60
            if left <= 0:
                raise RuntimeError("the run's time ran out before this model")
            cache, records = _record(name, root / safe, all_tasks)
            record_min = (time.perf_counter() - t_model) / 60
            slice_min = _search_minutes(minutes - (time.perf_counter() - start) / 60, len(names) - i, record_min,
                                        overheads)
            t_search = time.perf_counter()
            report = optimize_cache(cache, records, root / safe / "out",
                                    CompiledOptions(budget=budget, minutes=slice_min,
                                                    device="cuda", engine_cache=str(root / "engine"),
                                                    progress=lambda m: print(m, flush=True), prior=prior,
                                                    bandwidth=bytes_per_s))
            search_min = (time.perf_counter() - t_search) / 60
            row["share_source"] = report.share_source
            row["kernels"] = []
            for k in report.kernels:
                s = k.get("search") or {}
                best = s["trials"][s["winner"]] if s.get("winner") is not None else None
                choice = s.get("choice") if best is None else None
                if choice:  # no edit won; the faster config itself, as Inductor compiled it, is the result
                    best = {"spaces": ["config"], "pipeline": choice["edit"], "speedup": choice["speedup"],
                            "speedup_range": choice["speedup_range"], "verdict": "Inductor's own config",
                            "time_before_us": choice["time_before_us"], "time_after_us": choice["time_after_us"]}
                sibling_timings = (choice or s)["siblings"] if s else []
                row["kernels"].append({
                    "kernel": k["name"], "key": k["key"][:12], "share": f"{k['share']:.1%}" if k.get("share") else "?",
                    "trials": len(s.get("trials", [])), "result": k.get("skip") or k.get("result", ""),
                    **({"space": ",".join(best["spaces"]), "edit": best["pipeline"], "speedup": best["speedup"],
                        "range": best["speedup_range"], "verdict": best["verdict"],
                        "time_before_us": best.get("time_before_us"), "time_after_us": best.get("time_after_us")}
                       if best else {}),
                    # the config the candidates were timed against, and the best one against the kernel's other
                    # autotuning configs (a win must beat those too)
                    "baseline": (s.get("baseline") or {}).get("words"),
                    # the config the search started from when faster than the recorded one, and each other
                    # config's original against the recorded one, timed before the search
                    "started_from": (s.get("started_from") or {}).get("words"),
                    "speedup_vs_recorded": next((t["speedup"] for t in sibling_timings or ()
                                                 if t["config"].get("key") == (s.get("baseline") or {}).get("key")),
                                                None) if s.get("started_from") else None,
                    "configs": [{"config": t["config"].get("words"), "status": t["status"], "speedup": t["speedup"],
                                 "range": t["speedup_range"]} for t in s.get("configs") or ()],
                    "siblings": [{"config": t["config"].get("words"), "status": t["status"], "speedup": t["speedup"],
                                  "range": t["speedup_range"], "time_us": t["time_us"], "winner_us": t["winner_us"]}
                                 for t in sibling_timings or ()],
                    "sibling_verdict": s.get("sibling_verdict"),
                    # the winner's acceptance check (compute-sanitizer, the interpreter) by kind, and the search's
                    # whole time: at a published size the check is minutes (gap 01, H100: 194 s)
                    "acceptance_seconds": {k: v for k, v in (best.get("phase_seconds") or {}).items()
                                           if k.startswith("sanitize")} if best else {},
                    "search_seconds": round(s["seconds"], 1) if s.get("seconds") is not None else None,
                    "sol": buffer_sol(k.get("record") or s.get("record"), bytes_per_s,
                                      best.get("time_before_us") if best else k.get("time_us"),
                                      best.get("time_after_us") if best else None, bandwidth_source),
                    "verdicts": {st: sum(1 for t in s.get("trials", []) if t["status"] == st)
                                 for st in ("equivalent", "unproven", "different", "failed", "error")}})
            # written now too: a run cut during the re-check or the end to end (the call's limit, 2026-12-07) keeps
            # its searches in the results file, marked as such
            _write(results, env, [*rows, {**row, "pending": PENDING}], final=False,
                   seconds=time.perf_counter() - start, tag=tag)
            t_check = time.perf_counter()
            row["recheck"] = _recheck(report)
            print(f"{name}: re-check with fresh seeds {time.perf_counter() - t_check:.1f} s", flush=True)
            # and again with the re-check: a run cut during the end to end keeps its wrong-result count
            _write(results, env, [*rows, {**row, "pending": PENDING_END_TO_END}], final=False,
                   seconds=time.perf_counter() - start, tag=tag)
            _measure_end_to_end(row, name, all_tasks, root / safe / "out" / "tuned", root / safe,
                                partial_writer(results, env, rows, row, start, tag))
        except Exception as exc:  # a failing model is reported, the run goes on
            row["error"] = f"{type(exc).__name__}: {exc}"
        overheads.append((time.perf_counter() - t_model) / 60 - search_min)
        if record_min is not None:  # where the model's time went: the next runs' estimates
            row["minutes"] = {"record": round(record_min, 2), "search_slice": round(slice_min, 2),
                              "search": round(search_min, 2), "outside_search": round(overheads[-1], 2)}
        rows.append(row)
        _write(results, env, rows, final=False, seconds=time.perf_counter() - start, tag=tag)
    summary = _write(results, env, rows, final=True, seconds=time.perf_counter() - start, tag=tag)
    print(json.dumps(summary, indent=1))
    ok = summary["wrong_results"] == 0 and summary["recheck_undecided"] == 0 and all("error" not in r for r in rows)
    return 0 if ok else 1


def _measure_end_to_end(row: dict[str, Any], name: str, all_tasks: bool, tuned: Path, work: Path,
                        on_timed: Callable[[dict[str, Any]], None]) -> None:
    """`row`'s end to end through the tuned database `tuned`, with what the kernels' own A/B predicts and their
    isolated figures beside the in-program ones."""
    row["end_to_end"] = _end_to_end(name, all_tasks, tuned, work, on_timed=on_timed)
    row["end_to_end"]["expected"] = expected_end_to_end(row)
    attach_isolated(row)


def partial_writer(results: Path, env: dict[str, Any], rows: list[dict[str, Any]], row: dict[str, Any],
                   start: float, tag: str) -> Callable[[dict[str, Any]], None]:
    """The results written again with `row`'s end to end as far as it went (its A/B, before the census and the
    profiles): a run the call's limit stops there keeps its end-to-end figure, marked partial."""
    def write(partial: dict[str, Any]) -> None:
        _write(results, env, [*rows, {**row, "end_to_end": partial}], final=False,
               seconds=time.perf_counter() - start, tag=tag)
    return write


#: Why a `--tuned` run has no re-check (said in its results).
TUNED_RECHECK_NOTE = ("measured from a tuned database made before (--tuned): its winners were gated and re-checked "
                      "by the search that made it, not again in this run")


def _tuned_problem(tuned: Path, names: list[str]) -> str | None:
    """Why `--tuned` cannot run (None: it can): it takes one model and a readable, non-empty tuned database."""
    from kstrata.agents.tuned import TunedDB, TunedError, TunedRecord

    if len(names) != 1:
        return f"measures one model end to end; --models names {len(names) or 'none'}"
    db = TunedDB(tuned)
    try:
        db.check()
    except (TunedError, OSError) as exc:
        return str(exc)
    records = list(db.records())
    bad = [f"{d}: {r}" for d, r in records if isinstance(r, TunedError)]
    if bad:
        return f"unreadable records: {'; '.join(bad)[:300]}"
    if not records:
        return "holds no tuned kernel"
    # a record without its binary is never applied: the end to end would time Inductor against itself
    damaged = [f"{d.name}: {why}" for d, r in records if isinstance(r, TunedRecord)
               and (why := db.stale_reason(d, r, r.versions_digest))]
    if damaged:
        return "; ".join(damaged)[:400]
    return None


def tuned_rows(db: Path, bytes_per_s: float | None, bandwidth_source: str) -> list[dict[str, Any]]:
    """A tuned database's kernels as the results' kernel rows: each with the edit, speedup, range and times the
    search that made it measured (and when), its timings against the kernel's other configs, and %SOL from the
    launch record it was measured on where that file is still there."""
    from kstrata.agents.tuned import TunedDB, TunedRecord

    rows = []
    for _, r in TunedDB(db).records():
        if not isinstance(r, TunedRecord):
            continue
        cfg = r.config or {}
        rows.append({
            "kernel": r.kernel, "key": str(cfg.get("key", ""))[:12], "share": "?", "trials": 0,
            "result": f"from the tuned database (measured {r.measured_at} on {r.device})",
            "space": ",".join(r.spaces), "edit": r.edit, "speedup": r.speedup,
            "range": r.speedup_range or [r.speedup, r.speedup], "verdict": r.verdict,
            "time_before_us": r.time_before_us, "time_after_us": r.time_after_us, "baseline": cfg.get("words"),
            "started_from": None, "speedup_vs_recorded": r.speedup_vs_recorded, "configs": [],
            "siblings": [{"config": (t.get("config") or {}).get("words"), "status": t.get("status"),
                          "speedup": t.get("speedup"), "range": t.get("speedup_range"), "time_us": t.get("time_us"),
                          "winner_us": t.get("winner_us")} for t in r.siblings or ()],
            "sibling_verdict": None,
            "sol": buffer_sol(cfg.get("record") if cfg.get("record") and Path(cfg["record"]).is_file() else None,
                              bytes_per_s, r.time_before_us, r.time_after_us, bandwidth_source),
            "verdicts": {}})
    return rows


def _results_dir(results: Path) -> int:
    """0 when `--results` is a directory (made if missing), else 2 with one line naming it."""
    from kstrata.ir.errors import KstrataError
    from kstrata.ir.files import make_dir

    try:
        make_dir(results, "--results directory")
    except KstrataError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


def _rerender(path: Path, results: Path) -> int:
    """The report of a results JSON written again (the measurements as they are; the report's reading of them
    from this version): its stem is kept. A file that is not one is a line naming it, exit 2."""
    try:
        data = json.loads(path.read_text())
        env, rows, summary = data["environment"], data["models"], data["summary"]
        if not (isinstance(env, dict) and isinstance(rows, list) and all(isinstance(r, dict) for r in rows)
                and isinstance(summary, dict) and isinstance(env.get("date"), str)):
            raise TypeError("environment, models and summary are not an object with a date, a list of objects "
                            "and an object")
        seconds = float(summary["seconds"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"error: {path}: not a compiled-bench results file ({type(e).__name__}: {e})", file=sys.stderr)
        return 2
    m = re.match(r"compiled-bench-\d{4}-\d{2}-\d{2}(?:-(.+))?\.json$", path.name)
    try:
        _write(results, env, rows, final=bool(summary.get("complete")), seconds=seconds,
               tag=(m.group(1) or "") if m else "")
    except (KeyError, TypeError, AttributeError, ValueError) as e:  # a row of another shape than this version's
        print(f"error: {path}: a row this version cannot read ({type(e).__name__}: {e})", file=sys.stderr)
        return 2
    return 0


#: Minutes a model takes outside its search (record, re-check, end to end) before any was measured in the run:
#: the H200's MLP took 72 s.
FIRST_OVERHEAD_MIN = 1.2


#: The least a model takes outside its search, as a multiple of its recording. Was 6 while the winner's
#: acceptance check ran after the search (gap task 01, H100, 2026-12-07: a recording of about 36 s, then
#: re-check and end to end that did not end in 154 s). With the check inside the search (H100, 2026-12-08) gap 01's
#: re-check and end to end took 34 s, and at 6 times the level tasks' searches got the half-minute floor
#: each while their call ended 2 of its 5.4 minutes early (`compiled-bench-2026-12-08-tasks-w`).
OVERHEAD_PER_RECORD = 3.0


def _search_minutes(left: float, models_left: int, record_min: float, overheads: Sequence[float]) -> float:
    """The search's minutes for the model just recorded: what is `left` of the run, less what this model still
    needs after its search (re-check and end to end) and what each later model needs outside its search,
    shared by the models left (at least 0.5). Outside a search a model takes the most measured on the models
    before (`FIRST_OVERHEAD_MIN` while none was), and at least `OVERHEAD_PER_RECORD` times its recording: the end to end
    compiles the model twice more, times and profiles it, and at a published size that is what takes the
    time."""
    overhead = max(max(overheads) if overheads else FIRST_OVERHEAD_MIN, OVERHEAD_PER_RECORD * record_min)
    after_search = max(0.0, overhead - record_min)
    return max(0.5, (left - after_search - overhead * (models_left - 1)) / models_left)


def main(argv: list[str] | None = None) -> int:
    from kstrata.tools.console import run_command

    return run_command(command, argv, help=__doc__)


if __name__ == "__main__":
    sys.exit(main())
