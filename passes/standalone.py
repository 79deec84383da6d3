"""A bundle from a single IR file, so passes can run on one `.ttir`/`.ttgir`/`.llir`/`.ptx`/`.amdgcn`."""

from __future__ import annotations

import re
from pathlib import Path

from kstrata.ir.bundle import KernelBundle
from kstrata.ir.errors import BundleError
from kstrata.ir.files import read_ir_text, user_path
from kstrata.ir.target import Target

_EXTENSIONS = ("ttir", "ttgir", "llir", "ptx", "amdgcn")


def _target_from_text(level: str, text: str) -> Target | None:
    if level in ("ttgir",):
        m = re.search(r'ttg\.target\s*=\s*"([^"]+)"', text)
        return Target.parse(m.group(1)) if m else None
    if level == "ptx":
        m = re.search(r"^\.target\s+sm_(\d+)", text, re.M)
        return Target.parse(f"cuda:{m.group(1)}") if m else None
    if level == "amdgcn":
        m = re.search(r"amdgcn-amd-amdhsa--(gfx[0-9a-f]+)", text)
        return Target.parse(f"hip:{m.group(1)}") if m else None
    if level == "llir":
        if "amdgcn-amd-amdhsa" in text:
            m = re.search(r'"target-cpu"="(gfx[0-9a-f]+)"', text)
            return Target.parse(f"hip:{m.group(1)}") if m else None
        if "nvptx64" in text:
            m = re.search(r'"target-cpu"="sm_(\d+)', text)
            return Target.parse(f"cuda:{m.group(1)}") if m else None
    return None


def bundle_for_file(path: str | Path, target: str | None = None) -> KernelBundle:
    """A bundle holding one IR file (or, for a directory, the cache or dump entry it is)."""
    p = user_path(path)
    if p.is_dir():
        from kstrata.ir.triton_layout import load_any

        bundles, errors = load_any(p)
        if errors:
            raise errors[0]
        if len(bundles) != 1:
            raise BundleError(f"expected one kernel, found {len(bundles)}", path=p)
        return bundles[0]
    level = p.suffix.lstrip(".")
    if level not in _EXTENSIONS:
        raise BundleError(f"not an IR file: the extension must be one of {', '.join(_EXTENSIONS)}", path=p)
    text = read_ir_text(p, f"{level} file", error=BundleError)
    tgt = Target.parse(target) if target else _target_from_text(level, text)
    if tgt is None:
        raise BundleError("cannot tell the target from the file; pass --target", path=p)
    name = p.stem
    m = re.search(r"(?:tt\.func public @|\.entry\s+|define\s+\w+\s+void\s+@)([\w$]+)", text)
    if m:
        name = m.group(1)
    return KernelBundle(name, tgt, {level: text}, {"name": name}, origin=str(p))
