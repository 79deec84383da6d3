"""Triton's on-disk layouts for kernels, read and written: cache entries, dump and override directories.

Layouts (Triton 3.6):
- **cache entry**: `<cache root>/<base32 of the cache hash>/` with `<name>.{source,ttir,ttgir,llir,ptx,cubin}`
  (or `amdgcn`, `hsaco`), the metadata `<name>.json` and the group file `__grp__<name>.json` that lists
  the entry's files by absolute path.
- **dump entry** (`TRITON_KERNEL_DUMP=1`): `<dump root>/<base32 of src.hash()>/<name>.<level>` (+ `.sass`), no metadata.
- **override entry** (`TRITON_KERNEL_OVERRIDE=1`): `<override root>/<base32 of src.hash()>/<name>.<level>`; Triton
  replaces a stage's output by the file of the same name. The key is the hash of the kernel's *source*
  (`ASTSource.hash()`), which a cache entry does not record: it is known for kernels compiled through
  kstrata, loaded from a dump directory, or listed in a cache root's `kstrata-index.json`.

Nothing here writes into a directory it read from; every write goes to a fresh temporary directory first
and is renamed into place, so an interrupted write leaves nothing half-written.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from .bundle import Artifact, KernelBundle
from .errors import BundleError, CompileError, KstrataError, TargetError
from .files import check_ir_lines, decode_text, read_bytes, read_json, read_text, user_path
from .target import BINARY_LEVELS, LEVELS, Target

#: Index of a cache root written by kstrata: cache entry directory name -> override key and source.
INDEX_FILE = "kstrata-index.json"
INDEX_SCHEMA = "kstrata.cache-index/1"
_STAGE_EXTS = frozenset(ext for levels in LEVELS.values() for ext in levels if ext != "source")


def base32_key(hex_digest: str) -> str:
    """Triton's directory name for a hex digest (base32, no padding)."""
    return base64.b32encode(bytes.fromhex(hex_digest)).decode("ascii").rstrip("=")


# ---------------------------------------------------------------------------------------------------
# Integrity checks: a missing, empty, truncated or corrupt artifact is an error that names its file.
# ---------------------------------------------------------------------------------------------------
def _braces_balanced(text: str) -> bool:
    depth = 0
    in_string = False
    prev = ""
    for ch in text:
        if in_string:
            if ch == '"' and prev != "\\":
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth < 0:
                return False
        prev = ch
    return depth == 0


def check_elf(data: bytes, path: Path) -> None:
    """A cubin/hsaco must be a 64-bit ELF whose section header table lies inside the file."""
    if len(data) < 64 or data[:4] != b"\x7fELF":
        raise BundleError("not an ELF object (empty or corrupt binary)", path=path)
    if data[4] != 2:
        raise BundleError("not a 64-bit ELF object", path=path)
    e_shoff = int.from_bytes(data[0x28:0x30], "little")
    e_shentsize = int.from_bytes(data[0x3A:0x3C], "little")
    e_shnum = int.from_bytes(data[0x3C:0x3E], "little")
    if e_shoff + e_shentsize * e_shnum > len(data):
        raise BundleError(f"truncated ELF object: section headers end at byte {e_shoff + e_shentsize * e_shnum}, "
                          f"file has {len(data)}", path=path)


def check_artifact(level: str, art: Artifact, path: Path) -> None:
    """Raise `BundleError` naming `path` when the artifact at `level` is empty, truncated or corrupt."""
    if len(art) == 0:
        raise BundleError(f"empty {level} file", path=path)
    if level in BINARY_LEVELS:
        assert isinstance(art, bytes)
        check_elf(art, path)
        return
    assert isinstance(art, str)
    if level in ("ttir", "ttgir", "source"):
        if "module" not in art or "tt.func" not in art:
            raise BundleError(f"not Triton IR: no module with a tt.func in this {level} file", path=path)
        if not _braces_balanced(art):
            raise BundleError(f"truncated or corrupt {level}: unbalanced braces", path=path)
    elif level == "llir":
        if "define " not in art or not _braces_balanced(art):
            raise BundleError("truncated or corrupt LLVM IR: no complete `define`", path=path)
    elif level == "ptx":
        if ".entry" not in art or not _braces_balanced(art):
            raise BundleError("truncated or corrupt PTX: no complete `.entry`", path=path)
    elif level == "amdgcn" and ".end_amdgpu_metadata" not in art:
        raise BundleError("truncated AMDGCN: no `.end_amdgpu_metadata` at the end", path=path)


def _read_artifact(path: Path, level: str) -> Artifact:
    if not path.exists():
        raise BundleError(f"missing {level} file", path=path)
    data = read_bytes(path, f"{level} file", error=BundleError)
    art: Artifact = data if level in BINARY_LEVELS else decode_text(data, path, f"{level} file", error=BundleError)
    if isinstance(art, str):  # what Triton writes has no MiB-long lines; tools take minutes on one
        check_ir_lines(art, path, f"{level} file", error=BundleError)
    check_artifact(level, art, path)
    return art


def _read_json(path: Path) -> Any:
    if not path.exists():
        raise BundleError("missing file", path=path)
    return read_json(path, "metadata", error=BundleError)


# ---------------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------------
def _target_of(metadata: Mapping[str, Any], path: Path) -> Target:
    raw = metadata.get("target")
    if raw is None:
        raise BundleError("metadata has no `target`", path=path)
    try:
        return Target.from_triton(raw)
    except TargetError as exc:
        raise TargetError(exc.message, path=path) from None


def _entry_group(entry: Path) -> tuple[Path, str]:
    groups = sorted(entry.glob("__grp__*.json"))
    if not groups:
        raise BundleError("not a Triton cache entry: no __grp__<kernel>.json group file", path=entry)
    if len(groups) > 1:
        raise BundleError(f"cache entry holds several groups: {', '.join(g.name for g in groups)}", path=entry)
    grp = groups[0]
    return grp, grp.name[len("__grp__"):-len(".json")]


def load_cache_entry(path: str | os.PathLike[str], index: Mapping[str, Any] | None = None) -> KernelBundle:
    """Load one Triton cache entry directory (`<root>/<hash>/`)."""
    entry = Path(path)
    if not entry.is_dir():
        raise BundleError("no such cache entry directory", path=entry)
    grp, name = _entry_group(entry)
    group = _read_json(grp)
    children = group.get("child_paths") if isinstance(group, dict) else None
    if not isinstance(children, dict):
        raise BundleError("corrupt group file: no `child_paths` object", path=grp)
    meta_name = f"{name}.json"
    if meta_name not in children:
        raise BundleError(f"group lists no metadata file {meta_name}", path=grp)
    metadata = _read_json(entry / meta_name)
    if not isinstance(metadata, dict) or "name" not in metadata:
        raise BundleError("corrupt metadata: no kernel `name`", path=entry / meta_name)
    target = _target_of(metadata, entry / meta_name)
    levels: dict[str, Artifact] = {}
    extra: dict[str, bytes] = {}
    # Child paths are absolute paths of where Triton wrote the entry; a copied cache keeps the names only.
    for child in children:
        ext = child.rsplit(".", 1)[-1]
        child_path = entry / child
        if child == meta_name:
            continue
        if ext in target.levels and ext != "source":
            levels[ext] = _read_artifact(child_path, ext)
        elif child_path.exists():
            extra[child] = read_bytes(child_path, error=BundleError)
        else:
            raise BundleError(f"group lists {child}, which is missing", path=child_path)
    if not levels:
        raise BundleError(f"entry holds no kernel level for {target}", path=entry)
    bundle = KernelBundle(
        name=str(metadata["name"]), target=target, levels=levels, metadata=metadata,
        origin=str(entry), extra_files=extra,
    )
    record = (index or {}).get(entry.name)
    if isinstance(record, dict):
        bundle.override_key = record.get("override_key")
        bundle.source = record.get("source")
    return bundle


def read_index(root: Path) -> dict[str, Any]:
    """The kstrata index of a cache root (empty when there is none)."""
    path = root / INDEX_FILE
    if not path.exists():
        return {}
    data = _read_json(path)
    if not isinstance(data, dict) or data.get("schema") != INDEX_SCHEMA or not isinstance(data.get("entries"), dict):
        raise BundleError(f"not a kstrata cache index (expected schema {INDEX_SCHEMA})", path=path)
    return dict(data["entries"])


def iter_cache_entries(root: Path) -> Iterator[Path]:
    """Entry directories of a cache root that hold a kernel (launcher and utility entries are skipped)."""
    for entry in sorted(p for p in root.iterdir() if p.is_dir()):
        names = [f.name for f in entry.iterdir()]
        if any(n.startswith("__grp__") for n in names) and any(n.rsplit(".", 1)[-1] in _STAGE_EXTS for n in names):
            yield entry


def load_cache_root(path: str | os.PathLike[str]) -> tuple[list[KernelBundle], list[KstrataError]]:
    """Every kernel of a Triton cache root; a bad entry is reported in the error list, not raised."""
    root = Path(path)
    if not root.is_dir():
        raise BundleError("no such cache directory", path=root)
    index = read_index(root)
    bundles: list[KernelBundle] = []
    errors: list[KstrataError] = []
    for entry in iter_cache_entries(root):
        try:
            bundles.append(load_cache_entry(entry, index))
        except KstrataError as exc:
            errors.append(exc)
    return bundles, errors


def _ttgir_target(ttgir: str, path: Path) -> Target:
    m = re.search(r'ttg\.target\s*=\s*"([^"]+)"', ttgir)
    if not m:
        raise BundleError("TTGIR has no ttg.target attribute", path=path)
    try:
        return Target.parse(m.group(1))
    except TargetError as exc:
        raise TargetError(exc.message, path=path) from None


def load_dump_entry(path: str | os.PathLike[str]) -> KernelBundle:
    """Load one Triton dump entry (`TRITON_DUMP_DIR/<key>/`); the directory name is the override key."""
    entry = Path(path)
    if not entry.is_dir():
        raise BundleError("no such dump entry directory", path=entry)
    ttgirs = sorted(entry.glob("*.ttgir"))
    if not ttgirs:
        raise BundleError("not a Triton dump entry: no <kernel>.ttgir", path=entry)
    if len(ttgirs) > 1:
        raise BundleError(f"dump entry holds several kernels: {', '.join(p.name for p in ttgirs)}", path=entry)
    name = ttgirs[0].stem
    ttgir = _read_artifact(ttgirs[0], "ttgir")
    assert isinstance(ttgir, str)
    target = _ttgir_target(ttgir, ttgirs[0])
    levels: dict[str, Artifact] = {}
    extra: dict[str, bytes] = {}
    notes: list[str] = []
    for file in sorted(entry.iterdir()):
        stem, _, ext = file.name.rpartition(".")
        if stem != name:
            continue
        if ext in target.levels and ext != "source":
            levels[ext] = _read_artifact(file, ext)
        elif ext in _STAGE_EXTS:
            # Triton dumps every target of one source into one directory; the IR levels hold the last one.
            notes.append(f"ignored {file.name}: a {ext} for another target than the IR's {target}")
        else:
            extra[file.name] = read_bytes(file, error=BundleError)
    metadata: dict[str, Any] = {"name": name, "target": {"backend": target.backend, "arch": target.arch,
                                                          "warp_size": target.warp_size}}
    notes.append("loaded from a dump directory: Triton records no metadata there (num_stages unknown)")
    return KernelBundle(name=name, target=target, levels=levels, metadata=metadata, override_key=entry.name,
                        origin=str(entry), extra_files=extra, notes=notes)


def load_dump_root(path: str | os.PathLike[str]) -> tuple[list[KernelBundle], list[KstrataError]]:
    """Every kernel of a Triton dump directory (or the one entry `path` is)."""
    root = Path(path)
    if not root.is_dir():
        raise BundleError("no such dump directory", path=root)
    if any(root.glob("*.ttgir")):
        return [load_dump_entry(root)], []
    bundles: list[KernelBundle] = []
    errors: list[KstrataError] = []
    for entry in sorted(p for p in root.iterdir() if p.is_dir()):
        try:
            bundles.append(load_dump_entry(entry))
        except KstrataError as exc:
            errors.append(exc)
    return bundles, errors


def override_keys_from_dump(dump_root: str | os.PathLike[str]) -> dict[str, str]:
    """sha256 of each dumped binary (cubin/hsaco) -> its dump directory's name, which is Triton's override key.

    A program run with `TRITON_KERNEL_DUMP=1` leaves both a cache entry (with metadata) and a dump entry
    (keyed for overrides) per kernel; the identical binary ties the two together.
    """
    import hashlib

    keys: dict[str, str] = {}
    root = Path(dump_root)
    if not root.is_dir():
        raise BundleError("no such dump directory", path=root)
    for entry in sorted(p for p in root.iterdir() if p.is_dir()):
        for binary in [*entry.glob("*.cubin"), *entry.glob("*.hsaco")]:
            keys[hashlib.sha256(binary.read_bytes()).hexdigest()] = entry.name
    return keys


def load_any(path: str | os.PathLike[str]) -> tuple[list[KernelBundle], list[KstrataError]]:
    """Load whatever `path` is: a cache entry, a cache root, a dump entry or a dump root (`~` is expanded)."""
    p = user_path(path)
    if not p.exists():
        raise BundleError("no such file or directory", path=p)
    if not p.is_dir():
        raise BundleError("expected a directory (a Triton cache or dump entry, or a root of them)", path=p)
    if any(p.glob("__grp__*.json")):
        return [load_cache_entry(p, read_index(p.parent))], []
    if any(p.glob("*.ttgir")):
        return [load_dump_entry(p)], []
    subdirs = [d for d in p.iterdir() if d.is_dir()]
    if any(any(d.glob("__grp__*.json")) for d in subdirs):
        return load_cache_root(p)
    if any(any(d.glob("*.ttgir")) for d in subdirs):
        return load_dump_root(p)
    raise BundleError("neither a Triton cache nor a dump directory: no kernel entries found", path=p)


# ---------------------------------------------------------------------------------------------------
# Writing
# ---------------------------------------------------------------------------------------------------
def _write_entry_atomically(final: Path, files: Mapping[str, bytes], overwrite: bool) -> Path:
    """Write `files` into directory `final` through a temporary sibling directory and a rename."""
    if final.exists():
        same = all((final / n).exists() and (final / n).read_bytes() == data for n, data in files.items())
        if same:
            return final
        if not overwrite:
            differing = sorted(n for n, d in files.items() if not (final / n).exists() or (final / n).read_bytes() != d)
            raise BundleError(f"entry exists with different contents ({', '.join(differing)}); "
                              "pass overwrite=True (--force) to replace it", path=final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp.", dir=final.parent))
    try:
        if final.exists():  # keep files of the old entry that the new one does not replace
            for old in final.iterdir():
                if old.is_file() and old.name not in files:
                    shutil.copy2(old, tmp / old.name)
        for name, data in files.items():
            (tmp / name).write_bytes(data)
        if final.exists():
            backup = final.with_name(f".{final.name}.old.{os.getpid()}")
            final.rename(backup)
            tmp.rename(final)
            shutil.rmtree(backup)
        else:
            tmp.rename(final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def _encode(art: Artifact) -> bytes:
    return art if isinstance(art, bytes) else art.encode("utf-8")


def write_cache_entry(bundle: KernelBundle, root: str | os.PathLike[str], overwrite: bool = False) -> Path:
    """Write `bundle` as a Triton cache entry under `root`; returns the entry directory."""
    if not bundle.cache_key:
        raise BundleError(f"kernel {bundle.name}: no Triton cache hash in its metadata; it cannot be keyed "
                          "as a cache entry (write it as an override instead)", path=bundle.origin)
    final = Path(root) / base32_key(bundle.cache_key)
    name = bundle.name
    files: dict[str, bytes] = {n: d for n, d in bundle.extra_files.items() if not n.startswith("__grp__")}
    for level, art in bundle.levels.items():
        files[f"{name}.{level}"] = _encode(art)
    files[f"{name}.json"] = json.dumps(bundle.metadata).encode()
    group = {"child_paths": {n: str(final / n) for n in files}}
    files[f"__grp__{name}.json"] = json.dumps(group).encode()
    return _write_entry_atomically(final, files, overwrite)


def write_override(bundle: KernelBundle, root: str | os.PathLike[str], levels: list[str] | None = None,
                   overwrite: bool = False, extra_files: Mapping[str, bytes] | None = None) -> Path:
    """Write `bundle`'s levels (default: every stage level present) in `TRITON_OVERRIDE_DIR` layout.

    Triton reads `<root>/<override key>/<name>.<level>` when run with `TRITON_KERNEL_OVERRIDE=1`; it only
    compiles (and so overrides) on a cache miss, so run with a fresh `TRITON_CACHE_DIR` or
    `TRITON_ALWAYS_COMPILE=1`.
    """
    if not bundle.override_key:
        raise BundleError(f"kernel {bundle.name}: its override key (Triton's source hash) is unknown; load it "
                          "from a dump directory, a kstrata-built cache, or compile it through kstrata",
                          path=bundle.origin)
    chosen = levels or [lv for lv in bundle.target.levels if lv in bundle.levels]
    files = {f"{bundle.name}.{lv}": _encode(bundle.level(lv)) for lv in chosen}
    files.update(extra_files or {})  # e.g. kstrata-candidate.json, which Triton does not read
    return _write_entry_atomically(Path(root) / bundle.override_key, files, overwrite)


def update_index(root: Path, records: Mapping[str, Mapping[str, Any]]) -> Path:
    """Merge `records` (cache entry name -> {override_key, name, target, source}) into the root's index.

    Two processes building into one cache root (one target each) merge in turn, under an exclusive lock
    on `.kstrata-index.json.lock` beside the index: neither loses the other's records."""
    import fcntl

    path = root / INDEX_FILE
    with open(root / f".{INDEX_FILE}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        entries = read_index(root)
        entries.update({k: dict(v) for k, v in records.items()})
        tmp = root / f".{INDEX_FILE}.tmp.{os.getpid()}"
        tmp.write_text(json.dumps({"schema": INDEX_SCHEMA, "entries": entries}, indent=1, sort_keys=True))
        tmp.replace(path)
    return path


# ---------------------------------------------------------------------------------------------------
# Compiling a @triton.jit function on the CPU
# ---------------------------------------------------------------------------------------------------
@contextlib.contextmanager
def _cache_dir(path: str) -> Iterator[None]:
    from triton import knobs

    with knobs.cache.scope():
        knobs.cache.dir = path
        yield


def _describe_failure(exc: BaseException, fn: Any) -> str:
    """One line for a Triton front-end or compiler failure: where in the kernel, and the innermost reason."""
    where = ""
    node = getattr(exc, "node", None)
    if node is not None and hasattr(node, "lineno"):
        # the node's line counts from the `def` line (Triton drops the decorators from the source it parses)
        try:
            from triton.runtime.jit import get_jit_fn_file_line

            first = int(get_jit_fn_file_line(fn)[1])
        except Exception:  # not a JIT function Triton knows: the line within the function
            first = 1
        where = f"line {node.lineno + first - 1}: "
    reason: BaseException = exc
    while getattr(reason, "error_message", None) is None and reason.__cause__ is not None:
        reason = reason.__cause__
    text = getattr(reason, "error_message", None) or str(reason)
    lines = [ln.strip() for ln in str(text).strip().splitlines() if ln.strip() and set(ln.strip()) != {"^"}]
    return f"{where}{type(reason).__name__}: {lines[-1] if lines else ''}"


def _jit_source_text(fn: Any) -> str | None:
    src = getattr(fn, "src", None)
    return src if isinstance(src, str) else None


def compile_ir_file(path: str | os.PathLike[str], target: Target | str | None = None,
                    options: Mapping[str, Any] | None = None) -> KernelBundle:
    """Compile a `.ttir`/`.ttgir` file with Triton's stages from its level and return the kernel's bundle.

    The target comes from `target`, else from the module's `ttg.target` (TTGIR); the options from
    `options`, else from Triton's metadata `<name>.json` beside the file (a cache entry's), else Triton's
    defaults (a TTGIR module carries its own warp count).
    """
    import triton

    from .ir_roundtrip import _target_from_text, compile_options, load_metadata_beside

    file = Path(path)
    if file.suffix not in (".ttir", ".ttgir"):
        raise BundleError("only .ttir and .ttgir files are compiled from their level (other levels need the "
                          "original kernel's metadata: give a cache or dump entry)", path=file)
    text = read_text(file, "IR file", error=BundleError)
    tgt = Target.parse(target) if isinstance(target, str) else target or _target_from_text(text, file)
    opts = dict(options) if options is not None else compile_options(load_metadata_beside(file))
    with tempfile.TemporaryDirectory() as root, _cache_dir(root):
        try:
            compiled = triton.compile(str(file), target=tgt.to_triton(), options=opts)
        except Exception as exc:
            raise CompileError(f"Triton failed to compile it for {tgt}: {type(exc).__name__}: "
                               f"{str(exc).strip().splitlines()[0] if str(exc).strip() else ''}", path=file) from exc
        bundle = load_cache_entry(Path(root) / base32_key(compiled.hash))
    bundle.origin = str(file)
    return bundle


def compile_jit(fn: Any, signature: Mapping[str, str], target: Target | str,
                constexprs: Mapping[str, Any] | None = None,
                attrs: Mapping[tuple[int, ...], list[list[Any]]] | None = None,
                options: Mapping[str, Any] | None = None,
                cache_dir: str | os.PathLike[str] | None = None) -> KernelBundle:
    """Compile a `@triton.jit` function for `target` on this machine and return its bundle.

    `signature` maps every parameter to its Triton type (`*fp32`, `i32`, `constexpr`, …), `attrs` maps
    parameter index tuples to Triton attributes (`[["tt.divisibility", 16]]`). With `cache_dir` the
    entry is written there in Triton cache layout (as Triton itself would); otherwise into a
    temporary directory that is removed afterwards.
    """
    import triton
    from triton.compiler import ASTSource

    tgt = Target.parse(target) if isinstance(target, str) else target
    if not hasattr(fn, "arg_names") or not hasattr(fn, "cache_key"):
        raise CompileError(f"{fn!r} is not a @triton.jit function (is TRITON_INTERPRET=1 set?)")
    source = ASTSource(fn, dict(signature), dict(constexprs or {}), dict(attrs or {}))
    with contextlib.ExitStack() as stack:
        root = str(cache_dir) if cache_dir is not None else stack.enter_context(tempfile.TemporaryDirectory())
        stack.enter_context(_cache_dir(root))
        try:
            compiled = triton.compile(source, target=tgt.to_triton(), options=dict(options or {}))
        except Exception as exc:
            raise CompileError(f"Triton failed to compile {source.name} for {tgt}: {_describe_failure(exc, fn)}",
                               path=getattr(getattr(fn, "fn", None), "__code__", None) and fn.fn.__code__.co_filename
                               ) from exc
        bundle = load_cache_entry(Path(root) / base32_key(compiled.hash))
    bundle.source = _jit_source_text(fn)
    bundle.override_key = base32_key(source.hash())
    if cache_dir is None:  # the entry it was loaded from is gone
        bundle.origin = f"{getattr(fn, '__module__', '?')}.{source.name} compiled for {tgt}"
    return bundle
