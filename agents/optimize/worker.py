"""The optimizer's child process: `python -m kstrata.agents.optimize.worker JOB.json`. Not a public interface.

Jobs (JSON in, `RESULT.json` out, written atomically; the parent is `evaluation.run_job`):

- `probe`: the reference run three ways for the degenerate-task verdict (inputs redrawn, weights redrawn,
  the outputs' spread); `contract.judge_degeneracy` decides.
- `contract`: each candidate called twice on the same inputs: bit-identical results (determinism) and the
  output layouts (`contract.output_problems`).
- `measure` (CUDA): the candidates of one task built side by side, warmed up (compiled), the contract
  checks above, then `rounds` rounds, each timing every candidate for `runs` runs with the evaluator's
  timer (`eval_worker.time_cuda`: L2 flush, events, synchronize), the order rotated every round: an
  interleaved measurement, so drift hits all alike.
- `profile` (CUDA): torch.profiler over a few calls of one candidate: per-kernel device time shares,
  launches per call, the call's wall time; in a Triton cache directory of its own, so the parent can read
  the kernels' SASS afterwards. With `ncu_range`, the worker wraps one call in that NVTX range (for Nsight
  Compute, which the parent runs around this process).
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any


def _layout(o: Any) -> dict[str, Any] | None:
    import torch

    if not isinstance(o, torch.Tensor):
        return None
    return {"shape": list(o.shape), "stride": list(o.stride()), "contiguous": bool(o.is_contiguous()),
            "dtype": str(o.dtype).removeprefix("torch.")}


def _same_bits(a: list[Any], b: list[Any]) -> bool:
    import torch

    for x, y in zip(a, b, strict=True):
        if isinstance(x, torch.Tensor):
            if x.shape != y.shape or x.dtype != y.dtype:
                return False
            if not torch.equal(x.contiguous().reshape(-1).view(torch.uint8), y.contiguous().reshape(-1).view(torch.uint8)):
                return False
        elif x != y and not (isinstance(x, float) and math.isnan(x) and math.isnan(y)):
            return False
    return True


def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def _contract_check(fn: Any, inputs: list[Any], device: str, layouts: list[Any]) -> dict[str, Any]:
    import torch

    from kstrata.agents.eval_worker import _flat_outputs
    from kstrata.agents.optimize.contract import output_problems

    with torch.no_grad():
        first = [o.clone() if isinstance(o, torch.Tensor) else o for o in _flat_outputs(fn(*inputs))]
        second = _flat_outputs(fn(*inputs))
        _sync(device)
    problems = output_problems(layouts, [_layout(o) for o in first]) if layouts else []
    deterministic = _same_bits(first, second)
    if not deterministic:
        problems.append("not deterministic: two calls on the same inputs gave different bits")
    return {"deterministic": deterministic, "problems": problems}


def _load(job: dict[str, Any]) -> tuple[Any, str, int]:
    from kstrata.agents.tasks import import_task_module

    return import_task_module(job["task"]), job.get("device", "cpu"), int(job.get("seed", 42))


def _wait_for_go(job: dict[str, Any]) -> None:
    """Built and compiled: say so, and wait until the parent holds the timing queue (gated jobs only)."""
    if job.get("ready_file"):
        Path(job["ready_file"]).write_text("ready")
        go = Path(job["go_file"])
        while not go.exists():
            time.sleep(0.005)


#: The float64 run of the probe is skipped when its input and output copies (both draws) would exceed this.
FP64_PROBE_MAX_BYTES = 4 << 30


def perturb_weights(model: Any, seed: int) -> tuple[Any, int]:
    """A copy of `model` whose floating parameters and buffers are redrawn at random (same shape and dtype).

    Redrawing the init seed changes nothing for deterministic inits (GroupNorm's ones and zeros), so the
    values are replaced directly: parameters by N(mean, std) of the originals, or N(0, 1) where the original is
    constant; buffers (running statistics) scaled by a factor in [0.5, 1.5) per element (uniform [0, 1)
    where all zero), so variances stay positive. Returns the copy and how many tensors were redrawn."""
    import copy

    import torch

    if not isinstance(model, torch.nn.Module):
        return model, 0
    other = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    count = 0
    with torch.no_grad():
        for p in other.parameters():
            if not p.dtype.is_floating_point or p.numel() == 0:
                continue
            f = p.detach().double().cpu()
            std = float(f.std()) if f.numel() > 1 else 0.0
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float64)
            new = f.mean() + std * noise if std > 0 and torch.isfinite(torch.tensor(std)) else noise
            p.copy_(new.to(p.dtype))
            count += 1
        for b in other.buffers():
            if not b.dtype.is_floating_point or b.numel() == 0:
                continue
            f = b.detach().double().cpu()
            u = torch.rand(b.shape, generator=gen, dtype=torch.float64)
            b.copy_((f * (0.5 + u) if bool((f != 0).any()) else u).to(b.dtype))
            count += 1
    return other, count


def probe(job: dict[str, Any]) -> dict[str, Any]:
    import torch

    from kstrata.agents.eval_worker import _build, _flat_outputs, _to_double, make_inputs

    module, device, seed = _load(job)
    model, _ = _build(module.Model, module, seed, device)
    other_model, n_params = perturb_weights(model, seed + 1)
    a = make_inputs(module, 0, seed, device)
    b = make_inputs(module, 0, seed + 1000, device)  # the task's own distribution, another draw
    with torch.no_grad():
        oa = _flat_outputs(model(*a))
        ob = _flat_outputs(model(*b))
        ow = _flat_outputs(other_model(*a))
    # The same two draws in float64: is the change between them more than the rounding error of computing them?
    # (Skipped for big tasks: other tasks share the GPU, and float64 copies of everything double the memory.)
    fp64_bytes = 16 * sum(int(t.numel()) for t in [*a, *oa] if isinstance(t, torch.Tensor) and t.dtype.is_floating_point)
    try:
        if fp64_bytes > FP64_PROBE_MAX_BYTES:
            raise MemoryError(f"{fp64_bytes / 2**30:.1f} GiB of float64 copies")
        m64, a64 = _to_double(model, a)
        _, b64 = _to_double(model, b)
        with torch.no_grad():
            oa64 = _flat_outputs(m64(*a64))
            ob64 = _flat_outputs(m64(*b64))
    except Exception:  # a model that cannot run in float64 (explicit casts, integer paths): no such evidence
        oa64 = ob64 = [None] * len(oa)
    _sync(device)
    outs = []
    for i, (x, y, w) in enumerate(zip(oa, ob, ow, strict=True)):
        if not isinstance(x, torch.Tensor) or not x.dtype.is_floating_point or x.numel() == 0:
            continue
        x64, y64 = (oa64[i] if i < len(oa64) else None), (ob64[i] if i < len(ob64) else None)
        if not (isinstance(x64, torch.Tensor) and isinstance(y64, torch.Tensor) and x64.shape == x.shape == y64.shape):
            x64 = y64 = None
        st = _output_stats(x, y, w, x64, y64)
        scale, change = st["scale"], st["change"]
        rel = change / scale if scale > 0 else (0.0 if change == 0 else math.inf)
        row = {"output": i, "numel": int(x.numel()),
               "depends_on_inputs": not torch.equal(x, y),
               "depends_on_weights": (not torch.equal(x, w)) if n_params else None,
               "constant": bool(x.numel() > 1 and st["max"] - st["min"] == 0.0) if st["any_finite"] else True,
               "rel_change_across_inputs": rel,
               "weights_rel_change": st["wchange"] / scale if scale > 0 and st["any_finite"] else 0.0}
        if st["any_finite64"]:  # the float64 change between the draws, against this dtype's rounding error
            row["change_fp64"], row["rounding_error"] = st["change64"], st["error64"]
        outs.append(row)
    return {"ok": True, "outputs": outs}


def _output_stats(x: Any, y: Any, w: Any, x64: Any, y64: Any, chunk: int = 1 << 24) -> dict[str, Any]:
    """Max-abs statistics of one output over its elements where both draws are finite, in float64, a chunk
    at a time (no float64 copy of a whole large output): scale, change between the input draws, change under
    the perturbed weights, min/max; with the float64 runs (`x64`, `y64`), their change and the rounding error."""
    xs, ys, ws = x.reshape(-1), y.reshape(-1), w.reshape(-1)
    x6, y6 = (x64.reshape(-1), y64.reshape(-1)) if x64 is not None else (None, None)
    st: dict[str, Any] = {"scale": 0.0, "change": 0.0, "wchange": 0.0, "min": math.inf, "max": -math.inf,
                          "any_finite": False, "change64": 0.0, "error64": 0.0, "any_finite64": False}
    for lo in range(0, xs.numel(), chunk):
        xf, yf = xs[lo:lo + chunk].double(), ys[lo:lo + chunk].double()
        fin = xf.isfinite() & yf.isfinite()
        if not bool(fin.any()):
            continue
        st["any_finite"] = True
        xc = xf[fin]
        st["scale"] = max(st["scale"], float(xc.abs().max()))
        st["change"] = max(st["change"], float((xc - yf[fin]).abs().max()))
        st["wchange"] = max(st["wchange"], float((xc - ws[lo:lo + chunk].double()[fin]).abs().max()))
        st["min"], st["max"] = min(st["min"], float(xc.min())), max(st["max"], float(xc.max()))
        if x6 is not None and y6 is not None:
            a6, b6 = x6[lo:lo + chunk].double(), y6[lo:lo + chunk].double()
            f6 = fin & a6.isfinite() & b6.isfinite()
            if bool(f6.any()):
                st["any_finite64"] = True
                st["change64"] = max(st["change64"], float((a6[f6] - b6[f6]).abs().max()))
                st["error64"] = max(st["error64"], float((xf[f6] - a6[f6]).abs().max()),
                                    float((yf[f6] - b6[f6]).abs().max()))
    return st


def _candidates(job: dict[str, Any], module: Any, device: str, seed: int) -> dict[str, Any]:
    from kstrata.agents.eval_worker import _build
    from kstrata.agents.tasks import import_task_module

    models = {}
    for key, path in job["candidates"].items():
        cls = import_task_module(path).ModelNew
        models[key] = _build(cls, module, seed, device)[0]
    return models


def contract(job: dict[str, Any]) -> dict[str, Any]:
    from kstrata.agents.eval_worker import make_inputs

    module, device, seed = _load(job)
    inputs = make_inputs(module, 0, seed, device)
    results = {}
    for key, path in job["candidates"].items():
        try:
            model = _candidates({"candidates": {key: path}}, module, device, seed)[key]
            results[key] = {"ok": True, **_contract_check(model, inputs, device, job.get("layouts") or [])}
        except Exception as exc:
            results[key] = {"ok": False, "error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    return {"ok": True, "candidates": results}


def measure(job: dict[str, Any]) -> dict[str, Any]:
    import statistics

    import torch

    from kstrata.agents.eval_worker import make_inputs, time_cuda

    module, device, seed = _load(job)
    if device != "cuda" and not job.get("cpu_wall_clock"):
        return {"ok": False, "error": "measuring needs a CUDA GPU"}
    timer = time_cuda if device == "cuda" else _cpu_wall_clock  # the CPU timer exists for tests of this code
    if job.get("policy", "strict") == "strict":  # IEEE fp32, as the evaluator's reference runs
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    inputs = make_inputs(module, 0, seed, device)
    keys = list(job["candidates"])
    results: dict[str, dict[str, Any]] = {}
    live: dict[str, Any] = {}
    for key in keys:
        try:
            model = _candidates({"candidates": {key: job["candidates"][key]}}, module, device, seed)[key]
            t0 = time.perf_counter()
            with torch.no_grad():
                model(*inputs)  # first call: compiles, autotunes, captures
            _sync(device)
            results[key] = {"ok": True, "warmup_s": time.perf_counter() - t0,
                            **_contract_check(model, inputs, device, job.get("layouts") or []), "rounds_us": []}
            if results[key]["problems"]:
                results[key]["ok"] = False
                results[key]["error"] = "; ".join(results[key]["problems"])
            else:
                live[key] = model
        except Exception as exc:
            results[key] = {"ok": False, "error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    _wait_for_go(job)
    runs, rounds = int(job.get("runs", 30)), int(job.get("rounds", 5))
    order = [k for k in keys if k in live]
    with torch.no_grad():
        for r in range(rounds):
            rotated = order[r % len(order):] + order[: r % len(order)] if order else []
            for key in rotated:
                model = live[key]
                def call(model: Any = model) -> Any:
                    return model(*inputs)

                t = timer(call, runs, warmup=3)
                results[key]["rounds_us"].append(t["median_us"])
    for key in order:
        rs = results[key]["rounds_us"]
        med = statistics.median(rs)
        results[key]["median_us"] = med
        results[key]["spread"] = (max(rs) - min(rs)) / 2 / med if med > 0 else 0.0
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu (wall clock: tests only)"
    return {"ok": True, "device_name": name, "candidates": results}


def _cpu_wall_clock(fn: Any, runs: int, warmup: int = 3) -> dict[str, Any]:
    import statistics

    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t0) * 1e6)
    return {"median_us": statistics.median(ts)}


def profile(job: dict[str, Any]) -> dict[str, Any]:
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    from kstrata.agents.eval_worker import make_inputs

    module, device, seed = _load(job)
    if job.get("policy", "strict") == "strict":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    inputs = make_inputs(module, 0, seed, device)
    model = _candidates({"candidates": {"c": job["candidate"]}}, module, device, seed)["c"]
    calls = int(job.get("calls", 5))
    with torch.no_grad():
        for _ in range(3):
            model(*inputs)
        _sync(device)
        _wait_for_go(job)
        if job.get("ncu_range"):
            torch.cuda.nvtx.range_push(job["ncu_range"])  # type: ignore[no-untyped-call]
            model(*inputs)
            _sync(device)
            torch.cuda.nvtx.range_pop()  # type: ignore[no-untyped-call]
            return {"ok": True, "ncu_run": True}
        t0 = time.perf_counter()
        for _ in range(calls):
            model(*inputs)
        _sync(device)
        wall_us = (time.perf_counter() - t0) / calls * 1e6
        with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                model(*inputs)
            _sync(device)
    return {"ok": True, "wall_us_per_call": wall_us, **kernel_rows(prof.events(), calls)}


def kernel_rows(events: Any, calls: int) -> dict[str, Any]:
    """The device work of `calls` profiled calls by kernel name (`device_profile`: kernels, memcpys and
    memsets; a `record_function` range projected onto the GPU, such as Inductor's graph call, would count its
    kernels twice): time and launches per call, each name's share, their sum per call."""
    from kstrata.backends.device_profile import device_profile

    p = device_profile([list(events)], calls=calls)
    total = sum(k.us_per_call for k in p.kernels)
    rows = [{"name": k.name, "time_us_per_call": k.us_per_call, "launches_per_call": k.launches_per_call,
             "share": k.us_per_call / total if total else 0.0} for k in p.kernels]
    return {"kernel_us_per_call": total, "launches_per_call": sum(k.launches_per_call for k in p.kernels),
            "kernels": rows[:50]}


JOBS = {"probe": probe, "contract": contract, "measure": measure, "profile": profile}


def main(argv: list[str]) -> None:
    job = json.loads(Path(argv[0]).read_text())
    out = Path(job["result"])
    try:
        if job.get("device") == "cpu":
            os.environ.setdefault("TRITON_INTERPRET", "1")
        result = JOBS[job["cmd"]](job)
    except BaseException as exc:  # a candidate's SystemExit is a failure to report
        result = {"ok": False, "error": f"{type(exc).__name__}: {str(exc)[:500]}", "traceback": traceback.format_exc()[-3000:]}
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(result, default=str))
    tmp.replace(out)
    from kstrata.agents.leave import leave

    leave(0)


if __name__ == "__main__":
    main(sys.argv[1:])
