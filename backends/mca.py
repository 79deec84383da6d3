"""The static surrogate for AMD candidates: `llvm-mca -mcpu=gfx942` throughput of a hot window.

No AMD GPU is available to this project, so AMDGCN candidates are ranked by what LLVM's scheduling model
for the target predicts for their hot window (`backends/hotwindow.py`): the cycles `llvm-mca` needs per
iteration of the window's straight-line instructions (branches and `s_cbranch`es are left out: the model
does not follow control flow). It is a ranking aid, never a timing: a candidate ranked by it is reported
`unmeasured`, with this reason. `llvm-mca` comes with Debian's `llvm-22` (`make setup` installs it).
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .tools import DEFAULT_TIMEOUT_S, ToolError, run_tool

#: Iterations llvm-mca simulates (its default is 100).
ITERATIONS = 100
_BRANCH = re.compile(r"^(s_cbranch_\w+|s_branch|s_setpc_b64|s_endpgm|s_trap)\b")


@dataclass(frozen=True)
class McaEstimate:
    """What llvm-mca predicts for one window: `cycles_per_iteration` is the figure candidates are ranked by."""

    mcpu: str
    instructions: int
    total_cycles: int
    iterations: int
    cycles_per_iteration: float
    block_rthroughput: float | None
    ipc: float | None
    repro: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def find_llvm_mca() -> Any:
    from .amd import find_amd_tool

    return find_amd_tool("llvm-mca")


def _field(text: str, name: str) -> float | None:
    m = re.search(rf"^{re.escape(name)}:\s+([\d.]+)", text, re.M)
    return float(m.group(1)) if m else None


def mca_estimate(instructions: Sequence[str], mcpu: str = "gfx942", *, timeout: float = DEFAULT_TIMEOUT_S) -> McaEstimate:
    """Run llvm-mca on `instructions` (AMDGCN, one per item) for `mcpu`; a failure is a `ToolError`."""
    body = [i for i in instructions if i and not _BRANCH.match(i)]
    if not body:
        raise ToolError("llvm-mca: the hot window has no straight-line instructions to model")
    tool = find_llvm_mca()
    with tempfile.TemporaryDirectory(prefix="kstrata-mca-") as tmp:
        src = Path(tmp) / "window.s"
        src.write_text("\n".join(f"\t{i}" for i in body) + "\n")
        argv = [str(tool.path), "-mtriple=amdgcn-amd-amdhsa", f"-mcpu={mcpu}", f"-iterations={ITERATIONS}", str(src)]
        out = run_tool(argv, timeout=timeout).stdout
    total = _field(out, "Total Cycles")
    iterations = _field(out, "Iterations")
    if total is None or not iterations:
        raise ToolError("llvm-mca printed no 'Total Cycles' (its output format changed?)", repro=" ".join(argv))
    return McaEstimate(mcpu, len(body), int(total), int(iterations), total / iterations, _field(out, "Block RThroughput"),
                       _field(out, "IPC"), " ".join(argv))
