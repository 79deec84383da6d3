import torch
import torch.nn as nn


class Model(nn.Module):
    """C = A @ B for a tall-skinny fp16 product: (M, K) @ (K, N) with K much larger than M."""

    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return A @ B


M = 2048
K = 8192
N = 4096
DTYPE = torch.float16


def get_inputs():
    A = torch.randn(M, K, dtype=DTYPE)
    B = torch.randn(K, N, dtype=DTYPE)
    return [A, B]


def get_init_inputs():
    return []
