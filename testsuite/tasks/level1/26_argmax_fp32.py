import torch
import torch.nn as nn


class Model(nn.Module):
    """Index of the maximum along the last dimension of a (64, 1024, 4096) fp32 tensor (int64 result)."""

    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.argmax(x, dim=self.dim)


shape = (64, 1024, 4096)
reduce_dim = 2
DTYPE = torch.float32


def get_inputs():
    x = torch.randn(*shape, dtype=DTYPE)
    return [x]


def get_init_inputs():
    return [reduce_dim]
