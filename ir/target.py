"""Compilation targets: `cuda:90`, `hip:gfx942`, … and what each one's lowering produces."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from .errors import TargetError, cut_text

#: Architectures kstrata knows, per backend, with their warp (wavefront) size.
KNOWN_CUDA_ARCHS = (75, 80, 86, 87, 89, 90, 100, 103, 120)
KNOWN_HIP_ARCHS = {"gfx90a": 64, "gfx942": 64, "gfx950": 64, "gfx1100": 32, "gfx1101": 32, "gfx1200": 32, "gfx1201": 32}

#: The levels of a kernel, from the top, per backend: the names Triton gives its stages (and files).
LEVELS = {
    "cuda": ("source", "ttir", "ttgir", "llir", "ptx", "cubin"),
    "hip": ("source", "ttir", "ttgir", "llir", "amdgcn", "hsaco"),
}
#: Levels stored as bytes; every other level is text.
BINARY_LEVELS = frozenset({"cubin", "hsaco"})


@dataclass(frozen=True, order=True)
class Target:
    """A GPU target, spelled `cuda:<sm>` or `hip:<gfx arch>`."""

    backend: str
    arch: int | str
    warp_size: int

    @classmethod
    def parse(cls, spelling: str) -> Target:
        """Parse `cuda:90`, `sm_90`, `hip:gfx942` or `gfx942`; unknown targets raise `TargetError`."""
        text = spelling.strip().lower()
        m = re.fullmatch(r"(?:cuda:|sm_?)(\d+)a?", text)
        if m:
            arch = int(m.group(1))
            if arch not in KNOWN_CUDA_ARCHS:
                raise TargetError(f"unknown CUDA target {spelling!r}; known: " + ", ".join(f"cuda:{a}" for a in KNOWN_CUDA_ARCHS))
            return cls("cuda", arch, 32)
        m = re.fullmatch(r"(?:hip:)?(gfx[0-9a-f]+)", text)
        if m:
            gfx = m.group(1)
            if gfx not in KNOWN_HIP_ARCHS:
                raise TargetError(f"unknown HIP target {spelling!r}; known: " + ", ".join(f"hip:{a}" for a in KNOWN_HIP_ARCHS))
            return cls("hip", gfx, KNOWN_HIP_ARCHS[gfx])
        raise TargetError(f"cannot read target {spelling!r}: write cuda:<sm> (e.g. cuda:90) or hip:<gfx> (e.g. hip:gfx942)")

    @classmethod
    def from_triton(cls, target: Any) -> Target:
        """From Triton's `GPUTarget` or its JSON form (`{"backend": .., "arch": .., "warp_size": ..}`)."""
        if isinstance(target, dict):
            backend, arch, warp = target.get("backend"), target.get("arch"), target.get("warp_size")
        else:  # a GPUTarget; anything else (a string, a list from corrupt metadata) has none of these
            backend, arch, warp = (getattr(target, k, None) for k in ("backend", "arch", "warp_size"))
        if (not isinstance(backend, str) or backend not in LEVELS or not isinstance(arch, (int, str))
                or isinstance(arch, bool) or not isinstance(warp, int)):
            raise TargetError(f"not a Triton target: {cut_text(repr(target), 120)}")
        return cls.parse(f"{backend}:{arch}")

    def to_triton(self) -> Any:
        from triton.backends.compiler import GPUTarget

        return GPUTarget(self.backend, self.arch, self.warp_size)

    @property
    def levels(self) -> tuple[str, ...]:
        return LEVELS[self.backend]

    @property
    def asm_level(self) -> str:
        """The assembly text level: `ptx` or `amdgcn`."""
        return self.levels[-2]

    @property
    def binary_level(self) -> str:
        """The binary level: `cubin` or `hsaco`."""
        return self.levels[-1]

    def __str__(self) -> str:
        return f"{self.backend}:{self.arch}"
