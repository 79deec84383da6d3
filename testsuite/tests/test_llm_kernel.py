"""Kernel-level LLM answers (`kstrata.agents.llm.kernel`): a pipeline, a generated pass or an assembly patch
for one compiled kernel, turned into engine edits and judged by the search; each failure goes back to the
model in its own words. Against a scripted OpenAI-compatible server on 127.0.0.1."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kstrata.agents import engine as eng
from kstrata.agents.llm.client import LLMClient
from kstrata.agents.llm.config import LLMConfig
from kstrata.agents.llm.kernel import KernelLLM, KernelView, kernel_context, pass_catalogue
from kstrata.testsuite.fake_llm import FakeLLMServer, chat

from .conftest import copy_suite_subset


@pytest.fixture(scope="module")
def add_kernel(suite_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = copy_suite_subset(suite_cache, tmp_path_factory.mktemp("llm-kernel"), ("vector_add",), ("cuda:90",))
    return next(p for p in root.iterdir() if p.is_dir())


@dataclass
class FakeTrial:
    pipeline: str
    status: str
    reason: str = ""
    speedup: float | None = None
    measured: bool = False
    unmeasured: str | None = None


def _cfg(server: FakeLLMServer) -> LLMConfig:
    return LLMConfig(server.base_url, "fake-model", api_key="k", max_retries=0, backoff_s=0.01, timeout_s=5.0,
                     max_turns=6)


NOOP_PASS = ("from dataclasses import dataclass\nfrom kstrata.passes.base import KernelPass, PassResult\n"
             "@dataclass(frozen=True)\nclass Blocks(KernelPass):\n    name = 'blocks'\n    level = 'ttgir'\n"
             "    def apply(self, ctx):\n        BODY\n")


def test_each_answer_becomes_an_engine_edit_and_each_failure_goes_back(add_kernel: Path) -> None:
    """Prose without code, an unknown pass, a correct but slower pipeline, a generated pass that raises, and a
    pass that rewrites the TTGIR (judged different), then a winning pipeline: each rejected with its reason
    in the next turn, the winner accepted, and the conversation stops there."""
    ttgir = next(add_kernel.glob("*.ttgir")).read_text()
    assert "arith.constant" in ttgir
    raises = NOOP_PASS.replace("BODY", "raise ValueError('no idea')")
    rewrites = NOOP_PASS.replace("BODY", "return PassResult(ctx.text.replace('arith.addf', 'arith.subf', 1))")
    script = [chat("Use more warps, that is always faster."),
              chat("```pipeline\nttgir(warp-magic{n=9})\n```"),
              chat("```pipeline\nttgir(num-warps{n=8})\n```"),
              chat(f"```xdsl-pass\n{raises}```"),
              chat(f"```xdsl-pass\n{rewrites}```"),
              chat("```pipeline\nttgir(num-warps{n=2})\n```")]
    seen: list[tuple[Any, str, str]] = []

    def evaluate(edit: Any, level: str, label: str, tolerance: str | None) -> FakeTrial:
        seen.append((edit, level, label))
        if isinstance(edit, eng.IrTextEdit):
            assert "arith.subf" in edit.text and level == "ttgir"
            return FakeTrial(label, "different", "output 0 element 3: 1.5 != -0.5")
        assert isinstance(edit, eng.PipelineEdit) and level == "ttgir"
        if "n=8" in edit.spec:
            return FakeTrial(label, "equivalent", "equivalent", 0.97, True)
        return FakeTrial(label, "equivalent", "equivalent", 1.31, True)

    with FakeLLMServer(script) as server:
        llm = KernelLLM(LLMClient(_cfg(server)), spaces=("ir",))
        view = KernelView("vector_add_kernel", "cuda:90", str(add_kernel), share=0.8, findings=("memory-bound",),
                          tried=("ttgir(num-warps{n=4}): unchanged",))
        tries = llm(view, evaluate, lambda t: (t.speedup or 0) > 1.02)
        requests = [r["body"]["messages"] for r in server.requests]
    outcomes = [(t.attempt.outcome, t.attempt.stage) for t in tries]
    assert outcomes == [("unparsable", "parse"), ("unparsable", "parse"), ("rejected", "timing"),
                        ("rejected", "sandbox"), ("rejected", "correctness"), ("accepted", "accepted")]
    assert len(requests) == 6 and len(seen) == 3
    first = requests[0][1]["content"]
    assert "vector_add_kernel" in first and "tt.func" in first and "num-warps (ttgir" in first  # TTGIR, catalogue
    assert "ttgir(num-warps{n=4}): unchanged" in first and "memory-bound" in first  # what was tried, findings
    assert "no code block" in requests[1][-1]["content"]
    assert "warp-magic" in requests[2][-1]["content"]
    assert "0.970x" in requests[3][-1]["content"] and "not faster" in requests[3][-1]["content"]
    assert "ValueError: no idea" in requests[4][-1]["content"]
    assert "element 3" in requests[5][-1]["content"]
    assert all(a["kernel"] == "vector_add_kernel" for a in llm.attempts) and len(llm.attempts) == 6


def test_asm_answers_must_apply_to_the_kernels_ptx_and_the_budget_stops_cleanly(add_kernel: Path) -> None:
    ptx = next(add_kernel.glob("*.ptx")).read_text()
    ctx, asm_text = kernel_context("asm", KernelView("vector_add_kernel", "cuda:90", str(add_kernel), window=(1, 5)))
    assert asm_text == ptx and ctx.hot_level == "ptx" and "hot window is 1-5" in (ctx.hot_window or "")
    bad_patch = ("# kstrata asm patch v1\nlevel: ptx\nkernel: vector_add_kernel\ndescription: x\n"
                 "@@ nowhere\n-\tno.such.instruction;\n+\tadd.s32 %r1, %r1, 0;\n")
    from kstrata.agents.llm.client import _estimate_tokens
    from kstrata.agents.llm.prompts import initial_messages

    first = sum(_estimate_tokens(m["content"]) for m in initial_messages(kernel_context(
        "asm", KernelView("vector_add_kernel", "cuda:90", str(add_kernel)))[0]))
    with FakeLLMServer([chat(f"```asm-patch\n{bad_patch}```"), chat("```asm-patch\n# nothing\n```")]) as server:
        cfg = _cfg(server)
        # enough for the first request, not for the second after the first reply's 150 tokens
        llm = KernelLLM(LLMClient(LLMConfig(cfg.base_url, cfg.model, api_key="k", max_retries=0, timeout_s=5.0,
                                            max_turns=3, budget_tokens=first + 100)), spaces=("asm",))
        tries = llm(KernelView("vector_add_kernel", "cuda:90", str(add_kernel)),
                    lambda *a: pytest.fail("nothing should reach the search"), lambda t: False)
    assert tries[0].attempt.outcome == "unparsable" and "does not apply" in tries[0].attempt.reason
    assert [t.attempt.outcome for t in tries] == ["unparsable", "budget"] and llm.exhausted


def test_the_catalogue_lists_the_passes_of_the_space_and_backend() -> None:
    ir = pass_catalogue(("ttir", "ttgir", "llir"), "cuda")
    assert any(line.startswith("num-warps (ttgir") for line in ir) and not any(line.startswith("ld-nc") for line in ir)
    assert not any(line.startswith("mfma-priority") for line in pass_catalogue(("amdgcn",), "cuda"))


@pytest.mark.slow  # two compiled-kernel candidates gated by the interpreter, and a sandboxed pass: about 40 s
def test_optimize_a_cache_with_llm_answers_through_the_cpu_path(suite_cache: Path, tmp_path: Path) -> None:
    """`kstrata optimize CACHE --launches R --llm` on the CPU: a generated pass that turns an add into a subtract is
    built, gated by the interpreter on the kernel's launch record and found different, which the model hears with
    the first differing element; its next answer (a pipeline) is equivalent, which ends the conversation where
    nothing is timed. Both are trials of the kernel's search, in the report and the JSON; the key never is."""
    import json
    import os
    import subprocess
    import sys

    from .test_compiled import _program

    cache, records = _program(suite_cache, tmp_path, "vector_add", "cuda:90")
    wrong = NOOP_PASS.replace("BODY", "return PassResult(ctx.text.replace('arith.addf', 'arith.subf', 1))")
    script = [chat(f"Subtracting is cheaper.\n```xdsl-pass\n{wrong}```"),
              chat("Then more warps.\n```pipeline\nttgir(num-warps{n=8})\n```")]
    with FakeLLMServer(script, lifetime_s=240) as server:
        env = {**os.environ, "KSTRATA_LLM_BASE_URL": server.base_url, "KSTRATA_LLM_MODEL": "fake-model",
               "OPENAI_API_KEY": "sk-secret-kernel-7311"}
        proc = subprocess.run([sys.executable, "-m", "kstrata.tools.cli", "optimize", str(cache), "--launches",
                               str(records), "--out", str(tmp_path / "out"), "--device", "cpu", "--engine-cache",
                               str(tmp_path / "engine"), "--budget", "1", "--spaces", "ttir", "--llm", "--json"],
                              capture_output=True, text=True, timeout=300, env=env)
        asked = [r["body"]["messages"] for r in server.requests]
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    (kernel,) = report["kernels"]
    llm_trials = [t for t in kernel["search"]["trials"] if t["phase"] == "llm"]
    assert [(t["pipeline"].split(":")[0] + ":" + t["pipeline"].split(":")[1] if t["pipeline"].startswith("llm:")
             else t["pipeline"], t["status"]) for t in llm_trials] == [("llm:xdsl_pass", "different"),
                                                                      ("ttgir(num-warps{n=8})", "equivalent")]
    assert [a["outcome"] for a in kernel["search"]["llm"]] == ["rejected", "accepted"]
    assert len(asked) == 2 and "different result" in asked[1][-1]["content"]
    assert [a["outcome"] for a in report["llm"]["kernel_attempts"]] == ["rejected", "accepted"]
    text = (tmp_path / "out" / "optimize-compiled.md").read_text()
    assert "| llm |" in text and "sk-secret-kernel-7311" not in proc.stdout + proc.stderr + text

