import torch
import torch.nn as nn


class Model(nn.Module):
    """Maximum over the middle dimension of a (64, 4096, 1024) fp16 tensor (values only)."""

    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.max(x, dim=self.dim).values


shape = (64, 4096, 1024)
reduce_dim = 1
DTYPE = torch.float16


def get_inputs():
    x = torch.randn(*shape, dtype=DTYPE)
    return [x]


def get_init_inputs():
    return [reduce_dim]
