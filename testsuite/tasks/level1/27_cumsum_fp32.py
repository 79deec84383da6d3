import torch
import torch.nn as nn


class Model(nn.Module):
    """Inclusive prefix sum along the rows of a (4096, 16384) fp32 tensor."""

    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cumsum(x, dim=self.dim)


shape = (4096, 16384)
reduce_dim = 1
DTYPE = torch.float32


def get_inputs():
    x = torch.randn(*shape, dtype=DTYPE)
    return [x]


def get_init_inputs():
    return [reduce_dim]
