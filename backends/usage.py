"""`ResourceUsage`: what a kernel's binary asks of the hardware, one shape for both vendors.

A leaf module: the vendor modules (`nvidia.py`, `amd.py`) fill it in and `resources.py` dispatches to
them, so neither imports the other's importer (no cycle).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class ResourceUsage:
    """What a kernel's binary asks of the hardware, read from the binary or its metadata.

    NVIDIA: `registers` per thread, `local_bytes` per thread (spills land there), `shared_bytes`
    static shared memory in the cubin, `stack_bytes`. AMD: `registers` is the VGPR count, with SGPRs,
    AGPRs and spill counts beside it; `shared_bytes` is the code object's static LDS (Triton passes its
    own LDS allocation, `KernelBundle.shared`, dynamically at launch), `local_bytes` is private (scratch)
    memory.
    Fields a vendor does not report are `None`.
    """

    vendor: str
    registers: int
    shared_bytes: int
    local_bytes: int
    stack_bytes: int | None = None
    sgprs: int | None = None
    agprs: int | None = None
    vgpr_spills: int | None = None
    sgpr_spills: int | None = None
    wavefront_size: int | None = None
    #: Where the numbers were read from, e.g. `cuobjdump -res-usage` or `AMDGCN metadata`.
    source: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)
