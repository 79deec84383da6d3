"""`kstrata doctor`: which tools and versions are here, whether a GPU is present, what can run."""

from __future__ import annotations

import importlib
import importlib.metadata
import platform
import shutil
from typing import Any

from kstrata.backends.tools import ToolError, run_tool

_PYTHON_PACKAGES = ("triton", "torch", "xdsl", "llvmlite", "numpy", "openai", "bm25s", "typer", "rich")


def _package(name: str) -> dict[str, Any]:
    try:
        version = importlib.metadata.version(name)
        importlib.import_module(name)
        return {"name": name, "ok": True, "detail": version}
    except Exception as exc:  # missing or broken: both mean "cannot use it"
        return {"name": name, "ok": False, "detail": f"{type(exc).__name__}: {exc}"}


def _tool_rows() -> list[dict[str, Any]]:
    from kstrata.backends.amd import AMD_TOOLS, find_amd_tool
    from kstrata.backends.nvidia import NVIDIA_TOOLS, find_nvidia_tool

    rows = []
    for name in NVIDIA_TOOLS:
        try:
            tool = find_nvidia_tool(name)
            rows.append({"name": name, "ok": True, "detail": f"{tool.version()} ({tool.origin}: {tool.path})"})
        except ToolError as exc:
            rows.append({"name": name, "ok": False, "detail": str(exc)})
    for name in AMD_TOOLS:
        try:
            tool = find_amd_tool(name)
            rows.append({"name": name, "ok": True, "detail": f"{tool.version()} ({tool.origin}: {tool.path})"})
        except ToolError as exc:
            rows.append({"name": name, "ok": False, "detail": str(exc)})
    return rows


def _gpus() -> dict[str, Any]:
    info: dict[str, Any] = {"nvidia": [], "amd": []}
    try:
        import torch

        if torch.cuda.is_available():
            names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
            info["nvidia" if torch.version.hip is None else "amd"] = names
    except Exception as exc:
        info["error"] = f"{type(exc).__name__}: {exc}"
    if not info["nvidia"] and shutil.which("nvidia-smi"):
        try:
            res = run_tool(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], timeout=20)
            info["nvidia"] = [ln.strip() for ln in res.stdout.splitlines() if ln.strip()]
        except ToolError:
            pass
    return info


def _llm_endpoint() -> dict[str, Any]:
    """Whether the configured OpenAI-compatible endpoint answers (never prints the key)."""
    from kstrata.agents.llm.client import LLMClient
    from kstrata.agents.llm.config import LLMConfigError, load_config

    try:
        config = load_config()
    except LLMConfigError as exc:
        return {"name": "LLM endpoint", "ok": False, "detail": str(exc)}
    if config is None:
        return {"name": "LLM endpoint", "ok": False, "configured": False,
                "detail": "not configured (KSTRATA_LLM_BASE_URL, KSTRATA_LLM_MODEL, OPENAI_API_KEY; optional: "
                          "optimize --llm needs it, the built-in proposers do not)"}
    try:
        ok, detail = LLMClient(config).ping()
    except Exception as exc:  # a broken client install: report it, the rest of the doctor still runs
        ok, detail = False, config.redact(f"{type(exc).__name__}: {exc}")
    key = "a key is set" if config.api_key else "no key set"
    return {"name": "LLM endpoint", "ok": ok, "configured": True, "detail": f"{detail} ({key})"}


def diagnose() -> dict[str, Any]:
    """The doctor's report as a JSON-ready dict; `ok` is false when something the CPU path needs is missing."""
    components = [{"name": "python", "ok": True, "detail": platform.python_version()}]
    components += [_package(p) for p in _PYTHON_PACKAGES]
    tools = _tool_rows()
    components += tools
    gpus = _gpus()
    llm = _llm_endpoint()
    components.append(llm)
    have = {c["name"]: c["ok"] for c in components}
    nv_gpu = bool(gpus["nvidia"])
    amd_gpu = bool(gpus["amd"])
    capabilities = [
        {"name": "compile for NVIDIA targets (CPU)", "ok": have["triton"] and have["ptxas"],
         "why": "Triton and its bundled ptxas" if have["triton"] and have["ptxas"] else "needs triton and ptxas"},
        {"name": "compile for AMD targets (CPU)", "ok": have["triton"],
         "why": "Triton links hsaco with its own bundled linker"},
        {"name": "NVIDIA resource reports", "ok": have["cuobjdump"], "why": "cuobjdump -res-usage"},
        {"name": "AMDGCN reassembly (llvm-mc + ld.lld)", "ok": have["llvm-mc"] and have["ld.lld"],
         "why": "LLVM 22 (or 19) from Debian" if have["llvm-mc"] and have["ld.lld"] else "apt-get install -y llvm-22 lld-22"},
        {"name": "Triton interpreter on CPU tensors", "ok": have["triton"] and have["torch"], "why": "TRITON_INTERPRET=1"},
        {"name": "run kernels on an NVIDIA GPU", "ok": nv_gpu,
         "why": ", ".join(gpus["nvidia"]) if nv_gpu else "no NVIDIA GPU visible to torch or nvidia-smi"},
        {"name": "LLM proposers (optimize --llm)", "ok": llm["ok"], "why": llm["detail"]},
        {"name": "run kernels on an AMD GPU", "ok": amd_gpu,
         "why": ", ".join(gpus["amd"]) if amd_gpu else "no AMD GPU visible (dynamic AMD checks need one)"},
    ]
    required = ("triton", "torch", "numpy", "typer", "rich", "ptxas", "cuobjdump")
    return {
        "ok": all(have.get(r, False) for r in required),
        "components": components,
        "gpus": gpus,
        "capabilities": capabilities,
    }
