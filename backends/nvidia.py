"""NVIDIA tools (`ptxas`, `cuobjdump`, `nvdisasm`): discovery and cubin resource usage.

Discovery order for each tool: the environment override (`KSTRATA_PTXAS`, `KSTRATA_CUOBJDUMP`,
`KSTRATA_NVDISASM`), the binaries bundled in Triton's wheel (the ones Triton itself compiles with),
then a CUDA toolkit (`$CUDA_HOME/bin`, `/usr/local/cuda/bin`, `PATH`).
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

from kstrata.ir.errors import BundleError

from .resources import ResourceUsage
from .tools import FoundTool, find_tool, run_tool

NVIDIA_TOOLS = ("ptxas", "cuobjdump", "nvdisasm")


def triton_nvidia_bin() -> Path | None:
    try:
        import triton.backends.nvidia as nv
    except ImportError:
        return None
    return Path(nv.__file__).parent / "bin"


def find_nvidia_tool(name: str) -> FoundTool:
    """Locate `name` (one of `NVIDIA_TOOLS`)."""
    candidates: list[tuple[str, str | os.PathLike[str]]] = []
    bundled = triton_nvidia_bin()
    if bundled is not None:
        candidates.append(("triton", bundled / name))
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if cuda_home:
        candidates.append(("cuda-toolkit", Path(cuda_home) / "bin" / name))
    candidates += [("cuda-toolkit", Path("/usr/local/cuda/bin") / name), ("system", name)]
    return find_tool(name, env_var=f"KSTRATA_{name.upper()}", candidates=candidates)


_RES_LINE = re.compile(r"Function\s+(\S+):\s*\n\s*(REG:.*)")


def cubin_resource_usage(cubin: bytes, kernel: str) -> ResourceUsage:
    """Registers, shared, local and stack bytes of `kernel` in `cubin`, from `cuobjdump -res-usage`."""
    tool = find_nvidia_tool("cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = run_tool([tool.path, "-res-usage", f.name], timeout=60).stdout
    for name, fields in _RES_LINE.findall(out):
        if name == kernel:
            values = dict(re.findall(r"([A-Z]+(?:\[\d+\])?):(\d+)", fields))
            return ResourceUsage(
                vendor="nvidia",
                registers=int(values.get("REG", 0)),
                shared_bytes=int(values.get("SHARED", 0)),
                local_bytes=int(values.get("LOCAL", 0)),
                stack_bytes=int(values.get("STACK", 0)),
                source="cuobjdump -res-usage",
            )
    raise BundleError(f"cuobjdump reports no function {kernel!r} in the cubin")
