import torch
import torch.nn as nn


class Model(nn.Module):
    """y = A @ x for a wide fp32 matrix and a column vector: memory-bound, one pass over A."""

    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return torch.matmul(A, x)


M = 8192
K = 32768
DTYPE = torch.float32


def get_inputs():
    A = torch.randn(M, K, dtype=DTYPE)
    x = torch.randn(K, 1, dtype=DTYPE)
    return [A, x]


def get_init_inputs():
    return []
