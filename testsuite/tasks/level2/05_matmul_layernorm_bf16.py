import torch
import torch.nn as nn


class Model(nn.Module):
    """A linear projection followed by LayerNorm over its output features, bf16."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features, dtype=DTYPE)
        self.norm = nn.LayerNorm(out_features, dtype=DTYPE)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.linear(x))


batch = 16
seq = 1024
in_features = 2048
out_features = 4096
DTYPE = torch.bfloat16


def get_inputs():
    x = torch.randn(batch, seq, in_features, dtype=DTYPE)
    return [x]


def get_init_inputs():
    return [in_features, out_features]
