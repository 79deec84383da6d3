"""Correctness of rendered sources without a GPU: the ModelNew against the task's Model, on the CPU under
Triton's interpreter (or on any device), judged by the strict bound of `kstrata.agents.evaluate`.

`compare(task, candidate)` seeds and builds both models as KernelBench does (same weights: the test also
checks the state dicts are equal), runs them on the task's inputs (optionally made non-contiguous), runs
the Model in float64 as the truth, and passes when the candidate's largest absolute error and relative L2
error are within `kstrata eval`'s strict bounds (`evaluate.strict_bounds`: a multiple of the PyTorch reference's own plus a few ULPs).

Triton decides at `import triton` whether `@triton.jit` means the interpreter (`TRITON_INTERPRET=1`), so
the check runs in a child process started with it set: `run_jobs(jobs)` runs many checks in one child
(`python -m kstrata.agents.templates.cpucheck JOBS.json OUT.json`) with a timeout.

A GPU compile needs no GPU: with `record=True` a job also records every kernel launch the forward made
(kernel name, parameter types, constexpr values, num_warps), and `compile_jobs` compiles each recorded
launch for a GPU target (`cuda:90` by default) in a child *without* the interpreter, so a rendered source
that would not lower on the GPU (an op the backend lacks, a type mismatch the interpreter forgives) fails
on the CPU machine, and so does one that needs more shared memory than a block of the target gets (which
Triton itself checks only when it loads the binary on a device).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any


def _errors(x: Any, truth: Any) -> tuple[float, float]:
    import torch

    d = (x.double() - truth).abs()
    den = torch.linalg.vector_norm(truth)
    num = torch.linalg.vector_norm(x.double() - truth)
    return float(d.max()), float(num / den) if float(den) > 0 else float(num)


def compare(task: str | Path, candidate: str | Path, *, device: str = "cpu", noncontiguous: bool = False,
            seed: int = 42, policy: str = "strict") -> dict[str, Any]:
    """Figures of the candidate against the task's Model (see the module docstring); `ok` says if it passes.
    `policy` "tf32": the bound admits the error of TF32 rounding in the model's convolutions and matrix
    products (`eval_worker.tf32_allowance`, as `kstrata eval --precision tf32` does) besides PyTorch's own."""
    import torch

    from kstrata.agents.evaluate import strict_bounds
    from kstrata.agents.tasks import import_task_module

    task_mod = import_task_module(task)
    cand_mod = import_task_module(candidate)
    torch.manual_seed(seed)
    init = list(task_mod.get_init_inputs())
    torch.manual_seed(seed)
    ref_model = task_mod.Model(*init).to(device).eval()
    torch.manual_seed(seed)
    new_model = cand_mod.ModelNew(*init).to(device).eval()
    ref_state, new_state = ref_model.state_dict(), new_model.state_dict()
    if list(ref_state) != list(new_state) or not all(torch.equal(v, new_state[k]) for k, v in ref_state.items()):
        return {"ok": False, "reason": "ModelNew's parameters differ from the Model's"}
    torch.manual_seed(seed + 1)
    inputs = [t.to(device) if isinstance(t, torch.Tensor) else t for t in task_mod.get_inputs()]
    if noncontiguous:
        inputs = [t.transpose(-1, -2).contiguous().transpose(-1, -2) if isinstance(t, torch.Tensor) and t.dim() >= 2
                  and t.shape[-1] > 1 and t.shape[-2] > 1 else t for t in inputs]
        if all(not isinstance(t, torch.Tensor) or t.is_contiguous() for t in inputs):
            return {"ok": False, "reason": "no input could be made non-contiguous"}
    with torch.no_grad():
        ref = ref_model(*inputs)
        out = new_model(*inputs)
        truth = ref_model.double()(*[t.double() if isinstance(t, torch.Tensor) and t.is_floating_point() else t
                                     for t in inputs])
    if not isinstance(out, torch.Tensor) or out.shape != ref.shape or out.dtype != ref.dtype:
        return {"ok": False, "reason": f"output {getattr(out, 'shape', type(out))} {getattr(out, 'dtype', '')}, "
                                       f"expected {tuple(ref.shape)} {ref.dtype}"}
    if not bool(torch.isfinite(out).all()) and bool(torch.isfinite(ref).all()):
        return {"ok": False, "reason": "non-finite values in the candidate's output (an element not written?)"}
    ref_abs, ref_rel = _errors(ref, truth)
    out_abs, out_rel = _errors(out, truth)
    allow_abs = allow_rel = 0.0
    if policy == "tf32":
        from kstrata.agents.eval_worker import tf32_allowance

        with torch.no_grad():
            allowance, _ = tf32_allowance(ref_model, inputs, [truth], ("convolution", "matmul"))
        if allowance and allowance[0]:
            allow_abs, allow_rel = float(allowance[0]["max_abs"]), float(allowance[0]["rel_l2"])
    elif policy != "strict":
        raise ValueError(f"compare judges under strict or tf32, not {policy!r}")
    abs_bound, rel_bound = strict_bounds(ref.dtype, max(ref_abs, allow_abs), max(ref_rel, allow_rel),
                                         float(truth.abs().max()))
    ok = out_abs <= abs_bound and out_rel <= rel_bound
    return {"ok": ok, "reason": "" if ok else f"error above the {policy} bound", "max_abs": out_abs,
            "rel_l2": out_rel, "ref_max_abs": ref_abs, "ref_rel_l2": ref_rel, "tf32_max_abs": allow_abs,
            "tf32_rel_l2": allow_rel, "abs_bound": abs_bound, "rel_bound": rel_bound}


_TRITON_DTYPES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "float64": "fp64", "int64": "i64",
                  "int32": "i32", "int8": "i8", "uint8": "u8", "bool": "i1"}


def _record_launches() -> list[dict[str, Any]]:
    """Patch the interpreter's launch to record each launch's kernel, parameter types and constexprs."""
    import inspect

    import torch
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction

    records: list[dict[str, Any]] = []
    original = InterpretedFunction.run

    def run(self: Any, *args: Any, grid: Any, warmup: Any, **kwargs: Any) -> Any:
        sig = inspect.signature(self.fn)
        meta: dict[str, Any] = {k: kwargs[k] for k in ("num_warps", "num_stages") if k in kwargs}
        bound = sig.bind(*args, **{k: v for k, v in kwargs.items() if k in sig.parameters})
        types: dict[str, str] = {}
        constexprs: dict[str, Any] = {}
        for name, param in sig.parameters.items():
            value = bound.arguments.get(name)
            if param.annotation is tl.constexpr or (isinstance(param.annotation, type) and issubclass(param.annotation, tl.constexpr)):
                types[name] = "constexpr"
                constexprs[name] = value
            elif isinstance(value, torch.Tensor):
                types[name] = "*" + _TRITON_DTYPES[str(value.dtype).removeprefix("torch.")]
            elif isinstance(value, bool):
                types[name] = "i1"
            elif isinstance(value, int):
                types[name] = "i32" if -(2**31) <= value < 2**31 else "i64"
            elif isinstance(value, float):
                types[name] = "fp32"
            else:
                raise TypeError(f"kernel {self.fn.__name__}: argument {name}={value!r} of no Triton type")
        records.append({"kernel": self.fn.__name__, "signature": types, "constexprs": constexprs, **meta})
        return original(self, *args, grid=grid, warmup=warmup, **kwargs)

    InterpretedFunction.run = run
    return records


def compile_launches(candidate: str | Path, launches: list[dict[str, Any]], target: str = "cuda:90") -> list[str]:
    """Compile each distinct recorded launch of the candidate's kernels for `target`; the failures, one line each."""
    import triton
    from triton.compiler import ASTSource

    from kstrata.agents.tasks import import_task_module
    from kstrata.ir.target import Target

    mod = import_task_module(candidate)
    tgt = Target.parse(target).to_triton()
    failures: list[str] = []
    seen: set[str] = set()
    for launch in launches:
        key = json.dumps(launch, sort_keys=True)
        if key in seen:
            continue
        seen.add(key)
        fn = getattr(mod, launch["kernel"])
        # "divisible": parameters a real launch would specialize as multiples of 16 (aligned pointers, strides)
        attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in launch.get("divisible", [])}
        src = ASTSource(fn, dict(launch["signature"]), dict(launch["constexprs"]), attrs)
        opts = {k: launch[k] for k in ("num_warps", "num_stages") if k in launch}
        try:
            compiled = triton.compile(src, target=tgt, options=opts)
        except Exception as e:  # what the GPU compiler says is the result
            lines = [line for line in str(e).splitlines() if line.strip()]
            # Triton's CompilationError: "at L:C:", the source lines, a caret, then the reason last
            failures.append(f"{launch['kernel']} {opts}: {type(e).__name__}: {' | '.join(lines[:1] + lines[-2:])[:400]}")
            continue
        # Triton checks shared memory only when it loads the binary on a device: check it here
        shared, limit = int(getattr(compiled.metadata, "shared", 0)), _shared_limit(target)
        if limit is not None and shared > limit:
            failures.append(f"{launch['kernel']} {opts}: needs {shared} bytes of shared memory, a block on {target} "
                            f"gets {limit}")
    return failures


def _shared_limit(target: str) -> int | None:
    """The shared memory one block may take on an NVIDIA target (None: not known here)."""
    from kstrata.backends.nvidia import SM_LIMITS
    from kstrata.ir.target import Target

    t = Target.parse(target)
    if t.backend != "cuda":
        return None
    try:
        lim = SM_LIMITS[int(t.arch)]
    except (KeyError, ValueError):
        return None
    return lim.shared_bytes - lim.reserved_shared_per_block


def compile_jobs(jobs: list[dict[str, Any]], target: str = "cuda:90", timeout_s: float = 900.0) -> list[list[str]]:
    """For each job ({"task", "source"}): record its launches under the interpreter, then compile them for `target`
    (two children: the interpreter's and a compiler's). Returns each job's compile failures (empty: all compiled)."""
    recorded = run_jobs([{**j, "record": True} for j in jobs], timeout_s=timeout_s, keep_sources=True)
    return compile_recorded(recorded, target, timeout_s)


def compile_recorded(recorded: list[dict[str, Any]], target: str = "cuda:90", timeout_s: float = 900.0) -> list[list[str]]:
    """Compile the launches `run_jobs(..., record=True, keep_sources=True)` recorded, in a compiler child."""
    todo = []
    for r in recorded:
        if not r.get("launches"):
            raise RuntimeError(f"no launch recorded ({r.get('reason', '')})")
        todo.append({"candidate": r["candidate_source"], "launches": r["launches"], "target": target})
    with tempfile.TemporaryDirectory(prefix="kstrata-gpucompile-") as d:
        for i, t in enumerate(todo):
            path = Path(d) / f"model_new_{i}.py"
            path.write_text(t.pop("candidate"))
            t["candidate"] = str(path)
        jobs_path, out_path = Path(d) / "jobs.json", Path(d) / "out.json"
        jobs_path.write_text(json.dumps(todo))
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        proc = subprocess.run([sys.executable, "-m", "kstrata.agents.templates.cpucheck", "--compile", str(jobs_path),
                               str(out_path)], env=env, capture_output=True, text=True, timeout=timeout_s)
        if proc.returncode != 0 or not out_path.exists():
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            raise RuntimeError(f"the compile child failed (exit {proc.returncode}): {' | '.join(tail)}")
        out: list[list[str]] = json.loads(out_path.read_text())
        return out


def run_jobs(jobs: list[dict[str, Any]], timeout_s: float = 900.0, keep_sources: bool = False) -> list[dict[str, Any]]:
    """Run `compare` for each job ({"task", "source" or "candidate", "noncontiguous", "record"}) in one
    interpreter child."""
    with tempfile.TemporaryDirectory(prefix="kstrata-cpucheck-") as d:
        todo = []
        for i, job in enumerate(jobs):
            job = dict(job)
            if "source" in job:
                path = Path(d) / f"model_new_{i}.py"
                path.write_text(job.pop("source"))
                job["candidate"] = str(path)
            todo.append(job)
        jobs_path, out_path = Path(d) / "jobs.json", Path(d) / "out.json"
        jobs_path.write_text(json.dumps(todo))
        env = {**os.environ, "TRITON_INTERPRET": "1"}
        proc = subprocess.run([sys.executable, "-m", "kstrata.agents.templates.cpucheck", str(jobs_path), str(out_path)],
                              env=env, capture_output=True, text=True, timeout=timeout_s)
        if proc.returncode != 0 or not out_path.exists():
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            raise RuntimeError(f"the CPU check child failed (exit {proc.returncode}): {' | '.join(tail)}")
        results: list[dict[str, Any]] = json.loads(out_path.read_text())
        if keep_sources:
            for job, r in zip(todo, results, strict=True):
                r["candidate_source"] = Path(job["candidate"]).read_text()
        return results


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[0] == "--compile":
        todo = json.loads(Path(args[1]).read_text())
        Path(args[2]).write_text(json.dumps([compile_launches(t["candidate"], t["launches"], t["target"]) for t in todo]))
        return 0
    jobs = json.loads(Path(args[0]).read_text())
    results = []
    records = _record_launches() if any(j.get("record") for j in jobs) else None
    for job in jobs:
        t0 = time.monotonic()
        if records is not None:
            records.clear()
        try:
            r = compare(job["task"], job["candidate"], device=job.get("device", "cpu"),
                        noncontiguous=bool(job.get("noncontiguous")))
            r["seconds"] = round(time.monotonic() - t0, 3)
            if records is not None:
                r["launches"] = list(records)
            results.append(r)
        except Exception as e:  # one failing job is a result; the others still run
            tb = traceback.format_exception(type(e), e, e.__traceback__)
            results.append({"ok": False, "reason": f"{type(e).__name__}: {str(e)[:500]}", "traceback": "".join(tb)[-2000:]})
    Path(args[1]).write_text(json.dumps(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
