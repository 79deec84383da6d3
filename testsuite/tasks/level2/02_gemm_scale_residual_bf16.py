import torch
import torch.nn as nn


class Model(nn.Module):
    """y = x + scale * (x @ W.T + b): a scaled linear layer added back to its input, bf16."""

    def __init__(self, features: int, scale: float):
        super().__init__()
        self.linear = nn.Linear(features, features, dtype=DTYPE)
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.scale * self.linear(x)


batch = 4096
features = 4096
scale = 0.5
DTYPE = torch.bfloat16


def get_inputs():
    x = torch.randn(batch, features, dtype=DTYPE)
    return [x]


def get_init_inputs():
    return [features, scale]
