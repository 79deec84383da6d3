import torch
import torch.nn as nn


class Model(nn.Module):
    """Row sums of a Linear's outputs, scaled twice: exact fx rewrites apply (x @ W.sum(0) + b.sum(), 0.5*3 = 1.5)."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.linear(x).sum(dim=1, keepdim=True)
        return (y * 0.5) * 3.0


batch = 32
in_features = 64
out_features = 48


def get_inputs():
    return [torch.randn(batch, in_features)]


def get_init_inputs():
    return [in_features, out_features]
