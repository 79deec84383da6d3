"""The round-trip contract for TTIR/TTGIR: parse and print through xDSL, then let Triton judge the result.

`check_roundtrip(text, level, target, options)` prints the parsed module and reports (a) whether the text
is identical to the input, and where the first difference is; (b) whether Triton's own parser accepts it;
(c) whether compiling it with Triton's stages from that level gives the same cubin/hsaco as compiling the
input text (both compiled here, in one session, so that `ptxas`'s record of source files is the same).
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .errors import CompileError, KstrataError
from .target import Target
from .triton_ir import parse_triton, print_triton

#: Options of Triton's metadata that a recompile from TTIR/TTGIR must get back (the rest follow from them).
_OPTION_KEYS = ("num_warps", "num_ctas", "num_stages", "maxnreg", "enable_fp_fusion", "launch_cooperative_grid",
                "launch_pdl", "default_dot_input_precision", "max_num_imprecise_acc_default",
                "supported_fp8_dtypes", "deprecated_fp8_dot_operand_dtypes", "allowed_dot_input_precisions",
                "sanitize_overflow", "debug", "waves_per_eu", "kpack", "matrix_instr_nonkdim", "schedule_hint",
                "arch", "instruction_sched_variant")


@dataclass(frozen=True)
class TextDifference:
    line: int
    column: int
    expected: str
    got: str


@dataclass
class RoundTripResult:
    """What happened to one module: text identity, Triton's parser, and the binary."""

    level: str
    target: str
    text_identical: bool
    first_text_difference: TextDifference | None
    triton_parses: bool | None = None
    triton_error: str | None = None
    binary_identical: bool | None = None
    binary_difference: str | None = None
    #: Triton's stored binary vs the recompiled input (`None`: equal or not compared).
    stored_difference: str | None = None

    @property
    def holds(self) -> bool:
        """The contract: Triton accepts the printed text and compiles it to the same binary."""
        return bool(self.triton_parses) and self.binary_identical is not False

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["holds"] = self.holds
        return data


def first_difference(expected: str, got: str) -> TextDifference | None:
    """Line and column (1-based) of the first character where `got` departs from `expected`."""
    if expected == got:
        return None
    a, b = expected.splitlines(keepends=True), got.splitlines(keepends=True)
    for i in range(max(len(a), len(b))):
        x = a[i] if i < len(a) else ""
        y = b[i] if i < len(b) else ""
        if x != y:
            col = next((j for j, (p, q) in enumerate(zip(x, y, strict=False)) if p != q), min(len(x), len(y)))
            return TextDifference(i + 1, col + 1, x.rstrip("\n"), y.rstrip("\n"))
    return TextDifference(len(a), 1, "", "")


def elf_sections(data: bytes) -> dict[str, bytes]:
    """Section name -> contents of a 64-bit little-endian ELF (cubin, hsaco); `{}` when it is not one."""
    if len(data) < 64 or data[:4] != b"\x7fELF" or data[4] != 2:
        return {}
    shoff = int.from_bytes(data[0x28:0x30], "little")
    shentsize = int.from_bytes(data[0x3A:0x3C], "little")
    shnum = int.from_bytes(data[0x3C:0x3E], "little")
    shstrndx = int.from_bytes(data[0x3E:0x40], "little")
    if shoff + shentsize * shnum > len(data) or shstrndx >= shnum:
        return {}
    headers = []
    for i in range(shnum):
        h = data[shoff + i * shentsize: shoff + (i + 1) * shentsize]
        name, kind = int.from_bytes(h[0:4], "little"), int.from_bytes(h[4:8], "little")
        off, size = int.from_bytes(h[0x18:0x20], "little"), int.from_bytes(h[0x20:0x28], "little")
        headers.append((name, kind, off, size))
    _, _, str_off, str_size = headers[shstrndx]
    names = data[str_off:str_off + str_size]
    sections: dict[str, bytes] = {}
    for i, (name, kind, off, size) in enumerate(headers):
        label = names[name:names.find(b"\0", name)].decode("ascii", "replace") or f"#{i}"
        sections[label] = b"" if kind == 8 else data[off:off + size]  # SHT_NOBITS holds no bytes
    return sections


def first_binary_difference(expected: bytes, got: bytes) -> str | None:
    """`None` when equal; otherwise the first differing ELF section and offset in it, or the byte offset."""
    if expected == got:
        return None
    ea, eb = elf_sections(expected), elf_sections(got)
    for name, da in ea.items():
        if name not in eb:
            return f"section {name} missing"
        db = eb[name]
        if da != db:
            off = next((i for i, (p, q) in enumerate(zip(da, db, strict=False)) if p != q), min(len(da), len(db)))
            return f"section {name} at offset {off:#x} (sizes {len(da)} and {len(db)})"
    extra = [n for n in eb if n not in ea]
    if extra:
        return f"extra section {extra[0]}"
    off = next((i for i, (p, q) in enumerate(zip(expected, got, strict=False)) if p != q), min(len(expected), len(got)))
    return f"byte {off:#x} (sizes {len(expected)} and {len(got)}; the ELF headers differ)"


def triton_parse_error(text: str, level: str, target: Target) -> str | None:
    """`None` when Triton's MLIR parser (with the target's dialects) accepts `text`, else its message."""
    from triton._C.libtriton import ir  # type: ignore[import-not-found, unused-ignore]
    from triton.compiler.compiler import make_backend

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"module.{level}"
        path.write_text(text)
        context = ir.context()
        ir.load_dialects(context)
        make_backend(target.to_triton()).load_dialects(context)
        try:
            module = ir.parse_mlir_module(str(path), context)
        except Exception as exc:  # Triton raises RuntimeError with MLIR's diagnostic
            return str(exc).strip() or type(exc).__name__
        if module is None:
            return "Triton's parser returned no module"
    return None


def compile_options(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """The compile options in a bundle's metadata that matter when compiling from TTIR/TTGIR."""
    opts = {k: metadata[k] for k in _OPTION_KEYS if k in metadata and metadata[k] is not None}
    for k in ("supported_fp8_dtypes", "deprecated_fp8_dot_operand_dtypes", "allowed_dot_input_precisions"):
        if k in opts:
            opts[k] = tuple(opts[k])
    opts.pop("arch", None)
    return opts


@contextlib.contextmanager
def _fresh_cache() -> Iterator[str]:
    from triton import knobs

    with tempfile.TemporaryDirectory() as tmp, knobs.cache.scope():
        knobs.cache.dir = tmp
        yield tmp


def compile_binary(path: Path, target: Target, options: Mapping[str, Any]) -> bytes:
    """Compile a `.ttir`/`.ttgir` file with Triton's stages from its level, in a fresh cache.

    The binary records the file's path in its line tables (AMD), so compare binaries compiled from the same path.
    """
    import triton

    with _fresh_cache() as cache:
        try:
            compiled = triton.compile(str(path), target=target.to_triton(), options=dict(options))
        except Exception as exc:
            raise CompileError(f"Triton failed to compile {path.name} for {target}: {exc}", path=path) from exc
        if not any(Path(cache).iterdir()):
            raise CompileError("Triton did not compile into the fresh cache (is TRITON_CACHE_DIR forced?)", path=path)
        binary = compiled.asm[target.binary_level]
        assert isinstance(binary, bytes)
        return binary


def check_roundtrip(text: str, level: str, target: Target | None = None, metadata: Mapping[str, Any] | None = None,
                    *, path: str | Path | None = None, compile: bool = True,
                    stored_binary: bytes | None = None) -> RoundTripResult:
    """Run the contract on one module. `metadata` supplies compile options (a bundle's `.json`).

    The input text and the printed text are compiled from the same file path, each in a fresh cache; the
    binaries must be equal. `stored_binary` (Triton's own cubin/hsaco for the kernel) is compared with the
    recompiled input for information only: compiling from a file names that file in AMD line tables.
    """
    module = parse_triton(text, path)
    printed = print_triton(module)
    diff = first_difference(text, printed)
    tgt = target or _target_from_text(text, path)
    result = RoundTripResult(level=level, target=str(tgt), text_identical=diff is None, first_text_difference=diff)
    error = triton_parse_error(printed, level, tgt)
    result.triton_parses = error is None
    result.triton_error = error
    if compile and error is None:
        options = compile_options(metadata or {})
        name = str((metadata or {}).get("name") or "kernel")
        with tempfile.TemporaryDirectory() as tmp:
            file = Path(tmp) / f"{name}.{level}"
            file.write_text(text)
            ref = compile_binary(file, tgt, options)
            file.write_text(printed)
            got = compile_binary(file, tgt, options)
        result.binary_difference = first_binary_difference(ref, got)
        result.binary_identical = result.binary_difference is None
        if stored_binary is not None:
            result.stored_difference = first_binary_difference(stored_binary, ref)
    return result


def _target_from_text(text: str, path: str | Path | None) -> Target:
    import re

    m = re.search(r'ttg\.target\s*=\s*"([^"]+)"', text)
    if m is None:
        raise KstrataError("cannot tell the target of a TTIR module: pass --target (e.g. cuda:90)", path=path)
    return Target.parse(m.group(1))


def load_metadata_beside(path: Path) -> dict[str, Any]:
    """Triton's metadata `<name>.json` next to a cache entry's `.ttir`/`.ttgir`, or `{}`."""
    meta = path.with_suffix(".json")
    if meta.is_file():
        from .files import read_json

        data = read_json(meta, "metadata")  # a corrupt file beside the IR is an error, not silently no options
        return data if isinstance(data, dict) else {}
    return {}
