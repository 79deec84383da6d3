"""`kstrata llm refine`: one multi-turn conversation with the configured model on one task.

Beside `kstrata optimize --llm` (the search's proposers, `kstrata.agents.llm.setup.llm_setup`), this is how a
person tries an endpoint on a task alone: the model proposes, the hardened evaluator judges each
answer in the sandbox, failures go back as feedback, up to `--turns` turns. Writes `OUT/attempts.json`
(every turn: outcome, stage, reason, tokens; never the key) and, when one was accepted,
`OUT/model_new.py`. Exit codes: 0 accepted, 1 none accepted (or the budget ran out), 2 a user error.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from kstrata.tools.console import JsonFlag, emit_json, out

llm_app = typer.Typer(help="The LLM proposer on one task (multi-turn, sandboxed, hardened evaluation).",
                      no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)


@llm_app.command("refine")
def llm_refine(
    task: Annotated[Path, typer.Argument(help="A KernelBench-format task file.")],
    out_dir: Annotated[Path, typer.Option("--out", help="Where attempts.json (and model_new.py) go.")],
    space: Annotated[str, typer.Option("--space", help="graph, triton, library or compiler.")] = "triton",
    turns: Annotated[int | None, typer.Option("--turns", help="Refinement turns (default: the config's).")] = None,
    device: Annotated[str, typer.Option("--device", help="cpu or cuda (default: cuda when present).")] = "",
    policy: Annotated[str, typer.Option("--policy", help="strict or kernelbench.")] = "strict",
    base_url: Annotated[str | None, typer.Option("--llm-base-url")] = None,
    model: Annotated[str | None, typer.Option("--llm-model")] = None,
    config_file: Annotated[Path | None, typer.Option("--llm-config", help="A JSON config file.")] = None,
    budget_tokens: Annotated[int | None, typer.Option("--llm-budget-tokens")] = None,
    skills_dir: Annotated[Path | None, typer.Option("--skills-dir", help="The skill library to retrieve from.")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Ask the model for a faster ModelNew for TASK, check every answer, feed failures back."""
    from kstrata.agents.llm.client import LLMClient
    from kstrata.agents.llm.config import LLMConfigError, load_config
    from kstrata.agents.llm.prompts import PromptContext, contract_text
    from kstrata.agents.llm.proposer import TASK_SPACES, EvalChecker, refine
    from kstrata.agents.skills import SkillLibrary, skill_query
    from kstrata.agents.tasks import load_task

    if space not in TASK_SPACES:
        raise LLMConfigError(f"--space {space!r}: one of {', '.join(TASK_SPACES)} (ir and asm answers need the engine)")
    cfg = load_config({"base_url": base_url, "model": model, "budget_tokens": budget_tokens}, config_file=config_file)
    if cfg is None:
        raise LLMConfigError("no endpoint configured: set KSTRATA_LLM_BASE_URL and KSTRATA_LLM_MODEL, or --llm-base-url")
    loaded = load_task(task)
    source = task.read_text()
    import torch

    dev = device or ("cuda" if torch.cuda.is_available() else "cpu")
    lib = SkillLibrary(skills_dir)
    query = skill_query(loaded.spec.name, [op for op, _ in loaded.spec.flops_by_op], loaded.spec.dtypes)
    ctx = PromptContext(space, loaded.spec.name, contract=contract_text(loaded.spec, source, policy),
                        incumbent=source, skills=tuple(s.render() for s in lib.search(query, 3, space=space)),
                        policy=policy, device=dev)
    client = LLMClient(cfg)
    checker = EvalChecker(task, out_dir / "candidates", device=dev, policy=policy)
    result = refine(client, ctx, checker, max_turns=turns,
                    on_attempt=None if as_json else lambda a: out.print(
                        f"turn {a.turn}: {a.outcome} ({a.stage}): {a.reason.splitlines()[0][:200]}",
                        highlight=False, markup=False))
    out_dir.mkdir(parents=True, exist_ok=True)
    payload = {"task": str(task), "model": cfg.model, "device": dev, "config": cfg.to_json(), **result.to_json()}
    (out_dir / "attempts.json").write_text(cfg.redact(json.dumps(payload, indent=2, default=str)) + "\n")
    if result.accepted is not None:
        (out_dir / "model_new.py").write_text(getattr(result.accepted, "source", ""))
    if as_json:
        emit_json(payload)
    else:
        u = result.usage
        out.print(f"{result.stopped}: {len(result.attempts)} turns, {u['tokens']} tokens"
                  + (" (estimated)" if u["tokens_estimated"] else "") + f", ${u['cost_usd']:.4f}; "
                  f"see {out_dir / 'attempts.json'}", highlight=False)
    if result.accepted is None:
        raise typer.Exit(1)
