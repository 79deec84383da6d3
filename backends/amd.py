"""AMD targets: tool discovery, AMDGCN → hsaco rebuilds, code-object metadata, ISA statistics.

Tools (`llvm-mc`, `ld.lld`, `llvm-objdump`, `llvm-readobj`) are found in this order: the environment
override (`KSTRATA_LLVM_MC`, …), Debian's versioned LLVM 22, then LLVM 19 (which also handles gfx942
and older), then the unversioned names on `PATH`. The setup (`make setup`) installs `llvm-22` and
`lld-22` where they are missing. Every tool runs through `backends.tools.run_tool`.

What this module owns:

- `reassemble_amdgcn`: AMDGCN text → hsaco the way Triton's `make_hsaco` does it (assemble for the
  `amdgcn-amd-amdhsa` triple and the arch, then `ld.lld -shared`), and `compare_text` to check that a
  rebuild kept the machine code byte for byte.
- `code_object_metadata`: the per-kernel metadata of an hsaco, decoded from its `NT_AMDGPU_METADATA`
  note (MessagePack) and its 64-byte kernel descriptors, and `compare_metadata`, which splits changes
  into ABI (what a launcher relies on), resources (registers, spills, scratch) and hardware setup.
- `amd_instruction_mix`: the instruction mix of an hsaco from `llvm-objdump`.
- `amdgcn_resource_usage`: the resource report read from the AMDGCN text's metadata block.
"""

from __future__ import annotations

import re
import shutil
import struct
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from kstrata.ir.errors import BundleError

from .elf import ElfFile, ElfSection, read_elf
from .isa import InstructionMix
from .tools import DEFAULT_TIMEOUT_S, FoundTool, ToolError, ToolNotFound, find_tool, run_tool
from .usage import ResourceUsage

AMD_TOOLS = ("llvm-mc", "ld.lld", "llvm-objdump", "llvm-readobj")
LLVM_VERSIONS = (22, 19)
AMDHSA_TRIPLE = "amdgcn-amd-amdhsa"
EM_AMDGPU = 224


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


# =================================================================================================
# Resource report from the AMDGCN text
# =================================================================================================

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


# =================================================================================================
# Rebuild: AMDGCN text → hsaco
# =================================================================================================

#: `EF_AMDGPU_MACH` (the low byte of an AMDGPU ELF's `e_flags`) → processor, checked against llvm-mc 22.
AMDGPU_MACH = {
    0x2F: "gfx906", 0x30: "gfx908", 0x36: "gfx1030", 0x3F: "gfx90a", 0x41: "gfx1100", 0x43: "gfx1150",
    0x46: "gfx1101", 0x47: "gfx1102", 0x48: "gfx1200", 0x4A: "gfx1151", 0x4C: "gfx942", 0x4E: "gfx1201",
    0x4F: "gfx950",
}


def amdgcn_target_id(amdgcn: str) -> tuple[str, dict[str, bool]] | None:
    """The processor and target features of the `.amdgcn_target` directive (`gfx942:xnack+` →
    `("gfx942", {"xnack": True})`), or `None` when the text has no directive."""
    m = re.search(r'^\s*\.amdgcn_target\s+"([^"]+)"', amdgcn, re.M)
    if not m:
        return None
    target_id = m.group(1)
    # `amdgcn-amd-amdhsa--gfx942:sramecc+:xnack-`: the triple, an empty environment, then the id.
    processor_and_features = target_id.split("--", 1)[-1]
    processor, *settings = processor_and_features.split(":")
    features = {s[:-1]: s.endswith("+") for s in settings if s[-1:] in "+-" and len(s) > 1}
    return processor, features


def assembler_features(amdgcn: str, arch: str, features: str = "") -> str:
    """The `-mattr` string that assembles `amdgcn` for `arch` as Triton would.

    Triton's `make_hsaco` passes `+xnack` under ASAN and nothing otherwise; the text records that
    choice in its `.amdgcn_target` id (`gfx942:xnack+`), and llvm-mc refuses a text whose target id
    disagrees with its own subtarget. So the target id's settings are the defaults, and `features`
    (comma separated, `+x`/`-x`) adds to or overrides them. Triton's gfx11 `-real-true16` is a
    code-generation feature of its `make_amdgcn`, not an assembler one: the text it produces uses the
    fake-16 spellings, which assemble to the same words either way (checked on gfx1100).
    """
    wanted: dict[str, bool] = {}
    parsed = amdgcn_target_id(amdgcn)
    if parsed is not None:
        processor, target_features = parsed
        if processor != arch:
            raise BundleError(f"AMDGCN was generated for {processor} (.amdgcn_target) but is being assembled for {arch}",
                              hint=f"assemble for {processor}, or regenerate the AMDGCN for {arch}")
        wanted.update(target_features)
    for item in (f.strip() for f in features.split(",")):
        if not item:
            continue
        if item[0] not in "+-" or len(item) < 2:
            raise ValueError(f"target feature {item!r} must be spelled +name or -name")
        wanted[item[1:]] = item[0] == "+"
    return ",".join(("+" if on else "-") + name for name, on in wanted.items())


def reassemble_amdgcn(amdgcn: str, arch: str, features: str = "", *, timeout: float = DEFAULT_TIMEOUT_S) -> bytes:
    """Assemble AMDGCN text and link it into an hsaco, as Triton's `make_hsaco` does.

    `llvm-mc -triple=amdgcn-amd-amdhsa -mcpu=<arch> [-mattr=<features>] -filetype=obj`, then
    `ld.lld -shared`. On a tool failure the temporary directory with the input is kept, so the
    `repro` command line of the raised `ToolError` can be run as it stands.
    """
    mattr = assembler_features(amdgcn, arch, features)
    mc, lld = find_amd_tool("llvm-mc"), find_amd_tool("ld.lld")
    work = Path(tempfile.mkdtemp(prefix="kstrata-hsaco-"))
    src, obj, out = work / "kernel.amdgcn", work / "kernel.o", work / "kernel.hsaco"
    src.write_text(amdgcn)
    keep = False
    try:
        run_tool([mc.path, f"-triple={AMDHSA_TRIPLE}", f"-mcpu={arch}", *([f"-mattr={mattr}"] if mattr else []),
                  "-filetype=obj", src, "-o", obj], timeout=timeout)
        run_tool([lld.path, "-shared", obj, "-o", out], timeout=timeout)
        return out.read_bytes()
    except ToolError as exc:
        keep = True
        exc.hint = f"the input is kept in {work} for the repro" + (f"; {exc.hint}" if exc.hint else "")
        raise
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)


def hsaco_arch(hsaco: bytes | ElfFile) -> str | None:
    """The processor an AMDGPU code object was built for, from its ELF `e_flags` (`None` if unknown)."""
    elf = hsaco if isinstance(hsaco, ElfFile) else read_elf(hsaco)
    if elf.machine != EM_AMDGPU:
        raise BundleError(f"ELF machine {elf.machine} is not AMDGPU ({EM_AMDGPU})", path=elf.origin)
    return AMDGPU_MACH.get(elf.flags & 0xFF)


@dataclass(frozen=True)
class TextComparison:
    """Whether two code objects hold the same `.text` bytes, and where they first differ."""

    identical: bool
    size_a: int
    size_b: int
    #: Byte offset in `.text` of the first 32-bit word that differs (`None` when identical).
    offset: int | None = None
    word_a: int | None = None
    word_b: int | None = None
    #: The disassembled instruction covering `offset` in each, when the disassembler could tell.
    instruction_a: str | None = None
    instruction_b: str | None = None

    def describe(self) -> str:
        if self.identical:
            return f".text identical ({self.size_a} bytes)"
        def word(w: int | None) -> str:
            return "end of .text" if w is None else f"{w:08x}"
        text = (f".text differs at offset {self.offset:#x} (sizes {self.size_a} and {self.size_b}): "
                f"a={word(self.word_a)} b={word(self.word_b)}")
        if self.instruction_a or self.instruction_b:
            text += f"\n  a: {self.instruction_a or '?'}\n  b: {self.instruction_b or '?'}"
        return text


def compare_text(a_hsaco: bytes, b_hsaco: bytes, arch: str | None = None) -> TextComparison:
    """Compare the `.text` of two hsacos byte for byte; on a difference, name the first differing word
    and, when `llvm-objdump` is available, the instruction at that offset in each."""
    elf_a, elf_b = read_elf(a_hsaco, origin="hsaco a"), read_elf(b_hsaco, origin="hsaco b")
    text_a, text_b = elf_a.section(".text"), elf_b.section(".text")
    if text_a.data == text_b.data:
        return TextComparison(True, text_a.size, text_b.size)
    common = min(len(text_a.data), len(text_b.data))
    first = next((i for i in range(common) if text_a.data[i] != text_b.data[i]), common)
    offset = first - first % 4

    def word(data: bytes) -> int | None:
        return struct.unpack_from("<I", data, offset)[0] if offset + 4 <= len(data) else None

    def instruction(elf: ElfFile, text: ElfSection, hsaco: bytes) -> str | None:
        target = arch or hsaco_arch(elf)
        if target is None:
            return None
        try:
            insts = disassemble_hsaco(hsaco, target, functions_only=False)
        except ToolError:
            return None
        address = text.addr + offset
        for inst in insts:
            if inst.address <= address < inst.address + 4 * len(inst.words):
                return f"{inst.address - text.addr:#x}: {inst.text}"
        return None

    return TextComparison(False, text_a.size, text_b.size, offset, word(text_a.data), word(text_b.data),
                          instruction(elf_a, text_a, a_hsaco), instruction(elf_b, text_b, b_hsaco))


# =================================================================================================
# Code-object metadata: the NT_AMDGPU_METADATA note and the kernel descriptors
# =================================================================================================

NT_AMDGPU_METADATA = 32
KERNEL_DESCRIPTOR_SIZE = 64


def unpack_msgpack(data: bytes) -> Any:
    """Decode one MessagePack value (the encoding of AMDGPU code-object metadata, v3 and later), with
    the `msgpack` library.

    Maps become dicts (keys kept in file order), arrays lists, `bin` and `ext` payloads bytes. A value
    that does not decode is a `BundleError` saying why (truncated, bytes after the value, a byte that
    is not a MessagePack type, nesting too deep).
    """
    import msgpack

    def ext(_code: int, payload: bytes) -> bytes:
        return payload

    def pairs(items: list[tuple[Any, Any]]) -> dict[Any, Any]:
        return {(tuple(k) if isinstance(k, list) else k): v for k, v in items}

    try:
        return msgpack.unpackb(bytes(data), raw=False, strict_map_key=False, use_list=True, ext_hook=ext,
                               object_pairs_hook=pairs)
    except msgpack.ExtraData as exc:
        raise BundleError(f"AMDGPU metadata: {len(exc.extra)} bytes after the MessagePack value") from None
    except msgpack.FormatError as exc:
        raise BundleError(f"AMDGPU metadata: a byte is not a MessagePack type {exc or '(a reserved code)'}") from None
    except msgpack.StackError:
        raise BundleError("AMDGPU metadata: MessagePack nesting too deep") from None
    except msgpack.OutOfData:
        raise BundleError(f"AMDGPU metadata: MessagePack value truncated ({len(data)} bytes)") from None
    except (ValueError, TypeError, UnicodeDecodeError) as exc:
        # the library reports incomplete input as a ValueError; an unhashable key as a TypeError
        what = "truncated" if "incomplete" in str(exc) else "malformed"
        raise BundleError(f"AMDGPU metadata: MessagePack value {what}: {exc}") from None


@dataclass(frozen=True)
class KernelArg:
    """One kernel argument of the kernarg segment, as the code-object metadata lays it out."""

    offset: int
    size: int
    value_kind: str  # global_buffer, by_value, hidden_block_count_x, …
    address_space: str | None = None  # global, constant, local, … (pointers only)
    name: str | None = None
    #: Every other key of the argument's metadata (`.access`, `.pointee_align`, …), sorted.
    attributes: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def from_msgpack(cls, entry: Mapping[str, Any]) -> KernelArg:
        core = {".offset", ".size", ".value_kind", ".address_space", ".name"}
        return cls(int(entry.get(".offset", -1)), int(entry.get(".size", -1)), str(entry.get(".value_kind", "")),
                   entry.get(".address_space"), entry.get(".name"),
                   tuple(sorted((k, _freeze(v)) for k, v in entry.items() if k not in core)))


def _freeze(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    return value


def _bits(value: int, lo: int, hi: int) -> int:
    return (value >> lo) & ((1 << (hi - lo + 1)) - 1)


@dataclass(frozen=True)
class KernelDescriptor:
    """The 64-byte kernel descriptor (`<kernel>.kd` in `.rodata`): what the packet processor reads to
    start a wave. Layout of code-object v4/v5 (AMDGPUUsage, "Kernel Descriptor")."""

    group_segment_fixed_size: int
    private_segment_fixed_size: int
    kernarg_size: int
    #: Byte offset from the descriptor to the kernel's first instruction.
    kernel_code_entry_byte_offset: int
    compute_pgm_rsrc3: int
    compute_pgm_rsrc1: int
    compute_pgm_rsrc2: int
    kernel_code_properties: int
    kernarg_preload: int
    #: Address of the descriptor itself (its symbol's value).
    address: int = 0

    @classmethod
    def from_bytes(cls, raw: bytes, address: int = 0) -> KernelDescriptor:
        if len(raw) != KERNEL_DESCRIPTOR_SIZE:
            raise BundleError(f"kernel descriptor is {len(raw)} bytes, expected {KERNEL_DESCRIPTOR_SIZE}")
        group, private, kernarg = struct.unpack_from("<III", raw, 0)
        (entry,) = struct.unpack_from("<q", raw, 16)
        rsrc3, rsrc1, rsrc2 = struct.unpack_from("<III", raw, 44)
        props, preload = struct.unpack_from("<HH", raw, 56)
        return cls(group, private, kernarg, entry, rsrc3, rsrc1, rsrc2, props, preload, address)

    # COMPUTE_PGM_RSRC1
    @property
    def vgpr_blocks(self) -> int:
        return _bits(self.compute_pgm_rsrc1, 0, 5)

    @property
    def sgpr_blocks(self) -> int:
        return _bits(self.compute_pgm_rsrc1, 6, 9)

    @property
    def float_mode(self) -> int:
        """Round modes (bits 0-3) and denormal modes (bits 4-7), FLOAT_MODE in LLVM's listing."""
        return _bits(self.compute_pgm_rsrc1, 12, 19)

    @property
    def dx10_clamp(self) -> bool:
        return bool(_bits(self.compute_pgm_rsrc1, 21, 21))

    @property
    def ieee_mode(self) -> bool:
        return bool(_bits(self.compute_pgm_rsrc1, 23, 23))

    @property
    def fp16_overflow(self) -> bool:
        return bool(_bits(self.compute_pgm_rsrc1, 26, 26))

    # COMPUTE_PGM_RSRC2
    @property
    def enable_private_segment(self) -> bool:
        return bool(_bits(self.compute_pgm_rsrc2, 0, 0))

    @property
    def user_sgpr_count(self) -> int:
        return _bits(self.compute_pgm_rsrc2, 1, 5)

    @property
    def workgroup_id_enable(self) -> tuple[bool, bool, bool]:
        rsrc2 = self.compute_pgm_rsrc2
        return bool(_bits(rsrc2, 7, 7)), bool(_bits(rsrc2, 8, 8)), bool(_bits(rsrc2, 9, 9))

    @property
    def workitem_id_dims(self) -> int:
        """VGPR_WORKITEM_ID: 0 → x, 1 → x,y, 2 → x,y,z."""
        return _bits(self.compute_pgm_rsrc2, 11, 12)

    # kernel_code_properties and kernarg preload
    @property
    def wavefront_size32(self) -> bool:
        return bool(_bits(self.kernel_code_properties, 10, 10))

    @property
    def uses_dynamic_stack(self) -> bool:
        return bool(_bits(self.kernel_code_properties, 11, 11))

    @property
    def kernarg_preload_length(self) -> int:
        return _bits(self.kernarg_preload, 0, 6)

    @property
    def kernarg_preload_offset(self) -> int:
        return _bits(self.kernarg_preload, 7, 15)

    @property
    def entry_address(self) -> int:
        return self.address + self.kernel_code_entry_byte_offset

    # Per-arch decoding
    def accum_offset(self, arch: str) -> int | None:
        """First AGPR's index in the unified register file (gfx90a, gfx94x, gfx950 only)."""
        return (_bits(self.compute_pgm_rsrc3, 0, 5) + 1) * 4 if _has_unified_vgprs(arch) else None

    def allocated_vgprs(self, arch: str) -> int:
        """VGPRs (AGPRs included on gfx90a+) the wave is given: (blocks + 1) × encoding granule."""
        if _has_unified_vgprs(arch):
            granule = 8
        else:
            granule = 8 if self.wavefront_size32 else 4
        return (self.vgpr_blocks + 1) * granule

    def allocated_sgprs(self, arch: str) -> int | None:
        """SGPRs the wave is given on GFX9 ((blocks + 1) × 8); `None` on GFX10+, where the field is unused."""
        return None if arch.startswith(("gfx10", "gfx11", "gfx12")) else (self.sgpr_blocks + 1) * 8

    def to_json(self, arch: str) -> dict[str, Any]:
        return {
            "group_segment_fixed_size": self.group_segment_fixed_size,
            "private_segment_fixed_size": self.private_segment_fixed_size,
            "kernarg_size": self.kernarg_size,
            "kernel_code_entry_byte_offset": self.kernel_code_entry_byte_offset,
            "compute_pgm_rsrc1": f"{self.compute_pgm_rsrc1:#010x}",
            "compute_pgm_rsrc2": f"{self.compute_pgm_rsrc2:#010x}",
            "compute_pgm_rsrc3": f"{self.compute_pgm_rsrc3:#010x}",
            "kernel_code_properties": f"{self.kernel_code_properties:#06x}",
            "allocated_vgprs": self.allocated_vgprs(arch),
            "allocated_sgprs": self.allocated_sgprs(arch),
            "accum_offset": self.accum_offset(arch),
            "user_sgpr_count": self.user_sgpr_count,
            "wavefront_size32": self.wavefront_size32,
            "kernarg_preload_length": self.kernarg_preload_length,
        }


def _has_unified_vgprs(arch: str) -> bool:
    # gfx90a and later CDNA parts allocate VGPRs and AGPRs from one file, in granules of 8.
    return arch == "gfx90a" or arch.startswith("gfx94") or arch.startswith("gfx95")


@dataclass(frozen=True)
class KernelMetadata:
    """One kernel of a code object: its metadata map (decoded) and its kernel descriptor."""

    name: str
    symbol: str
    args: tuple[KernelArg, ...]
    kernarg_segment_size: int
    kernarg_segment_align: int
    group_segment_fixed_size: int  # static LDS bytes
    private_segment_fixed_size: int  # scratch bytes per work-item
    wavefront_size: int
    max_flat_workgroup_size: int | None
    sgpr_count: int
    vgpr_count: int  # on gfx90a+ this counts AGPRs too (the unified file)
    agpr_count: int | None
    sgpr_spill_count: int | None
    vgpr_spill_count: int | None
    uses_dynamic_stack: bool | None
    descriptor: KernelDescriptor | None
    #: Address and size of the kernel's code (its function symbol), when the ELF has it.
    code_address: int | None = None
    code_size: int | None = None
    #: The whole metadata map of the kernel as decoded from the note.
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, hash=False, compare=False)

    @classmethod
    def from_msgpack(cls, entry: Mapping[str, Any], descriptor: KernelDescriptor | None,
                     code: tuple[int, int] | None = None) -> KernelMetadata:
        def req(key: str) -> Any:
            if key not in entry:
                raise BundleError(f"AMDGPU metadata of kernel {entry.get('.name', '?')!r} has no {key}")
            return entry[key]

        def opt_int(key: str) -> int | None:
            value = entry.get(key)
            return None if value is None else int(value)

        dyn = entry.get(".uses_dynamic_stack")
        return cls(
            name=str(req(".name")), symbol=str(req(".symbol")),
            args=tuple(KernelArg.from_msgpack(a) for a in entry.get(".args", [])),
            kernarg_segment_size=int(req(".kernarg_segment_size")),
            kernarg_segment_align=int(req(".kernarg_segment_align")),
            group_segment_fixed_size=int(req(".group_segment_fixed_size")),
            private_segment_fixed_size=int(req(".private_segment_fixed_size")),
            wavefront_size=int(req(".wavefront_size")),
            max_flat_workgroup_size=opt_int(".max_flat_workgroup_size"),
            sgpr_count=int(req(".sgpr_count")), vgpr_count=int(req(".vgpr_count")),
            agpr_count=opt_int(".agpr_count"),
            sgpr_spill_count=opt_int(".sgpr_spill_count"), vgpr_spill_count=opt_int(".vgpr_spill_count"),
            uses_dynamic_stack=None if dyn is None else bool(dyn),
            descriptor=descriptor,
            code_address=None if code is None else code[0], code_size=None if code is None else code[1],
            raw=dict(entry),
        )

    def resource_usage(self) -> ResourceUsage:
        return ResourceUsage(
            vendor="amd", registers=self.vgpr_count, shared_bytes=self.group_segment_fixed_size,
            local_bytes=self.private_segment_fixed_size, sgprs=self.sgpr_count, agprs=self.agpr_count,
            vgpr_spills=self.vgpr_spill_count, sgpr_spills=self.sgpr_spill_count,
            wavefront_size=self.wavefront_size, source="hsaco NT_AMDGPU_METADATA note",
        )


@dataclass(frozen=True)
class CodeObjectMetadata:
    """The metadata of one hsaco: its target, metadata version, and kernels by name."""

    target: str  # e.g. amdgcn-amd-amdhsa--gfx942
    version: tuple[int, ...]
    kernels: Mapping[str, KernelMetadata]
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, hash=False, compare=False)

    @property
    def arch(self) -> str:
        return self.target.split("--", 1)[-1].split(":", 1)[0]

    def kernel(self, name: str | None = None) -> KernelMetadata:
        """The kernel called `name`, or the only kernel when `name` is `None`."""
        if name is None:
            if len(self.kernels) != 1:
                raise BundleError(f"code object has {len(self.kernels)} kernels; name one of: {', '.join(self.kernels)}")
            return next(iter(self.kernels.values()))
        if name not in self.kernels:
            raise BundleError(f"code object has no kernel {name!r} (kernels: {', '.join(self.kernels) or 'none'})")
        return self.kernels[name]


def amdgpu_metadata_map(hsaco: bytes | ElfFile) -> dict[str, Any]:
    """The decoded `NT_AMDGPU_METADATA` note of an hsaco: the map `llvm-readobj --notes` prints as YAML."""
    elf = hsaco if isinstance(hsaco, ElfFile) else read_elf(hsaco, origin="hsaco")
    notes = elf.notes(owner="AMDGPU", type=NT_AMDGPU_METADATA)
    if not notes:
        raise BundleError("hsaco has no NT_AMDGPU_METADATA note (code object v2, or not an hsaco)", path=elf.origin)
    try:
        value = unpack_msgpack(notes[0].desc)
    except BundleError as exc:
        raise BundleError(exc.message, path=elf.origin) from None
    if not isinstance(value, dict):
        raise BundleError(f"AMDGPU metadata is a {type(value).__name__}, expected a map", path=elf.origin)
    return value


def code_object_metadata(hsaco: bytes, *, origin: str | None = None) -> CodeObjectMetadata:
    """Per-kernel metadata of an hsaco: the metadata note joined with each kernel's descriptor (`.kd`)."""
    elf = read_elf(hsaco, origin=origin or "hsaco")
    meta = amdgpu_metadata_map(elf)
    symbols = {s.name: s for s in elf.symbols(".symtab")} or {s.name: s for s in elf.symbols(".dynsym")}
    kernels: dict[str, KernelMetadata] = {}
    for entry in meta.get("amdhsa.kernels", []):
        kd_name = entry.get(".symbol")
        descriptor = None
        if isinstance(kd_name, str) and kd_name in symbols:
            kd = symbols[kd_name]
            descriptor = KernelDescriptor.from_bytes(elf.symbol_bytes(kd), address=kd.value)
        code_sym = symbols.get(str(entry.get(".name")))
        code = (code_sym.value, code_sym.size) if code_sym is not None and code_sym.type == "func" else None
        kernel = KernelMetadata.from_msgpack(entry, descriptor, code)
        kernels[kernel.name] = kernel
    version = meta.get("amdhsa.version", [])
    return CodeObjectMetadata(str(meta.get("amdhsa.target", "")), tuple(int(v) for v in version), kernels, meta)


def descriptor_problems(kernel: KernelMetadata, arch: str) -> list[str]:
    """Where the kernel descriptor disagrees with the metadata or the code: each is a broken hsaco."""
    kd = kernel.descriptor
    if kd is None:
        return [f"{kernel.name}: no kernel descriptor symbol {kernel.symbol!r}"]
    problems = []
    pairs = (("kernarg size", kd.kernarg_size, kernel.kernarg_segment_size),
             ("LDS bytes", kd.group_segment_fixed_size, kernel.group_segment_fixed_size),
             ("scratch bytes", kd.private_segment_fixed_size, kernel.private_segment_fixed_size),
             ("wavefront size", 32 if kd.wavefront_size32 else 64, kernel.wavefront_size))
    for what, in_kd, in_meta in pairs:
        if in_kd != in_meta:
            problems.append(f"{kernel.name}: descriptor says {what} {in_kd}, metadata says {in_meta}")
    if kd.allocated_vgprs(arch) < kernel.vgpr_count:
        problems.append(f"{kernel.name}: descriptor allocates {kd.allocated_vgprs(arch)} VGPRs, "
                        f"the code uses {kernel.vgpr_count}")
    sgprs = kd.allocated_sgprs(arch)
    if sgprs is not None and sgprs < kernel.sgpr_count:
        problems.append(f"{kernel.name}: descriptor allocates {sgprs} SGPRs, the code uses {kernel.sgpr_count}")
    if kernel.code_address is not None and kd.entry_address != kernel.code_address:
        problems.append(f"{kernel.name}: descriptor entry {kd.entry_address:#x} is not the kernel's code "
                        f"at {kernel.code_address:#x}")
    return problems


# -- comparison ---------------------------------------------------------------------------------------

DifferenceKind = Literal["abi", "resource", "setup"]


@dataclass(frozen=True)
class MetadataDifference:
    """One change between two code objects' metadata.

    `kind` says who cares: `abi` — a launcher or runtime relies on it (kernarg layout, wavefront size,
    LDS, workgroup size, kernel symbol); `resource` — registers, spills, scratch (occupancy and speed,
    not meaning); `setup` — hardware state the descriptor sets up for the code (float modes, user SGPR
    layout, kernarg preload), which must agree with the code but is no launcher's business.
    """

    kernel: str
    field: str
    kind: DifferenceKind
    before: Any
    after: Any

    @property
    def label(self) -> str:
        return _FIELD_LABELS.get(self.field, self.field)

    def __str__(self) -> str:
        return f"{self.kernel}: {self.label} {_show(self.before)} → {_show(self.after)}"


_FIELD_LABELS = {
    "vgpr_count": "VGPRs", "sgpr_count": "SGPRs", "agpr_count": "AGPRs", "vgpr_spill_count": "VGPR spills",
    "sgpr_spill_count": "SGPR spills", "private_segment_fixed_size": "scratch bytes",
    "group_segment_fixed_size": "LDS bytes", "wavefront_size": "wavefront size",
    "max_flat_workgroup_size": "max workgroup size", "kernarg_segment_size": "kernarg bytes",
    "kernarg_segment_align": "kernarg alignment", "descriptor.allocated_vgprs": "allocated VGPRs (descriptor)",
    "descriptor.allocated_sgprs": "allocated SGPRs (descriptor)", "descriptor.accum_offset": "AGPR offset (descriptor)",
}

#: Kernel metadata keys and their kind; a key not listed here is compared as `abi`, the cautious choice.
_KERNEL_KEY_KIND: dict[str, DifferenceKind] = {
    ".symbol": "abi", ".kernarg_segment_size": "abi", ".kernarg_segment_align": "abi",
    ".group_segment_fixed_size": "abi", ".wavefront_size": "abi", ".max_flat_workgroup_size": "abi",
    ".uniform_work_group_size": "abi", ".reqd_workgroup_size": "abi", ".workgroup_size_hint": "abi",
    ".sgpr_count": "resource", ".vgpr_count": "resource", ".agpr_count": "resource",
    ".sgpr_spill_count": "resource", ".vgpr_spill_count": "resource", ".private_segment_fixed_size": "resource",
    ".uses_dynamic_stack": "resource", ".language": "setup", ".language_version": "setup",
}


def _show(value: Any) -> str:
    return "(none)" if value is None else str(value)


def _descriptor_fields(kd: KernelDescriptor | None, arch: str) -> dict[str, tuple[DifferenceKind, Any]]:
    if kd is None:
        return {}
    return {
        "descriptor.kernarg_size": ("abi", kd.kernarg_size),
        "descriptor.group_segment_fixed_size": ("abi", kd.group_segment_fixed_size),
        "descriptor.wavefront_size32": ("abi", kd.wavefront_size32),
        "descriptor.private_segment_fixed_size": ("resource", kd.private_segment_fixed_size),
        "descriptor.allocated_vgprs": ("resource", kd.allocated_vgprs(arch)),
        "descriptor.allocated_sgprs": ("resource", kd.allocated_sgprs(arch)),
        "descriptor.accum_offset": ("resource", kd.accum_offset(arch)),
        "descriptor.uses_dynamic_stack": ("resource", kd.uses_dynamic_stack),
        "descriptor.float_mode": ("setup", kd.float_mode),
        "descriptor.ieee_mode": ("setup", kd.ieee_mode),
        "descriptor.dx10_clamp": ("setup", kd.dx10_clamp),
        "descriptor.fp16_overflow": ("setup", kd.fp16_overflow),
        "descriptor.user_sgpr_count": ("setup", kd.user_sgpr_count),
        "descriptor.enable_private_segment": ("setup", kd.enable_private_segment),
        "descriptor.workgroup_id_enable": ("setup", kd.workgroup_id_enable),
        "descriptor.workitem_id_dims": ("setup", kd.workitem_id_dims),
        "descriptor.kernel_code_properties": ("setup", kd.kernel_code_properties),
        "descriptor.kernarg_preload_length": ("setup", kd.kernarg_preload_length),
        "descriptor.kernarg_preload_offset": ("setup", kd.kernarg_preload_offset),
        "descriptor.compute_pgm_rsrc3": ("setup", kd.compute_pgm_rsrc3),
    }


_ACCESS_HINTS = frozenset({".actual_access"})


def _compare_args(kernel: str, a: Sequence[KernelArg], b: Sequence[KernelArg]) -> list[MetadataDifference]:
    diffs = []
    if len(a) != len(b):
        diffs.append(MetadataDifference(kernel, "args.count", "setup" if _hidden_tail(a, b) else "abi", len(a), len(b)))
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        for name in ("offset", "size", "value_kind", "address_space", "name"):
            if getattr(x, name) != getattr(y, name):
                diffs.append(MetadataDifference(kernel, f"args[{i}].{name}", "abi", getattr(x, name), getattr(y, name)))
        ax, ay = dict(x.attributes), dict(y.attributes)
        for key in sorted(set(ax) | set(ay)):
            if ax.get(key) != ay.get(key):
                # `.actual_access` reports what the code does with the argument (read_only, …): the
                # runtime may use it as a hint, but the launch does not depend on it.
                kind: DifferenceKind = "setup" if key in _ACCESS_HINTS else "abi"
                diffs.append(MetadataDifference(kernel, f"args[{i}].{key.lstrip('.')}", kind, ax.get(key), ay.get(key)))
    # Arguments added or dropped after the others: `hidden_*` ones (grid and block counts, the implicit segment's
    # pointers) are the runtime's, which lays them out after the explicit arguments from this metadata; the
    # launcher passes the explicit ones only (a kernel that starts reading `tl.num_programs` gains them, as
    # Triton's own kernels that read it have them). Not run here: there is no AMD GPU
    hidden = _hidden_tail(a, b)
    for i, extra in enumerate(a[len(b):], start=len(b)):
        diffs.append(MetadataDifference(kernel, f"args[{i}]", "setup" if hidden else "abi",
                                        f"{extra.value_kind}@{extra.offset}", None))
    for i, extra in enumerate(b[len(a):], start=len(a)):
        diffs.append(MetadataDifference(kernel, f"args[{i}]", "setup" if hidden else "abi", None,
                                        f"{extra.value_kind}@{extra.offset}"))
    return diffs


def _hidden_tail(a: Sequence[KernelArg], b: Sequence[KernelArg]) -> bool:
    """Whether `a` and `b` differ only by runtime-supplied (`hidden_*`) arguments after the same explicit ones
    (neither has a hidden argument among those they share differing)."""
    shared = min(len(a), len(b))
    tail = [*a[shared:], *b[shared:]]
    return bool(tail) and a[:shared] == b[:shared] and all(x.value_kind.startswith("hidden_") for x in tail)


def compare_metadata(before: CodeObjectMetadata, after: CodeObjectMetadata) -> list[MetadataDifference]:
    """Every difference between two code objects' metadata and kernel descriptors, each with its kind.

    Kernels are matched by name; a kernel present on one side only is an `abi` difference. Within a
    kernel: the kernarg layout argument by argument, every key of the metadata map (known keys by
    their kind, unknown keys as `abi`), and the decoded descriptor fields.
    """
    diffs: list[MetadataDifference] = []
    if before.target != after.target:
        diffs.append(MetadataDifference("*", "target", "abi", before.target, after.target))
    if before.version != after.version:
        diffs.append(MetadataDifference("*", "metadata version", "abi", before.version, after.version))
    for name in sorted(set(before.kernels) | set(after.kernels)):
        a, b = before.kernels.get(name), after.kernels.get(name)
        if a is None or b is None:
            diffs.append(MetadataDifference(name, "kernel", "abi", None if a is None else "present",
                                            None if b is None else "present"))
            continue
        diffs.extend(_compare_args(name, a.args, b.args))
        # the kernarg segment grows or shrinks with runtime-supplied arguments alone: the runtime sizes it
        sized_by_runtime = _hidden_tail(a.args, b.args)
        for key in sorted((set(a.raw) | set(b.raw)) - {".args", ".name"}):
            va, vb = a.raw.get(key), b.raw.get(key)
            if va != vb:
                kind = "setup" if sized_by_runtime and key == ".kernarg_segment_size" else _KERNEL_KEY_KIND.get(key, "abi")
                diffs.append(MetadataDifference(name, key.lstrip("."), kind, va, vb))
        fa, fb = _descriptor_fields(a.descriptor, before.arch), _descriptor_fields(b.descriptor, after.arch)
        for key in sorted(set(fa) | set(fb)):
            kind = (fa.get(key) or fb[key])[0]
            if sized_by_runtime and key == "descriptor.kernarg_size":
                kind = "setup"
            va, vb = fa.get(key, (kind, None))[1], fb.get(key, (kind, None))[1]
            if va != vb:
                diffs.append(MetadataDifference(name, key, kind, va, vb))
    return diffs


def summarize_differences(diffs: Sequence[MetadataDifference]) -> str:
    """One line per kind, e.g. `ABI unchanged; resources: k: VGPRs 96 → 88`."""
    def part(kind: DifferenceKind, title: str) -> str:
        items = [d for d in diffs if d.kind == kind]
        return f"{title} unchanged" if not items else f"{title}: " + "; ".join(str(d) for d in items)

    return ", ".join((part("abi", "ABI"), part("resource", "resources"), part("setup", "hardware setup")))


# =================================================================================================
# ISA statistics
# =================================================================================================

@dataclass(frozen=True)
class AmdInstruction:
    """One disassembled instruction: address, mnemonic, operands, and its encoding words."""

    address: int
    mnemonic: str
    operands: str
    words: tuple[int, ...]
    function: str | None = None

    @property
    def text(self) -> str:
        return f"{self.mnemonic} {self.operands}".strip()


_OBJDUMP_LINE = re.compile(r"^\s+(?P<mn>[a-z_][\w.]*)(?P<ops>[^/]*?)\s*//\s*(?P<addr>[0-9A-Fa-f]+):\s*"
                           r"(?P<words>(?:[0-9A-Fa-f]{8}\s*)+)")
_OBJDUMP_FUNC = re.compile(r"^[0-9A-Fa-f]+\s+<(?P<name>[^>]+)>:")


def disassemble_hsaco(hsaco: bytes, arch: str, *, functions_only: bool = True,
                      timeout: float = DEFAULT_TIMEOUT_S) -> list[AmdInstruction]:
    """`llvm-objdump -d --mcpu=<arch>` of an hsaco, parsed. With `functions_only`, only the bytes inside
    function symbols are kept, dropping the `s_code_end`/`s_nop` fill the assembler appends to `.text`."""
    elf = read_elf(hsaco, origin="hsaco")
    objdump = find_amd_tool("llvm-objdump")
    with tempfile.TemporaryDirectory(prefix="kstrata-objdump-") as tmp:
        path = Path(tmp) / "kernel.hsaco"
        path.write_bytes(hsaco)
        out = run_tool([objdump.path, "-d", f"--mcpu={arch}", path], timeout=timeout).stdout
    symbols = elf.symbols(".symtab") or elf.symbols(".dynsym")  # a stripped hsaco keeps only .dynsym
    ranges = [(s.value, s.value + s.size, s.name) for s in symbols if s.type == "func" and s.size]
    insts: list[AmdInstruction] = []
    current: str | None = None
    for line in out.splitlines():
        fm = _OBJDUMP_FUNC.match(line)
        if fm:
            current = fm.group("name")
            continue
        m = _OBJDUMP_LINE.match(line)
        if not m:
            continue
        address = int(m.group("addr"), 16)
        function = next((name for lo, hi, name in ranges if lo <= address < hi), None)
        if functions_only and ranges and function is None:
            continue
        words = tuple(int(w, 16) for w in m.group("words").split())
        insts.append(AmdInstruction(address, m.group("mn"), m.group("ops").strip(), words, function or current))
    return insts


_WIDTH_SUFFIX = re.compile(r"_(?:dwordx(?P<dx>\d+)|(?P<dw>dword)|b(?P<b>8|16|32|64|96|128)|[ui](?P<ui>8|16|32|64)"
                           r"|(?P<byte>[us]?byte)|(?P<short>[us]?short))(?:_|$)")


def _memory_width(mnemonic: str) -> int | None:
    """Access width in bits from a memory mnemonic: `dwordx4` → 128, `b64` → 64, `ubyte` → 8, `read2_b32` → 64."""
    m = _WIDTH_SUFFIX.search(mnemonic)
    if not m:
        return None
    if m.group("dx"):
        width = 32 * int(m.group("dx"))
    elif m.group("dw"):
        width = 32
    elif m.group("b"):
        width = int(m.group("b"))
    elif m.group("ui"):
        width = int(m.group("ui"))
    elif m.group("byte"):
        width = 8
    else:
        width = 16
    # ds_read2/ds_write2 (and their st64 forms) move two elements of the named width.
    if re.match(r"ds_(?:read|write|load|store)2", mnemonic):
        width *= 2
    return width


_LDS_ATOMIC = re.compile(r"ds_(?:add|sub|rsub|inc|dec|min|max|and|or|xor|mskor|cmpst|cmpstore|cmpswap|wrxchg|"
                         r"condxchg|pk_add|append|consume)(?:_|$)")


def classify_amd_opcode(mnemonic: str, operands: str = "") -> tuple[str, int | None]:
    """The `backends.isa.CATEGORIES` category of an AMDGCN mnemonic, and its access width in bits
    for loads and stores (`None` where it does not apply or cannot be read off the mnemonic)."""
    mn = re.sub(r"_e(?:32|64)(?:_dpp|_sdwa)?$|_(?:dpp|sdwa)$", "", mnemonic)
    if mn.startswith(("global_atomic", "buffer_atomic", "flat_atomic")) or _LDS_ATOMIC.match(mn):
        return "atomic", None
    if mn.startswith(("global_load_lds", "global_load_async")) or (mn.startswith("buffer_load") and re.search(r"\blds\b", operands)):
        # A load that writes LDS directly (gfx942 `buffer_load … lds`, gfx950 `global_load_lds_dwordx4`): an async copy.
        return "async_copy", _memory_width(mn)
    if mn.startswith(("global_load", "buffer_load", "flat_load")):
        return "load.global", _memory_width(mn)
    if mn.startswith(("global_store", "buffer_store", "flat_store")):
        return "store.global", _memory_width(mn)
    if mn.startswith(("scratch_load",)):
        return "load.local", _memory_width(mn)
    if mn.startswith(("scratch_store",)):
        return "store.local", _memory_width(mn)
    if mn.startswith(("ds_read", "ds_load")):
        return "load.shared", _memory_width(mn)
    if mn.startswith(("ds_write", "ds_store")):
        return "store.shared", _memory_width(mn)
    if mn.startswith(("s_load", "s_buffer_load", "s_scalar_load")):
        return "load.const", _memory_width(mn)
    if mn.startswith(("v_mfma", "v_smfmac", "v_wmma", "v_swmmac")):
        return "mma", None
    if mn.startswith(("s_cbranch", "s_branch", "s_setpc", "s_swappc", "s_call")):
        return "branch", None
    if mn.startswith("s_barrier"):
        return "barrier", None
    if mn.startswith(("s_waitcnt", "s_wait_")):
        return "wait", None
    if mn.startswith(("s_nop", "s_endpgm", "s_code_end", "s_setprio", "s_sleep", "s_sendmsg", "s_trap", "s_sethalt",
                      "s_icache", "s_dcache", "buffer_wbl2", "buffer_inv", "buffer_wbinvl1", "global_wb", "global_inv",
                      "ds_bpermute", "ds_permute", "ds_swizzle", "ds_nop", "s_ttrace", "s_denorm_mode", "s_round_mode")):
        # Lane shuffles through the LDS crossbar (ds_*permute, ds_swizzle) touch no LDS memory: `other`.
        return "other", None
    if mn.startswith(("v_", "s_")):
        return "alu", None
    return "other", None


_UNCONDITIONAL = ("s_branch", "s_endpgm", "s_setpc_b64")


def amd_instruction_mix(hsaco: bytes, arch: str) -> InstructionMix:
    """Instruction mix of an hsaco's kernels, from `llvm-objdump -d --mcpu=<arch>`.

    Why the binary and not the AMDGCN text: the binary is what runs, it exists for every kernel
    (also for a cache entry whose text is gone or was patched), and objdump spells each instruction
    canonically, where the text may use aliases. Alignment fill is not counted: bytes outside the
    function symbols, and the `s_nop` runs after an unconditional branch or `s_endpgm` (the 256-byte
    kernarg-preload block on gfx942 and loop-alignment padding behind a branch are never executed).
    """
    mix = InstructionMix(vendor="amd")
    previous: str | None = None
    for inst in disassemble_hsaco(hsaco, arch):
        if inst.mnemonic == "s_nop" and previous in _UNCONDITIONAL:
            continue  # unreachable padding; `previous` stays unconditional so the whole run is skipped
        if inst.mnemonic == "s_code_end":
            continue
        previous = inst.mnemonic
        category, width = classify_amd_opcode(inst.mnemonic, inst.operands)
        mix.add(inst.mnemonic, category, width)
    return mix
