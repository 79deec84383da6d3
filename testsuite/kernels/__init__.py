"""The project's own Triton kernels: each with a PyTorch reference, an input generator and a launch spec.

Kernel modules in this package define `KERNELS: list[SuiteKernel]`; `all_kernels()` collects them.
Modules are imported on demand, so that setting `TRITON_INTERPRET=1` before the first call makes every
kernel an interpreted one.
"""

from __future__ import annotations

import importlib
import pkgutil

from .spec import SuiteKernel

_INFRASTRUCTURE = frozenset({"spec", "run", "build", "launch"})


def kernel_modules() -> list[str]:
    """Names of the modules that hold suite kernels, sorted."""
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if m.name not in _INFRASTRUCTURE)


def all_kernels() -> list[SuiteKernel]:
    """Every suite kernel, in a stable order (module, then definition order)."""
    kernels: list[SuiteKernel] = []
    seen: dict[str, str] = {}
    for module_name in kernel_modules():
        module = importlib.import_module(f"{__name__}.{module_name}")
        for kernel in getattr(module, "KERNELS", ()):
            if kernel.name in seen:
                raise ValueError(f"suite kernel name {kernel.name!r} defined in both {seen[kernel.name]} and {module_name}")
            seen[kernel.name] = module_name
            kernels.append(kernel)
    return kernels


def get_kernel(name: str) -> SuiteKernel:
    """The suite kernel called `name`; a KeyError lists the known names otherwise."""
    for kernel in all_kernels():
        if kernel.name == name:
            return kernel
    known = ", ".join(k.name for k in all_kernels())
    raise KeyError(f"no suite kernel named {name!r}; known: {known}")


__all__ = ["SuiteKernel", "all_kernels", "get_kernel", "kernel_modules"]
