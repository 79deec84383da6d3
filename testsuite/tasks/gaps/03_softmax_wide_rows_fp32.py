import torch
import torch.nn as nn


class Model(nn.Module):
    """Softmax over the last dim of (4096, 393216): very wide rows, 6.4 GB in and out, fp32."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=1)


batch = 4096
dim = 393216
DTYPE = torch.float32


def get_inputs():
    x = torch.randn(batch, dim, dtype=DTYPE)
    return [x]


def get_init_inputs():
    return []
