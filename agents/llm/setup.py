"""What `--llm` adds to a run: the task-level proposers (`proposer.LLMProposer`, one per task space) and the
kernel-level answers of the ir and asm spaces (`kernel.KernelLLM`), on one client (one concurrency limit, one
budget)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .client import LLMClient
from .kernel import KERNEL_SPACES, KernelLLM
from .proposer import TASK_SPACES, LLMProposer


@dataclass
class LLMSetup:
    """What `--llm` adds: task-level proposers, and the kernel-level answers of the ir/asm spaces, on one
    client (one concurrency limit, one budget)."""

    client: LLMClient
    proposers: list[LLMProposer]
    kernel: Any = None  # kernel.KernelLLM, when ir or asm was asked for


def llm_setup(spaces: Sequence[str] = ("triton", "graph"), *, config: Any = None,
              options: dict[str, Any] | None = None, config_file: str | Path | None = None,
              library: Any = None, policy: str = "strict") -> LLMSetup:
    """The LLM proposers for `spaces` (task spaces: an `LLMProposer` each; ir/asm: one `KernelLLM` for the
    kernel searches). Raises `LLMConfigError` for an unknown space or when no endpoint is configured."""
    from kstrata.agents.skills import SkillLibrary

    from .config import LLMConfigError, load_config

    bad = [s for s in spaces if s not in TASK_SPACES + KERNEL_SPACES]
    if bad:
        raise LLMConfigError(f"LLM spaces {', '.join(bad)}: each one of {', '.join(TASK_SPACES + KERNEL_SPACES)}")
    cfg = config or load_config(options, config_file=config_file)
    if cfg is None:
        raise LLMConfigError("--llm needs an endpoint: set KSTRATA_LLM_BASE_URL and KSTRATA_LLM_MODEL (and "
                             "OPENAI_API_KEY), or --llm-config FILE")
    client = LLMClient(cfg)
    lib = library if library is not None else SkillLibrary()
    kernel_spaces = tuple(s for s in spaces if s in KERNEL_SPACES)
    return LLMSetup(client, [LLMProposer(client, s, library=lib) for s in spaces if s in TASK_SPACES],
                    KernelLLM(client, kernel_spaces, library=lib, policy=policy) if kernel_spaces else None)


def llm_proposers(spaces: Sequence[str] = ("triton", "graph"), *, config: Any = None,
                  options: dict[str, Any] | None = None, config_file: str | Path | None = None,
                  library: Any = None) -> list[LLMProposer]:
    """The task-level proposers of `llm_setup` (spaces ir and asm are refused here: they are kernel-level)."""
    from .config import LLMConfigError

    kernel = [s for s in spaces if s not in TASK_SPACES]
    if kernel:
        raise LLMConfigError(f"LLM spaces {', '.join(kernel)}: not task-level spaces ({', '.join(TASK_SPACES)}); "
                             "use llm_setup for ir and asm")
    return llm_setup(spaces, config=config, options=options, config_file=config_file, library=library).proposers
