import torch
import torch.nn as nn


class Model(nn.Module):
    """Elementwise tanh over a (4096, 16384) fp32 tensor."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x)


batch_size = 4096
dim = 16384
DTYPE = torch.float32


def get_inputs():
    x = torch.randn(batch_size, dim, dtype=DTYPE)
    return [x]


def get_init_inputs():
    return []
