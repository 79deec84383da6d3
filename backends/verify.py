"""`kstrata verify ORIGINAL CANDIDATE`: every equivalence check that applies to the levels that differ.

Static checks, on any machine: the runtime signature is unchanged; each differing level is accepted by
the tool that consumes it (Triton's parser for TTIR/TTGIR through the typed dialects, LLVM for LLVM IR,
ptxas for PTX, llvm-mc + ld.lld for AMDGCN); the launch ABI is unchanged (PTX entry parameters and
launch bounds, or the code object's kernarg layout and wave size); resources before and after.

Dynamic checks need a launch record (`kstrata record`, or a suite kernel's launch). Each runs the
original and the candidate on identical input sets (`replay.input_sets`: random seeds, edge values,
the recorded snapshot) in a child process with a timeout, so that a fault or a hang in the candidate is
a failed verdict and not a crash of the verifier; outputs must match byte for byte (any NaN matches any
NaN) unless the candidate declares a `Tolerance`:

- on the CPU, for a differing TTIR or TTGIR: our interpreter (`kstrata.ir.interp`) runs both texts;
- on an NVIDIA GPU: a differential run of both binaries, a determinism re-run of the candidate, and
  optionally the candidate under compute-sanitizer (memcheck, racecheck, synccheck, initcheck).

AMD candidates get the static checks (llvm-mc + ld.lld accept the AMDGCN, kernarg layout, wave size,
resources, `s_waitcnt` hazards) and the interpreter. Their differential run takes the same path through
Triton's HIP launcher under a ROCm build of torch; it is written but has never run — the project has no
AMD GPU — and without one the verdict says that the run needs an AMD GPU.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kstrata.ir.bundle import KernelBundle
from kstrata.ir.errors import KstrataError

from .amd_hazards import check_waitcnt_hazards
from .checks import amd_metadata_changes, binary, llir_accepted, mlir_accepted, ptx_entry_changes
from .dynamic import Outcome, run_jobs, verdict
from .replay import InputSet, input_sets

if TYPE_CHECKING:
    from kstrata.ir.launch import LaunchRecord as LaunchRecordT
    from kstrata.ir.tolerance import Tolerance


@dataclass
class Check:
    name: str
    level: str
    verdict: str  # "pass", "fail", "skipped"
    detail: str = ""


@dataclass
class VerifyReport:
    kernel: str
    target: str
    differing_levels: list[str]
    checks: list[Check] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not any(c.verdict == "fail" for c in self.checks)

    def to_json(self) -> dict[str, Any]:
        return {"kernel": self.kernel, "target": self.target, "ok": self.ok, "differing_levels": self.differing_levels,
                "checks": [c.__dict__ for c in self.checks]}


def _add(report: VerifyReport, name: str, level: str, fn: Any) -> None:
    from .tools import ToolNotFound

    try:
        detail = fn()
        report.checks.append(Check(name, level, "pass", detail or ""))
    except ToolNotFound as exc:  # a check this machine cannot run says so; it is not the candidate's fault
        report.checks.append(Check(name, level, "skipped", f"cannot run here: {exc}"))
    except Exception as exc:  # a failed check is a verdict, not a crash
        report.checks.append(Check(name, level, "fail", f"{type(exc).__name__}: {exc}"))


def _accepts_mlir(text: str, level: str, bundle: KernelBundle) -> str:
    from kstrata.ir.triton_ir import parse_triton

    parse_triton(text, bundle.origin)
    mlir_accepted(bundle.target, level, text)
    return "typed dialects and Triton's parser accept it"


def _accepts_llir(text: str) -> str:
    llir_accepted(text)
    return "LLVM verifies it"


def _ptx_abi(original: KernelBundle, candidate: KernelBundle) -> str:
    changed = ptx_entry_changes(original.text("ptx"), candidate.text("ptx"), launch_bounds=False)
    if changed:
        raise KstrataError("PTX entry changed: " + "; ".join(changed))
    bounds = ptx_entry_changes(original.text("ptx"), candidate.text("ptx"))
    if not bounds:
        return "entry name, parameters and launch bounds unchanged"
    # A pass may change the block size on purpose (num-warps); the launcher takes the block size from
    # the candidate's metadata, so the launch bounds must agree with it.
    from .ptx import parse_ptx

    threads = (candidate.num_warps or 0) * candidate.target.warp_size
    reqntid = parse_ptx(candidate.text("ptx")).entry().reqntid
    if candidate.num_warps != original.num_warps and reqntid and reqntid[0] == threads:
        return (f"entry name and parameters unchanged; block size {original.num_warps} -> {candidate.num_warps} "
                f"warps, and .reqntid {reqntid} matches it")
    raise KstrataError(f"PTX entry changed: {'; '.join(bounds)} (the candidate's metadata launches "
                       f"{candidate.num_warps} warps = {threads} threads)")


def _amd_abi(original: KernelBundle, candidate: KernelBundle) -> str:
    abi, other = amd_metadata_changes(binary(original.level("hsaco")), binary(candidate.level("hsaco")))
    if abi:
        raise KstrataError("code object ABI changed: " + "; ".join(abi))
    return "kernarg layout and wave size unchanged" + (f"; {'; '.join(other)}" if other else "")


def _resources(original: KernelBundle, candidate: KernelBundle) -> str:
    from .resources import resource_usage

    a, b = resource_usage(original).to_json(), resource_usage(candidate).to_json()
    changed = [f"{k} {a[k]} -> {b[k]}" for k in a if k != "source" and a[k] != b[k]]
    if original.shared != candidate.shared:
        changed.append(f"Triton shared {original.shared} -> {candidate.shared}")
    return "; ".join(changed) or "unchanged"


def verify_static(original: KernelBundle, candidate: KernelBundle) -> VerifyReport:
    """The static checks for the levels in which `candidate` differs from `original`."""
    if original.target != candidate.target:
        raise KstrataError(f"the bundles are for different targets: {original.target} and {candidate.target}")
    levels = [lv for lv in original.target.levels[1:]
              if lv in original.levels and lv in candidate.levels and original.levels[lv] != candidate.levels[lv]]
    report = VerifyReport(original.name, str(original.target), levels)
    _add(report, "signature", "abi", lambda: _same_signature(original, candidate))
    for lv in levels:
        if lv in ("ttir", "ttgir"):
            _add(report, "accepted", lv, lambda lv=lv: _accepts_mlir(candidate.text(lv), lv, candidate))
        elif lv == "llir":
            _add(report, "accepted", lv, lambda: _accepts_llir(candidate.text("llir")))
        elif lv == "ptx":
            _add(report, "accepted", lv, lambda: _ptxas_accepts(candidate))
        elif lv == "amdgcn":
            _add(report, "accepted", lv, lambda: _assembles(candidate))
            _add(report, "waitcnt-hazards", lv,
                 lambda: check_waitcnt_hazards(original.text("amdgcn"), candidate.text("amdgcn")))
    binary = original.target.binary_level
    if levels:
        if original.target.backend == "cuda":
            _add(report, "abi", "ptx", lambda: _ptx_abi(original, candidate))
        else:
            _add(report, "abi", "hsaco", lambda: _amd_abi(original, candidate))
        _add(report, "resources", binary, lambda: _resources(original, candidate))
    return report


def load_original(path: str | Path, target: str | None = None) -> KernelBundle:
    """The original kernel: a cache or dump entry, or a `.ttir`/`.ttgir` file compiled for `target`
    (default: the module's own target, and the metadata beside the file)."""
    from kstrata.ir.files import user_path
    from kstrata.ir.triton_layout import compile_ir_file, load_any

    p = user_path(path)
    if p.is_file() and p.suffix in (".ttir", ".ttgir"):
        return compile_ir_file(p, target)
    bundles, errors = load_any(p)
    if errors:
        raise errors[0]
    return bundles[0]


def load_candidate(path: str | Path, original: KernelBundle) -> KernelBundle:
    """A candidate from a cache or dump entry, an override entry (only the levels it replaces, laid over
    the original's, with the metadata its `kstrata-candidate.json` says the rewrite changed), or one IR
    file (`.ttir`, `.ttgir`, `.llir`, `.ptx`, `.amdgcn`: that level replaced, the levels below rebuilt)."""
    import dataclasses

    from kstrata.ir.candidate import CANDIDATE_FILE, CandidateInfo
    from kstrata.ir.files import read_bytes, read_ir_text, read_text, user_path
    from kstrata.ir.triton_layout import load_any

    p = user_path(path)
    level = p.suffix.lstrip(".")
    if p.is_file() and level in original.target.levels[1:-1]:
        # one IR file: the original with that level replaced and every level below rebuilt
        from .rebuild import rebuild_from

        text = read_ir_text(p, f"{level} file")
        if level in ("ttir", "ttgir"):  # our parser first: Triton's C++ one segfaults on some bad IR (an empty file)
            from kstrata.ir.triton_ir import parse_triton

            parse_triton(text, p, verify=False)
        candidate = rebuild_from(original, level, text)
        return dataclasses.replace(candidate, origin=str(p))
    try:
        bundles, errors = load_any(p)
        if bundles and not errors:
            return bundles[0]
    except KstrataError:
        pass
    if not p.is_dir():
        raise KstrataError("not a kernel entry (cache, dump or override directory) or an IR file of one of the "
                           f"levels {', '.join(original.target.levels[1:-1])}", path=p)
    levels: dict[str, Any] = {}
    for f in p.iterdir():
        stem, _, ext = f.name.rpartition(".")
        if stem == original.name and ext in original.target.levels:
            levels[ext] = read_bytes(f, f"{ext} file") if ext in ("cubin", "hsaco") else read_text(f, f"{ext} file")
    if not levels:
        raise KstrataError(f"no level of kernel {original.name} in this directory", path=p)
    info = CandidateInfo.read(p)
    if info is not None and info.kernel != original.name:
        raise KstrataError(f"{CANDIDATE_FILE} describes kernel {info.kernel}, not {original.name}", path=p)
    metadata = {**original.metadata, **(info.metadata if info else {})}
    if "ttgir" in levels:  # Triton takes the warp count of what it builds from the TTGIR's module attribute
        warps = re.search(r'"ttg\.(?:total-)?num-warps"\s*=\s*(\d+)', levels["ttgir"])
        if warps:
            metadata["num_warps"] = int(warps.group(1))
    return dataclasses.replace(original, levels={**original.levels, **levels}, metadata=metadata, origin=str(p))


def _same_signature(original: KernelBundle, candidate: KernelBundle) -> str:
    if original.signature != candidate.signature:
        raise KstrataError(f"signature changed: {original.signature} -> {candidate.signature}")
    return "unchanged"


def _assembles(candidate: KernelBundle) -> str:
    from .amd import reassemble_amdgcn

    reassemble_amdgcn(candidate.text("amdgcn"), str(candidate.target.arch))
    return "llvm-mc and ld.lld accept it"


def _ptxas_accepts(candidate: KernelBundle) -> str:
    from .nvidia import rebuild_cubin

    rebuild_cubin(candidate)
    return "ptxas accepts it"


def _gpu_available(backend: str) -> bool:
    """Whether torch sees a GPU of the kernel's vendor (a ROCm build of torch for `hip` kernels)."""
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available() and (torch.version.hip is not None) == (backend == "hip")


SANITIZER_TOOLS = ("memcheck", "racecheck", "synccheck", "initcheck")


def _sanitizer_binary() -> str:
    import os
    import shutil

    found = shutil.which("compute-sanitizer")
    for root in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if not found and root and Path(root, "bin", "compute-sanitizer").exists():
            found = str(Path(root, "bin", "compute-sanitizer"))
    if not found:
        raise KstrataError("compute-sanitizer not found (put it on PATH or set CUDA_HOME)")
    return found


def verify(original: KernelBundle, candidate: KernelBundle, launch: LaunchRecordT | None = None, *, seeds: int = 2,
           device: str = "auto", tolerance: Tolerance | str | None = None, sanitizer: str | None = None,
           timeout: float = 120.0, launch_dir: Path | None = None, on_check: Any = None) -> VerifyReport:
    """Every check that applies: static ones always, dynamic ones with a launch record.

    `device`: "cpu" (static + interpreter), "cuda" (also the GPU differential run; an error without
    an NVIDIA GPU) or "auto" (the GPU when there is one). `tolerance` loosens floating comparisons
    (a `Tolerance` or its spelling). `launch_dir` is where the record's snapshots are. `on_check(check)`
    is called as each dynamic check finishes (progress for long runs).
    """
    from kstrata.ir.tolerance import Tolerance

    if device not in ("auto", "cpu", "cuda"):
        raise KstrataError(f"unknown device {device!r} (auto, cpu or cuda)")
    if sanitizer is not None and sanitizer not in SANITIZER_TOOLS:
        raise KstrataError(f"unknown sanitizer tool {sanitizer!r} ({', '.join(SANITIZER_TOOLS)})")
    tol = Tolerance.parse(tolerance) if isinstance(tolerance, str) else tolerance
    report = verify_static(original, candidate)
    if tol is not None and not tol.exact:
        report.checks.append(Check("tolerance", "floating", "pass", f"declared: {tol.spelling()}"
                                   + (f" ({tol.why})" if tol.why else "")))
    if launch is None:
        if report.differing_levels:
            report.checks.append(Check("dynamic", "all", "skipped",
                                       "no launch record: give one (kstrata record) for the interpreter and GPU runs"))
        return report
    launch.check_against(original.params)
    launch.check_against(candidate.params)
    gpu = _gpu_available(original.target.backend)
    if device == "cuda" and original.target.backend == "cuda" and not gpu:
        raise KstrataError("--device cuda: no NVIDIA GPU visible to torch here")
    sets = input_sets(launch, seeds, launch_dir)
    launch_name = f"{launch.kernel} grid {list(launch.grid)}"

    def add(check: Check) -> None:
        report.checks.append(check)
        if on_check is not None:
            on_check(check)

    job_base = {"original": original, "candidate": candidate, "record": launch, "tolerance": tol, "base_dir": launch_dir}
    planned: list[tuple[str, str, InputSet, dict[str, Any]]] = []  # (check name, level, input set, job)
    for level in ("ttir", "ttgir"):
        if level in report.differing_levels:
            planned += [(f"interpreter: {s.label}", level, s, {**job_base, "kind": "interp", "level": level,
                                                                "input_set": s}) for s in sets]
    binary_level = original.target.binary_level
    gpu_runs = False
    vendor = "an NVIDIA" if original.target.backend == "cuda" else "an AMD"
    if binary_level in report.differing_levels:
        if device == "cpu" or not gpu:
            # The AMD path (Triton's HIP launcher under a ROCm torch) is written but has never run: the
            # project has no AMD GPU.
            add(Check("differential", binary_level, "skipped", f"the GPU differential run needs {vendor} GPU"
                      + (" (--device cpu)" if device == "cpu" else " (none here)")))
        else:
            gpu_runs = True
            first_random = True
            for s in sets:
                runs = 20 if first_random and s.mode == "random" else 0  # time the pair once
                first_random = first_random and runs == 0
                planned.append((f"differential: {s.label}", binary_level, s,
                                {**job_base, "kind": "gpu", "runs": runs, "input_set": s}))
            again = next((s for s in sets if s.mode == "random"), sets[0])
            planned.append(("determinism", binary_level, again,
                            {**job_base, "original": candidate, "kind": "gpu", "runs": 0, "input_set": again}))

    def judged(index: int, outcome: Outcome) -> None:
        name, level, iset, _ = planned[index]
        verdict_, detail = verdict(name, level, iset, outcome, timeout, launch_name)
        if name == "determinism" and verdict_ == "pass":
            detail = "the candidate gives the same bytes twice"
        add(Check(name, level, verdict_, detail))

    run_jobs([job for *_, job in planned], timeout, on_outcome=judged)
    if gpu_runs and sanitizer is not None and original.target.backend != "cuda":
        add(Check(f"compute-sanitizer {sanitizer}", binary_level, "skipped", "compute-sanitizer runs NVIDIA kernels only"))
    elif gpu_runs and sanitizer is not None:
        wrapper = [_sanitizer_binary(), "--tool", sanitizer, "--error-exitcode", "86", "--print-limit", "5"]
        iset = next((s for s in sets if s.mode == "random"), sets[0])
        outcome = run_jobs([{**job_base, "kind": "sanitize", "input_set": iset}], timeout * 5, wrapper)[0]
        name = f"compute-sanitizer {sanitizer}"
        if outcome.status == "ran" and not outcome.payload.get("returncode"):
            add(Check(name, binary_level, "pass", "no errors reported"))
        else:
            errors = [ln.strip() for ln in outcome.output.splitlines() if ln.startswith("=========") and
                      ("ERROR" in ln.upper() or "Invalid" in ln or "hazard" in ln.lower())][:6]
            add(Check(name, binary_level, "fail", f"{outcome.status} (exit {outcome.payload.get('returncode')}): "
                      + (" | ".join(errors) or outcome.output.strip()[-600:])))
    return report



def declared_tolerance(candidate: str | Path) -> str | None:
    """The tolerance a candidate entry declares in its `kstrata-candidate.json`, if any."""
    from kstrata.ir.candidate import CandidateInfo

    p = Path(candidate)
    info = CandidateInfo.read(p) if p.is_dir() else None
    return info.tolerance if info is not None else None
