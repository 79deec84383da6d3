import torch
import torch.nn as nn


class Model(nn.Module):
    """tanh(A[b] @ B[b]) * 0.5 - 0.125: a batched product and its epilogue, bf16."""

    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return torch.tanh(torch.bmm(A, B)) * 0.5 - 0.125


batch = 3
M = 33
K = 40
N = 24
DTYPE = torch.bfloat16


def get_inputs():
    return [torch.randn(batch, M, K, dtype=DTYPE), torch.randn(batch, K, N, dtype=DTYPE)]


def get_init_inputs():
    return []
