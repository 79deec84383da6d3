import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Elementwise SiLU (x * sigmoid(x)) over a (4096, 16384) bf16 tensor."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.silu(x)


batch_size = 4096
dim = 16384
DTYPE = torch.bfloat16


def get_inputs():
    x = torch.randn(batch_size, dim, dtype=DTYPE)
    return [x]


def get_init_inputs():
    return []
