import torch
import torch.nn as nn


class Model(nn.Module):
    """A batch of independent bf16 matrix products: C[b] = A[b] @ B[b]."""

    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return torch.bmm(A, B)


batch = 64
M = 512
K = 1024
N = 768
DTYPE = torch.bfloat16


def get_inputs():
    A = torch.randn(batch, M, K, dtype=DTYPE)
    B = torch.randn(batch, K, N, dtype=DTYPE)
    return [A, B]


def get_init_inputs():
    return []
