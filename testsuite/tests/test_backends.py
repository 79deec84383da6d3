"""The tool wrapper's typed errors, tool discovery, and resource reports for both vendors."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kstrata.backends.amd import amdgcn_resource_usage, find_amd_tool
from kstrata.backends.nvidia import find_nvidia_tool
from kstrata.backends.resources import resource_usage
from kstrata.backends.tools import ToolCrashed, ToolFailed, ToolNotFound, ToolTimeout, find_tool, run_tool
from kstrata.ir.errors import BundleError
from kstrata.ir.triton_layout import load_cache_root


def test_failure_carries_exit_code_stderr_and_repro() -> None:
    with pytest.raises(ToolFailed) as info:
        run_tool([sys.executable, "-c", "import sys; sys.stderr.write('boom\\n'); sys.exit(3)"])
    assert info.value.returncode == 3
    assert "boom" in str(info.value) and "repro:" in str(info.value) and "sys.exit(3)" in str(info.value)


def test_signal_is_named() -> None:
    with pytest.raises(ToolCrashed) as info:
        run_tool([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"])
    assert info.value.signal_name == "SIGSEGV"


def test_timeout() -> None:
    with pytest.raises(ToolTimeout, match="timeout"):
        run_tool([sys.executable, "-c", "import time; time.sleep(30)"], timeout=0.5)


def test_missing_executable() -> None:
    with pytest.raises(ToolNotFound):
        run_tool(["/nonexistent/ptxas", "--version"])


def test_env_override_must_be_executable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("KSTRATA_PTXAS", str(tmp_path / "nope"))
    with pytest.raises(ToolNotFound, match="KSTRATA_PTXAS"):
        find_tool("ptxas", env_var="KSTRATA_PTXAS", candidates=[])


def test_nvidia_tools_come_from_triton_first() -> None:
    for name in ("ptxas", "cuobjdump", "nvdisasm"):
        tool = find_nvidia_tool(name)
        assert tool.origin in ("triton", "env")
        assert "release" in tool.version()


def test_amd_tools_are_llvm_19_or_newer() -> None:
    for name in ("llvm-mc", "ld.lld", "llvm-objdump", "llvm-readobj"):
        tool = find_amd_tool(name)
        assert tool.origin in ("llvm-22", "llvm-19", "env", "system")


def test_resources_for_both_vendors(suite_cache: Path) -> None:
    bundles, _ = load_cache_root(suite_cache)
    by_vendor: dict[str, list[int]] = {"nvidia": [], "amd": []}
    for b in bundles:
        usage = resource_usage(b)
        by_vendor[usage.vendor].append(usage.registers)
        assert usage.registers > 0
        if usage.vendor == "amd":
            assert usage.wavefront_size == 64 and usage.sgprs
            # Triton allocates LDS dynamically at launch (`shared` in its metadata); the code object's
            # static LDS is what the kernel declares itself, never more than that.
            assert usage.shared_bytes <= (b.shared or 0)
    assert by_vendor["nvidia"] and by_vendor["amd"]


def test_amdgcn_metadata_errors() -> None:
    with pytest.raises(BundleError, match=r"no \.amdgpu_metadata"):
        amdgcn_resource_usage("s_endpgm\n", "k")
