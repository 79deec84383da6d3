"""Per-kernel resource usage, the same shape for both vendors, and the dispatch from a bundle."""

from __future__ import annotations

from kstrata.ir.bundle import KernelBundle

from .usage import ResourceUsage

__all__ = ["ResourceUsage", "resource_usage"]


def resource_usage(bundle: KernelBundle) -> ResourceUsage:
    """Resource usage of `bundle`'s binary (cubin via cuobjdump, hsaco via its AMDGCN metadata)."""
    if bundle.target.backend == "cuda":
        from .nvidia import cubin_resource_usage

        cubin = bundle.level("cubin")
        assert isinstance(cubin, bytes)
        return cubin_resource_usage(cubin, bundle.name)
    from .amd import amdgcn_resource_usage

    return amdgcn_resource_usage(bundle.text("amdgcn"), bundle.name)
