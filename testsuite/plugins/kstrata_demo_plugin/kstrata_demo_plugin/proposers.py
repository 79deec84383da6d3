"""A third-party proposer of the `triton` space: a hand-written ReLU kernel for tasks named `*relu*`.

It shows the proposer interface (kstrata.agents.optimize): a name, a space, and `propose(state)`
returning complete standalone ModelNew sources (torch + triton only).
"""

from __future__ import annotations

from typing import Any

SOURCE = '''# kstrata optimize: {task}
# precision policy: strict
# space: triton; proposer: demo-triton-relu
# measured: (not yet measured)
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def relu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(y_ptr + offs, tl.maximum(x, 0.0), mask=mask)


class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        n = x.numel()
        relu_kernel[(triton.cdiv(n, {block}),)](x, y, n, BLOCK={block})
        return y
'''


class TritonRelu:
    name = "demo-triton-relu"
    space = "triton"

    def propose(self, state: Any) -> list[Any]:
        from kstrata.agents.optimize import TaskCandidate

        if "relu" not in state.task.name:
            state.note(self.name, "not a ReLU task")
            return []
        block = 1024
        return [TaskCandidate(SOURCE.format(task=state.task.name, block=block), self.space, self.name,
                              f"Triton ReLU kernel, BLOCK={block}", {"BLOCK": block}, parent=state.incumbent.key)]
