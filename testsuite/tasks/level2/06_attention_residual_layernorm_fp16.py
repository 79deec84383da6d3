import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """LayerNorm(residual + merge_heads(attention(q, k, v))): attention's output merged, added and normalized, fp16."""

    def __init__(self, heads: int, head_dim: int):
        super().__init__()
        self.norm = nn.LayerNorm(heads * head_dim, dtype=DTYPE)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        b, h, s, d = q.shape
        attn = F.scaled_dot_product_attention(q, k, v)
        merged = attn.transpose(1, 2).reshape(b, s, h * d)
        return self.norm(residual + merged)


batch = 8
heads = 16
seq = 1024
head_dim = 64
DTYPE = torch.float16


def get_inputs():
    q = torch.randn(batch, heads, seq, head_dim, dtype=DTYPE)
    k = torch.randn(batch, heads, seq, head_dim, dtype=DTYPE)
    v = torch.randn(batch, heads, seq, head_dim, dtype=DTYPE)
    residual = torch.randn(batch, seq, heads * head_dim, dtype=DTYPE)
    return [q, k, v, residual]


def get_init_inputs():
    return [heads, head_dim]
