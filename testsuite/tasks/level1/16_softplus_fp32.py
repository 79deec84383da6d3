import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Elementwise softplus, log(1 + exp(x)), linear above the threshold 20, fp32."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.softplus(x, beta=1.0, threshold=20.0)


batch_size = 4096
dim = 16384
DTYPE = torch.float32


def get_inputs():
    x = torch.randn(batch_size, dim, dtype=DTYPE)
    return [x]


def get_init_inputs():
    return []
