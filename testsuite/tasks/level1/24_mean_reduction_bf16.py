import torch
import torch.nn as nn


class Model(nn.Module):
    """Mean over the last dimension of a (64, 2048, 2048) bf16 tensor."""

    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.mean(x, dim=self.dim)


shape = (64, 2048, 2048)
reduce_dim = 2
DTYPE = torch.bfloat16


def get_inputs():
    x = torch.randn(*shape, dtype=DTYPE)
    return [x]


def get_init_inputs():
    return [reduce_dim]
