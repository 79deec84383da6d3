"""The verifier that runs after every pass: the new text of a level must be well formed for the tool
that consumes it, and must not change what a launcher relies on.

- TTIR/TTGIR: Triton's own parser and MLIR verifier accept it.
- LLVM IR: llvmlite parses and verifies it (in a child process: its LLVM must not share a process with
  Triton's).
- PTX: kstrata's PTX model reads it, and the entry's parameters and launch bounds are unchanged.
- AMDGCN: `llvm-mc` + `ld.lld` assemble it.
"""

from __future__ import annotations

from kstrata.ir.bundle import KernelBundle
from kstrata.ir.errors import KstrataError


class VerificationError(KstrataError):
    """A pass left IR that does not verify."""


def verify_level(bundle: KernelBundle, level: str, text: str) -> None:
    """Raise `VerificationError` (or a tool error) when `text` is not a valid `level` of `bundle`."""
    from kstrata.backends import checks

    try:
        if level in ("ttir", "ttgir"):
            checks.mlir_accepted(bundle.target, level, text)
        elif level == "llir":
            checks.llir_accepted(text)
        elif level == "ptx":
            changed = checks.ptx_entry_changes(bundle.text("ptx"), text)
            if changed:
                raise VerificationError("the PTX entry's launch ABI changed: " + "; ".join(changed))
        elif level == "amdgcn":
            from kstrata.backends.amd import reassemble_amdgcn

            reassemble_amdgcn(text, str(bundle.target.arch))
        else:
            raise VerificationError(f"no verifier for level {level!r}")
    except checks.CheckFailed as exc:
        raise VerificationError(exc.message) from None
