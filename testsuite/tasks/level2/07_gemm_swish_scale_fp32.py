import torch
import torch.nn as nn


class Model(nn.Module):
    """y = scale * swish(x @ W.T + b), swish written out as z * sigmoid(z), fp32."""

    def __init__(self, in_features: int, out_features: int, scale: float):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features, dtype=DTYPE)
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.linear(x)
        return z * torch.sigmoid(z) * self.scale


batch = 4096
in_features = 2048
out_features = 4096
scale = 2.0
DTYPE = torch.float32


def get_inputs():
    x = torch.randn(batch, in_features, dtype=DTYPE)
    return [x]


def get_init_inputs():
    return [in_features, out_features, scale]
