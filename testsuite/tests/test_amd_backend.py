"""The AMD backend on the CPU: the ELF reader, AMDGCN → hsaco reassembly (byte-identical `.text` for
every suite kernel), code-object metadata and its comparison, ISA statistics, and the rocprofv3
adapter's commands and CSV parsing (rocprofv3 itself needs an AMD GPU, which this machine lacks)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import stat
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kstrata.backends import rocprof
from kstrata.backends.amd import (
    amd_instruction_mix,
    amdgcn_target_id,
    amdgpu_metadata_map,
    assembler_features,
    classify_amd_opcode,
    code_object_metadata,
    compare_metadata,
    compare_text,
    descriptor_problems,
    find_amd_tool,
    hsaco_arch,
    reassemble_amdgcn,
    summarize_differences,
    unpack_msgpack,
)
from kstrata.backends.elf import SHT_NOTE, read_elf
from kstrata.backends.tools import ToolFailed, run_tool
from kstrata.ir.bundle import KernelBundle
from kstrata.ir.errors import BundleError
from kstrata.ir.target import Target
from kstrata.testsuite.kernels import all_kernels, get_kernel
from kstrata.testsuite.kernels.build import SuiteBuild, build_suite

SUITE_NAMES = [k.name for k in all_kernels()]
EXTRA_ARCHS = ("gfx90a", "gfx950", "gfx1100")


# -- fixtures ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def gfx942(suite_cache: Path) -> SuiteBuild:
    """The whole suite for hip:gfx942, read from the session's shared suite cache (built once)."""
    from kstrata.ir.triton_layout import load_cache_entry, read_index
    from kstrata.testsuite.kernels import all_kernels

    target = Target.parse("hip:gfx942")
    build = SuiteBuild(target)
    index = read_index(suite_cache)
    for key, record in index.items():
        if record["target"] == str(target):
            build.bundles[record["suite_kernel"]] = load_cache_entry(suite_cache / key, index)
    for kernel in all_kernels():
        if target.backend in kernel.unsupported_backends:
            build.skipped[kernel.name] = f"not supported on {target.backend}: {kernel.description}"
    return build


@pytest.fixture(scope="module")
def other_archs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, SuiteBuild]:
    kernels = [get_kernel("vector_add"), get_kernel("matmul_fp16")]
    return {arch: build_suite(Target.parse(f"hip:{arch}"), tmp_path_factory.mktemp(f"amd-{arch}"), kernels)
            for arch in EXTRA_ARCHS}


def bundle_of(build: SuiteBuild, name: str) -> KernelBundle:
    if name in build.errors:
        pytest.skip(f"suite kernel {name} does not compile for {build.target} (build_suite error, the kernel "
                    f"author's to fix): {build.errors[name].splitlines()[0]}")
    if name in build.skipped:
        pytest.skip(f"suite kernel {name} is not built for {build.target}: {build.skipped[name]}")
    return build.bundles[name]


def amdgcn(bundle: KernelBundle) -> str:
    return bundle.text("amdgcn")


def hsaco(bundle: KernelBundle) -> bytes:
    data = bundle.level("hsaco")
    assert isinstance(data, bytes)
    return data


def readobj(args: list[str], binary: bytes, tmp_path: Path, name: str = "obj.bin") -> str:
    path = tmp_path / name
    path.write_bytes(binary)
    return run_tool([find_amd_tool("llvm-readobj").path, *args, path]).stdout


# -- ELF reader -------------------------------------------------------------------------------------

def _readobj_sections(text: str) -> dict[str, tuple[int, int, int]]:
    """{name: (type, address, size)} from `llvm-readobj --sections`."""
    out = {}
    for block in re.findall(r"Section \{(.*?)\n  \}", text, re.S):
        name = re.search(r"Name: (\S*) \(", block)
        stype = re.search(r"Type: \S+ \((0x[0-9A-F]+)\)", block)
        addr = re.search(r"Address: (0x[0-9A-F]+)", block)
        size = re.search(r"Size: (\d+)", block)
        assert name and stype and addr and size, block
        out[name.group(1)] = (int(stype.group(1), 16), int(addr.group(1), 16), int(size.group(1)))
    return out


def test_elf_sections_and_symbols_match_llvm_readobj(gfx942: SuiteBuild, tmp_path: Path) -> None:
    binary = hsaco(bundle_of(gfx942, "vector_add"))
    elf = read_elf(binary)
    theirs = _readobj_sections(readobj(["--sections"], binary, tmp_path))
    ours = {s.name: (s.type, s.addr, s.size) for s in elf.sections}
    assert ours == theirs
    text = elf.section(".text")
    assert text.is_code and len(text.data) == text.size
    assert elf.section(".note").type == SHT_NOTE
    kernel = elf.symbol("vector_add_kernel")
    kd = elf.symbol("vector_add_kernel.kd")
    assert (kernel.type, kernel.section, kernel.bind) == ("func", ".text", "global")
    assert (kd.type, kd.section, kd.size) == ("object", ".rodata", 64)
    listing = readobj(["--symbols"], binary, tmp_path)
    m = re.search(r"Name: vector_add_kernel \(\d+\)\s+Value: (0x[0-9A-F]+)\s+Size: (\d+)", listing)
    assert m and (kernel.value, kernel.size) == (int(m.group(1), 16), int(m.group(2)))
    assert len(elf.symbol_bytes(kd)) == 64
    assert {s.table for s in elf.symbols()} == {".symtab", ".dynsym"}


def test_elf_reads_a_cubin_too(tmp_path: Path) -> None:
    """Vendor-neutral: the NVIDIA cubin of vector_add has its `.text.<kernel>` section and kernel symbol."""
    build = build_suite(Target.parse("cuda:90"), tmp_path / "cache", [get_kernel("vector_add")])
    if "vector_add" in build.errors:
        pytest.skip(f"vector_add does not compile for cuda:90: {build.errors['vector_add']}")
    cubin = build.bundles["vector_add"].level("cubin")
    assert isinstance(cubin, bytes)
    elf = read_elf(cubin)
    assert elf.machine == 190  # EM_CUDA
    theirs = _readobj_sections(readobj(["--sections"], cubin, tmp_path, "k.cubin"))
    assert {s.name: (s.type, s.addr, s.size) for s in elf.sections} == theirs
    name = build.bundles["vector_add"].name
    assert elf.section(f".text.{name}").is_code
    assert elf.symbol(name).type == "func"


def test_elf_errors_are_bundle_errors(gfx942: SuiteBuild) -> None:
    binary = hsaco(bundle_of(gfx942, "vector_add"))
    with pytest.raises(BundleError, match="not an ELF file"):
        read_elf(b"PK\x03\x04 this is a zip")
    with pytest.raises(BundleError, match="not an ELF file"):
        read_elf(b"")
    with pytest.raises(BundleError, match="ELF header is truncated"):
        read_elf(binary[:40])
    with pytest.raises(BundleError, match="truncated"):
        read_elf(binary[: len(binary) // 2], origin="half.hsaco")
    elf32 = bytearray(binary[:64])
    elf32[4] = 1
    with pytest.raises(BundleError, match="not ELF64"):
        read_elf(bytes(elf32))
    with pytest.raises(BundleError, match=r"no section '\.nope'"):
        read_elf(binary).section(".nope")
    with pytest.raises(BundleError, match="no symbol"):
        read_elf(binary).symbol("nope")


def test_corrupt_elf_is_a_bundle_error_naming_the_file(gfx942: SuiteBuild) -> None:
    """Bytes flipped anywhere in a code object: it still reads, or the error names the file (never a
    pyelftools, struct or index error)."""
    import random

    binary = hsaco(bundle_of(gfx942, "vector_add"))
    rng = random.Random(7)
    errors = 0
    for _ in range(150):
        corrupt = bytearray(binary)
        for _ in range(rng.randint(1, 8)):
            corrupt[rng.randrange(0, 64 if rng.random() < 0.3 else len(corrupt))] = rng.randrange(256)
        try:
            elf = read_elf(bytes(corrupt), origin="corrupt.hsaco")
            elf.symbols()
            elf.notes()
        except BundleError as exc:
            assert str(exc).startswith("corrupt.hsaco: "), str(exc)
            errors += 1
    assert errors > 0  # the sample does hit broken structures


# -- reassembly -------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", SUITE_NAMES)
def test_reassembly_gives_identical_text_gfx942(gfx942: SuiteBuild, name: str) -> None:
    bundle = bundle_of(gfx942, name)
    rebuilt = reassemble_amdgcn(amdgcn(bundle), "gfx942")
    comparison = compare_text(hsaco(bundle), rebuilt)
    assert comparison.identical, comparison.describe()
    # The rebuilt code object carries the same metadata and descriptor (the whole note map, too).
    assert compare_metadata(code_object_metadata(hsaco(bundle)), code_object_metadata(rebuilt)) == []
    assert amdgpu_metadata_map(rebuilt) == amdgpu_metadata_map(hsaco(bundle))


@pytest.mark.parametrize("arch", EXTRA_ARCHS)
@pytest.mark.parametrize("name", ["vector_add", "matmul_fp16"])
def test_reassembly_gives_identical_text_other_archs(other_archs: dict[str, SuiteBuild], arch: str, name: str) -> None:
    bundle = bundle_of(other_archs[arch], name)
    rebuilt = reassemble_amdgcn(amdgcn(bundle), arch)
    assert hsaco_arch(rebuilt) == hsaco_arch(hsaco(bundle)) == arch
    comparison = compare_text(hsaco(bundle), rebuilt)
    assert comparison.identical, comparison.describe()


def test_assembler_features_follow_the_target_id() -> None:
    assert amdgcn_target_id('\t.amdgcn_target "amdgcn-amd-amdhsa--gfx942:sramecc+:xnack-"\n') == (
        "gfx942", {"sramecc": True, "xnack": False})
    text = '\t.amdgcn_target "amdgcn-amd-amdhsa--gfx942:xnack+"\n'
    assert assembler_features(text, "gfx942") == "+xnack"  # Triton's ASAN build
    assert assembler_features(text, "gfx942", "-xnack,+sramecc") == "-xnack,+sramecc"
    assert assembler_features("s_endpgm\n", "gfx942") == ""
    with pytest.raises(BundleError, match="generated for gfx942"):
        assembler_features(text, "gfx90a")
    with pytest.raises(ValueError, match=r"\+name"):
        assembler_features("", "gfx942", "xnack")


def test_xnack_target_assembles_with_xnack(gfx942: SuiteBuild) -> None:
    text = amdgcn(bundle_of(gfx942, "vector_add")).replace(
        '"amdgcn-amd-amdhsa--gfx942"', '"amdgcn-amd-amdhsa--gfx942:xnack+"', 1)
    elf = read_elf(reassemble_amdgcn(text, "gfx942"))
    assert elf.flags & 0x300 == 0x300  # EF_AMDGPU_FEATURE_XNACK_ON_V4


def test_broken_amdgcn_gives_tool_failed_with_repro(gfx942: SuiteBuild) -> None:
    text = amdgcn(bundle_of(gfx942, "vector_add")).replace("s_waitcnt lgkmcnt(0)", "s_frobnicate s0, s1", 1)
    with pytest.raises(ToolFailed) as info:
        reassemble_amdgcn(text, "gfx942")
    exc = info.value
    assert exc.repro and "llvm-mc" in exc.repro and "-mcpu=gfx942" in exc.repro and "-filetype=obj" in exc.repro
    assert "s_frobnicate" in exc.stderr and "error" in exc.stderr
    assert "repro:" in str(exc)
    kept = re.search(r"the input is kept in (\S+) for the repro", str(exc))
    assert kept, str(exc)
    # The repro runs as printed, on the kept input, and fails the same way.
    assert (Path(kept.group(1)) / "kernel.amdgcn").read_text() == text
    again = run_tool(shlex.split(exc.repro), check=False)
    assert again.returncode != 0 and "s_frobnicate" in again.stderr
    shutil.rmtree(kept.group(1))


def test_compare_text_names_the_first_differing_instruction(gfx942: SuiteBuild) -> None:
    bundle = bundle_of(gfx942, "vector_add")
    original = amdgcn(bundle)
    assert "v_mov_b32_e32 v4, 0\n" in original
    edited = reassemble_amdgcn(original.replace("v_mov_b32_e32 v4, 0\n", "v_mov_b32_e32 v4, 1\n", 1), "gfx942")
    comparison = compare_text(hsaco(bundle), edited)
    assert not comparison.identical and comparison.offset is not None and comparison.offset % 4 == 0
    assert comparison.word_a != comparison.word_b
    assert comparison.instruction_a and "v_mov_b32_e32 v4, 0" in comparison.instruction_a
    assert comparison.instruction_b and "v_mov_b32_e32 v4, 1" in comparison.instruction_b
    assert f"{comparison.offset:#x}" in comparison.describe()


# -- metadata ---------------------------------------------------------------------------------------

def _yaml_scalar(text: str) -> Any:
    text = text.strip()
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    if text in ("true", "false"):
        return text == "true"
    if text.startswith("[") and text.endswith("]"):
        return [_yaml_scalar(x) for x in text[1:-1].split(",") if x.strip()]
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    return text


def _yaml_block(lines: list[tuple[int, str]], i: int, indent: int) -> tuple[Any, int]:
    """The block YAML subset LLVM prints for AMDGPU metadata: maps, `- ` lists, scalars."""
    if lines[i][1].startswith("- "):
        items = []
        while i < len(lines) and lines[i][0] == indent and lines[i][1].startswith("- "):
            rest = lines[i][1][2:].strip()
            if re.match(r"[^\s:]+:(\s|$)", rest):
                lines[i] = (indent + 2, rest)
                item, i = _yaml_block(lines, i, indent + 2)
            else:
                item, i = _yaml_scalar(rest), i + 1
            items.append(item)
        return items, i
    out = {}
    while i < len(lines) and lines[i][0] == indent and not lines[i][1].startswith("- "):
        key, _, rest = lines[i][1].partition(":")
        i += 1
        if rest.strip():
            out[key] = _yaml_scalar(rest)
        else:
            out[key], i = _yaml_block(lines, i, lines[i][0])
    return out, i


def readobj_metadata(binary: bytes, tmp_path: Path) -> Any:
    """The AMDGPU metadata map as `llvm-readobj --notes` reports it (YAML), parsed independently."""
    text = readobj(["--notes"], binary, tmp_path)
    m = re.search(r"AMDGPU Metadata: ---\n(.*?)\n\.\.\.", text, re.S)
    assert m, text
    lines = [(len(ln) - len(ln.lstrip(" ")), ln.strip()) for ln in m.group(1).splitlines() if ln.strip()]
    value, end = _yaml_block(lines, 0, 0)
    assert end == len(lines)
    return value


@pytest.mark.parametrize("name", SUITE_NAMES)
def test_metadata_note_matches_llvm_readobj(gfx942: SuiteBuild, name: str, tmp_path: Path) -> None:
    bundle = bundle_of(gfx942, name)
    ours = amdgpu_metadata_map(hsaco(bundle))
    assert ours == readobj_metadata(hsaco(bundle), tmp_path)
    meta = code_object_metadata(hsaco(bundle))
    assert meta.arch == "gfx942" and meta.version[0] == 1
    kernel = meta.kernel(bundle.name)
    assert kernel.symbol == f"{bundle.name}.kd" and kernel.wavefront_size == 64
    # Triton's LDS is dynamic (given at launch from its metadata's `shared`); the static part is at most that.
    assert kernel.group_segment_fixed_size <= (bundle.shared or 0)
    assert kernel.max_flat_workgroup_size == (bundle.num_warps or 0) * 64
    assert [a.value_kind for a in kernel.args].count("global_buffer") >= sum(p.is_pointer for p in bundle.params)
    assert descriptor_problems(kernel, "gfx942") == []
    # The metadata agrees with the AMDGCN text's resource report.
    usage = kernel.resource_usage()
    from kstrata.backends.amd import amdgcn_resource_usage

    text_usage = amdgcn_resource_usage(amdgcn(bundle), bundle.name)
    assert (usage.registers, usage.sgprs, usage.agprs, usage.vgpr_spills, usage.shared_bytes, usage.local_bytes) == (
        text_usage.registers, text_usage.sgprs, text_usage.agprs, text_usage.vgpr_spills, text_usage.shared_bytes,
        text_usage.local_bytes)


def test_kernel_descriptor_fields(gfx942: SuiteBuild, other_archs: dict[str, SuiteBuild]) -> None:
    meta = code_object_metadata(hsaco(bundle_of(gfx942, "matmul_fp16")))
    kernel = meta.kernel()
    kd = kernel.descriptor
    assert kd is not None
    assert kd.kernarg_size == kernel.kernarg_segment_size
    assert not kd.wavefront_size32 and kd.workgroup_id_enable[0]
    assert kernel.agpr_count and kernel.agpr_count > 0  # MFMA accumulators
    accum = kd.accum_offset("gfx942")
    assert accum is not None and accum + kernel.agpr_count <= kd.allocated_vgprs("gfx942")
    assert kd.allocated_vgprs("gfx942") >= kernel.vgpr_count
    assert kd.entry_address == kernel.code_address
    rdna = code_object_metadata(hsaco(bundle_of(other_archs["gfx1100"], "vector_add"))).kernel()
    assert rdna.descriptor is not None and rdna.descriptor.wavefront_size32 and rdna.wavefront_size == 32
    assert descriptor_problems(rdna, "gfx1100") == []


def test_compare_metadata_detects_register_changes(gfx942: SuiteBuild) -> None:
    bundle = bundle_of(gfx942, "vector_add")
    text = amdgcn(bundle)
    before = code_object_metadata(hsaco(bundle))
    vgprs = before.kernel().vgpr_count
    assert f".amdhsa_next_free_vgpr {vgprs}\n" in text and f".vgpr_count:     {vgprs}\n" in text
    edited = text.replace(f".amdhsa_next_free_vgpr {vgprs}\n", ".amdhsa_next_free_vgpr 40\n", 1).replace(
        f".vgpr_count:     {vgprs}\n", ".vgpr_count:     40\n", 1)
    after = code_object_metadata(reassemble_amdgcn(edited, "gfx942"))
    diffs = compare_metadata(before, after)
    kd = before.kernel().descriptor
    assert kd is not None
    assert {(d.field, d.kind, d.before, d.after) for d in diffs} == {
        ("vgpr_count", "resource", vgprs, 40),
        ("descriptor.allocated_vgprs", "resource", kd.allocated_vgprs("gfx942"), 40),
    }
    summary = summarize_differences(diffs)
    assert summary.startswith("ABI unchanged") and f"VGPRs {vgprs} → 40" in summary, summary


def test_compare_metadata_detects_kernarg_changes(gfx942: SuiteBuild) -> None:
    bundle = bundle_of(gfx942, "vector_add")
    text = amdgcn(bundle)
    before = code_object_metadata(hsaco(bundle))
    kernel = before.kernel()
    by_value = next(i for i, a in enumerate(kernel.args) if a.value_kind == "by_value")
    arg = kernel.args[by_value]
    # Widen the scalar argument from 4 to 8 bytes in the metadata, and say so in the descriptor.
    pattern = rf"(\.offset:\s+{arg.offset}\n\s+\.size:\s+){arg.size}(\n\s+\.value_kind:\s+by_value)"
    edited, n = re.subn(pattern, r"\g<1>8\g<2>", text, count=1)
    assert n == 1
    size = kernel.kernarg_segment_size
    edited = edited.replace(f".amdhsa_kernarg_size {size}\n", f".amdhsa_kernarg_size {size + 8}\n", 1)
    edited = edited.replace(f".kernarg_segment_size: {size}\n", f".kernarg_segment_size: {size + 8}\n", 1)
    after = code_object_metadata(reassemble_amdgcn(edited, "gfx942"))
    diffs = compare_metadata(before, after)
    abi = {(d.field, d.before, d.after) for d in diffs if d.kind == "abi"}
    assert abi == {
        (f"args[{by_value}].size", arg.size, 8),
        ("kernarg_segment_size", size, size + 8),
        ("descriptor.kernarg_size", size, size + 8),
    }
    assert not [d for d in diffs if d.kind != "abi"]
    assert summarize_differences(diffs).startswith("ABI: ")
    # The descriptor and the metadata still agree with each other; only the comparison can tell.
    assert descriptor_problems(after.kernel(), "gfx942") == []


def test_descriptor_problems_catch_an_inconsistent_object(gfx942: SuiteBuild) -> None:
    bundle = bundle_of(gfx942, "vector_add")
    text = amdgcn(bundle)
    vgprs = code_object_metadata(hsaco(bundle)).kernel().vgpr_count
    edited = text.replace(f".vgpr_count:     {vgprs}\n", ".vgpr_count:     64\n", 1)
    problems = descriptor_problems(code_object_metadata(reassemble_amdgcn(edited, "gfx942")).kernel(), "gfx942")
    assert len(problems) == 1 and "allocates 16 VGPRs, the code uses 64" in problems[0]


def test_msgpack_decoder() -> None:
    data = bytes([0x87,
                  0xA1, 0x61, 0x7F,                                   # "a": 127
                  0xA1, 0x62, 0xFF,                                   # "b": -1
                  0xA1, 0x63, 0xCD, 0x01, 0x00,                       # "c": 256
                  0xA1, 0x64, 0x93, 0xC3, 0xC2, 0xC0,                 # "d": [true, false, nil]
                  0xA1, 0x65, 0xD9, 0x03, 0x78, 0x79, 0x7A,           # "e": "xyz" (str8)
                  0xA1, 0x66, 0xC4, 0x02, 0x01, 0x02,                 # "f": b"\x01\x02"
                  0xA1, 0x67, 0xCB]) + struct.pack(">d", 1.5)         # "g": 1.5
    assert unpack_msgpack(data) == {"a": 127, "b": -1, "c": 256, "d": [True, False, None], "e": "xyz",
                                    "f": b"\x01\x02", "g": 1.5}
    assert unpack_msgpack(bytes([0xD2]) + struct.pack(">i", -70000)) == -70000
    assert unpack_msgpack(bytes([0xDE, 0x00, 0x01, 0xA1, 0x6B, 0x90])) == {"k": []}
    with pytest.raises(BundleError, match="truncated"):
        unpack_msgpack(bytes([0x92, 0x01]))
    with pytest.raises(BundleError, match="after the MessagePack value"):
        unpack_msgpack(bytes([0x01, 0x02]))
    with pytest.raises(BundleError, match="not a MessagePack type"):
        unpack_msgpack(bytes([0xC1]))


def test_metadata_errors() -> None:
    with pytest.raises(BundleError, match="not an ELF file"):
        code_object_metadata(b"\x00" * 64)


# -- ISA statistics ---------------------------------------------------------------------------------

def test_matmul_instruction_mix(gfx942: SuiteBuild) -> None:
    mix = amd_instruction_mix(hsaco(bundle_of(gfx942, "matmul_fp16")), "gfx942")
    cats = mix.by_category
    assert cats["mma"] > 0 and any(op.startswith("v_mfma") for op in mix.by_opcode)
    assert cats["load.global"] > 0 and cats["load.shared"] > 0 and cats["store.shared"] > 0
    assert cats["load.const"] > 0 and cats["barrier"] > 0 and cats["wait"] > 0 and cats["branch"] > 0
    assert cats["alu"] > 0 and cats["store.global"] > 0
    assert 128 in mix.widths["load.global"]  # global_load_dwordx4 of the A/B tiles
    assert mix.total == sum(cats.values()) == sum(mix.by_opcode.values())
    # Alignment fill (the 256-byte kernarg-preload block, trailing s_code_end fill) is not counted.
    assert mix.by_opcode["s_nop"] < 8


def test_vector_add_instruction_mix(gfx942: SuiteBuild, other_archs: dict[str, SuiteBuild]) -> None:
    mix = amd_instruction_mix(hsaco(bundle_of(gfx942, "vector_add")), "gfx942")
    assert mix.by_category["mma"] == 0 and mix.by_category["load.global"] > 0
    assert set(mix.widths["load.global"]) == {32}
    assert mix.by_category["store.global"] > 0 and mix.by_category["load.const"] > 0
    rdna = amd_instruction_mix(hsaco(bundle_of(other_archs["gfx1100"], "matmul_fp16")), "gfx1100")
    assert rdna.by_category["mma"] > 0 and any(op.startswith("v_wmma") for op in rdna.by_opcode)


@pytest.mark.parametrize(("mnemonic", "operands", "expected"), [
    ("global_load_dwordx4", "", ("load.global", 128)),
    ("global_load_dword", "", ("load.global", 32)),
    ("buffer_load_ushort", "", ("load.global", 16)),
    ("global_load_b128", "", ("load.global", 128)),
    ("buffer_load_dword", "v1, s[0:3], 0 offen lds", ("async_copy", 32)),
    ("global_load_lds_dwordx4", "", ("async_copy", 128)),
    ("global_store_short", "", ("store.global", 16)),
    ("buffer_store_dwordx2", "", ("store.global", 64)),
    ("ds_read_b128", "", ("load.shared", 128)),
    ("ds_read2_b64", "", ("load.shared", 128)),
    ("ds_read2st64_b32", "", ("load.shared", 64)),
    ("ds_load_u16", "", ("load.shared", 16)),
    ("ds_write_b8", "", ("store.shared", 8)),
    ("ds_store_b64", "", ("store.shared", 64)),
    ("scratch_load_dword", "", ("load.local", 32)),
    ("scratch_store_dwordx4", "", ("store.local", 128)),
    ("s_load_dwordx8", "", ("load.const", 256)),
    ("s_load_b64", "", ("load.const", 64)),
    ("v_mfma_f32_32x32x8_f16", "", ("mma", None)),
    ("v_wmma_f32_16x16x16_f16", "", ("mma", None)),
    ("s_cbranch_execz", "", ("branch", None)),
    ("s_branch", "", ("branch", None)),
    ("s_barrier", "", ("barrier", None)),
    ("s_barrier_wait", "", ("barrier", None)),
    ("s_waitcnt", "", ("wait", None)),
    ("s_wait_loadcnt", "", ("wait", None)),
    ("global_atomic_add_f32", "", ("atomic", None)),
    ("buffer_atomic_add_f32", "", ("atomic", None)),
    ("ds_add_u32", "", ("atomic", None)),
    ("ds_max_rtn_f32", "", ("atomic", None)),
    ("ds_bpermute_b32", "", ("other", None)),
    ("v_add_u32_e32", "", ("alu", None)),
    ("v_add_f32_dpp", "", ("alu", None)),
    ("s_mul_i32", "", ("alu", None)),
    ("s_nop", "", ("other", None)),
    ("s_endpgm", "", ("other", None)),
])
def test_classify_amd_opcode(mnemonic: str, operands: str, expected: tuple[str, int | None]) -> None:
    assert classify_amd_opcode(mnemonic, operands) == expected


# -- rocprofv3 --------------------------------------------------------------------------------------

KERNEL_TRACE_CSV = """\
"Kind","Agent_Id","Queue_Id","Stream_Id","Thread_Id","Dispatch_Id","Kernel_Id","Kernel_Name","Correlation_Id","Start_Timestamp","End_Timestamp","LDS_Block_Size","Scratch_Size","VGPR_Count","Accum_VGPR_Count","SGPR_Count","Workgroup_Size_X","Workgroup_Size_Y","Workgroup_Size_Z","Grid_Size_X","Grid_Size_Y","Grid_Size_Z"
"KERNEL_DISPATCH","Agent 4",1,1,8528,1,10,"matmul_kernel",1,1551874061244694,1551874061255734,16384,0,72,16,32,256,1,1,4096,16,1
"KERNEL_DISPATCH","Agent 4",1,1,8528,2,11,"vector_add_kernel",2,1551874061259214,1551874061260214,0,0,12,0,24,256,1,1,1048576,1,1
"KERNEL_DISPATCH","Agent 4",1,1,8528,3,10,"matmul_kernel",3,1551874061270254,1551874061279974,16384,0,72,16,32,256,1,1,4096,16,1
"""

COUNTER_CSV = """\
"Correlation_Id","Dispatch_Id","Agent_Id","Queue_Id","Process_Id","Thread_Id","Grid_Size","Kernel_Id","Kernel_Name","Workgroup_Size","LDS_Block_Size","Scratch_Size","VGPR_Count","Accum_VGPR_Count","SGPR_Count","Counter_Name","Counter_Value","Start_Timestamp","End_Timestamp"
1,1,4,1,2250,2250,65536,10,"matmul_kernel",256,16384,0,72,16,32,"SQ_WAVES",1024.000000,317095766765717,317095766775957
1,1,4,1,2250,2250,65536,10,"matmul_kernel",256,16384,0,72,16,32,"SQ_INSTS_VALU",4.5e+06,317095766765717,317095766775957
2,2,4,1,2250,2250,1048576,11,"vector_add_kernel",256,0,0,12,0,24,"SQ_WAVES",16384.000000,317095767013157,317095767022957
2,2,4,1,2250,2250,1048576,11,"vector_add_kernel",256,0,0,12,0,24,"SQ_INSTS_VALU",3.2e+05,317095767013157,317095767022957
"""

# An older release: no Kernel_Id, Accum_VGPR_Count or timestamps.
COUNTER_CSV_OLD = """\
"Correlation_Id","Dispatch_Id","Agent_Id","Queue_Id","Process_Id","Thread_Id","Grid_Size","Kernel_Name","Workgroup_Size","LDS_Block_Size","Scratch_Size","VGPR_Count","SGPR_Count","Counter_Name","Counter_Value"
0,1,1,139892123975680,5619,5619,1048576,"matrixTranspose(float*, float*, int)",16,0,0,8,16,"SQ_WAVES",65536
"""


@pytest.fixture
def fake_rocprofv3(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    tool = tmp_path / "bin" / "rocprofv3"
    tool.parent.mkdir()
    tool.write_text("#!/bin/sh\nexit 0\n")
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv(rocprof.ENV_VAR, str(tool))
    yield tool


def test_rocprofv3_discovery_honours_the_override(fake_rocprofv3: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    found = rocprof.find_rocprofv3()
    assert found.path == fake_rocprofv3 and found.origin == "env"
    monkeypatch.setenv(rocprof.ENV_VAR, str(fake_rocprofv3.parent / "missing"))
    with pytest.raises(rocprof.ToolError, match=rocprof.ENV_VAR):
        rocprof.find_rocprofv3()


def test_rocprofv3_kernel_trace_command(fake_rocprofv3: Path, tmp_path: Path) -> None:
    cmd = rocprof.kernel_trace_command(["python", "bench.py", "--n", "3"], tmp_path / "out", output_name="run1",
                                       kernel_include="matmul")
    assert cmd.argv == (str(fake_rocprofv3), "--kernel-trace", "--output-format", "csv", "-d", str(tmp_path / "out"),
                        "-o", "run1", "--kernel-include-regex", "matmul", "--", "python", "bench.py", "--n", "3")
    assert cmd.mode == "kernel-trace" and cmd.output_suffix == "kernel_trace.csv"
    with pytest.raises(ValueError, match="application"):
        rocprof.kernel_trace_command([], tmp_path)
    with pytest.raises(ValueError, match="file-name prefix"):
        rocprof.kernel_trace_command(["a"], tmp_path, output_name="x/y")


def test_rocprofv3_counter_command(tmp_path: Path) -> None:
    cmd = rocprof.counter_collection_command(["./app"], tmp_path, ["SQ_WAVES", "SQ_INSTS_VALU"], tool="/opt/rocm/bin/rocprofv3")
    assert cmd.argv == ("/opt/rocm/bin/rocprofv3", "--pmc", "SQ_WAVES", "SQ_INSTS_VALU", "--output-format", "csv",
                        "-d", str(tmp_path), "-o", "kstrata", "--", "./app")
    assert cmd.output_suffix == "counter_collection.csv"
    with pytest.raises(ValueError, match="at least one counter"):
        rocprof.counter_collection_command(["./app"], tmp_path, [], tool="rocprofv3")
    with pytest.raises(ValueError, match="not counter names"):
        rocprof.counter_collection_command(["./app"], tmp_path, ["SQ_WAVES; rm -rf /"], tool="rocprofv3")


def test_parse_kernel_trace(tmp_path: Path) -> None:
    out = tmp_path / "out" / "myhost"
    out.mkdir(parents=True)
    (out / "run1_kernel_trace.csv").write_text(KERNEL_TRACE_CSV)
    cmd = rocprof.kernel_trace_command(["./app"], tmp_path / "out", output_name="run1", tool="rocprofv3")
    dispatches = rocprof.read_kernel_trace(cmd)
    assert [d.dispatch_id for d in dispatches] == [1, 2, 3]
    first = dispatches[0]
    assert first.kernel_name == "matmul_kernel" and first.duration_ns == 11040
    assert first.grid == (4096, 16, 1) and first.workgroup == (256, 1, 1)
    assert (first.vgprs, first.agprs, first.sgprs, first.lds_bytes, first.agent) == (72, 16, 32, 16384, "Agent 4")
    assert rocprof.durations_by_kernel(dispatches) == {"matmul_kernel": [11040, 9720], "vector_add_kernel": [1000]}
    assert rocprof.parse_kernel_trace(KERNEL_TRACE_CSV) == dispatches  # CSV text works too


def test_parse_counter_collection(tmp_path: Path) -> None:
    (tmp_path / "pass_1").mkdir()
    (tmp_path / "pass_1" / "kstrata_counter_collection.csv").write_text(COUNTER_CSV)
    cmd = rocprof.counter_collection_command(["./app"], tmp_path, ["SQ_WAVES", "SQ_INSTS_VALU"], tool="rocprofv3")
    records = rocprof.read_counter_collection(cmd)
    assert [(r.dispatch_id, r.kernel_name) for r in records] == [(1, "matmul_kernel"), (2, "vector_add_kernel")]
    assert records[0].counters == {"SQ_WAVES": 1024.0, "SQ_INSTS_VALU": 4.5e6}
    assert records[0].duration_ns == 10240 and records[0].agprs == 16 and records[0].grid_size == 65536
    old = rocprof.parse_counter_collection(COUNTER_CSV_OLD)
    assert old[0].counters == {"SQ_WAVES": 65536.0} and old[0].duration_ns is None and old[0].kernel_id is None


def test_rocprof_output_errors(tmp_path: Path) -> None:
    with pytest.raises(rocprof.ProfileOutputError, match="Start_Timestamp"):
        rocprof.parse_kernel_trace('"Dispatch_Id","Kernel_Name"\n1,"k"\n')
    bad_time = KERNEL_TRACE_CSV.replace("1551874061255734", "1551874061000000")
    with pytest.raises(rocprof.ProfileOutputError, match=r"line 2: End_Timestamp .* is before"):
        rocprof.parse_kernel_trace(bad_time)
    bad_value = COUNTER_CSV.replace("1024.000000", "n/a")
    with pytest.raises(rocprof.ProfileOutputError, match="line 2: Counter_Value 'n/a'"):
        rocprof.parse_counter_collection(bad_value)
    twice = COUNTER_CSV.replace('"SQ_INSTS_VALU",4.5e+06', '"SQ_WAVES",4.5e+06')
    with pytest.raises(rocprof.ProfileOutputError, match="SQ_WAVES appears twice for dispatch 1"):
        rocprof.parse_counter_collection(twice)
    with pytest.raises(rocprof.ProfileOutputError, match="cannot read"):
        rocprof.parse_kernel_trace(tmp_path / "nope.csv")
    cmd = rocprof.counter_collection_command(["./app"], tmp_path / "empty", ["SQ_WAVES"], tool="rocprofv3")
    with pytest.raises(rocprof.ProfileOutputError, match="no counter values"):
        rocprof.read_counter_collection(cmd)


@pytest.mark.skipif(os.path.exists("/dev/kfd"), reason="this machine has an AMD GPU")
def test_rocprofv3_refuses_without_an_amd_gpu(tmp_path: Path) -> None:
    cmd = rocprof.kernel_trace_command(["./app"], tmp_path, tool="rocprofv3")
    with pytest.raises(rocprof.ProfilerUnavailable, match="needs an AMD GPU with ROCm") as info:
        rocprof.run_rocprofv3(cmd)
    assert info.value.repro and "--kernel-trace" in info.value.repro


def test_runtime_supplied_arguments_added_after_the_explicit_ones_are_not_an_abi_change() -> None:
    """A kernel that starts reading the grid size (`tl.num_programs`, interleaved-pid) gains `hidden_*` arguments
    after its explicit ones: the runtime lays those out from the metadata, the launcher passes the explicit ones
    only. Any change among the explicit arguments is still an ABI change."""
    from kstrata.backends.amd import KernelArg, _compare_args

    explicit = [KernelArg(0, 8, "global_buffer", "global", "x"), KernelArg(8, 4, "by_value", None, "n")]
    hidden = [KernelArg(16, 4, "hidden_block_count_x"), KernelArg(24, 8, "hidden_grid_dims")]
    grown = _compare_args("k", explicit, [*explicit, *hidden])
    assert grown and all(d.kind == "setup" for d in grown), grown
    assert all(d.kind == "setup" for d in _compare_args("k", [*explicit, *hidden], explicit))
    renamed = [explicit[0], KernelArg(8, 4, "by_value", None, "m")]
    assert any(d.kind == "abi" for d in _compare_args("k", explicit, [*renamed, *hidden]))
    another = [*explicit, KernelArg(16, 4, "by_value", None, "extra")]
    assert all(d.kind == "abi" for d in _compare_args("k", explicit, another))
