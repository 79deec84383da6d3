"""AMD tools (`llvm-mc`, `ld.lld`, `llvm-objdump`, `llvm-readobj`): discovery and code-object metadata.

Discovery order: the environment override (`KSTRATA_LLVM_MC`, …), Debian's versioned LLVM 22, then
LLVM 19 (which also handles gfx942 and older), then the unversioned names on `PATH`. The setup
(`make setup`) installs `llvm-22` and `lld-22` where they are missing.
"""

from __future__ import annotations

import re
from pathlib import Path

from kstrata.ir.errors import BundleError

from .resources import ResourceUsage
from .tools import FoundTool, ToolNotFound, find_tool

AMD_TOOLS = ("llvm-mc", "ld.lld", "llvm-objdump", "llvm-readobj")
LLVM_VERSIONS = (22, 19)


def find_amd_tool(name: str) -> FoundTool:
    """Locate `name` (one of `AMD_TOOLS`), preferring LLVM 22."""
    candidates: list[tuple[str, str]] = []
    for version in LLVM_VERSIONS:
        candidates.append((f"llvm-{version}", f"{name}-{version}"))
        candidates.append((f"llvm-{version}", str(Path(f"/usr/lib/llvm-{version}/bin") / name)))
    candidates.append(("system", name))
    tool = find_tool(name, env_var="KSTRATA_" + name.upper().replace("-", "_").replace(".", "_"), candidates=candidates)
    if tool.origin == "system":
        version_line = tool.version()
        m = re.search(r"version (\d+)", version_line)
        if m and int(m.group(1)) < 19:
            raise ToolNotFound(f"{name}: only {version_line} found at {tool.path}; gfx942 needs LLVM 19 or newer",
                               hint="apt-get install -y llvm-22 lld-22 (or run `make setup`)")
    return tool


def _metadata_block(amdgcn: str) -> str:
    m = re.search(r"\.amdgpu_metadata\s*\n(.*?)\.end_amdgpu_metadata", amdgcn, re.S)
    if not m:
        raise BundleError("AMDGCN has no .amdgpu_metadata block")
    return m.group(1)


def _kernel_entry(block: str, kernel: str) -> str:
    # Each kernel is a YAML list item under `amdhsa.kernels:` starting with `  - `.
    entries = re.split(r"\n  - ", block.split("amdhsa.kernels:", 1)[-1])
    for entry in entries:
        if re.search(rf"^\s*\.name:\s+{re.escape(kernel)}\s*$", entry, re.M):
            return entry
    raise BundleError(f"AMDGCN metadata has no kernel {kernel!r}")


def _int_field(entry: str, key: str) -> int | None:
    m = re.search(rf"^\s*\.{re.escape(key)}:\s+(\d+)\s*$", entry, re.M)
    return int(m.group(1)) if m else None


def amdgcn_resource_usage(amdgcn: str, kernel: str) -> ResourceUsage:
    """VGPR/SGPR/AGPR counts, spills, LDS and scratch of `kernel` from its AMDGCN metadata."""
    entry = _kernel_entry(_metadata_block(amdgcn), kernel)
    vgprs = _int_field(entry, "vgpr_count")
    if vgprs is None:
        raise BundleError(f"AMDGCN metadata of {kernel!r} has no .vgpr_count")
    return ResourceUsage(
        vendor="amd",
        registers=vgprs,
        shared_bytes=_int_field(entry, "group_segment_fixed_size") or 0,
        local_bytes=_int_field(entry, "private_segment_fixed_size") or 0,
        sgprs=_int_field(entry, "sgpr_count"),
        agprs=_int_field(entry, "agpr_count"),
        vgpr_spills=_int_field(entry, "vgpr_spill_count"),
        sgpr_spills=_int_field(entry, "sgpr_spill_count"),
        wavefront_size=_int_field(entry, "wavefront_size"),
        source="AMDGCN code-object metadata",
    )
