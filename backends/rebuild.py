"""Rebuild a kernel's lower levels from any level, with Triton's own stages and the options Triton used.

`rebuild_from(bundle, level, text)` takes new text for one level (TTIR, TTGIR, LLVM IR, PTX or AMDGCN)
and regenerates every level below it: TTIR/TTGIR through `triton.compile` on the file (Triton skips
the passes of the level it starts from, as for its own IR tests), LLVM IR through the backend's stage
functions (`make_ptx`/`make_amdgcn`, then the binary stage), PTX through `ptxas`, AMDGCN through
`llvm-mc` + `ld.lld`. Options come from the bundle's metadata, so an unchanged level rebuilds to the
binary Triton produced.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import tempfile
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from kstrata.ir.bundle import KernelBundle
from kstrata.ir.errors import BundleError, CompileError, cut_text
from kstrata.ir.triton_layout import base32_key, load_cache_entry

#: Metadata keys that are machine-specific or derived, never passed back as options.
_NOT_OPTIONS = frozenset({"extern_libs", "arch", "backend_name", "hash", "target", "name", "shared", "tmem_size",
                          "global_scratch_size", "global_scratch_align", "profile_scratch_size",
                          "profile_scratch_align", "tensordesc_meta", "triton_version"})


_STDERR_LOCK = threading.Lock()


@contextlib.contextmanager
def _native_stderr() -> Iterator[list[str]]:
    """Capture what native code (LLVM's assembler, LLD, ptxas through Triton) writes to file descriptor 2
    while the block runs; the list gets the text. A corrupt AMDGCN text makes LLVM print one diagnostic per
    bad line (hundreds of KB): the caller puts the first lines in its error instead. Small output of a
    successful block is passed on to the real stderr."""
    captured: list[str] = []
    with _STDERR_LOCK, tempfile.TemporaryFile() as sink:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(sink.fileno(), 2)
        ok = False
        try:
            yield captured
            ok = True
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            text = sink.read(1 << 20).decode(errors="replace")
            captured.append(text)
            if ok and text.strip() and len(text) < 4096:
                sys.stderr.write(text)


def _diagnostics(captured: list[str], lines: int = 8) -> str:
    """The first `lines` non-empty lines of captured native output, each cut, with a count of the rest."""
    text = "".join(captured)
    rows = [ln.rstrip() for ln in text.splitlines() if ln.strip()]
    if not rows:
        return ""
    more = f"\n... ({len(rows) - lines} more lines of diagnostics)" if len(rows) > lines else ""
    return "\n" + "\n".join(cut_text(ln, 200) for ln in rows[:lines]) + more


def _backend(bundle: KernelBundle) -> Any:
    from triton.compiler.compiler import make_backend

    return make_backend(bundle.target.to_triton())


def compile_options(bundle: KernelBundle, overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The options Triton used for `bundle` (from its metadata), with `overrides` applied."""
    backend = _backend(bundle)
    fields = backend.parse_options({}).__dataclass_fields__.keys()
    opts: dict[str, Any] = {}
    for key, value in bundle.metadata.items():
        if key in fields and key not in _NOT_OPTIONS and value is not None:
            opts[key] = tuple(value) if isinstance(value, list) else value
    opts.update(overrides or {})
    return opts


@contextlib.contextmanager
def _private_cache() -> Iterator[str]:
    from triton import knobs

    # Both knob groups scoped: a knob set outside its group's scope stays set for the rest of the process,
    # in Triton and in os.environ (TRITON_ALWAYS_COMPILE=1 for every later compile and child process).
    with tempfile.TemporaryDirectory(prefix="kstrata-rebuild-") as tmp, knobs.cache.scope(), \
            knobs.compilation.scope():
        knobs.cache.dir = tmp
        knobs.compilation.always_compile = True
        yield tmp


#: A bundle's note saying that its levels below LEVEL were built from LEVEL's text of that digest.
REBUILT_MARK = "kstrata: lower levels rebuilt from"


def rebuilt_mark(level: str, text: str) -> str:
    import hashlib

    return f"{REBUILT_MARK} {level} sha256:{hashlib.sha256(text.encode()).hexdigest()[:32]}"


def rebuild_from(bundle: KernelBundle, level: str, text: str | None = None,
                 option_overrides: Mapping[str, Any] | None = None) -> KernelBundle:
    """A new bundle whose `level` is `text` (default: the bundle's own) and whose lower levels are rebuilt."""
    levels = bundle.target.levels
    if level not in levels[1:-1]:
        raise BundleError(f"cannot rebuild from {level!r}; levels: {', '.join(levels[1:-1])}", path=bundle.origin)
    src = text if text is not None else bundle.text(level)
    new = dataclasses.replace(bundle, levels=dict(bundle.levels), metadata=dict(bundle.metadata),
                              notes=list(bundle.notes), extra_files=dict(bundle.extra_files))
    if level in ("ttir", "ttgir"):
        _rebuild_with_triton(bundle, new, level, src, option_overrides)
    else:
        _rebuild_with_stages(bundle, new, level, src, option_overrides)
    new.levels[level] = src
    new.notes.append(rebuilt_mark(level, src))
    # Levels above `level` are kept: each level holds its last state, which is what a Triton override
    # directory needs (Triton replaces each stage's output by the file of that level).
    return new


def _rebuild_with_triton(bundle: KernelBundle, new: KernelBundle, level: str, src: str,
                         option_overrides: Mapping[str, Any] | None) -> None:
    import triton

    opts = compile_options(bundle, option_overrides)
    with _private_cache() as root, tempfile.TemporaryDirectory(prefix="kstrata-src-") as srcdir:
        path = Path(srcdir) / f"{bundle.name}.{level}"
        path.write_text(src)
        try:
            with _native_stderr() as native:
                compiled = triton.compile(str(path), target=bundle.target.to_triton(), options=opts)
        except Exception as exc:
            raise CompileError(f"kernel {bundle.name}: Triton could not compile the new {level}: "
                               f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1] if str(exc).strip() else ''}"
                               + _diagnostics(native), path=bundle.origin) from exc
        rebuilt = load_cache_entry(Path(root) / base32_key(compiled.hash))
    below = bundle.target.levels[bundle.target.levels.index(level) + 1:]
    for lv in below:
        new.levels[lv] = rebuilt.level(lv)
    for key in ("shared", "num_warps", "num_stages", "num_ctas", "global_scratch_size", "profile_scratch_size",
                "tmem_size", "hash"):
        if key in rebuilt.metadata:
            new.metadata[key] = rebuilt.metadata[key]
    new.metadata.update({k: v for k, v in (option_overrides or {}).items()})


def _rebuild_with_stages(bundle: KernelBundle, new: KernelBundle, level: str, src: str,
                         option_overrides: Mapping[str, Any] | None) -> None:
    from triton._C.libtriton import llvm
    from triton.backends.compiler import Language

    # Triton initializes LLVM's targets in its LLVM IR stage; starting below it, do it here (without it
    # LLVM's code generation crashes).
    llvm.init_targets()
    if bundle.target.backend == "cuda":
        # Triton's LLVM IR stage also sets NVPTX's 32-bit shared-memory pointers, a process-wide LLVM option;
        # without it a rebuild from LLVM IR in a fresh process gives different (64-bit shared address) PTX.
        from triton._C.libtriton import nvidia

        nvidia.set_short_ptr()
    backend = _backend(bundle)
    options = backend.parse_options(compile_options(bundle, option_overrides))
    stages: dict[str, Any] = {}
    backend.add_stages(stages, options, Language.TRITON)
    metadata: dict[str, Any] = dict(bundle.metadata)
    order = bundle.target.levels
    module: Any = src
    native: list[str] = []
    try:
        with _native_stderr() as native:
            for lv in order[order.index(level) + 1:]:
                module = stages[lv](module, metadata)
                new.levels[lv] = module
    except Exception as exc:
        # Keep the tool's own log (Triton puts ptxas's stderr after its first line), not only the headline,
        # and the first diagnostics LLVM's assembler or LLD wrote to stderr.
        lines = str(exc).strip().splitlines()
        detail = "\n".join(cut_text(ln, 300) for ln in lines[:1] + [ln for ln in lines[1:] if ln.strip()][:12])
        raise CompileError(f"kernel {bundle.name}: rebuilding from {level} failed at the {lv} stage: "
                           f"{type(exc).__name__}: {detail}{_diagnostics(native)}", path=bundle.origin) from exc
    new.metadata.update({k: v for k, v in (option_overrides or {}).items()})
