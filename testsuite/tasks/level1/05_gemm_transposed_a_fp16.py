import torch
import torch.nn as nn


class Model(nn.Module):
    """C = A.T @ B where A is stored K-major, shape (K, M): the kernel must read A transposed."""

    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return torch.matmul(A.T, B)


M = 4096
K = 2048
N = 4096
DTYPE = torch.float16


def get_inputs():
    A = torch.randn(K, M, dtype=DTYPE)
    B = torch.randn(K, N, dtype=DTYPE)
    return [A, B]


def get_init_inputs():
    return []
