"""The verifier that runs after every pass: the new text of a level must be well formed for the tool
that consumes it, and must not change what a launcher relies on.

- TTIR/TTGIR: Triton's own parser and MLIR verifier accept it.
- LLVM IR: llvmlite parses and verifies it (in a child process: its LLVM must not share a process with
  Triton's).
- PTX: kstrata's PTX model reads it, and the entry's parameters and launch bounds are unchanged.
- AMDGCN: `llvm-mc` + `ld.lld` assemble it.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from kstrata.ir.bundle import KernelBundle
from kstrata.ir.errors import KstrataError


class VerificationError(KstrataError):
    """A pass left IR that does not verify."""


def _verify_mlir(bundle: KernelBundle, level: str, text: str) -> None:
    from triton._C.libtriton import ir
    from triton.compiler.compiler import make_backend

    context = ir.context()
    ir.load_dialects(context)
    make_backend(bundle.target.to_triton()).load_dialects(context)
    with tempfile.TemporaryDirectory(prefix="kstrata-verify-") as tmp:
        path = Path(tmp) / f"{bundle.name}.{level}"
        path.write_text(text)
        try:
            module = ir.parse_mlir_module(str(path), context)
        except Exception as exc:
            raise VerificationError(f"Triton's parser rejects the {level}: {exc}") from None
        if not module.verify():
            raise VerificationError(f"the {level} does not pass MLIR's verifier")


_LLVMLITE_VERIFY = "import sys, llvmlite.binding as l; l.parse_assembly(sys.stdin.read()).verify()"


def _verify_llir(text: str) -> None:
    # llvmlite carries its own LLVM; loaded in the same process as Triton's, the two clash (a segfault in
    # Triton's code generation). So llvmlite runs in a child process.
    import sys

    from kstrata.backends.tools import ToolFailed, run_tool

    try:
        run_tool([sys.executable, "-c", _LLVMLITE_VERIFY], input=text.encode(), timeout=120)
    except ToolFailed as exc:
        lines = [ln for ln in exc.stderr.strip().splitlines() if ln.strip()]
        raise VerificationError(f"LLVM rejects the IR: {lines[-1] if lines else exc.message}") from None


def _verify_ptx(bundle: KernelBundle, text: str) -> None:
    from kstrata.backends.ptx import PtxError, parse_ptx

    try:
        before, after = parse_ptx(bundle.text("ptx")).entry(), parse_ptx(text).entry()
    except PtxError as exc:
        raise VerificationError(f"malformed PTX: {exc.message}") from None
    if (before.name, before.params, before.reqntid, before.maxntid) != (after.name, after.params, after.reqntid,
                                                                         after.maxntid):
        raise VerificationError("the PTX entry's name, parameters or launch bounds changed")


def _verify_amdgcn(bundle: KernelBundle, text: str) -> None:
    from kstrata.backends.amd import reassemble_amdgcn

    reassemble_amdgcn(text, str(bundle.target.arch))


def verify_level(bundle: KernelBundle, level: str, text: str) -> None:
    """Raise `VerificationError` (or a tool error) when `text` is not a valid `level` of `bundle`."""
    if level in ("ttir", "ttgir"):
        _verify_mlir(bundle, level, text)
    elif level == "llir":
        _verify_llir(text)
    elif level == "ptx":
        _verify_ptx(bundle, text)
    elif level == "amdgcn":
        _verify_amdgcn(bundle, text)
    else:
        raise VerificationError(f"no verifier for level {level!r}")
