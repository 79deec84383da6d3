import torch
import torch.nn as nn


class Model(nn.Module):
    """Sum over the middle dimension of a (64, 4096, 1024) fp32 tensor, keeping the dimension."""

    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sum(x, dim=self.dim, keepdim=True)


shape = (64, 4096, 1024)
reduce_dim = 1
DTYPE = torch.float32


def get_inputs():
    x = torch.randn(*shape, dtype=DTYPE)
    return [x]


def get_init_inputs():
    return [reduce_dim]
