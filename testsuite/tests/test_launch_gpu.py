"""On an NVIDIA GPU: bundles' cubins (Triton's, rebuilt by kstrata, and patched) launch through Triton's
launcher and compute what Triton's JIT computes."""

from __future__ import annotations

import pytest

from .conftest import has_cuda

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not has_cuda(), reason="needs an NVIDIA GPU")]


@pytest.mark.parametrize("name", ["vector_add", "softmax_online", "bmm_fp16_bt"])
def test_original_rebuilt_and_patched_cubins_agree(name: str) -> None:
    import torch

    from kstrata.backends.asm import patch_bundle
    from kstrata.backends.launch import LoadedKernel
    from kstrata.backends.nvidia import rebuild_cubin
    from kstrata.backends.patch import make_patch
    from kstrata.ir.bundle import KernelBundle
    from kstrata.ir.target import Target
    from kstrata.testsuite.kernels import get_kernel
    from kstrata.testsuite.kernels.build import bundle_for
    from kstrata.testsuite.kernels.run import launch, poison_

    kernel = get_kernel(name)
    original = bundle_for(kernel, Target.parse("cuda:90"))
    rebuilt = KernelBundle(original.name, original.target, {**original.levels, "cubin": rebuild_cubin(original).cubin},
                           dict(original.metadata))
    ptx = original.text("ptx")
    patched = patch_bundle(original, make_patch("ptx", ptx, ptx.replace("ld.global.", "ld.global.nc."), original.name))
    host = kernel.make_args(torch.Generator().manual_seed(1))
    grid = kernel.grid(host)

    def fresh() -> dict[str, object]:
        args = {k: (v.to("cuda") if isinstance(v, torch.Tensor) else v) for k, v in host.items()}
        for out in kernel.outputs:
            poison_(args[out])  # type: ignore[arg-type]
        return args

    jit_args = fresh()
    launch(kernel, jit_args)  # Triton's own JIT launch
    for bundle in (original, rebuilt, patched.bundle):
        args = fresh()
        LoadedKernel(bundle).call_by_name(grid, args)
        torch.cuda.synchronize()
        for out in kernel.outputs:
            assert torch.equal(args[out].view(torch.uint8), jit_args[out].view(torch.uint8)), (bundle.notes, out)  # type: ignore[union-attr]
