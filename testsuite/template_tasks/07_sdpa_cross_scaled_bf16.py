import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Cross attention (19 queries, 45 keys, value dim 24 != key dim 32) with an explicit scale, plus a residual,
    bf16."""

    def __init__(self):
        super().__init__()

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, scale=0.3) + r


batch = 3
queries = 19
keys = 45
head_dim = 32
value_dim = 24
DTYPE = torch.bfloat16


def get_inputs():
    return [torch.randn(batch, queries, head_dim, dtype=DTYPE), torch.randn(batch, keys, head_dim, dtype=DTYPE),
            torch.randn(batch, keys, value_dim, dtype=DTYPE), torch.randn(batch, queries, value_dim, dtype=DTYPE)]


def get_init_inputs():
    return []
