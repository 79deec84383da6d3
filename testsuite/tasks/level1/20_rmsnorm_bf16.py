import torch
import torch.nn as nn


class Model(nn.Module):
    """RMSNorm as LLaMA-style models write it: statistics in fp32, result scaled by a bf16 weight."""

    def __init__(self, hidden: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden, dtype=DTYPE))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        inv_rms = torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return (xf * inv_rms).to(x.dtype) * self.weight


batch = 32
seq = 2048
hidden = 4096
eps = 1e-6
DTYPE = torch.bfloat16


def get_inputs():
    x = torch.randn(batch, seq, hidden, dtype=DTYPE)
    return [x]


def get_init_inputs():
    return [hidden, eps]
