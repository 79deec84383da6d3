"""Compile suite kernels for any target on the CPU, as Triton's JIT would specialize them.

    python -m kstrata.testsuite.kernels.build --target cuda:90 [--only NAME ...]

The signature comes from the arguments `make_args` produces (Triton's own type mangling), and the
divisibility hints from the same rule Triton's JIT applies at launch: a pointer whose address is a
multiple of 16, or an integer that is, is marked `tt.divisibility = 16`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from kstrata.ir.bundle import KernelBundle
from kstrata.ir.errors import KstrataError
from kstrata.ir.target import Target
from kstrata.ir.triton_layout import base32_key, compile_jit, update_index

from .spec import SuiteKernel

#: The seed whose arguments define a kernel's compile-time specialization.
SPECIALIZATION_SEED = 0


def specialization(kernel: SuiteKernel) -> tuple[dict[str, str], dict[str, Any], dict[tuple[int, ...], list[list[Any]]]]:
    """Triton signature, constexprs and attributes of `kernel`, from the arguments of the default seed.

    Uses Triton's own launch-time specialization: an integer equal to 1 becomes a constexpr, pointers
    and integers divisible by 16 get `tt.divisibility = 16`.
    """
    from triton.backends.compiler import BaseBackend
    from triton.runtime.jit import native_specialize_impl

    args = kernel.make_args(torch.Generator().manual_seed(SPECIALIZATION_SEED))
    signature: dict[str, str] = {}
    constexprs: dict[str, Any] = dict(kernel.constexprs)
    attrs: dict[tuple[int, ...], list[list[Any]]] = {}
    for index, name in enumerate(kernel.param_names):
        if name in kernel.constexprs:
            signature[name] = "constexpr"
            continue
        if name not in args:
            raise ValueError(f"suite kernel {kernel.name}: make_args gave no value for parameter {name!r}")
        mangled, spec = native_specialize_impl(BaseBackend, args[name], False, True, True)
        if mangled == "constexpr":
            constexprs[name] = spec
        elif spec:
            attrs[(index,)] = BaseBackend.parse_attr(spec)
        signature[name] = mangled
    return signature, constexprs, attrs


def compile_for(kernel: SuiteKernel, target: Target) -> Any:
    """Compile `kernel` for `target` with Triton on this machine; returns Triton's `CompiledKernel`."""
    import triton
    from triton.compiler import ASTSource

    signature, constexprs, attrs = specialization(kernel)
    source = ASTSource(kernel.fn, signature, constexprs, attrs)
    options = {"num_warps": kernel.num_warps, "num_stages": kernel.num_stages}
    return triton.compile(source, target=target.to_triton(), options=options)


def bundle_for(kernel: SuiteKernel, target: Target, cache_dir: str | Path | None = None) -> KernelBundle:
    """Compile `kernel` for `target` into a `KernelBundle` (written to `cache_dir` in Triton cache layout if given)."""
    signature, constexprs, attrs = specialization(kernel)
    options = {"num_warps": kernel.num_warps, "num_stages": kernel.num_stages}
    bundle = compile_jit(kernel.fn, signature, target, constexprs, attrs, options, cache_dir=cache_dir)
    bundle.notes.append(f"suite kernel {kernel.name}")
    return bundle


@dataclass
class SuiteBuild:
    """The outcome of building the suite for one target."""

    target: Target
    bundles: dict[str, KernelBundle] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    #: Kernels not built because the target's backend lacks what they use (`SuiteKernel.unsupported_backends`).
    skipped: dict[str, str] = field(default_factory=dict)


def build_suite(target: Target, cache_dir: str | Path, kernels: list[SuiteKernel] | None = None,
                on_kernel: Callable[[SuiteKernel, KernelBundle | None, str | None], None] | None = None) -> SuiteBuild:
    """Compile every suite kernel (or `kernels`) for `target` into `cache_dir`, Triton cache layout.

    A kernel that fails to compile is recorded in `errors` and the build goes on. The cache root gets a
    `kstrata-index.json` naming each entry's kernel, target and override key, so that the bundles loaded
    back from it can be written as Triton overrides.
    """
    from . import all_kernels

    root = Path(cache_dir)
    root.mkdir(parents=True, exist_ok=True)
    result = SuiteBuild(target)
    records: dict[str, dict[str, Any]] = {}
    for kernel in kernels if kernels is not None else all_kernels():
        if target.backend in kernel.unsupported_backends:
            result.skipped[kernel.name] = f"not supported on {target.backend}: {kernel.description}"
            if on_kernel:
                on_kernel(kernel, None, None)
            continue
        try:
            bundle = bundle_for(kernel, target, root)
        except KstrataError as exc:
            result.errors[kernel.name] = str(exc)
            if on_kernel:
                on_kernel(kernel, None, str(exc))
            continue
        result.bundles[kernel.name] = bundle
        assert bundle.origin is not None and bundle.cache_key is not None
        records[base32_key(bundle.cache_key)] = {
            "suite_kernel": kernel.name, "name": bundle.name, "target": str(target),
            "override_key": bundle.override_key, "source": bundle.source,
        }
        if on_kernel:
            on_kernel(kernel, bundle, None)
    if records:
        update_index(root, records)
    return result


def main(argv: list[str] | None = None) -> int:
    from . import all_kernels

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", action="append", default=None, help="cuda:90, hip:gfx942, … (repeatable)")
    parser.add_argument("--only", nargs="*", default=None)
    ns = parser.parse_args(argv)
    targets = [Target.parse(t) for t in (ns.target or ["cuda:90", "hip:gfx942"])]
    failures = 0
    for kernel in all_kernels():
        if ns.only and kernel.name not in ns.only:
            continue
        for target in targets:
            if target.backend in kernel.unsupported_backends:
                print(f"skip {kernel.name:32s} {target!s:12s} not supported on {target.backend}")
                continue
            try:
                compiled = compile_for(kernel, target)
                print(f"ok   {kernel.name:32s} {target!s:12s} shared={compiled.metadata.shared}")
            except Exception as exc:
                failures += 1
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                print(f"FAIL {kernel.name:32s} {target!s:12s} {type(exc).__name__}: {first}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
