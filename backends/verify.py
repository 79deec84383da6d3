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

The verdict is evidence, never the absence of a failure (`Verdict`): `equivalent` needs identical code
or a complete dynamic check (every input set of the interpreter, or of the GPU differential run, ran
and matched; a symbolic proof plugs in through `symbolic_evidence`), `different` names the first
failed check, and `unproven` means only static checks ran (or a check could not run: that is never a
pass). Before anything is compared, both sides are validated (a corrupt original is an error), and a
candidate's truth is its highest changed level: every level below it is rebuilt from that level
(`derive_lower_levels`), so a stale cubin left in an entry whose PTX was edited is never what runs.
"""

from __future__ import annotations

import enum
import hashlib
import json
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kstrata.ir.bundle import KernelBundle
from kstrata.ir.errors import KstrataError

from .amd_hazards import check_waitcnt_hazards
from .checks import amd_metadata_changes, binary, llir_accepted, mlir_accepted, ptx_entry_changes
from .dynamic import Outcome, interpreter_workers, run_jobs, run_jobs_parallel, verdict
from .replay import REDZONE_BYTES, InputSet, input_sets

if TYPE_CHECKING:
    from kstrata.ir.launch import LaunchRecord as LaunchRecordT
    from kstrata.ir.tolerance import Tolerance


class Verdict(enum.Enum):
    """What a verification shows: evidence of equivalence, a difference, or neither."""

    EQUIVALENT = "equivalent"
    DIFFERENT = "different"
    UNPROVEN = "unproven"

    @property
    def exit_code(self) -> int:
        """`kstrata verify`'s exit status (2 is a user error: a file that cannot be read)."""
        return {"equivalent": 0, "different": 1, "unproven": 3}[self.value]


#: Check verdicts: `n/a` is an input set that does not apply to the kernel (the original itself faults
#: on it); `skipped` is a check that could not run, which leaves the verdict unproven.
CHECK_VERDICTS = ("pass", "fail", "skipped", "n/a")

#: The dynamic checks, by evidence group: a group is evidence when every check of it passed (or does not apply).
_EVIDENCE_GROUPS = {"interpreter": ("interpreter",), "differential": ("differential", "determinism"),
                    "symbolic": ("symbolic",), "identical binary": ("identical binary",)}
#: The checks that ran both binaries on a GPU (their names start with it: `differential: <input set>`).
GPU_DIFFERENTIAL = "differential"


def ran_on_gpu(evidence: Iterable[Any]) -> bool:
    """Whether some GPU differential run of both binaries passed among `evidence` (objects with `name` and
    `verdict`: this module's checks or the engine's evidence); a skipped one is not evidence."""
    return any(e.verdict == "pass" and str(e.name).startswith(GPU_DIFFERENTIAL + ":") for e in evidence)


_DYNAMIC_PREFIXES = ("interpreter", "differential", "determinism", "symbolic", "compute-sanitizer", "dynamic",
                     "identical binary")


@dataclass
class Check:
    name: str
    level: str
    verdict: str  # one of CHECK_VERDICTS
    detail: str = ""
    #: The check's own wall time (its job in the child, or the sanitizer's whole child), when it ran one.
    seconds: float | None = None

    @property
    def dynamic(self) -> bool:
        return self.name.startswith(_DYNAMIC_PREFIXES)


@dataclass
class VerifyReport:
    kernel: str
    target: str
    differing_levels: list[str]
    checks: list[Check] = field(default_factory=list)
    #: Levels rebuilt from the candidate's highest changed level before any check (the truth is that level).
    rebuilt_levels: list[str] = field(default_factory=list)
    #: Where the launch of the dynamic checks came from (a record, or one kstrata knows), or None.
    launch_source: str | None = None
    #: What was run or left out on purpose (the sanitizer off, static evidence accepted).
    notes: list[str] = field(default_factory=list)
    #: `--static-only`: static evidence is accepted explicitly (the verdict stays `unproven`).
    static_only: bool = False
    #: The candidate's truth: the lowest level it edits (a pipeline `ttgir(a),ptx(b)` edits the PTX after
    #: the TTGIR, so its binary is not the TTGIR's), or its highest changed level; None when unknown.
    truth_level: str | None = None

    def evidence(self) -> list[str]:
        """The dynamic check groups that are complete evidence (every check passed or does not apply).
        The interpreter and the symbolic checker read TTIR/TTGIR: they are evidence for a candidate whose
        truth is at one of those levels, not for one that also edits LLVM IR or assembly below them."""
        groups = []
        ir_only = self.truth_level is not None and self.truth_level not in ("ttir", "ttgir")
        for group, prefixes in _EVIDENCE_GROUPS.items():
            if ir_only and group in ("interpreter", "symbolic"):
                continue
            members = [c for c in self.checks if c.name.startswith(prefixes)]
            if members and all(c.verdict in ("pass", "n/a") for c in members) and \
                    any(c.verdict == "pass" for c in members):
                groups.append(group)
        return groups

    def unproven_reasons(self) -> list[str]:
        """Why the verdict is not `equivalent` although nothing failed (empty when it is)."""
        if any(c.verdict == "fail" for c in self.checks) or not self.differing_levels:
            return []
        reasons = [f"{c.level} {c.name} could not run: {c.detail}" for c in self.checks
                   if c.verdict == "skipped" and not c.dynamic]
        if not self.evidence():
            skipped = [f"{c.level} {c.name}: {c.detail}" for c in self.checks if c.dynamic and c.verdict == "skipped"]
            ir_passed = any(c.verdict == "pass" and c.name.startswith(("interpreter", "symbolic")) for c in self.checks)
            if ir_passed and self.truth_level not in (None, "ttir", "ttgir"):
                reasons.append(f"the interpreter's or symbolic checker's TTIR/TTGIR evidence does not cover the "
                               f"candidate's own {self.truth_level} edit (a GPU differential run does)")
            reasons.append("no dynamic evidence" + (f" ({'; '.join(skipped)})" if skipped else
                                                    " (no dynamic check ran)"))
        return reasons

    @property
    def verdict(self) -> Verdict:
        if any(c.verdict == "fail" for c in self.checks):
            return Verdict.DIFFERENT
        if not self.differing_levels:
            return Verdict.EQUIVALENT  # identical code
        return Verdict.UNPROVEN if self.unproven_reasons() else Verdict.EQUIVALENT

    @property
    def accepted(self) -> bool:
        """Equivalent, or unproven with static evidence accepted explicitly (`--static-only`)."""
        v = self.verdict
        return v is Verdict.EQUIVALENT or (v is Verdict.UNPROVEN and self.static_only)

    @property
    def ok(self) -> bool:
        """Equivalent with evidence (an unproven candidate is not ok)."""
        return self.verdict is Verdict.EQUIVALENT

    @property
    def exit_code(self) -> int:
        return 0 if self.accepted else self.verdict.exit_code

    def to_json(self) -> dict[str, Any]:
        return {"kernel": self.kernel, "target": self.target, "verdict": self.verdict.value, "ok": self.ok,
                "accepted": self.accepted, "static_only": self.static_only,
                "differing_levels": self.differing_levels, "rebuilt_levels": self.rebuilt_levels,
                "truth_level": self.truth_level,
                "evidence": self.evidence(), "unproven_reasons": self.unproven_reasons(),
                "launch_source": self.launch_source, "notes": self.notes,
                "checks": [c.__dict__ for c in self.checks]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> VerifyReport:
        """The report `to_json` gave (a cached check's): every field back; verdict, evidence and reasons follow."""
        import dataclasses

        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{**{k: v for k, v in data.items() if k in names},
                      "checks": [Check(**c) for c in data["checks"]]})


def _add(report: VerifyReport, name: str, level: str, fn: Any) -> None:
    from .tools import ToolNotFound

    try:
        detail = fn()
        report.checks.append(Check(name, level, "pass", detail or ""))
    except ToolNotFound as exc:  # a check this machine cannot run says so; it is not the candidate's fault
        report.checks.append(Check(name, level, "skipped", f"cannot run here: {exc}"))
    except ImportError as exc:  # kstrata's own install is incomplete: the check could not run, nothing was caught
        report.checks.append(Check(name, level, "skipped", f"cannot run here: {type(exc).__name__}: {exc} "
                                   "(an incomplete install: `make setup` installs every dependency)"))
    except Exception as exc:  # a failed check is a verdict, not a crash
        report.checks.append(Check(name, level, "fail", f"{type(exc).__name__}: {exc}"))


def _accepts_mlir(text: str, level: str, bundle: KernelBundle) -> str:
    from kstrata.ir.triton_ir import parse_triton

    parse_triton(text, bundle.origin)
    mlir_accepted(bundle.target, level, text)
    return "typed dialects and Triton's parser accept it"


def _accepts_llir(text: str, kernel: str) -> str:
    if not re.search(rf"^define\b[^\n]*@{re.escape(kernel)}\(", text, re.MULTILINE):
        raise KstrataError(f"the LLVM IR defines no kernel @{kernel}" + (" (it is empty)" if not text.strip() else ""))
    llir_accepted(text)
    return "LLVM verifies it"


def _nonempty(bundle: KernelBundle, level: str) -> None:
    art = bundle.levels.get(level)
    if art is None or (isinstance(art, str) and not art.strip()) or (isinstance(art, bytes) and not art):
        raise KstrataError(f"the {level} is empty")


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
    before, after = binary(original.level("hsaco")), binary(candidate.level("hsaco"))
    abi, other = amd_metadata_changes(before, after)
    if abi and candidate.num_warps != original.num_warps:
        # As on NVIDIA: a pass may change the warp count on purpose (num-warps); the launcher takes the block
        # size from the candidate's metadata, so the code object's max workgroup size must agree with it.
        from .amd import code_object_metadata

        kernel = code_object_metadata(after).kernel(candidate.name)
        threads = (candidate.num_warps or 0) * kernel.wavefront_size
        rest, _ = amd_metadata_changes(before, after, workgroup=False)
        if not rest and kernel.max_flat_workgroup_size == threads:
            return (f"kernarg layout and wave size unchanged; block size {original.num_warps} -> "
                    f"{candidate.num_warps} warps, and the max workgroup size {threads} matches it"
                    + (f"; {'; '.join(other)}" if other else ""))
    if abi:
        raise KstrataError("code object ABI changed: " + "; ".join(abi))
    return "kernarg layout and wave size unchanged" + (f"; {'; '.join(other)}" if other else "")


def _resources(original: KernelBundle, candidate: KernelBundle) -> str:
    from .resources import resource_usage

    a, b = resource_usage(original).to_json(), resource_usage(candidate).to_json()
    changed = [f"{k} {a[k]} -> {b[k]}" for k in a if k != "source" and a[k] != b[k]]
    if candidate.shared is None and original.shared is not None:
        # The launcher reserves the shared memory the metadata names; an unknown size is not a pass.
        raise KstrataError(f"the candidate's metadata does not give its shared memory size (the original's: "
                           f"{original.shared} bytes): Triton would launch it without knowing it")
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
        if isinstance(candidate.levels[lv], str) and not candidate.text(lv).strip():
            report.checks.append(Check("accepted", lv, "fail", f"the candidate's {lv} is empty"))
        elif lv in ("ttir", "ttgir"):
            _add(report, "accepted", lv, lambda lv=lv: _accepts_mlir(candidate.text(lv), lv, candidate))
        elif lv == "llir":
            _add(report, "accepted", lv, lambda: _accepts_llir(candidate.text("llir"), candidate.name))
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


def validate_original(original: KernelBundle, levels: list[str]) -> None:
    """Raise `KstrataError` when a level of the original that is compared is not valid: a corrupt
    original is an error to report, never a baseline a candidate can match."""
    from .ptx import PtxError, parse_ptx

    for lv in levels:
        try:
            _nonempty(original, lv)
            if lv in ("ttir", "ttgir"):
                mlir_accepted(original.target, lv, original.text(lv))
            elif lv == "llir":
                _accepts_llir(original.text(lv), original.name)
            elif lv == "ptx":
                parse_ptx(original.text(lv)).entry(original.name)
            elif lv in ("cubin", "hsaco") and not binary(original.level(lv)).startswith(b"\x7fELF"):
                raise KstrataError(f"the {lv} is not an ELF file")
        except PtxError as exc:
            raise KstrataError(f"the original's ptx is not valid: {exc.message}", path=original.origin) from None
        except KstrataError as exc:
            raise KstrataError(f"the original's {lv} is not valid: {exc.message}", path=original.origin) from None


# ---------------------------------------------------------------------------------------------------
# Launches kstrata knows
# ---------------------------------------------------------------------------------------------------
#: A launch source: given the original kernel, a launch record that fits it and where it came from, or None.
LaunchSource = Callable[[KernelBundle], "tuple[LaunchRecordT, str] | None"]
_LAUNCH_SOURCES: list[LaunchSource] = []


def register_launch_source(source: LaunchSource) -> None:
    """Add a way to find a kernel's launch when none is given (the test suite registers its kernels')."""
    if source not in _LAUNCH_SOURCES:
        _LAUNCH_SOURCES.append(source)


def known_launch(bundle: KernelBundle) -> tuple[LaunchRecordT, str] | None:
    """The first registered source's launch for `bundle` that fits its parameters, with its origin."""
    from kstrata.ir.launch import LaunchRecordError

    for source in _LAUNCH_SOURCES:
        found = source(bundle)
        if found is None:
            continue
        try:
            found[0].check_against(bundle.params)
        except LaunchRecordError:
            continue
        return found
    return None


# ---------------------------------------------------------------------------------------------------
# Rebuilding the lower levels
# ---------------------------------------------------------------------------------------------------
_REBUILDS: dict[str, KernelBundle] = {}

def rebuild_job(payload: dict[str, str]) -> str:
    """In a child (`child.call_in_child`): the pickled (bundle, level, text) in `payload["job"]` rebuilt;
    the new bundle pickled to `payload["out"]`. A failure raises (the caller's `error`)."""
    import pickle

    from .rebuild import rebuild_from

    bundle, level, text = pickle.loads(Path(payload["job"]).read_bytes())
    Path(payload["out"]).write_bytes(pickle.dumps(rebuild_from(bundle, level, text)))
    return "ok"


def rebuild(bundle: KernelBundle, level: str, text: str, timeout: float = 600.0) -> KernelBundle:
    """`rebuild_from(bundle, level, text)`, remembered per process. LLVM IR is parsed by Triton's LLVM,
    which aborts or crashes on bad IR, so a rebuild from LLVM IR runs in a child process: a crash there
    is an error naming the signal, not the end of kstrata."""
    import dataclasses
    import pickle

    from kstrata.ir.errors import CompileError

    from .rebuild import rebuild_from

    key = hashlib.sha256(json.dumps([str(bundle.target), bundle.name, level, text, bundle.metadata],
                                    sort_keys=True, default=str).encode()).hexdigest()
    if key in _REBUILDS:
        return dataclasses.replace(_REBUILDS[key], origin=bundle.origin)
    if level in ("ttir", "ttgir"):  # our parser first: Triton's C++ one overflows its stack on deep nesting
        from kstrata.ir.triton_ir import parse_triton

        parse_triton(text, bundle.origin, verify=False)
    if level != "llir":
        import contextlib
        import io

        # Triton prints ptxas's log (the source, the whole error) to stdout, which is the report's; a
        # failure's log is in the CompileError already, so what Triton prints is kept out of both streams.
        with contextlib.redirect_stdout(io.StringIO()):
            new = rebuild_from(bundle, level, text)
    else:
        import tempfile

        from .child import call_in_child

        with tempfile.TemporaryDirectory(prefix="kstrata-rebuild-") as tmp:  # the one child protocol (child.py)
            job, out = Path(tmp) / "job.pkl", Path(tmp) / "out.pkl"
            job.write_bytes(pickle.dumps((bundle, level, text)))
            run = call_in_child("kstrata.backends.verify:rebuild_job", {"job": str(job), "out": str(out)},
                                timeout=timeout)
            if run.status == "timeout":
                raise CompileError(f"kernel {bundle.name}: rebuilding from the LLVM IR ran past {timeout:g} s",
                                   path=bundle.origin)
            if run.status == "error":
                raise CompileError(f"kernel {bundle.name}: rebuilding from the LLVM IR failed: {run.error}",
                                   path=bundle.origin)
            if not run.ok:
                raise CompileError(f"kernel {bundle.name}: LLVM died rebuilding from the LLVM IR ({run.reason()})",
                                   path=bundle.origin)
            new = pickle.loads(out.read_bytes())
    _REBUILDS[key] = new
    return new


@dataclass
class Derived:
    """What `derive_lower_levels` did: the level the candidate's truth is, the levels rebuilt from it,
    and those whose content in the entry was not what that level builds to (stale)."""

    top: str | None
    rebuilt: list[str] = field(default_factory=list)
    stale: list[str] = field(default_factory=list)
    declared: bool = False
    #: The rebuild was done when the candidate was built (kstrata's own rebuild, of the same text).
    by_kstrata: bool = False

    def describe(self) -> str:
        if not self.rebuilt:
            return f"the {self.top} is the lowest level: nothing below it to rebuild" if self.top else "no change"
        if self.by_kstrata:
            return f"{', '.join(self.rebuilt)} built from the candidate's {self.top} by kstrata's rebuild of that text"
        why = "the lowest level its pipeline edits" if self.declared else "its highest changed level"
        text = f"{', '.join(self.rebuilt)} rebuilt from the candidate's {self.top} ({why})"
        if self.stale:
            text += (f"; the entry's own {', '.join(self.stale)} differed from that rebuild (stale or hand-edited "
                     "lower levels): the rebuild is what is checked")
        return text


def pipeline_levels(spec: str | None) -> list[str]:
    """The levels a pipeline spelling edits (`llir(a),ptx(b{x=1})` -> llir, ptx)."""
    levels, depth, word = [], 0, ""
    for ch in spec or "":
        if ch in "({":
            if depth == 0 and ch == "(":
                levels.append(word.strip().strip(","))
            depth += 1
            word = ""
        elif ch in ")}":
            depth -= 1
        elif depth == 0:
            word = "" if ch == "," else word + ch
    return levels


def edited_levels(candidate: str | Path) -> list[str] | None:
    """The levels a candidate entry's `kstrata-candidate.json` says its pipeline edits, if it says."""
    from kstrata.ir.candidate import CandidateInfo

    p = Path(candidate)
    info = CandidateInfo.read(p) if p.is_dir() else None
    return pipeline_levels(info.pipeline) if info is not None and info.pipeline else None


def derive_lower_levels(original: KernelBundle, candidate: KernelBundle,
                        edited: list[str] | None = None) -> tuple[KernelBundle, Derived]:
    """The candidate with every level below its truth rebuilt: below its highest changed level, or below
    the lowest of the `edited` levels (a pipeline with passes at several levels edits each of them). The
    entry's own lower levels count as derived when the rebuild gives the same binary (text levels may be
    re-printed with other SSA names); otherwise they are stale and replaced by the rebuild. Raises
    `CompileError` when that level does not build."""
    import dataclasses

    levels = original.target.levels
    order = [lv for lv in levels[1:] if lv in original.levels and lv in candidate.levels]
    changed = [lv for lv in order if original.levels[lv] != candidate.levels[lv]]
    if not changed:
        return candidate, Derived(None)
    declared = [lv for lv in changed if lv in (edited or ())]
    top = declared[-1] if declared else changed[0]
    if top not in levels[1:-1]:
        return candidate, Derived(top)
    from .rebuild import rebuilt_mark

    text_changed = [lv for lv in changed if lv in levels[1:-1]]
    lowest = text_changed[-1] if text_changed else None
    if lowest is not None and rebuilt_mark(lowest, candidate.text(lowest)) in candidate.notes:
        # Built in this process by kstrata's rebuild from exactly that text (a pass pipeline's output, each
        # level's edit rebuilt below it): its lower levels are derived, nothing to redo.
        below = [lv for lv in levels[levels.index(lowest) + 1:] if lv in candidate.levels]
        return candidate, Derived(lowest, below, [], bool(declared), by_kstrata=True)
    rebuilt = rebuild(candidate, top, candidate.text(top))
    below = [lv for lv in levels[levels.index(top) + 1:] if lv in rebuilt.levels]
    binary_level = original.target.binary_level
    stale: list[str] = []
    if binary_level in candidate.levels and candidate.levels[binary_level] != rebuilt.levels.get(binary_level):
        stale = [lv for lv in below if lv in candidate.levels and candidate.levels[lv] != rebuilt.levels[lv]]
    derived = dataclasses.replace(rebuilt, origin=candidate.origin)
    return derived, Derived(top, below, stale, bool(declared))


def load_original(path: str | Path, target: str | None = None) -> KernelBundle:
    """The original kernel: a cache or dump entry, or a `.ttir`/`.ttgir` file compiled for `target`
    (default: the module's own target, and the metadata beside the file)."""
    from kstrata.ir.files import user_path
    from kstrata.ir.triton_layout import compile_ir_file, load_any

    p = user_path(path)
    if p.is_file() and p.suffix in (".ttir", ".ttgir"):
        text = _read_ir_file(p)
        bundle = compile_ir_file(p, target or target_beside(p))
        # The file is the original's truth at its level (Triton's compile re-prints it, which would make
        # the same file given as the candidate look changed).
        bundle.levels[p.suffix[1:]] = text
        return bundle
    bundles, errors = load_any(p)
    if errors:
        raise errors[0]
    return bundles[0]


def target_beside(path: Path) -> str | None:
    """The target Triton's metadata `<name>.json` beside a `.ttir`/`.ttgir` names (a cache entry's), if any."""
    from kstrata.ir.errors import TargetError
    from kstrata.ir.target import Target

    meta = path.with_suffix(".json")
    if not meta.is_file():
        return None
    try:
        data = json.loads(meta.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise KstrataError(f"the metadata beside the IR file cannot be read: {exc}", path=meta) from None
    if not isinstance(data, dict) or "target" not in data:
        return None
    try:
        return str(Target.from_triton(data["target"]))
    except (TargetError, AttributeError, TypeError) as exc:
        raise KstrataError(f"the metadata's target is not a Triton target: {exc}", path=meta) from None


def _read_ir_file(p: Path) -> str:
    from kstrata.ir.files import read_ir_text

    text = read_ir_text(p, f"{p.suffix.lstrip('.') or 'IR'} file")  # names the line of a bad byte; bounds lines
    if not text.strip():
        raise KstrataError("the file is empty", path=p)
    return text


def load_candidate(path: str | Path, original: KernelBundle) -> KernelBundle:
    """A candidate from a cache or dump entry, an override entry (only the levels it replaces, laid over
    the original's, with the metadata its `kstrata-candidate.json` says the rewrite changed), or one IR
    file (`.ttir`, `.ttgir`, `.llir`, `.ptx`, `.amdgcn`: that level replaced, the levels below rebuilt)."""
    import dataclasses

    from kstrata.ir.candidate import CANDIDATE_FILE, CandidateInfo
    from kstrata.ir.files import read_bytes, user_path
    from kstrata.ir.triton_layout import load_any

    p = user_path(path)
    level = p.suffix.lstrip(".")
    if p.is_file() and level in original.target.levels[1:-1]:
        # one IR file: the original with that level replaced and every level below rebuilt
        text = _read_ir_file(p)
        if level in ("ttir", "ttgir"):  # our parser first: Triton's C++ one segfaults on some bad IR
            from kstrata.ir.triton_ir import parse_triton

            parse_triton(text, p, verify=False)
        # errors of the rebuild name the candidate's file, not the original's entry
        candidate = rebuild(dataclasses.replace(original, origin=str(p)), level, text)
        return dataclasses.replace(candidate, origin=str(p))
    # A directory with Triton's metadata or group file is a cache or dump entry: it loads whole or not at
    # all (read as an override directory, its corrupt metadata would silently become the original's).
    entry_like = p.is_dir() and (any(p.glob("__grp__*.json")) or (p / f"{original.name}.json").exists())
    try:
        bundles, errors = load_any(p)
        if bundles and not errors:
            if bundles[0].name != original.name:
                raise KstrataError(f"the entry is kernel {bundles[0].name}, not {original.name}", path=p)
            return bundles[0]
        if entry_like and errors:
            raise KstrataError(f"a corrupt kernel entry: {errors[0].message}", path=p)
    except KstrataError as exc:
        if entry_like:
            raise KstrataError(f"refused: a kernel entry whose files cannot be read ({exc})", path=p) from None
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
        if entry_like:
            raise KstrataError(f"refused: a kernel entry whose files cannot be read ({type(exc).__name__}: {exc})",
                               path=p) from None
    if not p.is_dir():
        raise KstrataError("not a kernel entry (cache, dump or override directory) or an IR file of one of the "
                           f"levels {', '.join(original.target.levels[1:-1])}", path=p)
    levels: dict[str, Any] = {}
    for f in p.iterdir():
        stem, _, ext = f.name.rpartition(".")
        if stem == original.name and ext in original.target.levels:
            levels[ext] = read_bytes(f, f"{ext} file") if ext in ("cubin", "hsaco") else _read_ir_file(f)
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


#: A symbolic checker (`kstrata.ir.symbolic`, or a plugin): given the original, the candidate, a level
#: that differs (ttir/ttgir), the launch (or None) and a time limit, a `Check` named `symbolic`
#: (pass: proved; fail: a counterexample; skipped: undecided), or None when it does not apply.
SymbolicChecker = Callable[[KernelBundle, KernelBundle, str, "LaunchRecordT | None", float], "Check | None"]
_SYMBOLIC_CHECKERS: list[SymbolicChecker] = []


def register_symbolic_checker(checker: SymbolicChecker) -> None:
    """Plug a symbolic checker into the `unproven` path of `verify(..., symbolic=True)`."""
    if checker not in _SYMBOLIC_CHECKERS:
        _SYMBOLIC_CHECKERS.append(checker)


def symbolic_check(result: Any, level: str) -> Check:
    """A `Check` from a symbolic result with `status` proved|counterexample|undecided and `reason`
    (and `counterexample`): what `kstrata.ir.symbolic.check` returns."""
    status = str(getattr(result, "status", "undecided"))
    reason = str(getattr(result, "reason", "") or "")
    if status == "proved":
        return Check("symbolic", level, "pass", reason or "proved equivalent for every input")
    if status == "counterexample":
        return Check("symbolic", level, "fail", f"counterexample: {getattr(result, 'counterexample', None)}"
                     + (f" ({reason})" if reason else ""))
    return Check("symbolic", level, "skipped", f"undecided: {reason}" if reason else "undecided")


def symbolic_evidence(report: VerifyReport, original: KernelBundle, candidate: KernelBundle,
                      launch: LaunchRecordT | None, timeout: float) -> None:
    """The place a symbolic result decides an otherwise `unproven` verdict: each differing TTIR/TTGIR
    level is given to the registered checkers (the first that answers counts). Symbolic claims are
    bit-exact: under a declared tolerance they do not apply."""
    tolerant = any(c.name == "tolerance" for c in report.checks)
    for level in ("ttir", "ttgir"):
        if level not in report.differing_levels:
            continue
        if tolerant and _SYMBOLIC_CHECKERS:
            report.checks.append(Check("symbolic", level, "skipped", "a tolerance is declared: the symbolic "
                                       "claims are bit-exact"))
            continue
        for checker in _SYMBOLIC_CHECKERS:
            check = checker(original, candidate, level, launch, timeout)
            if check is not None:
                report.checks.append(check)
                break


def _highest_changed(original: KernelBundle, candidate: KernelBundle) -> str | None:
    return next((lv for lv in original.target.levels[1:] if lv in original.levels and lv in candidate.levels
                 and original.levels[lv] != candidate.levels[lv]), None)


def verify(original: KernelBundle, candidate: KernelBundle, launch: LaunchRecordT | None = None, *, seeds: int = 2,
           device: str = "auto", tolerance: Tolerance | str | None = None, sanitizer: str | None = "auto",
           timeout: float = 120.0, launch_dir: Path | None = None, on_check: Any = None, static_only: bool = False,
           find_launch: bool = True, symbolic: bool = False, edited: list[str] | None = None,
           interpreter: bool = True) -> VerifyReport:
    """Every check that applies: static ones always, dynamic ones with a launch.

    The candidate's levels below its highest changed level are rebuilt first (`derive_lower_levels`),
    and the original's compared levels validated (`validate_original`: a corrupt original raises).
    `device`: "cpu" (static + interpreter), "cuda" (also the GPU differential run; an error without
    an NVIDIA GPU) or "auto" (the GPU when there is one). `tolerance` loosens floating comparisons
    (a `Tolerance` or its spelling). `sanitizer`: "auto" (memcheck on one launch of the candidate where
    compute-sanitizer exists), a tool name, or "none"/None (off, and the report says so). Without
    `launch`, a launch kstrata knows (`known_launch`, unless `find_launch=False`) is used. `launch_dir`
    is where the record's snapshots are. `static_only` accepts static evidence explicitly (no dynamic
    run). `symbolic` asks the registered symbolic checkers when the verdict would be unproven.
    `edited` names the levels the candidate edits on purpose (its pipeline's; `edited_levels`).
    `on_check(check)` is called as each dynamic check finishes (progress for long runs). `interpreter=False`
    skips the CPU interpreter runs of changed TTIR/TTGIR when the GPU differential run checks the rebuilt
    binary (a search's gate on a GPU; the candidate about to win gets the full check), and the report says so.
    """
    from kstrata.ir.tolerance import Tolerance

    if device not in ("auto", "cpu", "cuda"):
        raise KstrataError(f"unknown device {device!r} (auto, cpu or cuda)")
    tool = "none" if sanitizer is None else sanitizer
    if tool not in ("auto", "none", *SANITIZER_TOOLS):
        raise KstrataError(f"unknown sanitizer tool {sanitizer!r} (auto, none, {', '.join(SANITIZER_TOOLS)})")
    if not timeout > 0:
        raise KstrataError(f"--timeout {timeout:g}: a dynamic run needs a positive time limit (seconds)")
    if original.target != candidate.target:
        raise KstrataError(f"the bundles are for different targets: {original.target} and {candidate.target}")
    if device == "cuda" and original.target.backend == "cuda" and not _gpu_available("cuda"):
        raise KstrataError("--device cuda: no NVIDIA GPU visible to torch here")
    if launch is not None:  # a record of another kernel is the user's mistake, said even where it is not needed
        from kstrata.ir.launch import LaunchRecordError

        if launch.kernel != original.name:
            raise LaunchRecordError(f"the launch record is of kernel {launch.kernel}, not {original.name}",
                                    path=launch.origin)
        launch.check_against(original.params)
    tol = Tolerance.parse(tolerance) if isinstance(tolerance, str) else tolerance
    top = _highest_changed(original, candidate)
    try:
        candidate, derived = derive_lower_levels(original, candidate, edited)
    except KstrataError as exc:  # the candidate's truth does not build: rejected, with the builder's reason
        assert top is not None
        validate_original(original, [top])
        return VerifyReport(original.name, str(original.target), [top],
                            [Check("accepted", top, "fail", f"its lower levels cannot be rebuilt: {exc.message}")])
    report = verify_static(original, candidate)
    validate_original(original, report.differing_levels)
    report.rebuilt_levels = derived.rebuilt
    report.truth_level = derived.top
    if derived.rebuilt:
        report.checks.insert(0, Check("lower levels", derived.top or "", "pass", derived.describe()))
    if tol is not None and not tol.exact:
        report.checks.append(Check("tolerance", "floating", "pass", f"declared: {tol.spelling()}"
                                   + (f" ({tol.why})" if tol.why else "")))
    if not report.differing_levels:
        return report
    if (same := _same_binary(original, candidate, report)) is not None:
        report.checks.append(same)  # the code that runs is the original's: evidence without a launch
        return report
    if static_only:
        report.static_only = True
        report.notes.append("static evidence accepted explicitly (--static-only): no dynamic check was run")
        return report
    if launch is not None:
        report.launch_source = "the given launch record"
    elif find_launch and (found := known_launch(original)) is not None:
        launch, report.launch_source = found
    if launch is None:
        report.checks.append(Check("dynamic", "all", "skipped",
                                   "no launch record: give one (kstrata record) for the interpreter and GPU runs"))
        if symbolic:
            symbolic_evidence(report, original, candidate, None, timeout)
        return report
    _dynamic(report, original, candidate, launch, seeds, device, tol, tool, timeout, launch_dir, on_check, interpreter)
    if symbolic and report.verdict is Verdict.UNPROVEN:
        symbolic_evidence(report, original, candidate, launch, timeout)
    return report


def _same_binary(original: KernelBundle, candidate: KernelBundle, report: VerifyReport) -> Check | None:
    """A passing check when the candidate's higher levels differ but its binary, rebuilt from them, is
    byte-identical to the original's and launches with the same metadata (e.g. an LLVM attribute that
    changes no instruction): the GPU runs exactly the original's code. None otherwise."""
    binary = original.target.binary_level
    if binary in report.differing_levels or binary not in original.levels or binary not in candidate.levels:
        return None
    if binary not in report.rebuilt_levels or any(c.verdict != "pass" for c in report.checks):
        return None  # only a binary kstrata rebuilt from the candidate's truth counts, and only after clean statics
    launch_keys = ("num_warps", "num_ctas", "shared", "cluster_dims", "maxnreg", "tmem_size", "global_scratch_size",
                   "profile_scratch_size", "name")
    changed = [k for k in launch_keys if original.metadata.get(k) != candidate.metadata.get(k)]
    if changed:
        return None
    return Check("identical binary", binary, "pass",
                 f"the {binary} rebuilt from the candidate's {report.differing_levels[0]} is byte-identical to the "
                 f"original's and launches with the same metadata: the same code runs")


def _dynamic(report: VerifyReport, original: KernelBundle, candidate: KernelBundle, launch: LaunchRecordT,
             seeds: int, device: str, tol: Tolerance | None, tool: str, timeout: float, launch_dir: Path | None,
             on_check: Any, interpreter: bool = True) -> None:
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
    binary_level = original.target.binary_level
    binary_on_gpu = binary_level in report.differing_levels and device != "cpu" and gpu
    interpreted = [lv for lv in ("ttir", "ttgir") if lv in report.differing_levels]
    if interpreted and not interpreter and binary_on_gpu:
        # on the H200 (2026-12-03) the interpreter was 2-4 of a gate's 5-7 dynamic checks, and a TTIR edit's gate
        # took 42.6 s where a PTX edit's (no interpreter run) took 8.8 s; the binary that would be deployed is
        # checked on the GPU either way
        report.notes.append(f"interpreter runs of {', '.join(interpreted)} left to a later check: the GPU "
                            "differential run checks the rebuilt binary")
        interpreted = []
    for level in interpreted:
        planned += [(f"interpreter: {s.label}", level, s, {**job_base, "kind": "interp", "level": level,
                                                            "input_set": s}) for s in sets]
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
                planned.append((f"{GPU_DIFFERENTIAL}: {s.label}", binary_level, s,
                                {**job_base, "kind": "gpu", "runs": runs, "input_set": s}))
            again = next((s for s in sets if s.mode == "random"), sets[0])
            planned.append(("determinism", binary_level, again,
                            {**job_base, "original": candidate, "kind": "gpu", "runs": 0, "input_set": again}))

    def checked(index: int, outcome: Outcome) -> Check:
        name, level, iset, _ = planned[index]
        verdict_, detail = verdict(name, level, iset, outcome, timeout, launch_name)
        if name == "determinism" and verdict_ == "pass":
            detail = "the candidate gives the same bytes twice"
        return Check(name, level, verdict_, detail, outcome.payload.get("seconds"))

    def judged(index: int, outcome: Outcome) -> None:
        add(checked(index, outcome))

    # the interpreter's jobs first, in parallel children when the launch is large (`interpreter_workers`): each
    # check is told as it ends (`on_check`), and the report keeps the planned order; then the GPU's, one child
    interp = [i for i, (*_, job) in enumerate(planned) if job["kind"] == "interp"]
    if interp:
        done: dict[int, Check] = {}

        def told(k: int, outcome: Outcome) -> None:  # from the runner's threads, one at a time
            done[interp[k]] = check = checked(interp[k], outcome)
            if on_check is not None:
                on_check(check)

        run_jobs_parallel([planned[i][3] for i in interp], timeout, interpreter_workers(launch, len(interp)),
                          on_outcome=told)
        report.checks.extend(done[i] for i in interp)
    rest = [i for i in range(len(planned)) if i not in interp]
    run_jobs([planned[i][3] for i in rest], timeout, on_outcome=lambda k, outcome: judged(rest[k], outcome))
    if gpu_runs:
        report.notes.append(f"every buffer of the differential runs has {REDZONE_BYTES}-byte redzones before and "
                            "after it, checked after each launch")
        _sanitize(report, add, job_base, sets, tool, timeout, binary_level, original.target.backend)


def _sanitize(report: VerifyReport, add: Any, job_base: dict[str, Any], sets: list[InputSet], tool: str,
              timeout: float, binary_level: str, backend: str) -> None:
    """One launch of the candidate under compute-sanitizer, each buffer its own allocation (torch's caching
    allocator off: one element past a buffer inside its pool is valid memory to the sanitizer)."""
    if tool == "none":
        report.notes.append("compute-sanitizer: off (--sanitizer none)")
        return
    if backend != "cuda":
        add(Check(f"compute-sanitizer {tool}", binary_level, "skipped", "compute-sanitizer runs NVIDIA kernels only"))
        return
    try:
        binary_path = _sanitizer_binary()
    except KstrataError as exc:
        if tool != "auto":
            raise
        report.notes.append(f"compute-sanitizer memcheck not run: {exc.message}")
        return
    tool = "memcheck" if tool == "auto" else tool
    wrapper = [binary_path, "--tool", tool, "--error-exitcode", "86", "--print-limit", "5"]
    iset = next((s for s in sets if s.mode == "random"), sets[0])
    t0 = time.perf_counter()
    outcome = run_jobs([{**job_base, "kind": "sanitize", "input_set": iset}], timeout * 5, wrapper,
                       env={"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"})[0]
    seconds = round(time.perf_counter() - t0, 3)  # the whole child: its start-up under the sanitizer is most of it
    name = f"compute-sanitizer {tool}"
    if outcome.status == "ran" and not outcome.payload.get("returncode"):
        add(Check(name, binary_level, "pass", "no errors reported (one launch, every buffer its own allocation)",
                  seconds))
    elif outcome.status == "harness-error":  # the arguments did not fit: no verdict on the kernel
        add(Check(name, binary_level, "skipped", f"cannot run: {outcome.payload.get('error')}", seconds))
    else:
        errors = [ln.strip() for ln in outcome.output.splitlines() if ln.startswith("=========") and
                  ("ERROR" in ln.upper() or "Invalid" in ln or "hazard" in ln.lower() or "bytes" in ln)][:6]
        add(Check(name, binary_level, "fail", f"{outcome.status} (exit {outcome.payload.get('returncode')}): "
                  + (" | ".join(errors) or outcome.output.strip()[-600:]), seconds))


def declared_tolerance(candidate: str | Path) -> str | None:
    """The tolerance a candidate entry declares in its `kstrata-candidate.json`, if any."""
    from kstrata.ir.candidate import CandidateInfo

    p = Path(candidate)
    info = CandidateInfo.read(p) if p.is_dir() else None
    return info.tolerance if info is not None else None
