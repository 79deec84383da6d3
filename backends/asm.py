"""Assembly-level work on a bundle, for both vendors: rebuild, patch + static checks, and reports.

- `rebuild(bundle)`: assemble the bundle's own PTX (AMDGCN) with the options Triton used and compare
  the result with Triton's cubin (hsaco).
- `patch_bundle(bundle, patch)`: apply an `AsmPatch` strictly, rebuild the binary, and check what must
  not change (entry parameters and launch bounds / kernel arguments, shared memory, wave size) and
  what did (registers, spills, instruction mix).
- `asm_report(bundle)`: resources, occupancy, instruction mix and ABI in one JSON-ready dict.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kstrata.ir.bundle import KernelBundle
from kstrata.ir.errors import KstrataError

from .checks import amd_metadata_changes, ptx_entry_changes
from .patch import AsmPatch, PatchResult, apply_patch


class AsmCheckError(KstrataError):
    """A patched kernel fails a static check (its ABI changed, or it does not assemble)."""


@dataclass
class RebuildReport:
    level: str
    identical: bool
    same_code: bool
    detail: str
    command: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"level": self.level, "identical": self.identical, "same_code": self.same_code,
                "detail": self.detail, "command": self.command}


def rebuild(bundle: KernelBundle) -> tuple[bytes, RebuildReport]:
    """Rebuild the binary from the assembly level and compare it with the bundle's binary."""
    original = bundle.level(bundle.target.binary_level)
    assert isinstance(original, bytes)
    if bundle.target.backend == "cuda":
        from .nvidia import compare_cubins, rebuild_cubin

        build = rebuild_cubin(bundle)
        cmp = compare_cubins(original, build.cubin)
        return build.cubin, RebuildReport("ptx", cmp.identical, cmp.same_code, cmp.describe(), build.command)
    from .amd import compare_text, reassemble_amdgcn

    hsaco = reassemble_amdgcn(bundle.text("amdgcn"), str(bundle.target.arch))
    text_cmp = compare_text(original, hsaco)
    return hsaco, RebuildReport("amdgcn", hsaco == original, text_cmp.identical, text_cmp.describe())


@dataclass
class PatchedBundle:
    """The outcome of `patch_bundle`: the new bundle, where the hunks applied, and the checks."""

    bundle: KernelBundle
    result: PatchResult
    checks: dict[str, Any] = field(default_factory=dict)
    resources_before: dict[str, Any] = field(default_factory=dict)
    resources_after: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"kernel": self.bundle.name, "target": str(self.bundle.target), "hunks": self.result.to_json()["hunks"],
                "checks": self.checks, "resources_before": self.resources_before,
                "resources_after": self.resources_after}


def patch_bundle(bundle: KernelBundle, patch: AsmPatch) -> PatchedBundle:
    """Apply `patch` to `bundle` at its level, rebuild the binary, and run the static checks.

    Raises `AsmPatchError` when a hunk does not apply at exactly one place, `ToolError` when the
    patched assembly does not assemble, and `AsmCheckError` when the kernel's ABI changed.
    """
    level = bundle.target.asm_level
    if patch.level != level:
        raise AsmCheckError(f"patch is for {patch.level}, but {bundle.target} kernels are patched at {level}")
    if patch.kernel and patch.kernel != bundle.name:
        raise AsmCheckError(f"patch is for kernel {patch.kernel!r}, not {bundle.name!r}", path=bundle.origin)
    result = apply_patch(bundle.text(level), patch)
    new = KernelBundle(bundle.name, bundle.target, dict(bundle.levels), dict(bundle.metadata), bundle.source,
                       bundle.override_key, bundle.origin, dict(bundle.extra_files), list(bundle.notes),
                       declared_params=bundle.params)
    new.levels[level] = result.text
    # Levels above the patched one no longer describe the binary: drop them rather than mislead.
    for upper in bundle.target.levels[1:bundle.target.levels.index(level)]:
        new.levels.pop(upper, None)
    new.notes.append(f"patched at {level}: {patch.description or 'asm patch'}")
    checks: dict[str, Any] = {}
    if bundle.target.backend == "cuda":
        from .nvidia import rebuild_cubin

        changed = ptx_entry_changes(bundle.text("ptx"), result.text)
        if changed:
            raise AsmCheckError(f"kernel {bundle.name}: the patch changes the entry's ABI ({'; '.join(changed)})")
        checks["abi"] = "unchanged (entry name and parameters, .reqntid/.maxntid, target)"
        before, after = rebuild_cubin(bundle), rebuild_cubin(bundle, result.text)
        new.levels["cubin"] = after.cubin
        checks["ptxas"] = "accepted"
        rb, ra = before.reports.get(bundle.name), after.reports.get(bundle.name)
        res_before = vars(rb) if rb else {}
        res_after = vars(ra) if ra else {}
        if ra and rb and ra.smem_bytes != rb.smem_bytes:
            raise AsmCheckError(f"kernel {bundle.name}: static shared memory changed {rb.smem_bytes} -> {ra.smem_bytes}")
    else:
        from .amd import code_object_metadata, reassemble_amdgcn

        hsaco = reassemble_amdgcn(result.text, str(bundle.target.arch))
        original = bundle.level("hsaco")
        assert isinstance(original, bytes)
        new.levels["hsaco"] = hsaco
        checks["llvm-mc + ld.lld"] = "accepted"
        abi, other = amd_metadata_changes(original, hsaco)
        if abi:
            raise AsmCheckError(f"kernel {bundle.name}: the patch changes the code object's ABI: " + "; ".join(abi))
        checks["abi"] = "unchanged (kernarg layout, wavefront size, LDS, workgroup size, kernel symbol)"
        checks["other_changes"] = other
        res_before = code_object_metadata(original).kernel(bundle.name).resource_usage().to_json()
        res_after = code_object_metadata(hsaco).kernel(bundle.name).resource_usage().to_json()
    # The patched binary's code changed: it cannot keep the original's cache identity.
    new.metadata.pop("hash", None)
    return PatchedBundle(new, result, checks, res_before, res_after)


def asm_report(bundle: KernelBundle) -> dict[str, Any]:
    """Resources (with spills and occupancy on NVIDIA), instruction mix and ABI of `bundle`."""
    from .resources import resource_usage

    report: dict[str, Any] = {"kernel": bundle.name, "target": str(bundle.target),
                              "resources": resource_usage(bundle).to_json(), "abi": bundle.abi().to_json()}
    binary = bundle.level(bundle.target.binary_level)
    assert isinstance(binary, bytes)
    if bundle.target.backend == "cuda":
        from .nvidia import occupancy, rebuild_cubin, sass, sass_instruction_mix

        build = rebuild_cubin(bundle)
        ptxas = build.reports.get(bundle.name)
        if ptxas is not None:
            report["ptxas"] = vars(ptxas)
        regs = report["resources"]["registers"]
        occ = occupancy(int(bundle.target.arch), regs, bundle.abi().threads_per_block, bundle.shared or 0)
        report["occupancy"] = {"blocks_per_sm": occ.blocks_per_sm, "warps_per_sm": occ.warps_per_sm,
                               "fraction": round(occ.fraction, 4), "limiter": occ.limiter}
        report["instruction_mix"] = sass_instruction_mix(sass(binary)).to_json()
    else:
        from .amd import amd_instruction_mix

        report["instruction_mix"] = amd_instruction_mix(binary, str(bundle.target.arch)).to_json()
    return report
