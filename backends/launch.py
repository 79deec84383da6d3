"""Launch a kernel bundle's binary on a GPU exactly as Triton would (timing: `backends/timing.py`).

`LoadedKernel(bundle)` loads the bundle's cubin (or hsaco) through Triton's own driver and launcher:
the arguments are the bundle's runtime parameters in order (what Triton's JIT passes after folding
constexprs), plus the scratch buffers Triton appends. Only the binary is used, so a patched cubin runs
with the same launch path as the original.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kstrata.ir.bundle import KernelBundle
from kstrata.ir.errors import KstrataError
from kstrata.ir.triton_layout import base32_key, load_cache_entry, write_cache_entry


class LaunchError(KstrataError):
    """A bundle could not be loaded or launched on this machine's GPU."""


@dataclass(frozen=True)
class _BundleSource:
    """What Triton's launcher needs from a source: the runtime signature by position, no constants."""

    name: str
    signature: dict[int, str]
    constants: dict[tuple[int, ...], Any]


class LoadedKernel:
    """A bundle's binary loaded on the current GPU, callable as `kernel[grid](*args)`."""

    def __init__(self, bundle: KernelBundle) -> None:
        import torch

        if not torch.cuda.is_available():
            raise LaunchError(f"kernel {bundle.name}: no GPU visible to torch; launching needs a "
                              f"{'NVIDIA' if bundle.target.backend == 'cuda' else 'AMD'} GPU", path=bundle.origin)
        from triton.compiler.compiler import CompiledKernel

        binary = bundle.level(bundle.target.binary_level)
        assert isinstance(binary, bytes)
        # A distinct cache key per binary, so an original and a patched bundle never share an entry.
        meta = dict(bundle.metadata)
        meta["hash"] = hashlib.sha256(binary + json.dumps(meta, sort_keys=True, default=str).encode()).hexdigest()
        staged = KernelBundle(bundle.name, bundle.target, dict(bundle.levels), meta)
        self.params = bundle.params
        src = _BundleSource(bundle.name, {p.index: p.triton_type for p in self.params}, {})
        # Triton reads the entry's files when the kernel object is made and loads the binary into the
        # driver in `_init_handles`; after that the staging directory is no longer needed.
        with tempfile.TemporaryDirectory(prefix="kstrata-launch-") as tmp:
            entry = write_cache_entry(staged, tmp)
            loaded = load_cache_entry(entry)
            group = {f"{loaded.name}.{lv}": str(entry / f"{loaded.name}.{lv}") for lv in loaded.levels}
            group[f"{loaded.name}.json"] = str(entry / f"{loaded.name}.json")
            try:
                self._compiled = CompiledKernel(src, group, meta["hash"])
                self._compiled._init_handles()
            except Exception as exc:
                raise LaunchError(f"kernel {bundle.name}: the GPU driver refused the binary: {exc}",
                                  path=bundle.origin) from exc
            assert base32_key(meta["hash"]) == entry.name
        self.name = bundle.name
        self.registers = getattr(self._compiled, "n_regs", None)
        self.spills = getattr(self._compiled, "n_spills", None)

    def __getitem__(self, grid: Sequence[int]) -> Callable[..., None]:
        grid3 = tuple(grid) + (1,) * (3 - len(grid))
        runner = self._compiled[grid3]

        def launch(*args: Any) -> None:
            if len(args) != len(self.params):
                raise LaunchError(f"kernel {self.name} takes {len(self.params)} runtime arguments "
                                  f"({', '.join(p.name for p in self.params)}), got {len(args)}")
            runner(*args)

        return launch

    def call_by_name(self, grid: Sequence[int], args: Mapping[str, Any]) -> None:
        """Launch with arguments given by parameter name (extra names, e.g. constexprs, are ignored)."""
        missing = [p.name for p in self.params if p.name not in args]
        if missing:
            raise LaunchError(f"kernel {self.name}: no value for {', '.join(missing)}")
        self[grid](*(args[p.name] for p in self.params))
