"""The contract every kernel of the project's suite fulfils.

A `SuiteKernel` is one Triton kernel written by us together with everything needed to compile it for
any target on the CPU (signature, constexprs, options) and to run it anywhere Triton runs (the GPU, or
the Triton interpreter on CPU tensors) against a PyTorch reference: an input generator, a grid and the
expected outputs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

#: What `make_args` returns: every runtime (non-constexpr) parameter of the kernel, by name, in the
#: kernel's parameter order. Tensors are CPU tensors; the runner moves them to the device.
KernelArgs = dict[str, Any]


@dataclass(frozen=True)
class SuiteKernel:
    """One kernel of the suite.

    `make_args(gen)` builds fresh arguments from a seeded generator, output buffers included.
    `reference(args)` computes, with PyTorch, the expected contents of every tensor named in `outputs`
    from the arguments as they were before the launch. Outputs not in `inout` are poisoned by the
    runner before the launch, so a kernel that skips an element is caught; outputs in `inout` keep
    the contents `make_args` gave them (accumulators such as a histogram's bins).
    """

    name: str
    fn: Any  # a @triton.jit function (an InterpretedFunction under TRITON_INTERPRET=1)
    make_args: Callable[[torch.Generator], KernelArgs]
    grid: Callable[[Mapping[str, Any]], tuple[int, ...]]
    reference: Callable[[Mapping[str, Any]], dict[str, torch.Tensor]]
    outputs: tuple[str, ...]
    constexprs: Mapping[str, Any] = field(default_factory=dict)
    inout: tuple[str, ...] = ()
    num_warps: int = 4
    num_stages: int = 3
    atol: float = 0.0
    rtol: float = 0.0
    #: What the kernel exercises, e.g. ("matmul", "fp16", "scf.for"); `kstrata suite list` shows them.
    tags: tuple[str, ...] = ()
    description: str = ""
    #: Backends ("cuda", "hip") whose Triton rejects this kernel; the suite must stay empty here unless
    #: a target truly lacks the feature, and the reason goes in `description`.
    unsupported_backends: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        missing = [o for o in (*self.outputs, *self.inout) if o not in self.param_names]
        if missing:
            raise ValueError(f"suite kernel {self.name}: outputs {missing} are not parameters of {self.fn_name}")
        unknown = [c for c in self.constexprs if c not in self.param_names]
        if unknown:
            raise ValueError(f"suite kernel {self.name}: constexprs {unknown} are not parameters of {self.fn_name}")

    @property
    def fn_name(self) -> str:
        return str(getattr(self.fn, "__name__", None) or self.fn.fn.__name__)

    @property
    def param_names(self) -> tuple[str, ...]:
        return tuple(self.fn.arg_names)
