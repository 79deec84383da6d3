import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Causal grouped-query attention at a decoder's size, bf16: 32 query heads over 8 key/value heads (4 query
    heads per group), 2048 tokens, head dim 128. GPU-sized (for the benchmark, not the CPU tests)."""

    def __init__(self):
        super().__init__()

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


batch = 4
q_heads = 32
kv_heads = 8
seq = 2048
head_dim = 128
DTYPE = torch.bfloat16


def get_inputs():
    return [torch.randn(batch, q_heads, seq, head_dim, dtype=DTYPE),
            torch.randn(batch, kv_heads, seq, head_dim, dtype=DTYPE),
            torch.randn(batch, kv_heads, seq, head_dim, dtype=DTYPE)]


def get_init_inputs():
    return []
