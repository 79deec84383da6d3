"""`KernelBundle`: one kernel at every level of Triton's lowering, with its metadata and ABI.

A bundle holds the artifacts Triton produces for one kernel and one target (TTIR, TTGIR, LLVM IR, and
PTX + cubin or AMDGCN + hsaco), the Python source of the `@triton.jit` function when it is known,
Triton's metadata, and where the bundle came from. Loading and writing the on-disk layouts (cache,
dump and override directories) lives in `kstrata.ir.triton_layout`.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Any

from .errors import BundleError
from .target import BINARY_LEVELS, Target

Artifact = str | bytes


@dataclass(frozen=True)
class KernelParam:
    """One parameter of the kernel's entry function, as the TTIR declares it."""

    index: int
    name: str
    type: str  # the MLIR type, e.g. `!tt.ptr<f32>` or `i32`
    divisibility: int | None = None

    @property
    def is_pointer(self) -> bool:
        return self.type.startswith("!tt.ptr")

    @property
    def triton_type(self) -> str:
        """Triton's signature spelling: `*fp32`, `i32`, …"""
        return _triton_type(self.type)


_MLIR_TO_TRITON = {
    "f32": "fp32", "f16": "fp16", "bf16": "bf16", "f64": "fp64",
    "f8E4M3FN": "fp8e4nv", "f8E5M2": "fp8e5", "f8E4M3FNUZ": "fp8e4b8", "f8E5M2FNUZ": "fp8e5b16",
    "i1": "i1", "i8": "i8", "i16": "i16", "i32": "i32", "i64": "i64",
}


def _triton_type(mlir_type: str) -> str:
    m = re.fullmatch(r"!tt\.ptr<([^,>]+)(?:,\s*\d+)?>", mlir_type)
    if m:
        return "*" + _triton_type(m.group(1))
    return _MLIR_TO_TRITON.get(mlir_type, mlir_type)


@dataclass(frozen=True)
class KernelABI:
    """What a launcher must agree on: parameters, threads per block and dynamic shared memory."""

    params: tuple[KernelParam, ...]
    threads_per_block: int
    shared_bytes: int
    #: Extra pointer parameters Triton's launcher appends (global and profile scratch), from the metadata.
    global_scratch_bytes: int = 0
    profile_scratch_bytes: int = 0
    #: `.param` types of the PTX entry, in order (NVIDIA only).
    ptx_params: tuple[str, ...] = ()
    #: `.reqntid` of the PTX entry (NVIDIA only).
    reqntid: tuple[int, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "params": [
                {"name": p.name, "type": p.triton_type, "mlir_type": p.type, "divisibility": p.divisibility}
                for p in self.params
            ],
            "threads_per_block": self.threads_per_block,
            "shared_bytes": self.shared_bytes,
            "global_scratch_bytes": self.global_scratch_bytes,
            "profile_scratch_bytes": self.profile_scratch_bytes,
            "ptx_params": list(self.ptx_params),
            "reqntid": list(self.reqntid),
        }


@dataclass
class KernelBundle:
    """One kernel, for one target, at every level Triton produced."""

    name: str
    target: Target
    #: Triton stage outputs by level name (`ttir`, `ttgir`, `llir`, `ptx`/`amdgcn`, `cubin`/`hsaco`).
    levels: dict[str, Artifact]
    #: Triton's metadata JSON for the kernel (from a cache entry), or what could be read off the IR.
    metadata: dict[str, Any] = field(default_factory=dict)
    #: The Python source of the `@triton.jit` function, when known.
    source: str | None = None
    #: Base32 key Triton gives this kernel's dump and override directories (`src.hash()`), when known.
    override_key: str | None = None
    #: Where the bundle was loaded from, for messages.
    origin: str | None = None
    #: Other files of the entry kept for a lossless write-back (e.g. Triton's `.source`, `.sass`).
    extra_files: dict[str, bytes] = field(default_factory=dict)
    #: Things a user should know about how the bundle was loaded.
    notes: list[str] = field(default_factory=list)
    #: The entry's parameters when no TTIR/TTGIR is at hand (e.g. a bundle patched at the assembly
    #: level, whose upper levels were dropped after its ABI was checked unchanged).
    declared_params: tuple[KernelParam, ...] | None = None

    # -- levels ---------------------------------------------------------------------------------
    def level(self, name: str) -> Artifact:
        """The artifact at level `name`, or a `BundleError` saying which levels exist."""
        if name == "source":
            if self.source is None:
                raise BundleError(f"kernel {self.name}: the Python source is not known", path=self.origin)
            return self.source
        if name not in self.target.levels:
            raise BundleError(f"kernel {self.name}: {self.target} has no level {name!r}; levels: {', '.join(self.target.levels)}",
                              path=self.origin)
        if name not in self.levels:
            have = ", ".join(lv for lv in self.target.levels if lv in self.levels) or "none"
            raise BundleError(f"kernel {self.name}: level {name!r} is missing (present: {have})", path=self.origin)
        return self.levels[name]

    def text(self, name: str) -> str:
        art = self.level(name)
        if isinstance(art, bytes):
            raise BundleError(f"kernel {self.name}: level {name!r} is binary", path=self.origin)
        return art

    def present_levels(self) -> list[str]:
        """Levels present, top first (`source` included when the Python source is known)."""
        return [lv for lv in self.target.levels if (lv == "source" and self.source is not None) or lv in self.levels]

    def digest(self, name: str) -> str:
        art = self.level(name)
        data = art if isinstance(art, bytes) else art.encode()
        return hashlib.sha256(data).hexdigest()

    # -- metadata -------------------------------------------------------------------------------
    def _meta_int(self, key: str, ttgir_attr: str | None = None) -> int | None:
        value = self.metadata.get(key)
        if isinstance(value, int):
            return value
        if ttgir_attr and "ttgir" in self.levels:
            m = re.search(rf'"?{re.escape(ttgir_attr)}"?\s*=\s*(\d+)\s*:\s*i32', self.text("ttgir"))
            if m:
                return int(m.group(1))
        return None

    @property
    def num_warps(self) -> int | None:
        return self._meta_int("num_warps", "ttg.num-warps")

    @property
    def num_stages(self) -> int | None:
        """`None` for bundles from a dump directory: Triton records it only in the cache metadata."""
        return self._meta_int("num_stages")

    @property
    def num_ctas(self) -> int | None:
        return self._meta_int("num_ctas", "ttg.num-ctas")

    @property
    def shared(self) -> int | None:
        """Shared memory (LDS) bytes Triton allocated."""
        return self._meta_int("shared", "ttg.shared")

    @property
    def cache_key(self) -> str | None:
        """Triton's cache hash (hex) when the bundle came from a cache entry or a compile."""
        value = self.metadata.get("hash")
        return value if isinstance(value, str) else None

    # -- signature and ABI ------------------------------------------------------------------------
    @property
    def params(self) -> tuple[KernelParam, ...]:
        """Parameters of the entry `tt.func`, read from the TTIR (or TTGIR)."""
        for level in ("ttir", "ttgir"):
            if level in self.levels:
                return parse_entry_params(self.text(level), self.name, origin=self.origin)
        if self.declared_params is not None:
            return self.declared_params
        raise BundleError(f"kernel {self.name}: no TTIR or TTGIR to read the signature from", path=self.origin)

    @property
    def signature(self) -> dict[str, str]:
        """Triton signature of the runtime parameters (constexprs are folded into the IR)."""
        return {p.name: p.triton_type for p in self.params}

    def abi(self) -> KernelABI:
        ptx_params: tuple[str, ...] = ()
        reqntid: tuple[int, ...] = ()
        if "ptx" in self.levels:
            ptx = self.text("ptx")
            entry = re.search(r"\.entry\s+\w+\s*\(([^)]*)\)", ptx)
            if entry:
                ptx_params = tuple(re.findall(r"\.param\s+(\.[\w.]+(?:\s+\.align\s+\d+)?)", entry.group(1)))
            m = re.search(r"\.reqntid\s+([\d,\s]+)", ptx)
            if m:
                reqntid = tuple(int(x) for x in m.group(1).replace(" ", "").split(",") if x)
        warps = self.num_warps or 0
        return KernelABI(
            params=self.params,
            threads_per_block=warps * self.target.warp_size,
            shared_bytes=self.shared or 0,
            global_scratch_bytes=int(self.metadata.get("global_scratch_size") or 0),
            profile_scratch_bytes=int(self.metadata.get("profile_scratch_size") or 0),
            ptx_params=ptx_params,
            reqntid=reqntid,
        )

    # -- presentation -----------------------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        """A JSON-ready description: identity, options, levels with sizes and digests, ABI."""
        levels = {}
        for lv in self.present_levels():
            art = self.level(lv)
            levels[lv] = {
                "bytes": len(art) if isinstance(art, bytes) else len(art.encode()),
                "lines": None if isinstance(art, bytes) else art.count("\n") + 1,
                "sha256": self.digest(lv),
            }
        return {
            "name": self.name,
            "target": str(self.target),
            "origin": self.origin,
            "cache_key": self.cache_key,
            "override_key": self.override_key,
            "num_warps": self.num_warps,
            "num_stages": self.num_stages,
            "num_ctas": self.num_ctas,
            "shared": self.shared,
            "signature": self.signature,
            "levels": levels,
            "abi": self.abi().to_json(),
            "notes": list(self.notes),
        }


def _split_top_level(text: str, sep: str = ",") -> list[str]:
    """Split on `sep` where no bracket, brace or string is open."""
    parts, depth, current, in_string = [], 0, [], False
    for ch in text:
        if in_string:
            current.append(ch)
            if ch == '"':
                in_string = False
            continue
        if ch == '"':
            in_string = True
        elif ch in "([{<":
            depth += 1
        elif ch in ")]}>":
            depth -= 1
        if ch == sep and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    if "".join(current).strip():
        parts.append("".join(current))
    return parts


def _entry_arg_list(ir_text: str, kernel: str) -> str | None:
    m = re.search(r"tt\.func\s+public\s+@(\w+)\s*\(", ir_text)
    if not m:
        return None
    start = m.end()
    depth = 1
    for i in range(start, len(ir_text)):
        ch = ir_text[i]
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0:
                return ir_text[start:i]
    return None


def parse_entry_params(ir_text: str, kernel: str, origin: str | None = None) -> tuple[KernelParam, ...]:
    """Parameters of the public `tt.func` in TTIR/TTGIR text: names, MLIR types and divisibility."""
    arglist = _entry_arg_list(ir_text, kernel)
    if arglist is None:
        raise BundleError(f"kernel {kernel}: no complete `tt.func public @…(…)` in the IR", path=origin)
    params = []
    for index, raw in enumerate(_split_top_level(arglist)):
        raw = re.sub(r"\s+loc\(.*\)\s*$", "", raw.strip())
        m = re.match(r"%([\w$.-]+)\s*:\s*(.+?)(?:\s*(\{.*\}))?$", raw)
        if not m:
            raise BundleError(f"kernel {kernel}: cannot read parameter {index} `{raw}`", path=origin)
        name, mlir_type, attrs = m.group(1), m.group(2).strip(), m.group(3) or ""
        div = re.search(r"tt\.divisibility\s*=\s*(\d+)", attrs)
        params.append(KernelParam(index, name, mlir_type, int(div.group(1)) if div else None))
    return tuple(params)


def is_binary_level(level: str) -> bool:
    return level in BINARY_LEVELS
