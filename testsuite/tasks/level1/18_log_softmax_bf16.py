import torch
import torch.nn as nn


class Model(nn.Module):
    """Log-softmax along a given dimension of a bf16 tensor (the result stays bf16)."""

    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(x, dim=self.dim)


batch_size = 4096
vocab = 32768
DTYPE = torch.bfloat16


def get_inputs():
    x = torch.randn(batch_size, vocab, dtype=DTYPE)
    return [x]


def get_init_inputs():
    return [1]
