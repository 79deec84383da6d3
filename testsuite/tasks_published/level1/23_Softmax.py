import torch
import torch.nn as nn


class Model(nn.Module):
    """Simple model that performs a Softmax over dim 1 (KernelBench level1/23, published size)."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=1)


batch_size = 4096
dim = 393216


def get_inputs():
    x = torch.randn(batch_size, dim, dtype=torch.float32)
    return [x]


def get_init_inputs():
    return []
