import torch
import torch.nn as nn


class Model(nn.Module):
    """relu(x @ W) over batch dims (2, 3): one (K, N) weight shared by every batch, fp16."""

    def __init__(self, K: int, N: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(K, N, dtype=DTYPE) / K**0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(torch.matmul(x, self.weight))


M = 20
K = 48
N = 36
DTYPE = torch.float16


def get_inputs():
    return [torch.randn(2, 3, M, K, dtype=DTYPE)]


def get_init_inputs():
    return [K, N]
