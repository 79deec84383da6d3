import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """A pre-norm GPT-style decoder block, fp16: causal multi-head self-attention, then a GELU MLP, each residual."""

    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(hidden, dtype=DTYPE)
        self.qkv = nn.Linear(hidden, 3 * hidden, dtype=DTYPE)
        self.proj = nn.Linear(hidden, hidden, dtype=DTYPE)
        self.norm2 = nn.LayerNorm(hidden, dtype=DTYPE)
        self.fc1 = nn.Linear(hidden, 4 * hidden, dtype=DTYPE)
        self.fc2 = nn.Linear(4 * hidden, hidden, dtype=DTYPE)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(h, dim=-1)
        q, k, v = (t.view(b, s, self.heads, h // self.heads).transpose(1, 2) for t in (q, k, v))
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attn.transpose(1, 2).reshape(b, s, h))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


batch = 8
seq = 1024
hidden = 1024
heads = 16
DTYPE = torch.float16


def get_inputs():
    x = torch.randn(batch, seq, hidden, dtype=DTYPE)
    return [x]


def get_init_inputs():
    return [hidden, heads]
