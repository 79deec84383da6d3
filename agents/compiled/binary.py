"""`kstrata optimize KERNEL.hsaco|KERNEL.cubin --launches RECORD`: a bare code object, edited by in-place patches
only.

Without the kernel's assembly the only edits allowed are same-size rewrites of instructions in the
machine code (`backends/binpatch.py` applies them and checks them: anchors, alignment, the section layout,
the number of decoded instructions, the expected text). The patches are generated, not hand-written:

- **non-temporal hints**: every global/buffer store (and, in a second candidate, load) without `nt` is
  disassembled, re-encoded by `llvm-mc` with `nt` added, and kept only when the re-encoding of the
  instruction *as disassembled* gives back its original bytes (the disassembler and the assembler agree
  on it) and the new encoding has the same length. `nt` is a cache-policy bit: it changes no value.

Each patched hsaco must keep the code object's metadata (kernarg layout, descriptor, registers, LDS) and
the original's `s_waitcnt` hazard profile; it is ranked by the llvm-mca surrogate of its function's
instructions (the machine code has no labels, so the window is the whole function) and written under
`OUT/unmeasured/<target>/<kernel>/<rank>/` with the patch (`patch.json`, reviewable and re-appliable) and
`surrogate.json`, marked unmeasured: its differential run and timing need an AMD GPU. The surrogate does
not model cache policy, so it ranks these candidates equal to the original; it is reported, not used to
pretend a gain.

A bare cubin: NVIDIA publishes no SASS assembler, so the one edit generated is the one whose encoding can be
learned from ptxas itself: the L2 evict-first policy on global loads and stores (`backends/sass_policy.py`:
the bits `.cs` flips in a probe kernel assembled for the cubin's architecture, applied only where the
policy bits hold the plain value). Each patched instruction must disassemble to its old text with `.EF`
added. The patched cubin is written under `OUT/unmeasured/cuda-<arch>/<kernel>/<rank>/` with `patch.json`,
unmeasured: kstrata launches kernels from Triton cache entries, and a bare cubin's differential run and
timing are not built.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kstrata.ir.errors import KstrataError
from kstrata.ir.files import make_dir

REPORT_SCHEMA = "kstrata.optimize-binary/1"
_MEMORY = re.compile(r"^(global|buffer)_(load|store)_")


@dataclass
class BinaryReport:
    binary: str
    kernel: str
    target: str
    launches: list[str]
    out: str
    candidates: list[dict[str, Any]] = field(default_factory=list)
    base_surrogate: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {"schema": REPORT_SCHEMA, **self.__dict__}


def _encode(lines: list[str], arch: str) -> list[bytes | None]:
    """The encoding of each AMDGCN instruction line by `llvm-mc -show-encoding` (None where it fails): one
    call for all, and one per line when a line is rejected (so that it cannot shift the others)."""
    from kstrata.backends.amd import find_amd_tool
    from kstrata.backends.tools import ToolError, run_tool

    mc = find_amd_tool("llvm-mc")

    def run(text: str) -> list[bytes] | None:
        try:
            out = run_tool([mc.path, "-triple=amdgcn-amd-amdhsa", f"-mcpu={arch}", "-show-encoding"],
                           input=text.encode()).stdout
        except ToolError:
            return None
        return [bytes(int(b, 16) for b in m.group(1).split(",")) for m in re.finditer(r"; encoding: \[([^\]]*)\]", out)]

    batch = run("".join(f"\t{line}\n" for line in lines))
    if batch is not None and len(batch) == len(lines):
        return list(batch)
    out: list[bytes | None] = []
    for line in lines:
        one = run(f"\t{line}\n")
        out.append(one[0] if one and len(one) == 1 else None)
    return out


def nontemporal_patch(hsaco: bytes, arch: str, *, stores: bool = True, loads: bool = False) -> tuple[Any, list[str]]:
    """A `BinaryPatch` adding `nt` to the chosen memory instructions, and why any were left out."""
    from kstrata.backends.amd import disassemble_hsaco
    from kstrata.backends.binpatch import BinaryEdit, BinaryPatch
    from kstrata.backends.elf import read_elf

    base = read_elf(hsaco).section(".text").addr
    chosen = []
    for ins in disassemble_hsaco(hsaco, arch):
        m = _MEMORY.match(ins.mnemonic)
        if not m or re.search(r"(?<!\w)(nt|lds)(?!\w)", ins.operands):
            continue
        if (m.group(2) == "store" and stores) or (m.group(2) == "load" and loads):
            chosen.append(ins)
    if not chosen:
        return None, ["no global/buffer memory instruction of the chosen kinds without nt"]
    plain = _encode([i.text for i in chosen], arch)
    hinted = _encode([f"{i.text} nt" for i in chosen], arch)
    edits, skipped = [], []
    for ins, again, new in zip(chosen, plain, hinted, strict=True):
        old = b"".join(w.to_bytes(4, "little") for w in ins.words)
        if again != old:
            skipped.append(f"{ins.text} at {ins.address:#x}: its disassembly does not re-encode to its bytes")
        elif new is None or len(new) != len(old):
            skipped.append(f"{ins.text} at {ins.address:#x}: no same-size encoding with nt")
        else:
            edits.append(BinaryEdit(".text", ins.address - base, old, new, expect=" nt"))
    if not edits:
        return None, skipped
    kinds = "+".join(k for k, on in (("stores", stores), ("loads", loads)) if on)
    return BinaryPatch(tuple(edits), description=f"nt on {len(edits)} global/buffer {kinds} (in place)"), skipped


def _records_for(launches: Path, kernel: str) -> list[str]:
    from kstrata.ir.launch import LaunchRecord

    files = sorted(launches.glob("*.json")) if launches.is_dir() else [launches]
    found = []
    for f in files:
        try:
            if LaunchRecord.load(f).kernel == kernel:
                found.append(str(f))
        except KstrataError:
            continue
    return found


def _surrogate(hsaco: bytes, arch: str, kernel_meta: Any) -> dict[str, Any]:
    from kstrata.backends.amd import disassemble_hsaco
    from kstrata.backends.mca import mca_estimate

    from .surrogate import SIMDS_PER_CU

    est = mca_estimate([i.text for i in disassemble_hsaco(hsaco, arch)], mcpu=arch)
    # waves per workgroup from the kernel's largest workgroup (the launch record's block would be exact)
    size = int(getattr(kernel_meta, "max_flat_workgroup_size", 0) or 256)
    waves = max(1, size // max(1, int(getattr(kernel_meta, "wavefront_size", 64) or 64)))
    per_simd = max(1.0, waves / SIMDS_PER_CU)
    return {"cost": est.cycles_per_iteration * per_simd, "cycles_per_iteration": est.cycles_per_iteration,
            "window": "the whole function (machine code has no loop labels)", "mca": est.to_json()}


def optimize_binary(path: Path, launches: Path, out: Path, *, write_top: int = 3) -> BinaryReport:
    """See the module docstring. A user error (no record for the kernel, a cubin) raises `KstrataError`."""
    from kstrata.agents.optimize.trajectory import write_atomic
    from kstrata.agents.run_passes import _write_dir_atomically
    from kstrata.backends.amd import code_object_metadata, compare_metadata, hsaco_arch
    from kstrata.backends.amd_hazards import waitcnt_hazards

    from .program import bare_binary_kind

    start = time.perf_counter()
    kind = bare_binary_kind(path)
    if kind == "cubin":
        return _optimize_cubin(path, launches, out, start, write_top)
    if kind != "hsaco":
        raise KstrataError(f"{path}: not a GPU code object")
    hsaco = path.read_bytes()
    arch = hsaco_arch(hsaco) or "gfx942"
    meta = code_object_metadata(hsaco, origin=str(path))
    if len(meta.kernels) != 1:
        raise KstrataError(f"{path}: holds {len(meta.kernels)} kernels; kstrata optimizes code objects of one kernel")
    kernel = next(iter(meta.kernels))
    records = _records_for(launches, kernel)
    if not records:
        raise KstrataError(f"{launches}: no launch record of kernel {kernel} (record the program with kstrata record)")
    report = BinaryReport(str(path), kernel, f"hip:{arch}", records, str(out))
    make_dir(out, "--out directory")  # once the input is known good: a refused one leaves nothing
    report.notes.append("in-place patches only: the kernel's assembly is not at hand")
    try:
        report.base_surrogate = _surrogate(hsaco, arch, meta.kernel(kernel))
    except KstrataError as exc:
        report.notes.append(f"the llvm-mca surrogate failed on the original: {exc}")
    base_hazards = len(waitcnt_hazards(_listing_text(hsaco, arch)))
    written = 0
    for stores, loads in ((True, False), (False, True), (True, True)):
        patch, skipped = nontemporal_patch(hsaco, arch, stores=stores, loads=loads)
        cand: dict[str, Any] = {"edit": f"nontemporal{{stores={str(stores).lower()} loads={str(loads).lower()}}}",
                                "skipped_instructions": skipped}
        report.candidates.append(cand)
        applied = _applied(hsaco, patch, "amd", arch, cand)
        if applied is None or patch is None:
            continue
        patched, edits = applied
        diffs = compare_metadata(meta, code_object_metadata(patched))
        if diffs:
            cand.update(status="different", reason=f"the code object's metadata changed: {diffs[0]}")
            continue
        if len(waitcnt_hazards(_listing_text(patched, arch))) != base_hazards:
            cand.update(status="different", reason="the s_waitcnt hazard profile changed")
            continue
        cand.update(status="unproven", edits=len(edits), unmeasured="no AMD GPU here: the differential run and "
                    "timing run when one is present", patch=patch.to_json())
        try:
            cand["surrogate"] = _surrogate(patched, arch, meta.kernel(kernel))
        except KstrataError as exc:
            cand["surrogate"] = {"error": str(exc)}
        if written < write_top:
            written += 1
            where = out / "unmeasured" / f"hip-{arch}" / kernel / str(written)
            _write_dir_atomically(where, {
                f"{kernel}.hsaco": patched,
                "patch.json": (json.dumps(patch.to_json(), indent=1) + "\n").encode(),
                "surrogate.json": (json.dumps({"status": "unmeasured", "reason": cand["unmeasured"], "launches": records,
                                               "candidate": cand["surrogate"], "original": report.base_surrogate},
                                              indent=1) + "\n").encode()})
            cand["written"] = str(where)
    report.seconds = time.perf_counter() - start
    write_atomic(out / "optimize-binary.json", json.dumps(report.to_json(), indent=1, default=str) + "\n")
    return report


def _applied(binary: bytes, patch: Any, vendor: str, arch: str,
             cand: dict[str, Any]) -> tuple[bytes, list[dict[str, Any]]] | None:
    """`patch` applied to `binary` with the binary-patch checks (`backends/binpatch.py`), or None with `cand`'s
    status saying why not (nothing to patch, or a check failed)."""
    from kstrata.backends.binpatch import apply_binary_patch

    if patch is None:
        cand["status"] = "nothing to patch"
        return None
    try:
        return apply_binary_patch(binary, patch, vendor, arch)
    except KstrataError as exc:
        cand.update(status="failed", reason=str(exc))
        return None


def _optimize_cubin(path: Path, launches: Path, out: Path, start: float, write_top: int) -> BinaryReport:
    """A bare cubin: evict-first patches of its global loads, stores, or both (`backends/sass_policy.py`: the
    policy field learned from ptxas for its architecture), each applied with the binary-patch checks and its
    instructions disassembled back to their old text with `.EF` added; written unmeasured."""
    from kstrata.agents.optimize.trajectory import write_atomic
    from kstrata.agents.run_passes import _write_dir_atomically
    from kstrata.backends.binpatch import nvidia_listing
    from kstrata.backends.sass_policy import check_evict_first, cubin_arch, evict_first_patch

    cubin = path.read_bytes()
    try:
        functions = list(nvidia_listing(cubin))
        arch = cubin_arch(cubin)
    except KstrataError as exc:
        raise KstrataError(f"{path}: not a cubin kstrata can disassemble ({exc})") from None
    if len(functions) != 1:
        raise KstrataError(f"{path}: holds {len(functions)} kernels; kstrata optimizes cubins of one kernel")
    kernel = functions[0]
    records = _records_for(launches, kernel)
    if not records:
        raise KstrataError(f"{launches}: no launch record of kernel {kernel} (record the program with kstrata record)")
    capability = "".join(ch for ch in arch if ch.isdigit())  # sm_90a: cuda:90
    report = BinaryReport(str(path), kernel, f"cuda:{capability}", records, str(out))
    make_dir(out, "--out directory")  # once the input is known good: a refused one leaves nothing
    report.notes.append("in-place patches only: the kernel's PTX is not at hand; the SASS policy field is learned "
                        f"from ptxas's own encodings for {arch}")
    written = 0
    for stores, loads in ((True, False), (False, True), (True, True)):
        cand: dict[str, Any] = {"edit": f"evict-first{{stores={str(stores).lower()} loads={str(loads).lower()}}}"}
        report.candidates.append(cand)
        try:
            patch, skipped = evict_first_patch(cubin, loads=loads, stores=stores, arch=arch)
        except KstrataError as exc:
            cand.update(status="failed", reason=str(exc))
            continue
        cand["skipped_instructions"] = skipped
        applied = _applied(cubin, patch, "nvidia", arch, cand)
        if applied is None or patch is None:
            continue
        patched, edits = applied
        wrong = check_evict_first(edits)
        if wrong:
            cand.update(status="different", reason=f"an instruction did not disassemble to its evict-first form: {wrong}")
            continue
        cand.update(status="unproven", edits=len(edits), patch=patch.to_json(),
                    unmeasured="a bare cubin's differential run and timing are not built yet (kstrata launches "
                    "kernels from Triton cache entries; the patched cubin is written for the user to run)")
        if written < write_top:
            written += 1
            where = out / "unmeasured" / report.target.replace(":", "-") / kernel / str(written)
            _write_dir_atomically(where, {
                f"{kernel}.cubin": patched,
                "patch.json": (json.dumps(patch.to_json(), indent=1) + "\n").encode(),
                "status.json": (json.dumps({"status": "unmeasured", "reason": cand["unmeasured"], "launches": records,
                                            "instructions": edits}, indent=1) + "\n").encode()})
            cand["written"] = str(where)
    report.seconds = time.perf_counter() - start
    write_atomic(out / "optimize-binary.json", json.dumps(report.to_json(), indent=1, default=str) + "\n")
    return report


def _listing_text(hsaco: bytes, arch: str) -> str:
    """The machine code as AMDGCN text the hazard check reads (one function; branches keep their offsets as
    operands, so the check sees straight-line code: the same on both sides)."""
    from kstrata.backends.amd import disassemble_hsaco

    body = "\n".join(f"\t{i.text}" for i in disassemble_hsaco(hsaco, arch))
    return f"\t.type\tk,@function\nk:\n{body}\n.Lfunc_end0:\n"
