"""`kstrata eval` and `kstrata bench`: the hardened evaluator and the suite benchmark.

`eval_app` and `bench_app` are typer sub-apps with one command each; `kstrata.tools.cli` mounts them as
`eval` and `bench`. Run on its own, this module offers both (`python -m kstrata.tools.cli_eval eval
TASK.py CANDIDATE.py`). Exit codes: 0 accepted (eval) or finished (bench); 1 rejected, or a bench task
failed; 2 a user error (one line naming the file).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from kstrata.ir.errors import KstrataError
from kstrata.tools.console import JsonFlag, emit_json, err, error_line, out

#: Each sub-app is one command (its callback): options may follow the arguments, as in any command.
ONE_COMMAND: dict[str, Any] = {"allow_interspersed_args": True}
eval_app = typer.Typer(help="Judge a KernelBench ModelNew candidate against a task, hardened against cheating.",
                       add_completion=False, pretty_exceptions_enable=False, context_settings=ONE_COMMAND)
bench_app = typer.Typer(help="Benchmark a suite of tasks under eager and torch.compile baselines.",
                        add_completion=False, pretty_exceptions_enable=False, context_settings=ONE_COMMAND)

_emit_json = emit_json


@eval_app.callback(invoke_without_command=True)
def eval_cmd(
    task: Annotated[Path, typer.Argument(metavar="TASK.py", help="A KernelBench-format task file (Model, get_inputs, get_init_inputs).")],
    candidate: Annotated[Path, typer.Argument(metavar="CANDIDATE.py", help="A file defining ModelNew.")],
    as_json: JsonFlag = False,
    policy: Annotated[str, typer.Option("--policy", help="strict (float64-anchored, default) or kernelbench.")] = "strict",
    trials: Annotated[int, typer.Option("--trials", help="Correctness trials (at least 5).")] = 6,
    seed: Annotated[int, typer.Option("--seed")] = 42,
    device: Annotated[str, typer.Option("--device", help="cuda or cpu (default: cuda when present).")] = "",
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds each process may run.")] = 600.0,
    runs: Annotated[int, typer.Option("--runs", help="Timed runs (median reported).")] = 100,
    cuda_graph: Annotated[bool, typer.Option("--cuda-graph", help="Time through a CUDA graph.")] = False,
    no_timing: Annotated[bool, typer.Option("--no-timing", help="Check correctness only.")] = False,
    ceilings_dir: Annotated[Path | None, typer.Option("--ceilings-dir", help="Where measured ceilings are cached.")] = None,
) -> None:
    """Run the reference and the candidate in separate processes and judge the candidate."""
    from kstrata.agents.engine import Engine, TaskOptions
    from kstrata.agents.evaluate import EvalError

    ceilings = None
    dev = device or None
    if not no_timing and (dev or "") != "cpu":
        import torch

        if torch.cuda.is_available():
            from kstrata.agents.roofline import load_or_measure

            ceilings, _ = load_or_measure(ceilings_dir or Path.home() / ".cache" / "kstrata")
    started: dict[str, float] = {}

    def on_plan(plan: Any) -> None:
        gib = 2**30
        err.print(f"memory plan: {plan.mode}; inputs {plan.input_bytes / gib:.2f} GiB, outputs "
                  f"{plan.output_bytes / gib:.2f} GiB, float64 copies {plan.float64_bytes / gib:.2f} GiB; about "
                  f"{plan.host_need_bytes / gib:.1f} GiB of host memory here ({plan.host_available_bytes / gib:.0f} "
                  "GiB available)", highlight=False)

    def on_progress(role: str, done: int, total: int, seconds: float, phases: str = "") -> None:
        # per trial, with an estimate of what is left of this process's trials and where the trial's time went
        left = seconds / done * (total - done) if done else 0.0
        started.setdefault(role, seconds)
        err.print(f"  {role}: trial {done}/{total} done, {seconds:.1f} s so far"
                  + (f", about {left:.0f} s left" if done < total else "")
                  + (f" (last trial, s: {phases.replace(',', ', ')})" if phases else ""), highlight=False)

    # through the candidate engine: the candidate is `Candidate.task(TASK, its source)`, evaluated in place
    options = TaskOptions(policy=policy, trials=trials, seed=seed, runs=runs, cuda_graph=cuda_graph,
                          timing=False if no_timing else None, ceilings=ceilings, on_progress=on_progress,
                          on_plan=on_plan)  # progress on stderr, with --json too
    try:
        with Engine() as engine:  # a missing task or candidate file: one line naming it (EngineError)
            base = engine.add_task(task)
            checked = engine.check(base, engine.adopt_task(base, candidate), device=dev or "", timeout=timeout,
                                   task=options)
        verdict = checked.task_verdict
    except EvalError as exc:
        raise KstrataError(str(exc)) from None
    if as_json:
        _emit_json(verdict.to_json())
    else:
        colour = "green" if verdict.accepted else "red"
        out.print(f"[bold {colour}]{'ACCEPTED' if verdict.accepted else 'REJECTED'}[/] {verdict.candidate} for "
                  f"{verdict.task} ({verdict.policy} policy): {verdict.reason}", highlight=False, soft_wrap=True)
        out.print(f"correct: strict={verdict.correct_strict} kernelbench={verdict.correct_kernelbench} "
                  f"kernelbench(task inputs only)={verdict.correct_kernelbench_task_inputs}", highlight=False)
        if verdict.trials:
            table = Table(title="trials")
            for col in ("#", "inputs", "integrity", "strict", "kernelbench", "err vs fp64 (rel)", "PyTorch's own"):
                table.add_column(col)
            for t in verdict.trials:
                o = t.outputs[0] if t.outputs else None
                table.add_row(str(t.index), t.distribution, "ok" if t.integrity_ok else "FAIL",
                              "ok" if t.passes("strict") else "FAIL", "ok" if t.passes("kernelbench") else "FAIL",
                              f"{o.candidate_rel_l2:.3g}" if o and o.candidate_rel_l2 is not None else "—",
                              f"{o.reference_rel_l2:.3g}" if o and o.reference_rel_l2 is not None else "—")
            out.print(table)
        if verdict.candidate_timing and verdict.reference_timing:
            c, r = verdict.candidate_timing, verdict.reference_timing
            out.print(f"time: candidate {c.median_us:.1f} us (p10 {c.p10_us:.1f}, p90 {c.p90_us:.1f}), reference "
                      f"{r.median_us:.1f} us; speedup {verdict.speedup:.2f}x", highlight=False)
        elif verdict.timing_note:
            out.print(f"time: {verdict.timing_note}", highlight=False)
        mem = verdict.memory
        peaks = [f"{role} host {m['peak_host_bytes'] / 2**30:.2f} GiB"
                 + (f", GPU {m['peak_gpu_bytes'] / 2**30:.2f} GiB" if "peak_gpu_bytes" in m else "")
                 for role in ("reference", "candidate", "evaluator") if isinstance(m := mem.get(role), dict)]
        if peaks:
            out.print("peak memory: " + "; ".join(peaks), highlight=False)
        prec = verdict.precision
        if prec.get("reference"):
            out.print("precision: " + "; ".join(
                f"{role} TF32 matmul={p.get('matmul_allow_tf32')} cuDNN={p.get('cudnn_allow_tf32')}, reduced-precision "
                f"reductions fp16={p.get('matmul_fp16_reduced_precision_reduction')} "
                f"bf16={p.get('matmul_bf16_reduced_precision_reduction')}"
                for role, p in prec.items() if p), highlight=False)
        if verdict.roofline:
            out.print(f"roofline: {100 * verdict.roofline['fraction']:.1f}% of speed of light "
                      f"({verdict.roofline['bound']}-bound)", highlight=False)
    if not verdict.accepted:
        raise typer.Exit(1)


@bench_app.callback(invoke_without_command=True)
def bench_cmd(
    suite_dir: Annotated[Path, typer.Argument(metavar="SUITE_DIR", help="A directory of task files (searched recursively).")],
    baselines: Annotated[str, typer.Option("--baselines", help="Comma-separated: eager, compile, compile-max-autotune.")] = "eager,compile",
    as_json: JsonFlag = False,
    out_dir: Annotated[Path, typer.Option("--out", help="Results JSON, markdown report and plots go here.")] = Path("bench-out"),
    runs: Annotated[int, typer.Option("--runs", help="Timed runs per task and baseline (median).")] = 100,
    task_timeout: Annotated[float, typer.Option("--task-timeout", help="Seconds each evaluation process (the "
                                                "reference's, a baseline's) may take.")] = 600.0,
    only: Annotated[list[str] | None, typer.Option("--only", help="Only tasks whose path contains this (repeatable).")] = None,
    ceilings_dir: Annotated[Path | None, typer.Option("--ceilings-dir", help="Cache of measured ceilings (default: --out).")] = None,
    jobs: Annotated[int, typer.Option("--jobs", help="Parallel workers that fill torch.compile's caches before the "
                                                       "timed (sequential) pass.")] = 1,
    gpus: Annotated[str | None, typer.Option("--gpus", help="all, or GPU indices 0,1,...: the tasks spread over one "
                                             "GPU worker per device (one task at a time on each).")] = None,
    workers: Annotated[str | None, typer.Option("--workers", help="Where tasks run: local (default), ray (a local "
                                                "Ray cluster) or ray://HOST:PORT.")] = None,
    engine_cache: Annotated[Path | None, typer.Option("--engine-cache", help="The candidate engine's cache, where "
                                                      "baseline evaluations are kept (default KSTRATA_ENGINE_CACHE "
                                                      "or ~/.cache/kstrata/engine).")] = None,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Evaluate and time every baseline again: take "
                                           "nothing from the engine's cache.")] = False,
) -> None:
    """Every task under SUITE_DIR under each baseline, through the candidate engine (a re-run on unchanged
    tasks and versions answers from its cache); resumes from OUT/bench-results.json."""
    from kstrata.agents.bench import run_bench
    from kstrata.agents.workers import make_workers

    if not suite_dir.is_dir():
        raise KstrataError("no such suite directory", path=suite_dir)
    names = [b.strip() for b in baselines.split(",") if b.strip()]

    def progress(m: str) -> None:
        (err if as_json else out).print(m, highlight=False)

    pool = make_workers(workers, gpus, on_event=progress) if gpus is not None or workers is not None else None
    try:
        results = run_bench(suite_dir, names, out_dir, runs=runs, task_timeout_s=task_timeout,
                            ceilings_dir=ceilings_dir, only=only, jobs=jobs, on_progress=progress, workers=pool,
                            engine_cache=engine_cache, use_cache=not no_cache)
    except (ValueError, RuntimeError) as exc:
        raise KstrataError(str(exc)) from None
    finally:
        if pool is not None:
            pool.close()
    if as_json:
        _emit_json(results)
    else:
        out.print(f"report: {out_dir / 'bench-report.md'}", highlight=False)
        for b, s in results["summary"].items():
            out.print(f"{b}: {s['correct']}/{s['tasks']} correct, geomean speedup vs eager "
                      f"{s['geomean_speedup_vs_eager'] or 0:.3f}, " +
                      ", ".join(f"{k}={v:.2f}" for k, v in s["fast_p"].items()), highlight=False)
    failed = any(not r.get("ok") for e in results["tasks"].values() for r in e["baselines"].values())
    if failed:
        raise typer.Exit(1)


def main() -> None:
    """Run `eval` or `bench` on its own, turning kstrata's user errors into one line and exit code 2."""
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False, no_args_is_help=True)
    app.command("eval", help=eval_cmd.__doc__, context_settings=ONE_COMMAND)(eval_cmd)
    app.command("bench", help=bench_cmd.__doc__, context_settings=ONE_COMMAND)(bench_cmd)
    try:
        app()
    except KstrataError as exc:
        error_line(exc)
        sys.exit(2)


if __name__ == "__main__":
    main()
