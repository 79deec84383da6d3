"""NVIDIA tools (`ptxas`, `cuobjdump`, `nvdisasm`): discovery and cubin resource usage.

Discovery order for each tool: the environment override (`KSTRATA_PTXAS`, `KSTRATA_CUOBJDUMP`,
`KSTRATA_NVDISASM`), the binaries bundled in Triton's wheel (the ones Triton itself compiles with),
then a CUDA toolkit (`$CUDA_HOME/bin`, `/usr/local/cuda/bin`, `PATH`).
"""

from __future__ import annotations

import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from kstrata.ir.bundle import KernelBundle
from kstrata.ir.errors import BundleError

from .isa import InstructionMix
from .tools import FoundTool, find_tool, run_tool
from .usage import ResourceUsage

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
    # the ptxas Triton itself uses (Inductor points it at torch's own, whose PTX ISA the bundled one may not know:
    # PTX that Triton wrote for it, `.version 9.0`, is refused by a bundled ptxas 8.7)
    triton_ptxas = os.environ.get("TRITON_PTXAS_PATH") if name == "ptxas" else None
    if triton_ptxas:
        candidates.append(("TRITON_PTXAS_PATH", triton_ptxas))
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


# ---------------------------------------------------------------------------------------------------
# PTX -> cubin with the options Triton used
# ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PtxasOptions:
    """The `ptxas` command line Triton 3.6 uses (`make_cubin`), as a value."""

    arch: str  # e.g. "sm_90a"
    lineinfo: bool = True
    fmad: bool = True
    extra: tuple[str, ...] = ()

    @classmethod
    def from_bundle(cls, bundle: KernelBundle) -> PtxasOptions:
        """The options Triton used for `bundle` (arch from its target, fp fusion and ptx_options from metadata)."""
        if bundle.target.backend != "cuda":
            raise BundleError(f"kernel {bundle.name}: {bundle.target} is not an NVIDIA target", path=bundle.origin)
        capability = int(bundle.target.arch)
        arch = f"sm_{capability}{'a' if capability >= 90 else ''}"  # Triton's sm_arch_from_capability
        extra = bundle.metadata.get("ptx_options")
        return cls(arch=arch, fmad=bool(bundle.metadata.get("enable_fp_fusion", True)),
                   extra=tuple(str(extra).split()) if extra else ())

    def argv(self, ptxas: Path, src: Path, out: Path) -> list[str]:
        return [str(ptxas), *(["-lineinfo"] if self.lineinfo else []), *([] if self.fmad else ["--fmad=false"]), "-v",
                *self.extra, f"--gpu-name={self.arch}", str(src), "-o", str(out)]


@dataclass(frozen=True)
class PtxasReport:
    """What `ptxas -v` says about one entry."""

    registers: int
    spill_store_bytes: int
    spill_load_bytes: int
    stack_frame_bytes: int
    barriers: int
    cmem_bytes: int = 0
    smem_bytes: int = 0


@dataclass(frozen=True)
class CubinBuild:
    cubin: bytes
    log: str
    reports: dict[str, PtxasReport]
    command: str


def _ptxas_tool(arch: str) -> FoundTool:
    # Triton uses a separate ptxas for Blackwell (sm_100 and newer).
    if int(re.sub(r"\D", "", arch)[:3] or 0) >= 100 and not os.environ.get("KSTRATA_PTXAS"):
        chosen = os.environ.get("TRITON_PTXAS_BLACKWELL_PATH")  # Triton's own choice for these targets
        if chosen and Path(chosen).is_file() and os.access(chosen, os.X_OK):
            return FoundTool("ptxas", Path(chosen), "TRITON_PTXAS_BLACKWELL_PATH")
        bundled = triton_nvidia_bin()
        if bundled is not None and (bundled / "ptxas-blackwell").exists():
            return FoundTool("ptxas", bundled / "ptxas-blackwell", "triton")
    return find_nvidia_tool("ptxas")


def parse_ptxas_log(log: str) -> dict[str, PtxasReport]:
    """Per-entry figures from `ptxas -v` output."""
    reports: dict[str, PtxasReport] = {}
    current: dict[str, dict[str, int]] = {}
    for m in re.finditer(r"Function properties for (\w+)\s*\n\s*(\d+) bytes stack frame, (\d+) bytes spill stores, "
                         r"(\d+) bytes spill loads", log):
        current.setdefault(m.group(1), {}).update(stack=int(m.group(2)), st=int(m.group(3)), ld=int(m.group(4)))
    for m in re.finditer(r"Compiling entry function '(\w+)'.*?Used (\d+) registers(?:, used (\d+) barriers)?"
                         r"(?:, (\d+) bytes smem)?(?:, (\d+) bytes cmem\[0\])?", log, re.S):
        current.setdefault(m.group(1), {}).update(regs=int(m.group(2)), bar=int(m.group(3) or 0),
                                                  smem=int(m.group(4) or 0), cmem=int(m.group(5) or 0))
    for name, v in current.items():
        reports[name] = PtxasReport(registers=v.get("regs", 0), spill_store_bytes=v.get("st", 0),
                                    spill_load_bytes=v.get("ld", 0), stack_frame_bytes=v.get("stack", 0),
                                    barriers=v.get("bar", 0), cmem_bytes=v.get("cmem", 0), smem_bytes=v.get("smem", 0))
    return reports


def assemble_ptx(ptx: str, options: PtxasOptions, timeout: float = 300.0) -> CubinBuild:
    """Assemble `ptx` into a cubin with `options`, as Triton's `make_cubin` does.

    For an unmodified kernel the cubin equals Triton's byte for byte, provided the source files named
    by the PTX's `.file` directives still have the size and modification time they had when Triton
    compiled: ptxas records both in `.debug_line`. `compare_cubins` tells that case apart.
    """
    ptxas = _ptxas_tool(options.arch)
    with tempfile.TemporaryDirectory(prefix="kstrata-ptxas-") as tmp:
        src, out = Path(tmp) / "kernel.ptx", Path(tmp) / "kernel.cubin"
        src.write_text(ptx)
        argv = options.argv(ptxas.path, src, out)
        result = run_tool(argv, timeout=timeout)
        log = result.stderr + result.stdout
        return CubinBuild(out.read_bytes(), log, parse_ptxas_log(log), result.repro)


def rebuild_cubin(bundle: KernelBundle, ptx: str | None = None) -> CubinBuild:
    """Assemble `ptx` (default: the bundle's own PTX) with the options Triton used for `bundle`."""
    return assemble_ptx(ptx if ptx is not None else bundle.text("ptx"), PtxasOptions.from_bundle(bundle))


# ---------------------------------------------------------------------------------------------------
# Occupancy
# ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SmLimits:
    registers: int = 65536
    max_threads: int = 2048
    max_blocks: int = 32
    shared_bytes: int = 233472  # 228 KiB per SM (Hopper)
    reserved_shared_per_block: int = 1024
    register_unit: int = 256  # registers are allocated per warp in units of 256


SM_LIMITS: dict[int, SmLimits] = {
    80: SmLimits(shared_bytes=167936),
    86: SmLimits(max_threads=1536, max_blocks=16, shared_bytes=102400),
    87: SmLimits(shared_bytes=167936),
    89: SmLimits(max_threads=1536, max_blocks=24, shared_bytes=102400),
    90: SmLimits(),
    100: SmLimits(),
    103: SmLimits(),
    120: SmLimits(max_threads=1536, max_blocks=32, shared_bytes=102400),
}


@dataclass(frozen=True)
class Occupancy:
    blocks_per_sm: int
    warps_per_sm: int
    max_warps_per_sm: int
    #: What stops more blocks from fitting: "registers", "shared", "threads" or "blocks" (ties joined by
    #: "+", in that order), or "none" when the SM is full (every warp slot used).
    limiter: str

    @property
    def fraction(self) -> float:
        return self.warps_per_sm / self.max_warps_per_sm


def occupancy(capability: int, registers: int, threads_per_block: int, shared_bytes: int) -> Occupancy:
    """Theoretical occupancy of one kernel on one SM of compute capability `capability`."""
    lim = SM_LIMITS.get(capability, SmLimits())
    warps = max(1, -(-threads_per_block // 32))
    regs_per_warp = -(-max(registers, 1) * 32 // lim.register_unit) * lim.register_unit
    by = {
        "registers": lim.registers // (regs_per_warp * warps),
        "shared": lim.shared_bytes // (shared_bytes + lim.reserved_shared_per_block),
        "threads": lim.max_threads // (warps * 32),
        "blocks": lim.max_blocks,
    }
    blocks = min(by.values())
    max_warps = lim.max_threads // 32
    limiter = "none" if blocks * warps >= max_warps else "+".join(k for k, v in by.items() if v == blocks)
    return Occupancy(blocks, blocks * warps, max_warps, limiter)


# ---------------------------------------------------------------------------------------------------
# SASS
# ---------------------------------------------------------------------------------------------------
def sass(cubin: bytes) -> str:
    """The SASS listing of `cubin` (`cuobjdump --dump-sass`)."""
    tool = find_nvidia_tool("cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return run_tool([tool.path, "--dump-sass", f.name], timeout=120).stdout


_SASS_INSTR = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)")
_WIDTH = {"U8": 8, "S8": 8, "U16": 16, "S16": 16, "32": 32, "64": 64, "128": 128}


def _sass_category(op: str) -> tuple[str, int | None]:
    base, *mods = op.split(".")
    width = 32
    for mod in mods:
        if mod in _WIDTH:
            width = _WIDTH[mod]
    memory = {"LDG": "load.global", "STG": "store.global", "LDS": "load.shared", "STS": "store.shared",
              "LDSM": "load.shared", "STSM": "store.shared", "LDL": "load.local", "STL": "store.local",
              "LDC": "load.const", "ULDC": "load.const"}
    if base in memory:
        return memory[base], width
    if base in ("LDGSTS",) or base.startswith("LDGDEPBAR"):
        return "async_copy", width if base == "LDGSTS" else None
    if base.startswith("UTMA") or base.startswith("UBLKCP"):
        return "tma", None
    if base in ("ATOM", "ATOMG", "ATOMS", "RED", "REDG", "REDUX"):
        return "atomic", None
    if base in ("HMMA", "IMMA", "DMMA", "BMMA", "QMMA", "OMMA"):
        return "mma", None
    if base in ("HGMMA", "IGMMA", "QGMMA", "BGMMA", "WARPGROUP", "UTCHMMA", "UTCQMMA", "UTCIMMA"):
        return "wgmma", None
    if base in ("BRA", "BRX", "JMP", "JMX", "CALL", "RET", "EXIT", "BREAK", "BRK", "CONT"):
        return "branch", None
    if base in ("BAR", "BSYNC", "BSSY", "MEMBAR", "SYNCS", "WARPSYNC", "ERRBAR", "CCTL", "FENCE"):
        return "barrier", None
    if base in ("DEPBAR",):
        return "wait", None
    if base in ("NOP",):
        return "other", None
    return "alu", None


def sass_instruction_mix(listing: str) -> InstructionMix:
    """Instruction mix of a SASS listing: loads/stores by space and width, MMA/WGMMA, branches, barriers."""
    mix = InstructionMix("nvidia")
    for m in _SASS_INSTR.finditer(listing):
        op = m.group(1)
        category, width = _sass_category(op)
        mix.add(op, category, width)
    return mix


# ---------------------------------------------------------------------------------------------------
# Comparing cubins
# ---------------------------------------------------------------------------------------------------
def _is_debug_section(name: str) -> bool:
    return name.startswith((".debug_", ".nv_debug_", ".rela.debug_", ".rela.nv_debug_"))


@dataclass(frozen=True)
class CubinComparison:
    """Whether two cubins are the same: byte for byte, or in every section but the debug ones."""

    identical: bool
    same_code: bool
    differing_sections: tuple[str, ...]
    #: Sections whose size or presence differs, which shifts every later offset.
    layout_changed: bool

    def describe(self) -> str:
        if self.identical:
            return "byte-identical"
        if self.same_code:
            return ("identical except debug sections " + ", ".join(self.differing_sections)
                    + " (ptxas records the .file sources' size and mtime there)")
        return "differs in " + ", ".join(self.differing_sections)


def compare_cubins(a: bytes, b: bytes) -> CubinComparison:
    """Compare two cubins section by section (headers are implied by the section layout)."""
    from .elf import read_elf

    if a == b:
        return CubinComparison(True, True, (), False)
    ea, eb = read_elf(a), read_elf(b)
    sa = {s.name: s for s in ea.sections if s.index}
    sb = {s.name: s for s in eb.sections if s.index}
    differing = sorted(n for n in sa.keys() | sb.keys() if n not in sa or n not in sb or sa[n].data != sb[n].data)
    layout = sa.keys() != sb.keys() or any(sa[n].size != sb[n].size for n in sa.keys() & sb.keys())
    same_code = bool(differing) and all(_is_debug_section(n) for n in differing)
    if not differing:  # same sections, different headers or padding
        differing = ["<ELF headers>"]
    return CubinComparison(False, same_code, tuple(differing), layout)
