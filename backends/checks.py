"""The static checks every part shares: is a level's text accepted by the tool that consumes it, and
did a launcher-visible property change between two versions of a kernel.

Used by the pass verifier (after every pass), `run-passes`, assembly patches and `kstrata verify`.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

from kstrata.ir.errors import KstrataError
from kstrata.ir.target import Target


class CheckFailed(KstrataError):
    """A level is rejected by its consumer, or a launcher-visible property changed."""


def mlir_accepted(target: Target, level: str, text: str) -> None:
    """Triton's parser and MLIR's verifier accept `text` as a TTIR/TTGIR module for `target`."""
    from triton._C.libtriton import ir
    from triton.compiler.compiler import make_backend

    context = ir.context()
    ir.load_dialects(context)
    make_backend(target.to_triton()).load_dialects(context)
    with tempfile.TemporaryDirectory(prefix="kstrata-check-") as tmp:
        path = Path(tmp) / f"kernel.{level}"
        path.write_text(text)
        try:
            module = ir.parse_mlir_module(str(path), context)
        except Exception as exc:
            raise CheckFailed(f"Triton's parser rejects the {level}: {exc}") from None
        if not module.verify():
            raise CheckFailed(f"the {level} does not pass MLIR's verifier")


_LLVMLITE_VERIFY = "import sys, llvmlite.binding as l; l.parse_assembly(sys.stdin.read()).verify()"


def llir_accepted(text: str) -> None:
    """LLVM (llvmlite) parses and verifies `text`.

    llvmlite carries its own LLVM; loaded in the same process as Triton's, the two clash (a segfault in
    Triton's code generation), so llvmlite runs in a child process.
    """
    from .tools import ToolFailed, run_tool

    try:
        run_tool([sys.executable, "-c", _LLVMLITE_VERIFY], input=text.encode(), timeout=120)
    except ToolFailed as exc:
        lines = [ln for ln in exc.stderr.strip().splitlines() if ln.strip()]
        raise CheckFailed(f"LLVM rejects the IR: {lines[-1] if lines else exc.message}") from None


def ptx_entry_changes(before: str, after: str, *, launch_bounds: bool = True) -> list[str]:
    """What changed in the PTX entry a launcher relies on: name, parameters, target and address size, and
    (unless `launch_bounds=False`, for passes that change the block size on purpose) `.reqntid`/`.maxntid`."""
    from .ptx import PtxError, parse_ptx

    try:
        mb, ma = parse_ptx(before), parse_ptx(after)
        eb, ea = mb.entry(), ma.entry()
    except PtxError as exc:
        raise CheckFailed(f"malformed PTX: {exc.message}") from None
    fields = {"name": (eb.name, ea.name), "params": (eb.params, ea.params), "target": (mb.target, ma.target),
              "address_size": (mb.address_size, ma.address_size)}
    if launch_bounds:
        fields |= {"reqntid": (eb.reqntid, ea.reqntid), "maxntid": (eb.maxntid, ea.maxntid)}
    return [f"{k} {b} -> {a}" for k, (b, a) in fields.items() if b != a]


def amd_metadata_changes(before: bytes, after: bytes, *, workgroup: bool = True) -> tuple[list[str], list[str]]:
    """(ABI changes, other changes) between two code objects' metadata; with `workgroup=False` a changed
    workgroup size (a different warp count on purpose) is not counted as an ABI change."""
    from .amd import code_object_metadata, compare_metadata

    diffs = compare_metadata(code_object_metadata(before), code_object_metadata(after))
    abi = [str(d) for d in diffs if d.kind == "abi" and (workgroup or "workgroup" not in d.field)]
    other = [str(d) for d in diffs if str(d) not in abi]
    return abi, other


def binary(art: Any) -> bytes:
    if not isinstance(art, bytes):
        raise CheckFailed("expected a binary level")
    return art
