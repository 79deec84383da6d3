"""`kstrata optimize`: the optimizer loop (kstrata.agents.optimize) on a task file or a directory of tasks.

Exit codes: 0 every task done with an accepted output; 1 a task failed (its report says why); 2 a user
error (a bad task file, an --out holding a previous run without --resume, bad options), one line.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from kstrata.ir.errors import KstrataError
from kstrata.tools.console import JsonFlag, emit_json, err, out

optimize_app = typer.Typer(help="Make a KernelBench task faster: baselines, profile, findings, planner, search, "
                                "a verified model_new.py.", add_completion=False, pretty_exceptions_enable=False,
                           context_settings={"allow_interspersed_args": True})


def _load_proposer(spec: str) -> list[Any]:
    """`MODULE:ATTR` -> proposers; a bad one is a user error naming it."""
    import importlib

    from kstrata.agents.optimize.proposers import _as_proposers, _invalid

    module, _, attr = spec.partition(":")
    if not module or not attr:
        raise KstrataError(f"--proposer {spec!r}: write MODULE:ATTR")
    try:
        objs = _as_proposers(getattr(importlib.import_module(module), attr))
    except Exception as exc:
        raise KstrataError(f"--proposer {spec}: {type(exc).__name__}: {exc}") from None
    for obj in objs:
        why = _invalid(obj)
        if why:
            raise KstrataError(f"--proposer {spec}: {why}")
    return objs


def _workers_spec(workers: str, strategy_workers: int) -> tuple[str, int]:
    """`--workers`: where jobs run (local, ray, ray://HOST:PORT), or, as before, a number of strategy workers."""
    text = workers.strip()
    if text.isdigit():
        return "local", int(text)
    if text in ("local", "ray") or text.startswith("ray://"):
        return text, strategy_workers
    raise KstrataError(f"--workers {workers!r}: choose local, ray or ray://HOST:PORT (or a number of strategy workers)")


@optimize_app.callback(invoke_without_command=True)
def optimize_cmd(
    targets: Annotated[list[str], typer.Argument(help="A task file (Model, get_inputs, get_init_inputs) or a directory "
                                                      "of them; or a Triton cache directory (with --launches); or a "
                                                      "bare cubin or hsaco (with --launches: in-place patches); or, "
                                                      "after --, a command of two or more words to record and "
                                                      "optimize (-- python prog.py).", metavar="TARGET | -- CMD ...")],
    out_dir: Annotated[Path, typer.Option("--out", help="Per task: model_new.py, report.md, trajectory.jsonl.")],
    budget: Annotated[int, typer.Option("--budget", help="Candidates per task beyond the baselines.")] = 24,
    minutes: Annotated[float, typer.Option("--minutes", help="Time limit per task (minutes), baselines, search, "
                                           "final re-evaluation and report included.")] = 10.0,
    precision: Annotated[str, typer.Option("--precision", help="strict (default), tf32, bf16 or fp16.")] = "strict",
    workers: Annotated[str, typer.Option("--workers", help="Where jobs run: local (default), ray (a local Ray "
                                         "cluster started on demand) or ray://HOST:PORT; a number N is "
                                         "--strategy-workers N.")] = "local",
    strategy_workers: Annotated[int, typer.Option("--strategy-workers", help="Strategy workers per task (parallel "
                                                  "checks).")] = 1,
    gpus: Annotated[str | None, typer.Option("--gpus", help="all, or GPU indices 0,1,...: one GPU worker per device "
                                             "(pinned; timing serialized per GPU). Default: the default GPU.")]
    = None,
    device: Annotated[str, typer.Option("--device", help="cuda or cpu (default: cuda when present).")] = "",
    resume: Annotated[bool, typer.Option("--resume", help="Continue a killed or finished run in --out.")] = False,
    as_json: JsonFlag = False,
    baselines: Annotated[str, typer.Option("--baselines", help="Comma-separated: eager, compile, compile-max-autotune.")]
    = "eager,compile,compile-max-autotune",
    spaces: Annotated[str, typer.Option("--spaces", help="Only these spaces (comma-separated; default: all).")] = "",
    parallel_tasks: Annotated[int | None, typer.Option("--parallel-tasks", help="Tasks of a directory optimized at "
                                                             "once (default: one per GPU worker with --gpus, else 1)."
                                                             )] = None,
    no_ncu: Annotated[bool, typer.Option("--no-ncu", help="Do not run Nsight Compute.")] = False,
    no_plugins: Annotated[bool, typer.Option("--no-plugins", help="Built-in proposers and analyzers only (not the entry points, nor other packages' proposers such as the templates).")] = False,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds each child process may run.")] = 600.0,
    trials: Annotated[int, typer.Option("--trials", help="Correctness trials of each hardened evaluation (>= 5).")] = 6,
    proposer: Annotated[list[str] | None, typer.Option("--proposer", help="Another proposer, MODULE:ATTR (a class, "
                                                       "factory or instance; repeatable), without packaging it.")] = None,
    ceilings_dir: Annotated[Path | None, typer.Option("--ceilings-dir", help="Cache of measured ceilings.")] = None,
    llm: Annotated[bool, typer.Option("--llm", help="Add LLM proposers (an OpenAI-compatible endpoint: "
                                                    "KSTRATA_LLM_BASE_URL, KSTRATA_LLM_MODEL, OPENAI_API_KEY).")] = False,
    llm_spaces: Annotated[str, typer.Option("--llm-spaces", help="Spaces the LLM proposes in (comma-separated): "
                                            "triton, graph, library, compiler (ModelNew files), ir, asm (edits of the "
                                            "incumbent's compiled kernels, on a GPU).")]
    = "triton,graph",
    llm_config: Annotated[Path | None, typer.Option("--llm-config", help="LLM config file (JSON).")] = None,
    llm_budget_tokens: Annotated[int | None, typer.Option("--llm-budget-tokens", help="Stop asking after this many "
                                                                                     "tokens.")] = None,
    llm_turns: Annotated[int | None, typer.Option("--llm-turns", help="Refinement turns per conversation.")] = None,
    learn_skills: Annotated[Path | None, typer.Option("--learn-skills", help="Skill library to add timed wins to "
                                                      "(only after they reproduce on other seeds).")] = None,
    launches: Annotated[Path | None, typer.Option("--launches", help="Triton cache only: the launch records of the "
                                                  "program (kstrata record --out DIR).")] = None,
    exact: Annotated[bool, typer.Option("--exact", help="Triton cache only: bit-exact edits only (no pass that "
                                                        "declares a tolerance).")] = False,
    seed: Annotated[int, typer.Option("--seed", help="Triton cache only: the search's random seed.")] = 0,
    jobs: Annotated[int, typer.Option("--jobs", help="Triton cache only: parallel build/check processes.")] = 1,
    engine_cache: Annotated[Path | None, typer.Option("--engine-cache", help="Triton cache only: the candidate "
                                                      "engine's cache (default ~/.cache/kstrata/engine).")] = None,
    only: Annotated[list[str] | None, typer.Option("--only", help="Triton cache only: only these kernels.")] = None,
    max_edits: Annotated[int, typer.Option("--max-edits", help="Triton cache only: edits per candidate.")] = 3,
) -> None:
    """Optimize TARGET; see the README's optimizer section."""
    from kstrata.agents.compiled.program import bare_binary_kind, is_triton_cache

    compiled: dict[str, Any] = dict(budget=budget, minutes=minutes, device=device, spaces=spaces, exact=exact, seed=seed,
                    jobs=jobs, engine_cache=engine_cache, only=only, max_edits=max_edits, timeout=timeout,
                    as_json=as_json)
    if llm and (len(targets) > 1 or is_triton_cache(Path(targets[0]))):
        from kstrata.agents.llm.kernel import KERNEL_SPACES
        from kstrata.agents.llm.setup import llm_setup

        asked = tuple(x.strip() for x in llm_spaces.split(",") if x.strip())
        # compiled kernels take kernel-level answers only: the default task spaces mean "ir" here
        kernel_spaces = tuple(x for x in asked if x in KERNEL_SPACES) or ("ir",)
        compiled["llm"] = llm_setup(kernel_spaces, options={"budget_tokens": llm_budget_tokens, "max_turns": llm_turns},
                                    config_file=llm_config, policy=precision)
    if len(targets) > 1:  # `-- CMD ...`: record the program's kernels into its own cache, then optimize them
        from kstrata.tools.cli_compiled import record_and_optimize

        record_and_optimize(targets, out_dir, **compiled)
        return
    target = Path(targets[0])
    binary = bare_binary_kind(target)
    if binary is not None:  # a bare cubin/hsaco: in-place binary patches only (kstrata.agents.compiled.binary)
        from kstrata.tools.cli_compiled import run_binary

        if launches is None:
            raise KstrataError(f"{target}: a bare {binary} needs --launches (the launch records of the program that "
                               "ran it: kstrata record --out DIR -- CMD)")
        run_binary(target, out_dir, launches, as_json=as_json)
        return
    if is_triton_cache(target):  # compiled kernels: the hot-window search (kstrata.agents.compiled)
        from kstrata.tools.cli_compiled import run_compiled

        run_compiled(target, out_dir, launches, **compiled)
        return
    if launches is not None:
        raise KstrataError(f"--launches goes with a Triton cache directory; {target} is not one")
    from kstrata.agents.optimize.candidate import POLICIES
    from kstrata.agents.optimize.search import BASELINES, Options, optimize

    if precision not in POLICIES:
        raise KstrataError(f"--precision {precision!r}: choose one of {', '.join(POLICIES)}")
    names = tuple(b.strip() for b in baselines.split(",") if b.strip())
    bad = [b for b in names if b not in BASELINES]
    if bad:
        raise KstrataError(f"--baselines: unknown {', '.join(bad)}; choose from {', '.join(BASELINES)}")
    backend, strategy = _workers_spec(workers, strategy_workers)
    if budget < 0 or strategy < 1 or minutes <= 0 or trials < 5:
        raise KstrataError("--budget must be >= 0, --strategy-workers >= 1, --minutes > 0 and --trials >= 5")
    import torch

    dev = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if dev not in ("cuda", "cpu"):
        raise KstrataError(f"--device {dev!r}: choose cuda or cpu")
    if dev == "cuda" and not torch.cuda.is_available() and backend == "local":
        raise KstrataError("--device cuda: no CUDA GPU here (use --device cpu for a correctness-only run)")
    if gpus is not None and dev == "cpu":
        raise KstrataError(f"--gpus {gpus}: --device cpu runs no GPU job (leave --gpus out, or use --device cuda)")
    ceilings = None
    if dev == "cuda" and torch.cuda.is_available():  # measured here (a Ray cluster's driver may have no GPU)
        from kstrata.agents.roofline import DEFAULT_CEILINGS_DIR, load_or_measure

        ceilings, _ = load_or_measure(ceilings_dir or DEFAULT_CEILINGS_DIR)
    stream = err if as_json else out
    tty = stream.is_terminal

    def progress(msg: str) -> None:
        if tty:
            stream.print(msg, highlight=False, markup=False, soft_wrap=True)
        else:  # plain lines when not a terminal
            print(msg, file=sys.stderr if as_json else sys.stdout, flush=True)

    from kstrata.agents.workers import make_workers

    pool = make_workers(backend, gpus, on_event=progress, lock_path=None, workdir=out_dir / ".work")
    extra = [_load_proposer(spec) for spec in proposer or []]
    setup = None
    if llm:
        from kstrata.agents.llm.setup import llm_setup

        setup = llm_setup(tuple(x.strip() for x in llm_spaces.split(",") if x.strip()),
                          options={"budget_tokens": llm_budget_tokens, "max_turns": llm_turns},
                          config_file=llm_config, policy=precision)
    opts = Options(budget=budget, minutes=minutes, policy=precision, workers=strategy, device=dev, resume=resume,
                   baselines=names, spaces=tuple(s.strip() for s in spaces.split(",") if s.strip()) or None,
                   ncu=not no_ncu, plugins=not no_plugins, timeout_s=timeout, ceilings=ceilings, progress=progress,
                   trials=trials, extra_proposers=tuple(p for group in extra for p in group)
                   + tuple(setup.proposers if setup else ()),
                   skills_dir=learn_skills, pool=pool, kernel_llm=setup.kernel if setup else None)
    try:
        # tasks are what is spread over the GPU workers: by default, one task per GPU worker at a time
        parallel = parallel_tasks if parallel_tasks is not None else (max(1, len(pool.gpus)) if gpus else 1)
        results = optimize(target, out_dir, opts, parallel_tasks=parallel)
    finally:
        pool.close()
    payload: dict[str, Any] = {"out": str(out_dir), "device": dev, "policy": precision, "timed": dev == "cuda",
                               "workers": pool.describe(), "tasks": [r.to_json() for r in results]}
    if setup is not None:  # tokens and cost of the LLM proposers (they share one client); never the key
        payload["llm"] = {"config": setup.client.config.to_json(), "usage": setup.client.ledger.to_json(),
                          "kernel_attempts": setup.kernel.attempts if setup.kernel else []}
    if as_json:
        emit_json(payload)
    else:
        for r in results:
            if r.status != "done":
                out.print(f"[red]FAILED[/] {r.task}: {r.error}", highlight=False)
                continue
            sp = f"{r.speedup:.3f}x over the best baseline ({r.incumbent_baseline})" if r.speedup else "not timed"
            out.print(f"{r.task}: {sp}; space {r.chosen_space}; final {'ok' if r.final_ok else 'REJECTED'} -> "
                      f"{Path(r.out_dir) / 'model_new.py'}" + (" [degenerate]" if r.degenerate else ""), highlight=False)
        if not opts.device == "cuda":
            out.print("nothing was timed (no GPU): correctness only", highlight=False)
        if setup is not None:
            u = payload["llm"]["usage"]
            out.print(f"LLM: {u['requests']} requests, {u['retries']} retries, {u['tokens']} tokens"
                      + (" (estimated)" if u["tokens_estimated"] else "") + f", ${u['cost_usd']:.4f}", highlight=False)
    if any(r.status != "done" or not r.final_ok for r in results):
        raise typer.Exit(1)
