import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """tanh(causal attention(q, k, v)) * 2 over (batch, heads, seq, head_dim), fp16; a head dim that is not a
    power of two and a sequence that is not a multiple of the blocks."""

    def __init__(self):
        super().__init__()

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return torch.tanh(F.scaled_dot_product_attention(q, k, v, is_causal=True)) * 2.0


batch = 2
heads = 3
seq = 37
head_dim = 40
DTYPE = torch.float16


def get_inputs():
    return [torch.randn(batch, heads, seq, head_dim, dtype=DTYPE) for _ in range(3)]


def get_init_inputs():
    return []
