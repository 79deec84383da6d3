import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """RMSNorm, then the gated half of a SwiGLU MLP: silu(x @ Wg.T) * (x @ Wu.T), bf16, no biases."""

    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.norm_weight = nn.Parameter(torch.ones(hidden, dtype=DTYPE))
        self.gate = nn.Linear(hidden, intermediate, bias=False, dtype=DTYPE)
        self.up = nn.Linear(hidden, intermediate, bias=False, dtype=DTYPE)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        normed = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * self.norm_weight
        return F.silu(self.gate(normed)) * self.up(normed)


batch = 8
seq = 2048
hidden = 4096
intermediate = 11008
DTYPE = torch.bfloat16


def get_inputs():
    x = torch.randn(batch, seq, hidden, dtype=DTYPE)
    return [x]


def get_init_inputs():
    return [hidden, intermediate]
