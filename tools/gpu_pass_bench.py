"""GPU proof of `run-passes --measure`: which passes make which kernels of a real program faster, measured.

    python -m kstrata.tools.gpu_pass_bench --work DIR --results DIR [--pipeline SPEC ...] [--jobs N]

On a machine with an NVIDIA GPU, in a fresh work directory:

1. records a real program under `kstrata record` with a fresh `TRITON_CACHE_DIR` and
   `TORCHINDUCTOR_CACHE_DIR`: a `torch.compile`d transformer-style MLP block (LayerNorm, Linear, GELU,
   residual, softmax; fp16, 16384 tokens x 4096) and two suite kernels at GPU sizes (`vector_add` over
   2^27 floats, `softmax_online` over 16384 x 8192), saving a digest of every output;
2. runs `kstrata run-passes CACHE --pipeline P --launches RECORDS --measure` for each pipeline (the
   report times every changed kernel, original binary against rewritten, on replays of its recorded
   launch);
3. re-runs the program with `TRITON_KERNEL_OVERRIDE=1 TRITON_OVERRIDE_DIR=...` and a fresh cache for
   each pipeline (concurrently: these runs check results, they are not timed), checks that the outputs
   are bit-identical to the recorded run's, and counts how many rewritten kernels Triton actually used
   (a PTX of the override run's cache equal to the one run-passes wrote);
4. prints a table and writes `run-passes-gpu-<date>.json` and `.md` (device, versions, date) under
   `--results`.

Every figure is reported as measured, slowdowns included.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer

DEFAULT_PIPELINES = (
    "ptx(ld-nc{assume_noalias=true},cache-hints)",
    "ttgir(num-warps{n=8})",
    "ttgir(num-stages{n=4})",
    "ptx(max-registers{n=64})",
)

PROGRAM = '''
"""The program whose kernels are recorded, rewritten and timed (written by kstrata.tools.gpu_pass_bench)."""
import hashlib, json, sys
import torch
import torch.nn as nn
import torch.nn.functional as F

from kstrata.tools.suite import load_suite

get_kernel = load_suite().get_kernel


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        h = self.fc2(F.gelu(self.fc1(self.norm(x))))
        y = x + h
        return y, torch.softmax(y.float(), dim=-1)


def digest(t):
    t = t.detach().contiguous()
    return {"sha256": hashlib.sha256(t.view(torch.uint8).cpu().numpy().tobytes()).hexdigest(),
            "head": t.flatten()[:4096].float().cpu().tolist()}


torch.manual_seed(0)
results = {}
with torch.no_grad():
    block = Block(4096).cuda().half().eval()
    x = torch.randn(16384, 4096, device="cuda", dtype=torch.half)
    compiled = torch.compile(block)
    for _ in range(3):
        y, p = compiled(x)
    results["block.y"], results["block.softmax"] = digest(y), digest(p)

    add = get_kernel("vector_add")
    n = 1 << 27
    a, b = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    out = torch.empty_like(a)
    for _ in range(3):
        add.fn[((n + 1023) // 1024,)](a, b, out, n, BLOCK=1024)
    results["vector_add"] = digest(out)

    sm = get_kernel("softmax_online")
    rows, cols = 16384, 8192
    s = (torch.randn(rows, cols, device="cuda") * 2.0).half()
    o = torch.empty(rows, cols, device="cuda")
    for _ in range(3):
        sm.fn[(rows,)](s, o, cols, BLOCK=128)
    results["softmax_online"] = digest(o)
torch.cuda.synchronize()
with open(sys.argv[1], "w") as f:
    json.dump(results, f)
'''


def _env(work: Path, tag: str, **extra: str) -> dict[str, str]:
    """A fresh Triton and Inductor cache for one run of the program (so every kernel is compiled)."""
    env = dict(os.environ)
    env.update({"TRITON_CACHE_DIR": str(work / f"triton-cache-{tag}"),
                "TORCHINDUCTOR_CACHE_DIR": str(work / f"inductor-cache-{tag}"),
                "TORCHINDUCTOR_COMPILE_THREADS": "1", "PYTHONUNBUFFERED": "1"})
    env.update(extra)
    return env


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "kstrata.tools.cli", *args]


def _compare(reference: dict[str, Any], other: dict[str, Any]) -> dict[str, Any]:
    """Per output: bit-identical, or the largest difference among the first 4096 elements."""
    out: dict[str, Any] = {}
    for name, ref in reference.items():
        got = other.get(name)
        if got is None:
            out[name] = "missing"
        elif got["sha256"] == ref["sha256"]:
            out[name] = "bit-identical"
        else:
            diff = max((abs(a - b) for a, b in zip(ref["head"], got["head"], strict=True)), default=0.0)
            out[name] = (f"differs (max |diff| over the first 4096 elements: {diff:.3g})" if diff else
                         "differs (the first 4096 elements agree; the bytes differ further on)")
    return out


def _ptx_digests(root: Path) -> set[str]:
    """Digests of every PTX under `root`. An applied override shows as the override's PTX in the cache of
    the run that used it (Triton keeps a stage's override as that stage's output, and rebuilds what is
    below it as run-passes did); binaries are not compared, since ptxas flags may differ."""
    return {hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*.ptx")}


def main(argv: list[str] | None = None) -> int:
    from kstrata.tools.console import run_command

    return run_command(command, argv, help=__doc__)


def command(
    work: Annotated[Path, typer.Option("--work", help="Work directory (emptied first).")],
    results: Annotated[Path, typer.Option("--results", help="Where the dated results files go.")],
    pipeline: Annotated[list[str] | None, typer.Option("--pipeline", help="Repeatable; default: four pipelines.")] = None,
    jobs: Annotated[int, typer.Option("--jobs", help="Parallel run-passes workers.")] = 8,
) -> int:

    import torch

    if not torch.cuda.is_available() or torch.version.hip is not None:
        print("gpu_pass_bench: needs an NVIDIA GPU visible to torch; nothing was run", file=sys.stderr)
        return 2
    pipelines = pipeline or list(DEFAULT_PIPELINES)
    work = work.resolve()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    program = work / "program.py"
    program.write_text(PROGRAM)
    start = time.perf_counter()

    # 1. the recorded run
    launches = work / "launches"
    reference_file = work / "outputs-recorded.json"
    rec = subprocess.run(_cli("record", "--out", str(launches), "--json", "--", sys.executable, str(program),
                              str(reference_file)), env=_env(work, "recorded"), capture_output=True, text=True,
                         check=False)
    if rec.returncode != 0:
        print(rec.stdout[-3000:], rec.stderr[-3000:], sep="\n", file=sys.stderr)
        return 1
    from kstrata.tools.record import summarize

    records = summarize(sorted(launches.glob("*.json")))  # not the CLI's stdout: the program shares it
    cache = work / "triton-cache-recorded"
    reference = json.loads(reference_file.read_text())
    print(f"recorded {len(records)} launches ({time.perf_counter() - start:.0f} s)", flush=True)

    # 2. run-passes with timing, one pipeline after the other (timings never overlap)
    runs: list[dict[str, Any]] = []
    for i, spec in enumerate(pipelines):
        out = work / f"overrides-{i}"
        proc = subprocess.run(_cli("run-passes", str(cache), "--pipeline", spec, "--out", str(out), "--launches",
                                   str(launches), "--measure", "--jobs", str(jobs), "--json"),
                              capture_output=True, text=True, check=False)
        try:
            report = json.loads(proc.stdout)
        except json.JSONDecodeError:
            report = {"error": proc.stderr[-2000:], "kernels": [], "counts": {}}
        runs.append({"pipeline": spec, "out": out, "report": report, "returncode": proc.returncode})
        print(f"run-passes {spec}: {report.get('counts')} ({time.perf_counter() - start:.0f} s)", flush=True)
        _write_results(results, records, runs, start, final=False)

    # 3. the program again with each override directory, concurrently (a check of results, not timed)
    children = []
    for i, run in enumerate(runs):
        root = run["out"] / "cuda-90"
        if not any(root.glob("*/*")):
            run["outputs"], run["overrides_applied"] = "no overrides written", None
            continue
        outputs = work / f"outputs-override-{i}.json"
        env = _env(work, f"override-{i}", TRITON_KERNEL_OVERRIDE="1", TRITON_OVERRIDE_DIR=str(root))
        children.append((run, outputs, root, work / f"triton-cache-override-{i}",
                         subprocess.Popen([sys.executable, str(program), str(outputs)], env=env,
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)))
    for run, outputs, root, override_cache, child in children:
        log, _ = child.communicate()
        if child.returncode != 0:
            run["outputs"] = f"the program failed with overrides (exit code {child.returncode}): {log[-1500:]}"
            run["overrides_applied"] = None
            continue
        run["outputs"] = _compare(reference, json.loads(outputs.read_text()))
        written, built = _ptx_digests(root), _ptx_digests(override_cache)
        run["overrides_applied"] = f"{len(written & built)} of {len(written)}"
    print(f"override runs done ({time.perf_counter() - start:.0f} s)", flush=True)

    _write_results(results, records, runs, start, final=True)
    return 0


def _write_results(results: Path, records: list[dict[str, Any]], runs: list[dict[str, Any]], start: float,
                   final: bool) -> None:
    import torch
    import triton

    props = torch.cuda.get_device_properties(0)
    env: dict[str, Any] = {"date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                           "device": props.name, "torch": torch.__version__, "cuda": torch.version.cuda,
                           "triton": triton.__version__, "python": platform.python_version(),
                           "host_cpus": os.cpu_count()}
    result = {"schema": "kstrata.gpu-pass-bench/1", "environment": env, "complete": final, "records": records,
              "seconds": round(time.perf_counter() - start, 1),
              "pipelines": [{k: (str(v) if isinstance(v, Path) else v) for k, v in r.items()} for r in runs]}
    text = _markdown(env, runs, len(records)) + ("" if final else "\n(partial: the run did not finish)\n")
    if final:
        print(text)
    results.mkdir(parents=True, exist_ok=True)
    stem = f"run-passes-gpu-{env['date'][:10]}"
    (results / f"{stem}.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    (results / f"{stem}.md").write_text(text)


def _markdown(env: dict[str, Any], runs: list[dict[str, Any]], n_records: int) -> str:
    lines = [f"# run-passes --measure on {env['device']}", "",
             f"{env['date']} · torch {env['torch']} (CUDA {env['cuda']}) · triton {env['triton']}", "",
             "Program: a `torch.compile`d MLP block (LayerNorm, Linear, GELU, residual, softmax; fp16, 16384 x 4096) "
             "and the suite's `vector_add` (2^27 fp32) and `softmax_online` (16384 x 8192, fp16 in, fp32 out), "
             f"recorded with `kstrata record` ({n_records} launch records). Each changed kernel with a record is "
             "timed by `run-passes --measure`: original vs rewritten binary on replays of the recorded launch, "
             "L2 flushed before each run, median of rounds (ABBA order) of the median of runs; spread is the "
             "range of round medians. Outputs: the program re-run with the override directory and a fresh "
             "cache, compared with the recorded run.", ""]
    for run in runs:
        report = run["report"]
        counts = report.get("counts") or {}
        lines += [f"## `{run['pipeline']}`", "",
                  f"{counts.get('changed', 0)} changed, {counts.get('unchanged', 0)} unchanged, "
                  f"{counts.get('failed', 0)} failed · overrides used by Triton (PTX match): {run.get('overrides_applied')} · "
                  f"outputs: {_outputs_line(run.get('outputs'))}", ""]
        if report.get("error"):
            lines += [f"run-passes failed: {report['error']}", ""]
        rows = [k for k in report.get("kernels", []) if k["status"] != "unchanged"]
        if rows:
            lines += ["| kernel | status | before µs | after µs | speedup (range) | note |", "|---|---|---|---|---|---|"]
        for k in rows:
            t = k.get("timing") or {}
            if k.get("time_after_us") is not None:
                lo, hi = t.get("speedup_range", [k["speedup"], k["speedup"]])
                cells = (f"{k['time_before_us']:.2f} ±{t.get('spread_before_pct', 0):.1f}% | "
                         f"{k['time_after_us']:.2f} ±{t.get('spread_after_pct', 0):.1f}% | "
                         f"{k['speedup']:.3f}x ({lo:.3f}–{hi:.3f})")
            else:
                cells = "— | — | —"
            note = "; ".join(k.get("suspicious") or []) or t.get("skipped") or t.get("error") or k.get("error") or ""
            if t.get("outputs_equal") is False and not k.get("suspicious"):
                worst = max((v for n, v in (t.get("max_difference") or {}).items() if not n.endswith(".rel")),
                            default=0.0)
                note = f"outputs not bit-identical (max |diff| {worst:.3g}), within what the pass declares: " \
                       f"{t.get('declared_tolerance')}"
            lines.append(f"| {k['name']} | {k['status']} | {cells} | {str(note).replace('|', '/')[:200]} |")
        lines.append("")
    return "\n".join(lines)


def _outputs_line(outputs: Any) -> str:
    if isinstance(outputs, dict):
        same = [k for k, v in outputs.items() if v == "bit-identical"]
        other = [f"{k}: {v}" for k, v in outputs.items() if v != "bit-identical"]
        return f"{len(same)}/{len(outputs)} bit-identical" + (f" ({'; '.join(other)})" if other else "")
    return str(outputs)


if __name__ == "__main__":
    sys.exit(main())
