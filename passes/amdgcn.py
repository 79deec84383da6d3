"""AMDGCN passes: edits of the assembly Triton produces for AMD GPUs, reassembled with llvm-mc + ld.lld.

Running the result needs an AMD GPU, which this project does not have: these passes are checked
statically (the assembly assembles; the code object's ABI metadata is unchanged) and their speed is
unmeasured here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from .base import KernelPass, PassContext, PassResult

_MEMORY_OP = re.compile(r"^(?P<indent>\s+)(?P<op>(?:global|buffer)_(?P<kind>load|store)_\w+)(?P<rest>[^;\n]*?)(?P<tail>\s*(?:;.*)?)$")


@dataclass(frozen=True)
class NontemporalHints(KernelPass):
    """Mark global/buffer stores (and optionally loads) non-temporal (`nt`).

    Helps kernels that stream large outputs once (elementwise, reductions' inputs): non-temporal
    accesses are not kept in the caches at the expense of reused data. Sound: `nt` is a cache-policy
    bit; it does not change what any load or store of the kernel sees.
    """

    name = "nontemporal-hints"
    level = "amdgcn"
    backends = ("hip",)
    stores: bool = True
    loads: bool = False

    def precondition(self, ctx: PassContext) -> str | None:
        if not self.stores and not self.loads:
            return "stores=false and loads=false: nothing to mark"
        for line in ctx.text.split("\n"):
            m = _MEMORY_OP.match(line)
            if m and ((m["kind"] == "store" and self.stores) or (m["kind"] == "load" and self.loads)) \
                    and not re.search(r"\bnt\b", m["rest"]) and "lds" not in m["rest"].split():
                return None
        return "no global or buffer memory instruction of the chosen kinds without nt"

    def apply(self, ctx: PassContext) -> PassResult:
        out = []
        count = 0
        for line in ctx.text.split("\n"):
            m = _MEMORY_OP.match(line)
            wanted = m and ((m["kind"] == "store" and self.stores) or (m["kind"] == "load" and self.loads))
            if m and wanted and not re.search(r"\bnt\b", m["rest"]) and "lds" not in m["rest"].split():
                line = f"{m['indent']}{m['op']}{m['rest']} nt{m['tail']}"
                count += 1
            out.append(line)
        return PassResult("\n".join(out), notes=[f"{count} memory instructions marked nt"])


@dataclass(frozen=True)
class MfmaPriority(KernelPass):
    """Raise the wave's issue priority around each run of MFMA instructions (`s_setprio`).

    Helps matrix kernels where waves compete for the matrix cores: a wave inside its MFMA run keeps
    issuing instead of yielding to waves that would only start more loads. Sound: `s_setprio` changes
    only the arbitration between waves, never results.
    """

    name = "mfma-priority"
    level = "amdgcn"
    backends = ("hip",)
    priority: Literal[1, 2, 3] = 1

    def precondition(self, ctx: PassContext) -> str | None:
        if "v_mfma" not in ctx.text:
            return "the kernel has no MFMA instructions"
        if "s_setprio" in ctx.text:
            return "the kernel already sets wave priorities"
        return None

    def apply(self, ctx: PassContext) -> PassResult:
        lines = ctx.text.split("\n")
        out: list[str] = []
        in_run = False
        runs = 0
        for line in lines:
            stripped = line.strip()
            is_mfma = stripped.startswith("v_mfma")
            is_code = bool(stripped) and not stripped.startswith(";")
            if is_mfma and not in_run:
                indent = line[: len(line) - len(line.lstrip())]
                out.append(f"{indent}s_setprio {self.priority}")
                in_run = True
                runs += 1
            elif in_run and is_code and not is_mfma:
                indent = line[: len(line) - len(line.lstrip())] or "\t"
                out.append(f"{indent}s_setprio 0")
                in_run = False
            out.append(line)
        return PassResult("\n".join(out), notes=[f"{runs} MFMA runs given priority {self.priority}"])
