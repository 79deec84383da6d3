"""`kstrata verify ORIGINAL CANDIDATE`: every equivalence check that applies to the levels that differ.

Static checks, on any machine: the runtime signature is unchanged; each differing level is accepted by
the tool that consumes it (Triton's parser for TTIR/TTGIR through the typed dialects, LLVM for LLVM IR,
ptxas for PTX, llvm-mc + ld.lld for AMDGCN); the launch ABI is unchanged (PTX entry parameters and
launch bounds, or the code object's kernarg layout and wave size); resources before and after.

Dynamic check, on an NVIDIA GPU with a launch record (`--launch`): a differential run of the original
and the candidate binary on identical replays of the recorded launch (several seeds), in a child process
with a timeout, so that an illegal address or a hang in the candidate is a failed verdict and not a
crash; outputs must match byte for byte unless the candidate declares a tolerance.

Not yet: the CPU interpreter for TTIR/TTGIR (the dynamic check without a GPU) and AMD GPU runs; the
verdict says so for the levels where they would apply.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kstrata.ir.bundle import KernelBundle
from kstrata.ir.errors import KstrataError

from .checks import amd_metadata_changes, binary, llir_accepted, mlir_accepted, ptx_entry_changes


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
    try:
        detail = fn()
        report.checks.append(Check(name, level, "pass", detail or ""))
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
    changed = ptx_entry_changes(original.text("ptx"), candidate.text("ptx"))
    if changed:
        raise KstrataError("PTX entry changed: " + "; ".join(changed))
    return "entry name, parameters and launch bounds unchanged"


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
            report.checks.append(Check("interpreter", lv, "skipped", "the CPU interpreter for Triton IR is not built yet"))
        elif lv == "llir":
            _add(report, "accepted", lv, lambda: _accepts_llir(candidate.text("llir")))
        elif lv == "ptx":
            _add(report, "accepted", lv, lambda: _ptxas_accepts(candidate))
    binary = original.target.binary_level
    if levels:
        if original.target.backend == "cuda":
            _add(report, "abi", "ptx", lambda: _ptx_abi(original, candidate))
        else:
            _add(report, "abi", "hsaco", lambda: _amd_abi(original, candidate))
            report.checks.append(Check("differential", "hsaco", "skipped", "running AMD binaries needs an AMD GPU"))
        _add(report, "resources", binary, lambda: _resources(original, candidate))
    return report


def load_candidate(path: str | Path, original: KernelBundle) -> KernelBundle:
    """A candidate from a cache or dump entry, or from an override entry (only the levels it replaces,
    laid over the original's)."""
    import dataclasses

    from kstrata.ir.triton_layout import load_any

    p = Path(path)
    try:
        bundles, errors = load_any(p)
        if bundles and not errors:
            return bundles[0]
    except KstrataError:
        pass
    if not p.is_dir():
        raise KstrataError("not a kernel entry (cache, dump or override directory)", path=p)
    levels: dict[str, Any] = {}
    for f in p.iterdir():
        stem, _, ext = f.name.rpartition(".")
        if stem == original.name and ext in original.target.levels:
            levels[ext] = f.read_bytes() if ext in ("cubin", "hsaco") else f.read_text()
    if not levels:
        raise KstrataError(f"no level of kernel {original.name} in this directory", path=p)
    return dataclasses.replace(original, levels={**original.levels, **levels}, origin=str(p))


def _same_signature(original: KernelBundle, candidate: KernelBundle) -> str:
    if original.signature != candidate.signature:
        raise KstrataError(f"signature changed: {original.signature} -> {candidate.signature}")
    return "unchanged"


def _ptxas_accepts(candidate: KernelBundle) -> str:
    from .nvidia import rebuild_cubin

    rebuild_cubin(candidate)
    return "ptxas accepts it"


def differential_in_child(original: Path, candidate: Path, launch: Path, seeds: int, timeout: float) -> list[Check]:
    """Run the GPU differential in a child process (a crash or hang there is a failed verdict)."""
    code = ("import json, sys; from kstrata.backends.verify import _differential_main; "
            "print(json.dumps(_differential_main(*sys.argv[1:])))")
    try:
        proc = subprocess.run([sys.executable, "-c", code, str(original), str(candidate), str(launch), str(seeds)],
                              capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return [Check("differential", "binary", "fail", f"the candidate ran past the {timeout:g} s timeout (hang?)")]
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-4:])
        return [Check("differential", "binary", "fail", f"the run died (exit {proc.returncode}): {tail}")]
    return [Check(**c) for c in json.loads(proc.stdout.strip().splitlines()[-1])]


def _differential_main(original: str, candidate: str, launch: str, seeds: str) -> list[dict[str, Any]]:
    from kstrata.ir.launch import LaunchRecord
    from kstrata.ir.triton_layout import load_any

    from .replay import differential

    a = load_any(original)[0][0]
    b = load_candidate(candidate, a)
    record = LaunchRecord.load(launch)
    checks = []
    for seed in range(int(seeds)):
        d = differential(a, b, record, seed=seed, runs=20)
        detail = "outputs byte-identical" if d.equal else f"first difference: {d.first_difference} (launch {launch})"
        checks.append(Check(f"differential seed {seed}", "binary", "pass" if d.equal else "fail",
                            detail + f"; {d.timing_a['median_us']:.2f} -> {d.timing_b['median_us']:.2f} us").__dict__)
    again = differential(b, b, record, seed=0, runs=5)
    checks.append(Check("determinism", "binary", "pass" if again.equal else "fail",
                        "the candidate gives the same bytes twice" if again.equal else str(again.first_difference)).__dict__)
    return checks
