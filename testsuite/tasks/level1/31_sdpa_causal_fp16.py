import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Causal scaled-dot-product attention over (batch, heads, seq, head_dim) fp16 queries, keys and values."""

    def __init__(self):
        super().__init__()

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


batch = 16
heads = 16
seq = 2048
head_dim = 128
DTYPE = torch.float16


def get_inputs():
    q = torch.randn(batch, heads, seq, head_dim, dtype=DTYPE)
    k = torch.randn(batch, heads, seq, head_dim, dtype=DTYPE)
    v = torch.randn(batch, heads, seq, head_dim, dtype=DTYPE)
    return [q, k, v]


def get_init_inputs():
    return []
