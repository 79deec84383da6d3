import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """clamp(gelu(x @ W.T + b) * scale + r, -2, 2): a linear layer and a four-op epilogue, fp16."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features, dtype=DTYPE)
        self.scale = nn.Parameter(torch.rand(out_features, dtype=DTYPE) + 0.5)

    def forward(self, x: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        return torch.clamp(F.gelu(self.linear(x)) * self.scale + r, -2.0, 2.0)


batch = 37
in_features = 40
out_features = 72
DTYPE = torch.float16


def get_inputs():
    return [torch.randn(batch, in_features, dtype=DTYPE), torch.randn(batch, out_features, dtype=DTYPE)]


def get_init_inputs():
    return [in_features, out_features]
