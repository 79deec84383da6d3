import torch
import torch.nn as nn


class Model(nn.Module):
    """Elementwise ReLU over a small fp32 tensor (CPU tests of kstrata optimize)."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x)


batch_size = 64
dim = 300


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
